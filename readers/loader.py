"""The ``DataLoader`` factory (the host-to-device step is :mod:`~shardfeed.readers.device`'s :func:`to_device`).

:func:`make_loader` applies the knobs the field tunes (docs/reading.md, "Loader options"):

* ``num_workers``: default ``min(4, usable CPUs)``;
* ``pin_memory``: on when CUDA is available (batches then reach the GPU by a ``non_blocking``
  copy, see :func:`to_device`);
* ``prefetch_factor`` (2) and ``persistent_workers`` (True), both only when ``num_workers > 0``;
* every worker starts with ``cv2.setNumThreads(1)`` and ``torch.set_num_threads(1)`` (workers
  must not fight over cores) and tells the dataset its worker id.

The epoch is split by sample ranges (:mod:`shardfeed.readers.sources.dataset`), so ``len(loader)`` is
exact: ``ceil(L / batch_size)`` (``L // batch_size`` with ``drop_last``) where ``L`` is
``N // world_size`` (``ceil(N / world_size)`` with ``pad=True``), and the same for any
``num_workers``. The loader counts epochs: each ``iter(loader)`` uses the next epoch (0, 1, ...)
unless :meth:`ShardfeedLoader.set_epoch` was called.

**Resuming mid-epoch.** :meth:`ShardfeedLoader.state_dict` returns a small JSON-serialisable dict
(format version, the dataset's fingerprint, epoch, samples consumed, seed, world size, batch size,
worker count, ...); :meth:`ShardfeedLoader.load_state_dict` on a new loader over the same dataset,
before iterating, continues that epoch from the next batch, then the following epochs. It costs a
seek, not a replay: positions are computed (:mod:`~shardfeed.readers.order.epoch`), a WebDataset worker
seeks to the first sample of the shuffle buffer's window it stopped in (``.sfidx`` offsets), LMDB and
folder sources index directly.

* Same world size, batch size, number of workers and seed: the same batches as an uninterrupted
  run (samples, order, labels, random crops and flips).
* Another number of workers or world size: every sample not yet consumed in that epoch is read
  once across ranks (the rest of the epoch is split by the usual rule, remainder included), and
  every rank yields the same number of batches.
* Batches consumed count whole: samples skipped under ``on_error="skip"`` count as consumed.
* Under DDP every rank consumes the same batches, so rank 0's state restores all ranks.
* A state from another dataset (other manifest fingerprint), another seed, shuffle, ``pad`` or
  ``drop_last`` is refused (:class:`~shardfeed.readers.errors.ResumeStateError`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing
import numbers
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, cast

import torch
import torch.utils.data

from .batching.buffers import BATCH_RING_MAX_BYTES, BatchRing, batch_ring_for, collate_decoded
from .device import to_device
from .iteration import EpochIterator, EpochProgress
from .sources.dataset import is_url, open_dataset, open_dataset_keywords
from .order.epoch import RankOrder, resolve_rank, resumed_samples_per_rank, validate_resume_state
from .errors import ResumeStateError
from .order.permutation import EPOCH_ORDER_VERSION, check_state_epoch_order
from .keywords import check_keywords, signature_keywords
from .sources.options import check_seed
from .sources.source_base import SourceBase

__all__ = ["make_loader", "LoaderOptions", "LOADER_OPTION_NAMES", "to_device", "ShardfeedLoader",
           "EpochSampler", "default_num_workers", "BATCH_RING_MAX_BYTES",
           "collate_raw", "worker_init", "STATE_VERSION"]

#: Version of the dict :meth:`ShardfeedLoader.state_dict` returns (2: it records ``epoch_order``).
STATE_VERSION = 2

log = logging.getLogger(__name__)


def default_num_workers() -> int:
    """``min(4, CPUs this process may use)``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(0, min(4, cpus))


