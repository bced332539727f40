"""WebDataset source: shards from a local directory or an ``http(s)://`` URL, split by sample ranges.

Each epoch a worker gets its list of ``(shard, first_sample, end_sample)`` ranges from
:func:`~shardfeed.readers.order.epoch.epoch_ranges` and reads exactly those bytes: a range that
starts inside a shard starts at the sample's byte offset from the shard's ``.sfidx`` (local
``seek``; over HTTP a ``Range`` request, or streaming and skipping when the server ignores
``Range``) and stops at the next sample's offset. Shards without an offset index (made by other
tools) are read from their start, skipping the samples before the range. Members are parsed by
:mod:`shardfeed.readers.format.tario` (no ``webdataset`` import, no per-member ``read`` call).

A seeded shuffle buffer (``shuffle_buffer`` samples, default 1000; seed, epoch, rank, worker)
mixes the samples of a worker: it reads a window of that many samples, emits them in a permuted
order, then reads the next (:mod:`~shardfeed.readers.order.buffer_order`); samples are decoded only when
they leave the buffer. The order is a function of positions only, computed per place: a resumed
worker seeks to the first sample of the window it stopped in (``.sfidx``; local ``seek`` or HTTP
``Range``) and reads at most one window again.

The buffer yields nothing before it is full, so each epoch starts by reading a worker's first
``shuffle_buffer`` samples while nothing decodes; on slow storage (a network mount, HTTP, s3) that
costs the storage's latency at every epoch. Under a loader whose processes read the next epoch too
(``next_epoch_ahead``), a worker whose reads of the epoch are done (its buffer still drains) reads
the first samples of its next epoch's sub-range in the background, once the samples still to come
would take :data:`AHEAD_MARGIN` (2) times as long as that read
(:class:`~shardfeed.readers.storage.shard_readahead.SpansAhead`: the next epoch's shard order is a function
of the seed and the epoch), at most the buffer's worth and
:data:`~shardfeed.readers.storage.shard_readahead.EPOCH_AHEAD_BYTES` (64 MiB) per process, whole samples;
the next epoch parses them from memory with the same parser. Bytes it does not start with are
dropped; a span that failed to read is read again as usual (and its error raised there).

Resuming (:mod:`~shardfeed.readers.order.epoch`): with the state's world size, batch size and worker
count a worker continues exactly where one worker of the interrupted run stopped (same windows,
same order), after a seek; otherwise each worker reads its batches of the rest of the epoch by
position, in chunks of ``shuffle_buffer`` samples: the samples a chunk needs are sorted, grouped
into runs of each shard (small gaps read through) and read by offset, and a sample read early for
a later chunk is kept until then.

Every sample of a range is checked against the manifest: a shard that yields fewer samples than
the manifest says raises :class:`~shardfeed.readers.errors.CorruptDataError` naming it.

With an offset index, only member groups that start at an indexed offset are samples: groups that
``shardfeed index`` found to be no sample (a stray member; listed in the manifest's ``skipped``)
are passed over silently, wherever they lie.

Damage: a truncated shard or a damaged tar header raises ``CorruptDataError`` naming the shard and
the byte offset (:mod:`~shardfeed.readers.format.tario`). Under ``on_error="skip"`` the samples read
before the damage are kept (with an index, also the last one before a damaged sample start), the
rest of that range is dropped and counted as skipped (one count per lost sample), and the other
ranges and shards are read normally; a half-read sample is never yielded.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import math
import os
import time
from collections import Counter
from typing import Any, Iterator, Sequence

import numpy as np
import torch.utils.data

from ..order.buffer_order import shuffled_windows
from ..order.epoch import (iter_spans, rank_span, resumed_rank_sequence, shard_order, worker_batch_counts_before,
                           worker_batches, worker_span)
from ..errors import CorruptDataError, DataSourceError
from ..format.manifest import TAR_BLOCK, Manifest, Sample
from ..format.manifest_table import shard_sample_counts
from ..format.offset_index import decode_index
from ..format.sample_members import label_problem
from ..storage.http_io import index_size_cap
from .options import ReadOptions, check_shuffle_buffer
from .source_base import IMAGE_EXTS, SourceBase, name_original_file, parts_to_raw
from ..storage.location import LocalLocation, check_shard_size, missing_file_error
from .offset_cache import DEFAULT_OFFSET_CACHE_BYTES, OffsetCache
from ..storage.offset_reads import sample_runs
from ..storage.shard_readahead import EPOCH_AHEAD_BYTES, SpansAhead, storage_is_slow
from ..format.tario import iter_members, iter_samples
from ..format.tario_indexed import INDEXED_READ_BYTES, SequentialReader, iter_indexed_samples

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

#: The next epoch's first samples are read ahead once the samples still to come would take this
#: many times as long as reading them (:meth:`WebDatasetSource._then_read_ahead`).
AHEAD_MARGIN = 2.0

#: Samples held by each worker's shuffle buffer.
DEFAULT_SHUFFLE_BUFFER = 1000

#: Reading a resumed epoch by position: samples between two wanted ones of a shard that are read
#: through (and dropped) rather than starting a new read.
MERGE_GAP_SAMPLES = 16


class WebDatasetSource(SourceBase, torch.utils.data.IterableDataset):
    """Iterable dataset over WebDataset shards (local directory or HTTP URL).

    Usually built by :func:`~shardfeed.readers.sources.dataset.open_dataset`; pass it to
    :func:`~shardfeed.readers.loader.make_loader` (which tells it the batch size and the epoch).

    Args:
        location: a local dataset directory (path) or an
            :class:`~shardfeed.readers.storage.http_io.HttpLocation`.
        manifest: the dataset's validated manifest.
        read: the options every source shares (:class:`~shardfeed.readers.sources.options.ReadOptions`;
            default ``ReadOptions()``).
        shuffle_buffer: samples in each worker's shuffle buffer (1 or 0: no buffer).
        readahead: local shards: once a read proves slow (a network or FUSE mount), keep several
            reads in flight ahead of the decoder (:mod:`~shardfeed.readers.storage.shard_readahead`;
            bounded: at most 32 requests, 6 MiB per reader). False reads one chunk at a time.

    Yields:
        ``(image uint8 [3, H, W], label int)``, or :class:`~shardfeed.readers.format.manifest.Sample`
        with ``decode=False``.

    ``len(ds)`` is the number of samples this rank reads per epoch (all its workers together).

    Each process keeps the shards' sample offsets it read in a cache of at most
    ``offset_cache_bytes`` (class attribute, 64 MiB: 8 bytes a sample); the shards used least
    recently leave first (:class:`~shardfeed.readers.sources.offset_cache.OffsetCache`).

    Attribute ``next_epoch_ahead`` (default False; :func:`~shardfeed.readers.loader.make_loader`
    sets it when the next epoch is read by the same processes: no workers, or persistent ones):
    once a worker's reads of an epoch are done, it reads (just in time, :data:`AHEAD_MARGIN`) the
    next epoch's first samples (what its shuffle buffer holds before it yields, at least one
    batch; at most :data:`~shardfeed.readers.storage.shard_readahead.EPOCH_AHEAD_BYTES`, 64 MiB, per
    process) in the background while the epoch's last samples decode, on slow storage only:
    local shards once a read of the epoch proved slow (with ``readahead``), remote ones always.
    The samples and their order are the same; what the next epoch does not start with is dropped.

    Attribute ``check_files`` (default True; ``open_dataset`` sets it from its ``check_files``): a
    local shard's size is compared with the manifest's as the shard is opened for reading (one
    ``fstat``; :func:`~shardfeed.readers.storage.location.check_shard_size`), so opening stats no shard.

    Raises:
        TypeError: ``shuffle_buffer`` is not an integer. ValueError: it is negative.
    """

    #: the shards' files are checked as each is opened for reading, not when the dataset is opened
    checks_files_on_read = True
    #: compare a local shard's size with the manifest's as it is opened (see the class docstring)
    check_files = True
    #: read the next epoch's first samples ahead (see the class docstring)
    next_epoch_ahead = False
    #: bytes of shard offsets one process keeps (8 per sample, least recently used shards leave first)
    offset_cache_bytes = DEFAULT_OFFSET_CACHE_BYTES

    def __init__(self, location: Any, manifest: Manifest, read: ReadOptions | None = None, *,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, readahead: bool = True) -> None:
        if isinstance(location, (str, os.PathLike)):
            location = LocalLocation(location, readahead=readahead)
        elif isinstance(location, LocalLocation):
            location.readahead = bool(readahead)
        self.location = location
        self.manifest = manifest
        if isinstance(location, LocalLocation):  # one version: every later open is checked against it
            location.record_versions()
        self.shuffle_buffer = check_shuffle_buffer(shuffle_buffer)
        self._classes = list(manifest.classes)
        self._class_to_idx = dict(manifest.class_to_idx)
        self._labels = frozenset(self._class_to_idx.values())
        self._num_samples = manifest.num_samples
        #: samples per shard (``int64 [shards]``, manifest order)
        self._counts = np.asarray(shard_sample_counts(manifest.shards), dtype=np.int64)
        #: packing-order index of each shard's first sample
        self._starts = (np.cumsum(self._counts) - self._counts).tolist()
        self._offsets = OffsetCache(self.offset_cache_bytes)
        #: the next epoch's first samples, read ahead in this process (:meth:`_start_ahead`)
        self._ahead: SpansAhead | None = None
        #: a range of this epoch ended slow, or the epoch started on samples read ahead
        self._slow_epoch = False
        #: what this epoch started on (None: its reads), for the next read's expected duration
        self._last_ahead: SpansAhead | None = None
        self._init_common(ReadOptions() if read is None else read)

    def __repr__(self) -> str:
        return (f"WebDatasetSource({str(self.location)!r}, num_samples={self._num_samples}, "
                f"shards={len(self._counts)}, rank={self.rank}/{self.world_size})")

    def __len__(self) -> int:
        return self.num_samples_per_rank

    @property
    def buffer_size(self) -> int:
        """Samples in each worker's shuffle buffer (0 without shuffle or with ``shuffle_buffer <= 1``)."""
        return self.shuffle_buffer if self.shuffle and self.shuffle_buffer > 1 else 0

    def __getstate__(self):
        state = super().__getstate__()
        state["_ahead"] = state["_last_ahead"] = None
        return state

    # ---- reading
    def _index(self, i: int) -> Sequence[int] | None:
        """Shard ``i``'s sample offsets (None: the shard has no index), from this process's bounded cache."""
        return self._offsets.get(i, self._load_index)

    def _load_index(self, i: int) -> list[int] | None:
        entry = self.manifest.shards[i]
        offsets = None
        if entry.index:
            if isinstance(self.location, LocalLocation):
                offsets = self.location.read_index(entry.index)
            else:
                cap = index_size_cap(entry.num_samples, entry.num_bytes)  # both from the untrusted manifest
                raw = self.location.read_bytes(entry.index, max_bytes=cap, what="the offset index")
                offsets = decode_index(raw, self.location.where(entry.index))
            if len(offsets) != entry.num_samples:
                raise CorruptDataError(f"{self.location.where(entry.index)}: {len(offsets)} offsets but "
                                       f"{entry.num_samples} samples in the manifest; rebuild it with "
                                       "`shardfeed index`")
            if offsets and offsets[-1] + TAR_BLOCK > entry.num_bytes:
                raise CorruptDataError(f"{self.location.where(entry.index)}: offset {offsets[-1]} lies past the end "
                                       f"of {entry.name} ({entry.num_bytes} bytes); the index is damaged: rebuild "
                                       "it with `shardfeed index`")
        return offsets

    def _open_shard(self, entry, first: int, stop: int | None, where: str):
        """``location.open`` of the shard's bytes ``[first, stop)``, refusing a server copy whose
        size differs from the manifest's (a local file's too, with :attr:`check_files`). Returns
        ``(stream, stream_offset)``."""
        stream, stream_offset = self.location.open(entry.name, first, stop)
        if isinstance(self.location, LocalLocation):
            if self.check_files:
                try:
                    check_shard_size(self.location.root, entry.name, os.fstat(stream.fileno()).st_size,
                                     entry.num_bytes)
                except BaseException:
                    stream.close()
                    raise
            return stream, stream_offset
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
                fast = yield from self.location.read_indexed(
                    entry.name, offsets, start, end, where, num_bytes=entry.num_bytes if self.check_files else None)
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
            # the shard's size bounds every member's size field: a local file's own (fstat), a
            # server's checked against the manifest's in _open_shard
            members = iter_members(stream, start_offset=first, end_offset=stop, source=where,
                                   stream_offset=stream_offset,
                                   total_bytes=None if isinstance(self.location, LocalLocation) else entry.num_bytes)
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
        order = shard_order(len(self._counts), seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        segments = self.resume_segments(epoch)
        seg = segments[0] if len(segments) == 1 else None
        if segments:
            self._drop_ahead()
        if not segments:
            raw = self._read_worker_range(order, epoch, worker, num_workers, 0)
        elif seg is not None and (int(seg["world_size"]), max(1, int(seg["num_workers"])), int(seg["batch_size"]),
                                  int(seg["shuffle_buffer"])) == (self.world_size, num_workers, self.batch_size,
                                                                  self.buffer_size):
            # exact resume: this worker plays the old worker whose turn comes next, from where it stopped
            consumed = -(-int(seg["samples_consumed"]) // self.batch_size)
            old = (worker + consumed) % num_workers
            done = worker_batch_counts_before(consumed, num_workers)[old] * self.batch_size
            raw = self._read_worker_range(order, epoch, old, num_workers, done)
        else:
            seq = resumed_rank_sequence(self._num_samples, segments, rank=self.rank, world_size=self.world_size,
                                        batch_size=self.batch_size, num_workers=num_workers, buffer=self.buffer_size,
                                        seed=self.seed, epoch=epoch, shuffle=self.shuffle, pad=self.pad,
                                        drop_last=self.drop_last, streams=True)
            mine = worker_batches(seq, batch_size=self.batch_size, num_workers=num_workers, worker=worker)
            raw = self._read_positions(order, mine)
        c2i = self._class_to_idx
        labels = self._labels
        hole = self.holes
        if self.fields or not self.manifest.labelled:
            yield from self._emit_general(raw)
            self.end_epoch()
            return
        if self.decode:
            decoder = self.decode_sample
            rng_for = self.sample_rng if self.needs_sample_rng() else None
            for index, key, parts in raw:
                if key is None:  # samples of a damaged shard, counted as skipped
                    yield None
                    continue
                try:
                    data, ext, label, _ = parts_to_raw(key, parts, c2i, parts["__url__"], labels)
                    where = f"{parts['__url__']} key {key}"
                    out = decoder(data, ext, label, where, rng=None if rng_for is None else rng_for(index))
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
            label_of: dict[bytes, int] = {}
            for _, key, parts in raw:
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
                        label = label_of.get(cls)
                        if label is None:
                            label = int(cls)
                            if label not in labels:
                                raise CorruptDataError(f"{parts['__url__']} key {key}: {label_problem(label, labels)}")
                            if len(label_of) < 4096:
                                label_of[cls] = label
                        try:
                            meta = loads(meta.decode("utf-8"))[0]
                        except ValueError:
                            meta = json.loads(meta)
                        out = new(Sample, (key, parts[ext], ext, label, meta))
                    else:
                        data, ext, label, meta = parts_to_raw(key, parts, c2i, parts["__url__"], labels)
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

    def _emit_general(self, raw):
        """The items of ``raw`` for unlabelled datasets and extra fields (the one grouping rule,
        :meth:`~shardfeed.readers.sources.source_base.SourceBase.emit`)."""
        c2i, hole, labelled = self._class_to_idx, self.holes, self.manifest.labelled
        for index, key, parts in raw:
            if key is None:
                yield None
                continue
            where = f"{parts['__url__']} key {key}"
            try:
                data, ext, label, meta = parts_to_raw(key, parts, c2i, parts["__url__"], self._labels,
                                                      labelled=labelled)
                extra = self.field_values(parts, where) if self.fields else None
                out = self.emit(key, data, ext, label, meta, where, index=index, extra=extra)
            except (CorruptDataError, ValueError) as exc:
                if not isinstance(exc, CorruptDataError):
                    exc = CorruptDataError(f"{where}: unreadable sample ({exc}); the shard is damaged: run "
                                           "`shardfeed check`")
                self.handle_error(name_original_file(exc, parts.get("json")), where)
                if hole:
                    yield None
                continue
            yield out

    def _read_worker_range(self, order: np.ndarray, epoch: int, worker: int, num_workers: int, done: int):
        """``(index, key, parts)`` of ``worker``'s sub-range of this rank through its shuffle buffer,
        from its ``done``-th emitted sample on.

        The sub-range is streamed front to back into the buffer's windows
        (:func:`~shardfeed.readers.order.buffer_order.shuffled_windows`). ``done > 0`` (a resumed worker):
        the stream starts at the first sample of the window holding emission place ``done`` (by
        offset: ``.sfidx``, local ``seek`` or HTTP ``Range``), so at most one window is read again.
        """
        start, stop = rank_span(self._num_samples, self.rank, self.world_size, pad=self.pad,
                                batch_size=self.batch_size, drop_last=self.drop_last)
        a, b = worker_span(start, stop, num_workers, worker, batch_size=self.batch_size)
        buffer = self.buffer_size
        first = done - done % buffer if buffer > 1 else done  # the stream place the read starts at
        ranges: Iterator[tuple[int, int, int]] = iter_spans(self._counts, order, a + first, b)
        ranges, held = self._take_ahead(ranges) if done == 0 else (ranges, {})
        reads = _Reads(self._iter_ranges(ranges, held))
        items = shuffled_windows(reads, buffer, num_items=b - a, seed=self.seed, epoch=epoch, rank=self.rank,
                                 worker=worker, first=done)
        yield from self._then_read_ahead(items, reads, epoch, a, b)

    # ---- the next epoch's first samples, read while this epoch's last ones decode
    def _then_read_ahead(self, items, reads: _Reads, epoch: int, a: int, b: int):
        """The items of ``items`` (what ``reads`` read, through the shuffle buffer); once the reads
        are done and the samples still to come would take about :data:`AHEAD_MARGIN` times as long
        as the next read ahead (the last one's duration, else this epoch's reads'), the first
        samples of epoch ``epoch + 1`` of the same sub-range ``[a, b)`` are read ahead
        (:meth:`_start_ahead`); at the latest when the items end.

        Just in time rather than at once: less of the buffer is still held beside the bytes read
        ahead, and a run stopped before the epoch's end reads less it never uses.
        """
        emitted, since, started = 0, None, False
        need = max(8, self.batch_size)  # samples over which the rate is measured
        for item in items:
            yield item
            emitted += 1
            if started or reads.ended_at is None:
                continue
            if since is None:
                since = (time.perf_counter(), emitted)
            elif emitted - since[1] >= need:
                spent = time.perf_counter() - since[0]
                left_s = (reads.count - emitted) * spent / (emitted - since[1])
                if left_s <= AHEAD_MARGIN * self._next_read_s(reads):
                    started = True
                    self._start_ahead(epoch + 1, a, b)
        if not started:
            self._start_ahead(epoch + 1, a, b)

    def _next_read_s(self, reads: _Reads) -> float:
        """Seconds the next read ahead should take: the last one's, else this epoch's reads' (when
        it did not start on bytes read ahead), else unknown (infinite: start at once)."""
        last = self._last_ahead
        if last is not None and last.elapsed is not None:
            return last.elapsed
        return reads.ended_at - reads.started_at if last is None and reads.started_at is not None else math.inf

    def _start_ahead(self, epoch: int, a: int, b: int) -> None:
        """Read the first samples of sub-range ``[a, b)`` in ``epoch`` ahead, in the background
        (:class:`~shardfeed.readers.storage.shard_readahead.SpansAhead`): as many as the shuffle buffer
        holds before it yields (at least one batch), whole samples, at most
        :data:`~shardfeed.readers.storage.shard_readahead.EPOCH_AHEAD_BYTES`. Only with ``next_epoch_ahead``
        and for shards read slowly: local ones once a read of the epoch proved slow (with
        ``readahead``), remote ones always."""
        local = isinstance(self.location, LocalLocation)
        self._drop_ahead()
        if not self.next_epoch_ahead:
            return
        if local and not (self.location.readahead and (self._slow_epoch or storage_is_slow())):
            return
        want = max(self.buffer_size, self.batch_size, 1)
        order = shard_order(len(self._counts), seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        ranges = list(itertools.islice(iter_spans(self._counts, order, a, b), want))  # each holds a sample
        self._ahead = SpansAhead(lambda: self._ahead_plan(ranges, want, local), max_bytes=EPOCH_AHEAD_BYTES)

    def _ahead_plan(self, ranges, want: int, local: bool) -> list[tuple]:
        """``((shard, start, end), source, first byte, end byte)`` of the first ``want`` samples of
        ``ranges`` (indexed shards only; stops at the first without an index), whole samples,
        within :data:`~shardfeed.readers.storage.shard_readahead.EPOCH_AHEAD_BYTES`. A whole shard that
        fits is planned without its offset index: the next epoch may never come, and an index
        fetched for it would be a request for nothing."""
        out, left, budget = [], want, EPOCH_AHEAD_BYTES
        for shard, start, end in ranges:
            entry = self.manifest.shards[shard]
            if not entry.index or left <= 0 or budget <= 0:
                break
            if start == 0 and end == entry.num_samples and end <= left and entry.num_bytes <= budget:
                out.append(((shard, 0, end), self._ahead_source(entry, 0, None, local), 0, entry.num_bytes))
                left -= end
                budget -= entry.num_bytes
                continue
            offsets = self._index(shard)
            if offsets is None:
                break
            first = offsets[start]
            # whole samples within the budget: [start, k) with offsets[k] (or the shard's end) <= first + budget
            k = bisect.bisect_right(offsets, first + budget, start) - 1
            if k == len(offsets) - 1 and entry.num_bytes - first <= budget:
                k = len(offsets)
            stop = min(end, start + left, k)
            if stop <= start:
                break
            last = offsets[stop] if stop < len(offsets) else entry.num_bytes
            source = self._ahead_source(entry, first, offsets[stop] if stop < len(offsets) else None, local)
            out.append(((shard, start, stop), source, first, last))
            left -= stop - start
            budget -= last - first
            if stop < end:
                break
        return out

    def _ahead_source(self, entry, first: int, stop: int | None, local: bool):
        """What :class:`~shardfeed.readers.storage.shard_readahead.SpansAhead` reads bytes ``[first, stop)``
        of shard ``entry`` from: its path (local) or a function opening the remote stream."""
        if local:
            return self.location.file_path(entry.name)
        return lambda: self._open_shard(entry, first, stop, self.location.where(entry.name))

    def _take_ahead(self, ranges: Iterator[tuple[int, int, int]]) -> tuple[Iterator[tuple[int, int, int]], dict]:
        """``(ranges, held)``: the same ranges, and ``{(shard, start): (stop, SpansAhead, key)}``, the
        spans read ahead (samples ``[start, stop)`` of ``shard``, whatever epoch they were read for)
        that start one of the first ranges (where :meth:`_ahead_plan` puts them) and end within it;
        every other span read ahead is dropped."""
        ahead, self._ahead = self._ahead, None
        self._last_ahead = ahead
        self._slow_epoch = ahead is not None  # read ahead: the storage was slow (the memory is not)
        if ahead is None:
            return ranges, {}
        spans = list(ahead.spans())
        head = list(itertools.islice(ranges, len(spans)))
        wanted = {(shard, start): end for shard, start, end in head}
        held = {}
        for key in spans:
            shard, start, stop = key
            if wanted.get((shard, start), -1) >= stop:
                held[(shard, start)] = (stop, ahead, key)
            else:
                ahead.discard(key)
        return itertools.chain(head, ranges), held

    def _drop_ahead(self) -> None:
        """Drop what was read ahead (an epoch that does not start afresh reads by position)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _read_positions(self, order: np.ndarray, positions: np.ndarray):
        """``(index, key, parts)`` of global positions ``positions`` in that order (a resumed epoch):
        chunk by chunk, each chunk's samples read by runs of their shards in file order; samples
        read ahead for a later chunk (within four chunks) are kept until then."""
        n = self._num_samples
        if n == 0 or len(positions) == 0:
            return
        ordered_counts = self._counts[np.asarray(order, dtype=np.int64)]
        ends = np.cumsum(ordered_counts)
        phys = np.asarray(positions, dtype=np.int64) % n
        slot = np.searchsorted(ends, phys, side="right")
        shard = np.asarray(order, dtype=np.int64)[slot]
        local = phys - (ends[slot] - ordered_counts[slot])
        chunk = max(self.shuffle_buffer, self.batch_size, 1)
        cache: dict[tuple[int, int], tuple] = {}
        left = Counter(zip(shard.tolist(), local.tolist()))
        for c0 in range(0, len(phys), chunk):
            wanted = list(zip(shard[c0:c0 + chunk].tolist(), local[c0:c0 + chunk].tolist()))
            missing = sorted({t for t in wanted if t not in cache})
            if missing:
                ahead = set(zip(shard[c0:c0 + 4 * chunk].tolist(), local[c0:c0 + 4 * chunk].tolist()))
                for sh, lo, hi in sample_runs(missing, MERGE_GAP_SAMPLES):
                    for item in self._iter_ranges([(sh, lo, hi)]):
                        t = (sh, item[0] - self._starts[sh])
                        if t in ahead:
                            cache[t] = item
            for t in wanted:
                left[t] -= 1
                item = cache.get(t) if left[t] else cache.pop(t, None)
                if item is None:  # lost with a damaged shard (on_error="skip"), already counted
                    if self.holes:
                        yield self._starts[t[0]] + t[1], None, None
                    continue
                yield item

    def _iter_ranges(self, ranges, held: dict | None = None):
        """``(index, key, parts)`` of the samples of ``ranges`` (``index``: packing order); under
        ``on_error="skip"`` a damaged shard's remaining samples are counted as skipped (and, under a
        loader, stand as ``(index, None, None)`` holes). ``held``: spans read ahead
        (:meth:`_take_ahead`), whose samples are parsed from memory."""
        local = isinstance(self.location, LocalLocation)
        held = {} if held is None else held
        pieces = iter(ranges)
        nxt = next(pieces, None)
        n = -1
        while nxt is not None:
            (shard, start, end), nxt, n = nxt, next(pieces, None), n + 1
            if local and (shard, start) in held and held[(shard, start)][0] < end:
                # read ahead only in part: the shard opens while its first samples come from memory
                self.location.open_ahead(self.manifest.shards[shard].name, 0)
            if local and nxt is not None and nxt[1] == 0 and (nxt[0], 0) not in held:
                # slow storage: the next shard opens (and its index is read) while this one decodes
                following = nxt[0]
                self.location.open_ahead(self.manifest.shards[following].name, INDEXED_READ_BYTES,
                                         prepare=lambda i=following: self._index(i))
            if local and not self._slow_epoch and n and storage_is_slow():
                self._slow_epoch = True  # the last range ended slow
            got = 0
            base = self._starts[shard] + start
            try:
                try:
                    for key, parts, _ in self._range_samples(shard, start, end, held.pop((shard, start), None)):
                        yield base + got, key, parts
                        got += 1
                except FileNotFoundError as exc:  # a shard or its index gone (or never there)
                    raise self._missing_file_error(self.manifest.shards[shard], exc) from None
            except (CorruptDataError, DataSourceError) as exc:
                if self.on_error == "raise":
                    raise
                lost = end - start - got
                self.handle_error(exc, self.location.where(self.manifest.shards[shard].name), count=lost)
                if self.holes:
                    for i in range(got, end - start):
                        yield base + i, None, None

    def _missing_file_error(self, entry, exc: FileNotFoundError) -> DataSourceError:
        """The error for a shard (or its offset index) not found when it was opened for reading."""
        local = isinstance(self.location, LocalLocation) and missing_file_error(self.location.root, entry, exc)
        return local or DataSourceError(f"{self.location.where(entry.name)}: a file of this shard is missing ({exc}); "
                                        "restore it (or rebuild the index with `shardfeed index`)")

    def _range_samples(self, shard: int, start: int, end: int, held: tuple | None):
        """:meth:`iter_range` of ``[start, end)``, its first samples parsed from ``held``
        (``(stop, SpansAhead, key)``: samples ``[start, stop)`` read ahead) when their bytes were
        read; the rest (and whatever the fast parser leaves) read as usual."""
        if held is not None:
            stop, ahead, key = held
            data = ahead.take(key)
            if data is not None:
                entry = self.manifest.shards[shard]
                start += yield from iter_indexed_samples(data.read_at, self._index(shard), start, stop,
                                                         entry.num_bytes, source=self.location.where(entry.name),
                                                         tag_source=True)
                del data
        if start < end:
            yield from self.iter_range(shard, start, end)


class _Reads:
    """The items of ``stream``, counted, and when the first was asked for and the stream ended
    (``time.perf_counter()``; None until then)."""

    def __init__(self, stream):
        self._stream = stream
        self.count = 0
        self.started_at: float | None = None
        self.ended_at: float | None = None

    def __iter__(self):
        self.started_at = time.perf_counter()
        for item in self._stream:
            self.count += 1
            yield item
        self.ended_at = time.perf_counter()

