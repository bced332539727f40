"""WebDataset source: shards from a local directory or an ``http(s)://`` URL, split by sample ranges.

Each epoch a worker gets its list of ``(shard, first_sample, end_sample)`` ranges from
:func:`~shardfeed.readers.dataset.epoch_ranges` and reads exactly those bytes: a range that
starts inside a shard starts at the sample's byte offset from the shard's ``.idx`` (local
``seek``; over HTTP a ``Range`` request, or streaming and skipping when the server ignores
``Range``) and stops at the next sample's offset. Shards without an offset index (made by other
tools) are read from their start, skipping the samples before the range. Members are parsed by
:mod:`shardfeed.readers.tario` (no ``webdataset`` import, no per-member ``read`` call).

A seeded shuffle buffer (``shuffle_buffer`` samples, default 1000; seed, epoch, rank, worker)
mixes the samples of a worker; samples are decoded only when they leave the buffer.

Every sample of a range is checked against the manifest: a shard that yields fewer samples than
the manifest says raises :class:`~shardfeed.readers.errors.CorruptDataError` naming it.

With an offset index, only member groups that start at an indexed offset are samples: groups that
``shardfeed index`` found to be no sample (a stray member; listed in the manifest's ``skipped``)
are passed over silently, wherever they lie.

Damage: a truncated shard or a damaged tar header raises ``CorruptDataError`` naming the shard and
the byte offset (:mod:`~shardfeed.readers.tario`). Under ``on_error="skip"`` the samples read
before the damage are kept (with an index, also the last one before a damaged sample start), the
rest of that range is dropped and counted as skipped (one count per lost sample), and the other
ranges and shards are read normally; a half-read sample is never yielded.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import BinaryIO, Iterator

import torch.utils.data

from .dataset import epoch_ranges, samples_per_rank
from .errors import CorruptDataError, DataSourceError
from .format import Manifest, Sample, decode_index, read_index
from .source_base import IMAGE_EXTS, SourceBase, name_original_file, parts_to_raw
from .tario import SequentialReader, iter_indexed_samples, iter_members, iter_samples

__all__ = ["WebDatasetSource", "LocalLocation", "DEFAULT_SHUFFLE_BUFFER"]

log = logging.getLogger(__name__)

_json_loads = json.JSONDecoder().raw_decode  # no whitespace scan: meta is compact JSON
# image extensions already canonical (what the packer writes): the raw fast path keeps them as they are
_FAST_EXTS = IMAGE_EXTS - {"jpeg", "tiff"}

#: Over HTTP, a background thread receives up to this many reads of :data:`HTTP_READ_BYTES` ahead
#: of the parser (bigger reads than locally: fewer hand-overs of the GIL between the threads).
#: Measured on the bench's small set through `shardfeed serve` on loopback, 2 cores: 96 KiB reads
#: without the thread 58-61k samples/s, with it 53k; 1 MiB reads 56k, with 4 ahead 70k.
HTTP_PREFETCH_READS = 4
HTTP_READ_BYTES = 1 << 20

#: Samples held by each worker's shuffle buffer.
DEFAULT_SHUFFLE_BUFFER = 1000


class LocalLocation:
    """A dataset directory on a local (or mounted) file system."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    def where(self, name: str) -> str:
        return str(self.root / name)

    def read_bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def read_index(self, name: str) -> list[int]:
        return read_index(self.root / name)

    def read_indexed(self, name: str, offsets, start: int, end: int, where: str):
        """Samples ``[start, end)`` of an indexed local shard by :func:`~shardfeed.readers.tario.iter_indexed_samples`
        (``__url__`` tagged); returns how many it yielded (it stops before anything unusual)."""
        fd = os.open(self.root / name, os.O_RDONLY)
        pread = os.pread
        try:
            return (yield from iter_indexed_samples(lambda offset, n: pread(fd, n, offset), offsets, start, end,
                                                    os.fstat(fd).st_size, source=where, tag_source=True))
        finally:
            os.close(fd)

    def open(self, name: str, start: int = 0, end: int | None = None) -> tuple[BinaryIO, int]:
        f = open(self.root / name, "rb", buffering=0)
        try:
            f.seek(start)
        except BaseException:
            f.close()
            raise
        return f, start


