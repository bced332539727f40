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

A background thread (``sample_interval_s``) samples with psutil what explains a stall: CPU time
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

Overhead: see ``python scripts/bench_watch.py`` (a few µs per batch, a few ms of CPU per second for
the sampler with 2 workers: well under 1 % of a 20 ms step).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import threading
import time
from typing import Any, Iterable, Iterator

from ..background import start_thread
from ..redact import shown_source
from .report import fmt_bytes, percentile
from .watch_hooks import HookMode, count_tensors
from .watch_rules import (BATCH_READY_HANDOFF, DIAGNOSIS_KINDS, STALL_COMPUTE_BOUND, WORKER_CPU_SATURATED,
                          pct, diagnose, predict_batch_interval)

__all__ = ["watch", "Watch", "WatchReport", "diagnose", "DIAGNOSIS_KINDS", "STALL_COMPUTE_BOUND",
           "WORKER_CPU_SATURATED", "BATCH_READY_HANDOFF", "DEFAULT_SAMPLE_INTERVAL_S", "data_facts", "batch_length",
           "batch_ready", "count_tensors", "reports_to_json", "predict_batch_interval", "MAX_PER_BATCH"]

logger = logging.getLogger("shardfeed.watch")

#: Seconds between two background samples of CPU time and scheduler state.
DEFAULT_SAMPLE_INTERVAL_S = 0.05
#: Memory, context switches and I/O counters are read every this many samples; the list of child
#: processes (when the workers are not known) and swap every ``_SLOW_EVERY``.
_FULL_EVERY = 10
_SLOW_EVERY = 20
#: Worker processes followed at most over a watch (non-persistent workers are new processes every epoch).
_MAX_TRACKED_PROCESSES = 1024


def batch_length(batch: Any) -> int | None:
    """Samples in ``batch``: the first dimension of a tensor/array, or of the first item of a
    tuple/list or the first value of a dict (the usual ``(images, labels)`` or
    ``{"pixel_values": ..., "labels": ...}``); the length of a list of per-sample items (more than
    :data:`_MIN_SAMPLE_LIST` tensors of one shape, or tuples/dicts: a ``collate_fn`` that does not
    stack); None when it has no length."""
    for _ in range(4):
        if isinstance(batch, dict):
            if not batch:
                return None
            batch = next(iter(batch.values()))
            continue
        if isinstance(batch, (tuple, list)):
            if not batch:
                return None
            if _per_sample_list(batch):
                return len(batch)
            first = batch[0]
            if hasattr(first, "shape") or isinstance(first, (tuple, list, dict)):
                batch = first
                continue
            return len(batch)
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else None
        return None
    return None


#: A list of more than this many same-shaped tensors (or of tuples/dicts) is a list of samples,
#: not the fields of a batch (``(images, labels)``, or a few stacked fields of one shape).
_MIN_SAMPLE_LIST = 4


def _per_sample_list(seq: Any) -> bool:
    """Whether ``seq`` holds one item per sample (see :func:`batch_length`)."""
    if len(seq) <= _MIN_SAMPLE_LIST:
        return False
    first = seq[0]
    if isinstance(first, (tuple, list, dict)):
        kind = type(first)
        return all(type(x) is kind for x in seq)
    shape = getattr(first, "shape", None)
    return shape is not None and all(getattr(x, "shape", None) == shape for x in seq)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "total": 0.0}
    return {"mean": float(statistics.fmean(values)), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "total": float(sum(values))}


# ---------------------------------------------------------------------------------------------
# background sampling