class EpochSampler(torch.utils.data.Sampler[int]):
    """Indices of one rank for random-access datasets, by the sample-range rule.

    Each epoch the N indices are permuted by the seeded per-position permutation of
    :func:`~shardfeed.readers.order.epoch.positions_to_indices` (identity without ``shuffle``) and the rank
    takes its contiguous range of that sequence (remainder dropped, or filled from the start with
    ``pad``), cut to whole batches with ``drop_last``. Only the rank's positions are computed, one chunk
    at a time as the indices are drawn (:class:`~shardfeed.readers.order.epoch.RankOrder`). After
    :meth:`set_resume`, the resumed epoch yields the rank's part of what is left of it
    (:func:`~shardfeed.readers.order.epoch.resumed_rank_sequence`).
    """

    def __init__(self, num_samples: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0,
                 world_size: int = 1, pad: bool = False, batch_size: int = 1, drop_last: bool = False,
                 locate: Callable[[int, Any], list[Any]] | None = None) -> None:
        self.num_samples = int(num_samples)
        #: ``locate(epoch, chunk of indices) -> items to hand out instead`` (a mix: where each slot reads)
        self.locate = locate
        self.shuffle, self.seed, self.pad = bool(shuffle), int(seed), bool(pad)
        self.rank, self.world_size = rank, world_size
        self.batch_size, self.drop_last = int(batch_size), bool(drop_last)
        self.epoch = 0
        self.resume: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def set_resume(self, plan: dict[str, Any] | None) -> None:
        """Continue ``plan["epoch"]`` after the earlier runs ``plan["segments"]`` (None: fresh epochs)."""
        self.resume = plan or None

    def _segments(self) -> list[dict[str, Any]]:
        plan = self.resume
        return list(plan["segments"]) if plan and int(plan["epoch"]) == self.epoch else []

    def __iter__(self) -> Iterator[int]:
        order = RankOrder(self.num_samples, self._segments(), rank=self.rank, world_size=self.world_size,
                          batch_size=self.batch_size, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
                          pad=self.pad, drop_last=self.drop_last)
        if self.locate is not None:
            return (item for chunk in order.chunks() for item in self.locate(self.epoch, chunk))
        return (i for chunk in order.chunks() for i in chunk.tolist())

    def __len__(self) -> int:
        return resumed_samples_per_rank(self.num_samples, self._segments(), world_size=self.world_size,
                                        batch_size=self.batch_size, pad=self.pad, drop_last=self.drop_last)


def worker_init(worker_id: int, user_fn: Callable[[int], Any] | None = None,
                forked_cv2_threads: int | None = None) -> None:
    """``worker_init_fn``: one OpenCV and one torch thread per worker; tell the dataset its id.

    OpenCV's thread pool does not survive ``fork``: in a worker forked from a parent whose OpenCV
    pool may be running (``forked_cv2_threads`` > 1), ``cv2.setNumThreads`` deadlocks in
    ``pthread_cond_destroy``, so it is left alone there (OpenCV still works, with the parent's
    setting). Spawned and forkserver workers, and forked ones whose parent never imported cv2,
    get one OpenCV thread.
    """
    if forked_cv2_threads is None or forked_cv2_threads <= 1:
        try:
            import cv2

            if cv2.getNumThreads() != 1:
                cv2.setNumThreads(1)
        except Exception:  # pragma: no cover - OpenCV missing or broken: nothing to limit
            pass
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    info = torch.utils.data.get_worker_info()
    ds = info.dataset if info is not None else None
    if isinstance(ds, SourceBase):
        ds.worker_init(worker_id)
    if user_fn is not None:
        user_fn(worker_id)


def _cv2_threads_if_forking(context: Any) -> int | None:
    """The parent's OpenCV thread count when workers will be forked after cv2 was imported."""
    cv2 = sys.modules.get("cv2")
    if cv2 is None:
        return None
    if context is None:
        method = multiprocessing.get_start_method(allow_none=False)
    else:
        method = context if isinstance(context, str) else context.get_start_method()
    return int(cv2.getNumThreads()) if method == "fork" else None


def collate_raw(batch: Sequence[Any]) -> list[Any]:
    """Collate for ``decode=False``: the batch is the list of samples (skipped ones removed)."""
    return [s for s in batch if s is not None]


