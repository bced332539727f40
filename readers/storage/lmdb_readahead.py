"""Reading an LMDB database's upcoming records ahead, with several requests in flight.

LMDB reads through a memory map: a record whose pages are not in memory costs page faults, each
one a synchronous request to the storage (on a FUSE or network mount, a round trip). py-lmdb
touches every page of a value it returns (``get`` and a cursor's ``value`` alike, with the GIL
released), so a thread pool already overlaps records, but each record still costs a round trip
per fault: about two, in series, for a 70 KB record with the kernel's 128 KiB read-around, and
~17 (4 KiB each) without it, as a database over half the RAM is opened (measured on the storage
emulator at 10 ms, one process, 640 of 1,600 records in shuffled order, batches of 64, 32
threads: through the map ~1,000 records/s with read-around, 915 requests, 100 MB fetched for 45
MB of records; 131 records/s without, 11,027 requests; by one ``os.pread`` each, 1,330 and 1,020
records/s, 666 and 681 requests, 46 MB; ``scripts/bench_readahead.py`` compares them in a loader).

:class:`ValueReader` finds a record's bytes in ``data.mdb`` without the map and reads them with
one ``os.pread`` (GIL released) on its own descriptor, opened with ``POSIX_FADV_RANDOM`` (the
kernel asks for the record's pages, no read-around):

1. the current meta page (of the two, the one with the newest transaction) gives the page
   size and the main B-tree's root; it must agree with what LMDB itself reports
   (``env.stat()``: page size, depth, page and entry counts; ``env.info()``: the last
   transaction and page numbers) or the reader is refused;
2. the key is looked up from the root down, each branch and leaf page read once by ``pread``
   (4 KiB each, kept in a bounded cache of :data:`MAX_PAGES` pages, at most
   :data:`MAX_PAGE_BYTES`) and searched with LMDB's default key order (bytes, then length);
3. the leaf node gives the value's range: inside the leaf page (a small value) or in
   consecutive overflow pages (a large one, which is read together with its page header: the
   header must name the page and say it is an overflow page of at least the value's size).

The database is read-only and never written while open (see :mod:`~shardfeed.readers.storage.lmdb_io`),
so these bytes are the map's. No read reaches outside the file. Anything unexpected (another
layout, a node with duplicates or sub-databases, a big-endian or 32-bit build) raises, and the
caller reads the record through the map instead.

:class:`ValueStream` gives the values of a queue of keys in order while at most
``max_records`` records and ``max_bytes`` bytes are read ahead of the caller (read, or being
read, and not yet taken); keys can be queued while earlier ones are read, so a caller that
knows what it will ask for next has those reads in flight while it works. A record that does
not fit the byte bound is read when the caller reaches it, in the caller's thread; a single
record larger than the bound is read alone. :func:`read_values_ahead` yields the values of a
list of keys through one.
"""

from __future__ import annotations

import collections
import os
import struct
import sys
import threading
import time
from concurrent.futures import Executor
from typing import Callable, Iterable, Iterator, Sequence

__all__ = ["ValueReader", "ValueStream", "read_values_ahead", "MAX_RECORDS", "MAX_BYTES", "MAX_PAGES",
           "MAX_PAGE_BYTES"]

#: Most records read ahead of the caller, per reader.
MAX_RECORDS = 32
#: Most bytes read ahead of the caller, per reader.
MAX_BYTES = 6 << 20
#: Most B-tree pages (branch and leaf, one LMDB page each) a :class:`ValueReader` keeps, of 4 KiB;
#: of a larger page size fewer, as many as fit in :data:`MAX_PAGE_BYTES`.
MAX_PAGES = 4096
#: Most bytes of B-tree pages a :class:`ValueReader` keeps (whatever page size the file declares).
MAX_PAGE_BYTES = MAX_PAGES * 4096

_DEFERRED = object()  # a worker's answer: the record did not fit the byte bound, read it later

# LMDB's on-disk layout (lmdb.h / mdb.c, data version 1, 64-bit little-endian builds)
_MAGIC, _DATA_VERSION = 0xBEEFC0DE, 1
_PAGEHDRSZ = 16  # pgno u64, pad u16, flags u16, lower u16, upper u16 (or pages u32)
_NODESIZE = 8  # lo u16, hi u16, flags u16, ksize u16, then the key and the data
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA = 0x01
_P_INVALID = 0xFFFFFFFFFFFFFFFF
_MAX_DEPTH = 64  # a B-tree of 2^64 entries is shallower
_PAGE_HEADER = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
# pad (the page size, in the free DB), flags, depth, branch/leaf/overflow pages, entries, root
_DB = struct.Struct("<IHHQQQQQ")
_META_HEAD = struct.Struct("<IIQQ")  # magic, version, address, map size


