"""Reading an LMDB database's upcoming records ahead, with several requests in flight.

LMDB reads through a memory map: a record whose pages are not in memory costs a page fault, and
each fault is one synchronous request to the storage (on a FUSE or network mount, a round trip;
py-lmdb copies a value while holding the GIL, so faults in several threads do not overlap
either). :class:`ValueReader` reads a record's bytes with ``os.pread`` instead, which releases
the GIL, so a thread pool keeps many requests in flight:

1. the record is looked up with a ``buffers=True`` read transaction: ``mdb_get`` walks the
   B-tree (its branch and leaf pages, small and soon all in memory; py-lmdb releases the GIL
   there) and returns a buffer into the map *without touching the value's pages*;
2. the buffer's address minus the map's base address (found once in ``/proc/self/maps``: the
   mapping of ``data.mdb`` that holds the buffer, matched by device and inode, mapped from file
   offset 0) is the value's offset in ``data.mdb``; an LMDB value is contiguous in the file (an
   inline value inside its leaf page, a large one in consecutive overflow pages);
3. ``os.pread`` of exactly that range, on the reader's own descriptor with
   ``POSIX_FADV_RANDOM`` (the kernel asks for the record's pages, no read-around), returns the
   value's bytes, equal to what the map holds (the database is read-only and never written
   while open, see :mod:`~shardfeed.readers.lmdb_io`). A range outside the file, or a map that
   cannot be found, falls back to the ordinary read.

:func:`read_values_ahead` yields the values of a list of keys in order while at most
``max_records`` records and ``max_bytes`` bytes are read ahead of the caller (read, or being
read, and not yet yielded). A record that does not fit the byte bound is read when the caller
reaches it, in the caller's thread; a single record larger than the bound is read alone.

Linux only (``/proc/self/maps``); elsewhere :class:`ValueReader` raises ``OSError`` and the
reader keeps to the memory map.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import Executor
from typing import Callable, Iterator, Sequence

import numpy as np

__all__ = ["ValueReader", "read_values_ahead", "MAX_RECORDS", "MAX_BYTES"]

#: Most records read ahead of the caller, per reader.
MAX_RECORDS = 32
#: Most bytes read ahead of the caller, per reader.
MAX_BYTES = 6 << 20

_DEFERRED = object()  # a worker's answer: the record did not fit the byte bound, read it later


def _map_base(addr: int, dev: int, ino: int) -> int:
    """The address at which file offset 0 of the file ``(dev, ino)`` is mapped, given an address
    inside that mapping.

    Raises:
        OSError: no mapping of that file holds ``addr`` (or ``/proc/self/maps`` is missing).
    """
    want_dev = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            lo, _, hi = parts[0].partition("-")
            if int(lo, 16) <= addr < int(hi, 16) and parts[3] == want_dev and int(parts[4]) == ino:
                return int(lo, 16) - int(parts[2], 16)
    raise OSError("the LMDB map holding the record is not in /proc/self/maps")


class ValueReader:
    """Reads values of one open LMDB environment by ``os.pread`` (see the module docstring).

    One per process and environment: it holds a descriptor of ``data.mdb`` (``close`` it) and
    one ``buffers=True`` read transaction per thread that looks records up.

    Args:
        env: the environment (read-only, from :func:`~shardfeed.readers.lmdb_io.open_lmdb_readonly`).
        data_path: its ``data.mdb``.

    Raises:
        OSError: ``data_path`` cannot be opened, or this system has no ``/proc/self/maps``.
    """

    def __init__(self, env, data_path: str | os.PathLike) -> None:
        if not os.path.exists("/proc/self/maps"):
            raise OSError("no /proc/self/maps: LMDB records are read through the map")
        self.env = env
        self.path = os.fspath(data_path)
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(self.fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        except OSError:
            os.close(self.fd)
            raise
        #: bytes of ``data.mdb``; no read reaches past them
        self.size = st.st_size
        self._file = (st.st_dev, st.st_ino)
        self._base: int | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def close(self) -> None:
        """Close the descriptor (the environment stays open)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def span(self, key: bytes) -> tuple[int, int] | None:
        """``(offset, length)`` of ``key``'s value in ``data.mdb``, or None when there is no such key.

        Looks the key up (branch and leaf pages) without reading the value's pages.

        Raises:
            OSError: the value lies outside the file, or the map cannot be found.
            lmdb.Error: the lookup failed (e.g. the environment was closed).
        """
        txn = getattr(self._local, "txn", None)
        if txn is None:
            txn = self._local.txn = self.env.begin(buffers=True)
        buf = txn.get(key)
        if buf is None:
            return None
        n = len(buf)
        if n == 0:
            return (0, 0)
        addr = np.frombuffer(buf, np.uint8).ctypes.data
        del buf
        if self._base is None:
            with self._lock:
                if self._base is None:
                    self._base = _map_base(addr, *self._file)
        offset = addr - self._base
        if offset < 0 or offset + n > self.size:
            raise OSError(f"{self.path}: record at {offset} (+{n} bytes) lies outside the file ({self.size} bytes)")
        return (offset, n)

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes of ``data.mdb`` at ``offset`` (``os.pread``, GIL released).

        Raises:
            OSError: the read failed or came back short.
        """
        if length == 0:
            return b""
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise OSError(f"{self.path}: short read at {offset} ({len(data)} of {length} bytes)")
        return data


class _Budget:
    """Bytes read ahead and not yet taken, never above ``limit`` unless nothing else is held."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        with self._lock:
            if self.held and self.held + n > self.limit:
                return False
            self.held += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.held -= n


