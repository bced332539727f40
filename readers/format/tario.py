"""Fast pure-Python tar reading for WebDataset shards (ours: webdataset's is Python-bound).

The reader parses 512-byte headers straight out of large buffered reads (256 KiB by default)
instead of calling ``file.read`` for every small piece, and checks each header's checksum with
``zlib.adler32`` over the header (a C call) rather than a Python ``sum``. It reads archives made
by any common tool: POSIX ustar (with the 155-byte name prefix), GNU (``L`` long names, base-256
sizes) and PAX (``x`` per-member and ``g`` global records: ``path`` and ``size`` are honoured).
Members that are not regular files (directories, links, devices, FIFOs) are skipped.
The indexed fast path, for a shard whose ``.sfidx`` gives every sample's offset, is
:mod:`shardfeed.readers.format.tario_indexed`.

Checksum rule: the ustar checksum is the sum of the header's bytes with the checksum field read
as spaces. The fast path compares it modulo 65521 (Adler-32's ``A`` half); a header that fails
the fast path is checked exactly, accepting the unsigned and the historic signed-char sums, as
``tarfile`` does.

Errors: a header with a bad checksum or an unparseable size, a member cut short by the end of the
stream, a key that reappears after another key (:func:`iter_samples`) raise
:class:`~shardfeed.readers.errors.CorruptDataError` naming the shard (``source``) and the byte
offset; a half-read member is never yielded. An error from :func:`iter_members` also carries the
offset as an attribute, ``exc.offset``: the first header of the member that could not be read
whole (so every member before it was read completely).

Typical use::

    with open("shard-000000.tar", "rb") as f:
        for key, parts, offset in iter_samples(iter_members(f, source=path), source=path):
            image_bytes, label = parts["jpg"], int(parts["cls"])
"""

from __future__ import annotations

import os
import stat
import zlib
from typing import BinaryIO, Container, Generator, Iterable, Iterator

from ..errors import CorruptDataError

__all__ = ["iter_members", "iter_samples", "skip_stream", "checksum_ok", "DEFAULT_READ_BYTES", "MAX_READ_BYTES",
           "MAX_RECORD_BYTES"]

#: Bytes asked of the stream per read (large reads keep the per-sample Python work small).
DEFAULT_READ_BYTES = 1 << 18

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_SPACES8 = b" " * 8
_ADLER_MOD = 65521
_REGULAR = frozenset(b"07\0")  # regular file, old-style (NUL) regular file, contiguous file
_NO_DATA = frozenset(b"123456")  # links, devices, directories, FIFOs: size field is not data
_PAX_LOCAL = ord("x")
_PAX_GLOBAL = ord("g")
_GNU_LONGNAME = ord("L")
_GNU_LONGLINK = ord("K")
_FIELD_END = frozenset(b"\0 ")
_POSIX_MAGIC = b"ustar\0"
#: The most bytes asked of a stream in one read while a big member is gathered: memory grows with
#: the bytes that really arrive, never with what a (possibly damaged) size field claims.
MAX_READ_BYTES = 16 << 20
#: The largest PAX or GNU long-name record accepted (real ones hold a few hundred bytes).
MAX_RECORD_BYTES = 16 << 20


def _stream_size(stream: BinaryIO) -> int | None:
    """The size in bytes of the regular file behind ``stream``, or None (a socket, a pipe, a wrapper)."""
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError, TypeError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _member_too_big(source: str, offset: int, size: int, total: int | None, what: str,
                    first_offset: int | None = None) -> CorruptDataError | None:
    """The error for a header (at ``offset``; its member's first header, a PAX one, at ``first_offset``)
    whose size field is negative or runs past the end of the shard, else None."""
    if first_offset is not None and first_offset != offset:
        what = f"{what} (extended header at byte offset {first_offset})"
    if size < 0:
        return CorruptDataError(f"{source}: tar header at byte offset {offset} has a negative {what} size ({size}); "
                                "the header is damaged (run `shardfeed check` and repack the shard)")
    if total is not None and offset + _BLOCK + size > total:
        left = max(total - offset - _BLOCK, 0)
        return CorruptDataError(f"{source}: tar header at byte offset {offset} claims a {what} of {size:,} bytes, but "
                                f"only {left:,} bytes of the shard follow it: the header is damaged or the shard "
                                "truncated (run `shardfeed check` and repack the shard)")
    return None