def _runqueue_wait_s(pid: int) -> float | None:
    """Seconds ``pid`` has been runnable but waiting for a core (``/proc/PID/schedstat``); None off Linux."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read(256).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class _ProcTrack:
    """What the sampler saw of one process: first/last CPU time and I/O, state counts."""

    __slots__ = ("proc", "t0", "t1", "cpu0", "cpu1", "rchar0", "rchar1", "rbytes0", "rbytes1", "states",
                 "running", "vol0", "vol1", "rss", "runq0", "runq1", "disk_sleep")

    def __init__(self, proc, now: float):
        self.proc = proc
        self.t0 = self.t1 = now
        self.cpu0 = self.cpu1 = None
        self.rchar0 = self.rchar1 = self.rbytes0 = self.rbytes1 = None
        self.vol0 = self.vol1 = self.runq0 = self.runq1 = None
        self.states = self.disk_sleep = 0
        self.running = 0
        self.rss = 0

    def sample(self, now: float, full: bool = True) -> bool:
        """One sample: CPU time and state (one read of ``/proc/PID/stat``); with ``full`` also
        memory, context switches and I/O counters. The first sample of a process is always full."""
        import psutil

        full = full or self.cpu0 is None
        try:
            with self.proc.oneshot():
                ct = self.proc.cpu_times()
                status = self.proc.status()
                if full:
                    rss = self.proc.memory_info().rss
                    vol = self.proc.num_ctx_switches().voluntary
                    try:
                        ioc = self.proc.io_counters()
                    except (psutil.AccessDenied, AttributeError):
                        ioc = None
        except (psutil.Error, OSError):
            return False
        cpu = ct.user + ct.system
        runq = _runqueue_wait_s(self.proc.pid) if full else None
        if self.cpu0 is None:
            self.runq0 = runq
            self.cpu0, self.t0 = cpu, now
            self.vol0 = vol
            if ioc is not None:
                self.rchar0, self.rbytes0 = ioc.read_chars, ioc.read_bytes
        self.cpu1, self.t1 = cpu, now
        if full:
            self.vol1, self.rss, self.runq1 = vol, rss, runq if runq is not None else self.runq1
            if ioc is not None:
                self.rchar1, self.rbytes1 = ioc.read_chars, ioc.read_bytes
        self.states += 1
        self.running += status == psutil.STATUS_RUNNING
        self.disk_sleep += status == psutil.STATUS_DISK_SLEEP
        return True

    def figures(self) -> dict:
        span = max(self.t1 - self.t0, 0.0)
        cpu = (self.cpu1 - self.cpu0) if self.cpu0 is not None else 0.0
        return {"pid": self.proc.pid, "watched_s": span, "cpu_s": cpu,
                "cpu_busy_share": min(1.0, cpu / span) if span > 0 else None,
                "cpu_demand_share": self.running / self.states if self.states else None,
                "runqueue_share": (min(1.0, (self.runq1 - self.runq0) / span) if span > 0 and None not in
                                   (self.runq0, self.runq1) else None),
                "disk_sleep_share": self.disk_sleep / self.states if self.states else None,
                "read_chars": (self.rchar1 - self.rchar0) if self.rchar0 is not None else None,
                "read_bytes": (self.rbytes1 - self.rbytes0) if self.rbytes0 is not None else None,
                "voluntary_ctx_switches": (self.vol1 - self.vol0) if self.vol0 is not None else None,
                "rss_bytes": self.rss}


class _Sampler:
    """The background thread: main process, loader workers, machine, GPU (see the module docstring)."""

    def __init__(self, interval_s: float, worker_pids, gpu_index: int | None):
        import psutil

        self.interval_s = interval_s
        self.worker_pids = worker_pids
        self.main = _ProcTrack(psutil.Process(), time.perf_counter())
        self.workers: dict[int, _ProcTrack] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.error: str | None = None
        self.cpu_times0 = psutil.cpu_times()
        self.swap0 = psutil.swap_memory().used
        self.vm_min_available = psutil.virtual_memory().available
        self.swap_max = self.swap0
        self.gpu = None
        if gpu_index is not None:
            from .sampling import GpuSampler

            self.gpu = GpuSampler(gpu_index)
            if not self.gpu.start():
                self.error = self.gpu.error
                self.gpu = None
        self._ticks = 0
        self._children: list[int] | None = None
        self.children_mode = False  # the workers are the main process's children, whichever they are
        self._thread = start_thread(self._loop, name="shardfeed-watch", stop=self._stop.set)

    def _tick(self) -> None:
        import psutil

        now = time.perf_counter()
        self._ticks += 1
        full = self._ticks % _FULL_EVERY == 1
        slow = self._ticks % _SLOW_EVERY == 1
        self.main.sample(now, full)
        pids = self.worker_pids()
        if pids is None:  # the workers are not known: the main process's children, looked up now and then
            if slow or (not self._children and self._ticks <= _SLOW_EVERY):  # each tick in the first second
                try:
                    self._children = [c.pid for c in self.main.proc.children()]
                except psutil.Error:
                    self._children = []
            pids, self.children_mode = self._children, True
        with self._lock:
            for pid in pids:
                track = self.workers.get(pid)
                if track is None:
                    if len(self.workers) >= _MAX_TRACKED_PROCESSES:
                        continue
                    try:
                        track = self.workers[pid] = _ProcTrack(psutil.Process(pid), now)
                    except psutil.Error:
                        continue
                track.sample(now, full)
        if full:
            self.vm_min_available = min(self.vm_min_available, psutil.virtual_memory().available)
        if slow:
            self.swap_max = max(self.swap_max, psutil.swap_memory().used)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # pragma: no cover - never let sampling break the loop
                self.error = f"sampling failed: {exc}"
                return
            self._stop.wait(self.interval_s)

    def snapshot(self) -> dict:
        """The figures so far (the thread keeps running)."""
        import psutil

        with self._lock:
            workers = [t.figures() for t in self.workers.values()]
        ct = psutil.cpu_times()
        d = {k: getattr(ct, k, 0.0) - getattr(self.cpu_times0, k, 0.0) for k in ct._fields}
        total = sum(d.values()) - d.get("guest", 0.0) - d.get("guest_nice", 0.0)
        system = {"cpu_count": psutil.cpu_count() or 1,
                  "cpu_busy_share": (1 - (d.get("idle", 0) + d.get("iowait", 0)) / total) if total > 0 else None,
                  "iowait_share": d.get("iowait", 0.0) / total if total > 0 else None,
                  "busy_s": total - d.get("idle", 0.0) - d.get("iowait", 0.0),
                  "memory_available_min_bytes": self.vm_min_available,
                  "memory_total_bytes": psutil.virtual_memory().total,
                  "swap_growth_bytes": max(0, self.swap_max - self.swap0)}
        gpu = self.gpu.stats() if self.gpu is not None else None
        if self.children_mode:  # a child that used no CPU while watched is no worker of this loader (another
            workers = [w for w in workers if w["cpu_s"] > 0] or workers  # loader's idle workers, a leftover)
        return {"main": self.main.figures(), "workers": workers, "system": system, "gpu": gpu}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self.gpu is not None:
            self.gpu.stop()
            self.gpu = None


# ---------------------------------------------------------------------------------------------
# the report


@dataclasses.dataclass
class WatchReport:
    """What :class:`Watch` saw of a training loop.

    Attributes:
        label: a name (the loader's class and dataset).
        batches: batches timed (the first of the first epoch excluded).
        epochs: passes started over the loader.
        t_wait_s, t_step_s: per-batch ``{"mean", "p50", "p95", "total"}``, seconds.
        t_first_batch_s: the wait for the very first batch (worker start-up), s; None before it.
        stall_share: ``Σ t_wait / Σ (t_wait + t_step + t_other)`` in [0, 1] (0 with no batch).
        samples_per_s: samples over ``Σ (t_wait + t_step + t_other)`` when batches have a length, else None.
        num_samples: samples in the timed batches (None when batches have no length).
        device: ``"cpu"`` or ``"cuda:N"``; ``timing``: ``"cuda_synchronize"`` or ``"perf_counter"``.
        loader: the loader's knobs as found (``num_workers``, ``pin_memory``, ``prefetch_factor``,
            ``persistent_workers``, ``batch_size``; None where the iterable has none).
        workers: ``{"num", "cpu_busy_share", "cpu_demand_share", "batch_ready_share",
            "ready_wait_share", "batch_tensors", "per_worker"}``: the mean over the watched worker
            processes; the share of timed requests at which the batch due had already come back from
            a worker, and the share of the waiting time spent on those requests (both None when not
            known: no multi-process ``DataLoader``); the tensors in one batch. None without workers
            or psutil.
        main: the main process: ``cpu_busy_share``, ``cpu_demand_share``, ``cpu_s``.
        io: bytes read by main and workers during the run (``read_chars``, ``read_bytes``) and
            per second; ``iowait_share`` of the machine.
        memory: ``memory_available_min_bytes``, ``swap_growth_bytes``.
        gpu_util: mean GPU utilisation from NVML in [0, 1]; None off CUDA or without NVML.
        diagnosis: ``{"kind", "text", "advice"}`` (see :func:`diagnose`).
        warnings: what limits the measurement.
        per_batch: the timed batches in order, for the figure: ``t_wait_s`` and ``t_step_s``
            (seconds) and ``num_samples`` (None when batches have no length), at most
            :data:`MAX_PER_BATCH` of them (``truncated`` says whether more were timed).
        t_other_s: ``{"mean", "p50", "p95", "total"}`` of the times between two steps that were not
            a fetch from the loader (a trainer's validation, evaluation, checkpointing, logging),
            seconds; all 0 where the loop itself is timed (the step is everything between two requests).
        other_share: ``Σ t_other / Σ (t_wait + t_step + t_other)`` in [0, 1].

    The stall share is ``Σ t_wait / Σ (t_wait + t_step + t_other)``; ``batches`` counts the fetches
    timed (each batch of a gradient-accumulation step) where a trainer's fetches are timed.
    """

    label: str
    batches: int
    epochs: int
    t_wait_s: dict
    t_step_s: dict
    t_first_batch_s: float | None
    stall_share: float
    samples_per_s: float | None
    num_samples: int | None
    device: str
    timing: str
    loader: dict
    workers: dict | None
    main: dict | None
    io: dict | None
    memory: dict | None
    system: dict | None
    gpu_util: float | None
    diagnosis: dict
    warnings: list = dataclasses.field(default_factory=list)
    per_batch: dict = dataclasses.field(default_factory=dict)
    t_other_s: dict = dataclasses.field(default_factory=lambda: _stats([]))
    other_share: float = 0.0

    def to_json(self) -> dict:
        """Every figure as a JSON-able dict."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """A few human-readable lines: the stall, the times, the workers and the advice."""
        w, s = self.t_wait_s, self.t_step_s
        rate = f", {self.samples_per_s:.1f} samples/s" if self.samples_per_s else ""
        first = (f" (after the first, worker start-up: {self.t_first_batch_s:.2f} s, reported apart)"
                 if self.t_first_batch_s is not None else "")
        lines = [f"{self.label}: {self.batches} batches timed over {self.epochs} epoch(s){first}{rate}",
                 f"  data stall {self.stall_share:.0%}: wait mean {w['mean'] * 1e3:.1f} ms (p95 {w['p95'] * 1e3:.1f}),"
                 f" step mean {s['mean'] * 1e3:.1f} ms (p95 {s['p95'] * 1e3:.1f}) [{self.timing}]"]
        if self.t_other_s.get("total"):
            lines.append(f"  other {self.other_share:.0%}: between steps, not waiting for data (validation, "
                         f"evaluation, checkpointing, logging), {self.t_other_s['total']:.1f} s in all")
        if self.workers:
            busy, demand = self.workers.get("cpu_busy_share"), self.workers.get("cpu_demand_share")
            ready = self.workers.get("batch_ready_share")
            ready_txt = f", the batch due ready at {ready:.0%} of the requests" if ready is not None else ""
            lines.append(f"  workers: {self.workers['num']}, CPU busy {pct(busy)}, running or runnable {pct(demand)}"
                         f"{ready_txt}")
        if self.io:
            rate = fmt_bytes(self.io.get('read_chars_per_s'))
            disk = (f"; from block devices {fmt_bytes(self.io.get('read_bytes'))}"
                    if self.io.get("read_bytes") is not None else "")
            lines.append(f"  read {fmt_bytes(self.io.get('read_chars'))} ({rate}/s, page-cache hits included{disk}), "
                         f"I/O wait {pct(self.io.get('iowait_share'))} of the machine")
        if self.gpu_util is not None:
            lines.append(f"  GPU utilisation {self.gpu_util:.0%}")
        d = self.diagnosis
        lines.append(f"  diagnosis: {'' if d['kind'] == 'borderline' else d['kind'] + ': '}{d['text']}")
        lines += [f"  {'do first' if i == 0 else 'also worth trying'}: {a}" for i, a in enumerate(d["advice"])]
        lines += [f"  warning: {x}" for x in self.warnings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()



# ---------------------------------------------------------------------------------------------
# the watch


def _loader_knobs(loader: Any) -> dict:
    out = {}
    for key in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"):
        value = getattr(loader, key, None)
        out[key] = value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
    return out


def _data_root(loader: Any) -> str | None:
    ds = getattr(loader, "dataset", None)
    root = getattr(ds, "root", None)
    if not isinstance(root, (str, os.PathLike)):  # a packed dataset of ours: its location
        from ..source_base import SourceBase

        location = getattr(ds, "location", None) if isinstance(ds, SourceBase) else None
        root = str(location) if location is not None else None
    return shown_source(root) if isinstance(root, (str, os.PathLike)) else None


#: Images whose header :func:`data_facts` reads to learn the stored sizes (a few, cheaply).
SIZE_PROBE_IMAGES = 4
#: The most bytes read for one probed image (larger ones are left out).
SIZE_PROBE_MAX_BYTES = 32 * 1024 * 1024
#: File system types taken as slow (network or user-space) storage for the ``stage`` advice.
SLOW_FS_TYPES = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "sshfs", "9p", "ceph", "lustre", "gpfs", "glusterfs",
                 "davfs", "s3fs", "fuse")


def _image_side(data: bytes) -> int | None:
    """The shorter side, px, from an encoded image's header (None when it does not parse)."""
    import io

    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
    except Exception:  # noqa: BLE001 - a sample that does not parse tells no size
        return None
    return min(int(w), int(h)) if w > 0 and h > 0 else None


def _file_side(path: str | os.PathLike) -> int | None:
    try:
        if os.path.getsize(path) > SIZE_PROBE_MAX_BYTES:
            return None
        with open(path, "rb") as f:
            return _image_side(f.read(SIZE_PROBE_MAX_BYTES))
    except (OSError, TypeError, ValueError):
        return None


def _probe_sides(ds: Any, fmt: str | None, remote: bool | None) -> list[int]:
    """Shorter sides of up to :data:`SIZE_PROBE_IMAGES` stored images of ``ds`` (local files only)."""
    n = SIZE_PROBE_IMAGES
    sides: list[int] = []
    if remote:
        return sides
    from ..registry import describe

    spec = describe(fmt) if fmt is not None and fmt != "folder" else None
    if spec is not None and spec.tar_shards:
        import tarfile

        from ..format import IMAGE_EXTENSIONS

        shards = getattr(getattr(ds, "manifest", None), "shards", None) or []
        location = getattr(ds, "location", None)
        if not shards or location is None:
            return sides
        try:
            with tarfile.open(location.where(shards[0].name), "r:") as tar:
                for _ in range(16 * n):
                    member = tar.next()
                    if member is None or len(sides) >= n:
                        break
                    ext = member.name.rsplit(".", 1)[-1].lower()
                    if member.isfile() and ext in IMAGE_EXTENSIONS and member.size <= SIZE_PROBE_MAX_BYTES:
                        f = tar.extractfile(member)
                        side = _image_side(f.read()) if f is not None else None
                        if side:
                            sides.append(side)
        except (OSError, tarfile.TarError, ValueError):
            pass
        return sides
    read_raw = getattr(ds, "read_raw", None)
    length = len(ds) if hasattr(ds, "__len__") else 0
    if spec is not None and not spec.sharded:  # LMDB: opening its environment here would share it with later workers
        return sides
    if callable(read_raw) and length:
        for i in range(min(n, length)):
            try:
                data = read_raw(i)[1]
            except Exception:  # noqa: BLE001 - an unreadable sample tells no size
                continue
            side = _image_side(data) if isinstance(data, (bytes, bytearray, memoryview)) else None
            if side:
                sides.append(side)
        return sides
    for attr in ("samples", "imgs", "paths", "files"):  # torchvision-style and plain file lists
        items = getattr(ds, attr, None)
        if not isinstance(items, (list, tuple)) or not items:
            continue
        for item in items[:n]:
            path = item[0] if isinstance(item, (list, tuple)) and item else item
            if isinstance(path, (str, os.PathLike)):
                side = _file_side(path)
                if side:
                    sides.append(side)
        break
    return sides


def _slow_mount(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies on a network or user-space file system (``/proc/mounts``; False when unknown)."""
    try:
        real = os.path.realpath(path)
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return False
    best, fstype = "", ""
    for line in lines[:100_000]:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
            best, fstype = mnt, parts[2]
    return any(fstype == t or fstype.startswith(t + ".") for t in SLOW_FS_TYPES)


def data_facts(loader: Any) -> dict:
    """What a loader reads, as far as it can be learnt cheaply; the advice of :func:`diagnose` depends on it.

    Args:
        loader: the watched iterable (a ``DataLoader``; its ``dataset`` is looked at).

    Returns:
        ``{"reader", "format", "remote", "slow_storage", "decoder", "image_size", "image_side"}``:
        ``reader`` ``"shardfeed"`` (one of our sources) or ``"other"`` (None without a dataset);
        ``format`` ``"webdataset"``, ``"lmdb"``, ``"folder"``, ``"memory"`` (``cache="memory"``, then
        also ``"in_memory": True``) or None (unknown); ``remote``: the
        location's ``remote`` capability (None when unknown); ``slow_storage``: a local dataset (ours, or a
        user's with a ``root`` or a list of files) on a
        network or user-space file system; ``decoder``: the JPEG decoder in use (``"simplejpeg"``,
        ``"pil"``, ``"cv2"``; None when unknown); ``image_size``: the loader's output size, px;
        ``image_side``: the median shorter side of a few stored images, px (from their headers,
        local files only; None when unknown).
    """
    ds = getattr(loader, "dataset", None)
    facts = {"reader": None, "format": None, "remote": None, "slow_storage": False, "decoder": None,
             "image_size": None, "image_side": None}
    if ds is None:
        return facts
    from ..registry import FORMATS
    from ..source_base import SourceBase

    ours = isinstance(ds, SourceBase)
    facts["reader"] = "shardfeed" if ours else "other"
    fmt = None
    for obj in (ds, getattr(ds, "manifest", None)):
        for attr in ("source_format", "format"):
            value = getattr(obj, attr, None)
            if fmt is None and isinstance(value, str) and (value == "folder" or value in FORMATS):
                fmt = value
    from ..memory_cache import MemoryCachedSource

    if isinstance(ds, MemoryCachedSource):  # cache="memory": the samples are in RAM already
        fmt, facts["in_memory"] = "memory", True
    facts["format"] = fmt if ours else None
    location = getattr(ds, "location", None) or getattr(ds, "store", None)
    remote = getattr(location, "remote", None)
    if ours and remote is None and fmt == "folder":
        remote = False  # a folder on the local file system
    facts["remote"] = remote if isinstance(remote, bool) else None
    if ours:
        root = getattr(location, "root", None) if location is not None else getattr(ds, "root", None)
        if remote is False and isinstance(root, (str, os.PathLike)):
            facts["slow_storage"] = _slow_mount(root)
        size = getattr(ds, "image_size", None)
        facts["image_size"] = int(size) if isinstance(size, int) and not isinstance(size, bool) else None
        decoder = getattr(getattr(ds, "sample_decoder", None), "decoder", None)
        if decoder == "auto":
            from ..jpeg import simplejpeg_available

            decoder = "simplejpeg" if simplejpeg_available() else "pil"
        facts["decoder"] = decoder if isinstance(decoder, str) else None
    if not ours:  # a user's dataset: the mount of its root or of its first file
        first = next((x for x in (getattr(ds, a, None) for a in ("samples", "imgs", "paths", "files"))
                      if isinstance(x, (list, tuple)) and x), [None])[0]
        first = first[0] if isinstance(first, (list, tuple)) and first else first
        where = getattr(ds, "root", None) or first
        facts["slow_storage"] = isinstance(where, (str, os.PathLike)) and _slow_mount(where)
    sides = _probe_sides(ds, facts["format"], facts["remote"])
    if sides:
        facts["image_side"] = int(statistics.median(sides))
    return facts


def _label_of(loader: Any) -> str:
    ds = getattr(loader, "dataset", None)
    name = type(loader).__name__
    return f"{name}({type(ds).__name__})" if ds is not None else name


def batch_ready(it: Any) -> bool | None:
    """Whether a batch has already come back from a worker when the loop asks a ``DataLoader``
    iterator for the next one: the batch due is held out of order, or the result queue (the
    pinning thread's queues too) is not empty. (The watch then also checks that the call did not
    hold a later batch aside while it waited for the due one; if it did, the request was not ready.)

    A loop that stalls although its batches were ready waits on the hand-off itself (the main
    process receiving and unpickling each batch, mapping its shared memory), not on the workers.
    Looks only at torch's multi-process iterator (``_task_info``, ``_rcvd_idx``, ``_data_queue``;
    torch 2.x) and never blocks: a non-blocking poll of each queue, a few microseconds.

    Returns:
        True or False; None for any other iterable, or when torch's internals are not as expected.
    """
    it = _torch_iterator(it)
    try:
        info, idx, data_queue = it.__dict__.get("_task_info"), it.__dict__.get("_rcvd_idx"), \
            it.__dict__.get("_data_queue")
        if not isinstance(info, dict) or not isinstance(idx, int) or data_queue is None:
            return None
        entry = info.get(idx)
        if isinstance(entry, tuple) and len(entry) == 2:
            return True
        queues = [data_queue]
        if it.__dict__.get("_pin_memory"):
            queues.append(it.__dict__.get("_worker_result_queue"))
        return any(q is not None and not q.empty() for q in queues)
    except Exception:  # noqa: BLE001 - a torch whose internals differ: unknown, never an error in the loop
        return None


def _torch_iterator(it: Any, max_depth: int = 4) -> Any:
    """The ``DataLoader`` iterator inside ``it``: a wrapper that hands the loop batches of its own
    (shardfeed's loader, this module's epoch) holds the one it wraps as ``_it``."""
    for _ in range(max_depth):
        d = getattr(it, "__dict__", None)
        if not isinstance(d, dict) or "_task_info" in d or d.get("_it") is None:
            return it
        it = d["_it"]
    return it


def held_out_of_order(it: Any) -> int | None:
    """Batches a ``DataLoader`` iterator holds that came back before their turn (None: not known)."""
    it = _torch_iterator(it)
    try:
        info = it.__dict__.get("_task_info")
        return sum(1 for v in list(info.values()) if isinstance(v, tuple) and len(v) == 2) \
            if isinstance(info, dict) else None
    except Exception:  # noqa: BLE001 - torch internals not as expected: unknown
        return None


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
        self._sampler: _Sampler | None = None
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
        workers = getattr(cur._it, "_workers", None)
        if workers is None:  # single-process iterator, or an iterable that is no DataLoader: no workers known
            return [] if not getattr(self.loader, "num_workers", None) else None
        return [p.pid for p in workers if getattr(p, "pid", None)]

    def _start_sampling(self) -> None:
        if self._sampler is not None:
            return
        try:
            import psutil  # noqa: F401
        except ImportError:
            self._warnings.append("psutil is not installed: no CPU, I/O or memory figures (pip install psutil)")
            return
        gpu_index = self._device.index if (self._cuda_sync and self._sample_gpu) else None
        self._sampler = _Sampler(self._sample_interval_s, self._worker_pids, gpu_index)
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
        knobs = _loader_knobs(self.loader)
        nw = knobs.get("num_workers")
        workers = main = io = memory = system = None
        gpu_util = None
        if snap is not None:
            per = [w for w in snap["workers"] if w["watched_s"] > 0]
            if nw is None and not per:  # an iterable that is no DataLoader and no worker process seen
                nw = 0
            busy = [w["cpu_busy_share"] for w in per if w["cpu_busy_share"] is not None]
            demand = [w["cpu_demand_share"] for w in per if w["cpu_demand_share"] is not None]
            runq = [w["runqueue_share"] for w in per if w["runqueue_share"] is not None]
            dsleep = [w["disk_sleep_share"] for w in per if w["disk_sleep_share"] is not None]
            flagged = [(r, t) for r, t in zip(self.ready[:len(waits_for_share)], waits_for_share) if r is not None]
            flagged_wait = sum(t for _, t in flagged)
            workers = {"num": nw if nw is not None else len(per),
                       "cpu_busy_share": statistics.fmean(busy) if busy else None,
                       "cpu_demand_share": statistics.fmean(demand) if demand else None,
                       "runqueue_share": statistics.fmean(runq) if runq else None,
                       "disk_sleep_share": statistics.fmean(dsleep) if dsleep else None,
                       "batch_ready_share": (sum(r for r, _ in flagged) / len(flagged)) if flagged else None,
                       "ready_wait_share": (sum(t for r, t in flagged if r) / flagged_wait) if flagged_wait > 0
                       else None,
                       "batch_tensors": self.batch_tensors,
                       "per_worker": per}
            m = snap["main"]
            main = {k: m[k] for k in ("cpu_s", "cpu_busy_share", "cpu_demand_share", "rss_bytes")}
            span = max(m["watched_s"], 1e-9)
            chars = [x["read_chars"] for x in [m, *snap["workers"]] if x["read_chars"] is not None]
            rbytes = [x["read_bytes"] for x in [m, *snap["workers"]] if x["read_bytes"] is not None]
            system = dict(snap["system"])
            ours = m["cpu_s"] + sum(x["cpu_s"] for x in snap["workers"])
            system["others_cpu_share"] = min(1.0, max(0.0, system.pop("busy_s") - ours) / (span * system["cpu_count"]))
            io = {"read_chars": sum(chars) if chars else None, "read_bytes": sum(rbytes) if rbytes else None,
                  "read_chars_per_s": sum(chars) / span if chars else None,
                  "read_bytes_per_s": sum(rbytes) / span if rbytes else None,
                  "iowait_share": system["iowait_share"]}
            memory = {"memory_available_min_bytes": system["memory_available_min_bytes"],
                      "swap_growth_bytes": system["swap_growth_bytes"]}
            if system["swap_growth_bytes"] > 128 * 1024 * 1024:
                warnings.append(f"swap use grew by {fmt_bytes(system['swap_growth_bytes'])}: the machine is short "
                                "of memory")
            if snap["gpu"]:
                gpu_util = snap["gpu"]["util_mean"]
        cpu_count = (system or {}).get("cpu_count") or os.cpu_count() or 1
        num_samples = self.num_samples
        if num_samples is not None and len(waits) > len(steps) and not self._fetch_hooked:  # its step has not ended
            num_samples -= self._last_len or 0
        samples_per_s = (num_samples / wall) if (num_samples is not None and wall > 0 and waits) else None
        t_wait, t_step = _stats(waits), _stats(steps)
        dev = str(self._device) if self._device is not None else "cpu"
        diagnosis = diagnose(stall_share=stall, batches=batches, num_workers=nw, workers=workers, main=main,
                             loader=knobs, cpu_count=cpu_count, cuda=self._cuda_sync, epochs=self.epochs,
                             t_wait_s=t_wait, io=io, data=_data_root(self.loader), t_step_s=t_step,
                             facts=self._data_facts(), system=system)
        if batches < 10:
            warnings.append(f"only {batches} batches timed: the figures are rough")
        return WatchReport(label=self.label, batches=batches, epochs=self.epochs, t_wait_s=t_wait, t_step_s=t_step,
                           t_first_batch_s=self.first_batch_s, stall_share=stall, samples_per_s=samples_per_s,
                           num_samples=num_samples if waits else None, device=dev,
                           timing="cuda_synchronize" if self._cuda_sync else "perf_counter", loader=knobs,
                           workers=workers, main=main, io=io, memory=memory, system=system, gpu_util=gpu_util,
                           diagnosis=diagnosis, warnings=warnings, per_batch=_per_batch(waits, steps, self.sizes),
                           t_other_s=_stats(others), other_share=to / wall if wall > 0 else 0.0)


#: The most batches a report lists one by one (``WatchReport.per_batch``; the figure's points).
MAX_PER_BATCH = 20_000


def _per_batch(waits: list[float], steps: list[float], sizes: list[int | None]) -> dict:
    n = min(len(waits), len(steps), MAX_PER_BATCH)
    counts = sizes[:n]
    return {"t_wait_s": waits[:n], "t_step_s": steps[:n],
            "num_samples": None if any(c is None for c in counts) else counts,
            "truncated": len(steps) > MAX_PER_BATCH}


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


def reports_to_json(reports: list[WatchReport]) -> str:
    """A list of reports as one JSON document (``{"loaders": [...]}``)."""
    return json.dumps({"loaders": [r.to_json() for r in reports]}, indent=2)
