"""What one measured run produced: :class:`RunReport`, its timing summary and small number helpers.

The data classes that ``bench``, ``verify`` and ``tune`` return and write as JSON; the tables
that print them live in :mod:`shardfeed.readers.measure.tables`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from ..errors import ShardfeedError

__all__ = ["DatasetMismatchError", "TimingStats", "RunReport", "percentile", "fmt_bytes"]


class DatasetMismatchError(ShardfeedError, ValueError):
    """``verify``: the two datasets do not hold the same samples or classes."""


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), without numpy.

    Args:
        values: at least one number.
        q: the percentile, 0 to 100.
    """
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def fmt_bytes(n: float | None) -> str:
    """``1234567`` bytes -> ``"1.2 MB"`` (decimal units); ``"n/a"`` for None."""
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


@dataclasses.dataclass
class TimingStats:
    """Mean, median and 95th percentile of per-batch times, seconds."""

    mean: float
    p50: float
    p95: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "TimingStats":
        """The summary of per-batch times in seconds (all zero for no values)."""
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(float(statistics.fmean(values)), percentile(values, 50), percentile(values, 95))

    def to_json(self) -> dict:
        """``{"mean", "p50", "p95"}``, seconds."""
        return {"mean": self.mean, "p50": self.p50, "p95": self.p95}


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
        batches: per-batch ``t_start_s`` (from the window start), ``t_wait_s``, ``t_compute_s`` (s) and
            ``num_samples`` (images in the batch).
        epochs: loader epochs started during the run (warm-up included).
        label: a name for tables (``"before"``, ``"after"``, a tune step).
        warnings: human-readable warnings about the measurement.
        warmup_s: wall time of the warm-up (worker start-up, the first reads, a shuffle buffer
            filling, and the warm-up batches' steps), s; None when not timed.
        warmup_samples: images in the warm-up batches.
        t_loader_wait_s: the part of ``t_wait_s`` spent in the loader (``next``), s; the rest is
            the copy to the device and the conversion to normalized float (on a CPU device done by
            the main process's CPU, where a GPU does it on the device); None when not measured.
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
    warmup_s: float | None = None
    warmup_samples: int = 0
    t_loader_wait_s: TimingStats | None = None

    @property
    def images_per_s_with_warmup(self) -> float | None:
        """Images per second over the warm-up and the measured window together: on a cold run,
        the rate that counts the reads done before the window (None when the warm-up was not timed)."""
        if self.warmup_s is None:
            return None
        total_s = self.warmup_s + self.seconds
        return (self.warmup_samples + self.num_samples) / total_s if total_s > 0 else None

    def to_json(self, *, per_batch: bool = True) -> dict:
        """Every figure as a JSON-able dict (``per_batch=False`` drops the per-batch lists)."""
        d = dataclasses.asdict(self)
        d["t_wait_s"] = self.t_wait_s.to_json()
        d["t_compute_s"] = self.t_compute_s.to_json()
        d["images_per_s_with_warmup"] = self.images_per_s_with_warmup
        d["t_loader_wait_s"] = self.t_loader_wait_s.to_json() if self.t_loader_wait_s is not None else None
        if not per_batch:
            d.pop("batches", None)
        return d

