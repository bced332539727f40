"""``tune``: sweep the ``DataLoader`` knobs one at a time and say where the data should live."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..redact import shown_source
from .bench import LOADER_KNOBS, MAKE_LOADER_DEFAULTS, bench_source
from .cache import dataset_files, detect_source_format
from .harness import select_device
from .report import fmt_bytes
from .sampling import meminfo, read_text
from .tables import TUNE_HEADER, format_table, tune_rows

__all__ = ["make_loader_call", "tune_loader", "TuneReport"]


@dataclasses.dataclass
class TuneReport:
    """What ``tune`` found: every setting tried, the best one and the ``make_loader(...)`` call.

    Attributes:
        source: the dataset measured.
        trials: one dict per trial in sweep order: ``step`` (the knob), ``options`` (the loader
            knobs), ``images_per_s``, ``stall_share``, ``seconds`` (s) and ``report`` (its
            :class:`RunReport`).
        best: the trial kept (one of ``trials``).
        best_options: the knobs of the recommended call.
        call: a ready-to-paste ``make_loader(...)`` call.
        warnings, advice, skipped: lines of text.
        seconds: the sweep's wall time, s; ``budget_s`` its budget.
        device, torch: where it ran and the torch version.
    """

    source: str
    trials: list
    best: dict
    best_options: dict
    call: str
    warnings: list
    advice: list
    skipped: list
    seconds: float
    budget_s: float
    device: str
    torch: str

    def headline(self) -> str:
        """``"best: 1234.5 images/s, data stall 3%"``."""
        return f"best: {self.best['images_per_s']:.1f} images/s, data stall {self.best['stall_share']:.0%}"

    def summary(self) -> str:
        """The printed report: a row per trial, warnings, skipped steps, advice, the best and its call."""
        lines = [format_table(tune_rows(self), header=TUNE_HEADER)]
        lines += [f"warning: {w}" for w in self.warnings] + [f"skipped: {s}" for s in self.skipped]
        lines += [f"advice: {a}" for a in self.advice]
        return "\n".join([*lines, self.headline(), self.call])

    def to_json(self) -> dict:
        """Every figure as a JSON-able dict (what ``tune --json`` writes; per-batch lists left out)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["trials"] = [{**{k: v for k, v in t.items() if k != "report"}, "report": t["report"].to_json(per_batch=False)}
                       for t in self.trials]
        d["best"] = {k: v for k, v in self.best.items() if k != "report"}
        return d


def make_loader_call(source: str | os.PathLike, batch_size: int, options: dict) -> str:
    """A ready-to-paste ``make_loader(...)`` call for ``options`` (a URL's ``user:password@`` shown
    as ``***@``: put the credentials back, or pass them in the environment)."""
    args = [repr(shown_source(source)), f"batch_size={batch_size}"]
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
    text = read_text("/proc/mounts") or ""
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
    avail = meminfo().get("MemAvailable")
    packed = detect_source_format(source) != "folder"
    advice = []
    if avail and size < 0.5 * avail:
        advice.append(f"the dataset ({fmt_bytes(size)}) fits comfortably in RAM ({fmt_bytes(avail)} available): "
                      "cache='memory' keeps its bytes there after one read (per process)")
    shm_free = _fs_free_bytes("/dev/shm")
    src = Path(str(source))
    if shm_free and size * 1.5 < shm_free and not _on_tmpfs(src):
        name = src.resolve().name or "dataset"
        how = (f"`shardfeed stage {source} /dev/shm/{name}`" if packed else
               f"pack it (`shardfeed pack {source} OUT`), then `shardfeed stage OUT /dev/shm/{name}`")
        advice.append(f"/dev/shm has room ({fmt_bytes(shm_free)} free): {how} puts it in RAM once for every "
                      "process and rank of the machine")
    elif avail and size >= 0.5 * avail:
        advice.append(f"the dataset ({fmt_bytes(size)}) does not fit comfortably in RAM: "
                      + ("stage it to the fastest local disk (`shardfeed stage`)" if packed else
                         "pack it (`shardfeed pack`, sequential reads) and stage it to the fastest local disk "
                         "(`shardfeed stage`)"))
    return advice


