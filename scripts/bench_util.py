"""Helpers of ``scripts/bench.py``: paired timing, page-cache eviction and checks, machine facts.

Timing rule: every comparison runs its candidates side by side in one run, round by
round, rotating their order each round (A B, then B A, ...), after one warm-up round; a figure is
the median over the rounds, and a ratio the median of the per-round ratios (each round's
candidates ran back to back, so slow drifts of the machine cancel).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

__all__ = [
    "Timer",
    "run_rounds",
    "median",
    "evict_files",
    "resident_fraction",
    "machine_info",
    "run_process",
    "drop_written",
]


def median(values: Sequence[float]) -> float:
    """Median of ``values`` (NaN when empty)."""
    return statistics.median(values) if values else float("nan")


class Timer:
    """``with Timer() as t: ...`` then ``t.s`` holds the wall time in seconds."""

    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.s = time.perf_counter() - self.t0


def run_rounds(cases: dict[str, Callable[[], float | dict]], *, rounds: int, warmup: int = 1,
               before_each: Callable[[str], None] | None = None, log: Callable[[str], None] = print) -> dict:
    """Run every case once per round, rotating the order each round; returns per-case figures.

    Args:
        cases: name -> callable returning a figure (seconds or a rate) or a dict holding ``value``
            (and anything else to keep).
        rounds: measured rounds (the medians are over these).
        warmup: unmeasured rounds first (page cache, imports, JIT-like warm-ups).
        before_each: called with the case name before each run, untimed (e.g. delete outputs, sync).

    Returns:
        ``{"order": [...], "values": {name: [v per round]}, "extra": {name: [dict per round]}}``.
    """
    names = list(cases)
    values: dict[str, list[float]] = {n: [] for n in names}
    extra: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(-warmup, rounds):
        k = r % len(names)
        order = names[k:] + names[:k]  # A B, B A, ... (rotation; with 3+ cases each leads in turn)
        for name in order:
            if before_each is not None:
                before_each(name)
            out = cases[name]()
            if r < 0:
                continue
            if isinstance(out, dict):
                values[name].append(float(out["value"]))
                extra[name].append(out)
            else:
                values[name].append(float(out))
        if r >= 0:
            log("  round %d: %s" % (r + 1, ", ".join(f"{n}={values[n][-1]:.4g}" for n in names)))
    return {"values": values, "extra": extra}


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median of the per-round ratios a[i] / b[i]."""
    return median([x / y for x, y in zip(a, b) if y > 0])


__all__.append("paired_ratio")


# ----------------------------------------------------------------------------------------------
# processes

