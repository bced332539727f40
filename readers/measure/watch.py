"""Watch the user's own training loop: is it data-bound, and why?

``for batch in watch(loader): step(batch)`` yields exactly what ``loader`` yields (any iterable of
batches: a plain ``torch.utils.data.DataLoader`` over the user's own ``Dataset``, a shardfeed
loader, a generator). Each pass over the :class:`Watch` is one epoch. Every other attribute is the
loader's (``w.sampler.set_epoch(e)``, ``w.state_dict()``, ``w.batch_size``). Per batch it times

* ``t_wait_s``: blocked in the loader, from the request (``next()``) to the batch;
* ``t_step_s``: the step, from the yield to the next request.

The data stall share is ``Σ t_wait / Σ (t_wait + t_step)``. On CUDA (``device`` a CUDA device, or
``None`` with CUDA initialised in this process) each request first calls
``torch.cuda.synchronize(device)``, so the work the step queued on the GPU is part of ``t_step``
and ``t_wait`` is the time the GPU sits idle waiting for the next batch (without it, an
asynchronous step returns at once and its GPU time would be counted as wait). Its cost: the
host no longer queues the next step while the GPU finishes the last one (``device="cpu"`` times
without synchronising). The CPU path (no synchronisation) is the fallback the tests exercise.
Trainers that iterate the loader themselves use the hook mode instead (:meth:`Watch.start`,
:meth:`Watch.batch_started`, :meth:`Watch.batch_ended`; :mod:`shardfeed.readers.integrations`).
The first batch of the first epoch (worker start-up) is reported apart (``t_first_batch_s``) and
left out of the stall share; the first batch of every later epoch counts (re-starting workers is
a cost ``persistent_workers`` removes).

A background thread (``sample_interval_s``; :class:`~shardfeed.readers.measure.sampling.ProcessSampler`,
the sampler ``bench`` and ``verify`` use too) samples with psutil what explains a stall: CPU time
and the scheduler state of the main process and of each ``DataLoader`` worker process (the
iterator's worker PIDs, else the main process's children), bytes read (``read_chars``: every read,
FUSE and network mounts included; ``read_bytes``: from block devices), the machine's I/O-wait
share, memory and swap, and on CUDA the GPU utilisation from NVML (``nvidia-ml-py``, the ``gpu``
extra; optional). A worker's ``cpu_busy_share`` is its CPU seconds over the seconds it was
watched; its ``cpu_demand_share`` is the share of samples in which it was running or runnable
(state ``R``): a worker that wants the CPU but shares the cores with others has a high demand and
a lower busy share, one that waits on storage has both low.

:meth:`Watch.report` returns a :class:`WatchReport`; its ``diagnosis`` is one of
:data:`DIAGNOSIS_KINDS` with ordered advice (see :func:`diagnose`).

This module times the loop. The sampling is in :mod:`.sampling`, the report and its figures in
:mod:`.watch_report`, the diagnosis rules in :mod:`.watch_rules`, the hook mode for trainers in
:mod:`.watch_hooks`, and the probes (mounts, stored images, torch's ``DataLoader`` fields) in
:mod:`.probes`.

Overhead: see ``python scripts/bench_watch.py`` (a few µs per batch, a few ms of CPU per second for
the sampler with 2 workers: well under 1 % of a 20 ms step).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable, Iterator

from .probes import batch_ready, data_facts, data_root, held_out_of_order, loader_knobs, loader_worker_pids
from .sampling import DEFAULT_SAMPLE_INTERVAL_S, ProcessSampler
from .watch_hooks import HookMode, count_tensors
from .watch_report import (MAX_PER_BATCH, WatchReport, batch_length, per_batch_figures, reports_to_json,
                           sampled_figures, timing_stats)
from .watch_rules import (BATCH_READY_HANDOFF, DIAGNOSIS_KINDS, STALL_COMPUTE_BOUND, WORKER_CPU_SATURATED, diagnose,
                          predict_batch_interval)

__all__ = ["watch", "Watch", "WatchReport", "diagnose", "DIAGNOSIS_KINDS", "STALL_COMPUTE_BOUND",
           "WORKER_CPU_SATURATED", "BATCH_READY_HANDOFF", "DEFAULT_SAMPLE_INTERVAL_S", "data_facts", "batch_length",
           "batch_ready", "count_tensors", "reports_to_json", "predict_batch_interval", "MAX_PER_BATCH"]

logger = logging.getLogger("shardfeed.watch")


def _label_of(loader: Any) -> str:
    ds = getattr(loader, "dataset", None)
    name = type(loader).__name__
    return f"{name}({type(ds).__name__})" if ds is not None else name


class _Epoch:
    """One pass over the loader: times each ``next()`` and the step before it."""

    def __init__(self, watch: "Watch", it: Iterator):
        self._watch = watch
        self._it = it
        self._yielded_at: float | None = None

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def __getattr__(self, name):  # the wrapped iterator's attributes (``_workers``, ...)
        return getattr(self.__dict__["_it"], name)

    def __next__(self):
        w = self._watch
        if w._cuda_sync:
            import torch

            torch.cuda.synchronize(w._device)
        t0 = time.perf_counter()
        if self._yielded_at is not None and not w._fetch_hooked:
            w._record_step(t0 - self._yielded_at)
        self._yielded_at = None
        ready = batch_ready(self._it)
        held = held_out_of_order(self._it) if ready else None
        try:
            batch = next(self._it)
        except StopIteration:
            w._end_epoch(self)
            raise
        t1 = time.perf_counter()
        if held is not None and (held_out_of_order(self._it) or 0) > held:
            ready = False  # what had come back was a later batch, held while the due one was awaited
        w._record_wait(t1 - t0, batch, ready)
        self._yielded_at = time.perf_counter()
        return batch


class Watch(HookMode):
    """Wraps an iterable of batches and times the loop over it (see the module docstring).

    Args:
        loader: any iterable of batches (a ``DataLoader``, a shardfeed loader, a list).
        device: the device the step runs on: ``None`` (CUDA synchronisation when CUDA is
            initialised in this process at a request, else none), ``"cpu"``, ``"cuda"``,
            ``"cuda:N"`` or a ``torch.device``.
        sample_interval_s: seconds between background samples (psutil; > 0).
        sample_gpu: sample GPU utilisation from NVML on CUDA (needs ``nvidia-ml-py``).
        status_every_s: log one status line (logger ``shardfeed.watch``, INFO) at most every this
            many seconds; None: off.
        status_bar: a ``tqdm`` bar: with ``status_every_s``, the stall so far goes to its postfix
            (``set_postfix_str``) instead of the log.
        warmup: batches at the very start left out of the stall share (default 1: the first
            batch waits for the workers to start).
        label: a name for the report (default: the loader's class and dataset class).

    Raises:
        ValueError: a non-positive interval or a negative warmup.
    """

    def __init__(self, loader: Iterable, *, device: Any = None, sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
                 sample_gpu: bool = True, status_every_s: float | None = None, warmup: int = 1,
                 label: str | None = None, status_bar: Any = None):
        if not sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        if warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {warmup}")
        self.loader = loader
        self.label = label or _label_of(loader)
        self._device_arg = device
        self._device = None
        self._cuda_sync = False
        self._sample_interval_s = sample_interval_s
        self._sample_gpu = sample_gpu
        self._status_every_s = status_every_s
        self._status_bar = status_bar
        self._last_status = time.perf_counter()
        self._warmup_left = warmup
        self.waits: list[float] = []
        self.ready: list[bool | None] = []  # per timed wait: a batch had arrived from a worker when asked for
        self.batch_tensors: int | None = None  # tensors in a batch from the workers (the first one timed)
        self.steps: list[float] = []
        self.others: list[float] = []  # hook mode with the fetches timed: between steps, not fetching
        self.sizes: list[int | None] = []
        self.first_batch_s: float | None = None
        self.num_samples: int | None = 0
        self.epochs = 0
        self._pending_step = False
        self._sampler: ProcessSampler | None = None
        self._current: _Epoch | None = None
        self._warnings: list[str] = []
        self._closed_snapshot: dict | None = None
        self._hook_mark: float | None = None
        self._fetch_hooked = False  # hook mode, the trainer's fetches timed (start(time_fetches=True))
        self._fetch_in_window = 0.0  # seconds fetching since the last step began or ended
        self._steps_warmup_left = warmup
        self._after_step = False
        self._last_len: int | None = None
        self._facts: dict | None = None

    # -- device
    def _resolve_device(self) -> None:
        dev = self._device_arg
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            return
        if dev is None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                dev = torch.device("cuda", torch.cuda.current_device())
            else:
                return
        dev = torch.device(dev)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {dev}: CUDA is not available")
            self._device = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
            self._cuda_sync = True
        else:
            self._device = dev

    def _worker_pids(self):
        cur = self._current
        if cur is None:
            return None if self._hook_mark is not None else []
        return loader_worker_pids(cur._it, self.loader)

    def _start_sampling(self) -> None:
        if self._sampler is not None:
            return
        try:
            import psutil  # noqa: F401
        except ImportError:
            self._warnings.append("psutil is not installed: no CPU, I/O or memory figures (pip install psutil)")
            return
        gpu_index = self._device.index if (self._cuda_sync and self._sample_gpu) else None
        self._sampler = ProcessSampler(worker_pids=self._worker_pids, interval_s=self._sample_interval_s,
                                       gpu_index=gpu_index)
        self._sampler.start()
        if self._sampler.error:  # NVML missing or unusable: the rest is still sampled
            self._warnings.append(self._sampler.error)

    # -- iteration
    def __iter__(self) -> _Epoch:
        if self.epochs == 0:
            self._resolve_device()
            # what the loader reads, learnt here, before its workers start: at exit (a report
            # written from atexit) a first import of an extension module can reset the
            # interpreter's record of an unhandled Ctrl-C, and the script would exit 1, not 130
            self._data_facts()
            self._start_sampling()
        if not self._fetch_hooked:  # the trainer's epoch hooks count its passes
            self._drop_unfinished()
            self.epochs += 1
        self._current = _Epoch(self, iter(self.loader))
        return self._current

    def _drop_unfinished(self) -> None:
        """A pass left early (``break``): its last batch's step never ended; leave that batch out."""
        if self._pending_step and len(self.waits) > len(self.steps):
            self.waits.pop()
            self.ready.pop()
            self.sizes.pop()
            if self.num_samples is not None:
                self.num_samples -= self._last_len or 0
            self._pending_step = False

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        """Every attribute the watch has not of its own is the loader's (``sampler``, ``batch_sampler``,
        ``dataset``, ``batch_size``, ``set_epoch``, ``state_dict``, ``load_state_dict``, ...), so a loop
        written for the loader runs unchanged on the watch."""
        loader = self.__dict__.get("loader")
        if loader is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(loader, name)

    def _record_wait(self, dt: float, batch: Any, ready: bool | None = None, count: bool = True) -> None:
        if self._fetch_hooked:
            self._fetch_in_window += dt
        if self._warmup_left > 0:
            self._warmup_left -= 1
            if self.first_batch_s is None:
                self.first_batch_s = dt
            self._pending_step = False
            return
        self.waits.append(dt)
        self.ready.append(ready)
        if self.batch_tensors is None and ready is not None and batch is not None:
            self.batch_tensors = count_tensors(batch)
        self._pending_step = True
        if count:
            self._count(batch)
        if self._status_every_s is not None:
            now = time.perf_counter()
            if now - self._last_status >= self._status_every_s:
                self._last_status = now
                if self._status_bar is not None:
                    self._status_bar.set_postfix_str(f"data stall {self._stall_so_far():.0%}", refresh=False)
                else:
                    logger.info("%s", self.status_line())

    def _count(self, batch: Any) -> None:
        """Count ``batch``'s samples (:func:`batch_length`: the one rule for every mode)."""
        n = batch_length(batch)
        self.sizes.append(n)
        if self.num_samples is not None:
            self._last_len = n
            self.num_samples = None if n is None else self.num_samples + n

    def _stall_so_far(self) -> float:
        tw, ts, to = sum(self.waits), sum(self.steps), sum(self.others)
        return tw / (tw + ts + to) if tw + ts + to > 0 else 0.0

    def _record_step(self, dt: float) -> None:
        if self._pending_step:
            self.steps.append(dt)
            self._pending_step = False

    def _end_epoch(self, epoch: _Epoch) -> None:
        if self._current is epoch:
            self._current = None

    def status_line(self) -> str:
        """One line: batches, data stall so far, mean wait and step."""
        tw, ts = sum(self.waits), sum(self.steps)
        stall = self._stall_so_far()
        n = max(len(self.waits), 1)
        return (f"{self.label}: {len(self.waits)} batches, data stall {stall:.0%}, wait {tw / n * 1e3:.1f} ms, "
                f"step {ts / max(len(self.steps), 1) * 1e3:.1f} ms")

    def close(self) -> None:
        """Stop the background sampling (the figures so far stay in :meth:`report`)."""
        if self._sampler is not None:
            self._closed_snapshot = self._sampler.snapshot()
            self._sampler.stop()
            self._sampler = None

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _data_facts(self) -> dict:
        """:func:`data_facts` of the loader, learnt once (a few image headers are read)."""
        if self._facts is None:
            try:
                self._facts = data_facts(self.loader)
            except Exception:  # noqa: BLE001 - facts only refine the advice; a dataset that resists tells none
                self._facts = {}
        return self._facts

    def report(self) -> WatchReport:
        """The :class:`WatchReport` so far (callable during the loop and after it)."""
        waits, steps, others = list(self.waits), list(self.steps), list(self.others)
        if len(steps) < len(waits) and not self._fetch_hooked:  # the last batch's step has not ended
            waits_for_share = waits[:len(steps)]
        else:
            waits_for_share = waits
        tw, ts, to = sum(waits_for_share), sum(steps), sum(others)
        wall = tw + ts + to
        stall = tw / wall if wall > 0 else 0.0
        batches = len(waits) if self._fetch_hooked else len(steps)
        snap = self._sampler.snapshot() if self._sampler is not None else self._closed_snapshot
        warnings = list(self._warnings)
        knobs = loader_knobs(self.loader)
        nw = knobs.get("num_workers")
        workers = main = io = memory = system = None
        gpu_util = None
        if snap is not None:
            fig = sampled_figures(snap, nw, self.ready, waits_for_share, self.batch_tensors)
            workers, main, io, memory, system = (fig[k] for k in ("workers", "main", "io", "memory", "system"))
            nw, gpu_util = fig["num_workers"], fig["gpu_util"]
            warnings += fig["warnings"]
        cpu_count = (system or {}).get("cpu_count") or os.cpu_count() or 1
        num_samples = self.num_samples
        if num_samples is not None and len(waits) > len(steps) and not self._fetch_hooked:  # its step has not ended
            num_samples -= self._last_len or 0
        samples_per_s = (num_samples / wall) if (num_samples is not None and wall > 0 and waits) else None
        t_wait, t_step = timing_stats(waits), timing_stats(steps)
        dev = str(self._device) if self._device is not None else "cpu"
        diagnosis = diagnose(stall_share=stall, batches=batches, num_workers=nw, workers=workers, main=main,
                             loader=knobs, cpu_count=cpu_count, cuda=self._cuda_sync, epochs=self.epochs,
                             t_wait_s=t_wait, io=io, data=data_root(self.loader), t_step_s=t_step,
                             facts=self._data_facts(), system=system)
        if batches < 10:
            warnings.append(f"only {batches} batches timed: the figures are rough")
        return WatchReport(label=self.label, batches=batches, epochs=self.epochs, t_wait_s=t_wait, t_step_s=t_step,
                           t_first_batch_s=self.first_batch_s, stall_share=stall, samples_per_s=samples_per_s,
                           num_samples=num_samples if waits else None, device=dev,
                           timing="cuda_synchronize" if self._cuda_sync else "perf_counter", loader=knobs,
                           workers=workers, main=main, io=io, memory=memory, system=system, gpu_util=gpu_util,
                           diagnosis=diagnosis, warnings=warnings,
                           per_batch=per_batch_figures(waits, steps, self.sizes),
                           t_other_s=timing_stats(others), other_share=to / wall if wall > 0 else 0.0)


def watch(loader: Iterable, *, device: Any = None, sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
          sample_gpu: bool = True, status_every_s: float | None = None, warmup: int = 1,
          label: str | None = None, status_bar: Any = None) -> Watch:
    """Wrap ``loader`` so the loop over it is timed: ``for batch in watch(loader): step(batch)``.

    Yields exactly what ``loader`` yields; each pass is one epoch. Keep the returned object to
    ask for ``w.report()`` (a :class:`WatchReport`; ``summary()``, ``to_json()``) during or after
    the loop, and ``w.close()`` (or ``with watch(loader) as w:``) to stop the background sampler.
    The arguments are those of :class:`Watch`.

    Example::

        w = watch(loader)
        for epoch in range(3):
            for images, labels in w:
                train_step(images.cuda(non_blocking=True),
                           labels.cuda(non_blocking=True))
        print(w.report().summary())
    """
    return Watch(loader, device=device, sample_interval_s=sample_interval_s, sample_gpu=sample_gpu,
                 status_every_s=status_every_s, warmup=warmup, label=label, status_bar=status_bar)