def _shuffled(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Reservoir-style shuffle buffer: holds up to ``size`` items, yields a random one per input."""
    buf = []
    rand = rng.random
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = int(rand() * size)
        out = buf[j]
        buf[j] = item
        yield out
    rng.shuffle(buf)
    yield from buf


class WebDatasetSource(SourceBase, torch.utils.data.IterableDataset):
    """Iterable dataset over WebDataset shards (local directory or HTTP URL).

    Usually built by :func:`~shardfeed.readers.dataset.open_dataset`; pass it to
    :func:`~shardfeed.readers.loader.make_loader` (which tells it the batch size and the epoch).

    Args:
        location: a local dataset directory (path) or an
            :class:`~shardfeed.readers.http_io.HttpLocation`.
        manifest: the dataset's validated manifest.
        shuffle_buffer: samples in each worker's shuffle buffer (1 or 0: no buffer).
        timeout_s, retries: HTTP options (see :mod:`shardfeed.readers.http_io`); ignored locally.
        **common: see :class:`~shardfeed.readers.source_base.SourceBase`.

    Yields:
        ``(image uint8 [3, H, W], label int)``, or :class:`~shardfeed.readers.format.Sample`
        with ``decode=False``.

    ``len(ds)`` is the number of samples this rank reads per epoch (all its workers together).
    """

    def __init__(self, location, manifest: Manifest, *, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
                 timeout_s: float | None = None, retries: int | None = None, **common):
        if isinstance(location, (str, os.PathLike)):
            location = LocalLocation(location)
        self.location = location
        self.manifest = manifest
        self.shuffle_buffer = int(shuffle_buffer)
        self._classes = list(manifest.classes)
        self._class_to_idx = dict(manifest.class_to_idx)
        self._num_samples = manifest.num_samples
        self._counts = [s.num_samples for s in manifest.shards]
        self._offsets: dict[int, list[int] | None] = {}
        self._init_common(**common)

    def __repr__(self) -> str:
        return (f"WebDatasetSource({str(self.location)!r}, num_samples={self._num_samples}, "
                f"shards={len(self._counts)}, rank={self.rank}/{self.world_size})")

    def __len__(self) -> int:
        return samples_per_rank(self._num_samples, self.world_size, pad=self.pad, batch_size=self.batch_size,
                                drop_last=self.drop_last)

    def __getstate__(self):
        state = super().__getstate__()
        state["_offsets"] = {}
        return state

    # ---- reading
    def _index(self, i: int) -> list[int] | None:
        if i in self._offsets:
            return self._offsets[i]
        entry = self.manifest.shards[i]
        offsets = None
        if entry.index:
            if isinstance(self.location, LocalLocation):
                offsets = self.location.read_index(entry.index)
            else:
                offsets = decode_index(self.location.read_bytes(entry.index), self.location.where(entry.index))
            if len(offsets) != entry.num_samples:
                raise CorruptDataError(f"{self.location.where(entry.index)}: {len(offsets)} offsets but "
                                       f"{entry.num_samples} samples in the manifest; rebuild it with "
                                       "`shardfeed index`")
        self._offsets[i] = offsets
        return offsets

    def _open_shard(self, entry, first: int, stop: int | None, where: str):
        """``location.open`` of the shard's bytes ``[first, stop)``, refusing a server copy whose
        size differs from the manifest's. Returns ``(stream, stream_offset)``."""
        stream, stream_offset = self.location.open(entry.name, first, stop)
        total = getattr(stream, "total_bytes", None)
        if total is not None and total != entry.num_bytes:
            stream.close()
            raise CorruptDataError(f"{where}: {total} bytes on the server but {entry.num_bytes} in the "
                                   "manifest; the shard changed: run `shardfeed check` and repack")
        return stream, stream_offset

    def iter_range(self, shard: int, start: int, end: int):
        """Raw samples ``[start, end)`` of shard ``shard``: ``(key, {ext: bytes}, header_offset)``.

        Each dict also holds ``"__url__"``: the shard's path or URL.

        Raises:
            CorruptDataError: the shard is damaged or holds fewer samples than the manifest says.
            DataSourceError: an HTTP read failed (names the URL).
        """
        entry = self.manifest.shards[shard]
        where = self.location.where(entry.name)
        offsets = self._index(shard)
        if offsets is not None:
            first = offsets[start]
            stop = offsets[end] if end < len(offsets) else None
            skip = 0
            # only groups starting at an indexed offset are samples (stray members are passed over)
            starts = set(offsets[start:end + 1])
        else:
            first, stop, skip, starts = 0, None, start, None
        want = end - start
        if offsets is not None and want:
            # fast path: whole samples per read, parsed inline; it stops before anything unusual,
            # and the general reader below takes over from there (and raises the precise error)
            if isinstance(self.location, LocalLocation):
                fast = yield from self.location.read_indexed(entry.name, offsets, start, end, where)
            else:
                stream, stream_offset = self._open_shard(entry, first, stop, where)
                try:
                    fast = yield from iter_indexed_samples(SequentialReader(stream, stream_offset, source=where),
                                                           offsets, start, end, entry.num_bytes, source=where,
                                                           tag_source=True, read_bytes=HTTP_READ_BYTES,
                                                           prefetch=HTTP_PREFETCH_READS)
                finally:
                    stream.close()
            if fast == want:
                return
            start += fast
            want -= fast
            first = offsets[start]
            starts = set(offsets[start:end + 1])
        stream, stream_offset = self._open_shard(entry, first, stop, where)
        try:
            members = iter_members(stream, start_offset=first, end_offset=stop, source=where,
                                   stream_offset=stream_offset)
            samples = iter_samples(members, source=where, limit=want + skip, tag_source=True, starts=starts)
            if skip:
                got = 0
                for item in samples:
                    if skip:
                        skip -= 1
                        continue
                    got += 1
                    yield item
            else:
                got = yield from samples
        finally:
            stream.close()
        if got < want:
            raise CorruptDataError(f"{where}: holds only {start + got} samples, the manifest says at least "
                                   f"{end}; the shard is damaged or was replaced: run `shardfeed check`")

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        num_workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        epoch = self.begin_epoch(worker)
        ranges = epoch_ranges(self._counts, seed=self.seed, epoch=epoch, rank=self.rank,
                              world_size=self.world_size, num_workers=num_workers, worker=worker, pad=self.pad,
                              shuffle=self.shuffle, batch_size=self.batch_size, drop_last=self.drop_last)
        raw = self._iter_ranges(ranges)
        if self.shuffle and self.shuffle_buffer > 1:
            rng = random.Random(f"shuffle-buffer:{self.seed}:{epoch}:{self.rank}:{worker}")
            raw = _shuffled(raw, self.shuffle_buffer, rng)
        c2i = self._class_to_idx
        hole = self.holes
        if self.decode:
            decoder = self.sample_decoder
            for key, parts, _ in raw:
                if key is None:  # samples of a damaged shard, counted as skipped
                    yield None
                    continue
                try:
                    data, ext, label, _ = parts_to_raw(key, parts, c2i, parts["__url__"])
                    out = decoder(data, ext, label, f"{parts['__url__']} key {key}")
                except (CorruptDataError, ValueError) as exc:
                    self.handle_error(name_original_file(exc, parts.get("json")), f"{parts['__url__']} key {key}")
                    if hole:
                        yield None
                    continue
                yield out
        else:
            loads = _json_loads
            fast_exts = _FAST_EXTS
            new = tuple.__new__
            labels: dict[bytes, int] = {}
            for key, parts, _ in raw:
                if key is None:
                    yield None
                    continue
                try:
                    # fast path for shardfeed's layout (exactly __url__, image, cls, json); else the one rule
                    it = iter(parts)
                    next(it)
                    ext = next(it, None)
                    meta = parts.get("json")
                    cls = parts.get("cls")
                    if len(parts) == 4 and ext in fast_exts and cls is not None and meta is not None:
                        label = labels.get(cls)
                        if label is None:
                            label = int(cls)
                            if len(labels) < 4096:
                                labels[cls] = label
                        try:
                            meta = loads(meta.decode("utf-8"))[0]
                        except ValueError:
                            meta = json.loads(meta)
                        out = new(Sample, (key, parts[ext], ext, label, meta))
                    else:
                        data, ext, label, meta = parts_to_raw(key, parts, c2i, parts["__url__"])
                        meta = json.loads(meta) if meta is not None else {}
                        out = Sample(key, data, ext, label, meta)
                except (CorruptDataError, ValueError) as exc:
                    if not isinstance(exc, CorruptDataError):  # an unreadable .cls or .json member
                        exc = CorruptDataError(f"{parts['__url__']} key {key}: unreadable label or metadata "
                                               f"member ({exc}); the shard is damaged: run `shardfeed check`")
                    self.handle_error(name_original_file(exc, parts.get("json")), f"{parts['__url__']} key {key}")
                    if hole:
                        yield None
                    continue
                yield out
        self.end_epoch()

    def _iter_ranges(self, ranges):
        """Raw samples of ``ranges``; under ``on_error="skip"`` a damaged shard's remaining samples
        are counted as skipped (and, under a loader, stand as ``(None, None, None)`` holes)."""
        hole = (None, None, None)
        for shard, start, end in ranges:
            got = 0
            try:
                try:
                    for item in self.iter_range(shard, start, end):
                        got += 1
                        yield item
                except FileNotFoundError as exc:  # a shard or its index gone since the manifest was read
                    entry = self.manifest.shards[shard]
                    raise DataSourceError(f"{self.location.where(entry.name)}: a file of this shard is missing "
                                          f"({exc}); restore it (or rebuild the index with `shardfeed index`)"
                                          ) from None
            except (CorruptDataError, DataSourceError) as exc:
                if self.on_error == "raise":
                    raise
                lost = end - start - got
                self.handle_error(exc, self.location.where(self.manifest.shards[shard].name), count=lost)
                if self.holes:
                    for _ in range(lost):
                        yield hole
