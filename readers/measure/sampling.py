"""Process and GPU sampling: what the machine did during a measured window.

:class:`ProcessSampler` reads, through psutil, the main process and its children (the
``DataLoader`` workers): CPU time, bytes read and resident memory; and ``/proc`` (Linux; None
elsewhere) for the machine: swap, I/O wait and the CPU time of other processes.
:class:`GpuSampler` samples GPU utilisation and memory from NVML (``nvidia-ml-py``, the ``gpu``
extra) in a background thread every :data:`GPU_SAMPLE_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import threading
import time
from typing import Callable, Iterable

from ..background import start_thread
from .report import percentile

__all__ = ["GPU_SAMPLE_INTERVAL_S", "MEMORY_GROWTH_FLAG_BYTES", "MEMORY_GROWTH_FLAG_SHARE", "ProcessSampler",
           "GpuSampler", "read_text", "meminfo", "cpu_times", "others_cpu"]

#: How often the NVML thread samples GPU utilisation and memory, seconds.
GPU_SAMPLE_INTERVAL_S = 0.1
#: RSS growth (main + workers) over the measured window flagged when above both of these (a first
#: run in a process grows by tens of MB as allocators and shared-memory batch buffers warm up).
MEMORY_GROWTH_FLAG_BYTES = 128 * 1024 * 1024
MEMORY_GROWTH_FLAG_SHARE = 0.20

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_text(path: str) -> str | None:
    """The text of a (``/proc``) file; None when it cannot be read."""
    try:
        with open(path, "r") as f:
            return f.read()
    except OSError:
        return None


def _process(pid: int | str):
    """The psutil ``Process`` of ``pid``; None when it is gone (or psutil cannot see it)."""
    import psutil

    try:
        return psutil.Process(int(pid))
    except (psutil.Error, ValueError):
        return None


def _proc_stat(pid: int | str) -> tuple[int, float, float] | None:
    """(ppid, own CPU s, reaped children's CPU s) of ``pid`` (psutil); None if gone."""
    import psutil

    proc = _process(pid)
    if proc is None:
        return None
    try:
        with proc.oneshot():
            ct = proc.cpu_times()
            return proc.ppid(), ct.user + ct.system, ct.children_user + ct.children_system
    except psutil.Error:
        return None


def _proc_io(pid: int | str) -> dict | None:
    """``{"rchar", "read_bytes"}`` of ``pid`` (psutil ``io_counters``: ``read_chars``, ``read_bytes``);
    None when unreadable (another user's process, or a platform without it)."""
    import psutil

    proc = _process(pid)
    if proc is None:
        return None
    try:
        io = proc.io_counters()
    except (psutil.Error, AttributeError, NotImplementedError):
        return None
    rchar = getattr(io, "read_chars", None)
    return None if rchar is None else {"rchar": int(rchar), "read_bytes": int(io.read_bytes)}


def _proc_rss(pid: int | str) -> int | None:
    import psutil

    proc = _process(pid)
    if proc is None:
        return None
    try:
        return int(proc.memory_info().rss)
    except psutil.Error:
        return None


def _children(pid: int) -> list[int]:
    """PIDs of the live (or not yet reaped) children of ``pid`` (psutil)."""
    import psutil

    proc = _process(pid)
    if proc is None:
        return []
    try:
        return sorted(c.pid for c in proc.children())
    except psutil.Error:
        return []


def meminfo() -> dict:
    """``/proc/meminfo`` as ``{key: bytes}`` (kB values converted); {} off Linux."""
    text = read_text("/proc/meminfo") or ""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def cpu_times() -> list[int] | None:
    """The machine's CPU ticks from ``/proc/stat`` (user nice system idle iowait ...); None off Linux."""
    text = read_text("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    return [int(x) for x in text.splitlines()[0].split()[1:]]


def others_cpu(ticks_start: list | None, ticks_end: list | None, ours_s: float, wall_s: float,
               cpu_count: int) -> dict:
    """CPU time other processes took during a window: ``{"others_s", "others_share"}``.

    The machine's busy time (``/proc/stat``: user, nice, system, irq, softirq and steal ticks,
    i.e. all but idle and I/O wait) minus ``ours_s``, and that as a share of ``wall_s x cpu_count``.
    Kernel threads count as others (the write-back of dirty pages among them); time another
    virtual machine stole from this one counts too. None values when ``/proc/stat`` is unreadable.

    Args:
        ticks_start, ticks_end: :func:`cpu_times` at the window's start and end.
        ours_s: CPU seconds of the measured processes (main + loader workers) in the window.
        wall_s: the window's wall time, s.
        cpu_count: cores of the machine.
    """
    if not ticks_start or not ticks_end or wall_s <= 0:
        return {"others_s": None, "others_share": None}
    delta = [y - x for x, y in zip(ticks_start, ticks_end)]
    busy_ticks = sum(delta[:8]) - delta[3] - (delta[4] if len(delta) > 4 else 0)
    others_s = max(0.0, busy_ticks / _CLK_TCK - ours_s)
    return {"others_s": others_s, "others_share": min(1.0, others_s / (wall_s * max(cpu_count, 1)))}


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
    """Reads (psutil) the main process and its children (the ``DataLoader`` workers).

    Call :meth:`start` at the beginning and :meth:`stop` at the end of the measured window;
    :meth:`stop` returns ``(cpu, io, memory, system)`` dicts for :class:`RunReport` (None where a
    figure cannot be read here). Finished workers are counted through the parent's reaped-children
    CPU time (psutil's ``children_user`` + ``children_system``, the kernel's ``cutime``/``cstime``)
    and I/O accounting (the kernel adds a reaped child's figures to its parent).

    Args:
        pid: the main process (default: this one).
        worker_pids: returns the PIDs of the loader's live worker processes (None: every child of
            ``pid`` counts as a worker).
    """

    def __init__(self, pid: int | None = None, worker_pids: Callable[[], Iterable[int] | None] | None = None):
        self.pid = pid or os.getpid()
        self.worker_pids = worker_pids
        self.available = _process(self.pid) is not None
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
        mem = meminfo()
        swap = mem["SwapTotal"] - mem["SwapFree"] if "SwapTotal" in mem and "SwapFree" in mem else None
        return _Snapshot(now, st[1] if st else None, st[2] if st else None, child_cpu, _proc_io(self.pid),
                         child_io, _proc_rss(self.pid), child_rss, swap, cpu_times())

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
            cpu.update(others_cpu(a.cpu_times, b.cpu_times, main_s + workers_s, wall, ncpu))
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
        self._thread = start_thread(self._loop, name="shardfeed-nvml", stop=self._stop.set)
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
        return self.stats()

    def stats(self) -> dict | None:
        """The figures so far (see :meth:`stop`), sampling going on; None when nothing was sampled."""
        util, mem = list(self._util), list(self._mem)
        if not util or not mem:
            return None
        return {"util_mean": statistics.fmean(util) / 100, "util_p50": percentile(util, 50) / 100,
                "util_samples": len(util), "memory_used_max_bytes": max(mem),
                "memory_total_bytes": self._mem_total}