class ShardfeedLoader(torch.utils.data.DataLoader[Any]):
    """A ``DataLoader`` that tells its dataset (and sampler) the epoch before each iteration.

    ``iter(loader)`` uses epoch 0, then 1, 2, ...; :meth:`set_epoch` chooses the next one.
    With ``on_error="skip"``, the epoch's skipped samples (all workers together) are logged once
    when the epoch ends (WARNING) and can be read as ``loader.dataset.skipped`` (see
    :class:`~shardfeed.readers.sources.source_base.SourceBase`). :meth:`state_dict` and
    :meth:`load_state_dict` resume mid-epoch (see the module docstring).

    Several iterations may be live at once (``zip(loader, loader)``): without persistent
    workers, each one's workers keep the epoch and resume plan it started with, only the first
    of them moves batches through the batch ring (:mod:`~shardfeed.readers.batching.buffers`), and
    one started while that one is alive and unfinished makes its batches the ordinary way. With
    ``num_workers=0`` the iterations share the one dataset in this process: each takes the epoch
    set last when it asks for its first batch, and random crops follow the epoch that began last;
    give each iteration its own loader when they must read different epochs.
    """

    def __init__(self, *args: Any, epoch_sampler: EpochSampler | None = None, batch_ring: BatchRing | None = None,
                 pin_ring: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._epoch_sampler = epoch_sampler
        #: reused shared-memory batch slots of the workers (:func:`~shardfeed.readers.batching.buffers.batch_ring_for`);
        #: each iteration hands it, or None, to the source (``SourceBase.use_batch_ring``) before its workers start
        self._batch_ring = batch_ring if isinstance(self.dataset, SourceBase) else None
        self._pin_ring = bool(pin_ring)  # batches taken from the ring are copied into page-locked memory
        self._ring_user: "weakref.ref[EpochIterator] | None" = None  # the iteration whose workers use the ring
        self._latest: "weakref.ref[EpochIterator] | None" = None  # the latest iteration started
        self._next_epoch = 0
        self._progress: EpochProgress | None = None  # the latest iteration's (see state_dict)
        self._resume: dict[str, Any] | None = None  # {"epoch", "segments"} in effect
        self._resume_started = False

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next ``iter(loader)`` (then ``epoch + 1``, ...)."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._next_epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter(loader)`` will use."""
        return self._next_epoch

    def _set_plan(self, plan: dict[str, Any] | None) -> None:
        self._resume = plan
        self._resume_started = False
        if isinstance(self.dataset, SourceBase):
            self.dataset.set_resume(plan)
        if self._epoch_sampler is not None:
            self._epoch_sampler.set_resume(plan)

    def __iter__(self) -> EpochIterator:  # type: ignore[override]  # DataLoader's says _BaseDataLoaderIter
        live = self._latest() if self._latest is not None else None
        if (live is not None and not live.finished and self.num_workers > 0 and not self.persistent_workers
                and isinstance(self.dataset, SourceBase)):
            # the live iteration's workers read the epoch and resume plan from shared memory:
            # this iteration's go to new copies
            self.dataset.separate_shared_state()
        e = self._next_epoch
        self._next_epoch = e + 1
        if self._resume is not None and (int(self._resume["epoch"]) != e or self._resume_started):
            self._set_plan(None)  # the resumed epoch is over (or another epoch was chosen)
        if self._resume is not None:
            self._resume_started = True
        ds = self.dataset
        if isinstance(ds, SourceBase) or hasattr(ds, "set_epoch"):
            ds.set_epoch(e)
        if self._epoch_sampler is not None:
            self._epoch_sampler.set_epoch(e)
        elif hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(e)
        segments = list(self._resume["segments"]) if self._resume is not None else []
        progress = EpochProgress(e, segments)
        ring = self._batch_ring
        if ring is not None and not self.persistent_workers and self._ring_in_use():
            # another iteration's workers write into the slots: this one's make their batches the
            # ordinary way, never touching the slots or the other iteration's handles
            log.debug("batch ring in use by a live iteration of this loader: this one makes its batches one by one")
            ring = None
        elif ring is not None:
            ring.reclaim()  # slots of batches an earlier iteration never took
        if self._batch_ring is not None:
            cast(SourceBase, ds).use_batch_ring(ring)  # the workers started below copy it
        it = EpochIterator(super().__iter__(), self, progress)
        if ring is not None:
            self._ring_user = weakref.ref(it)
        self._latest = weakref.ref(it)
        self._progress = progress
        return it

    def _ring_in_use(self) -> bool:
        """Whether an iteration whose workers write into the batch ring is still alive and unfinished."""
        user = self._ring_user() if self._ring_user is not None else None
        return user is not None and not user.finished

    # ---- resuming
    def _source(self) -> SourceBase:
        ds = self.dataset
        if not isinstance(ds, SourceBase):
            raise TypeError("state_dict/load_state_dict need a shardfeed source (open_dataset), not "
                            f"{type(ds).__name__}")
        return ds

    def _rules(self) -> dict[str, Any]:
        ds = self._source()
        return {"num_samples": ds.num_samples, "seed": ds.seed, "shuffle": ds.shuffle, "pad": ds.pad,
                "drop_last": ds.drop_last}

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: a small JSON-serialisable dict to save with the model checkpoint.

        Keys: ``version`` (:data:`STATE_VERSION`), ``fingerprint`` (the dataset's, from its
        manifest), ``epoch``, ``samples_consumed`` (positions of each rank's share of the epoch
        consumed by this run: ``batches_consumed * batch_size``, skipped samples included),
        ``batches_consumed``, ``seed``, ``shuffle``, ``pad``, ``drop_last``, ``num_samples``,
        ``world_size``, ``batch_size``, ``num_workers``, ``shuffle_buffer`` (WebDataset, samples; 0
        for random-access sources), ``epoch_order`` (the version of the epoch order,
        :data:`~shardfeed.readers.order.permutation.EPOCH_ORDER_VERSION`), ``access`` (``"stream"``: a
        WebDataset read by worker streams; ``"random"``: indices from the sampler) and ``segments`` (earlier runs of
        this epoch when it was itself resumed). Call it between batches (after a step): a batch the loop has
        received counts as consumed. Under DDP every rank returns the same values (save rank 0's).

        The state describes the latest ``iter(loader)`` (torchdata's ``StatefulDataLoader``
        contract): the batches it yielded, however the loop over it ended (``break``, an
        exception in the step, ``itertools.islice``, ``del it``); once it ran to its end, the
        start of the next epoch. A new ``iter(loader)`` starts the next epoch (an iteration left
        early is not continued by it); after :meth:`load_state_dict` and before the next
        ``iter(loader)``, the loaded position.

        Raises:
            TypeError: the loader's dataset is not a shardfeed source.
        """
        ds = self._source()
        cur = self._progress
        segments: list[dict[str, Any]] = []
        if cur is not None and not cur.finished and cur.epoch == self._next_epoch - 1:
            epoch, batches, segments = cur.epoch, cur.batches, list(cur.segments)
        elif self._resume is not None and not self._resume_started:
            epoch, batches = int(self._resume["epoch"]), 0  # loaded, not yet iterated
            segments = list(self._resume["segments"])
        else:
            epoch, batches = self._next_epoch, 0
        length = resumed_samples_per_rank(ds.num_samples, segments, world_size=ds.world_size,
                                          batch_size=ds.batch_size, pad=ds.pad, drop_last=ds.drop_last)
        state = {"version": STATE_VERSION, "fingerprint": ds.fingerprint, "epoch": epoch,
                 "samples_consumed": min(batches * ds.batch_size, length), "batches_consumed": batches,
                 **self._rules(), "world_size": ds.world_size, "batch_size": ds.batch_size,
                 "num_workers": self.num_workers, "shuffle_buffer": ds.buffer_size, "epoch_order": EPOCH_ORDER_VERSION,
                 "access": "random" if getattr(ds, "map_style", False) else "stream", "segments": segments}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of another process or rank):
        the next ``iter(loader)`` is the rest of ``state["epoch"]``, then the following epochs.

        Call it before iterating. Each rank loads the same state (rank 0's).

        Raises:
            ResumeStateError: another format version, another dataset (fingerprint or sample
                count), another seed, shuffle, ``pad`` or ``drop_last``, a mid-epoch position in another
                epoch order (:func:`~shardfeed.readers.order.permutation.check_state_epoch_order`), or a field
                of the wrong type or range, or inconsistent with the epoch
                (:func:`~shardfeed.readers.order.epoch.validate_resume_state`; the message names it).
            TypeError: the loader's dataset is not a shardfeed source.
        """
        ds = self._source()
        if not isinstance(state, dict) or state.get("version") not in (1, STATE_VERSION):
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise ResumeStateError(f"loader state version {got!r} is not {STATE_VERSION}: it was saved by another "
                                   "shardfeed; start the epoch afresh (loader.set_epoch(epoch))")
        validate_resume_state(state, num_samples=ds.num_samples)
        if state.get("fingerprint") != ds.fingerprint:
            raise ResumeStateError(f"the loader state was saved for another dataset (fingerprint "
                                   f"{str(state.get('fingerprint'))[:12]}..., this one {ds.fingerprint[:12]}...): "
                                   f"{ds!r} changed since (repacked or edited); resuming would repeat or skip "
                                   "samples. Start the epoch afresh with loader.set_epoch(epoch)")
        for key, value in self._rules().items():
            if state.get(key) != value:
                raise ResumeStateError(f"the loader state has {key}={state.get(key)!r} but this loader "
                                       f"{key}={value!r}; make the loader with the same {key} to resume")
        try:
            epoch = int(state["epoch"])
            seg = {"world_size": int(state["world_size"]), "num_workers": int(state["num_workers"]),
                   "batch_size": int(state["batch_size"]), "shuffle_buffer": int(state["shuffle_buffer"]),
                   "samples_consumed": int(state["samples_consumed"])}
            segments = [dict(x) for x in state.get("segments", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeStateError(f"malformed loader state ({exc!r}): pass what loader.state_dict() returned"
                                   ) from None
        if epoch < 0:
            raise ResumeStateError(f"malformed loader state: epoch {epoch}")
        if seg["samples_consumed"] > 0:
            segments.append(seg)
        try:
            left = resumed_samples_per_rank(ds.num_samples, segments, world_size=ds.world_size,
                                            batch_size=ds.batch_size, pad=ds.pad, drop_last=ds.drop_last)
        except ValueError as exc:
            raise ResumeStateError(f"loader state field samples_consumed (or one of segments) does not fit the "
                                   f"epoch: {exc}; pass what loader.state_dict() returned, or start the epoch "
                                   "afresh with loader.set_epoch(epoch)") from None
        mid_epoch = bool(segments) and left > 0  # positions consumed and positions left
        check_state_epoch_order(state, random_access=getattr(ds, "map_style", False), shuffle=ds.shuffle,
                                mid_epoch=mid_epoch)
        self._check_state_access(state, mid_epoch=mid_epoch)
        if segments and left == 0:
            epoch, segments = epoch + 1, []  # the epoch was consumed to its end
        self._next_epoch = epoch
        self._progress = None  # the state describes the loaded position until the next iter(loader)
        self._set_plan({"epoch": epoch, "segments": segments} if segments else None)
        ds.set_epoch(epoch)  # len(loader) now counts what the resumed epoch yields
        if self._epoch_sampler is not None:
            self._epoch_sampler.set_epoch(epoch)
        log.info("resuming epoch %d after %d earlier run(s): %d samples left on this rank", epoch, len(segments),
                 left if segments else 0)

    def _check_state_access(self, state: dict[str, Any], *, mid_epoch: bool) -> None:
        """Refuse a mid-epoch state saved by a loader that read the epoch the other way: a stream per
        worker (``access="stream"``: WebDataset) or indices handed out by the sampler
        (``access="random"``: LMDB, folders, ``cache="memory"``). The positions are delivered in
        another order, so resuming would repeat some samples and skip others. A state without
        ``access`` is a stream's when its ``shuffle_buffer`` is over 1 (random-access loaders save 0)."""
        mine = "random" if getattr(self._source(), "map_style", False) else "stream"
        theirs = state.get("access", "stream" if state.get("shuffle_buffer", 0) > 1 else None)
        if mid_epoch and theirs not in (None, mine):
            how = {"stream": "a stream per worker (a WebDataset read from its shards)",
                   "random": "indices from the sampler (LMDB, a folder, or cache=\"memory\")"}
            raise ResumeStateError(f"the loader state was saved mid-epoch by a loader that read {how[theirs]}, "
                                   f"and this one reads {how[mine]}: the same positions hold other samples. "
                                   "Make the loader as when the state was saved (the same cache= option), or "
                                   f"start the epoch afresh with loader.set_epoch({state.get('epoch')})")

    def _report_epoch(self, epoch: int) -> None:
        ds = self.dataset
        if isinstance(ds, SourceBase):
            n = ds.skipped_in_epoch(epoch)
            if n:
                log.warning("on_error='skip': %d samples skipped in epoch %d of %r (reasons logged above; "
                            "`shardfeed check` finds damaged files)", n, epoch, ds)


@dataclass(frozen=True)
class LoaderOptions:
    """The keywords :func:`make_loader` hands to the ``DataLoader`` rather than to
    :func:`~shardfeed.readers.sources.dataset.open_dataset`, and its GPU decoding hook (frozen).

    Args:
        multiprocessing_context: the workers' start method (``"fork"``, ``"spawn"``,
            ``"forkserver"`` or a context; None: the platform's default); unused without workers.
        worker_init_fn: called with the worker id in each worker, after shardfeed's own
            initialisation; unused without workers.
        collate_fn: replaces shardfeed's collate (None: shardfeed's, which also drops the holes a
            skipped sample leaves).
        timeout: seconds to wait for a batch from the workers (0: no limit), as ``DataLoader``'s.
        generator: the ``DataLoader``'s ``torch.Generator`` (None: its default).
        decode_device: ``"cuda"`` (or a CUDA device): the workers hand over encoded bytes and each
            batch is decoded on that GPU (:mod:`~shardfeed.readers.decode.gpu_decode`); None or a CPU
            device: decoded in the workers.
    """

    multiprocessing_context: Any = None
    worker_init_fn: Callable[[int], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    timeout: float = 0
    generator: torch.Generator | None = None
    decode_device: str | torch.device | None = None


#: The keywords that make a :class:`LoaderOptions`.
LOADER_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(LoaderOptions))


def make_loader(source_or_dataset: Any, batch_size: int, *, num_workers: int | None = None,
                pin_memory: bool | None = None, prefetch_factor: int | None = 2, persistent_workers: bool = True,
                shuffle: bool = True, seed: int = 0, drop_last: bool = False, pad: bool = False,
                rank: int | None = None, world_size: int | None = None, samples_per_epoch: int | None = None,
                weights: Sequence[float] | None = None, **open_dataset_options: Any) -> ShardfeedLoader:
    """A ``DataLoader`` over a source (path/URL) or a dataset from :func:`open_dataset`.

    Args:
        source_or_dataset: what :func:`~shardfeed.readers.sources.dataset.open_dataset` accepts, or a
            dataset (ours, or any map-style / iterable torch dataset); or a list of sources to mix
            (with ``samples_per_epoch``; :mod:`~shardfeed.readers.sources.mixing`).
        batch_size: samples per batch.
        num_workers: worker processes (default ``min(4, CPUs)``; 0 reads in the main process).
        pin_memory: page-locked batches for fast ``non_blocking`` copies (default: CUDA available).
        prefetch_factor: batches each worker prepares ahead (ignored without workers).
        persistent_workers: keep workers between epochs (only with ``num_workers > 0``).
        shuffle: shuffle each epoch (shard order + shuffle buffer, or a permutation), keyed by
            ``(seed, epoch)``.
        seed: the run's seed (shuffling and random transforms).
        drop_last: drop each rank's last partial batch.
        pad: give every rank ``ceil(N / world_size)`` samples by repeating samples from the start
            of the epoch instead of dropping the remainder ``N % world_size``.
        rank, world_size: override what ``torch.distributed`` / ``RANK``/``WORLD_SIZE`` say.
        samples_per_epoch: N: every epoch holds exactly N samples (all ranks together), drawn from the
            source(s) pass after pass (:mod:`~shardfeed.readers.sources.mixing`); None: one pass of one source.
        weights: with a list of sources, one positive weight each (None: equal); each epoch takes
            ``round(N * w / sum(w))`` samples from each (largest remainder). ``fields=("source",)``
            adds each item's source index.
        **open_dataset_options: passed to :func:`open_dataset` (``image_size``, ``train``,
            ``resize_size`` or ``crop_pct`` (evaluation: e.g. ``image_size=224, resize_size=256``),
            ``decoder``, ``decode``, ``on_error``, ``cache``, ``cache_dir``, ``cache_limit``, ...); besides,
            ``multiprocessing_context`` (``"fork"``, ``"spawn"``, ``"forkserver"``),
            ``worker_init_fn`` (called after ours), ``collate_fn``, ``timeout`` and ``generator`` go
            to the ``DataLoader`` (:class:`LoaderOptions`), and ``decode_device="cuda"`` makes the
            workers hand over encoded bytes and decodes each batch on that GPU (nvJPEG; images and
            labels come out on the device; the CPU loader where there is no CUDA): see
            :mod:`~shardfeed.readers.decode.gpu_decode`.

    With workers and the built-in transforms, batches cross from the workers through reused
    shared-memory slots (:mod:`~shardfeed.readers.batching.buffers`: ``num_workers * (prefetch_factor
    + 4)`` batches of shared memory, at most :data:`BATCH_RING_MAX_BYTES`); a slot is written
    again only after every tensor of the batch the loop received from it is freed.

    Returns:
        A :class:`ShardfeedLoader`. Batches: ``(images, labels)``: ``torch.uint8``
        ``[B, 3, H, W]`` and ``torch.int64`` ``[B]`` (``B <= batch_size`` for the last one unless
        ``drop_last``); with ``decode=False`` a list of :class:`~shardfeed.readers.format.manifest.Sample`.
        ``len(loader)`` is exact (see the module docstring).

    Raises:
        ValueError: bad sizes or options (a negative ``shuffle_buffer``); what :func:`open_dataset` raises;
            a weight that is not positive and finite, a weight count other than the source count, a
            ``samples_per_epoch`` below 1 or missing with a list of sources.
        TypeError: ``batch_size``, ``seed``, ``samples_per_epoch`` (or ``shuffle_buffer``) is not an
            integer (a bool, string or float).
    """
    seed = _check_loader_arguments(source_or_dataset, batch_size, seed, open_dataset_options)
    given = {k: open_dataset_options.pop(k) for k in LOADER_OPTION_NAMES if k in open_dataset_options}
    extras = LoaderOptions(**given)
    decode_device = extras.decode_device
    mix = (samples_per_epoch, weights) if (isinstance(source_or_dataset, (list, tuple)) or samples_per_epoch
                                           is not None or weights is not None) else None
    if decode_device is not None and torch.device(decode_device).type != "cpu":  # the GPU decoding hook
        _check_gpu_decoding(source_or_dataset, open_dataset_options, mixed=mix is not None)
        from .decode.gpu_decode import wrap_gpu_decoding

        # a GpuDecodingLoader stands in for the ShardfeedLoader it wraps (or the CPU loader, without CUDA)
        return cast("ShardfeedLoader", wrap_gpu_decoding(functools.partial(
            make_loader, source_or_dataset, batch_size, num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, shuffle=shuffle, seed=seed,
            drop_last=drop_last, pad=pad, rank=rank, world_size=world_size), decode_device, seed=seed, rank=rank,
            **open_dataset_options, **{k: v for k, v in given.items() if k != "decode_device"}))
    ds = _open_or_adopt(source_or_dataset, open_dataset_options, shuffle=shuffle, seed=seed, pad=pad, rank=rank,
                        world_size=world_size, mix=mix)
    num_workers = default_num_workers() if num_workers is None else int(num_workers)
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(batch_size=int(batch_size), num_workers=num_workers, pin_memory=bool(pin_memory))
    kwargs.update(_worker_options(num_workers, persistent_workers, prefetch_factor, extras))
    kwargs.update(_collate_option(ds, extras))
    kwargs.update(timeout=extras.timeout, generator=extras.generator)
    if isinstance(ds, SourceBase):
        ds.configure_batching(batch_size, drop_last)
        if hasattr(ds, "next_epoch_ahead"):  # the next epoch reads in these same processes
            ds.next_epoch_ahead = num_workers == 0 or bool(persistent_workers)
    epoch_sampler = _epoch_sampler(ds, batch_size, shuffle=shuffle, seed=seed, pad=pad, drop_last=drop_last,
                                   rank=rank, world_size=world_size)
    if epoch_sampler is not None:
        kwargs["sampler"] = epoch_sampler
    kwargs["drop_last"] = bool(drop_last)
    ring = None
    if isinstance(ds, SourceBase) and extras.collate_fn is None:  # the loader's collate sends ring handles
        ring = batch_ring_for(ds.batch_rows, num_workers, prefetch_factor)
    loader = ShardfeedLoader(ds, epoch_sampler=epoch_sampler, batch_ring=ring,
                             pin_ring=bool(pin_memory) and torch.cuda.is_available(), **kwargs)
    log.debug("make_loader: %r batch_size=%d num_workers=%d pin_memory=%s -> %d batches per epoch",
              ds, batch_size, num_workers, pin_memory, len(loader))
    return loader


def _check_loader_arguments(source_or_dataset: Any, batch_size: Any, seed: Any, options: dict[str, Any]) -> int:
    """:func:`make_loader`'s checks before any I/O (a dataset already opened too): the keywords'
    spelling for a path or URL, ``batch_size`` a positive integer; returns the checked seed.

    Raises:
        TypeError: a misspelt keyword ("did you mean"), a ``batch_size`` or ``seed`` that is not an integer.
        ValueError: ``batch_size`` below 1.
    """
    listed = source_or_dataset if isinstance(source_or_dataset, (list, tuple)) else [source_or_dataset]
    if any(isinstance(s, (str, os.PathLike)) or is_url(s) for s in listed):
        check_keywords("make_loader", options,
                       open_dataset_keywords() | signature_keywords(make_loader) | LOADER_OPTION_NAMES)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(f"batch_size must be an integer, got {batch_size!r} ({type(batch_size).__name__})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    return check_seed(seed)


def _check_gpu_decoding(source_or_dataset: Any, options: dict[str, Any], *, mixed: bool) -> None:
    """Refuse what GPU decoding (``decode_device="cuda"``) cannot read (``ValueError``): a dataset
    already opened, extra fields, a mix of sources."""
    if mixed:
        raise ValueError("decode_device (GPU decoding) reads one source; mix sources with CPU decoding")
    if not (isinstance(source_or_dataset, (str, os.PathLike)) or is_url(source_or_dataset)):
        raise ValueError("decode_device needs a source path or URL (the loader opens it with decode=False)")
    if options.get("fields"):
        raise ValueError("decode_device (GPU decoding) yields images and labels only; read extra fields "
                         "(fields=...) with CPU decoding")


def _open_or_adopt(source_or_dataset: Any, open_dataset_options: dict[str, Any], *, shuffle: bool, seed: int,
                   pad: bool, rank: int | None, world_size: int | None, mix: tuple[Any, Any] | None = None) -> Any:
    """:func:`make_loader`'s dataset: a source (path/URL) opened with :func:`open_dataset`, or a
    dataset given (ours gets the loader's shuffle, seed, padding and rank), or with ``mix``
    (``(samples_per_epoch, weights)``) a :class:`~shardfeed.readers.sources.mixing.MixedSource` of the source(s).

    Raises:
        TypeError: ``open_dataset_options`` given with a dataset already opened.
    """
    if mix is not None:
        from .sources.mixing import open_mix

        return open_mix(source_or_dataset, mix[1], mix[0], shuffle=shuffle, seed=seed, pad=pad, rank=rank,
                        world_size=world_size, options=open_dataset_options)
    if isinstance(source_or_dataset, (str, os.PathLike)) or is_url(source_or_dataset):
        return open_dataset(source_or_dataset, shuffle=shuffle, seed=seed, pad=pad, rank=rank,
                            world_size=world_size, **open_dataset_options)
    if open_dataset_options:
        raise TypeError(f"options {sorted(open_dataset_options)} apply when opening a source; the dataset "
                        "was already opened (pass them to open_dataset)")
    ds = source_or_dataset
    if isinstance(ds, SourceBase):
        ds.shuffle, ds.seed, ds.pad = bool(shuffle), int(seed), bool(pad)
        ds.sample_decoder.seed = int(seed)
        ds.set_distributed(rank if rank is not None else None, world_size if world_size is not None else None)
    return ds


def _collate_option(ds: Any, extras: LoaderOptions) -> dict[str, Any]:
    """The ``DataLoader``'s ``collate_fn``: the user's, else ours for a shardfeed source (decoded or
    raw), else none (the ``DataLoader``'s default)."""
    if extras.collate_fn is not None:
        return {"collate_fn": extras.collate_fn}
    if not isinstance(ds, SourceBase):
        return {}
    if not getattr(ds, "decode", True):
        return {"collate_fn": collate_raw}
    return {"collate_fn": functools.partial(collate_decoded, image_size=ds.image_size,
                                            num_fields=len(getattr(ds, "fields", ()) or ()))}


def _worker_options(num_workers: int, persistent_workers: bool, prefetch_factor: int | None,
                    extras: LoaderOptions) -> dict[str, Any]:
    """The ``DataLoader`` arguments about workers, with ``extras.multiprocessing_context`` and
    ``extras.worker_init_fn`` (ours calls the user's after its own); none without workers."""
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["persistent_workers"] = bool(persistent_workers)
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = int(prefetch_factor)
        if extras.multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = extras.multiprocessing_context
        kwargs["worker_init_fn"] = functools.partial(
            worker_init, user_fn=extras.worker_init_fn,
            forked_cv2_threads=_cv2_threads_if_forking(kwargs.get("multiprocessing_context")))
    return kwargs


def _epoch_sampler(ds: Any, batch_size: int, *, shuffle: bool, seed: int, pad: bool, drop_last: bool,
                   rank: int | None, world_size: int | None) -> EpochSampler | None:
    """The :class:`EpochSampler` of a map-style dataset (this rank's share of each epoch's
    permutation); None for an iterable one (it splits the epoch itself)."""
    if isinstance(ds, torch.utils.data.IterableDataset):
        return None
    r, w = (ds.rank, ds.world_size) if isinstance(ds, SourceBase) else resolve_rank(rank, world_size)
    n = ds.num_samples if isinstance(ds, SourceBase) else len(ds)
    return EpochSampler(n, shuffle=shuffle, seed=seed, rank=r, world_size=w, pad=pad,
                        batch_size=batch_size, drop_last=drop_last, locate=getattr(ds, "locate_items", None))