def run_process(cmd: Sequence[str], *, cwd: str | None = None, env: dict | None = None,
                check: bool = True) -> dict:
    """Run ``cmd``; return its wall time (s), CPU times (s), peak RSS (bytes) and output.

    Peak RSS: a child forked from this (large) process starts with this process's high-water
    mark, and Linux carries it across ``exec``, so ``wait4``'s ``ru_maxrss`` would report at
    least our own size. When GNU ``/usr/bin/time`` is there, the command runs under it (a tiny
    process forks the command) and its ``%M`` is the command's own peak, children it waited for
    included; otherwise ``max_rss_bytes`` is None.
    """
    time_bin = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None
    rss_file = None
    full = list(map(str, cmd))
    if time_bin:
        import tempfile

        fd, rss_file = tempfile.mkstemp(prefix="bench-rss-")
        os.close(fd)
        full = [time_bin, "-q", "-f", "%M", "-o", rss_file, *full]
    t0 = time.perf_counter()
    p = subprocess.Popen(full, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    wall_s = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    max_rss = None
    if rss_file:
        try:
            max_rss = int(Path(rss_file).read_text().split()[-1]) * 1024
        except (ValueError, IndexError, OSError):
            max_rss = None
        os.unlink(rss_file)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    global _last_children_cpu
    cpu = ru.ru_utime + ru.ru_stime
    cpu_s, _last_children_cpu = cpu - _last_children_cpu, cpu
    return {"value": wall_s, "wall_s": wall_s, "max_rss_bytes": max_rss, "cpu_s": cpu_s, "rc": p.returncode,
            "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}


_last_children_cpu = 0.0


def drop_written(paths: Sequence[Path]) -> None:
    """Remove benchmark outputs and flush the disk, untimed, so no run pays the last one's write-back."""
    import shutil

    for p in paths:
        p = Path(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    os.sync()


# ----------------------------------------------------------------------------------------------
# page cache

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_PAGE = mmap.PAGESIZE
_MAP_FAILED = ctypes.c_void_p(-1).value


def _resident_pages(path: str) -> tuple[int, int]:
    """(resident pages, total pages) of one file, by ``mmap`` + ``mincore``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"{path}: mmap failed")
        try:
            n = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"{path}: mincore failed")
            return sum(v & 1 for v in bytes(vec)), n
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_fraction(paths: Sequence[str]) -> float:
    """Share of the files' pages that are in the page cache (0..1), checked with ``mincore``."""
    res = tot = 0
    for p in paths:
        r, t = _resident_pages(str(p))
        res += r
        tot += t
    return res / tot if tot else 0.0


def evict_files(paths: Sequence[str]) -> None:
    """Drop the files' pages from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` per file).

    Dirty pages cannot be dropped, so the files are synced first (a no-op when clean).
    """
    for p in paths:
        fd = os.open(str(p), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_read_probe(path: str, num_reads: int = 256) -> dict:
    """Latency of random 4 KiB reads of an evicted file: tells the disk from the host's cache.

    A virtual machine's disk is often a file on the host, cached in the host's RAM: pages the
    guest evicted come back at memory speed, so a "cold" run is optimistic. A local NVMe SSD
    answers a random 4 KiB read in ~50-100 µs, a network volume in 0.3-2 ms; ~10-30 µs means the
    bytes came from a cache outside this machine's page cache.
    """
    import random

    evict_files([path])
    size = os.path.getsize(path)
    rng = random.Random(0)
    offsets = [rng.randrange(0, max(1, size - 4096)) // 4096 * 4096 for _ in range(num_reads)]
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        t0 = time.perf_counter()
        for off in offsets:
            os.pread(fd, 4096, off)
        lat = (time.perf_counter() - t0) / num_reads
        evict_files([path])
        t0 = time.perf_counter()
        n = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            n += len(chunk)
        seq_s = time.perf_counter() - t0
    finally:
        os.close(fd)
    evict_files([path])
    return {"random_4k_read_us": lat * 1e6, "sequential_mb_per_s": n / 1e6 / seq_s if seq_s > 0 else 0.0,
            "file_bytes": size}


__all__.append("cold_read_probe")


# ----------------------------------------------------------------------------------------------
# machine

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _filesystem(path: Path) -> dict:
    path = Path(path).resolve()
    best = ("", "", "")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if str(path).startswith(mnt.rstrip("/") + "/") or str(path) == mnt:
                if len(mnt) >= len(best[1]):
                    best = (dev, mnt, fstype)
    except OSError:
        pass
    rotational = None
    dev = Path(best[0]).name
    for cand in (dev, dev.rstrip("0123456789"), dev.rstrip("0123456789").rstrip("p")):
        f = Path(f"/sys/block/{cand}/queue/rotational")
        if cand and f.exists():
            rotational = f.read_text().strip() == "1"
            break
    return {"device": best[0], "mount": best[1], "type": best[2], "rotational": rotational}


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None


def machine_info(data_dir: Path) -> dict:
    """CPU model, cores, RAM, OS, Python and library versions, and the file system of ``data_dir``."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "mem_total_bytes": _mem_total_bytes(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {m: _version(m) for m in ("shardfeed", "torch", "pillow", "pillow-simd", "numpy", "webdataset",
                                               "lmdb", "click", "opencv-python-headless")},
        "tar": subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "filesystem": _filesystem(data_dir),
    }
