"""Throughput measurement: the training-loop harness behind ``shardfeed bench``, ``verify`` and ``tune``.

The method is the one practitioners use to find a data-loading bottleneck (DESIGN.md,
"Measuring"): run a real training loop, and for every batch time

``t_wait_s``
    the wall time the loop is blocked on the loader, *including* the host-to-device copy
    (:func:`shardfeed.readers.loader.to_device`, ``non_blocking`` from pinned memory; on CUDA the
    copy is synchronised before the clock stops, so the figure is time the device sits idle);
``t_compute_s``
    the step: forward + backward + optimizer step of the model. On CUDA it is timed with CUDA
    events and the step is synchronised at its end (so the next wait starts when the device is
    idle); on the CPU with ``time.perf_counter`` after synchronising. ``compute_ms=X`` replaces the
    model by ``time.sleep(X / 1000)``: a step that takes X ms but leaves the CPU to the loader, as
    a GPU step does ("would this loader keep up with a GPU that needs X ms per step?").

From these a :class:`RunReport` gives images/s (samples / measured wall time), mean/p50/p95 of
both times and the data-stall share Σ t_wait / Σ (t_wait + t_compute), together with what the
machine did meanwhile, read from ``/proc`` (Linux; None elsewhere):

* CPU time of the main process and of the ``DataLoader`` worker processes (the main process's
  children: live ones are read from ``/proc/PID/stat``, finished ones through the parent's
  ``cutime``/``cstime``), as cores busy;
* bytes read, from ``/proc/PID/io`` of the same processes: ``read_bytes`` (fetched from the
  storage device: page-cache misses) and ``rchar`` (every ``read()``, cache hits included);
* resident memory (RSS) of the main process and the workers at the start and end of the measured
  window, with growth of more than :data:`MEMORY_GROWTH_FLAG_BYTES` and
  :data:`MEMORY_GROWTH_FLAG_SHARE` flagged; swap in use (``/proc/meminfo``); the machine's share
  of CPU time in I/O wait (``/proc/stat``);
* on CUDA, GPU utilisation and memory sampled from NVML (``nvidia-ml-py``, the ``gpu`` extra) by
  a background thread every :data:`GPU_SAMPLE_INTERVAL_S`.

``cold=True`` evicts the dataset's files from the page cache first with
``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` and checks with ``mincore(2)`` (or the
``fincore`` tool) whether the file system honoured it: tmpfs (``/dev/shm``), and some network
and FUSE file systems, keep the pages, and the report says so. Pages mapped by a running process
are not evicted either. ZFS's ARC ignores the advice without ``mincore`` noticing.

``torch`` is imported lazily, inside the functions.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import logging
import math
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from .errors import ShardfeedError
from .format import MANIFEST_NAME, load_manifest

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "GPU_SAMPLE_INTERVAL_S",
    "MEMORY_GROWTH_FLAG_BYTES",
    "MEMORY_GROWTH_FLAG_SHARE",
    "EVICTION_IGNORED_SHARE",
    "DatasetMismatchError",
    "TimingStats",
    "RunReport",
    "select_device",
    "run_training_loop",
    "bench_source",
    "detect_source_format",
    "dataset_files",
    "page_cache_residency",
    "evict_page_cache",
    "ProcessSampler",
    "GpuSampler",
    "check_same_samples",
    "compare_sources",
    "tune_loader",
    "format_table",
    "format_report",
    "format_comparison",
    "comparison_headline",
    "make_loader_call",
    "plot_runs",
]

logger = logging.getLogger(__name__)

#: ImageNet mean and standard deviation of R, G, B on the [0, 1] scale (``to_device`` divides by 255 first).
DEFAULT_MEAN = (0.485, 0.456, 0.406)
DEFAULT_STD = (0.229, 0.224, 0.225)
#: How often the NVML thread samples GPU utilisation and memory, seconds.
GPU_SAMPLE_INTERVAL_S = 0.1
#: RSS growth (main + workers) over the measured window flagged when above both of these (a first
#: run in a process grows by tens of MB as allocators and shared-memory batch buffers warm up).
MEMORY_GROWTH_FLAG_BYTES = 128 * 1024 * 1024
MEMORY_GROWTH_FLAG_SHARE = 0.20
#: After eviction, a cached share of the dataset's bytes above this means the eviction did not take
#: (the main process's own LMDB mapping keeps ~1% of a small data.mdb, which is fine).
EVICTION_IGNORED_SHARE = 0.05

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = mmap.PAGESIZE


class DatasetMismatchError(ShardfeedError, ValueError):
    """``verify``: the two datasets do not hold the same samples or classes."""


# ---------------------------------------------------------------------------------------------
# report


@dataclasses.dataclass
class TimingStats:
    """Mean, median and 95th percentile of per-batch times, seconds."""

    mean: float
    p50: float
    p95: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "TimingStats":
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(float(statistics.fmean(values)), _percentile(values, 50), _percentile(values, 95))

    def to_json(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p95": self.p95}


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), without numpy."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


@dataclasses.dataclass
class RunReport:
    """One measured run of the training loop.

    Attributes:
        images_per_s: ``num_samples / seconds``.
        num_batches: batches measured (warm-up excluded).
        num_samples: images in those batches.
        seconds: wall time of the measured window (first wait to last step end), s.
        t_wait_s: per-batch wait for data incl. the host-to-device copy, s.
        t_compute_s: per-batch step time, s.
        stall_share: Σ t_wait / Σ (t_wait + t_compute), in [0, 1].
        device: the torch device the loop ran on (``"cpu"``, ``"cuda:0"``).
        timing: how ``t_compute_s`` was taken: ``"cuda_events"``, ``"perf_counter"``.
        gpu_util: mean GPU utilisation from NVML in [0, 1]; None off CUDA or without NVML.
        gpu: NVML and torch memory figures (bytes) on CUDA; None otherwise.
        cpu: CPU time of the main process and the loader workers (s, cores busy); None off Linux.
        io: bytes read by the main process and the workers during the measured window
            (``read_bytes``: from the device; ``rchar``: all reads) and per second, and both
            counted from before the warm-up (``*_with_warmup``: kernel readahead may fetch whole
            shards while warming up); None when ``/proc/PID/io`` is unreadable.
        memory: RSS (bytes) of main and workers at start/end, growth and its flag.
        system: swap in use (bytes) at start/end, share of CPU time in I/O wait.
        cache: what ``cold`` eviction did (see :func:`evict_page_cache`); None when warm.
        config: the full configuration (source, ``source_format``, loader and harness settings).
        batches: per-batch ``t_start_s`` (from the window start), ``t_wait_s``, ``t_compute_s``.
        epochs: loader epochs started during the run (warm-up included).
        label: a name for tables (``"before"``, ``"after"``, a tune step).
        warnings: human-readable warnings about the measurement.
    """

    images_per_s: float
    num_batches: int
    num_samples: int
    seconds: float
    t_wait_s: TimingStats
    t_compute_s: TimingStats
    stall_share: float
    device: str
    timing: str
    gpu_util: float | None = None
    gpu: dict | None = None
    cpu: dict | None = None
    io: dict | None = None
    memory: dict | None = None
    system: dict | None = None
    cache: dict | None = None
    config: dict = dataclasses.field(default_factory=dict)
    batches: dict = dataclasses.field(default_factory=dict)
    epochs: int = 1
    label: str | None = None
    warnings: list = dataclasses.field(default_factory=list)

    def to_json(self, *, per_batch: bool = True) -> dict:
        """Every figure as a JSON-able dict (``per_batch=False`` drops the per-batch lists)."""
        d = dataclasses.asdict(self)
        d["t_wait_s"] = self.t_wait_s.to_json()
        d["t_compute_s"] = self.t_compute_s.to_json()
        if not per_batch:
            d.pop("batches", None)
        return d


# ---------------------------------------------------------------------------------------------
# devices


def select_device(spec: "str | torch.device | None" = "auto") -> "torch.device":
    """Resolve ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ValueError: CUDA asked for but not available, or an index beyond the visible GPUs.
    """
    import torch

    if isinstance(spec, torch.device):
        dev = spec
    else:
        text = (spec or "auto").strip().lower()
        if text == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        try:
            dev = torch.device(text)
        except RuntimeError:
            raise ValueError(f"device {spec!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!s}: CUDA is not available (torch {torch.__version__}); "
                             "use --device cpu or auto")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!s}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", index)
    elif dev.type != "cpu":
        logger.warning("device %s: only cpu and cuda are tested", dev)
    return dev


def _synchronize(device: "torch.device") -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# /proc: CPU time, I/O, memory of the main process and its children (the loader workers)


def _read_text(path: str) -> str | None:
    try:
        with open(path, "r") as f:
            return f.read()
    except OSError:
        return None


def _proc_stat(pid: int | str) -> tuple[int, float, float] | None:
    """(ppid, own CPU s, reaped children's CPU s) from ``/proc/PID/stat``; None if gone."""
    text = _read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): ppid=4, utime=14, stime=15, cutime=16, cstime=17
    ppid = int(fields[1])
    own = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    reaped = (int(fields[13]) + int(fields[14])) / _CLK_TCK
    return ppid, own, reaped