def skip_stream(stream: BinaryIO, num_bytes: int, *, source: str = "<stream>",
                read_bytes: int = DEFAULT_READ_BYTES) -> None:
    """Read and discard ``num_bytes`` bytes (to reach an offset on a stream that cannot seek).

    Raises:
        CorruptDataError: the stream ends first.
    """
    left = num_bytes
    while left > 0:
        chunk = stream.read(min(left, read_bytes))
        if not chunk:
            raise CorruptDataError(f"{source}: stream ended {left} bytes before offset "
                                   f"{num_bytes} while skipping to it (truncated shard?)")
        left -= len(chunk)


def _octal(field: bytes, what: str, source: str, offset: int) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 (sizes of 8 GiB and more)
        value = int.from_bytes(field, "big", signed=False) & ~(0x80 << (8 * (len(field) - 1)))
        return value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise CorruptDataError(f"{source}: tar header at byte offset {offset} has an unreadable "
                               f"{what} field {field!r}; the shard is damaged") from None


def checksum_ok(header: bytes | memoryview) -> bool:
    """Exact tar checksum test (unsigned or signed-char sum), as ``tarfile`` accepts."""
    h = bytes(header)
    try:
        stored = int(h[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    body = h[:148] + _SPACES8 + h[156:]
    unsigned = sum(body)
    signed = unsigned - 256 * sum(1 for b in body if b > 127)
    return stored in (unsigned, signed)


def _parse_pax(data: bytes, source: str, offset: int) -> dict[str, str]:
    """Parse PAX extended header records ``"%d %s=%s\\n"``; returns the keys we use."""
    out: dict[str, str] = {}
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] == 0:  # some writers pad with NULs
            break
        sp = data.find(b" ", pos)
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise CorruptDataError(f"{source}: malformed PAX header at byte offset {offset}") from None
        if sp < 0 or length <= 0 or pos + length > n:
            raise CorruptDataError(f"{source}: malformed PAX header at byte offset {offset}")
        record = data[sp + 1:pos + length - 1]  # drop the trailing newline
        eq = record.find(b"=")
        if eq > 0:
            key = record[:eq].decode("utf-8", "surrogateescape")
            if key in ("path", "size"):
                out[key] = record[eq + 1:].decode("utf-8", "surrogateescape")
        pos += length
    return out


def _position_stream(stream: BinaryIO, start_offset: int, stream_offset: int | None, source: str,
                     read_bytes: int) -> None:
    """Bring ``stream`` to shard offset ``start_offset``: ``seek`` when it can, else read and
    discard from ``stream_offset`` (default ``start_offset``) up to it.

    Raises:
        ValueError: a non-seekable stream stands past ``start_offset``.
        CorruptDataError: the stream ends first.
    """
    seekable = False
    try:
        seekable = bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        pass
    if seekable:
        stream.seek(start_offset)
        return
    at = start_offset if stream_offset is None else stream_offset
    if at > start_offset:
        raise ValueError(f"{source}: stream stands at offset {at}, past start_offset {start_offset}")
    if at < start_offset:
        skip_stream(stream, start_offset - at, source=source, read_bytes=read_bytes)


class _BufferedReads:
    """Buffered reading for :func:`iter_members`: large reads of a stream, never more than needed
    past ``end_offset``, each bounded by :data:`MAX_READ_BYTES` where a size field decides it.

    The buffer itself stays with the caller (a local in its loop); each method takes the unread
    bytes and returns the new buffer. ``fed`` is the shard offset of the next byte the stream
    gives, ``eof`` whether it has ended.
    """

    __slots__ = ("read", "read_bytes", "end_offset", "fed", "eof", "source")

    def __init__(self, stream: BinaryIO, read_bytes: int, end_offset: int | None, fed: int, source: str):
        self.read = stream.read
        self.read_bytes = read_bytes
        self.end_offset = end_offset
        self.fed = fed
        self.eof = False
        self.source = source

    def refill(self, rest: bytes, base: int, in_member: bool) -> bytes:
        """``rest`` (the unread bytes, from shard offset ``base``) followed by at least one
        header's worth of the stream; ``b""`` where the stream ends cleanly (between members).

        Raises:
            CorruptDataError: the stream ends inside a header, or inside a member's extension
                records (``in_member``).
        """
        parts = [rest] if rest else []
        have = len(rest)
        end_offset, read_bytes = self.end_offset, self.read_bytes
        while have < _BLOCK and not self.eof:
            want = read_bytes
            if end_offset is not None:
                want = max(_BLOCK - have, min(read_bytes, end_offset - self.fed))
            chunk = self.read(want)
            if not chunk:
                self.eof = True
                break
            parts.append(chunk)
            have += len(chunk)
            self.fed += len(chunk)
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(buf) < _BLOCK and (buf or in_member):
            raise CorruptDataError(f"{self.source}: truncated tar header at byte offset {base} ({len(buf)} of "
                                   "512 bytes); the shard is incomplete or damaged")
        return buf

    def gather(self, rest: bytes, need: int, offset: int, typeflag: int, size: int) -> bytes:
        """``rest`` (from the record's header at shard offset ``offset``) followed by the stream's
        bytes until ``need`` bytes are held: a small record (PAX, GNU long name) whole in the buffer.

        Raises:
            CorruptDataError: the stream ends first.
        """
        parts = [rest]
        have = len(rest)
        while have < need and not self.eof:
            chunk = self.read(min(max(need - have, self.read_bytes), MAX_READ_BYTES))
            if not chunk:
                self.eof = True
                break
            parts.append(chunk)
            have += len(chunk)
            self.fed += len(chunk)
        if have < need:
            raise CorruptDataError(f"{self.source}: tar record at byte offset {offset} is truncated (type "
                                   f"{chr(typeflag)!r}, {size} bytes); the shard is incomplete or damaged")
        return b"".join(parts)

    def member_rest(self, head: bytes, size: int, skip: int, name: str, first_offset: int) -> bytes:
        """A member's data that runs past the buffer: ``head`` (its bytes in the buffer) and the
        rest read from the stream, then ``skip`` more bytes (the padding) read and dropped.

        Raises:
            CorruptDataError: the stream ends first (the member is truncated).
        """
        tail = [head]
        rest = size - len(head)
        read = self.read
        while rest > 0 or skip > 0:
            chunk = b"" if self.eof else read(min(rest + skip, MAX_READ_BYTES))
            if not chunk:
                self.eof = True
                raise CorruptDataError(
                    f"{self.source}: tar member {name!r} at byte offset {first_offset} is truncated "
                    f"({size - rest} of {size} data bytes); the shard is incomplete or damaged")
            self.fed += len(chunk)
            if rest:
                if len(chunk) > rest:
                    tail.append(chunk[:rest])
                    skip -= len(chunk) - rest
                    rest = 0
                else:
                    tail.append(chunk)
                    rest -= len(chunk)
            else:
                skip -= len(chunk)
        return tail[0] if len(tail) == 1 else b"".join(tail)


def _decode_header(buf: bytes, mv: memoryview, p: int, offset: int, source: str,
                   _adler32=zlib.adler32) -> tuple[int, int, str]:
    """``(typeflag, size, name)`` of the 512-byte header at ``buf[p:]`` (shard offset ``offset``),
    its checksum verified: the size field as octal or GNU base-256, the name with the ustar prefix
    (``""`` for a record that is not a regular file: its name is not used).

    Raises:
        CorruptDataError: a bad checksum or an unreadable size field.
    """
    # checksum fast path: Adler-32's A half is 1 + byte sum (mod 65521); the field itself counts as
    # 8 spaces (256). Any other layout of the field takes the exact path.
    try:
        stored = int(buf[p + 148:p + 154], 8)
    except ValueError:
        stored = -1
    if ((stored - 255) % _ADLER_MOD != _adler32(mv[p + 156:p + _BLOCK], _adler32(mv[p:p + 148])) & 0xFFFF
            and not checksum_ok(mv[p:p + _BLOCK])):
        raise CorruptDataError(f"{source}: bad tar header checksum at byte offset {offset}; the shard "
                               "is damaged (run `shardfeed check` and repack it)")
    if buf[p + 135] in _FIELD_END:
        try:
            size = int(buf[p + 124:p + 135], 8)
        except ValueError:
            size = _octal(buf[p + 124:p + 136], "size", source, offset)
    else:
        size = _octal(buf[p + 124:p + 136], "size", source, offset)
    typeflag = buf[p + 156]
    if typeflag not in _REGULAR:
        return typeflag, size, ""
    end = buf.find(b"\0", p, p + 100)
    raw = buf[p:end] if end >= 0 else buf[p:p + 100]
    if buf[p + 345] and buf[p + 257:p + 263] == _POSIX_MAGIC:
        pend = buf.find(b"\0", p + 345, p + 500)
        raw = (buf[p + 345:pend] if pend >= 0 else buf[p + 345:p + 500]) + b"/" + raw
    return typeflag, size, raw.decode("utf-8", "surrogateescape")


def _pax_size(pax: dict[str, str], source: str, offset: int) -> int:
    try:
        return int(pax["size"])
    except ValueError:
        raise CorruptDataError(f"{source}: PAX header at byte offset {offset} has a bad size "
                               f"{pax['size']!r}") from None


class _ExtendedHeaders:
    """PAX and GNU extension records: the name and size they give the next member (``x``, GNU
    ``L``) or every later member (``g``). ``active`` is False while none applies (the common case).
    """

    __slots__ = ("name", "size", "global_name", "global_size", "active")

    def __init__(self):
        self.name = self.size = self.global_name = self.global_size = None
        self.active = False

    def resolve(self, size: int) -> tuple[str | None, int]:
        """The member's name from its extension records (None: its header's own) and its size
        (``size``: its header's)."""
        if self.size is not None:
            size = self.size
        elif self.global_size is not None:
            size = self.global_size
        return (self.name if self.name is not None else self.global_name), size

    def member_done(self) -> None:
        """Drop the per-member records (after a member, or a skipped non-regular one)."""
        self.name = self.size = None
        self.active = self.global_name is not None or self.global_size is not None

    def record(self, typeflag: int, payload: bytes, source: str, offset: int) -> bool:
        """Apply one record (``payload`` its data, ``offset`` its header's shard offset); returns
        whether it belongs to the next member (False: a global record, or a skipped member).

        Raises:
            CorruptDataError: a malformed PAX record or size.
        """
        if typeflag == _GNU_LONGNAME:
            self.name = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif typeflag == _PAX_LOCAL:
            pax = _parse_pax(payload, source, offset)
            if "path" in pax:
                self.name = pax["path"]
            if "size" in pax:
                self.size = _pax_size(pax, source, offset)
        elif typeflag == _PAX_GLOBAL:
            pax = _parse_pax(payload, source, offset)
            self.global_name = pax.get("path", self.global_name)
            if "size" in pax:
                self.global_size = _pax_size(pax, source, offset)
            self.active = self.name is not None or self.size is not None or self.global_name is not None \
                or self.global_size is not None
            return False
        elif typeflag == _GNU_LONGLINK:
            pass  # link target of the next member: irrelevant, links are skipped
        else:
            # directory, link, device, FIFO, volume label, ...: skipped with its extension headers
            self.member_done()
            return False
        self.active = True
        return True


def _check_archive_end(first_offset: int | None, source: str) -> None:
    """At the end-of-archive blocks: raise when extension records wait for their member.

    Raises:
        CorruptDataError: ``first_offset`` (a member's first extension header) is set.
    """
    if first_offset is not None:
        raise CorruptDataError(f"{source}: extended header at byte offset {first_offset} is not "
                               "followed by a member; the shard is damaged")


def _check_record(typeflag: int, size: int, offset: int, total: int | None, source: str) -> tuple[int, int]:
    """A non-regular record's data bytes (0 for links, devices, directories, FIFOs), bounded, and
    its bytes in the shard (header and padding included).

    Raises:
        CorruptDataError: a size that is negative, runs past the shard, or is too big for a record.
    """
    if typeflag in _NO_DATA:
        size = 0
    if size < 0 or (total is not None and offset + _BLOCK + size > total):
        raise _member_too_big(source, offset, size, total, f"record (type {chr(typeflag)!r})")
    if size > MAX_RECORD_BYTES and typeflag in (_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK):
        raise CorruptDataError(f"{source}: tar header at byte offset {offset} claims a {chr(typeflag)!r} "
                               f"record of {size:,} bytes (at most {MAX_RECORD_BYTES:,}); the header is "
                               "damaged (run `shardfeed check` and repack the shard)")
    return size, _BLOCK + size + (-size % _BLOCK)


def iter_members(stream: BinaryIO, *, start_offset: int = 0, end_offset: int | None = None,
                 source: str = "<tar>", stream_offset: int | None = None,
                 read_bytes: int = DEFAULT_READ_BYTES,
                 total_bytes: int | None = None) -> Iterator[tuple[str, bytes, int]]:
    """Iterate over the regular-file members of a tar stream.

    Args:
        stream: a binary file object (a local file, an HTTP response, ...). A seekable stream is
            positioned with ``seek(start_offset)``; a non-seekable one is taken to stand at
            ``stream_offset`` (default ``start_offset``), and the bytes up to ``start_offset``
            are read and discarded (an HTTP server that ignored a ``Range`` request).
        start_offset: shard byte offset of the first header to read (a sample boundary, e.g.
            from the ``.sfidx`` offsets; 0 for the whole shard).
        end_offset: stop before any header that starts at or after this shard byte offset (the
            next sample's offset); None reads to the end of the archive. No more than needed is
            read past it.
        source: the shard's path or URL, named in error messages.
        stream_offset: shard offset of a non-seekable stream's current position.
        read_bytes: bytes asked of the stream per read.
        total_bytes: the shard's size in bytes, when known (None: from ``fstat`` for a regular
            file, else unknown). A size field (octal, GNU base-256 or PAX ``size=``) claiming more
            bytes than the shard has after it is refused at once as damaged; without a known size
            such a member reads to the end of the stream and is reported truncated. Reads are
            bounded (:data:`MAX_READ_BYTES`): memory follows the bytes that really arrive.

    Yields:
        ``(name, data, header_offset)``: the member's name (``str``; PAX/GNU long names
        resolved), its bytes, and the shard byte offset of its first header block (the PAX or
        GNU ``L`` header when it has one).

    Raises:
        CorruptDataError: a bad header checksum or field, a size field that is negative or runs
            past the end of the shard, or a member cut short (the message names ``source`` and the
            byte offset).
        ValueError: ``stream_offset`` lies past ``start_offset``.
        OSError: the stream itself failed.
    """
    _position_stream(stream, start_offset, stream_offset, source, read_bytes)
    total = total_bytes if total_bytes is not None else _stream_size(stream)
    reads = _BufferedReads(stream, read_bytes, end_offset, start_offset, source)
    ext = _ExtendedHeaders()
    block, regular, decode_header = _BLOCK, _REGULAR, _decode_header
    # buf: the shard's bytes from offset base (mv: a view of it); p: index in buf of the next header
    buf, nbuf, base, p = b"", 0, start_offset, 0
    mv = memoryview(buf)
    first_offset: int | None = None   # first header of the member in progress (PAX/L included)
    try:
        while True:
            offset = base + p
            if end_offset is not None and offset >= end_offset and first_offset is None:
                return
            if nbuf - p < block:
                base, rest, p = offset, buf[p:] if p < nbuf else b"", 0
                buf = reads.refill(rest, base, first_offset is not None)
                nbuf, mv = len(buf), memoryview(buf)
                if not nbuf:
                    return  # archive ends without its zero blocks: tolerated, as tarfile does
            if buf[p] == 0 and buf[p:p + block] == _ZERO_BLOCK:
                _check_archive_end(first_offset, source)
                return  # end-of-archive marker
            typeflag, size, name = decode_header(buf, mv, p, offset, source)
            if first_offset is None:
                first_offset = offset
            if typeflag in regular:
                ext_name, size = ext.resolve(size) if ext.active else (None, size)
                if ext_name is not None:
                    name = ext_name
                elif typeflag == 0 and name.endswith("/"):  # old-style directory entry
                    first_offset, p = None, p + block
                    continue
                if size < 0 or (total is not None and offset + block + size > total):
                    raise _member_too_big(source, offset, size, total, f"member {name!r}", first_offset)
                data_end = p + block + size
                next_pos = data_end + (-size % block)
                if next_pos <= nbuf:
                    data = buf[p + block:data_end]
                    p = next_pos
                else:  # the member (or its padding) runs past the buffer: read the rest directly
                    data = reads.member_rest(buf[p + block:data_end], size, next_pos - max(data_end, nbuf),
                                             name, first_offset)
                    base, buf, mv, nbuf, p = base + next_pos, b"", memoryview(b""), 0, 0
                yield name, data, first_offset
                if ext.active:
                    ext.member_done()
                first_offset = None
                continue
            # ---- extension records and non-regular members
            size, need = _check_record(typeflag, size, offset, total, source)
            if nbuf - p < need:  # records are small: gather them into the buffer
                buf = reads.gather(buf[p:], need, offset, typeflag, size)
                base, nbuf, mv, p = offset, len(buf), memoryview(buf), 0
            payload = buf[p + block:p + block + size]
            p += need
            if not ext.record(typeflag, payload, source, offset):
                first_offset = None
    except CorruptDataError as exc:
        # where the damage is: the first header of the member that could not be read whole
        if getattr(exc, "offset", None) is None:
            exc.offset = first_offset if first_offset is not None else base + p
        raise


def iter_samples(members: Iterable[tuple[str, bytes, int]], *, source: str = "<tar>",
                 limit: int | None = None, tag_source: bool = False,
                 starts: Container[int] | None = None) -> Generator[tuple[str, dict[str, bytes], int], None, int]:
    """Group contiguous tar members into samples by key (WebDataset's rule).

    The key is the member name up to the first dot of its basename, the extension the rest
    (the rule of :func:`shardfeed.readers.format.manifest.split_member_name`, inlined here):
    ``000000042.jpg`` and ``000000042.cls`` form the sample ``000000042``.

    Args:
        members: ``(name, data, header_offset)`` as :func:`iter_members` yields them.
        source: the shard's path or URL, named in error messages.
        limit: stop after this many samples (None: all).
        tag_source: add ``"__url__": source`` to every sample's dict (as webdataset does).
        starts: the shard byte offsets at which samples start (from the shard's ``.sfidx``), or
            None. When given, (1) a member group that does not start at one of them is not a
            sample and is passed over silently (a stray member that ``shardfeed index`` left
            out and listed in the manifest's ``skipped``), and (2) when the members break off
            (a :class:`~shardfeed.readers.errors.CorruptDataError` from :func:`iter_members`)
            exactly at a sample start, the sample before it is known to be complete and is
            yielded before the error is raised. Without ``starts`` the sample in progress at a
            break is dropped: its last members may be missing.

    Yields:
        ``(key, {ext: data}, header_offset)`` with the shard byte offset of the sample's first
        header.

    Returns:
        The number of samples yielded (the value of ``yield from iter_samples(...)``).

    Raises:
        CorruptDataError: a key reappears after another key (its members are not contiguous), or
            one sample holds the same extension twice; what ``members`` raises passes through
            (with its ``offset`` attribute: the first header that could not be read whole).
    """
    seen: set[str] = set()
    key = None
    parts: dict[str, bytes] = {}
    first = 0
    n = 0
    pending = False  # a group is in progress and not yet yielded or passed over
    if limit is not None and limit <= 0:
        return 0
    try:
        for name, data, offset in members:
            # split_member_name, inlined (hot loop): key up to the first dot of the basename
            dot = name.find(".", name.rfind("/") + 1)
            if dot < 0:
                k, ext = name, ""
            else:
                k, ext = name[:dot], name[dot + 1:]
            if k == key:
                if ext in parts:
                    raise CorruptDataError(f"{source}: sample {k!r} holds member {name!r} twice "
                                           f"(byte offset {offset})")
                parts[ext] = data
                continue
            if key is not None and (starts is None or first in starts):
                pending = False
                yield key, parts, first
                n += 1
                if n == limit:
                    return n
            if k in seen:
                raise CorruptDataError(f"{source}: key {k!r} reappears at byte offset {offset} after other "
                                       "keys; a sample's members must be contiguous (repack the shard)")
            seen.add(k)
            key, first = k, offset
            parts = {"__url__": source, ext: data} if tag_source else {ext: data}
            pending = True
    except CorruptDataError as exc:
        # the break lies exactly where the next sample starts: the one in progress is whole
        if (pending and starts is not None and first in starts
                and getattr(exc, "offset", None) in starts and exc.offset != first):
            pending = False
            yield key, parts, first
        raise
    if key is not None and pending and (starts is None or first in starts):
        yield key, parts, first
        n += 1
    return n