class _Sweep:
    """The state of one ``tune`` sweep: trials run, the best so far, what was skipped."""

    def __init__(self, source: Any, budget_s: float, progress: Callable[[str], None] | None, bench_kwargs: dict):
        self.t0 = time.perf_counter()
        self.source = source
        self.budget_s = budget_s
        self.progress = progress
        self.bench_kwargs = bench_kwargs
        self.trials: list[dict] = []
        self.skipped: list[str] = []
        self.warnings: list[str] = []
        self.longest_s = 0.0
        self.best: dict[str, Any] = {}
        self.best_rec: dict | None = None

    def trial(self, step: str, options: dict) -> dict | None:
        """One measured trial; None (recorded as skipped) when it would not fit in the budget."""
        elapsed = time.perf_counter() - self.t0
        if self.trials and elapsed + self.longest_s > self.budget_s:
            self.skipped.append(f"{step} {_knobs_text(options)}")
            return None
        if self.progress:
            self.progress(f"{step}: {_knobs_text(options)}")
        ts = time.perf_counter()
        rep = bench_source(self.source, label=step, **self.bench_kwargs, **dict(options))
        dur = time.perf_counter() - ts
        self.longest_s = max(self.longest_s, dur)
        rec = {"step": step, "options": dict(options), "images_per_s": rep.images_per_s,
               "stall_share": rep.stall_share, "seconds": dur, "report": rep}
        self.trials.append(rec)
        return rec

    def workers(self, start: dict, max_workers: int, min_gain: float, pin: bool) -> list[dict]:
        """Step 1, ``num_workers``: stops after two counts in a row that gain less than ``min_gain``."""
        misses = 0
        by_workers: list[dict] = []
        for w in _worker_counts(max_workers):
            rec = self.trial("num_workers", {**start, "num_workers": w, "pin_memory": pin})
            if rec is None:
                break
            by_workers.append(rec)
            if self.best_rec is None or rec["images_per_s"] > self.best_rec["images_per_s"] * (1 + min_gain):
                self.best_rec, misses = rec, 0
            else:  # within noise of fewer workers: keep those (fewer processes, less memory)
                misses += 1
                if misses >= 2:
                    break
        if self.best_rec is None:
            raise ValueError(f"budget_s={self.budget_s} left no time for a single trial")
        self.best = dict(self.best_rec["options"])
        return by_workers

    def workers_plateau_warning(self, by_workers: list[dict], min_gain: float, cpu: int) -> None:
        """Warn where more workers stopped helping."""
        if not by_workers or by_workers[-1]["options"]["num_workers"] <= 1:
            return
        for p, c in zip(by_workers, by_workers[1:]):
            if p["options"]["num_workers"] >= 1 and c["images_per_s"] < p["images_per_s"] * (1 + min_gain):
                self.warnings.append(
                    f"more workers stop helping beyond {p['options']['num_workers']}: "
                    f"{p['options']['num_workers']} -> {c['options']['num_workers']} workers gave "
                    f"{p['images_per_s']:.0f} -> {c['images_per_s']:.0f} images/s "
                    f"({cpu} CPU core(s); the bottleneck is elsewhere: CPU, storage or the step)")
                return

    def try_knob(self, knob: str, value: Any, min_gain: float) -> None:
        """Run a trial with one knob changed; keep it only for a gain of at least ``min_gain``."""
        other = {**self.best, knob: value}
        rec = self.trial(knob, other)
        if rec and rec["images_per_s"] > self.best_rec["images_per_s"] * (1 + min_gain):
            self.best_rec, self.best = rec, other


def tune_loader(source: str | os.PathLike, *, budget_s: float = 300, batch_size: int = 64,
                image_size: int | None = 224, model: str = "tiny", device: str = "auto",
                compute_ms: float | None = None, warmup: int = 5, batches: int = 30, max_workers: int | None = None,
                min_gain: float = 0.05, channels_last: bool = False, num_threads: int | None = None,
                cold: bool = False, progress: Callable[[str], None] | None = None, **loader_options: Any) -> TuneReport:
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
        The :class:`~shardfeed.readers.measure.tune.TuneReport`: every trial (``step``,
        ``options``, ``images_per_s``, ``stall_share``, ``seconds``, ``report``), the best, the
        ``make_loader(...)`` call, warnings, advice and skipped steps; ``summary()``,
        ``headline()`` and ``to_json()``.
    """
    import torch

    dev = select_device(device)
    cpu = os.cpu_count() or 1
    max_workers = max_workers if max_workers is not None else 2 * cpu
    base = {k: v for k, v in loader_options.items() if k not in LOADER_KNOBS}
    sweep = _Sweep(source, budget_s, progress, dict(
        batch_size=batch_size, image_size=image_size, model=model, device=dev, compute_ms=compute_ms, warmup=warmup,
        batches=batches, channels_last=channels_last, num_threads=num_threads, cold=cold, **base))
    start = {"num_workers": 0, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": True}
    by_workers = sweep.workers(start, max_workers, min_gain, pin=dev.type == "cuda")
    sweep.workers_plateau_warning(by_workers, min_gain, cpu)
    # 2. pin_memory
    if dev.type == "cuda":
        sweep.try_knob("pin_memory", not sweep.best["pin_memory"], min_gain)
    else:
        sweep.skipped.append("pin_memory (no CUDA device: pinning only speeds up copies to a GPU)")
    # 3. prefetch_factor, 4. persistent_workers
    if sweep.best["num_workers"] > 0:
        for pf in (2, 4):
            if pf != sweep.best["prefetch_factor"]:
                sweep.try_knob("prefetch_factor", pf, min_gain)
        sweep.try_knob("persistent_workers", not sweep.best["persistent_workers"], min_gain)
    else:
        sweep.skipped.append("prefetch_factor, persistent_workers (they apply to worker processes; the best was 0)")
    best_rec, best = sweep.best_rec, sweep.best
    if best_rec["stall_share"] < 0.05:
        sweep.warnings.append(f"the best configuration leaves a data stall of {best_rec['stall_share']:.0%}: the "
                              "step, not the loader, sets the pace")
    if best["num_workers"] == 0:
        best = {"num_workers": 0, "pin_memory": best["pin_memory"]}
    extra = {k: v for k, v in loader_options.items()
             if k not in LOADER_KNOBS and k != "storage_options" and v is not None
             and MAKE_LOADER_DEFAULTS.get(k, object()) != v}
    call_opts = {**best, **({"image_size": image_size} if image_size else {}), **extra}
    return TuneReport(source=shown_source(source), trials=sweep.trials, best=best_rec, best_options=best,
                      call=make_loader_call(source, batch_size, call_opts), warnings=sweep.warnings,
                      advice=_storage_advice(source), skipped=sweep.skipped, seconds=time.perf_counter() - sweep.t0,
                      budget_s=budget_s, device=str(dev), torch=torch.__version__)


def _knobs_text(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())
