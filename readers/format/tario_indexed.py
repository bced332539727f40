"""The indexed fast path of tar reading: whole samples of a shard whose ``.sfidx`` gives every
sample's first header, read with one call per ~96 KiB and parsed inline.

It handles plain ustar members only. Anything else (a PAX/GNU record, a bad checksum, a stray
member, a short read) stops it before that sample, and the caller reads the rest with the general
reader, :func:`~shardfeed.readers.format.tario.iter_members` and
:func:`~shardfeed.readers.format.tario.iter_samples`, which raise the precise error or parse the layout.
"""

from __future__ import annotations

import queue
import threading
import zlib
from bisect import bisect_left
from typing import BinaryIO, Callable, Generator, Iterable, Iterator

from ..background import start_thread
from ..errors import CorruptDataError
from .manifest import TAR_BLOCK
from .tario import checksum_ok, skip_stream

__all__ = ["iter_indexed_samples", "SequentialReader", "INDEXED_READ_BYTES"]

_ZERO_BLOCK = bytes(TAR_BLOCK)

# caches of iter_indexed_samples: size field -> size; Adler-32 A half of a header -> the
# checksum field ("%06o\0 ") a valid header with that byte sum holds
_SIZE_FIELDS: dict[bytes, int] = {}
_CHECKSUM_FIELDS: dict[int, frozenset[bytes]] = {}
# member extension bytes -> str (a handful per dataset)
_EXT_NAMES: dict[bytes, str] = {}


def _checksum_fields(adler_a: int) -> frozenset[bytes]:
    """The checksum fields ``b"%06o\\0 "`` a valid header whose byte sum (field included) is
    ``adler_a - 1`` can hold.

    A header's checksum ``c`` is its byte sum with the field counted as 8 spaces (256); written
    as ``"%06o\\0 "`` the field itself adds ``6 * 48 + digitsum(c) + 32``, so the full byte sum is
    ``c + digitsum(c) + 64``: every ``c`` that solves it (usually one or two; none for a header
    written another way, which then takes the exact check).
    """
    total = adler_a - 1
    return frozenset(b"%06o\0 " % c for c in range(max(0, total - 64 - 42), total - 64 + 1)
                     if c + _octal_digit_sum(c) + 64 == total)


def _octal_digit_sum(c: int) -> int:
    """The sum of the octal digits of ``c >= 0``, by arithmetic: ``c - 7 * (c // 8 + c // 64 + ...)``.

    Each worker fills :data:`_CHECKSUM_FIELDS` afresh as it meets its shards' headers; summing the
    digits of a formatted string instead cost about 5 ms of its start-up on the bench's small set.
    """
    total = c
    q = c >> 3
    while q:
        total -= 7 * q
        q >>= 3
    return total


#: Bytes :func:`iter_indexed_samples` reads per ``pread`` (whole samples; a bigger sample alone).
INDEXED_READ_BYTES = 96 << 10


