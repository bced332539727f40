"""Read-ahead of a shard's chunks on slow storage: enough bytes in flight to hide the latency.

:func:`read_ahead` yields the reads of a plan (byte ranges of one shard, in order) while the
caller parses and decodes. It starts reading in the caller's thread and times each read; while
reads come back fast (page cache, a local disk) nothing else happens. A range that ended slow
makes the process's next range (the next shard) start reading ahead at once, at the depth and
latency it learned. Once a read takes longer
than :data:`SLOW_READ_S`, the remaining ranges are read by a thread pool with several requests in
flight (``os.pread`` releases the GIL; network file systems and FUSE mounts serve concurrent
requests in parallel), yielded in order. The depth adapts to what it observes: about the read
latency divided by the time the caller spends on each chunk, plus one, between 2 and
``max_depth`` requests and at most ``max_bytes`` in flight (memory stays bounded: each request is
one chunk, about 96 KiB). Errors surface in order, where the chunk would have been yielded.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

__all__ = ["read_ahead", "SLOW_READ_S", "MAX_DEPTH", "MAX_BYTES"]

#: A read slower than this (seconds) switches the rest of the range to reads ahead.
SLOW_READ_S = 0.0005
#: Most requests in flight per reader.
MAX_DEPTH = 32
#: Most bytes in flight per reader.
MAX_BYTES = 6 << 20

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None
#: what the last range of this process saw: (pid, depth it ended with, its latency), so the next
#: range (the next shard) starts reading ahead at once
_learned: tuple[int, int, float] | None = None


def _executor() -> ThreadPoolExecutor:
    """This process's read pool (a fresh one after ``fork``: threads do not survive it)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=MAX_DEPTH, thread_name_prefix="shardfeed-readahead"))
        return _pool[1]


def _timed(read_at: Callable[[int, int], bytes], offset: int, nbytes: int) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    data = read_at(offset, nbytes)
    return data, time.perf_counter() - t0


def read_ahead(read_at: Callable[[int, int], bytes], plan: Sequence[tuple[int, int, int, int]], *,
               max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
               slow_read_s: float = SLOW_READ_S) -> Iterator[bytes]:
    """The reads of ``plan`` in order, read ahead once the storage proves slow.

    Args:
        read_at: ``read_at(offset, nbytes) -> bytes``, safe to call from several threads at once
            (``os.pread`` on one file descriptor is).
        plan: ``(first sample, end sample, first byte, end byte)`` per read, increasing.
        max_depth: Most requests in flight (``>= 1``).
        max_bytes: Most bytes in flight (one request always goes out).
        slow_read_s: Read time, seconds, above which reading ahead starts.

    Yields:
        ``read_at(a, b - a)`` for each ``(_, _, a, b)`` of ``plan``.

    Raises:
        What ``read_at`` raises, at the chunk whose read failed.
    """
    global _learned
    i, n = 0, len(plan)
    learned = _learned if _learned is not None and _learned[0] == os.getpid() else None
    if learned is None:
        while i < n:  # in the caller's thread while the reads are fast
            _, _, a, b = plan[i]
            data, took = _timed(read_at, a, b - a)
            i += 1
            yield data
            if took > slow_read_s:
                break
        if i >= n:
            return
        depth, latency = 2, took
    else:
        depth, latency = max(2, min(max_depth, learned[1])), learned[2]
    pool = _executor()
    inflight: collections.deque = collections.deque()
    per_chunk = None
    nbytes = 0
    last = time.perf_counter()
    try:
        while i < n or inflight:
            while i < n and len(inflight) < depth and (not inflight or nbytes + plan[i][3] - plan[i][2] <= max_bytes):
                _, _, a, b = plan[i]
                inflight.append((pool.submit(_timed, read_at, a, b - a), b - a))
                nbytes += b - a
                i += 1
            future, size = inflight.popleft()
            data, took = future.result()
            nbytes -= size
            latency = 0.8 * latency + 0.2 * took
            yield data
            now = time.perf_counter()
            spent = now - last  # the caller's time on this chunk, plus any wait for it
            last = now
            per_chunk = spent if per_chunk is None else 0.8 * per_chunk + 0.2 * spent
            depth = max(2, min(max_depth, math.ceil(latency / max(per_chunk, 1e-4)) + 1))
        # fast reads again (the data came into the page cache): the next range starts in the caller's thread
        _learned = (os.getpid(), depth, latency) if latency > slow_read_s else None
    finally:
        for future, _ in inflight:
            future.cancel()
