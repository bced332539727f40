"""A fast, deterministic tar writer for WebDataset shards (ours: importing webdataset imports torch).

Each member is a POSIX ustar header with fixed metadata (mtime :data:`TAR_MTIME`, mode 0644,
uid/gid 0, empty user/group names), so identical input gives byte-identical shards. Member
names are ``{key}.{ext}``: short by construction (keys are digits), so no PAX/GNU long-name
records are ever needed. A shard is written under a temporary name in its output folder,
hashed (sha256) while it is written, and renamed into place when complete; its offset index
(``.idx``) is written atomically first, so a ``.tar`` under its final name is always complete.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from shardfeed.readers.format import (
    TAR_BLOCK,
    TAR_MODE,
    TAR_MTIME,
    ShardEntry,
    encode_index,
    write_bytes_atomic,
)

__all__ = ["tar_header", "TarShardFile", "END_OF_ARCHIVE_BYTES", "MAX_MEMBER_BYTES"]

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


def tar_header(name: bytes, size: int) -> bytes:
    """A 512-byte ustar header for a regular file ``name`` of ``size`` bytes, fixed metadata.

    Raises:
        ValueError: name longer than 100 bytes, or size beyond the ustar limit (8 GiB).
    """
    if len(name) > 100:
        raise ValueError(f"tar member name {name!r} is longer than 100 bytes")
    if size > MAX_MEMBER_BYTES:
        raise ValueError(f"tar member {name!r} of {size} bytes exceeds the 8 GiB ustar limit")
    h = _TEMPLATE.copy()
    h[0:len(name)] = name
    size_field = b"%011o\0" % size
    h[124:136] = size_field
    chksum = _FIXED_SUM + sum(name) + sum(size_field)
    h[148:156] = b"%06o\0 " % chksum
    return bytes(h)


class TarShardFile:
    """Writes one WebDataset shard and its offset index atomically.

    Usage::

        shard = TarShardFile(out_dir, "shard-000000.tar", "shard-000000.idx")
        shard.add_sample("000000000", [("jpg", jpeg_bytes), ("cls", b"3"), ("json", b"{...}")])
        entry = shard.close()   # ShardEntry with num_bytes, sha256, index_sha256

    The data goes to ``.{name}.tmp`` in ``out_dir``; :meth:`close` writes the ``.idx`` atomically,
    then fsyncs and renames the tar into place. :meth:`abort` removes the temporary file.
    """

    def __init__(self, out_dir: str | os.PathLike, name: str, index_name: str | None,
                 buffer_bytes: int = 1 << 20):
        self.out_dir = Path(out_dir)
        self.name = name
        self.index_name = index_name
        self.final_path = self.out_dir / name
        self.tmp_path = self.out_dir / f".{name}.tmp"
        self._f = open(self.tmp_path, "wb", buffering=0)
        self._hash = hashlib.sha256()
        self._parts: list[bytes] = []
        self._buffered = 0
        self._buffer_bytes = buffer_bytes
        self.offsets: list[int] = []
        self.num_bytes = 0

    def add_sample(self, key: str, members: list[tuple[str, bytes]]) -> int:
        """Append one sample's members contiguously. Returns the sample's bytes on disk."""
        start = self.num_bytes
        self.offsets.append(start)
        parts = self._parts
        written = 0
        for ext, data in members:
            n = len(data)
            parts.append(tar_header(f"{key}.{ext}".encode("utf-8"), n))
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

    def _flush(self) -> None:
        if self._parts:
            buf = b"".join(self._parts)
            self._hash.update(buf)
            mv = memoryview(buf)
            try:
                while mv:
                    n = self._f.write(mv)
                    mv = mv[n:]
            except OSError as exc:
                raise OSError(exc.errno, f"{self.tmp_path}: writing shard {self.name} failed ({exc.strerror}); "
                                         "free space (or fix the output) and finish with --resume") from None
            self._parts.clear()
            self._buffered = 0

    def close(self) -> ShardEntry:
        """Finish the archive, write the index, rename into place.

        Returns:
            The shard's :class:`~shardfeed.readers.format.ShardEntry` (``num_bytes``, ``sha256``...).
        """
        self._parts.append(_ZERO_BLOCK * 2)
        self.num_bytes += END_OF_ARCHIVE_BYTES
        self._flush()
        try:
            os.fsync(self._f.fileno())
        except OSError as exc:
            raise OSError(exc.errno, f"{self.tmp_path}: syncing shard {self.name} failed ({exc.strerror}); "
                                     "free space (or fix the output) and finish with --resume") from None
        self._f.close()
        index_sha = None
        if self.index_name:
            index_bytes = encode_index(self.offsets)
            write_bytes_atomic(self.out_dir / self.index_name, index_bytes)
            index_sha = hashlib.sha256(index_bytes).hexdigest()
        os.replace(self.tmp_path, self.final_path)
        return ShardEntry(self.name, len(self.offsets), self.num_bytes, self._hash.hexdigest(),
                          self.index_name, index_sha)

    def abort(self) -> None:
        """Drop the partial shard (temporary file removed; nothing under the final name)."""
        try:
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
