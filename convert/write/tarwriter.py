"""A fast, deterministic tar writer for WebDataset shards (ours: importing webdataset imports torch).

Each member is a POSIX ustar header with fixed metadata (mtime :data:`TAR_MTIME`, mode 0644,
uid/gid 0, empty user/group names), so identical input gives byte-identical shards. Member
names are ``{key}.{ext}``: short by construction (keys are digits), so no PAX/GNU long-name
records are ever needed. A shard is written under a temporary name in its output folder,
hashed (sha256) while it is written, and renamed into place when complete; its offset index
(``.sfidx``) is written atomically first, so a ``.tar`` under its final name is always complete.

Speed: a header is six pre-built byte strings joined, its checksum the fixed part's
sum plus the name's and size field's; samples are gathered into ~1 MiB buffers, and a
background thread hashes and writes each buffer while the caller reads the next files
(``hashlib`` and ``os.write`` release the GIL on large buffers, so the sha256 — as costly as
``tar``'s whole work — runs on another core). The thread also starts the disk write-back of
what it wrote (``sync_file_range``), so the ``fsync`` before the rename has little left to wait for.
"""

from __future__ import annotations

import hashlib
import os
import queue
import sys
import threading
from array import array
from pathlib import Path

from shardfeed.readers.format.manifest import TAR_BLOCK, TAR_MODE, TAR_MTIME, ShardEntry
from shardfeed.readers.format.offset_index import encode_index
from shardfeed.readers.file_io import write_bytes_atomic

__all__ = ["tar_header", "TarShardFile", "END_OF_ARCHIVE_BYTES", "MAX_MEMBER_BYTES", "create_new_file",
           "open_own_file"]

#: Two zero blocks close a tar archive.
END_OF_ARCHIVE_BYTES = 2 * TAR_BLOCK
#: Largest member a ustar size field (11 octal digits) can describe.
MAX_MEMBER_BYTES = 8**11 - 1
_ZERO_BLOCK = bytes(TAR_BLOCK)
_PAD = [bytes(i) for i in range(TAR_BLOCK)]


def _template() -> tuple[bytearray, int]:
    h = bytearray(TAR_BLOCK)
    h[100:108] = b"%07o\0" % TAR_MODE
    h[108:116] = b"0000000\0"  # uid
    h[116:124] = b"0000000\0"  # gid
    h[136:148] = b"%011o\0" % TAR_MTIME
    h[156:157] = b"0"  # regular file
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[329:337] = b"0000000\0"  # devmajor
    h[337:345] = b"0000000\0"  # devminor
    fixed_sum = sum(h) + 8 * 0x20  # checksum field counts as spaces
    return h, fixed_sum


_TEMPLATE, _FIXED_SUM = _template()
_T = bytes(_TEMPLATE)
_H_MID = _T[100:124]  # mode, uid, gid
_H_MTIME = _T[136:148]
_H_REST = _T[156:]  # type flag, magic, version, empty names, devices, prefix
_NAME_PAD = [bytes(i) for i in range(101)]
_EXT_BYTES: dict[str, tuple[bytes, int]] = {}  # ext -> (its UTF-8 bytes, their sum)
_SIZE_FIELDS: dict[int, tuple[bytes, int]] = {}  # size -> (ustar size field, its byte sum)


def _size_field(n: int) -> tuple[bytes, int]:
    field = b"%011o\0" % n
    if len(_SIZE_FIELDS) < 1 << 16:
        _SIZE_FIELDS[n] = (field, sum(field))
    return field, sum(field)


