"""``verify``: check AFTER against BEFORE, then measure both with the same loop in alternating rounds."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Sequence

from ..storage.redact import shown_source
from .bench import bench_source
from .cache import dataset_files, settle_disk, warm_page_cache
from .check import check_same_samples
from .report import RunReport
from .tables import format_comparison, limit_note, verify_headline
from .verdict import judge_rounds, others_cpu_shares

__all__ = ["compare_sources", "VerifyReport", "time_left_text"]


@dataclasses.dataclass
class VerifyReport:
    """What ``verify`` measured: BEFORE and AFTER through the same loop, in alternating rounds.

    Attributes:
        before, after: each side's median run by images/s (:class:`RunReport`).
        speedup: AFTER's median images/s ÷ BEFORE's (``inf`` when BEFORE delivered nothing).
        check: what :func:`~shardfeed.readers.measure.check.check_same_samples` found (None
            without the check).
        repeats: rounds run (each runs both sides).
        cold: whether the page cache was evicted before every run.
        settle: what :func:`~shardfeed.readers.measure.cache.settle_disk` did (None: not settled).
        warm_cache: what :func:`~shardfeed.readers.measure.cache.warm_page_cache` did (None: no
            warm-up, e.g. with ``cold``).
        verdict: the dict of :func:`~shardfeed.readers.measure.verdict.judge_rounds` (``kind``,
            ``text``, both sides' rounds, spread, others' CPU share, ``advice``); None when
            BEFORE delivered nothing.
        cpu_s_per_image: each side's median CPU seconds (main + workers) per image, ``{"before",
            "after"}``; None where CPU time is not readable.
        runs: every run in run order (B A A B B A ...).
        min_speedup: the ``--min-speedup`` threshold the caller checks, recorded in the JSON.
    """

    before: RunReport
    after: RunReport
    speedup: float
    check: dict | None
    repeats: int
    cold: bool
    settle: dict | None
    warm_cache: dict | None
    verdict: dict | None
    cpu_s_per_image: dict | None
    runs: list
    min_speedup: float | None = None

    @property
    def stall_share_before(self) -> float:
        """BEFORE's data-stall share, in [0, 1]."""
        return self.before.stall_share

    @property
    def stall_share_after(self) -> float:
        """AFTER's data-stall share, in [0, 1]."""
        return self.after.stall_share

    def headline(self) -> str:
        """The verdict line (``"2.9x faster; rounds vary by 4%; data stall 71% -> 6%"``, plus the
        decode-cost note when a side was re-encoded)."""
        return verify_headline(self)

    def summary(self, *, details: bool = False) -> str:
        """The printed report: both median runs side by side, the rounds, the verdict, advice
        (compact; ``details=True``: every row, see :func:`~shardfeed.readers.measure.tables.format_comparison`)."""
        return format_comparison(self, details=details)

    def to_json(self) -> dict:
        """Every figure as a JSON-able dict (what ``verify --json`` writes)."""
        return {"before": self.before.to_json(), "after": self.after.to_json(), "speedup": self.speedup,
                "stall_share_before": self.stall_share_before, "stall_share_after": self.stall_share_after,
                "headline": self.headline(), "limit": limit_note(self), "verdict": self.verdict, "settle": self.settle,
                "warm_cache": self.warm_cache, "cpu_s_per_image": self.cpu_s_per_image, "check": self.check,
                "repeats": self.repeats, "cold": self.cold, "min_speedup": self.min_speedup,
                "runs": [r.to_json() for r in self.runs]}


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


def time_left_text(durations: Sequence[float], runs_left: int) -> str | None:
    """``"about 4 min 30 s left"``: the runs left times the mean of the runs so far (seconds each);
    None before the first run has ended or when none is left."""
    if not durations or runs_left <= 0:
        return None
    left = round(sum(durations) / len(durations) * runs_left)
    minutes, seconds = divmod(left, 60)
    text = f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    return f"about {text} left"