def _fetch(reader: ValueReader, key: bytes, budget: _Budget):
    """In a pool thread: ``(value or None or _DEFERRED, span, seconds the lookup and read took)``."""
    t0 = time.perf_counter()
    span = reader.span(key)
    if span is None:
        return None, None, time.perf_counter() - t0
    if not budget.reserve(span[1]):
        return _DEFERRED, span, time.perf_counter() - t0
    try:
        return reader.read(*span), span, time.perf_counter() - t0
    except BaseException:
        budget.release(span[1])
        raise


def read_values_ahead(reader: ValueReader, keys: Sequence[bytes], pool: Executor, *,
                      fallback: Callable[[int], bytes | None], max_records: int = MAX_RECORDS,
                      max_bytes: int = MAX_BYTES) -> Iterator[tuple[bytes | None, float]]:
    """The values of ``keys`` in order (None: no such key), read ahead by ``pool``.

    Args:
        reader: the environment's :class:`ValueReader`.
        keys: the LMDB keys, in the order the caller takes them.
        pool: threads that look records up and read them.
        fallback: ``fallback(k)`` reads ``keys[k]``'s value in the caller's thread, used when
            the pool's read of it failed (so its error, if any, is the ordinary one).
        max_records: most records looked up or read ahead of the caller (at least 1).
        max_bytes: most bytes read ahead of the caller (a single larger record is read alone).

    Yields:
        ``(value, seconds)`` per key, in order: its value (``bytes``, or None: no such key) and
        how long its lookup and read took in the pool (0 when read in the caller's thread).
        Closing the generator early cancels the reads not yet started.
    """
    max_records = max(1, int(max_records))
    budget = _Budget(max(1, int(max_bytes)))
    pending: collections.deque = collections.deque()
    n = len(keys)
    submitted = 0
    try:
        for k in range(n):
            while submitted < n and submitted - k < max_records:
                pending.append(pool.submit(_fetch, reader, keys[submitted], budget))
                submitted += 1
            future = pending.popleft()
            try:
                value, span, took = future.result()
            except Exception:  # noqa: BLE001 - read it the ordinary way; that raises what is wrong
                yield fallback(k), 0.0
                continue
            if value is _DEFERRED:
                try:
                    value = reader.read(*span)
                except OSError:
                    value = fallback(k)
            elif span is not None:
                budget.release(span[1])
            yield value, took
    finally:
        for future in pending:
            future.cancel()
