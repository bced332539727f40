"""Read-ahead of a shard's chunks on slow storage: enough bytes in flight to hide the latency.

:func:`read_ahead` yields the reads of a plan (byte ranges of one shard, in order) while the
caller parses and decodes. It starts reading in the caller's thread and times each read; while
reads come back fast (page cache, a local disk) nothing else happens. A range that ended slow
makes the process's next range (the next shard) start reading ahead at once, at the depth and
latency it learned. Once a read takes longer
than :data:`SLOW_READ_S`, the remaining ranges are read by a thread pool with several requests in
flight (``os.pread`` releases the GIL; network file systems and FUSE mounts serve concurrent
requests in parallel), yielded in order. The depth adapts to what it observes: about the read
latency divided by the time the caller spends on each chunk, doubled, plus two (:func:`_depth_for`), between 2 and
``max_depth`` requests and at most ``max_bytes`` in flight (memory stays bounded: each request is
one chunk, about 96 KiB). Errors surface in order, where the chunk would have been yielded.
A shard's chunks (:func:`read_shard_ahead`) are read ahead in aligned requests of
:data:`REQUEST_BYTES` instead, cut into the chunks: chunks read at once by several threads would
otherwise cross the kernel's request boundaries and make it split its read-around into more
requests, each paying the whole latency. A local or mounted shard whose descriptor is known (the
local reader's) needs no pool for them: each aligned request is a ``posix_fadvise(WILLNEED)``
hint, which the kernel sends as one request of the file system without waiting, and each chunk
is one ``pread`` from the page cache in the caller's thread, as on a local disk (no thread wake-up,
future or intermediate ``bytes`` per request; :func:`_read_hinted`).

Between shards the pipeline would drain: the next shard's ``open`` and its first read each cost
a round trip while the decoder waits. Once this process's reads proved slow, :func:`open_ahead`
opens the next shard (and runs a caller's preparation, e.g. reading its offset index) in the read
pool and reads its first :data:`HEAD_REQUESTS` requests through the page cache, while the current shard is still being
decoded; :func:`take_opened` hands the open descriptor over (a FUSE mount without ``keep_cache``
drops a file's cached pages on every ``open``, so the pages read ahead stay only on that
descriptor). At most :data:`MAX_OPENED` files wait, per process.

Between epochs the pipeline drains too: a worker's shuffle buffer fills before it yields the
epoch's first sample, so every epoch starts by reading the worker's first ``shuffle_buffer``
samples while nothing decodes. :class:`SpansAhead` reads such byte spans (the next epoch's, while
the current epoch's last samples decode) in a background thread and holds them until taken: a
local file in aligned reads of :data:`AHEAD_READ_BYTES` by the read pool, a remote one by one
streamed request per span. At most :data:`EPOCH_AHEAD_BYTES` per process are held (plus less
than one read's alignment on each side of a span).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from concurrent.futures import Future
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

from ..background import start_thread

__all__ = ["read_ahead", "read_shard_ahead", "read_pool", "open_ahead", "take_opened", "storage_is_slow",
           "SpansAhead", "HeldBytes", "SLOW_READ_S", "MAX_DEPTH", "MAX_BYTES", "MAX_OPENED", "REQUEST_BYTES",
           "HEAD_REQUESTS", "EPOCH_AHEAD_BYTES", "STREAM_PIECE_BYTES", "AHEAD_READ_BYTES"]

#: A read slower than this (seconds) switches the rest of the range to reads ahead.
SLOW_READ_S = 0.0005
#: Most requests in flight per reader.
MAX_DEPTH = 32
#: Most bytes in flight per reader.
MAX_BYTES = 6 << 20

#: Bytes per request of :func:`read_shard_ahead`, aligned to them: the request size of a FUSE
#: or NFS mount's read-around (``read_ahead_kb``, 128 KiB by default). Chunks of a shard (whole
#: samples, about 96 KiB) read by several threads at once, each at its own offset, cross these
#: boundaries: the kernel then splits its read-around at the pages another thread is reading,
#: and each piece costs the storage's whole latency (measured on the emulator at 10 ms: a shard
#: read by 32 threads in 96 KiB chunks went out as 1.3 requests per 128 KiB and took 160 ms;
#: in aligned 128 KiB requests, one each, 73-120 ms).
REQUEST_BYTES = 128 << 10

#: Requests of :data:`REQUEST_BYTES` that :func:`open_ahead` reads from a file's start, at least:
#: a shard's reads ahead start at once then, instead of after one round trip (the first chunks
#: are parsed in well under one).
HEAD_REQUESTS = 8

#: Most files :func:`open_ahead` keeps open for the caller, per process.
MAX_OPENED = 2

#: Most bytes :class:`SpansAhead` reads ahead and holds, per process (the bench's workers need
#: ~57 MB each before their shuffle buffer yields; a full buffer of 1,000 ImageNet-sized samples
#: holds about as much).
EPOCH_AHEAD_BYTES = 64 << 20
#: Bytes per ``read`` call when :class:`SpansAhead` receives a remote span (one request per span).
STREAM_PIECE_BYTES = 1 << 20
#: Bytes per ``pread`` of a local span read by :class:`SpansAhead`, aligned to them: a multiple of
#: :data:`REQUEST_BYTES` (the kernel cuts it into aligned requests of that size, sent together).
#: Larger than a chunk's request because these reads run while the process decodes: each ``pread``
#: that returns takes the GIL from the decoding thread, and on a busy machine that hand-over can
#: cost a scheduler slice.
AHEAD_READ_BYTES = 1 << 20

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None
#: what the last range of this process saw: (pid, depth it ended with, its latency), so the next
#: range (the next shard) starts reading ahead at once
_learned: tuple[int, int, float] | None = None


def read_pool() -> ThreadPoolExecutor:
    """This process's read pool, :data:`MAX_DEPTH` threads (a fresh one after ``fork``: threads
    do not survive it); other readers on slow storage (LMDB records) share it."""
    return _executor()


def _executor() -> ThreadPoolExecutor:
    """This process's read pool (a fresh one after ``fork``: threads do not survive it)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=MAX_DEPTH, thread_name_prefix="shardfeed-readahead"))
        return _pool[1]