def iter_indexed_samples(read_at: Callable[[int, int], bytes], offsets, start: int, end: int, file_bytes: int, *,
                         source: str = "<tar>", tag_source: bool = False, read_bytes: int = INDEXED_READ_BYTES,
                         prefetch: int = 0, chunk_reader: Callable | None = None,
                         ) -> Generator[tuple[str, dict[str, bytes], int], None, int]:
    """Samples ``[start, end)`` of a local shard whose ``.sfidx`` gives every sample's first header.

    The fast path of the local reader: the index tells where samples start, so whole
    samples are read with one ``read_at`` call per ~``read_bytes`` (no read per member, no buffer
    splicing) and each plain ustar member is parsed inline, the key's bytes compared rather than
    decoded again. Header checksums are checked as in :func:`iter_members`.

    The default ``read_bytes`` (96 KiB) keeps each read's ``bytes`` object below glibc's
    ``mmap`` threshold (128 KiB): bigger ones come as fresh pages from the kernel, and faulting
    them in cost 1.6 us a small sample, more than parsing it (measured on the bench's small set).

    Anything else — a bad checksum, a PAX/GNU record, a non-regular member, a member of another
    key inside a sample's span (a stray member, or a damaged name), a short read, a member
    running past the next sample's offset — is not handled here: the generator stops
    *before* yielding that sample and returns how many it yielded, so that the caller reads the
    rest with :func:`iter_members`/:func:`iter_samples` (which raise the precise error or parse
    the exotic layout).

    Args:
        read_at: ``read_at(offset, nbytes)`` returns the shard's bytes ``[offset, offset + nbytes)``
            (fewer only at its end): ``os.pread`` on a local file, or :class:`SequentialReader`
            over a stream. It is called with increasing offsets, each at the previous end.
        offsets: the shard's sample offsets (``.sfidx``), a sequence of ints in increasing order.
        start, end: sample indices (``0 <= start <= end <= len(offsets)``).
        file_bytes: the shard's size in bytes (bounds the last sample).
        source: the shard's path, named in error messages.
        tag_source: add ``"__url__": source`` to every sample's dict.
        read_bytes: target bytes per read.
        prefetch: when > 0, a background thread does the reads, up to this many ahead (for a
            socket: receiving overlaps parsing); 0 reads in the caller's thread.
        chunk_reader: ``chunk_reader(read_at, plan)`` yielding each planned read's bytes in
            order, instead of ``prefetch`` (e.g.
            :func:`~shardfeed.readers.storage.shard_readahead.read_ahead` for slow local mounts).

    Yields:
        ``(key, {ext: data}, header_offset)``, as :func:`iter_samples` does.

    Returns:
        The number of samples yielded (fewer than ``end - start`` when it stopped early).

    Raises:
        CorruptDataError: one sample holds the same extension twice.
        OSError: the read itself failed (or what ``read_at`` raises).
    """
    # not a generator itself: the generator below holds the loop, this its contract
    return _indexed_samples(read_at, offsets, start, end, file_bytes, source, tag_source, read_bytes, prefetch,
                            chunk_reader)


def _planned_reads(read_at: Callable[[int, int], bytes], plan, prefetch: int,
                   chunk_reader: Callable | None) -> Iterable[bytes]:
    """The bytes of each read of ``plan``, in order: by ``chunk_reader``, by a prefetch thread
    (``prefetch`` > 0), or by ``read_at`` in the caller's thread."""
    if chunk_reader is not None:
        return chunk_reader(read_at, plan)
    if prefetch > 0:
        return _prefetched(read_at, plan, prefetch)
    return (read_at(a, b - a) for _, _, a, b in plan)


def _indexed_samples(read_at: Callable[[int, int], bytes], offsets, start: int, end: int, file_bytes: int,
                     source: str, tag_source: bool, read_bytes: int, prefetch: int,
                     chunk_reader: Callable | None) -> Generator[tuple[str, dict[str, bytes], int], None, int]:
    """The loop of :func:`iter_indexed_samples` (its arguments, yields and return value): each
    planned read's samples parsed inline, stopping before one the general reader must decide."""
    adler32 = zlib.adler32
    block = TAR_BLOCK
    exts = _EXT_NAMES
    size_of = _SIZE_FIELDS
    chk_field = _CHECKSUM_FIELDS
    n_off = len(offsets)
    done = 0
    plan = _chunk_plan(offsets, start, end, file_bytes, read_bytes)
    for (i, j, a, _), buf in zip(plan, _planned_reads(read_at, plan, prefetch, chunk_reader)):
        nbuf = len(buf)
        for k in range(i, j):
            p = offsets[k] - a
            span_end = (offsets[k + 1] - a) if k + 1 < n_off else nbuf
            if span_end > nbuf:
                return done  # short read: the shard is shorter than its index says
            key_b = None  # the key's bytes and its dot: b"000000042."; set by the first member
            key, lk, parts = "", 0, {}
            while p < span_end:
                if p + block > nbuf:
                    return done
                if buf[p + 156] != 48:  # not a regular file ("0")
                    if k + 1 >= n_off and key_b is not None and buf[p:p + block] == _ZERO_BLOCK:
                        break  # the end-of-archive blocks after the last sample
                    return done  # anything else: the general reader decides
                field = buf[p + 124:p + 135]
                size = size_of.get(field)
                if size is None:
                    try:
                        size = int(field, 8)
                    except ValueError:
                        return done
                    if len(size_of) < 4096:
                        size_of[field] = size
                # checksum: the field that a valid header with this byte sum holds (cached per sum)
                header_sum = adler32(buf[p:p + block]) & 0xFFFF
                expected = chk_field.get(header_sum)
                if expected is None:
                    expected = chk_field[header_sum] = _checksum_fields(header_sum)
                if (buf[p + 148:p + 156] not in expected and not checksum_ok(buf[p:p + block])) or buf[p + 345]:
                    return done  # a bad checksum (or a ustar name prefix): the general reader decides
                data_end = p + block + size
                if data_end > span_end:
                    return done
                if key_b is not None:
                    if not buf.startswith(key_b, p, p + 100):
                        return done  # another key inside the sample's span: the general reader decides
                    nend = buf.find(b"\0", p + lk, p + 100)
                    eb = buf[p + lk:nend] if nend >= 0 else buf[p + lk:p + 100]
                    ext = exts.get(eb)
                    if ext is None:
                        ext = eb.decode("utf-8", "surrogateescape")
                        if "/" in ext:
                            return done
                        if len(exts) < 64:
                            exts[eb] = ext
                    if ext in parts:
                        raise CorruptDataError(f"{source}: sample {key!r} holds member {key + '.' + ext!r} "
                                               f"twice (byte offset {a + p})")
                    parts[ext] = buf[p + block:data_end]
                else:
                    nend = buf.find(b"\0", p, p + 100)
                    if nend < 0:
                        nend = p + 100
                    # the key: up to the first dot of the basename (split_member_name's rule, on bytes)
                    dot = buf.find(b".", buf.rfind(b"/", p, nend) + 1 or p, nend)
                    if dot < 0:
                        return done  # no extension: the general reader decides
                    key_b = buf[p:dot + 1]
                    key = key_b[:-1].decode("utf-8", "surrogateescape")
                    lk = dot + 1 - p
                    eb = buf[dot + 1:nend]
                    ext = exts.get(eb)
                    if ext is None:
                        ext = eb.decode("utf-8", "surrogateescape")
                        if len(exts) < 64:
                            exts[eb] = ext
                    parts = {"__url__": source, ext: buf[p + block:data_end]} if tag_source \
                        else {ext: buf[p + block:data_end]}
                p = data_end + (-size % block)
            if key_b is None:
                return done
            yield key, parts, offsets[k]
            done += 1
    return done


