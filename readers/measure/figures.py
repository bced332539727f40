"""Pictures of a measurement: what ``--plot`` draws for ``bench``, ``verify``, ``tune`` and ``watch``.

Each figure is meant to be read at a glance:

* :func:`plot_delivery` (``bench``, ``verify``, ``watch``): on ONE axis, the images each run
  delivered to the training loop over time (the steeper line is the faster loader); beside it, one
  bar per run splitting its time into *waiting for data* and *compute*; below, the wait of every
  batch over time (a data stall shows as a line far above zero).
* :func:`plot_tune` (``tune``): images/s of every setting tried, in sweep order, the kept one
  marked.

matplotlib is an optional dependency (the ``plot`` extra); every function raises ImportError with
the install command when it is missing. The figures are written as PNG (``Agg`` backend, no display
needed).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import textwrap
from pathlib import Path
from typing import Any, Sequence

__all__ = ["DeliverySeries", "plot_delivery", "plot_tune", "series_of_run", "series_of_watch", "PLOT_INSTALL_HINT"]

#: What the error says when matplotlib is missing.
PLOT_INSTALL_HINT = "pip install 'shardfeed[plot]' (or pip install matplotlib)"

_WAIT_COLOUR, _STEP_COLOUR = "#d62728", "#1f77b4"
_SIDE_COLOURS = ("#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")


@dataclasses.dataclass
class DeliverySeries:
    """One run's per-batch timings, as the delivery plot reads them.

    Attributes:
        label: the legend's name (``"BEFORE folder"``, ``"epoch 0"``).
        t_start_s: each batch's request time from the start of the run, seconds.
        t_wait_s: each batch's wait for data, seconds.
        t_step_s: each batch's step (compute) time, seconds.
        num_samples: images in each batch (None: unknown, the plot then counts batches).
        images_per_s: the run's measured rate for the legend (None: images over the last arrival).
    """

    label: str
    t_start_s: Sequence[float]
    t_wait_s: Sequence[float]
    t_step_s: Sequence[float]
    num_samples: Sequence[int] | None = None
    images_per_s: float | None = None


def series_of_run(run: Any, label: str | None = None) -> DeliverySeries:
    """The :class:`DeliverySeries` of a :class:`~shardfeed.readers.measure.report.RunReport`."""
    b = run.batches or {}
    fmt = (run.config or {}).get("source_format", "")
    name = label or " ".join(x for x in ((run.label or "run").upper(), fmt) if x)
    return DeliverySeries(name, b.get("t_start_s", []), b.get("t_wait_s", []), b.get("t_compute_s", []),
                          b.get("num_samples"), run.images_per_s)


def series_of_watch(report: Any, label: str | None = None) -> DeliverySeries:
    """The :class:`DeliverySeries` of a :class:`~shardfeed.readers.measure.watch.WatchReport` (or its
    JSON form): each request starts when the previous step ends, so the start times are the running
    sum of wait + step."""
    doc = report.to_json() if hasattr(report, "to_json") else report
    b = doc.get("per_batch") or {}
    waits, steps = list(b.get("t_wait_s") or []), list(b.get("t_step_s") or [])
    starts, t = [], 0.0
    for w, st in zip(waits, steps):
        starts.append(t)
        t += float(w) + float(st)
    return DeliverySeries(label or str(doc.get("label") or "loader"), starts, waits, steps, b.get("num_samples"),
                          doc.get("samples_per_s"))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"--plot needs matplotlib: {PLOT_INSTALL_HINT}") from None
    return plt


def _finite(x) -> float | None:
    """``x`` as a float, or None when it is not a finite number (NaN, inf, None, text)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _save(fig, path: str | os.PathLike, **kwargs) -> Path:
    """Save ``fig`` as PNG at ``path`` atomically (a temporary file beside it, renamed): a link at
    ``path`` is replaced, never written through, and an interrupted save leaves no half PNG."""
    from ..file_io import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", **kwargs)
    out = Path(path)
    write_bytes_atomic(out, buf.getvalue())
    return out


def _cumulative(series: DeliverySeries) -> tuple[list[float], list[float], str]:
    """(times, delivered counts, unit): a step at each batch's arrival (its request + wait); a
    batch whose timings are not finite numbers still counts, at the previous arrival's time."""
    sizes = list(series.num_samples) if series.num_samples else None
    unit = "images" if sizes else "batches"
    xs, ys, total = [0.0], [0.0], 0.0
    for i, (t0, w) in enumerate(zip(series.t_start_s, series.t_wait_s)):
        n = _finite(sizes[i]) if sizes and i < len(sizes) else 1.0
        total += n if n is not None and n >= 0 else 0.0
        t0, w = _finite(t0), _finite(w)
        xs.append(t0 + w if t0 is not None and w is not None else xs[-1])
        ys.append(total)
    return xs, ys, unit