#: (pid, {path: future of (fd, first bytes read)}) of :func:`open_ahead`, oldest first
_opened: tuple[int, dict] | None = None


def storage_is_slow() -> bool:
    """Whether the last range this process read proved slow (the next one reads ahead at once)."""
    return _learned is not None and _learned[0] == os.getpid()


def _open_and_read(path: str, prepare: Callable[[], object] | None, nbytes: int) -> int:
    if prepare is not None:
        try:
            prepare()
        except Exception:  # noqa: BLE001 - the caller's own call raises it again, in its place
            pass
    fd = os.open(path, os.O_RDONLY)
    if nbytes > 0:  # its first pages into the page cache, in aligned requests read in parallel
        size = REQUEST_BYTES
        count = max(HEAD_REQUESTS, -(-nbytes // size))
        rest = [_executor().submit(os.pread, fd, size, k * size) for k in range(1, count)]
        for read in [lambda: os.pread(fd, size, 0)] + [f.result for f in rest]:
            try:
                read()
            except OSError:
                pass  # the caller's read raises it again
    return fd


def _close_when_done(future) -> None:
    def close(f) -> None:
        try:
            os.close(f.result())
        except Exception:  # noqa: BLE001 - the open failed: nothing to close
            pass
    future.add_done_callback(close)


def open_ahead(path: str | os.PathLike, *, prepare: Callable[[], object] | None = None,
               first_bytes: int = 0) -> bool:
    """Open ``path`` in the read pool and read its first ``first_bytes``, when reads proved slow.

    Args:
        path: the file the caller reads next (a shard).
        prepare: called first in the pool thread (e.g. reading the shard's offset index); what it
            raises is dropped (the caller's own call raises it again in its place).
        first_bytes: bytes from offset 0 to read ahead into the page cache (0: none); rounded up
            to whole aligned requests of :data:`REQUEST_BYTES`, at least :data:`HEAD_REQUESTS`
            of them, read in parallel by the pool.

    Returns:
        Whether it was started (only after a slow range in this process; never twice for a path).
        :func:`take_opened` returns the descriptor; the oldest beyond :data:`MAX_OPENED` is closed.
    """
    global _opened
    if not storage_is_slow():
        return False
    path = os.fspath(path)
    if _opened is None or _opened[0] != os.getpid():
        _opened = (os.getpid(), {})
    waiting = _opened[1]
    if path in waiting:
        return False
    waiting[path] = _executor().submit(_open_and_read, path, prepare, first_bytes)
    while len(waiting) > MAX_OPENED:
        _close_when_done(waiting.pop(next(iter(waiting))))
    return True


def take_opened(path: str | os.PathLike) -> int | None:
    """The descriptor :func:`open_ahead` opened for ``path`` (the caller closes it), or None.

    Raises:
        OSError: the open failed (as ``os.open`` would have, here).
    """
    if _opened is None or _opened[0] != os.getpid():
        return None
    future = _opened[1].pop(os.fspath(path), None)
    return None if future is None else future.result()


def _timed(read_at: Callable[[int, int], bytes], offset: int, nbytes: int) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    data = read_at(offset, nbytes)
    return data, time.perf_counter() - t0


def _depth_for(latency: float, per_chunk: float, max_depth: int) -> int:
    """Requests to keep in flight: twice the read latency over the caller's time per chunk, plus 2.

    Twice, because ``per_chunk`` includes the caller's waits: while it waits for every chunk, the
    time per chunk is ``latency / depth``, so the next depth is ``2 * depth + 2`` (it reaches what
    the storage needs in a few chunks instead of growing by one), and a margin for the jitter of
    the caller's work and of the storage (several workers share it).
    """
    return max(2, min(max_depth, math.ceil(2 * latency / max(per_chunk, 1e-4)) + 2))


def read_ahead(read_at: Callable[[int, int], bytes], plan: Sequence[tuple[int, int, int, int]], *,
               max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
               slow_read_s: float = SLOW_READ_S, request_bytes: int | None = None,
               fd: int | None = None) -> Iterator[bytes]:
    """The reads of ``plan`` in order, read ahead once the storage proves slow.

    Args:
        read_at: ``read_at(offset, nbytes) -> bytes``, safe to call from several threads at once
            (``os.pread`` on one file descriptor is).
        plan: ``(first sample, end sample, first byte, end byte)`` per read, increasing.
        max_depth: Most requests in flight (``>= 1``).
        max_bytes: Most bytes in flight (one request always goes out).
        slow_read_s: Read time, seconds, above which reading ahead starts.
        request_bytes: None: each chunk of ``plan`` is one ``read_at`` call. Else, once reading
            ahead, the rest of the plan's bytes are read in requests of this size aligned to it
            (see :data:`REQUEST_BYTES`) and each chunk is cut from them: one request of the
            storage each, none split by the kernel's read-around of its neighbours.
        fd: with ``request_bytes``, the descriptor ``read_at`` reads (a local or mounted file):
            the aligned requests are then asked of the kernel (``posix_fadvise(WILLNEED)``, which
            sends them to the file system without waiting) and each chunk is one ``read_at`` in
            the caller's thread from the page cache, instead of read by the pool
            (:func:`_read_hinted`). Where the hint is unavailable, fails or blocks, the pool reads.

    Yields:
        ``read_at(a, b - a)`` for each ``(_, _, a, b)`` of ``plan`` (with ``request_bytes``: the
        same bytes, cut from the aligned requests; shorter only where a request came back short).

    Raises:
        What ``read_at`` raises, at the chunk whose read failed (with ``request_bytes``: the first
        chunk that needs the failed request's bytes).
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
    if request_bytes and fd is not None and _HINTS:
        yield from _read_hinted(fd, read_at, plan, i, depth, latency, max_depth, max_bytes, slow_read_s,
                                max(4096, int(request_bytes)))
        return
    if request_bytes:
        yield from _read_requests(read_at, plan, i, depth, latency, max_depth, max_bytes, slow_read_s,
                                  max(4096, int(request_bytes)))
        return
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
            if i >= n and not inflight:
                # the last chunk: what the next range starts with is known now (a caller that
                # stops at its last chunk never resumes this generator past the yield).
                # Fast reads again (the data came into the page cache): it starts in the caller's thread.
                _learned = (os.getpid(), depth, latency) if latency > slow_read_s else None
            yield data
            now = time.perf_counter()
            spent = now - last  # the caller's time on this chunk, plus any wait for it
            last = now
            per_chunk = spent if per_chunk is None else 0.8 * per_chunk + 0.2 * spent
            depth = _depth_for(latency, per_chunk, max_depth)
    finally:
        for future, _ in inflight:
            future.cancel()


def _read_requests(read_at: Callable[[int, int], bytes], plan: Sequence[tuple[int, int, int, int]], i: int,
                   depth: int, latency: float, max_depth: int, max_bytes: int, slow_read_s: float,
                   size: int) -> Iterator[bytes]:
    """Chunks ``plan[i:]`` cut from aligned requests of ``size`` bytes read by the pool, in order.

    ``depth`` counts requests in flight (or waiting for the caller); it adapts as in
    :func:`read_ahead`, the caller's time per chunk scaled to a request's share of it. At most
    ``max_bytes`` are held (the requests of the chunk being cut always go out).
    """
    global _learned
    n = len(plan)
    end = plan[-1][3]
    pos = plan[i][2] - plan[i][2] % size  # the next request's offset
    pool = _executor()
    blocks: collections.deque = collections.deque()  # (offset, future of (bytes, seconds)), in order
    per_request = None
    last = time.perf_counter()
    try:
        for k in range(i, n):
            _, _, a, b = plan[k]
            while blocks and blocks[0][0] + size <= a:  # wholly before this chunk (a gap in the plan)
                blocks.popleft()[1].cancel()
            if not blocks and pos + size <= a:
                pos = a - a % size
            while pos < end and (pos < b or (len(blocks) < depth and (len(blocks) + 1) * size <= max_bytes)):
                blocks.append((pos, pool.submit(_timed, read_at, pos, min(size, end - pos))))
                pos += size
            pieces = []
            for off, future in blocks:
                if off >= b:
                    break
                data, took = future.result()
                latency = 0.8 * latency + 0.2 * took
                pieces.append(data[max(0, a - off):b - off])
                if off + len(data) < min(b, off + size, end):
                    break  # came back short (the file ended): the chunk ends there
            while blocks and blocks[0][0] + size <= b:
                blocks.popleft()
            if k + 1 >= n:
                # the last chunk: what the next range starts with (see read_ahead)
                _learned = (os.getpid(), depth, latency) if latency > slow_read_s else None
            yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
            now = time.perf_counter()
            spent = (now - last) * size / max(b - a, 1)  # the caller's time per request's worth of bytes
            last = now
            per_request = spent if per_request is None else 0.8 * per_request + 0.2 * spent
            depth = _depth_for(latency, per_request, max_depth)
    finally:
        for _, future in blocks:
            future.cancel()


#: Whether this platform has ``posix_fadvise`` (Linux; not macOS or Windows).
_HINTS = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")


#: Hints in a row that took about the read latency (a file system that reads them synchronously)
#: after which the rest of the range is read by the pool.
SLOW_HINTS = 3


def _hint(fd: int, offset: int, size: int) -> float | None:
    """Ask the kernel to read ``[offset, offset + size)`` of ``fd`` into the page cache without
    waiting (one request of the file system). Returns the seconds the call took, or None when
    it failed (the caller reads ahead by the pool instead)."""
    t0 = time.perf_counter()
    try:
        os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
    except OSError:
        return None
    return time.perf_counter() - t0


def _read_hinted(fd: int, read_at: Callable[[int, int], bytes], plan: Sequence[tuple[int, int, int, int]], i: int,
                 depth: int, latency: float, max_depth: int, max_bytes: int, slow_read_s: float,
                 size: int) -> Iterator[bytes]:
    """Chunks ``plan[i:]``, each one ``read_at`` in the caller's thread, the aligned requests of
    ``size`` bytes that hold them asked ahead of the kernel (:func:`_hint`).

    The kernel sends each hint as one request of the file system (a FUSE mount's background
    read, an NFS READ) and returns at once; the chunk's own read then copies the pages from the
    page cache, waiting only for pages still in flight. No thread and no intermediate ``bytes``
    per request. ``depth`` counts requests asked ahead of the chunk being read and adapts as in
    :func:`read_ahead`; the latency is learned from the reads that waited (from the request's
    hint to the end of the read) and, after the range's first chunk (whose pages a read ahead of
    the file's start may hold), from those whose request went out just before the read and still
    came back within ``slow_read_s`` (the storage is fast again). At most
    ``max_bytes`` are asked ahead (the requests of the chunk being read always go out). A hint
    that fails, or :data:`SLOW_HINTS` in a row that each took half the latency or more (the file
    system read them before returning; a single slow one is the scheduler's), hand the rest of
    the plan to :func:`_read_requests`.
    """
    global _learned
    n = len(plan)
    end = plan[-1][3]
    pos = plan[i][2] - plan[i][2] % size  # the next request's offset
    asked: collections.deque = collections.deque()  # (offset, time the hint went out), in order
    per_request = None
    slow_hints = 0
    last = time.perf_counter()
    for k in range(i, n):
        _, _, a, b = plan[k]
        while asked and asked[0][0] + size <= a:
            asked.popleft()
        if not asked and pos + size <= a:
            pos = a - a % size
        fresh = pos  # requests from here on are asked in this step
        while pos < end and (pos < b or (len(asked) < depth and (len(asked) + 1) * size <= max_bytes)):
            took = _hint(fd, pos, min(size, end - pos))
            slow_hints = 0 if took is not None and took < max(slow_read_s, latency / 2) else slow_hints + 1
            if took is None or slow_hints >= SLOW_HINTS:
                yield from _read_requests(read_at, plan, k, depth, latency, max_depth, max_bytes, slow_read_s, size)
                return
            asked.append((pos, time.perf_counter()))
            pos += size
        t0 = time.perf_counter()
        data = read_at(a, b - a)
        now = time.perf_counter()
        # the hint of the chunk's last request: (offset, when it went out)
        off, newest = next(((o, t) for o, t in reversed(asked) if o < b), (a, t0))
        if now - t0 > slow_read_s or (k > i and off >= fresh and now - newest <= slow_read_s):
            latency = 0.8 * latency + 0.2 * (now - newest)
        while asked and asked[0][0] + size <= b:
            asked.popleft()
        if k + 1 >= n:
            # the last chunk: what the next range starts with (see read_ahead)
            _learned = (os.getpid(), depth, latency) if latency > slow_read_s else None
        yield data
        now = time.perf_counter()
        spent = (now - last) * size / max(b - a, 1)  # the caller's time per request's worth of bytes
        last = now
        per_request = spent if per_request is None else 0.8 * per_request + 0.2 * spent
        depth = _depth_for(latency, per_request, max_depth)


def read_shard_ahead(read_at: Callable[[int, int], bytes], plan: Sequence[tuple[int, int, int, int]], *,
                     fd: int | None = None) -> Iterator[bytes]:
    """:func:`read_ahead` of a shard's chunks, read ahead in aligned requests of
    :data:`REQUEST_BYTES` (the ``chunk_reader`` of
    :func:`~shardfeed.readers.format.tario_indexed.iter_indexed_samples`).

    Args and yields: as :func:`read_ahead` (``fd``: the shard's descriptor, which ``read_at``
    reads: the requests go out as kernel read-ahead hints).

    Raises:
        What ``read_at`` raises, at the first chunk that needs the failed request's bytes.
    """
    return read_ahead(read_at, plan, request_bytes=REQUEST_BYTES, fd=fd)


class HeldBytes:
    """Bytes ``[start, end)`` of one file, held in memory as consecutive blocks.

    Args:
        start, end: the span (byte offsets of the file).
        base: the file offset of the first block's first byte (``<= start``).
        blocks: the file's bytes from ``base`` on, in order (any lengths); they reach ``end``.
        file: ``(path, identity)`` of the local file read (:func:`_file_identity` of its
            descriptor), or None; :meth:`SpansAhead.take` serves the bytes only while ``path``
            is still that file.
    """

    def __init__(self, start: int, end: int, base: int, blocks: list[bytes], *,
                 file: tuple[str, tuple] | None = None):
        self.start, self.end, self.blocks, self.file = start, end, blocks, file
        self._starts = list(itertools.accumulate((len(b) for b in blocks[:-1]), initial=base))

    @property
    def nbytes(self) -> int:
        """Bytes held (the blocks' lengths)."""
        return sum(len(b) for b in self.blocks)

    def read_at(self, offset: int, nbytes: int) -> bytes:
        """The file's bytes ``[offset, offset + nbytes)``, cut at the span's end.

        Raises:
            ValueError: ``offset`` lies before the span's start.
        """
        if offset < self.start:
            raise ValueError(f"offset {offset} lies before the held span's start {self.start}")
        stop = min(offset + max(0, nbytes), self.end)
        k = bisect.bisect_right(self._starts, offset) - 1
        pieces = []
        pos = offset
        while pos < stop:
            at = pos - self._starts[k]
            piece = self.blocks[k][at:at + stop - pos]
            pieces.append(piece)
            pos += len(piece)
            k += 1
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class SpansAhead:
    """Byte spans of files read ahead in a background thread and held until taken.

    A fresh thread calls ``plan()`` once (it may read small files, e.g. offset indexes) for the
    spans, ``(key, source, start, end)`` each: ``source`` a local path (read in aligned ``pread`` calls of
    :data:`AHEAD_READ_BYTES` by the read pool, :func:`read_pool`, every local span's reads queued
    at once) or a callable returning ``(stream, stream_offset)`` opened at ``start`` (read by this
    thread in ``read`` calls of :data:`STREAM_PIECE_BYTES`, one span after the other). The spans
    are cut to ``max_bytes`` in all: from the first span that would cross it on, none is read.
    A span whose read fails (any exception, a short file, a stream that did not start at
    ``start``) is held as None: the caller reads it itself, and meets the error there.

    Args:
        plan: returns the spans (keys distinct and hashable).
        max_bytes: most bytes held (plus, for a local span, less than one read's alignment,
            :data:`AHEAD_READ_BYTES`, on each side).

    The object belongs to the process that made it (:attr:`pid`); after ``fork`` a child sees
    nothing held.
    """

    def __init__(self, plan: Callable[[], Sequence[tuple[object, object, int, int]]], *,
                 max_bytes: int = EPOCH_AHEAD_BYTES):
        self.pid = os.getpid()
        self.max_bytes = int(max_bytes)
        self._spans: dict[object, tuple[int, int, Future]] = {}
        self._planned = threading.Event()
        self._stopped = False
        #: seconds from the start to the last span read (None until then)
        self.elapsed: float | None = None
        self._thread = start_thread(self._run, args=(plan,), name="shardfeed-epoch-ahead", stop=self._stop)

    def _stop(self) -> None:
        self._stopped = True

    def spans(self) -> dict[object, tuple[int, int]]:
        """``{key: (start, end)}`` of the spans planned and not yet taken (waits for the plan)."""
        if self.pid != os.getpid():
            return {}
        self._planned.wait()
        return {k: (a, b) for k, (a, b, _) in list(self._spans.items())}

    def take(self, key: object) -> HeldBytes | None:
        """The span ``key``'s bytes (waits for them), or None: not planned, already taken, not
        read (failed), another process's, or of a local file that changed since it was read
        (replaced, truncated, extended or modified: another inode, size or modification time).
        The span is no longer held here."""
        if self.pid != os.getpid():
            return None
        self._planned.wait()
        entry = self._spans.pop(key, None)
        held = None if entry is None else entry[2].result()
        if held is not None and held.file is not None:
            path, identity = held.file
            try:
                same = _file_identity(os.stat(path)) == identity
            except OSError:
                same = False
            if not same:
                return None
        return held

    def discard(self, key: object) -> None:
        """Drop the span ``key`` without waiting for it (its bytes go when its reads end)."""
        if self.pid == os.getpid():
            self._planned.wait()
            self._spans.pop(key, None)

    def close(self) -> None:
        """Drop every span not taken (one being read is dropped when its reads end)."""
        self._stopped = True
        if self.pid == os.getpid():
            self._planned.wait()
            self._spans.clear()

    def held_bytes(self) -> int:
        """Bytes of the spans read and not yet taken (a span still being read counts 0)."""
        if self.pid != os.getpid():
            return 0
        return sum(f.result().nbytes for _, _, f in list(self._spans.values())
                   if f.done() and f.result() is not None)

    def _run(self, plan) -> None:
        t0 = time.perf_counter()
        spans = []
        try:
            total = 0
            for key, source, a, b in plan():
                if b <= a or total + (b - a) > self.max_bytes:
                    break
                total += b - a
                spans.append((key, source, int(a), int(b), Future()))
        except Exception:  # noqa: BLE001 - nothing read ahead: the caller reads (and raises) itself
            pass
        self._spans = {key: (a, b, f) for key, _, a, b, f in spans}
        self._planned.set()
        local = []
        for _, source, a, b, future in spans:  # every local span's requests queued first
            if isinstance(source, (str, os.PathLike)):
                try:
                    local.append((future, a, b, *_request_span(os.fspath(source), a, b)))
                except Exception:  # noqa: BLE001 - read by the caller instead
                    future.set_result(None)
        stopped = lambda: self._stopped  # noqa: E731 - closed: the reads not yet done are dropped
        for future, a, b, fd, base, requests, file in local:
            future.set_result(_gather_requests(fd, a, b, base, requests, file=file, stopped=stopped))
        for _, source, a, b, future in spans:
            if not future.done():
                future.set_result(None if self._stopped else _receive_span(source, a, b, stopped=stopped))
        self.elapsed = time.perf_counter() - t0


def _file_identity(st: os.stat_result) -> tuple:
    """What tells one version of a file from another: device, inode, size, modification time (ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _request_span(path: str, a: int, b: int) -> tuple[int, int, list, tuple[str, tuple]]:
    """Open ``path`` and queue aligned requests covering ``[a, b)`` in the read pool: ``(fd, base,
    futures of bytes, (path, identity of the file opened))``.

    Raises:
        OSError: ``path`` cannot be opened, or ``[a, b)`` does not lie inside the file.
    """
    size = AHEAD_READ_BYTES
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if not 0 <= a < b <= st.st_size:
            raise OSError(f"{path}: bytes [{a}, {b}) do not lie inside the file ({st.st_size} bytes)")
    except BaseException:
        os.close(fd)
        raise
    base = a - a % size
    pool = _executor()
    return fd, base, [pool.submit(os.pread, fd, size, off) for off in range(base, b, size)], (path, _file_identity(st))


def _gather_requests(fd: int, a: int, b: int, base: int, requests: list, *, file: tuple[str, tuple] | None = None,
                     stopped: Callable[[], bool] = lambda: False) -> HeldBytes | None:
    """The requests' bytes as a :class:`HeldBytes` of ``[a, b)`` (None: a read failed or came
    back short before ``b``, or ``stopped()`` turned true); closes ``fd``."""
    blocks = []
    try:
        for f in requests:
            if stopped():
                return None
            try:
                blocks.append(f.result())
            except Exception:  # noqa: BLE001 - the caller's read raises it again
                return None
    finally:
        for f in requests:
            f.cancel()
        try:
            for f in requests:
                if not f.cancelled():
                    f.exception()  # the fd stays open until every request that started ended
        finally:
            os.close(fd)
    if any(len(x) != AHEAD_READ_BYTES for x in blocks[:-1]) or base + sum(len(x) for x in blocks) < b:
        return None
    return HeldBytes(a, b, base, blocks, file=file)


def _receive_span(source: Callable[[], tuple], a: int, b: int, *,
                  stopped: Callable[[], bool] = lambda: False) -> HeldBytes | None:
    """A remote span read through one stream ``source()`` opened at ``a`` (None: it failed, or
    ``stopped()`` turned true between two pieces)."""
    try:
        stream, offset = source()
    except Exception:  # noqa: BLE001 - the caller's own open raises it again
        return None
    try:
        if offset != a:
            return None
        blocks = []
        left = b - a
        while left > 0:
            if stopped():
                return None
            piece = stream.read(min(STREAM_PIECE_BYTES, left))
            if not piece:
                return None
            blocks.append(piece)
            left -= len(piece)
        return HeldBytes(a, b, a, blocks)
    except Exception:  # noqa: BLE001 - read by the caller instead, which meets the error itself
        return None
    finally:
        try:
            stream.close()
        except Exception:  # noqa: BLE001 - nothing more to read from it
            pass
