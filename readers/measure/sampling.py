"""Process and GPU sampling: what the machine did during a measured window (``bench``, ``verify``, ``watch``).

:class:`ProcessSampler` reads, through psutil, the main process and its ``DataLoader`` workers
(CPU time, scheduler state, bytes read, resident memory) and the machine (CPU time by kind, I/O
wait, the CPU time of other processes, available memory, swap), at the two ends of a window and,
with an interval, from a background thread in between.
:class:`GpuSampler` samples GPU utilisation and memory from NVML (``nvidia-ml-py``, the ``gpu``
extra) in a background thread every :data:`GPU_SAMPLE_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from typing import Callable, Iterable

from ..background import start_thread
from .report import percentile

__all__ = ["GPU_SAMPLE_INTERVAL_S", "DEFAULT_SAMPLE_INTERVAL_S", "MEMORY_GROWTH_FLAG_BYTES", "MEMORY_GROWTH_FLAG_SHARE",
           "ProcessSampler", "ProcTrack", "GpuSampler", "machine_cpu", "others_cpu"]

#: How often the NVML thread samples GPU utilisation and memory, seconds.
GPU_SAMPLE_INTERVAL_S = 0.1
#: RSS growth (main + workers) over the measured window flagged when above both of these (a first
#: run in a process grows by tens of MB as allocators and shared-memory batch buffers warm up).
MEMORY_GROWTH_FLAG_BYTES = 128 * 1024 * 1024
MEMORY_GROWTH_FLAG_SHARE = 0.20

#: Seconds between two background samples of CPU time and scheduler state (``watch``).
DEFAULT_SAMPLE_INTERVAL_S = 0.05
#: Memory, context switches and I/O counters are read every this many background samples; the list
#: of child processes (when the workers are not known) and swap every ``_SLOW_EVERY``.
_FULL_EVERY = 10
_SLOW_EVERY = 20
#: Worker processes followed at most by one sampler (non-persistent workers are new processes every epoch).
_MAX_TRACKED_PROCESSES = 1024


def _process(pid: int | str):
    """The psutil ``Process`` of ``pid``; None when it is gone (or psutil cannot see it)."""
    import psutil

    try:
        return psutil.Process(int(pid))
    except (psutil.Error, ValueError):
        return None


def _runqueue_wait_s(pid: int) -> float | None:
    """Seconds ``pid`` has been runnable but waiting for a core (``/proc/PID/schedstat``); None off Linux."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read(256).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class ProcTrack:
    """What a sampler saw of one process: first and last CPU time, I/O and memory; state counts.

    Args:
        proc: its psutil ``Process``.
        now: ``time.perf_counter()`` when it was found.
        born: it started inside the measured window (its whole CPU time and I/O belong to the window).
    """

    __slots__ = ("proc", "t0", "t1", "cpu0", "cpu1", "kids0", "kids1", "rchar0", "rchar1", "rbytes0", "rbytes1",
                 "states", "running", "vol0", "vol1", "rss0", "rss", "runq0", "runq1", "disk_sleep", "born", "alive")

    def __init__(self, proc, now: float, born: bool = False):
        self.proc = proc
        self.t0 = self.t1 = now
        self.cpu0 = self.cpu1 = self.kids0 = self.kids1 = None
        self.rchar0 = self.rchar1 = self.rbytes0 = self.rbytes1 = None
        self.vol0 = self.vol1 = self.runq0 = self.runq1 = self.rss0 = None
        self.states = self.disk_sleep = 0
        self.running = 0
        self.rss = 0
        self.born = born
        self.alive = True

    def sample(self, now: float, full: bool = True) -> bool:
        """One sample: CPU time and state (one read of ``/proc/PID/stat``); with ``full`` also
        memory, context switches and I/O counters. The first sample of a process is always full.
        False (and :attr:`alive` False) when the process is gone."""
        import psutil

        full = full or self.cpu0 is None
        ioc = None
        try:
            with self.proc.oneshot():
                ct = self.proc.cpu_times()
                status = self.proc.status()
                if full:
                    rss = self.proc.memory_info().rss
                    vol = self.proc.num_ctx_switches().voluntary
                    try:
                        ioc = self.proc.io_counters()
                    except (psutil.AccessDenied, AttributeError, NotImplementedError):
                        ioc = None
        except (psutil.Error, OSError):
            self.alive = False
            return False
        cpu, kids = ct.user + ct.system, getattr(ct, "children_user", 0.0) + getattr(ct, "children_system", 0.0)
        rchar = getattr(ioc, "read_chars", None)  # every read(), page-cache hits included (Linux)
        runq = _runqueue_wait_s(self.proc.pid) if full else None
        if self.cpu0 is None:
            self.runq0, self.rss0 = runq, rss
            self.cpu0, self.kids0, self.t0 = cpu, kids, now
            self.vol0 = vol
            if rchar is not None:
                self.rchar0, self.rbytes0 = rchar, ioc.read_bytes
        self.cpu1, self.kids1, self.t1 = cpu, kids, now
        if full:
            self.vol1, self.rss, self.runq1 = vol, rss, runq if runq is not None else self.runq1
            if rchar is not None:
                self.rchar1, self.rbytes1 = rchar, ioc.read_bytes
        self.states += 1
        self.running += status == psutil.STATUS_RUNNING
        self.disk_sleep += status == psutil.STATUS_DISK_SLEEP
        return True

    def figures(self) -> dict:
        """``{"pid", "watched_s", "cpu_s", "cpu_busy_share", "cpu_demand_share", "runqueue_share",
        "disk_sleep_share", "read_chars", "read_bytes", "voluntary_ctx_switches", "rss_bytes"}`` between
        its first and last sample (seconds, shares in [0, 1], bytes; None where not readable)."""
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

    def in_window(self, first: str, last: str) -> float:
        """A worker's share of a counter (``cpu``, ``rchar``, ``rbytes``) in the window: last minus
        first (from 0 when :attr:`born`); a process gone by the last sample gives minus its first
        reading, its whole life being in the parent's reaped-children figures."""
        base = 0 if self.born else getattr(self, first)
        if base is None:
            return 0
        if not self.alive:
            return -base
        end = getattr(self, last)
        return 0 if end is None else end - base


