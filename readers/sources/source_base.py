"""What the three sources share: decoding, raw samples, ``on_error``, epochs, rank and batching.

Every source turns a stored sample into the same output through :meth:`SourceBase.emit`:

* ``decode=True``: :class:`~shardfeed.readers.decode.transforms.SampleDecoder` →
  ``(image: torch.uint8 [3, H, W], label: int)``;
* ``decode=False``: :class:`~shardfeed.readers.format.manifest.Sample` ``(key, data, ext, label, meta)``.

``on_error="raise"`` re-raises, the message naming the file, or the shard and key (and the
sample's original file from its metadata when there is one). ``on_error="skip"`` drops a sample
that cannot be read or decoded (a damaged shard: the rest of its range) and counts it (a
:class:`~shardfeed.readers.errors.StorageAccessError`: credentials rejected or expired, HTTP
401/403, a wrong region or endpoint, is never skipped but raised under either choice):

* each process logs the first skip of an epoch with its reason (WARNING);
* the epoch's total is reported once: by :class:`~shardfeed.readers.loader.ShardfeedLoader` at
  the end of each epoch (all workers together), or by the source itself when it is iterated
  without a loader;
* the counts are readable in the main process, workers included: :attr:`SourceBase.skipped`
  (this epoch), :meth:`SourceBase.skipped_in_epoch`, :attr:`SourceBase.skipped_total`. They live
  in a small shared-memory table (one row per process: the main process and each ``DataLoader``
  worker), so they survive ``fork``, ``spawn`` and ``forkserver``; read them after an epoch ends.
* Under a loader (after :meth:`SourceBase.configure_batching`) a skipped sample of an iterable
  source leaves a ``None`` hole that the loader's collate removes, exactly as map-style sources
  return ``None``: every rank then still yields ``len(loader)`` batches (a batch may be smaller),
  so a damaged sample on one rank cannot leave the other ranks waiting in a collective.
  Iterating the dataset directly simply leaves the sample out.

The epoch lives in a one-element shared-memory tensor, so :meth:`SourceBase.set_epoch` called in
the main process reaches persistent ``DataLoader`` workers (fork, spawn or forkserver); so does
the resume plan (:meth:`SourceBase.set_resume`, a small JSON document in a shared byte tensor).

**Iterating a source directly** (``for x in open_dataset(...)``) behaves the same for the three
sources: the epoch is shuffled (``shuffle=True``) and split by ``rank``/``world_size`` exactly as
under :func:`~shardfeed.readers.loader.make_loader` (:mod:`~shardfeed.readers.order.epoch`), and each
iteration is the next epoch unless :meth:`SourceBase.set_epoch` chose one.
:attr:`SourceBase.num_samples_per_rank` is what one iteration yields on this rank (all workers
together). ``len(ds)`` is that number for the iterable WebDataset source; for the map-style
sources (LMDB, folder, memory cache) ``len(ds)`` stays N, the range of ``ds[i]`` (``i`` in
packing order), because ``torch.utils.data`` samplers (``DistributedSampler``...) rely on it.

**Random augmentation** (``train=True``) draws each sample's crop and flip from a generator seeded
by ``(seed, epoch, sample index)`` (:meth:`SourceBase.sample_rng`), not from a per-worker stream,
so a resumed run (or another number of workers) crops every sample as an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import numpy as np

from ..order.epoch import RankOrder, resolve_rank, resumed_samples_per_rank, worker_batches
from ..errors import DatasetChangedError, StorageAccessError
from ..order.permutation import CHUNK
from ..batching.buffers import BatchRing, BatchRows
from ..format.manifest import IMAGE_EXTENSIONS, SIDE_EXTENSIONS, Sample, field_member
from ..format.sample_members import decode_field, sample_from_members
from .options import ReadOptions

__all__ = ["SourceBase", "IMAGE_EXTS", "SIDE_EXTS", "parts_to_raw", "name_original_file", "SKIP_SLOTS",
           "manifest_fingerprint", "RESUME_CAPACITY_BYTES"]

_new_tuple = tuple.__new__
log = logging.getLogger("shardfeed.readers")

#: Extensions recognised as the image member of a WebDataset sample (the one list, in format.py).
IMAGE_EXTS = IMAGE_EXTENSIONS
#: Members that are not the image.
SIDE_EXTS = SIDE_EXTENSIONS

#: Rows of the shared skip-count table: row 0 is the main process, row ``1 + w % (SKIP_SLOTS - 1)``
#: is ``DataLoader`` worker ``w``.
SKIP_SLOTS = 64

#: Room for the resume plan shared with workers (JSON; a plan holds one small dict per earlier run
#: of the epoch, about 120 bytes each). Kept under torch's parallel grain size (32,768 elements):
#: filling a bigger tensor may start OpenMP threads, and a process forked from one that did can
#: deadlock on their lock (found with a source opened in a forked child of the test process).
RESUME_CAPACITY_BYTES = 1 << 14


def manifest_fingerprint(manifest) -> str:
    """SHA-256 (hex) of what decides a dataset's samples and their order: format, N, classes and
    every file's name, sample count, size and hash (not ``created_by`` nor the options).

    The same dataset read locally or over HTTP has the same fingerprint; a repacked or changed
    one (other shards, counts, sizes or hashes) has another.
    """
    doc = {"format": manifest.format, "num_samples": manifest.num_samples, "classes": list(manifest.classes),
           "shards": [[s.name, s.num_samples, s.num_bytes, s.sha256] for s in manifest.shards]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def name_original_file(exc: BaseException, meta: Any) -> BaseException:
    """Add the sample's original file (``meta["path"]``) to ``exc``'s message, in place.

    Args:
        exc: the error raised for a stored sample (its message names the shard and key).
        meta: the sample's metadata: a dict, its JSON bytes, or None.

    Returns:
        ``exc`` (its ``args[0]`` extended with ``"(original file PATH)"`` when the path is known).
    """
    try:
        if isinstance(meta, (bytes, bytearray, memoryview, str)):
            meta = json.loads(bytes(meta) if not isinstance(meta, str) else meta)
        path = meta.get("path") if isinstance(meta, dict) else None
    except Exception:  # unreadable metadata: the shard and key still name the sample
        path = None
    if path and exc.args and isinstance(exc.args[0], str) and path not in exc.args[0]:
        exc.args = (f"{exc.args[0]} (original file {path})",) + exc.args[1:]
    return exc


#: ``(data, ext, label, meta_json_bytes)`` of a WebDataset sample's members: the one grouping rule
#: of :func:`shardfeed.readers.format.sample_members.sample_from_members`, shared with every dataset tool.
parts_to_raw = sample_from_members


class SourceBase:
    """Mixin of the sources (not a dataset by itself).

    A source calls :meth:`_init_common` with one :class:`~shardfeed.readers.sources.options.ReadOptions`:
    the decode path (``image_size``, ``train``, ``decoder``, ``transform``, ``max_pixels``,
    ``max_decode_bytes``, ``seed``, ``resize_size``, ``crop_pct``:
    :class:`~shardfeed.readers.decode.transforms.SampleDecoder`), ``decode`` (False yields raw
    :class:`~shardfeed.readers.format.manifest.Sample` tuples), ``on_error`` (``"raise"`` or ``"skip"``),
    ``shuffle`` (each epoch, keyed by ``(seed, epoch)``), ``pad`` (fill the remainder
    ``N % world_size`` by repeating samples instead of dropping it), ``rank``/``world_size``
    (see :func:`~shardfeed.readers.sources.dataset.resolve_rank`) and ``fields``: extra fields to yield
    beside image and label (manifest version 3, e.g. ``("txt", "json")``): decoded items become
    ``(image, label, *values)`` in that order (``str`` for ``txt``, the parsed value for
    ``json``, ``bytes`` otherwise; None for a sample without it); raw items become
    ``(Sample, {name: value})``.
    """

    #: True for sources read by index (``__getitem__``), False for iterable ones.
    map_style = False

    def _init_common(self, read: ReadOptions) -> None:
        """Set up what every source shares from ``read`` (checked when it was built; the decode
        options are checked here, by :class:`~shardfeed.readers.decode.transforms.SampleDecoder`).

        Raises:
            ValueError: a requested field the manifest does not list; a bad decode option.
            TypeError: ``read`` is not a :class:`~shardfeed.readers.sources.options.ReadOptions`.
        """
        import torch

        from ..decode.transforms import SampleDecoder

        if not isinstance(read, ReadOptions):
            raise TypeError(f"a source takes its shared options as one ReadOptions, got {type(read).__name__}")
        self.fields = self._check_fields(read.fields)
        #: ``(name, member extension)`` of each requested field
        self._field_members = tuple((f, field_member(f)) for f in self.fields)
        self.image_size = read.image_size
        self.decode = read.decode
        self.on_error = read.on_error
        self.seed = read.seed
        self.shuffle = read.shuffle
        self.pad = read.pad
        self.rank, self.world_size = resolve_rank(read.rank, read.world_size)
        self.batch_size = 1
        self.drop_last = False
        # always built: validates the options even in raw mode
        self.sample_decoder = SampleDecoder(**read.decoder_options())
        #: the rows decoded images are written into once a loader batches the source
        #: (:meth:`configure_batching`; None: each image is a tensor of its own)
        self.batch_rows: BatchRows | None = None
        # epoch shared with workers: -1 = never set (then each process counts its own iterations)
        self._epoch_state = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        # resume plan shared with workers: [length, JSON bytes...] (length 0: none)
        self._resume_len = torch.zeros((1,), dtype=torch.int64).share_memory_()
        self._resume_bytes = torch.zeros((RESUME_CAPACITY_BYTES,), dtype=torch.uint8).share_memory_()
        self._local_epoch = 0
        self._ctx_epoch = None
        self._skips = 0
        self._skip_epoch = None
        # skip counts of every process: [epoch + 1 (0: unused), skipped in that epoch, skipped in all]
        self._skip_table = torch.zeros((SKIP_SLOTS, 3), dtype=torch.int64).share_memory_()
        #: True once a loader drives the source (configure_batching): skipped samples of an
        #: iterable source then stand as None holes, and the loader reports the epoch's total
        self.holes = False
        self._pid = os.getpid()

    def _check_fields(self, fields: tuple[str, ...]) -> tuple[str, ...]:
        """The requested extra fields, each one the manifest lists (``ValueError`` naming the others)."""
        if not fields:
            return ()
        manifest = getattr(self, "manifest", None)
        have = dict(getattr(manifest, "fields", None) or {})
        unknown = [f for f in fields if f not in have]
        if unknown:
            where = getattr(self, "location", None) or getattr(self, "root", None) or "this dataset"
            raise ValueError(f"{where}: no field(s) {', '.join(map(repr, unknown))}; the dataset's fields are "
                             f"{', '.join(have) or 'none'} (pack with --sidecars to store sidecar files)")
        return fields

    def field_values(self, stored: dict, where: str) -> tuple:
        """The requested fields' values from the stored ``{member extension or name: bytes}``
        (:func:`~shardfeed.readers.format.sample_members.decode_field`; None where a sample lacks one)."""
        out = []
        for name, member in self._field_members:
            data = stored.get(member)
            out.append(None if data is None else decode_field(name, data, where))
        return tuple(out)

    # ---- configuration
    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (shard order, shuffle, random transforms)."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch_state[0] = int(epoch)

    def separate_shared_state(self) -> None:
        """Continue with new shared epoch and resume-plan tensors, copies of the current ones.

        Workers started before keep reading the old ones: a loader calls this when an iteration
        starts while another one's workers are still running, so that the new iteration's epoch and
        plan never reach them (their shard split, order and random crops stay their own epoch's).
        """
        self._epoch_state = self._epoch_state.clone().share_memory_()
        self._resume_len = self._resume_len.clone().share_memory_()
        self._resume_bytes = self._resume_bytes.clone().share_memory_()

    def set_distributed(self, rank: int | None = None, world_size: int | None = None) -> None:
        """Set (or re-resolve) this reader's rank and world size."""
        self.rank, self.world_size = resolve_rank(rank, world_size)

    def worker_init(self, worker_id: int) -> None:
        """Called by the loader's ``worker_init_fn`` in each worker: remember the worker id."""
        self._worker_id = int(worker_id)
        self.sample_decoder.set_context(max(self.epoch_in_use(), 0), self.rank, int(worker_id))
        if self.batch_rows is not None:
            self.batch_rows.start_epoch()

    def configure_batching(self, batch_size: int, drop_last: bool = False) -> None:
        """Tell the source the loader's batch size, so workers split on batch boundaries.

        With the built-in transforms (``image_size`` set, no ``transform``) decoded images are then
        written into rows of batch buffers (:attr:`batch_rows`, :class:`~shardfeed.readers.batching.buffers.BatchRows`).
        """
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.holes = True
        sd = self.sample_decoder
        self.batch_rows = BatchRows(self.batch_size, sd.image_size) if self.decode and sd.writes_rows else None

    def use_batch_ring(self, ring: BatchRing | None) -> None:
        """The batch ring the workers of the next loader iteration write into (None: none).

        The loader calls it before each iteration starts its workers; the workers copy the source,
        and with it the ring, as they start (workers already running keep theirs).
        """
        if self.batch_rows is not None:
            self.batch_rows.use_ring(ring)

    def decode_sample(self, data: bytes, ext: str, label: int, where: str,
                      rng: np.random.Generator | None = None) -> tuple:
        """:attr:`sample_decoder`'s ``(image, label)`` for one sample, written into the next row of
        :attr:`batch_rows` when a loader batches the source (the row is given back when the sample
        fails to decode, so a batch's images stay consecutive rows). Raises what the decoder raises."""
        rows = self.batch_rows
        if rows is None:
            return self.sample_decoder(data, ext, label, where, rng=rng)
        out = rows.next_row()
        try:
            return self.sample_decoder(data, ext, label, where, rng=rng, out=out)
        except BaseException:
            rows.put_back()
            raise

    # ---- resuming and the epoch's sequence
    def set_resume(self, plan: dict | None) -> None:
        """Continue epoch ``plan["epoch"]`` after the earlier runs ``plan["segments"]``
        (see :mod:`~shardfeed.readers.order.epoch`); None: every epoch starts fresh.

        Set by :meth:`~shardfeed.readers.loader.ShardfeedLoader.load_state_dict`; it reaches
        persistent workers through shared memory. Other epochs than ``plan["epoch"]`` start fresh.

        Raises:
            ValueError: the plan does not fit in :data:`RESUME_CAPACITY_BYTES`.
        """
        import torch

        if not plan:
            self._resume_len[0] = 0
            return
        data = json.dumps({"epoch": int(plan["epoch"]), "segments": list(plan["segments"])},
                          separators=(",", ":")).encode()
        if len(data) > RESUME_CAPACITY_BYTES:
            raise ValueError(f"resume plan of {len(data)} bytes is over {RESUME_CAPACITY_BYTES} bytes: the epoch "
                             "was resumed too many times; start the next epoch fresh")
        self._resume_bytes[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._resume_len[0] = len(data)

    def resume_plan(self) -> dict | None:
        """The plan set by :meth:`set_resume` (None when there is none)."""
        n = int(self._resume_len[0])
        if n == 0:
            return None
        return json.loads(self._resume_bytes[:n].numpy().tobytes())

    def resume_segments(self, epoch: int) -> list[dict]:
        """The earlier runs of ``epoch`` (empty: the epoch starts fresh)."""
        plan = self.resume_plan()
        return list(plan["segments"]) if plan and int(plan["epoch"]) == int(epoch) else []

    @property
    def buffer_size(self) -> int:
        """Samples in each worker's shuffle buffer (0: random-access source or no shuffle)."""
        return 0

    @property
    def fingerprint(self) -> str:
        """SHA-256 of what decides this dataset's samples and order (:func:`manifest_fingerprint`)."""
        return manifest_fingerprint(self.manifest)

    @property
    def num_samples_per_rank(self) -> int:
        """Samples one iteration yields on this rank, all workers together (resume-aware)."""
        return resumed_samples_per_rank(self._num_samples, self.resume_segments(self.epoch_in_use()),
                                        world_size=self.world_size, batch_size=self.batch_size, pad=self.pad,
                                        drop_last=self.drop_last)

    def rank_order(self, epoch: int) -> RankOrder:
        """This rank's sample indices of ``epoch`` in the order a random-access source delivers them,
        computed a slice at a time (:class:`~shardfeed.readers.order.epoch.RankOrder`, the resume plan included).

        Raises:
            ValueError: the resume plan does not fit the epoch.
        """
        return RankOrder(self._num_samples, self.resume_segments(epoch), rank=self.rank, world_size=self.world_size,
                         batch_size=self.batch_size, seed=self.seed, epoch=epoch, shuffle=self.shuffle, pad=self.pad,
                         drop_last=self.drop_last)

    def needs_sample_rng(self) -> bool:
        """Whether decoding draws random numbers (built-in train transform)."""
        sd = self.sample_decoder
        return self.decode and sd.train and sd.transform is None and sd.image_size is not None

    def sample_rng(self, index: int) -> np.random.Generator:
        """The generator for sample ``index`` (packing order) in the current epoch: seeded by
        ``(seed, epoch, index)``, the same in every process and run
        (:func:`~shardfeed.readers.decode.transforms.sample_generator`: this thread's generator,
        re-seeded; draw from it before asking for the next sample's)."""
        from ..decode.transforms import sample_generator

        epoch = self._ctx_epoch if self._ctx_epoch is not None else 0
        return sample_generator(self.seed, epoch, index)

    def __iter__(self):
        """Direct iteration of a map-style source: the rank's indices of the epoch, shuffled and
        split as under :func:`~shardfeed.readers.loader.make_loader` (workers take every W-th batch)."""
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        num_workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        epoch = self.begin_epoch(worker)
        order = self.rank_order(epoch)
        round_size = max(1, num_workers) * self.batch_size  # one batch of each worker
        for chunk in order.chunks(round_size * max(1, CHUNK // round_size)):
            if num_workers > 1:
                chunk = worker_batches(chunk, batch_size=self.batch_size, num_workers=num_workers, worker=worker)
            for i in chunk.tolist():
                item = self[i]
                if item is not None or self.holes:
                    yield item
        self.end_epoch()

    @property
    def classes(self) -> list[str]:
        return list(self._classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return dict(self._class_to_idx)

    @property
    def num_samples(self) -> int:
        """Samples in the whole dataset (N), all ranks together."""
        return self._num_samples

    def epoch_in_use(self) -> int:
        """The epoch the current iteration uses (set, or this process's iteration count)."""
        e = int(self._epoch_state[0])
        return self._local_epoch if e < 0 else e

    def begin_epoch(self, worker: int | None = None) -> int:
        """Called at the start of an iteration in the process that reads; returns the epoch."""
        e = int(self._epoch_state[0])
        if e < 0:
            e = self._local_epoch
            self._local_epoch += 1
        self._enter_epoch(e, worker)
        return e

    def _enter_epoch(self, e: int, worker: int | None) -> None:
        if self._skip_epoch is not None and self._skip_epoch != e:
            self._report_skips()
        self._ctx_epoch = e
        self.sample_decoder.set_context(e, self.rank, worker)
        if self.batch_rows is not None:
            self.batch_rows.start_epoch()

    def end_epoch(self) -> None:
        """Called when an iteration ends: logs the epoch's skip count."""
        self._report_skips()

    def _report_skips(self) -> None:
        if self._skips:
            # under a loader the loader reports the epoch's total (all workers) once
            log.log(logging.DEBUG if self.holes else logging.WARNING,
                    "on_error='skip': %d samples skipped in epoch %s (process %d)", self._skips,
                    self._skip_epoch, os.getpid())
        self._skips = 0
        self._skip_epoch = None

    def _map_epoch_check(self) -> None:
        """Map-style sources: follow the shared epoch in each process (for random transforms)."""
        e = self._epoch_state.item()  # per sample: .item() costs 0.5 us, int(t[0]) 2 us
        if e < 0:
            e = 0
        if e != self._ctx_epoch:
            self._enter_epoch(e, None)

    # ---- turning stored samples into outputs
    def emit(self, key: str, data: bytes, ext: str, label: int, meta: Any, where: str, index: int | None = None,
             extra: tuple | None = None):
        """One output item: decoded ``(uint8 [3, H, W], int)`` or a raw ``Sample``.

        Args:
            meta: a dict, or the JSON bytes of one (parsed only in raw mode).
            where: the file, or ``"shard S key K"``, for error messages.
            index: the sample's index in packing order (seeds its random crop and flip).
            extra: the requested fields' values (:meth:`field_values`), when ``fields`` were asked:
                appended to a decoded item, or paired with a raw one as ``(Sample, {name: value})``.
        """
        if extra is not None:
            out = self.emit(key, data, ext, label, meta, where, index)
            if self.decode:
                return (*out, *extra)
            return (out, dict(zip(self.fields, extra)))
        if self.decode:
            if index is not None and self.needs_sample_rng():
                return self.decode_sample(data, ext, label, where, rng=self.sample_rng(index))
            return self.decode_sample(data, ext, label, where)
        if meta is None:
            meta = {}
        elif not isinstance(meta, dict):
            meta = json.loads(meta)
        return _new_tuple(Sample, (key, data, ext, label, meta))  # Sample(...) without its Python __new__

    def handle_error(self, exc: BaseException, where: str, count: int = 1) -> None:
        """``on_error``: re-raise, or count ``count`` skipped samples and log the epoch's first skip.

        Args:
            exc: the error (its message names the file, or the shard and key).
            where: the file, shard or ``"shard S key K"`` it concerns.
            count: samples lost with it (a damaged shard loses the rest of its range).
        """
        if self.on_error == "raise" or isinstance(exc, (StorageAccessError, DatasetChangedError)):  # data only
            raise exc
        if self._skips == 0:
            log.warning("on_error='skip': skipping %s: %s (further skips this epoch are counted)", where, exc)
        self._skips += count
        epoch = self._ctx_epoch if self._ctx_epoch is not None else 0
        self._skip_epoch = epoch
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        row = self._skip_table[0 if info is None else 1 + info.id % (SKIP_SLOTS - 1)]
        if int(row[0]) != epoch + 1:  # this process's first skip of the epoch
            row[0] = epoch + 1
            row[1] = 0
        row[1] += count
        row[2] += count

    def skipped_in_epoch(self, epoch: int) -> int:
        """Samples skipped in ``epoch``, by every process reading this source (main + workers).

        Each process keeps the count of its latest epoch only: read it once the epoch has ended
        (before the next one ends).
        """
        t = self._skip_table
        return int(t[t[:, 0] == int(epoch) + 1, 1].sum())

    @property
    def skipped(self) -> int:
        """Samples skipped in the current (or just finished) epoch, all processes together.

        The epoch is the one set by ``set_epoch`` (the loader sets it before each epoch), else the
        one this process last began, else the newest one any worker counted.
        """
        e = int(self._epoch_state[0])
        if e < 0:
            e = self._ctx_epoch
        if e is None:
            newest = int(self._skip_table[:, 0].max())
            if newest == 0:
                return 0
            e = newest - 1
        return self.skipped_in_epoch(e)

    @property
    def skipped_total(self) -> int:
        """Samples skipped in all epochs so far, all processes together."""
        return int(self._skip_table[:, 2].sum())

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_skips"] = 0
        state["_skip_epoch"] = None
        return state
