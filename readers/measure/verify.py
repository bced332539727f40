"""``verify``: check AFTER against BEFORE, then measure both with the same loop in alternating rounds."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .bench import bench_source
from .cache import dataset_files, settle_disk, warm_page_cache
from .check import check_same_samples
from .report import RunReport
from .verdict import judge_rounds, others_cpu_shares

__all__ = ["compare_sources"]


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
                    deep: bool = False, check: bool = True, settle: bool = True, warm_cache: bool = True,
                    progress: Callable[[str], None] | None = None, **bench_options: Any) -> dict:
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
        progress: called with a line of text before the page-cache warm-up and before each run.
        **bench_options: :func:`bench_source` options (model, device, batch size, loader knobs).

    Returns:
        ``{"before": run, "after": run, "speedup", "stall_share_before", "stall_share_after",
        "check", "repeats", "cold", "settle", "warm_cache", "verdict", "cpu_s_per_image",
        "runs": [run, ...]}``
        (runs are :class:`RunReport`); ``cpu_s_per_image`` each side's median CPU s per image (None
        without ``/proc``); ``speedup`` = AFTER's median images/s ÷ BEFORE's; ``settle`` what
        :func:`settle_disk` did (None with ``settle=False``); ``warm_cache`` what
        :func:`warm_page_cache` did (None with ``cold``); ``verdict`` the dict of
        :func:`judge_rounds` (``kind``, ``text``, both sides' rounds, spread, others' CPU share).

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
        checked = _run_in_child(check_same_samples, before, after, deep=deep) if cold else \
            check_same_samples(before, after, deep=deep)
    files = dataset_files(before) + dataset_files(after)
    settled = settle_disk() if settle else None
    warmed = None
    if warm_cache and not cold:
        if progress:
            progress(f"warming the page cache: reading both datasets once ({len(files)} files)")
        warmed = warm_page_cache(files)
    evict = files if cold else None
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
    verdict = judge_rounds([x.images_per_s for x in runs if x.label == "before"],
                           [x.images_per_s for x in runs if x.label == "after"], others_cpu_shares(runs)) \
        if best_b.images_per_s > 0 else None
    return {"before": best_b, "after": best_a, "speedup": speedup, "stall_share_before": best_b.stall_share,
            "stall_share_after": best_a.stall_share, "check": checked, "repeats": repeats, "cold": cold,
            "settle": settled, "warm_cache": warmed, "verdict": verdict, "cpu_s_per_image": _cpu_per_image(runs),
            "runs": runs}


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
