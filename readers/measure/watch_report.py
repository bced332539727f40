"""What :class:`~shardfeed.readers.measure.watch.Watch` reports: :class:`WatchReport` and its figures.

The timing lives in :mod:`.watch`, the process sampling in :mod:`.sampling` and the diagnosis rules
in :mod:`.watch_rules`; this module counts the samples in a batch and turns the sampled figures and
the timed waits and steps into the report.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any

from .report import fmt_bytes, percentile
from .watch_rules import pct

__all__ = ["WatchReport", "batch_length", "timing_stats", "per_batch_figures", "sampled_figures", "reports_to_json",
           "MAX_PER_BATCH", "SWAP_GROWTH_WARN_BYTES"]

#: Swap growth over a watch warned about (the machine is short of memory).
SWAP_GROWTH_WARN_BYTES = 128 * 1024 * 1024


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


def timing_stats(values: list[float]) -> dict:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "total": 0.0}
    return {"mean": float(statistics.fmean(values)), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "total": float(sum(values))}


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
    t_other_s: dict = dataclasses.field(default_factory=lambda: timing_stats([]))
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





#: The most batches a report lists one by one (``WatchReport.per_batch``; the figure's points).
MAX_PER_BATCH = 20_000


def per_batch_figures(waits: list[float], steps: list[float], sizes: list[int | None]) -> dict:
    n = min(len(waits), len(steps), MAX_PER_BATCH)
    counts = sizes[:n]
    return {"t_wait_s": waits[:n], "t_step_s": steps[:n],
            "num_samples": None if any(c is None for c in counts) else counts,
            "truncated": len(steps) > MAX_PER_BATCH}




def reports_to_json(reports: list[WatchReport]) -> str:
    """A list of reports as one JSON document (``{"loaders": [...]}``)."""
    return json.dumps({"loaders": [r.to_json() for r in reports]}, indent=2)


def _mean_of(per: list[dict], key: str) -> float | None:
    values = [w[key] for w in per if w[key] is not None]
    return statistics.fmean(values) if values else None


def sampled_figures(snap: dict, num_workers: int | None, ready: list, waits: list[float],
                    batch_tensors: int | None) -> dict:
    """The report's ``workers``, ``main``, ``io``, ``memory``, ``system`` and ``gpu_util`` from a
    :meth:`~shardfeed.readers.measure.sampling.ProcessSampler.snapshot` (see :class:`WatchReport`),
    with ``warnings`` about the machine and ``num_workers`` (0 for an unknown count when no worker
    process was seen, else as given).

    Args:
        snap: the sampler's snapshot.
        num_workers: the loader's ``num_workers`` (None: unknown; 0 when no worker process was seen).
        ready: per timed wait, whether the batch due had come back from a worker (None: not known).
        waits: the waits counted in the stall share, seconds.
        batch_tensors: tensors in one batch from the workers (None: not known).
    """
    per = [w for w in snap["workers"] if w["watched_s"] > 0]
    if num_workers is None and not per:  # an iterable that is no DataLoader and no worker process seen
        num_workers = 0
    flagged = [(r, t) for r, t in zip(ready[:len(waits)], waits) if r is not None]
    flagged_wait = sum(t for _, t in flagged)
    workers = {"num": num_workers if num_workers is not None else len(per),
               "cpu_busy_share": _mean_of(per, "cpu_busy_share"),
               "cpu_demand_share": _mean_of(per, "cpu_demand_share"),
               "runqueue_share": _mean_of(per, "runqueue_share"),
               "disk_sleep_share": _mean_of(per, "disk_sleep_share"),
               "batch_ready_share": (sum(r for r, _ in flagged) / len(flagged)) if flagged else None,
               "ready_wait_share": (sum(t for r, t in flagged if r) / flagged_wait) if flagged_wait > 0 else None,
               "batch_tensors": batch_tensors, "per_worker": per}
    m = snap["main"]
    main = {k: m[k] for k in ("cpu_s", "cpu_busy_share", "cpu_demand_share", "rss_bytes")}
    span = max(m["watched_s"], 1e-9)
    chars = [x["read_chars"] for x in [m, *snap["workers"]] if x["read_chars"] is not None]
    rbytes = [x["read_bytes"] for x in [m, *snap["workers"]] if x["read_bytes"] is not None]
    system = dict(snap["system"])
    io = {"read_chars": sum(chars) if chars else None, "read_bytes": sum(rbytes) if rbytes else None,
          "read_chars_per_s": sum(chars) / span if chars else None,
          "read_bytes_per_s": sum(rbytes) / span if rbytes else None,
          "iowait_share": system["iowait_share"]}
    memory = {"memory_available_min_bytes": system["memory_available_min_bytes"],
              "swap_growth_bytes": system["swap_growth_bytes"]}
    warnings = []
    if system["swap_growth_bytes"] > SWAP_GROWTH_WARN_BYTES:
        warnings.append(f"swap use grew by {fmt_bytes(system['swap_growth_bytes'])}: the machine is short of memory")
    gpu_util = snap["gpu"]["util_mean"] if snap["gpu"] else None
    return {"workers": workers, "main": main, "io": io, "memory": memory, "system": system, "gpu_util": gpu_util,
            "warnings": warnings, "num_workers": num_workers}