def compare_sources(before: str | os.PathLike, after: str | os.PathLike, *, repeats: int = 1, cold: bool = False,
                    deep: bool = False, check: bool = True, settle: bool = True, warm_cache: bool = True,
                    progress: Callable[[str], None] | None = None, **bench_options: Any) -> VerifyReport:
    """``verify``: check AFTER against BEFORE, then measure both with the same loop, alternately.

    First the disk is settled (:func:`~shardfeed.readers.measure.cache.settle_disk`: ``sync``, so
    the write-back of a dataset packed a moment ago does not land in a measured run). Round ``r``
    runs BEFORE then AFTER when ``r`` is even, AFTER then BEFORE when odd (B A A B B A ...), so a
    steady drift (thermal, page cache, other load) does not favour one side. With ``cold`` the
    files of *both* datasets are evicted before every run. The verdict comes from every round of
    both sides and the CPU other processes took meanwhile
    (:func:`~shardfeed.readers.measure.verdict.judge_rounds`): none when the noise exceeds the
    effect.

    Args:
        before, after: the original image folder and the packed dataset (any two sources).
        repeats: rounds (≥ 1); the reported runs are each side's median by images/s.
        cold: evict the page cache before each run.
        deep: compare every sample's bytes in the check.
        check: run :func:`check_same_samples` first.
        settle: flush dirty pages (``os.sync()``) before the first run.
        warm_cache: without ``cold``, read both datasets' files once before the first run
            (:func:`~shardfeed.readers.measure.cache.warm_page_cache`) so that neither side's first
            warm run reads from the disk.
        progress: called with a line of text before the page-cache warm-up, before the first run
            (how many runs), and before each run (from the second on, the time left estimated by
            :func:`time_left_text`).
        **bench_options: :func:`bench_source` options (model, device, batch size, loader knobs).

    Returns:
        The :class:`~shardfeed.readers.measure.verify.VerifyReport`: each side's median run by
        images/s, ``speedup`` = AFTER's median images/s ÷ BEFORE's, the verdict of
        :func:`judge_rounds` from every round, each side's median CPU time per image, what the
        settle and warm-up did, and every run; ``summary()``, ``headline()`` and ``to_json()``.

    Raises:
        DatasetMismatchError: the check failed (nothing is measured).
        ValueError: ``repeats`` below 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    checked = None
    if check:
        # with cold runs, check in a child process: readers that map files (LMDB) keep what they
        # mapped while the process lives, and mapped pages cannot be evicted from the page cache
        so = {"storage_options": bench_options["storage_options"]} if bench_options.get("storage_options") else {}
        if bench_options.get("follow_external_links"):
            so["follow_external_links"] = True
        checked = _run_in_child(check_same_samples, before, after, deep=deep, **so) if cold else \
            check_same_samples(before, after, deep=deep, **so)
    follow = bool(bench_options.get("follow_external_links", False))
    files = dataset_files(before, follow_external_links=follow) + dataset_files(after, follow_external_links=follow)
    settled = settle_disk() if settle else None
    warmed = None
    if warm_cache and not cold:
        if progress:
            progress(f"warming the page cache: reading both datasets once ({len(files)} files)")
        warmed = warm_page_cache(files)
    evict = files if cold else None
    runs: list[RunReport] = []
    durations: list[float] = []
    if progress:
        progress(f"{2 * repeats} runs to measure ({repeats} round(s) of both sides); the time left is "
                 "estimated from the first run")
    for r in range(repeats):
        order = (("before", before), ("after", after)) if r % 2 == 0 else (("after", after), ("before", before))
        for side, src in order:
            if progress:
                left = time_left_text(durations, 2 * repeats - len(runs))
                progress(f"round {r + 1}/{repeats}: {side} ({shown_source(src)})" + (f"; {left}" if left else ""))
            t0 = time.monotonic()
            rep = bench_source(src, cold=cold, evict_files=evict, label=side, **bench_options)
            durations.append(time.monotonic() - t0)
            rep.config["round"] = r
            runs.append(rep)
    best_b = _median_run([x for x in runs if x.label == "before"])
    best_a = _median_run([x for x in runs if x.label == "after"])
    speedup = best_a.images_per_s / best_b.images_per_s if best_b.images_per_s > 0 else float("inf")
    verdict = judge_rounds([x.images_per_s for x in runs if x.label == "before"],
                           [x.images_per_s for x in runs if x.label == "after"], others_cpu_shares(runs)) \
        if best_b.images_per_s > 0 else None
    return VerifyReport(before=best_b, after=best_a, speedup=speedup, check=checked, repeats=repeats, cold=cold,
                        settle=settled, warm_cache=warmed, verdict=verdict, cpu_s_per_image=_cpu_per_image(runs),
                        runs=runs)


def _cpu_per_image(runs: Sequence[RunReport]) -> dict | None:
    """Each side's median CPU seconds (main + loader workers) per image over its rounds.

    Unlike images/s this hardly moves with other processes' load (on a busy 2-core machine: images/s
    correlated -0.97 with the CPU share other processes took, CPU per image 0.03), so it shows
    which loader does less work even where the throughput verdict cannot be given.
    """
    out = {}
    for side in ("before", "after"):
        values = sorted(r.cpu["total_s"] / r.num_samples for r in runs
                        if r.label == side and r.cpu and r.num_samples)
        if not values:
            return None
        out[side] = values[(len(values) - 1) // 2]
    return out