def tar_header(name: bytes, size: int) -> bytes:
    """A 512-byte ustar header for a regular file ``name`` of ``size`` bytes, fixed metadata.

    Raises:
        ValueError: name longer than 100 bytes, or size beyond the ustar limit (8 GiB).
    """
    if len(name) > 100:
        raise ValueError(f"tar member name {name!r} is longer than 100 bytes")
    if size > MAX_MEMBER_BYTES:
        raise ValueError(f"tar member {name!r} of {size} bytes exceeds the 8 GiB ustar limit")
    size_field = b"%011o\0" % size
    chksum = _FIXED_SUM + sum(name) + sum(size_field)
    return b"".join((name, _NAME_PAD[100 - len(name)], _H_MID, size_field, _H_MTIME, b"%06o\0 " % chksum, _H_REST))


class _BackgroundSink:
    """Hashes buffers on one thread and writes them on another, in order; errors reach the caller.

    ``hashlib`` and ``os.write`` release the GIL on large buffers, so both run beside the caller's
    Python work (reading files, building headers). At most ``depth`` buffers wait in each queue,
    so memory stays bounded when the disk or the hash is the slower side.
    """

    _STOP = object()
    _FSYNC = object()

    def __init__(self, f, hasher, on_error, depth: int = 4, writeback_bytes: int = 8 << 20):
        self._f = f
        self._hash = hasher
        self._on_error = on_error
        self._hash_q: queue.Queue = queue.Queue(maxsize=depth)
        self._write_q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self._writeback_bytes = writeback_bytes
        self._threads = [threading.Thread(target=self._hash_loop, name="shardfeed-tar-hash", daemon=True),
                         threading.Thread(target=self._write_loop, name="shardfeed-tar-write", daemon=True)]
        for t in self._threads:
            t.start()

    def _hash_loop(self) -> None:
        q, update, stop = self._hash_q, self._hash.update, self._STOP
        while True:
            chunks = q.get()
            if chunks is stop:
                return
            for c in chunks:
                update(c)

    def _write_loop(self) -> None:
        fd = self._f.fileno()
        written = synced = 0
        sync_range = _sync_file_range()
        q, stop = self._write_q, self._STOP
        while True:
            buf = q.get()
            if buf is stop:
                return
            if self.error is not None:
                continue  # drain: the caller raises the error
            if buf is self._FSYNC:  # here, so that it overlaps the hashing still under way
                try:
                    os.fsync(fd)
                except OSError as exc:
                    self.error = self._on_error(exc, "syncing")
                continue
            try:
                _writev_all(self._f, buf)
                written += sum(len(c) for c in buf)
                if sync_range is not None and written - synced >= self._writeback_bytes:
                    # start the disk write-back now (asynchronous), so close()'s fsync waits less
                    sync_range(fd, synced, written - synced)
                    synced = written
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = self._on_error(exc)

    def put(self, buf: bytes) -> None:
        if self.error is not None:
            raise self.error
        self._write_q.put(buf)
        self._hash_q.put(buf)

    def finish(self, fsync: bool = False) -> None:
        """Wait for every buffer to be hashed and written (and the file synced with ``fsync``);
        raise the writer's error, if any."""
        if fsync:
            self._write_q.put(self._FSYNC)
        self._write_q.put(self._STOP)
        self._hash_q.put(self._STOP)
        for t in self._threads:
            t.join()
        if self.error is not None:
            raise self.error


_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start write-out of dirty pages in the range, do not wait
_sync_range_fn: list = []


def _sync_file_range():
    """``start_writeback(fd, offset, nbytes)`` by Linux's ``sync_file_range(..., SYNC_FILE_RANGE_WRITE)``
    (through ctypes: the ``os`` module does not offer it), or None where there is none.

    It only starts the disk write of what is already written (it neither waits nor makes anything
    durable: the fsync before the rename still does that), so that fsync finds most of the shard
    on disk already; a failure is ignored (the fsync reports real I/O errors).
    """
    if not _sync_range_fn:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                raw = libc.sync_file_range
                raw.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                raw.restype = ctypes.c_int

                def fn(fd: int, offset: int, nbytes: int, _raw=raw) -> None:
                    _raw(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)
            except (OSError, AttributeError):
                fn = None
        _sync_range_fn.append(fn)
    return _sync_range_fn[0]