def machine_cpu(start, end) -> dict:
    """The machine's CPU between two ``psutil.cpu_times()`` readings: ``{"busy_s", "cpu_busy_share",
    "iowait_share"}``. Busy is all but idle and I/O wait (user, nice, system, irq, softirq, steal;
    guest time is in user already), in CPU seconds summed over the cores; shares of all CPU time
    (None when no time passed)."""
    d = {k: getattr(end, k, 0.0) - getattr(start, k, 0.0) for k in end._fields}
    total = sum(d.values()) - d.get("guest", 0.0) - d.get("guest_nice", 0.0)
    idle, iowait = d.get("idle", 0.0), d.get("iowait", 0.0)
    return {"busy_s": total - idle - iowait,
            "cpu_busy_share": (1 - (idle + iowait) / total) if total > 0 else None,
            "iowait_share": iowait / total if total > 0 else None}


def others_cpu(start, end, ours_s: float, wall_s: float, cpu_count: int) -> dict:
    """CPU time other processes took during a window: ``{"others_s", "others_share"}``.

    The machine's busy time (:func:`machine_cpu`) minus ``ours_s``, and that as a share of
    ``wall_s x cpu_count``. Kernel threads count as others (the write-back of dirty pages among
    them); time another virtual machine stole from this one counts too. None values when a reading
    is missing.

    Args:
        start, end: ``psutil.cpu_times()`` at the window's start and end.
        ours_s: CPU seconds of the measured processes (main + loader workers) in the window.
        wall_s: the window's wall time, s.
        cpu_count: cores of the machine.
    """
    if start is None or end is None or wall_s <= 0:
        return {"others_s": None, "others_share": None}
    others_s = max(0.0, machine_cpu(start, end)["busy_s"] - ours_s)
    return {"others_s": others_s, "others_share": min(1.0, others_s / (wall_s * max(cpu_count, 1)))}


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