def _proc_io(pid: int | str) -> dict | None:
    text = _read_text(f"/proc/{pid}/io")
    if not text:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "read_bytes"):
            out[key] = int(value)
    return out if len(out) == 2 else None


def _proc_rss(pid: int | str) -> int | None:
    text = _read_text(f"/proc/{pid}/statm")
    if not text:
        return None
    return int(text.split()[1]) * _PAGE_SIZE


def _children(pid: int) -> list[int]:
    """PIDs of the live (or not yet reaped) children of ``pid``."""
    kids: list[int] = []
    task_dir = f"/proc/{pid}/task"
    found_children_file = False
    try:
        for tid in os.listdir(task_dir):
            text = _read_text(f"{task_dir}/{tid}/children")
            if text is not None:
                found_children_file = True
                kids += [int(x) for x in text.split()]
    except OSError:
        pass
    if found_children_file:
        return sorted(set(kids))
    try:  # kernels without CONFIG_PROC_CHILDREN: scan /proc for our children
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if name.isdigit():
            st = _proc_stat(name)
            if st is not None and st[0] == pid:
                kids.append(int(name))
    return sorted(kids)


def _meminfo() -> dict:
    text = _read_text("/proc/meminfo") or ""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def _cpu_times() -> list[int] | None:
    text = _read_text("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    return [int(x) for x in text.splitlines()[0].split()[1:]]


@dataclasses.dataclass
class _Snapshot:
    t: float
    own_cpu_s: float | None
    reaped_cpu_s: float | None
    child_cpu_s: dict
    io: dict | None
    child_io: dict
    rss: int | None
    child_rss: dict
    swap_used: int | None
    cpu_times: list | None


class ProcessSampler:
    """Reads ``/proc`` for the main process and its children (the ``DataLoader`` workers).

    Call :meth:`start` at the beginning and :meth:`stop` at the end of the measured window;
    :meth:`stop` returns ``(cpu, io, memory, system)`` dicts for :class:`RunReport` (None where
    ``/proc`` is not available). Finished workers are counted through the parent's ``cutime`` and
    I/O accounting (the kernel adds a reaped child's figures to its parent).

    Args:
        pid: the main process (default: this one).
        worker_pids: returns the PIDs of the loader's live worker processes (None: every child of
            ``pid`` counts as a worker).
    """

    def __init__(self, pid: int | None = None, worker_pids: Callable[[], Iterable[int] | None] | None = None):
        self.pid = pid or os.getpid()
        self.worker_pids = worker_pids
        self.available = os.path.exists(f"/proc/{self.pid}/stat")
        self._start: _Snapshot | None = None

    def _snapshot(self) -> _Snapshot:
        now = time.perf_counter()
        if not self.available:
            return _Snapshot(now, None, None, {}, None, {}, None, {}, None, None)
        st = _proc_stat(self.pid)
        kids = _children(self.pid)
        allowed = self.worker_pids() if self.worker_pids is not None else None
        if allowed is not None:  # other children (servers, helpers) are not the loader's
            allowed = set(allowed)
            kids = [k for k in kids if k in allowed]
        child_cpu, child_io, child_rss = {}, {}, {}
        for k in kids:
            kst = _proc_stat(k)
            if kst is None:
                continue
            child_cpu[k] = kst[1]
            child_io[k] = _proc_io(k)
            child_rss[k] = _proc_rss(k)
        mem = _meminfo()
        swap = mem["SwapTotal"] - mem["SwapFree"] if "SwapTotal" in mem and "SwapFree" in mem else None
        return _Snapshot(now, st[1] if st else None, st[2] if st else None, child_cpu, _proc_io(self.pid),
                         child_io, _proc_rss(self.pid), child_rss, swap, _cpu_times())

    def start(self) -> None:
        """Take the start snapshot."""
        self._start = self._snapshot()

    def stop(self) -> tuple[dict | None, dict | None, dict | None, dict | None]:
        """Take the end snapshot; return ``(cpu, io, memory, system)`` (see :class:`RunReport`)."""
        if self._start is None:
            raise RuntimeError("ProcessSampler.stop() before start()")
        a, b = self._start, self._snapshot()
        wall = max(b.t - a.t, 1e-9)
        ncpu = os.cpu_count() or 1
        cpu = io = memory = system = None
        if a.own_cpu_s is not None and b.own_cpu_s is not None:
            main_s = b.own_cpu_s - a.own_cpu_s
            workers_s = ((b.reaped_cpu_s - a.reaped_cpu_s) + sum(b.child_cpu_s.values())
                         - sum(a.child_cpu_s.values()))
            workers_s = max(workers_s, 0.0)
            cpu = {"main_s": main_s, "workers_s": workers_s, "total_s": main_s + workers_s,
                   "main_cores": main_s / wall, "workers_cores": workers_s / wall,
                   "util_share": (main_s + workers_s) / wall / ncpu, "cpu_count": ncpu,
                   "num_worker_processes": len(set(a.child_cpu_s) | set(b.child_cpu_s))}
        if a.io is not None and b.io is not None:
            io = {}
            for key in ("read_bytes", "rchar"):
                # reaped children's I/O is folded into the parent's; live ones are read directly
                total = (b.io[key] - a.io[key]
                         + sum(v[key] for v in b.child_io.values() if v)
                         - sum(v[key] for v in a.child_io.values() if v))
                io[key] = max(total, 0)
                io[f"{key}_per_s"] = io[key] / wall
            io["workers_readable"] = all(v is not None for v in list(a.child_io.values()) + list(b.child_io.values()))
        if a.rss is not None and b.rss is not None:
            ws, we = sum(v for v in a.child_rss.values() if v), sum(v for v in b.child_rss.values() if v)
            start, end = a.rss + ws, b.rss + we
            growth = end - start
            memory = {"main_rss_start_bytes": a.rss, "main_rss_end_bytes": b.rss,
                      "workers_rss_start_bytes": ws, "workers_rss_end_bytes": we,
                      "total_rss_start_bytes": start, "total_rss_end_bytes": end, "growth_bytes": growth,
                      "growth_flag": growth > MEMORY_GROWTH_FLAG_BYTES and growth > MEMORY_GROWTH_FLAG_SHARE * start}
        if a.cpu_times is not None or a.swap_used is not None:
            system = {"swap_used_start_bytes": a.swap_used, "swap_used_end_bytes": b.swap_used, "iowait_share": None}
            if a.cpu_times and b.cpu_times:
                delta = [y - x for x, y in zip(a.cpu_times, b.cpu_times)]
                total = sum(delta[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
                system["iowait_share"] = delta[4] / total if total > 0 and len(delta) > 4 else 0.0
        return cpu, io, memory, system


# ---------------------------------------------------------------------------------------------
# NVML


class GpuSampler:
    """Samples GPU utilisation and memory from NVML in a daemon thread (CUDA only).

    Uses ``pynvml`` from ``nvidia-ml-py`` (``pip install 'shardfeed[gpu]'``), imported lazily.
    The NVML device is matched to the torch device by UUID, then PCI bus id, then index.

    Args:
        device_index: the torch CUDA device index.
        interval_s: seconds between samples.
    """

    def __init__(self, device_index: int, interval_s: float = GPU_SAMPLE_INTERVAL_S):
        self.device_index = device_index
        self.interval_s = interval_s
        self.error: str | None = None
        self._util: list[float] = []
        self._mem: list[int] = []
        self._mem_total: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def _open(self) -> bool:
        try:
            import pynvml
        except ImportError:
            self.error = "GPU utilisation needs nvidia-ml-py: pip install 'shardfeed[gpu]'"
            return False
        try:
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = self._find_handle(pynvml)
            self._mem_total = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).total)
            return True
        except Exception as exc:  # NVML missing driver library, permissions, ...
            self.error = f"NVML unavailable: {exc}"
            if self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
            return False

    def _find_handle(self, pynvml):
        import torch

        props = torch.cuda.get_device_properties(self.device_index)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            text = str(uuid)
            for cand in (text, f"GPU-{text}"):
                with contextlib.suppress(Exception):
                    return pynvml.nvmlDeviceGetHandleByUUID(cand)
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
            with contextlib.suppress(Exception):
                return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        if not os.environ.get("CUDA_VISIBLE_DEVICES"):
            return pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        raise RuntimeError(f"cannot match CUDA device {self.device_index} to an NVML device")

    def _loop(self) -> None:
        pynvml, handle = self._nvml, self._handle
        while not self._stop.is_set():
            try:
                self._util.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                self._mem.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
            except Exception as exc:  # pragma: no cover - driver hiccup
                self.error = f"NVML sampling failed: {exc}"
                return
            self._stop.wait(self.interval_s)

    def start(self) -> bool:
        """Start sampling; False (with :attr:`error` set) when NVML is not usable."""
        if not self._open():
            return False
        self._thread = threading.Thread(target=self._loop, name="shardfeed-nvml", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> dict | None:
        """Stop sampling; returns ``{"util_mean", "util_p50", "util_samples", "memory_used_max_bytes",
        "memory_total_bytes"}`` (utilisation in [0, 1]) or None when nothing was sampled."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
        if not self._util:
            return None
        return {"util_mean": statistics.fmean(self._util) / 100, "util_p50": _percentile(self._util, 50) / 100,
                "util_samples": len(self._util), "memory_used_max_bytes": max(self._mem),
                "memory_total_bytes": self._mem_total}


# ---------------------------------------------------------------------------------------------
# page cache


def detect_source_format(source: str | os.PathLike) -> str:
    """``"folder"``, ``"webdataset"`` or ``"lmdb"`` for a local path (its manifest says which).

    A URL is taken as a packed dataset; its format is read by the reader (see :func:`bench_source`).

    Raises:
        FileNotFoundError: the path does not exist.
    """
    text = str(source)
    if "://" in text:
        return "webdataset"
    p = Path(text)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    mpath = p if p.is_file() else p / MANIFEST_NAME
    if mpath.is_file() and mpath.name == MANIFEST_NAME:
        return load_manifest(mpath, check_files=False).format
    if p.is_dir():
        return "folder"
    raise ValueError(f"{p}: not an image folder or a packed dataset (no {MANIFEST_NAME})")


def dataset_files(source: str | os.PathLike) -> list[Path]:
    """Every regular file of a local dataset (a folder, a packed dataset or its manifest); [] for URLs.

    Hidden files and folders are skipped for image folders (they are not samples).
    """
    text = str(source)
    if "://" in text:
        return []
    p = Path(text)
    if p.is_file():
        p = p.parent if p.name == MANIFEST_NAME else p
        if p.is_file():
            return [p]
    if p.is_dir() and not (p / MANIFEST_NAME).exists():
        try:  # an image folder: exactly its samples, through symlinked class folders too
            from .imagefolder import scan_image_folder

            scanned = scan_image_folder(p).files
            return [Path(os.path.realpath(scanned.path_of(i))) for i in range(len(scanned))]
        except ValueError:
            pass  # not an ImageFolder: every file below it
    files: list[Path] = []
    seen: set[str] = set()
    for root, dirs, names in os.walk(p, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            f = Path(root) / name
            if f.is_file():
                files.append(f.resolve() if f.is_symlink() else f)
    return files


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        return libc
    except (OSError, AttributeError):
        return None


_MAP_FAILED = ctypes.c_void_p(-1).value
_MINCORE_CHUNK = 1 << 30  # bytes of file examined per mincore call


def _cached_bytes_mincore(libc, path: Path) -> int:
    import numpy as np

    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap failed: {os.strerror(err)}", str(path))
        try:
            resident = 0
            for start in range(0, size, _MINCORE_CHUNK):
                length = min(_MINCORE_CHUNK, size - start)
                pages = (length + _PAGE_SIZE - 1) // _PAGE_SIZE
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(ctypes.c_void_p(addr + start), length, vec) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mincore failed: {os.strerror(err)}", str(path))
                resident += int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))
            return min(resident * _PAGE_SIZE, size)
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def _cached_bytes_fincore(paths: Sequence[Path]) -> int:
    exe = shutil.which("fincore")
    if exe is None:
        raise OSError("fincore not found")
    total = 0
    for i in range(0, len(paths), 256):
        chunk = [str(p) for p in paths[i:i + 256]]
        out = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "--output", "RES", *chunk],
                             capture_output=True, text=True, check=True).stdout
        total += sum(int(x) for x in out.split())
    return total


def page_cache_residency(paths: Sequence[str | os.PathLike]) -> tuple[int | None, int, str | None]:
    """How many bytes of ``paths`` are in the page cache.

    Uses ``mincore(2)`` on a read-only shared mapping (through ``ctypes``), else the ``fincore``
    tool (util-linux).

    Returns:
        ``(cached_bytes, total_bytes, method)``; ``cached_bytes`` and ``method`` are None when
        neither way works on this system.
    """
    paths = [Path(p) for p in paths]
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    libc = _libc()
    if libc is not None:
        try:
            cached = 0
            for p in paths:
                try:
                    cached += _cached_bytes_mincore(libc, p)
                except FileNotFoundError:
                    continue
            return cached, total, "mincore"
        except OSError as exc:
            logger.debug("mincore residency check failed (%s); trying fincore", exc)
    try:
        return _cached_bytes_fincore(paths), total, "fincore"
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        logger.debug("fincore residency check failed: %s", exc)
        return None, total, None


#: Files modified this recently (s) may still have dirty pages: they are written back before eviction.
_DIRTY_WINDOW_S = 120.0


def _advise_dontneed(paths: Sequence[Path]) -> int:
    """``posix_fadvise(DONTNEED)`` on every file; returns how many could not be opened or advised."""
    failed = 0
    now = time.time()
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            if now - os.fstat(fd).st_mtime < _DIRTY_WINDOW_S:
                with contextlib.suppress(OSError):
                    os.fdatasync(fd)  # DONTNEED drops clean pages only
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return failed


def evict_page_cache(paths: Sequence[str | os.PathLike], *, retries: int = 1) -> dict:
    """Drop ``paths`` from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) and check it.

    Files modified in the last two minutes are written back first (``fdatasync``), since the
    advice only drops clean pages. Afterwards :func:`page_cache_residency` tells whether the file
    system honoured the advice; when too much stayed cached the advice is repeated ``retries``
    times after a short pause (read-ahead still in flight from a previous run).

    Returns:
        ``{"files", "bytes", "cached_bytes_before", "cached_bytes_after", "check", "ignored",
        "failed_files", "attempts", "seconds", "message"}``: ``ignored`` is True when more than
        :data:`EVICTION_IGNORED_SHARE` of the bytes stayed cached (tmpfs, some network/FUSE file
        systems, pages mapped by a running process, another process reading the same files),
        None when it could not be checked; ``message`` says what that means for the measurement.
    """
    t0 = time.perf_counter()
    paths = [Path(p) for p in paths]
    before, total, method = page_cache_residency(paths)
    if not hasattr(os, "posix_fadvise"):
        return {"files": len(paths), "bytes": total, "cached_bytes_before": before, "cached_bytes_after": before,
                "check": method, "ignored": True, "failed_files": 0, "attempts": 0,
                "seconds": time.perf_counter() - t0,
                "message": "this platform has no posix_fadvise: the page cache was not evicted (a warm run)"}
    attempts = 0
    while True:
        attempts += 1
        failed = _advise_dontneed(paths)
        after, _, _ = page_cache_residency(paths)
        ignored = None if after is None or total == 0 else after / total > EVICTION_IGNORED_SHARE
        if not ignored or attempts > retries:
            break
        time.sleep(0.25)
    message = None
    if ignored:
        message = (f"the page cache kept {after / total:.0%} of the dataset's {_fmt_bytes(total)} after "
                   "POSIX_FADV_DONTNEED (tmpfs such as /dev/shm and some network or FUSE file systems ignore it; "
                   "pages a running process has mapped, or another process reading the same files, keep them "
                   "too): this run reads partly from RAM, not disk")
    elif after is None:
        message = "could not check page-cache residency (no mincore, no fincore): eviction not verified"
    if failed:
        message = (message + "; " if message else "") + f"{failed} file(s) could not be opened or advised"
    return {"files": len(paths), "bytes": total, "cached_bytes_before": before, "cached_bytes_after": after,
            "check": method, "ignored": ignored, "failed_files": failed, "attempts": attempts,
            "seconds": time.perf_counter() - t0, "message": message}


# ---------------------------------------------------------------------------------------------
# the training loop


def _num_classes_of(loader: Any) -> int | None:
    ds = getattr(loader, "dataset", loader)
    for obj in (ds, getattr(ds, "manifest", None)):
        if obj is None:
            continue
        for attr in ("classes", "class_to_idx"):
            value = getattr(obj, attr, None)
            if value:
                return len(value)
    return None


def _set_epoch(loader: Any, epoch: int) -> None:
    for obj in (loader, getattr(loader, "dataset", None), getattr(loader, "sampler", None)):
        fn = getattr(obj, "set_epoch", None)
        if callable(fn):
            fn(epoch)
            return


def _shutdown_loader(loader: Any, it: Any) -> None:
    """Stop the worker processes of ``loader`` now, rather than at garbage collection."""
    for obj in (it, getattr(loader, "_iterator", None)):
        fn = getattr(obj, "_shutdown_workers", None)
        if callable(fn):
            with contextlib.suppress(Exception):
                fn()


class _Step:
    """One training step on a batch already on the device; returns its compute time, s."""

    def __init__(self, device: "torch.device", model: Any, compute_ms: float | None, lr: float,
                 channels_last: bool):
        import torch

        self.device = device
        self.cuda = device.type == "cuda"
        self.compute_ms = compute_ms
        self.model = None
        self.kind = "sleep" if compute_ms is not None else ("none" if model is None else "train")
        if self.kind == "train":
            self.model = model.to(device)
            if channels_last:
                self.model = self.model.to(memory_format=torch.channels_last)
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
            self.loss_fn = torch.nn.CrossEntropyLoss()
        self.timing = "cuda_events" if self.cuda and self.kind == "train" else "perf_counter"
        if self.timing == "cuda_events":
            self._ev0 = torch.cuda.Event(enable_timing=True)
            self._ev1 = torch.cuda.Event(enable_timing=True)

    def _train(self, x, y) -> None:
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def __call__(self, x, y) -> float:
        if self.timing == "cuda_events":
            self._ev0.record()
            self._train(x, y)
            self._ev1.record()
            self._ev1.synchronize()
            return self._ev0.elapsed_time(self._ev1) / 1000.0
        t0 = time.perf_counter()
        if self.kind == "sleep":
            time.sleep(self.compute_ms / 1000.0)
        elif self.kind == "train":
            self._train(x, y)
        _synchronize(self.device)
        return time.perf_counter() - t0


def run_training_loop(loader: Iterable, *, model: "str | torch.nn.Module | None" = "tiny",
                      device: "str | torch.device" = "auto", compute_ms: float | None = None, warmup: int = 10,
                      batches: int = 100, num_classes: int | None = None,
                      mean: Sequence[float] | None = DEFAULT_MEAN, std: Sequence[float] | None = DEFAULT_STD,
                      channels_last: bool = False, lr: float = 0.01, config: dict | None = None,
                      label: str | None = None, sample_gpu: bool = True, shutdown: bool = True,
                      num_threads: int | None = None) -> RunReport:
    """Run a training loop over ``loader`` and time every batch (see the module docstring).

    The loader is iterated for ``warmup`` batches (not counted: worker start, first reads,
    allocator and cuDNN warm-up), then for ``batches`` measured ones; when an epoch ends before
    that, the next one starts (``set_epoch`` is called when the loader has it). Each batch is
    moved with :func:`shardfeed.readers.loader.to_device` (``non_blocking``, normalised on the
    device) and fed to the step.

    Args:
        loader: yields ``(uint8 [B, 3, H, W], int64 [B])`` (e.g. from ``make_loader``).
        model: a built-in model name (``tiny``, ``resnet18``, ``resnet50``, ``none``,
            ``module:callable``; see :mod:`shardfeed.readers.models`), a ``torch.nn.Module``, or
            None (no compute).
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or a ``torch.device``.
        compute_ms: replace the model by a step that sleeps this many ms (leaving the CPU free).
        warmup: batches run before measuring.
        batches: batches measured (≥ 1).
        num_classes: logits of a named model; default: the loader's dataset's class count.
        mean, std: per-channel normalisation after scaling to [0, 1] (None: none).
        channels_last: channels-last memory format for the batch and the model.
        lr: SGD learning rate (momentum 0.9).
        config: recorded in the report as its configuration.
        label: a name for the report.
        sample_gpu: on CUDA, sample utilisation and memory from NVML.
        shutdown: stop the loader's worker processes when done.
        num_threads: ``torch.set_num_threads`` for the step in this process. None: on the CPU
            with worker processes, ``max(1, cores - num_workers)`` (the workers use one thread
            each, and a step with a thread per core fights them for the cores: on 2 cores that
            cost the loader ~30 % here); otherwise torch's default.

    Returns:
        The :class:`RunReport`.

    Raises:
        ValueError: bad counts, an empty loader, a model that needs ``num_classes``.
    """
    import torch

    from .loader import to_device
    from .models import build_model

    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    if warmup < 0:
        raise ValueError(f"warmup must be 0 or more, got {warmup}")
    if compute_ms is not None and compute_ms < 0:
        raise ValueError(f"compute_ms must be 0 or more, got {compute_ms}")
    dev = select_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    threads_before = torch.get_num_threads()
    num_workers = int(getattr(loader, "num_workers", 0) or 0)
    if num_threads is None and dev.type == "cpu" and num_workers > 0:
        # the step and the loader workers share the CPU: leave the workers their cores
        num_threads = max(1, (os.cpu_count() or 1) - num_workers)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model_name = model if isinstance(model, str) else (None if model is None else type(model).__name__)
    if compute_ms is not None:
        model_obj = None
    elif isinstance(model, str):
        n = num_classes or _num_classes_of(loader)
        if n is None and model.strip().lower() != "none":
            raise ValueError(f"model {model!r} needs num_classes (the loader's dataset does not say how many)")
        model_obj = build_model(model, n or 1)
    else:
        model_obj = model
    step = _Step(dev, model_obj, compute_ms, lr, channels_last)
    warnings: list[str] = []

    def worker_pids() -> set[int] | None:
        if it is None:  # before the first iter(loader): no worker yet
            return set()
        workers = getattr(it, "_workers", None)  # torch's multiprocessing iterator
        if workers is None:
            return None if getattr(loader, "num_workers", 0) else set()
        return {w.pid for w in workers if w.pid}

    it = None
    whole_run = ProcessSampler(worker_pids=worker_pids)  # from before the first batch: warm-up reads too
    whole_run.start()
    epochs = 1
    it = iter(loader)

    def next_batch():
        nonlocal it, epochs
        try:
            return next(it)
        except StopIteration:
            pass
        _set_epoch(loader, epochs)
        epochs += 1
        it = iter(loader)
        try:
            return next(it)
        except StopIteration:
            raise ValueError("the loader yields no batches (dataset smaller than one batch with drop_last?)") from None

    def fetch():
        batch = next_batch()
        while len(batch[1]) == 0:  # every sample of the batch skipped (on_error="skip"): keep waiting
            batch = next_batch()
        x, y = to_device(batch, dev, mean=mean, std=std, channels_last=channels_last)
        _synchronize(dev)  # the copy (non_blocking) is part of the wait
        return x, y

    sampler = ProcessSampler(worker_pids=worker_pids)
    gpu_sampler = None
    waits: list[float] = []
    computes: list[float] = []
    starts: list[float] = []
    num_samples = 0
    try:
        for _ in range(warmup):
            x, y = fetch()
            step(x, y)
        if dev.type == "cuda" and sample_gpu:
            gpu_sampler = GpuSampler(dev.index or 0)
            if not gpu_sampler.start():
                warnings.append(gpu_sampler.error or "GPU utilisation not sampled")
                gpu_sampler = None
        sampler.start()
        t_start = time.perf_counter()
        for _ in range(batches):
            t0 = time.perf_counter()
            x, y = fetch()
            t1 = time.perf_counter()
            t_compute = step(x, y)
            starts.append(t0 - t_start)
            waits.append(t1 - t0)
            computes.append(t_compute)
            num_samples += int(x.shape[0])
        seconds = time.perf_counter() - t_start
        cpu, io, memory, system = sampler.stop()
        _, io_whole, _, _ = whole_run.stop()
        if io is not None and io_whole is not None:
            io["read_bytes_with_warmup"] = io_whole["read_bytes"]
            io["rchar_with_warmup"] = io_whole["rchar"]
        gpu_stats = gpu_sampler.stop() if gpu_sampler else None
        gpu_sampler = None
    finally:
        if gpu_sampler is not None:
            gpu_sampler.stop()
        if shutdown:
            _shutdown_loader(loader, it)
        used_threads = torch.get_num_threads()
        torch.set_num_threads(threads_before)

    gpu = None
    gpu_util = None
    if dev.type == "cuda":
        gpu = {"name": torch.cuda.get_device_name(dev),
               "max_allocated_bytes": int(torch.cuda.max_memory_allocated(dev)), "nvml": gpu_stats}
        if gpu_stats:
            gpu_util = gpu_stats["util_mean"]
    total_wait, total_compute = sum(waits), sum(computes)
    stall = total_wait / (total_wait + total_compute) if total_wait + total_compute > 0 else 0.0
    if memory and memory["growth_flag"]:
        warnings.append(f"memory grew by {_fmt_bytes(memory['growth_bytes'])} during the run "
                        f"({_fmt_bytes(memory['total_rss_start_bytes'])} -> "
                        f"{_fmt_bytes(memory['total_rss_end_bytes'])})")
    if system and system.get("swap_used_end_bytes"):
        if system["swap_used_end_bytes"] > (system.get("swap_used_start_bytes") or 0) + MEMORY_GROWTH_FLAG_BYTES:
            warnings.append("swap use grew during the run: the machine is short of memory")
    cfg = dict(config or {})
    cfg.setdefault("model", model_name if compute_ms is None else None)
    cfg.setdefault("compute_ms", compute_ms)
    cfg.setdefault("warmup", warmup)
    cfg.setdefault("batches", batches)
    cfg.setdefault("channels_last", channels_last)
    cfg.setdefault("torch_threads", used_threads)
    cfg.setdefault("normalize", {"mean": list(mean) if mean else None, "std": list(std) if std else None})
    return RunReport(
        images_per_s=num_samples / seconds if seconds > 0 else 0.0, num_batches=len(waits), num_samples=num_samples,
        seconds=seconds, t_wait_s=TimingStats.of(waits), t_compute_s=TimingStats.of(computes), stall_share=stall,
        device=str(dev), timing=step.timing, gpu_util=gpu_util, gpu=gpu, cpu=cpu, io=io, memory=memory,
        system=system, config=cfg, batches={"t_start_s": starts, "t_wait_s": waits, "t_compute_s": computes},
        epochs=epochs, label=label, warnings=warnings)


_LOADER_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
#: make_loader / open_dataset defaults, left out of the printed make_loader(...) call.
_MAKE_LOADER_DEFAULTS = {"shuffle": True, "seed": 0, "drop_last": False, "pad": False, "train": False,
                         "decoder": "auto", "decode": True, "on_error": "raise", "cache": None}


def bench_source(source: str | os.PathLike, *, batch_size: int = 64, image_size: int | None = 224,
                 model: str = "tiny", device: str = "auto", compute_ms: float | None = None, warmup: int = 10,
                 batches: int = 100, cold: bool = False, evict_files: Sequence[str | os.PathLike] | None = None,
                 channels_last: bool = False, mean: Sequence[float] | None = DEFAULT_MEAN,
                 std: Sequence[float] | None = DEFAULT_STD, label: str | None = None, num_threads: int | None = None,
                 **loader_options: Any) -> RunReport:
    """Build ``make_loader(source, batch_size, image_size=..., **loader_options)`` and measure it.

    On a CPU device ``pin_memory`` defaults to False (pinning only helps copies to a GPU).

    Args:
        source: an image folder, a packed dataset (directory, manifest or URL).
        batch_size: images per batch.
        image_size: the loader's ``image_size`` (resize + centre crop; None keeps decoded sizes).
        model, device, compute_ms, warmup, batches, channels_last, mean, std, label, num_threads:
            see :func:`run_training_loop`.
        cold: evict the dataset's files (or ``evict_files``) from the page cache first.
        evict_files: the files to evict with ``cold`` (default: :func:`dataset_files` of ``source``).
        **loader_options: any other ``make_loader`` / ``open_dataset`` option.

    Returns:
        The :class:`RunReport`; ``config`` holds ``source``, ``source_format`` and every setting.
    """
    import torch

    from .loader import make_loader

    dev = select_device(device)
    opts = {k: v for k, v in loader_options.items()}
    if dev.type != "cuda" and opts.get("pin_memory") is None:
        opts["pin_memory"] = False
    cache = None
    if cold:
        files = list(evict_files) if evict_files is not None else dataset_files(source)
        _close_lmdb_envs(files)
        if not files:
            cache = {"files": 0, "bytes": 0, "ignored": None,
                     "message": f"{source}: no local files to evict (a URL?): --cold has no effect"}
        else:
            cache = evict_page_cache(files)
        if cache.get("message"):
            logger.warning("%s", cache["message"])
    loader = make_loader(source, batch_size, image_size=image_size, **opts)
    try:
        fmt = _source_format_of(loader, source)
        effective = {k: getattr(loader, k, opts.get(k)) for k in _LOADER_KNOBS}
        config = {"source": str(source), "source_format": fmt, "batch_size": batch_size, "image_size": image_size,
                  "device": str(dev), "cold": cold, "loader": {**{k: v for k, v in opts.items()}, **effective},
                  "num_dataset_samples": _len_or_none(getattr(loader, "dataset", None)),
                  "cpu_count": os.cpu_count(), "torch": torch.__version__, "python": sys.version.split()[0]}
        report = run_training_loop(loader, model=model, device=dev, compute_ms=compute_ms, warmup=warmup,
                                   batches=batches, channels_last=channels_last, mean=mean, std=std,
                                   config=config, label=label, num_threads=num_threads)
    finally:
        _shutdown_loader(loader, None)
        del loader
        gc.collect()
    report.cache = cache
    if cache and cache.get("message"):
        report.warnings.insert(0, cache["message"])
    n = report.config.get("num_dataset_samples")
    if cold and n and (warmup + batches) * batch_size > n:
        report.warnings.append(f"warm-up + measured batches ({(warmup + batches) * batch_size} images) exceed the "
                               f"dataset ({n}): later epochs read from the page cache, not the disk")
    return report


def _close_lmdb_envs(files: Sequence[str | os.PathLike]) -> int:
    """Close this process's LMDB environments on ``files`` (before evicting them).

    The LMDB reader keeps one memory-mapped environment per database and process; pages mapped
    by a live process cannot be evicted from the page cache, so after a run that read in this
    process (``num_workers=0``) a cold run would find the file still cached. An LMDB dataset
    object still alive in this process on these files cannot be used afterwards (open it again);
    :func:`bench_source` builds its own and drops it after the run. Returns how many were closed.
    """
    mod = sys.modules.get("shardfeed.readers.lmdb_io")
    if mod is None:  # no LMDB reader in this process: nothing is open
        return 0
    from .format import LMDB_DATA_NAME

    return mod.close_environments({Path(f).parent for f in files if Path(f).name == LMDB_DATA_NAME})


def _len_or_none(obj: Any) -> int | None:
    """The whole dataset's sample count (``num_samples``, all ranks), else ``len``."""
    n = getattr(obj, "num_samples", None)
    if isinstance(n, int):
        return n
    try:
        return len(obj)
    except Exception:
        return None


def _source_format_of(loader: Any, source: Any) -> str:
    ds = getattr(loader, "dataset", None)
    for obj in (ds, getattr(ds, "manifest", None)):
        for attr in ("source_format", "format"):
            value = getattr(obj, attr, None)
            if isinstance(value, str) and value in ("folder", "webdataset", "lmdb"):
                return value
    return detect_source_format(source)


# ---------------------------------------------------------------------------------------------
# verify: same samples? then before vs after


def _open_info(source: str | os.PathLike, **options: Any):
    from .dataset import open_dataset

    return open_dataset(source, **options)


def _class_map(ds: Any) -> dict[str, int]:
    for obj in (ds, getattr(ds, "manifest", None)):
        value = getattr(obj, "class_to_idx", None)
        if value:
            return dict(value)
    for obj in (ds, getattr(ds, "manifest", None)):
        value = getattr(obj, "classes", None)
        if value:
            return {c: i for i, c in enumerate(value)}
    return {}


def _skipped_of(ds: Any) -> list:
    m = getattr(ds, "manifest", None)
    return list(getattr(m, "skipped", None) or [])


def _iter_raw(ds: Any):
    """Every raw sample of a dataset opened with ``decode=False``, in the main process."""
    fn = getattr(ds, "iter_samples", None)
    if callable(fn):
        yield from fn()
        return
    if hasattr(ds, "__iter__"):
        yield from iter(ds)
        return
    for i in range(len(ds)):
        yield ds[i]


def check_same_samples(before: str | os.PathLike, after: str | os.PathLike, *, deep: bool = False,
                       **open_options: Any) -> dict:
    """Check that AFTER holds the same samples and classes as BEFORE.

    Always compares the sample counts and the class maps. ``deep`` also reads every raw sample
    of both (``open_dataset(..., decode=False)``), matches them by ``meta["path"]`` and compares
    their bytes (SHA-256) and labels.

    Returns:
        ``{"num_samples", "num_classes", "deep", "num_compared"}``.

    Raises:
        DatasetMismatchError: counts, class maps, paths, bytes or labels differ (the message names
            the first differences).
    """
    import hashlib

    opts = {k: v for k, v in open_options.items() if k in ("extensions",)}
    # the whole dataset in this process: one rank, no shuffle
    opts.update(rank=0, world_size=1, shuffle=False)
    ds_b = _open_info(before, decode=False, **opts)
    ds_a = _open_info(after, decode=False, **opts)
    try:
        nb, na = _len_or_none(ds_b), _len_or_none(ds_a)
        cb, ca = _class_map(ds_b), _class_map(ds_a)
        problems = []
        if cb != ca:
            only_b = sorted(set(cb) - set(ca))
            only_a = sorted(set(ca) - set(cb))
            moved = sorted(c for c in set(cb) & set(ca) if cb[c] != ca[c])
            parts = []
            if only_b:
                parts.append(f"only in BEFORE: {', '.join(only_b[:5])}")
            if only_a:
                parts.append(f"only in AFTER: {', '.join(only_a[:5])}")
            if moved:
                parts.append(f"other index: {', '.join(f'{c} ({cb[c]} vs {ca[c]})' for c in moved[:5])}")
            problems.append("the class maps differ (" + "; ".join(parts) + ")")
        if nb != na:
            msg = f"BEFORE holds {nb} samples, AFTER {na}"
            skipped = _skipped_of(ds_a)
            if skipped:
                msg += (f" (AFTER's manifest lists {len(skipped)} skipped file(s), e.g. {skipped[0].get('path')}: "
                        f"{skipped[0].get('reason')})")
            problems.append(msg)
        if problems:
            raise DatasetMismatchError(f"{after} does not hold the same samples as {before}: " + "; ".join(problems)
                                       + ". Repack it from this folder (shardfeed pack) before comparing")
        compared = 0
        if deep:
            seen: dict[str, tuple[bytes, int]] = {}
            dup_b = []
            for s in _iter_raw(ds_b):
                path = s.meta.get("path", s.key)
                if path in seen:
                    dup_b.append(path)
                seen[path] = (hashlib.sha256(bytes(s.data)).digest(), int(s.label))
            diffs: list[str] = []
            found: set[str] = set()
            for s in _iter_raw(ds_a):
                path = s.meta.get("path")
                if path is None or path not in seen:
                    diffs.append(f"{path or s.key}: in AFTER only")
                    continue
                if path in found:
                    diffs.append(f"{path}: twice in AFTER")
                found.add(path)
                digest, label = seen[path]
                if hashlib.sha256(bytes(s.data)).digest() != digest:
                    diffs.append(f"{path}: other bytes")
                elif int(s.label) != label:
                    diffs.append(f"{path}: label {s.label} in AFTER, {label} in BEFORE")
                compared += 1
            missing = sorted(set(seen) - found)
            diffs += [f"{p}: missing in AFTER" for p in missing]
            if diffs:
                raise DatasetMismatchError(f"{after} does not hold the same samples as {before} ({len(diffs)} "
                                           f"difference(s)): " + "; ".join(diffs[:5])
                                           + ("; ..." if len(diffs) > 5 else "")
                                           + ". Repack it from this folder (shardfeed pack) before comparing")
        return {"num_samples": nb, "num_classes": len(cb), "deep": deep, "num_compared": compared}
    finally:
        for ds in (ds_b, ds_a):
            close = getattr(ds, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()
        del ds_b, ds_a
        gc.collect()


def _run_in_child(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a short-lived child process (fork where available); re-raises its error."""
    import concurrent.futures
    import multiprocessing as mp

    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context(method)) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def _median_run(runs: Sequence[RunReport]) -> RunReport:
    ordered = sorted(runs, key=lambda r: r.images_per_s)
    return ordered[(len(ordered) - 1) // 2]


def compare_sources(before: str | os.PathLike, after: str | os.PathLike, *, repeats: int = 1, cold: bool = False,
                    deep: bool = False, check: bool = True,
                    progress: Callable[[str], None] | None = None, **bench_options: Any) -> dict:
    """``verify``: check AFTER against BEFORE, then measure both with the same loop, alternately.

    Round ``r`` runs BEFORE then AFTER when ``r`` is even, AFTER then BEFORE when odd, so drift
    (thermal, page cache, other load) does not favour one side. With ``cold`` the files of *both*
    datasets are evicted before every run.

    Args:
        before, after: the original image folder and the packed dataset (any two sources).
        repeats: rounds (≥ 1); the reported runs are each side's median by images/s.
        cold: evict the page cache before each run.
        deep: compare every sample's bytes in the check.
        check: run :func:`check_same_samples` first.
        progress: called with a line of text before each run.
        **bench_options: :func:`bench_source` options (model, device, batch size, loader knobs).

    Returns:
        ``{"before": run, "after": run, "speedup", "stall_share_before", "stall_share_after",
        "check", "runs": [run, ...]}`` with runs as JSON dicts; ``speedup`` = after images/s ÷
        before images/s.

    Raises:
        DatasetMismatchError: the check failed (nothing is measured).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    checked = None
    if check:
        # with cold runs, check in a child process: readers that map files (LMDB) keep what they
        # mapped while the process lives, and mapped pages cannot be evicted from the page cache
        checked = _run_in_child(check_same_samples, before, after, deep=deep) if cold else \
            check_same_samples(before, after, deep=deep)
    evict = None
    if cold:
        evict = dataset_files(before) + dataset_files(after)
    runs: list[RunReport] = []
    for r in range(repeats):
        order = (("before", before), ("after", after)) if r % 2 == 0 else (("after", after), ("before", before))
        for side, src in order:
            if progress:
                progress(f"round {r + 1}/{repeats}: {side} ({src})")
            rep = bench_source(src, cold=cold, evict_files=evict, label=side, **bench_options)
            rep.config["round"] = r
            runs.append(rep)
    best_b = _median_run([x for x in runs if x.label == "before"])
    best_a = _median_run([x for x in runs if x.label == "after"])
    speedup = best_a.images_per_s / best_b.images_per_s if best_b.images_per_s > 0 else float("inf")
    return {"before": best_b, "after": best_a, "speedup": speedup, "stall_share_before": best_b.stall_share,
            "stall_share_after": best_a.stall_share, "check": checked, "repeats": repeats, "cold": cold,
            "runs": runs}


# ---------------------------------------------------------------------------------------------
# tune


def make_loader_call(source: str | os.PathLike, batch_size: int, options: dict) -> str:
    """A ready-to-paste ``make_loader(...)`` call for ``options``."""
    args = [repr(str(source)), f"batch_size={batch_size}"]
    args += [f"{k}={v!r}" for k, v in options.items()]
    return "make_loader(" + ", ".join(args) + ")"


def _worker_counts(max_workers: int) -> list[int]:
    counts = [0, 1, 2]
    n = 4
    while n <= max_workers:
        counts.append(n)
        n *= 2
    return [c for c in counts if c <= max_workers]


def _fs_free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _on_tmpfs(path: Path) -> bool:
    text = _read_text("/proc/mounts") or ""
    best, fstype = "", None
    rp = str(path.resolve())
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        if (rp == parts[1] or rp.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) >= len(best):
            best, fstype = parts[1], parts[2]
    return fstype in ("tmpfs", "ramfs")


def _storage_advice(source: str | os.PathLike) -> list[str]:
    """Where the data should live: ``cache="memory"``, ``shardfeed stage`` to /dev/shm, a local disk."""
    files = dataset_files(source)
    if not files:
        return []
    size = sum(f.stat().st_size for f in files)
    avail = _meminfo().get("MemAvailable")
    packed = detect_source_format(source) != "folder"
    advice = []
    if avail and size < 0.5 * avail:
        advice.append(f"the dataset ({_fmt_bytes(size)}) fits comfortably in RAM ({_fmt_bytes(avail)} available): "
                      "cache='memory' keeps its bytes there after one read (per process)")
    shm_free = _fs_free_bytes("/dev/shm")
    src = Path(str(source))
    if shm_free and size * 1.5 < shm_free and not _on_tmpfs(src):
        name = src.resolve().name or "dataset"
        how = (f"`shardfeed stage {source} /dev/shm/{name}`" if packed else
               f"pack it (`shardfeed pack {source} OUT`), then `shardfeed stage OUT /dev/shm/{name}`")
        advice.append(f"/dev/shm has room ({_fmt_bytes(shm_free)} free): {how} puts it in RAM once for every "
                      "process and rank of the machine")
    elif avail and size >= 0.5 * avail:
        advice.append(f"the dataset ({_fmt_bytes(size)}) does not fit comfortably in RAM: "
                      + ("stage it to the fastest local disk (`shardfeed stage`)" if packed else
                         "pack it (`shardfeed pack`, sequential reads) and stage it to the fastest local disk "
                         "(`shardfeed stage`)"))
    return advice


def tune_loader(source: str | os.PathLike, *, budget_s: float = 300, batch_size: int = 64,
                image_size: int | None = 224, model: str = "tiny", device: str = "auto",
                compute_ms: float | None = None, warmup: int = 5, batches: int = 30, max_workers: int | None = None,
                min_gain: float = 0.05, channels_last: bool = False, num_threads: int | None = None,
                cold: bool = False, progress: Callable[[str], None] | None = None, **loader_options: Any) -> dict:
    """Sweep the ``DataLoader`` knobs one at a time, the way practitioners do by hand.

    1. ``num_workers``: 0, 1, 2, 4, 8, … up to ``max_workers`` (default 2 × CPU count); the sweep
       stops after two counts in a row that gain less than ``min_gain`` over the best.
    2. ``pin_memory`` (with non-blocking copies) on and off — CUDA only.
    3. ``prefetch_factor`` 2 and 4 (with workers).
    4. ``persistent_workers`` on and off (with workers; it matters at epoch boundaries).

    Each step keeps the best setting so far; another setting replaces it only when it is at least
    ``min_gain`` faster (run-to-run noise is a few percent, and fewer workers cost less memory),
    so the recommendation never rests on a 1 % difference. A trial is skipped when the time
    left in ``budget_s`` is less than the longest trial so far.
    With ``cold``, every trial starts with the dataset's files evicted from the page cache (as
    :func:`bench_source` does): the knobs for a dataset that does not stay in memory.

    Returns:
        ``{"trials": [...], "best": {...}, "call": "make_loader(...)", "warnings": [...],
        "advice": [...], "skipped": [...], "seconds"}``; each trial is
        ``{"step", "options", "images_per_s", "stall_share", "seconds", "report"}``.
    """
    import torch

    t0 = time.perf_counter()
    dev = select_device(device)
    cpu = os.cpu_count() or 1
    max_workers = max_workers if max_workers is not None else 2 * cpu
    base = dict(loader_options)
    for k in _LOADER_KNOBS:
        base.pop(k, None)
    best: dict[str, Any] = {"num_workers": 0, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": True}
    trials: list[dict] = []
    skipped: list[str] = []
    warnings: list[str] = []
    longest = [0.0]

    def trial(step: str, options: dict) -> dict | None:
        elapsed = time.perf_counter() - t0
        if trials and elapsed + longest[0] > budget_s:
            skipped.append(f"{step} {_knobs_text(options)}")
            return None
        if progress:
            progress(f"{step}: {_knobs_text(options)}")
        opts = dict(options)
        ts = time.perf_counter()
        rep = bench_source(source, batch_size=batch_size, image_size=image_size, model=model, device=dev,
                           compute_ms=compute_ms, warmup=warmup, batches=batches, label=step,
                           channels_last=channels_last, num_threads=num_threads, cold=cold, **base, **opts)
        dur = time.perf_counter() - ts
        longest[0] = max(longest[0], dur)
        rec = {"step": step, "options": dict(options), "images_per_s": rep.images_per_s,
               "stall_share": rep.stall_share, "seconds": dur, "report": rep}
        trials.append(rec)
        return rec

    # 1. num_workers
    best_rec = None
    misses = 0
    by_workers: list[dict] = []
    for w in _worker_counts(max_workers):
        rec = trial("num_workers", {**best, "num_workers": w, "pin_memory": dev.type == "cuda"})
        if rec is None:
            break
        by_workers.append(rec)
        if best_rec is None or rec["images_per_s"] > best_rec["images_per_s"] * (1 + min_gain):
            best_rec, misses = rec, 0
        else:  # within noise of fewer workers: keep those (fewer processes, less memory)
            misses += 1
            if misses >= 2:
                break
    if best_rec is None:
        raise ValueError(f"budget_s={budget_s} left no time for a single trial")
    best = dict(best_rec["options"])
    if by_workers and by_workers[-1]["options"]["num_workers"] > 1:
        plateau = None
        for prev, cur in zip(by_workers, by_workers[1:]):
            if prev["options"]["num_workers"] >= 1 and cur["images_per_s"] < prev["images_per_s"] * (1 + min_gain):
                plateau = (prev, cur)
                break
        if plateau:
            p, c = plateau
            warnings.append(f"more workers stop helping beyond {p['options']['num_workers']}: "
                            f"{p['options']['num_workers']} -> {c['options']['num_workers']} workers gave "
                            f"{p['images_per_s']:.0f} -> {c['images_per_s']:.0f} images/s "
                            f"({cpu} CPU core(s); the bottleneck is elsewhere: CPU, storage or the step)")
    def try_knob(knob: str, value) -> None:
        """Run a trial with one knob changed; keep it only for a gain of at least ``min_gain``."""
        nonlocal best, best_rec
        other = {**best, knob: value}
        rec = trial(knob, other)
        if rec and rec["images_per_s"] > best_rec["images_per_s"] * (1 + min_gain):
            best_rec, best = rec, other

    # 2. pin_memory
    if dev.type == "cuda":
        try_knob("pin_memory", not best["pin_memory"])
    else:
        skipped.append("pin_memory (no CUDA device: pinning only speeds up copies to a GPU)")
    # 3. prefetch_factor, 4. persistent_workers
    if best["num_workers"] > 0:
        for pf in (2, 4):
            if pf != best["prefetch_factor"]:
                try_knob("prefetch_factor", pf)
        try_knob("persistent_workers", not best["persistent_workers"])
    else:
        skipped.append("prefetch_factor, persistent_workers (they apply to worker processes; the best was 0)")
    if best_rec["stall_share"] < 0.05:
        warnings.append(f"the best configuration leaves a data stall of {best_rec['stall_share']:.0%}: the step, "
                        "not the loader, sets the pace")
    if best["num_workers"] == 0:
        best = {"num_workers": 0, "pin_memory": best["pin_memory"]}
    extra = {k: v for k, v in loader_options.items()
             if k not in _LOADER_KNOBS and v is not None and _MAKE_LOADER_DEFAULTS.get(k, object()) != v}
    call_opts = {**best, **({"image_size": image_size} if image_size else {}), **extra}
    return {"source": str(source), "trials": trials, "best": best_rec, "best_options": best,
            "call": make_loader_call(source, batch_size, call_opts), "warnings": warnings,
            "advice": _storage_advice(source), "skipped": skipped, "seconds": time.perf_counter() - t0,
            "budget_s": budget_s, "device": str(dev), "torch": torch.__version__}


def _knobs_text(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


# ---------------------------------------------------------------------------------------------
# tables and plots


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> str:
    """Align ``rows`` in columns (first column left-aligned, the others right-aligned)."""
    all_rows = [list(header)] if header else []
    all_rows += [list(r) for r in rows]
    if not all_rows:
        return ""
    ncol = max(len(r) for r in all_rows)
    for r in all_rows:
        r += [""] * (ncol - len(r))
    widths = [max(len(r[i]) for r in all_rows) for i in range(ncol)]
    lines = []
    for j, r in enumerate(all_rows):
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, ncol)]
        lines.append("  ".join(cells).rstrip())
        if header and j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _report_rows(r: RunReport) -> list[tuple[str, str]]:
    cfg = r.config
    rows = [
        ("source", f"{cfg.get('source_format', '?')}: {cfg.get('source', '?')}"),
        ("images/s", f"{r.images_per_s:.1f}"),
        ("batches x images", f"{r.num_batches} x {cfg.get('batch_size', '?')} = {r.num_samples}"),
        ("measured time", f"{r.seconds:.2f} s"),
        ("wait for data, ms (mean/p50/p95)", f"{_ms(r.t_wait_s.mean)} / {_ms(r.t_wait_s.p50)} / {_ms(r.t_wait_s.p95)}"),
        ("compute, ms (mean/p50/p95)",
         f"{_ms(r.t_compute_s.mean)} / {_ms(r.t_compute_s.p50)} / {_ms(r.t_compute_s.p95)}"),
        ("data stall", f"{r.stall_share:.0%}"),
        ("GPU utilisation", "n/a (not CUDA)" if not r.device.startswith("cuda")
         else (f"{r.gpu_util:.0%}" if r.gpu_util is not None else "n/a (no NVML)")),
    ]
    if r.gpu:
        nv = r.gpu.get("nvml") or {}
        rows.append(("GPU memory (NVML max / torch max)",
                     f"{_fmt_bytes(nv.get('memory_used_max_bytes'))} / {_fmt_bytes(r.gpu.get('max_allocated_bytes'))}"))
    if r.cpu:
        nw = (cfg.get("loader") or {}).get("num_workers")
        rows.append(("CPU, loader workers", f"{r.cpu['workers_cores']:.2f} cores ({nw} workers)"))
        rows.append(("CPU, main process", f"{r.cpu['main_cores']:.2f} cores"))
        rows.append(("CPU, all of ours", f"{r.cpu['util_share']:.0%} of {r.cpu['cpu_count']} cores"))
    if r.io:
        rows.append(("read from disk", f"{_fmt_bytes(r.io['read_bytes_per_s'])}/s"
                     + (f" ({_fmt_bytes(r.io['read_bytes_with_warmup'])} incl. warm-up)"
                        if r.io.get("read_bytes_with_warmup") is not None else "")))
        rows.append(("read calls (incl. page cache)", f"{_fmt_bytes(r.io['rchar_per_s'])}/s"))
    if r.memory:
        m = r.memory
        rows.append(("memory, main (RSS start -> end)",
                     f"{_fmt_bytes(m['main_rss_start_bytes'])} -> {_fmt_bytes(m['main_rss_end_bytes'])}"))
        rows.append(("memory, workers (RSS start -> end)",
                     f"{_fmt_bytes(m['workers_rss_start_bytes'])} -> {_fmt_bytes(m['workers_rss_end_bytes'])}"))
        rows.append(("memory growth", ("YES " if m["growth_flag"] else "no, ") + f"{_fmt_bytes(m['growth_bytes'])}"))
    if r.system:
        rows.append(("swap in use", _fmt_bytes(r.system.get("swap_used_end_bytes"))))
        if r.system.get("iowait_share") is not None:
            rows.append(("CPU time in I/O wait (machine)", f"{r.system['iowait_share']:.1%}"))
    if r.cache is None:
        rows.append(("page cache", "warm (not evicted)"))
    else:
        c = r.cache
        after, total = c.get("cached_bytes_after"), c.get("bytes") or 0
        if not c.get("files"):
            state = "not evicted (no local files)"
        elif after is None or not total:
            state = "evicted (unchecked)"
        elif c.get("ignored"):
            state = f"NOT evicted, {after / total:.0%} left"
        else:
            state = f"evicted, {after / total:.0%} left"
        rows.append(("page cache", f"{state} of {c.get('files', 0)} files, {_fmt_bytes(total)}"))
    rows.append(("device", f"{r.device} ({r.timing})"))
    return rows


def format_report(report: RunReport) -> str:
    """The aligned table of one run (``bench``)."""
    text = format_table(_report_rows(report), header=("", report.label or "run"))
    if report.warnings:
        text += "\n" + "\n".join(f"warning: {w}" for w in report.warnings)
    return text


def comparison_headline(speedup: float, stall_before: float, stall_after: float) -> str:
    """``"2.9x faster; data stall 71% -> 6%"`` (or ``"1.3x slower; ..."``)."""
    if 0.95 <= speedup < 1.05:
        head = f"no clear difference ({speedup:.2f}x)"
    elif speedup >= 1:
        head = f"{speedup:.1f}x faster"
    elif speedup > 0:
        head = f"{1 / speedup:.1f}x slower ({speedup:.2f}x)"
    else:
        head = "no throughput"
    return f"{head}; data stall {stall_before:.0%} -> {stall_after:.0%}"


def format_comparison(result: dict) -> str:
    """Both median runs side by side, then the headline (``verify``)."""
    b, a = result["before"], result["after"]
    rb, ra = _report_rows(b), _report_rows(a)
    rows = [(name, vb, va) for (name, vb), (_, va) in zip(rb, ra)]
    text = format_table(rows, header=("", "BEFORE", "AFTER"))
    warnings = [f"before: {w}" for w in b.warnings] + [f"after: {w}" for w in a.warnings]
    if warnings:
        text += "\n" + "\n".join(f"warning: {w}" for w in dict.fromkeys(warnings))
    if result.get("repeats", 1) > 1:
        text += (f"\n(median of {result['repeats']} alternating rounds; images/s per run: before "
                 + ", ".join(f"{r.images_per_s:.0f}" for r in result["runs"] if r.label == "before")
                 + "; after " + ", ".join(f"{r.images_per_s:.0f}" for r in result["runs"] if r.label == "after") + ")")
    text += "\n" + comparison_headline(result["speedup"], result["stall_share_before"], result["stall_share_after"])
    return text


def plot_runs(runs: Sequence[RunReport], path: str | os.PathLike) -> Path:
    """Draw per-batch wait and compute over time, one panel per run, into a PNG.

    Each batch is a bar from its start time: the wait for data (bottom), then the compute.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'shardfeed[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'shardfeed[plot]' "
                          "(or pip install matplotlib)") from None
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.6 * len(runs)), squeeze=False, sharex=True)
    for ax, r in zip(axes[:, 0], runs):
        starts = r.batches.get("t_start_s", [])
        waits = [w * 1000 for w in r.batches.get("t_wait_s", [])]
        comps = [c * 1000 for c in r.batches.get("t_compute_s", [])]
        ax.plot(starts, waits, drawstyle="steps-post", label="wait for data (ms)", color="tab:red")
        ax.plot(starts, comps, drawstyle="steps-post", label="compute (ms)", color="tab:blue")
        ax.set_title(f"{r.label or 'run'}: {r.config.get('source_format', '')} {r.config.get('source', '')} - "
                     f"{r.images_per_s:.0f} images/s, data stall {r.stall_share:.0%}", fontsize=9)
        ax.set_ylabel("ms per batch")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time since the first measured batch (s)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