def _encode_offsets(offsets) -> bytes:
    """:func:`~shardfeed.readers.format.offset_index.encode_index`'s bytes (little-endian uint64), without
    passing every offset as an argument to ``struct.pack`` (6 % of a small-file pack)."""
    if sys.byteorder == "little":
        return (offsets if isinstance(offsets, array) and offsets.typecode == "Q" else array("Q", offsets)).tobytes()
    return encode_index(list(offsets))


_BIG_PART = 64 << 10


def _coalesce(parts: list[bytes]) -> list[bytes]:
    """Join runs of small parts (headers, padding, small files); keep big ones as they are.

    Copying an image of 100 KB into a joined buffer is one more pass over memory (the costliest
    part of packing large files on a machine with little memory bandwidth); the writer thread
    writes the chunks with one ``writev`` and the hasher hashes them one by one.
    """
    out: list[bytes] = []
    run: list[bytes] = []
    for p in parts:
        if len(p) >= _BIG_PART:
            if run:
                out.append(run[0] if len(run) == 1 else b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out


def _writev_all(f, chunks: list[bytes]) -> None:
    fd = f.fileno()
    total = sum(len(c) for c in chunks)
    n = os.writev(fd, chunks) if len(chunks) <= 1024 else 0
    if n == total:
        return
    # a short write (or too many chunks for one call): the rest one chunk at a time
    for c in chunks:
        if n >= len(c):
            n -= len(c)
            continue
        _write_all(f, memoryview(c)[n:])
        n = 0


def _write_all(f, buf: bytes) -> None:
    mv = memoryview(buf)
    while mv:
        n = f.write(mv)
        mv = mv[n:]


def create_new_file(path: str | os.PathLike) -> int:
    """Create ``path`` as a new empty file for writing and return its descriptor, never through a link.

    What is at ``path`` already (a temporary file a killed run left, or a link planted there) is
    removed first (a link is removed, not followed); the file is then created with ``O_EXCL |
    O_NOFOLLOW``, so a link planted in between makes it fail rather than write elsewhere.

    Raises:
        IsADirectoryError: ``path`` is a folder (it is not removed).
        OSError: the file cannot be created.
    """
    path = os.fspath(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o666)


def open_own_file(path: str | os.PathLike, *, create: bool, mode: int, where: str, fix: str,
                  what: str = "") -> int | None:
    """Open ``path`` read-write (created with ``mode`` if missing and ``create``), never through a
    link, and only when it is a plain file with no other hard links.

    Args:
        path: the file (a lock file, a staging file).
        create: create it when missing; False returns None for a missing file.
        mode: the permission bits of a new file.
        where: the folder's role in messages (``"an output folder"``).
        fix: the alternative the messages offer (``"choose another output folder"``).
        what: what shardfeed takes the file for, named when it is not that (``"shardfeed's lock file"``).

    Returns:
        The file descriptor (``O_NONBLOCK``: a FIFO planted there never blocks the open), or None.

    Raises:
        OSError: ``path`` is a symbolic link, not a plain file, or has other hard links (named, with
            the fix), or cannot be opened.
    """
    import stat

    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | (os.O_CREAT if create else 0), mode)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(exc.errno, f"{path}: is a symbolic link; shardfeed never writes through a link in "
                                     f"{where}: remove the link (or {fix})") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = "not a plain file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
        raise OSError(f"{path}: is {kind}{', not ' + what if what else ''}; remove it (or {fix})")
    return fd