def plot_delivery(series: Sequence[DeliverySeries], path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Draw the delivery figure of one or more runs into a PNG at ``path``.

    Args:
        series: the runs, in the order of the legend (BEFORE first for ``verify``).
        path: the PNG to write (its folder must exist; written atomically: a symbolic link at
            ``path`` is replaced by the file, its target left alone). Timings that are not finite
            numbers (NaN, inf) are left out of the lines and sums, never an error.
        title: the figure's title (e.g. the verdict line).

    Returns:
        ``path`` as a Path.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: no series.
    """
    if not series:
        raise ValueError("plot_delivery needs at least one run")
    plt = _pyplot()
    fig = _delivery_figure(plt, series, title)
    try:
        return _save(fig, path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def _delivery_figure(plt: Any, series: Sequence[DeliverySeries], title: str | None) -> Any:
    """The delivery figure of :func:`plot_delivery`, drawn but not saved (the caller closes it)."""
    fig = plt.figure(figsize=(11, 6.2))
    grid = fig.add_gridspec(2, 3, height_ratios=(3, 1.4), hspace=0.45, wspace=0.35)
    ax_del = fig.add_subplot(grid[0, :2])
    ax_bar = fig.add_subplot(grid[0, 2])
    ax_wait = fig.add_subplot(grid[1, :], sharex=ax_del)
    unit = "images"
    for i, s in enumerate(series):
        colour = _SIDE_COLOURS[i % len(_SIDE_COLOURS)]
        xs, ys, unit = _cumulative(s)
        rate = _finite(s.images_per_s) if unit == "images" else None
        if rate is None:
            rate = ys[-1] / max(xs) if max(xs) > 0 else 0.0
        ax_del.plot(xs, ys, drawstyle="steps-post", color=colour, linewidth=2,
                    label=f"{s.label}: {rate:,.0f} {unit}/s")
        points = [(t, w) for t, w in ((_finite(t), _finite(w)) for t, w in zip(s.t_start_s, s.t_wait_s))
                  if t is not None and w is not None]  # a non-finite timing is left out, never fatal
        ax_wait.plot([t for t, _ in points], [w * 1000 for _, w in points],
                     drawstyle="steps-post", color=colour, linewidth=1.2, label=s.label)
    ax_del.set_ylabel(f"{unit} delivered")
    ax_del.set_title(f"{unit.capitalize()} delivered to the training loop (steeper is faster)", fontsize=10)
    ax_del.grid(alpha=0.3)
    ax_del.legend(loc="upper left", fontsize=9)
    ax_wait.set_ylabel("wait per batch, ms", fontsize=9)
    ax_wait.set_xlabel("time since the first measured batch, s")
    ax_wait.grid(alpha=0.3)
    _time_bars(ax_bar, series)
    if title:
        wrapped = textwrap.fill(title, 120)
        fig.suptitle(wrapped, fontsize=10, fontweight="bold", y=0.97 + 0.035 * wrapped.count("\n"))
    return fig


def _time_bars(ax: Any, series: Sequence[DeliverySeries]) -> None:
    """One bar per run, its time split into compute and waiting for data. Each run's name sits
    above its bar and the legend above the axes, so no text covers a bar or the plot beside it."""
    waits = [sum(v for v in map(_finite, s.t_wait_s) if v is not None) for s in series]
    steps = [sum(v for v in map(_finite, s.t_step_s) if v is not None) for s in series]
    ypos = list(range(len(series)))[::-1]
    ax.barh(ypos, steps, height=0.5, color=_STEP_COLOUR, label="compute")
    ax.barh(ypos, waits, height=0.5, left=steps, color=_WAIT_COLOUR, label="waiting for data")
    for y, w, c, s in zip(ypos, waits, steps, series):
        share = w / (w + c) if w + c > 0 else 0.0
        ax.text(w + c, y, f" {share:.0%} stall", va="center", fontsize=9)
        ax.text(0, y + 0.3, s.label, va="bottom", ha="left", fontsize=9)
    ax.set_yticks([])
    ax.set_ylim(-0.5, len(series) - 0.2)
    ax.set_xlabel("seconds")
    ax.set_title("Where the time went", fontsize=10, pad=22)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False,
              handlelength=1.2, columnspacing=1.0)
    ax.set_xlim(0, max((w + c for w, c in zip(waits, steps)), default=1.0) * 1.45 or 1.0)


def plot_tune(result: Any, path: str | os.PathLike) -> Path:
    """Draw images/s of every ``tune`` trial in sweep order, the best one marked, into a PNG.

    Args:
        result: the :class:`~shardfeed.readers.measure.tune.TuneReport` of
            :func:`~shardfeed.readers.measure.tune.tune_loader` (``trials`` with ``step``,
            ``options``, ``images_per_s``, ``stall_share``; ``best``).
        path: the PNG to write (atomically, as :func:`plot_delivery`); a trial whose images/s is
            not a finite number is drawn as a zero bar.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: no trials.
    """
    trials = list(result.trials or [])
    if not trials:
        raise ValueError("plot_tune needs at least one trial")
    plt = _pyplot()
    best = result.best
    labels, values, colours = [], [], []
    for t in trials:
        o = t["options"]
        knob = t["step"]
        value = o.get(knob) if knob in o else o.get("num_workers")
        labels.append(f"{knob}={value}")
        values.append(_finite(t.get("images_per_s")) or 0.0)  # a failed or unmeasured trial: a zero bar
        colours.append("#2ca02c" if t is best else "#7f7f7f")
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(trials) + 2), 4.2))
    bars = ax.bar(range(len(trials)), values, color=colours)
    for rect, t in zip(bars, trials):
        share = _finite(t.get("stall_share"))
        ax.text(rect.get_x() + rect.get_width() / 2, rect.get_height(),
                "stall ?" if share is None else f"{share:.0%} stall", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(trials)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=9)
    ax.set_ylabel("images/s")
    ax.set_title("tune: images/s per setting (green: the one kept)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        return _save(fig, path, dpi=100)
    finally:
        plt.close(fig)
