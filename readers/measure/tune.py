"""``tune``: sweep the ``DataLoader`` knobs one at a time and say where the data should live."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..storage.redact import shown_source
from .bench import LOADER_KNOBS, MAKE_LOADER_DEFAULTS, bench_source
from .cache import dataset_files, detect_source_format
from .harness import select_device
from .report import fmt_bytes
from .probes import meminfo, read_text
from .tables import TUNE_HEADER, format_table, tune_rows
from .verdict import judge_rounds, others_cpu_shares

__all__ = ["make_loader_call", "tune_loader", "TuneReport", "TUNE_ROUNDS", "setting_beats", "storage_was_read"]

#: Rounds per setting: the least that measures a spread with a middle round.
TUNE_ROUNDS = 3


@dataclasses.dataclass
class TuneReport:
    """What ``tune`` found: every setting tried, the best one and the ``make_loader(...)`` call.

    Attributes:
        source: the dataset measured.
        trials: one dict per trial in sweep order: ``step`` (the knob), ``options`` (the loader
            knobs), ``round`` (1, 2, ...), ``images_per_s``, ``stall_share``, ``seconds`` (s) and ``report`` (its
            :class:`RunReport`).
        best: the median round of the setting kept (one of ``trials``).
        best_options: the knobs of the recommended call.
        call: a ready-to-paste ``make_loader(...)`` call.
        warnings, advice, skipped: lines of text.
        seconds: the sweep's wall time, s; ``budget_s`` its budget.
        device, torch: where it ran and the torch version.
        decisions: one line per comparison: the knob changed, kept or not, and the rounds' figures.
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
    decisions: list = dataclasses.field(default_factory=list)

    def headline(self) -> str:
        """``"best: 1234.5 images/s, data stall 3%"``."""
        return f"best: {self.best['images_per_s']:.1f} images/s, data stall {self.best['stall_share']:.0%}"

    def summary(self) -> str:
        """The printed report: a row per trial, warnings, skipped steps, advice, the best and its call."""
        lines = [format_table(tune_rows(self), header=TUNE_HEADER)]
        lines += [f"warning: {w}" for w in self.warnings] + [f"skipped: {s}" for s in self.skipped]
        lines += [f"decision: {d}" for d in self.decisions]
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
    """The state of one ``tune`` sweep: trials run in interleaved rounds, the best so far, what was
    skipped and why each setting was kept or not.

    ``measure(source, label=..., **options)`` measures one trial and returns a report with
    ``images_per_s``, ``stall_share`` and ``cpu`` (:func:`bench_source`'s :class:`RunReport`);
    ``clock()`` reads seconds for the budget (:func:`time.perf_counter`)."""

    def __init__(self, source: Any, budget_s: float, progress: Callable[[str], None] | None, bench_kwargs: dict,
                 *, rounds: int = TUNE_ROUNDS, min_gain: float = 0.05, measure: Callable[..., Any] = bench_source,
                 clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.measure = measure
        self.t0 = clock()
        self.source = source
        self.budget_s = budget_s
        self.progress = progress
        self.bench_kwargs = bench_kwargs
        self.rounds = rounds
        self.min_gain = min_gain
        self.trials: list[dict] = []
        self.skipped: list[str] = []
        self.warnings: list[str] = []
        self.decisions: list[str] = []
        self.longest_s = 0.0
        self.best: dict[str, Any] = {}
        self.best_rec: dict | None = None

    def trial(self, step: str, options: dict, round_: int) -> dict | None:
        """One measured trial; None (recorded as skipped) when it would not fit in the budget."""
        elapsed = self.clock() - self.t0
        if self.trials and elapsed + self.longest_s > self.budget_s:
            self.skipped.append(f"{step} {_knobs_text(options)} round {round_ + 1}")
            return None
        if self.progress:
            self.progress(f"{step} round {round_ + 1}/{self.rounds}: {_knobs_text(options)}")
        ts = self.clock()
        rep = self.measure(self.source, label=step, **self.bench_kwargs, **dict(options))
        dur = self.clock() - ts
        self.longest_s = max(self.longest_s, dur)
        rec = {"step": step, "options": dict(options), "round": round_ + 1, "images_per_s": rep.images_per_s,
               "stall_share": rep.stall_share, "seconds": dur, "report": rep}
        self.trials.append(rec)
        return rec

    def rounds_of(self, step: str, settings: list[dict]) -> list[list[dict]]:
        """Every setting of a step measured ``rounds`` times, round-robin (round 1 of each setting,
        then round 2 of each, ...): a slow stretch of the machine falls on every setting alike.
        Returns the trials of each setting, in ``settings`` order."""
        out: list[list[dict]] = [[] for _ in settings]
        for r in range(self.rounds):
            for i, opts in enumerate(settings):
                rec = self.trial(step, opts, r)
                if rec is not None:
                    out[i].append(rec)
        return out

    def choose(self, step: str, settings: list[dict], recs: list[list[dict]]) -> int:
        """The index of the setting kept: ``settings[0]`` (the setting so far) unless a later one is
        faster by more than the rounds' spread (:func:`setting_beats`), scanning in order, each
        later setting compared with the one kept so far. Sets ``best`` and ``best_rec``."""
        kept = 0
        for i in range(1, len(settings)):
            if len(recs[i]) < self.rounds or len(recs[kept]) < self.rounds:
                if recs[i]:
                    self.decisions.append(f"{step}: {_knobs_text(_changed(settings[kept], settings[i]))} not "
                                          f"judged: {len(recs[i])} of {self.rounds} rounds fit in the budget")
                continue
            won, text = setting_beats([t["images_per_s"] for t in recs[kept]],
                                      [t["images_per_s"] for t in recs[i]], self.min_gain,
                                      others_cpu_shares([t["report"] for t in recs[kept] + recs[i]]))
            change = _knobs_text(_changed(settings[kept], settings[i]))
            self.decisions.append(f"{step}: {change} {'kept' if won else 'not kept'}: {text}")
            if won:
                kept = i
        if recs[kept]:
            self.best_rec = _median_trial(recs[kept])
            self.best = dict(settings[kept])
        return kept

    def workers(self, start: dict, max_workers: int, pin: bool) -> list[list[dict]]:
        """Step 1, ``num_workers``: every count of :func:`_worker_counts` in interleaved rounds.

        Raises:
            ValueError: the budget left no time for a single trial.
        """
        settings = [{**start, "num_workers": w, "pin_memory": pin} for w in _worker_counts(max_workers)]
        recs = self.rounds_of("num_workers", settings)
        if not recs[0]:
            raise ValueError(f"budget_s={self.budget_s} left no time for a single trial")
        self.choose("num_workers", settings, recs)
        return recs

    def workers_plateau_warning(self, by_workers: list[list[dict]], cpu: int) -> None:
        """Warn where more workers stopped helping (the median rounds of two counts in a row)."""
        meds = [_median_trial(r) for r in by_workers if r]
        if not meds or meds[-1]["options"]["num_workers"] <= 1:
            return
        for p, c in zip(meds, meds[1:]):
            if p["options"]["num_workers"] >= 1 and c["images_per_s"] < p["images_per_s"] * (1 + self.min_gain):
                self.warnings.append(
                    f"more workers stop helping beyond {p['options']['num_workers']}: "
                    f"{p['options']['num_workers']} -> {c['options']['num_workers']} workers gave "
                    f"{p['images_per_s']:.0f} -> {c['images_per_s']:.0f} images/s (median rounds; "
                    f"{cpu} CPU core(s); the bottleneck is elsewhere: CPU, storage or the step)")
                return

    def try_knob(self, knob: str, value: Any) -> None:
        """The setting so far against the same with one knob changed, in interleaved rounds; the
        change is kept only when it wins (:meth:`choose`)."""
        settings = [dict(self.best), {**self.best, knob: value}]
        self.choose(knob, settings, self.rounds_of(knob, settings))


def setting_beats(default_images_per_s: list[float], setting_images_per_s: list[float], min_gain: float,
                  others_shares: list[float] | None = None) -> tuple[bool, str]:
    """Whether a setting beats the default by more than the rounds' spread: ``(won, why)``.

    It wins when :func:`~shardfeed.readers.measure.verdict.judge_rounds` calls it ``faster``
    (every round of the setting above every round of the default, the gain of the medians above
    both sides' spread ``(max - min) / median`` and at least 5 %, other processes' CPU share no
    larger than the gain) and its median is at least ``min_gain`` above the default's.

    Args:
        default_images_per_s, setting_images_per_s: images/s, one per round.
        min_gain: the least gain of the medians, a share (0.05: 5 %).
        others_shares: other processes' share of the CPU during each round, in [0, 1].
    """
    v = judge_rounds(default_images_per_s, setting_images_per_s, others_shares or ())
    won = v["kind"] == "faster" and v["ratio"] >= 1 + min_gain
    return won, v["text"]


def _median_trial(recs: list[dict]) -> dict:
    """The trial of the median round (the lower middle one for an even count, as ``verify``)."""
    ordered = sorted(recs, key=lambda t: t["images_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def _changed(before: dict, after: dict) -> dict:
    return {k: v for k, v in after.items() if before.get(k) != v}


def storage_was_read(report: Any) -> bool:
    """Whether a trial read its data from storage and waited on it, not from the page cache: the
    workers' and main process's reads from the block device (``io["read_bytes"]``) are at least
    10 % of all their reads (``io["rchar"]``), and the processes were not busy on the CPU (less
    than 80 % of the cores they could use) or the machine waited on I/O for at least 10 % of its
    time. False without the figures (off Linux)."""
    io, cpu = getattr(report, "io", None) or {}, getattr(report, "cpu", None) or {}
    system = getattr(report, "system", None) or {}
    rchar, read = io.get("rchar"), io.get("read_bytes")
    if not rchar or read is None or read < 0.1 * rchar:
        return False
    iowait = system.get("iowait_share") or 0.0
    workers = (getattr(report, "config", None) or {}).get("loader", {}).get("num_workers") or 0
    ncpu = cpu.get("cpu_count") or os.cpu_count() or 1
    busy_cores = (cpu.get("workers_cores") if workers else cpu.get("main_cores"))
    usable = min(max(workers, 1), ncpu)
    cpu_bound = busy_cores is not None and busy_cores >= 0.8 * usable
    return iowait >= 0.1 or not cpu_bound


def tune_loader(source: str | os.PathLike, *, budget_s: float = 300, batch_size: int = 64,
                image_size: int | None = 224, model: str = "tiny", device: str = "auto",
                compute_ms: float | None = None, warmup: int = 5, batches: int = 30, max_workers: int | None = None,
                min_gain: float = 0.05, channels_last: bool = False, num_threads: int | None = None,
                cold: bool = False, progress: Callable[[str], None] | None = None, rounds: int = TUNE_ROUNDS,
                measure: Callable[..., Any] | None = None, clock: Callable[[], float] = time.perf_counter,
                **loader_options: Any) -> TuneReport:
    """Sweep the ``DataLoader`` knobs one at a time, the way practitioners do by hand.

    1. ``num_workers``: 0, 1, 2, 4, 8, … up to ``max_workers`` (default 2 × CPU count).
    2. ``pin_memory`` (with non-blocking copies) on and off — CUDA only.
    3. ``prefetch_factor`` 2 and 4 (with workers).
    4. ``persistent_workers`` on and off (with workers; it matters at epoch boundaries).

    Each step measures its settings in ``rounds`` interleaved rounds (round 1 of every setting,
    then round 2 of every setting, ...), so a slow stretch of a busy machine falls on all of them.
    Each step keeps the setting so far; another replaces it only when it beats it by more than the
    rounds' spread (:func:`setting_beats`: its slowest round above the other's fastest, the gain of
    the medians above both spreads and at least ``min_gain``); fewer workers win ties (they cost
    less memory). A trial is skipped when the time left in ``budget_s`` is less than the longest
    trial so far; a setting with fewer than ``rounds`` rounds is not judged. With ``cold``, every
    trial starts with the dataset's files evicted from the page cache (as :func:`bench_source`
    does): the knobs for a dataset that does not stay in memory. Where the data should live
    (cache, stage) is advised only when the kept trial read from storage and waited on it
    (:func:`storage_was_read`), not when decoding or the step is the limit.

    Args:
        rounds: rounds per setting (at least 3).
        measure: measures one trial, ``measure(source, label=STEP, **options)`` returning a report
            with ``images_per_s``, ``stall_share``, ``cpu``, ``io``, ``system``, ``config`` and
            ``to_json`` (default :func:`bench_source`).
        clock: seconds for the budget and the trials' durations (default :func:`time.perf_counter`).

    Returns:
        The :class:`~shardfeed.readers.measure.tune.TuneReport`: every trial (``step``,
        ``options``, ``round``, ``images_per_s``, ``stall_share``, ``seconds``, ``report``), the
        best (the median round of the setting kept), the ``make_loader(...)`` call, warnings,
        advice, skipped trials and the decision of each comparison; ``summary()``,
        ``headline()`` and ``to_json()``.

    Raises:
        ValueError: ``rounds`` below 3, or a budget with no time for a single trial.
    """
    import torch

    if rounds < TUNE_ROUNDS:
        raise ValueError(f"rounds must be at least {TUNE_ROUNDS}, got {rounds}: fewer rounds measure no spread")
    dev = select_device(device)
    cpu = os.cpu_count() or 1
    max_workers = max_workers if max_workers is not None else 2 * cpu
    base = {k: v for k, v in loader_options.items() if k not in LOADER_KNOBS}
    sweep = _Sweep(source, budget_s, progress, dict(
        batch_size=batch_size, image_size=image_size, model=model, device=dev, compute_ms=compute_ms, warmup=warmup,
        batches=batches, channels_last=channels_last, num_threads=num_threads, cold=cold, **base),
        rounds=rounds, min_gain=min_gain, measure=measure or bench_source, clock=clock)
    start = {"num_workers": 0, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": True}
    by_workers = sweep.workers(start, max_workers, pin=dev.type == "cuda")
    sweep.workers_plateau_warning(by_workers, cpu)
    # 2. pin_memory
    if dev.type == "cuda":
        sweep.try_knob("pin_memory", not sweep.best["pin_memory"])
    else:
        sweep.skipped.append("pin_memory (no CUDA device: pinning only speeds up copies to a GPU)")
    # 3. prefetch_factor, 4. persistent_workers
    if sweep.best["num_workers"] > 0:
        for pf in (2, 4):
            if pf != sweep.best["prefetch_factor"]:
                sweep.try_knob("prefetch_factor", pf)
        sweep.try_knob("persistent_workers", not sweep.best["persistent_workers"])
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
    advice = _storage_advice(source) if best_rec["stall_share"] >= 0.05 and storage_was_read(best_rec["report"]) \
        else []
    return TuneReport(source=shown_source(source), trials=sweep.trials, best=best_rec, best_options=best,
                      call=make_loader_call(source, batch_size, call_opts), warnings=sweep.warnings,
                      advice=advice, skipped=sweep.skipped, seconds=clock() - sweep.t0,
                      budget_s=budget_s, device=str(dev), torch=torch.__version__, decisions=sweep.decisions)


def _knobs_text(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())