class TarShardFile:
    """Writes one WebDataset shard and its offset index atomically.

    Usage::

        shard = TarShardFile(out_dir, "shard-000000.tar", "shard-000000.sfidx")
        shard.add_sample("000000000", [("jpg", jpeg_bytes), ("cls", b"3"), ("json", b"{...}")])
        entry = shard.close()   # ShardEntry with num_bytes, sha256, index_sha256

    The data goes to ``.{name}.tmp`` in ``out_dir``; :meth:`close` writes the ``.sfidx`` atomically,
    then fsyncs and renames the tar into place. :meth:`abort` removes the temporary file.
    """

    def __init__(self, out_dir: str | os.PathLike, name: str, index_name: str | None,
                 buffer_bytes: int = 1 << 20, background: bool = True):
        self.out_dir = Path(out_dir)
        self.name = name
        self.index_name = index_name
        self.final_path = self.out_dir / name
        self.tmp_path = self.out_dir / f".{name}.tmp"
        self._f = os.fdopen(create_new_file(self.tmp_path), "wb", buffering=0)
        self._hash = hashlib.sha256()
        self._parts: list[bytes] = []
        self._buffered = 0
        self._buffer_bytes = buffer_bytes
        self._background = background
        self._sink: _BackgroundSink | None = None
        #: byte offset of each sample's first header (uint64: 8 bytes a sample, not a list of ints)
        self.offsets = array("Q")
        self.num_bytes = 0
        #: samples per image extension (the sample's first member), recorded in the manifest
        self.extensions: dict[str, int] = {}

    def _write_error(self, exc: BaseException, doing: str = "writing") -> BaseException:
        if isinstance(exc, OSError):
            return OSError(exc.errno, f"{self.tmp_path}: {doing} shard {self.name} failed ({exc.strerror}); "
                                      "free space (or fix the output) and finish with --resume")
        return exc

    def add_sample(self, key: str, members: list[tuple[str, bytes]]) -> int:
        """Append one sample's members contiguously. Returns the sample's bytes on disk.

        Raises:
            ValueError: a member name longer than 100 bytes, or a member over 8 GiB (nothing of the
                sample is added).
            OSError: writing failed (disk full...): the message names the shard.
        """
        key_b = key.encode("utf-8") + b"."
        for ext, data in members:  # every member checked before any is added: a refused sample leaves nothing
            if len(key_b) + len(ext.encode("utf-8")) > 100 or len(data) > MAX_MEMBER_BYTES:
                tar_header(key_b + ext.encode("utf-8"), len(data))  # raises the precise error
        start = self.num_bytes
        self.offsets.append(start)
        if members and members[0][0] not in ("cls", "json"):
            self.extensions[members[0][0]] = self.extensions.get(members[0][0], 0) + 1
        parts = self._parts
        written = 0
        key_sum = _FIXED_SUM + sum(key_b)
        for ext, data in members:
            n = len(data)
            ext_b = ext.encode("utf-8")
            name = key_b + ext_b
            size_field = b"%011o\0" % n
            chksum = key_sum + sum(ext_b) + sum(size_field)
            parts.append(b"".join((name, _NAME_PAD[100 - len(name)], _H_MID, size_field, _H_MTIME,
                                   b"%06o\0 " % chksum, _H_REST)))
            parts.append(data)
            pad = -n % TAR_BLOCK
            if pad:
                parts.append(_PAD[pad])
            written += TAR_BLOCK + n + pad
        self.num_bytes += written
        self._buffered += written
        if self._buffered >= self._buffer_bytes:
            self._flush()
        return written

    def add_wds_sample(self, key: str, ext: str, data: bytes, cls: bytes, meta: bytes) -> int:
        """``add_sample(key, [(ext, data), ("cls", cls), ("json", meta)])``, same bytes, less work.

        The packer's hot path: the three headers share the key's bytes and checksum part, and
        size fields (with their byte sums) come from a small cache.

        Raises:
            ValueError: a member name longer than 100 bytes, or a member over 8 GiB.
            OSError: writing failed (disk full...): the message names the shard.
        """
        kb = key.encode("utf-8") + b"."
        eb = _EXT_BYTES.get(ext)
        if eb is None:
            eb = _EXT_BYTES[ext] = (ext.encode("utf-8"), sum(ext.encode("utf-8")))
        ext_b, ext_sum = eb
        n, m, k = len(data), len(cls), len(meta)
        nk = len(kb)
        if nk + max(len(ext_b), 4) > 100 or n > MAX_MEMBER_BYTES or k > MAX_MEMBER_BYTES:
            return self.add_sample(key, [(ext, data), ("cls", cls), ("json", meta)])  # raises the precise error
        ks = _FIXED_SUM + sum(kb)
        sf1 = _SIZE_FIELDS.get(n) or _size_field(n)
        sf2 = _SIZE_FIELDS.get(m) or _size_field(m)
        sf3 = _SIZE_FIELDS.get(k) or _size_field(k)
        p1, p2, p3 = -n % TAR_BLOCK, -m % TAR_BLOCK, -k % TAR_BLOCK
        self.offsets.append(self.num_bytes)
        self.extensions[ext] = self.extensions.get(ext, 0) + 1
        self._parts += (
            b"".join((kb, ext_b, _NAME_PAD[100 - nk - len(ext_b)], _H_MID, sf1[0], _H_MTIME,
                      b"%06o\0 " % (ks + ext_sum + sf1[1]), _H_REST)),
            data, _PAD[p1],
            b"".join((kb, b"cls", _NAME_PAD[97 - nk], _H_MID, sf2[0], _H_MTIME, b"%06o\0 " % (ks + 322 + sf2[1]),
                      _H_REST, cls, _PAD[p2],
                      kb, b"json", _NAME_PAD[96 - nk], _H_MID, sf3[0], _H_MTIME, b"%06o\0 " % (ks + 442 + sf3[1]),
                      _H_REST)),
            meta, _PAD[p3],
        )
        written = 1536 + n + p1 + m + p2 + k + p3
        self.num_bytes += written
        self._buffered += written
        if self._buffered >= self._buffer_bytes:
            self._flush()
        return written

    def _flush(self) -> None:
        if not self._parts:
            return
        if self._background:
            chunks = _coalesce(self._parts)
            self._parts.clear()
            self._buffered = 0
            if self._sink is None:
                self._sink = _BackgroundSink(self._f, self._hash, self._write_error)
            self._sink.put(chunks)
            return
        buf = b"".join(self._parts)
        self._parts.clear()
        self._buffered = 0
        self._hash.update(buf)
        try:
            _write_all(self._f, buf)
        except OSError as exc:
            raise self._write_error(exc) from None

    def close(self) -> ShardEntry:
        """Finish the archive, write the index, rename into place.

        Returns:
            The shard's :class:`~shardfeed.readers.format.manifest.ShardEntry` (``num_bytes``, ``sha256``...).
        """
        self._parts.append(_ZERO_BLOCK * 2)
        self.num_bytes += END_OF_ARCHIVE_BYTES
        self._flush()
        if self._sink is not None:
            sink, self._sink = self._sink, None
            sink.finish(fsync=True)
        else:
            try:
                os.fsync(self._f.fileno())
            except OSError as exc:
                raise self._write_error(exc, "syncing") from None
        self._f.close()
        index_sha = None
        if self.index_name:
            index_bytes = _encode_offsets(self.offsets)
            write_bytes_atomic(self.out_dir / self.index_name, index_bytes)
            index_sha = hashlib.sha256(index_bytes).hexdigest()
        os.replace(self.tmp_path, self.final_path)
        return ShardEntry(self.name, len(self.offsets), self.num_bytes, self._hash.hexdigest(),
                          self.index_name, index_sha, dict(sorted(self.extensions.items())))

    def abort(self) -> None:
        """Drop the partial shard (temporary file removed; nothing under the final name)."""
        try:
            if self._sink is not None:
                sink, self._sink = self._sink, None
                try:
                    sink.finish()
                except BaseException:  # noqa: BLE001 - the shard is dropped anyway
                    pass
            self._f.close()
        finally:
            try:
                os.unlink(self.tmp_path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "TarShardFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