def _read_meta(fd: int, size: int) -> dict:
    """The newest of the two meta pages: ``{"psize", "txnid", "last_pgno", "flags", "depth",
    "branch_pages", "leaf_pages", "overflow_pages", "entries", "root"}`` of the main database.

    Raises:
        OSError: not an LMDB data file of the layout above.
    """
    metas = []
    psize = None
    need = _PAGEHDRSZ + _META_HEAD.size + 2 * _DB.size + 16
    if size < need:  # no read past the end of the file, even a short one
        raise OSError("data.mdb is shorter than its meta pages")
    for n in (0, 1):
        off = 0 if n == 0 else psize
        page = os.pread(fd, need, off)
        if len(page) < need:
            raise OSError("data.mdb is shorter than its meta pages")
        magic, version, _, _ = _META_HEAD.unpack_from(page, _PAGEHDRSZ)
        if magic != _MAGIC or version != _DATA_VERSION:
            raise OSError("data.mdb: not an LMDB data file of the known layout")
        at = _PAGEHDRSZ + _META_HEAD.size
        free_db = _DB.unpack_from(page, at)
        main_db = _DB.unpack_from(page, at + _DB.size)
        last_pgno, txnid = struct.unpack_from("<QQ", page, at + 2 * _DB.size)
        if n == 0:
            psize = free_db[0]
            if not 512 <= psize <= 65536 or psize & (psize - 1) or 2 * psize > size:
                raise OSError(f"data.mdb: implausible page size {psize}")
        pad, flags, depth, branch, leaf, overflow, entries, root = main_db
        metas.append({"psize": psize, "txnid": txnid, "last_pgno": last_pgno, "flags": flags, "depth": depth,
                      "branch_pages": branch, "leaf_pages": leaf, "overflow_pages": overflow, "entries": entries,
                      "root": root})
    return metas[1] if metas[1]["txnid"] > metas[0]["txnid"] else metas[0]