class ProcessSampler:
    """Reads (psutil) a main process, its ``DataLoader`` workers and the machine over a window.

    :meth:`start` opens the window and :meth:`stop` closes it. With ``interval_s`` a background
    thread samples every ``interval_s`` seconds in between: each process's scheduler state
    (running or runnable, waiting on a disk), its run-queue wait, the machine's lowest available
    memory and highest swap; :meth:`snapshot` gives those figures at any time (``watch``). Without
    it only the two ends are read (``bench``, ``verify``).

    :meth:`stop` returns ``(cpu, io, memory, system)`` dicts for :class:`RunReport` (None where a
    figure cannot be read here). Finished workers are counted through the main process's
    reaped-children CPU time (psutil's ``children_user`` + ``children_system``) and I/O (the kernel
    adds a reaped child's figures to its parent's); a worker started inside the window counts from zero.

    Args:
        pid: the main process (default: this one).
        worker_pids: returns the PIDs of the loader's worker processes (None from it: the workers
            are every child of ``pid``); None: every child of ``pid`` counts as a worker.
        interval_s: seconds between background samples; None: no background thread.
        gpu_index: a CUDA device whose utilisation and memory a :class:`GpuSampler` samples meanwhile
            (background mode; None: none). When NVML is unusable, :attr:`error` says why.
    """

    def __init__(self, pid: int | None = None, worker_pids: Callable[[], Iterable[int] | None] | None = None,
                 interval_s: float | None = None, gpu_index: int | None = None):
        self.pid = pid or os.getpid()
        self.worker_pids = worker_pids
        self.interval_s = interval_s
        self.available = _process(self.pid) is not None
        self.main: ProcTrack | None = None
        self.workers: dict[int, ProcTrack] = {}
        self.children_mode = False  # the workers are the main process's children, whichever they are
        self.error: str | None = None
        self.gpu: GpuSampler | None = None
        self._gpu_index = gpu_index
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ticks = 0
        self._children: list[int] | None = None
        self._t0 = self._t_end = None
        self._cpu_times0 = self._cpu_times_end = None
        self._swap0 = self._swap_end = self._swap_max = self._vm_min_available = None

    def start(self) -> None:
        """Open the window: read every process and the machine (and start the thread, if any)."""
        import psutil

        self._t0 = time.perf_counter()
        if self.available:
            self.main = ProcTrack(_process(self.pid), self._t0)
        self._cpu_times0 = psutil.cpu_times()
        self._swap0 = self._swap_max = psutil.swap_memory().used
        self._vm_min_available = psutil.virtual_memory().available
        self._tick(full=True, lookup=True)
        if self.interval_s is None:
            return
        if self._gpu_index is not None:
            self.gpu = GpuSampler(self._gpu_index)
            if not self.gpu.start():
                self.error, self.gpu = self.gpu.error, None
        self._thread = start_thread(self._loop, name="shardfeed-watch", stop=self._stop.set)

    def _pids(self, lookup: bool) -> list[int]:
        import psutil

        pids = self.worker_pids() if self.worker_pids is not None else None
        if pids is not None:
            return list(pids)
        # the workers are not known: the main process's children, looked up now and then
        if lookup or (not self._children and self._ticks <= _SLOW_EVERY):  # each tick in the first second
            try:
                self._children = [c.pid for c in self.main.proc.children()] if self.main is not None else []
            except psutil.Error:
                self._children = []
        self.children_mode = True
        return list(self._children or [])

    def _tick(self, full: bool = False, lookup: bool = False) -> None:
        import psutil

        now = time.perf_counter()
        self._ticks += 1
        full = full or self._ticks % _FULL_EVERY == 1
        slow = lookup or self._ticks % _SLOW_EVERY == 1
        if self.main is not None:
            self.main.sample(now, full)
        pids = self._pids(slow)
        with self._lock:
            for pid in pids:
                track = self.workers.get(pid)
                if track is None:
                    if len(self.workers) >= _MAX_TRACKED_PROCESSES:
                        continue
                    try:
                        track = self.workers[pid] = ProcTrack(psutil.Process(pid), now, born=self._ticks > 1)
                    except psutil.Error:
                        continue
                track.sample(now, full)
        if full:
            self._vm_min_available = min(self._vm_min_available, psutil.virtual_memory().available)
        if slow:
            self._swap_max = max(self._swap_max, psutil.swap_memory().used)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception as exc:  # pragma: no cover - never let sampling break the loop
                self.error = f"sampling failed: {exc}"
                return

    def snapshot(self) -> dict:
        """The figures so far (a background thread keeps running): ``{"main", "workers", "system", "gpu"}``,
        ``main`` and each of ``workers`` a :meth:`ProcTrack.figures`; ``system`` the machine's
        ``cpu_count``, ``cpu_busy_share``, ``iowait_share``, ``others_cpu_share`` (:func:`others_cpu`
        over the main process's watched span), ``memory_available_min_bytes``,
        ``memory_total_bytes``, ``swap_growth_bytes``; ``gpu`` :meth:`GpuSampler.stats` or None."""
        import psutil

        with self._lock:
            workers = [t.figures() for t in self.workers.values()]
        now = psutil.cpu_times()
        main = self.main.figures() if self.main is not None else None
        ours = (main["cpu_s"] if main else 0.0) + sum(w["cpu_s"] for w in workers)
        cpus = psutil.cpu_count() or 1
        system = {"cpu_count": cpus, **machine_cpu(self._cpu_times0, now),
                  "others_cpu_share": others_cpu(self._cpu_times0, now, ours, main["watched_s"] if main else 0.0,
                                                 cpus)["others_share"],
                  "memory_available_min_bytes": self._vm_min_available,
                  "memory_total_bytes": psutil.virtual_memory().total,
                  "swap_growth_bytes": max(0, self._swap_max - self._swap0)}
        del system["busy_s"]
        gpu = self.gpu.stats() if self.gpu is not None else None
        if self.children_mode:  # a child that used no CPU while watched is no worker of this loader (another
            workers = [w for w in workers if w["cpu_s"] > 0] or workers  # loader's idle workers, a leftover)
        return {"main": main, "workers": workers, "system": system, "gpu": gpu}

    def stop(self) -> tuple[dict | None, dict | None, dict | None, dict | None]:
        """Close the window (a last full reading); return ``(cpu, io, memory, system)`` (see :class:`RunReport`).

        Raises:
            RuntimeError: before :meth:`start`.
        """
        import psutil

        if self._t0 is None:
            raise RuntimeError("ProcessSampler.stop() before start()")
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2)
            self._thread = None
        if self.gpu is not None:
            self.gpu.stop()
            self.gpu = None
        self._tick(full=True, lookup=True)
        self._t_end = time.perf_counter()
        self._cpu_times_end = psutil.cpu_times()
        self._swap_end = psutil.swap_memory().used
        return self._window()

    def _window(self) -> tuple[dict | None, dict | None, dict | None, dict | None]:
        m, tracks = self.main, list(self.workers.values())
        if m is None or m.cpu0 is None:
            return None, None, None, None
        wall = max(self._t_end - self._t0, 1e-9)
        ncpu = os.cpu_count() or 1
        main_s = m.cpu1 - m.cpu0
        workers_s = max((m.kids1 - m.kids0) + sum(t.in_window("cpu0", "cpu1") for t in tracks), 0.0)
        cpu = {"main_s": main_s, "workers_s": workers_s, "total_s": main_s + workers_s,
               "main_cores": main_s / wall, "workers_cores": workers_s / wall,
               "util_share": (main_s + workers_s) / wall / ncpu, "cpu_count": ncpu, "num_worker_processes": len(tracks)}
        cpu.update(others_cpu(self._cpu_times0, self._cpu_times_end, main_s + workers_s, wall, ncpu))
        io = None
        if m.rchar0 is not None and m.rchar1 is not None:
            io = {}
            for key, first, last in (("read_bytes", "rbytes0", "rbytes1"), ("rchar", "rchar0", "rchar1")):
                # reaped children's I/O is folded into the parent's; live ones are read directly
                total = getattr(m, last) - getattr(m, first) + sum(t.in_window(first, last) for t in tracks)
                io[key] = max(total, 0)
                io[f"{key}_per_s"] = io[key] / wall
            io["workers_readable"] = all(t.rchar0 is not None for t in tracks)
        ws = sum(t.rss0 or 0 for t in tracks if not t.born)
        we = sum(t.rss or 0 for t in tracks if t.alive)
        start, end = m.rss0 + ws, m.rss + we
        growth = end - start
        memory = {"main_rss_start_bytes": m.rss0, "main_rss_end_bytes": m.rss,
                  "workers_rss_start_bytes": ws, "workers_rss_end_bytes": we,
                  "total_rss_start_bytes": start, "total_rss_end_bytes": end, "growth_bytes": growth,
                  "growth_flag": growth > MEMORY_GROWTH_FLAG_BYTES and growth > MEMORY_GROWTH_FLAG_SHARE * start}
        iowait = machine_cpu(self._cpu_times0, self._cpu_times_end)["iowait_share"]
        system = {"swap_used_start_bytes": self._swap0, "swap_used_end_bytes": self._swap_end,
                  "iowait_share": iowait if iowait is not None else 0.0}
        return cpu, io, memory, system