def _chunk_plan(offsets, start: int, end: int, file_bytes: int, read_bytes: int) -> list[tuple[int, int, int, int]]:
    """``(first sample, end sample, first byte, end byte)`` of each read: whole samples, about
    ``read_bytes`` each (one sample when it is bigger); stops at an offset that does not increase."""
    plan = []
    n_off = len(offsets)
    i = start
    while i < end:
        a = offsets[i]
        j = max(i + 1, min(end, bisect_left(offsets, a + read_bytes, i + 1, end)))
        b = offsets[j] if j < n_off else file_bytes
        if b <= a:
            break
        plan.append((i, j, a, b))
        i = j
    return plan


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _prefetched(read_at: Callable[[int, int], bytes], plan, depth: int) -> Iterator[bytes]:
    """The reads of ``plan``, done by a background thread up to ``depth`` reads ahead (a socket
    read releases the GIL, so receiving overlaps parsing); its error is raised here, in order.
    Closing the generator stops the thread at its next read."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for _, _, a, b in plan:
                if stop.is_set() or not put(read_at(a, b - a)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            if not stop.is_set():
                put(_Failure(exc))

    start_thread(run, name="shardfeed-prefetch", stop=stop.set)
    try:
        for _ in plan:
            item = q.get()
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()


class SequentialReader:
    """``read_at(offset, nbytes)`` over a stream that only reads forward (an HTTP body), for
    :func:`iter_indexed_samples`.

    Args:
        stream: a binary stream whose next byte is the shard's byte ``position``.
        position: that offset.
        source: named in error messages.

    Raises (when called):
        ValueError: an offset before the stream's position.
        CorruptDataError: the stream ends while skipping forward to an offset.
    """

    def __init__(self, stream: BinaryIO, position: int, *, source: str = "<stream>"):
        self.stream = stream
        self.position = position
        self.source = source

    def __call__(self, offset: int, nbytes: int) -> bytes:
        if offset != self.position:
            if offset < self.position:
                raise ValueError(f"{self.source}: cannot read back to offset {offset} from {self.position}")
            skip_stream(self.stream, offset - self.position, source=self.source)
            self.position = offset
        read = self.stream.read
        data = read(nbytes)
        if len(data) < nbytes and data:
            parts = [data]
            got = len(data)
            while got < nbytes:
                chunk = read(nbytes - got)
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
            data = b"".join(parts)
        self.position += len(data)
        return data