class ValueReader:
    """Reads values of one open LMDB environment by ``os.pread`` (see the module docstring).

    One per process and environment: it holds a descriptor of ``data.mdb`` (``close`` it) and a
    bounded cache of the B-tree's pages. Thread-safe.

    Args:
        env: the environment (read-only, from :func:`~shardfeed.readers.storage.lmdb_io.open_lmdb_readonly`).
        data_path: its ``data.mdb``.

    Raises:
        OSError: ``data_path`` cannot be opened, is not of the known layout, or does not describe
            the same database as ``env`` (page size, depth, page and entry counts, last transaction
            and page numbers), or this is not
            a 64-bit little-endian build.
    """

    def __init__(self, env, data_path: str | os.PathLike) -> None:
        if sys.byteorder != "little" or struct.calcsize("P") != 8:
            raise OSError("LMDB pages are parsed on 64-bit little-endian builds only")
        self.path = os.fspath(data_path)
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
            #: bytes of ``data.mdb``; no read reaches past them
            self.size = os.fstat(self.fd).st_size
            meta = _read_meta(self.fd, self.size)
            stat = env.stat()
            info = env.info()  # the map's newest meta: a file replaced since the open differs here
            same = all(meta[k] == stat[k] for k in ("psize", "depth", "branch_pages", "leaf_pages",
                                                    "overflow_pages", "entries"))
            same = same and meta["txnid"] == info["last_txnid"] and meta["last_pgno"] == info["last_pgno"]
            if not same or meta["flags"] != 0:
                raise OSError(f"{self.path}: its meta page does not describe the open database "
                              "(or a database with duplicates or integer keys)")
        except BaseException:
            os.close(self.fd)
            raise
        self.psize = meta["psize"]
        #: most pages kept (:data:`MAX_PAGES`, fewer of pages over 4 KiB: :data:`MAX_PAGE_BYTES`)
        self.max_pages = max(1, min(MAX_PAGES, MAX_PAGE_BYTES // self.psize))
        self._root = meta["root"]
        self._pages: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the descriptor."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def _page(self, pgno: int) -> bytes:
        page = self._pages.get(pgno)
        if page is None:
            if not 2 <= pgno or (pgno + 1) * self.psize > self.size:
                raise OSError(f"{self.path}: page {pgno} lies outside the file")
            page = os.pread(self.fd, self.psize, pgno * self.psize)
            if len(page) != self.psize or _PAGE_HEADER.unpack_from(page)[0] != pgno:
                raise OSError(f"{self.path}: page {pgno} does not read back as that page")
            with self._lock:
                while len(self._pages) >= self.max_pages:
                    self._pages.pop(next(iter(self._pages)))
                self._pages[pgno] = page
        return page

    def _node(self, page: bytes, i: int) -> tuple[int, int, int, bytes]:
        """``(node offset, lo | hi << 16, flags, key)`` of node ``i`` of ``page``."""
        at = struct.unpack_from("<H", page, _PAGEHDRSZ + 2 * i)[0]
        if not _PAGEHDRSZ <= at <= self.psize - _NODESIZE:
            raise OSError(f"{self.path}: a node outside its page")
        lo, hi, flags, ksize = _NODE.unpack_from(page, at)
        if at + _NODESIZE + ksize > self.psize:
            raise OSError(f"{self.path}: a key outside its page")
        return at, lo | hi << 16, flags, page[at + _NODESIZE:at + _NODESIZE + ksize]

    def span(self, key: bytes) -> tuple[int, int] | None:
        """``(offset, length)`` of ``key``'s value in ``data.mdb``, or None when there is no such key.

        Reads the B-tree's pages on the way (cached), never the value's.

        Raises:
            OSError: a page is not what LMDB would have there, or the value lies outside the file.
        """
        key = bytes(key)
        pgno = self._root
        if pgno == _P_INVALID:
            return None
        for _ in range(_MAX_DEPTH):
            page = self._page(pgno)
            _, _, flags, lower, _ = _PAGE_HEADER.unpack(page[:_PAGEHDRSZ])
            n = (lower - _PAGEHDRSZ) >> 1
            if not 0 < n <= (self.psize - _PAGEHDRSZ) // 2:
                raise OSError(f"{self.path}: page {pgno} has no nodes")
            if flags & _P_BRANCH:
                lo_i, hi_i = 1, n  # the last node whose key <= key (node 0's key sorts first)
                while lo_i < hi_i:
                    mid = (lo_i + hi_i) // 2
                    if self._node(page, mid)[3] <= key:
                        lo_i = mid + 1
                    else:
                        hi_i = mid
                _, low, high, _ = self._node(page, lo_i - 1)
                pgno = low | high << 32
                continue
            if flags & _P_LEAF and not flags & ~(_P_LEAF | 0x10):
                return self._leaf_span(page, pgno, n, key)
            raise OSError(f"{self.path}: page {pgno} is neither a branch nor a leaf page")
        raise OSError(f"{self.path}: the B-tree is deeper than {_MAX_DEPTH}")

    def _leaf_span(self, page: bytes, pgno: int, n: int, key: bytes) -> tuple[int, int] | None:
        lo_i, hi_i = 0, n
        while lo_i < hi_i:
            mid = (lo_i + hi_i) // 2
            at, size, flags, k = self._node(page, mid)
            if k == key:
                break
            if k < key:
                lo_i = mid + 1
            else:
                hi_i = mid
        else:
            return None
        if flags & ~_F_BIGDATA:
            raise OSError(f"{self.path}: key {key!r} has duplicates or a sub-database")
        data_at = at + _NODESIZE + len(key)
        if flags & _F_BIGDATA:
            if data_at + 8 > self.psize:
                raise OSError(f"{self.path}: an overflow page number outside its page")
            first = struct.unpack_from("<Q", page, data_at)[0]
            offset = first * self.psize + _PAGEHDRSZ
        else:
            if data_at + size > self.psize:
                raise OSError(f"{self.path}: a value outside its page")
            offset = pgno * self.psize + data_at
        if offset + size > self.size:
            raise OSError(f"{self.path}: record at {offset} (+{size} bytes) lies outside the file ({self.size} bytes)")
        return (offset, size)

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes of ``data.mdb`` at ``offset`` (``os.pread``, GIL released), a
        :meth:`span`. A value in overflow pages (``offset`` just past a page header) is read with
        its page header, which must name an overflow page of that number and size.

        Raises:
            OSError: the read failed or came back short, or the header does not match.
        """
        if length == 0:
            return b""
        if offset % self.psize != _PAGEHDRSZ:  # a small value inside its leaf page
            data = os.pread(self.fd, length, offset)
            if len(data) != length:
                raise OSError(f"{self.path}: short read at {offset} ({len(data)} of {length} bytes)")
            return data
        start = offset - _PAGEHDRSZ
        data = os.pread(self.fd, length + _PAGEHDRSZ, start)
        if len(data) != length + _PAGEHDRSZ:
            raise OSError(f"{self.path}: short read at {start} ({len(data)} of {length + _PAGEHDRSZ} bytes)")
        pgno, _, flags, _, _ = _PAGE_HEADER.unpack_from(data)
        pages = struct.unpack_from("<I", data, 12)[0]
        if pgno * self.psize != start or not flags & _P_OVERFLOW or pages * self.psize < length + _PAGEHDRSZ:
            raise OSError(f"{self.path}: the value at {offset} is not where its overflow page header says")
        return data[_PAGEHDRSZ:]


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


class ValueStream:
    """Values of a growing queue of keys, taken in order, read ahead by a pool within bounds.

    At most ``max_records`` records are looked up or read ahead of the caller (submitted and not
    yet taken) and at most ``max_bytes`` bytes of them held read; a record that does not fit the
    byte bound is read when the caller takes it, in the caller's thread, and a single record larger
    than the bound is read alone. Keys may be appended while earlier ones are still being read
    (:meth:`extend`), so the reads of what the caller will ask for next overlap with its work on
    what it took; :meth:`close` cancels the reads not yet started and drops the ones held.

    Args:
        reader: the environment's :class:`ValueReader`.
        pool: threads that look records up and read them.
        fallback: ``fallback(tag)`` reads the value of the key queued with ``tag`` in the caller's
            thread, used when the pool's read of it failed (so its error, if any, is the ordinary one).
        max_records: most records read ahead of the caller (at least 1).
        max_bytes: most bytes read ahead of the caller.
    """

    def __init__(self, reader: ValueReader, pool: Executor, *, fallback: Callable[[object], bytes | None],
                 max_records: int = MAX_RECORDS, max_bytes: int = MAX_BYTES) -> None:
        self.reader, self.pool, self.fallback = reader, pool, fallback
        self.max_records = max(1, int(max_records))
        self.budget = _Budget(max(1, int(max_bytes)))
        self._queued: collections.deque = collections.deque()  # (key, tag) not yet submitted
        self._pending: collections.deque = collections.deque()  # (tag, future), oldest first
        self._closed = False

    def __len__(self) -> int:
        """Keys queued and not yet taken."""
        return len(self._queued) + len(self._pending)

    def tags(self) -> list:
        """The tags of the keys not yet taken, in order."""
        return [t for t, _ in self._pending] + [t for _, t in self._queued]

    def extend(self, items: Iterable[tuple[bytes, object]]) -> None:
        """Queue ``(key, tag)`` pairs after the ones queued, and start reads up to the bounds.

        Raises:
            ValueError: the stream is closed.
        """
        if self._closed:
            raise ValueError("the value stream is closed")
        self._queued.extend((bytes(k), t) for k, t in items)
        self._fill()

    def _fill(self) -> None:
        while self._queued and len(self._pending) < self.max_records:
            key, tag = self._queued.popleft()
            self._pending.append((tag, self.pool.submit(_fetch, self.reader, key, self.budget)))

    def take(self) -> tuple[object, bytes | None, float]:
        """``(tag, value, seconds)`` of the oldest key not yet taken: its value (None: no such key)
        and how long its lookup and read took in the pool (0 when read in the caller's thread).
        The reads then start up to the bounds again.

        Raises:
            IndexError: nothing is queued.
            What ``fallback`` raises.
        """
        self._fill()
        if not self._pending:
            raise IndexError("no key queued in the value stream")
        tag, future = self._pending.popleft()
        try:
            try:
                value, span, took = future.result()
            except Exception:  # noqa: BLE001 - read it the ordinary way; that raises what is wrong
                return tag, self.fallback(tag), 0.0
            if value is _DEFERRED:
                try:
                    value = self.reader.read(*span)
                except OSError:
                    value = self.fallback(tag)
            elif span is not None:
                self.budget.release(span[1])
            return tag, value, took
        finally:
            self._fill()

    def close(self) -> None:
        """Cancel the reads not yet started and drop what is queued or held (idempotent)."""
        self._closed = True
        self._queued.clear()
        while self._pending:
            self._pending.popleft()[1].cancel()


def read_values_ahead(reader: ValueReader, keys: Sequence[bytes], pool: Executor, *,
                      fallback: Callable[[int], bytes | None], max_records: int = MAX_RECORDS,
                      max_bytes: int = MAX_BYTES) -> Iterator[tuple[bytes | None, float]]:
    """The values of ``keys`` in order (None: no such key), read ahead by ``pool``
    (a :class:`ValueStream` of ``keys``).

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
    stream = ValueStream(reader, pool, fallback=fallback, max_records=max_records, max_bytes=max_bytes)
    try:
        stream.extend((key, k) for k, key in enumerate(keys))
        while len(stream):
            _, value, took = stream.take()
            yield value, took
    finally:
        stream.close()
