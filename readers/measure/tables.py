"""Report formatting: the aligned tables of ``bench``, ``verify`` and ``tune``, and the per-batch plot."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from .report import RunReport, fmt_bytes

__all__ = ["format_table", "terminal_width", "MIN_WRAP_WIDTH", "format_report", "format_comparison",
           "comparison_headline", "verdict_headline", "verify_headline", "decode_cost_note", "reencode_text",
           "comparison_rows", "report_rows", "tune_rows", "TUNE_HEADER", "plot_runs", "COMPACT_ROWS"]


#: Narrowest width a table is wrapped to, columns (narrower: cells would be cut into pieces of a
#: few characters, or, at 0, dropped; the table is shown unwrapped instead).
MIN_WRAP_WIDTH = 40


def _printable(cell) -> str:
    """A cell as text with its control characters escaped (``\\x1b``, ``\\n``): a cell never moves
    the cursor, colours or clears the terminal, nor breaks the table's lines."""
    text = str(cell)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def _plain_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None) -> str:
    all_rows = [list(header)] if header else []
    all_rows += [list(r) for r in rows]
    if not all_rows:
        return ""
    ncol = max(len(r) for r in all_rows)
    for r in all_rows:
        r += [""] * (ncol - len(r))
    widths = [max(len(r[i]) for r in all_rows) for i in range(ncol)]
    lines = []
    for j, r in enumerate(all_rows):
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, ncol)]
        lines.append("  ".join(cells).rstrip())
        if header and j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def terminal_width() -> int | None:
    """The width of the terminal standard output is, in columns; None when it is not a terminal
    (a pipe, a file, a test runner), where tables are never wrapped (so they stay grep-able)."""
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size().columns


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, *,
                 width: int | None = None) -> str:
    """Align ``rows`` in columns (first column left-aligned, the others right-aligned).

    Args:
        rows: the cells, as strings (control characters, e.g. a terminal escape in a file name,
            are shown escaped: ``\\x1b``).
        header: the column names (underlined); None for none.
        width: the widest a line may be, in columns. A table wider than that is laid out by
            ``rich`` with its cells wrapped to fit. None: :func:`terminal_width` (no wrapping when
            standard output is not a terminal). Below :data:`MIN_WRAP_WIDTH` (a terminal that
            reports 0 columns, a very narrow one) the table is not wrapped: every cell is shown whole.
    """
    rows = [[_printable(c) for c in r] for r in rows]
    header = None if header is None else [_printable(c) for c in header]
    plain = _plain_table(rows, header)
    if width is None:
        width = terminal_width()
    if width is None or width < MIN_WRAP_WIDTH or not plain or max(len(line) for line in plain.splitlines()) <= width:
        return plain
    return _wrapped_table(rows, header, width)


def _wrapped_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None, width: int) -> str:
    """The table laid out by ``rich`` to fit ``width`` columns, cells wrapped at spaces."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    ncol = max(len(r) for r in ([header] if header else []) + [list(r) for r in rows])
    table = Table(box=box.SIMPLE_HEAD if header else None, show_header=bool(header), pad_edge=False,
                  show_edge=False, padding=(0, 1))
    names = list(header or [""] * ncol) + [""] * (ncol - len(header or []))
    for i, name in enumerate(names):
        table.add_column(Text(name), justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        cells = list(r) + [""] * (ncol - len(r))
        table.add_row(*(Text(str(c)) for c in cells))
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False,
            emoji=False).print(table)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")


def _batches_text(r: RunReport) -> str:
    """``"30 x 64 = 1920"``; with partial batches (an epoch's last) the real count:
    ``"30 batches (28 x 64, 2 partial) = 1900"``."""
    sizes = list((r.batches or {}).get("num_samples") or [])
    bs = r.config.get("batch_size")
    if not sizes or not isinstance(bs, int) or all(n == bs for n in sizes):
        return f"{r.num_batches} x {bs if bs is not None else '?'} = {r.num_samples}"
    full = sum(1 for n in sizes if n == bs)
    return f"{r.num_batches} batches ({full} x {bs}, {len(sizes) - full} partial) = {r.num_samples}"


#: The rows of the compact table (the default of ``bench`` and ``verify``); ``--details`` shows every row.
COMPACT_ROWS = ("source", "images/s", "wait for data, ms (mean/p50/p95)", "compute, ms (mean/p50/p95)", "data stall",
                "GPU utilisation", "CPU per image, main + workers", "page cache", "images/s incl. warm-up (cold start)",
                "device")


def _report_rows(r: RunReport, details: bool = True) -> list[tuple[str, str]]:
    """One run's rows, ``(name, value)``: every row, or with ``details=False`` those of
    :data:`COMPACT_ROWS` (the GPU utilisation only on CUDA)."""
    rows = _all_report_rows(r)
    if details:
        return rows
    on_cuda = r.device.startswith("cuda")
    return [row for row in rows if row[0] in COMPACT_ROWS and (on_cuda or row[0] != "GPU utilisation")]


def _all_report_rows(r: RunReport) -> list[tuple[str, str]]:
    cfg = r.config
    rows = [
        ("source", f"{cfg.get('source_format', '?')}: {cfg.get('source', '?')}"),
        ("images/s", f"{r.images_per_s:.1f}"),
        ("batches x images", _batches_text(r)),
        ("measured time", f"{r.seconds:.2f} s"),
        ("wait for data, ms (mean/p50/p95)", f"{_ms(r.t_wait_s.mean)} / {_ms(r.t_wait_s.p50)} / {_ms(r.t_wait_s.p95)}"),
        *([("  of which in the loader, ms (mean/p50/p95)",
            f"{_ms(r.t_loader_wait_s.mean)} / {_ms(r.t_loader_wait_s.p50)} / {_ms(r.t_loader_wait_s.p95)}")]
          if r.t_loader_wait_s is not None else []),
        ("compute, ms (mean/p50/p95)",
         f"{_ms(r.t_compute_s.mean)} / {_ms(r.t_compute_s.p50)} / {_ms(r.t_compute_s.p95)}"),
        ("data stall", f"{r.stall_share:.0%}"),
        ("GPU utilisation", "n/a (not CUDA)" if not r.device.startswith("cuda")
         else (f"{r.gpu_util:.0%}" if r.gpu_util is not None else "n/a (no NVML)")),
    ]
    if r.gpu:
        nv = r.gpu.get("nvml") or {}
        rows.append(("GPU memory (NVML max / torch max)",
                     f"{fmt_bytes(nv.get('memory_used_max_bytes'))} / {fmt_bytes(r.gpu.get('max_allocated_bytes'))}"))
    if r.cpu:
        nw = (cfg.get("loader") or {}).get("num_workers")
        rows.append(("CPU, loader workers", f"{r.cpu['workers_cores']:.2f} cores ({nw} workers)"))
        rows.append(("CPU, main process", f"{r.cpu['main_cores']:.2f} cores"))
        rows.append(("CPU, main + workers", f"{r.cpu['util_share']:.0%} of {r.cpu['cpu_count']} cores"))
        if r.num_samples:
            rows.append(("CPU per image, main + workers", f"{r.cpu['total_s'] / r.num_samples * 1000:.2f} ms"))
        if r.cpu.get("others_share") is not None:
            rows.append(("CPU, other processes", f"{r.cpu['others_share']:.0%} of {r.cpu['cpu_count']} cores"))
    if r.io:
        rows.append(("read from disk", f"{fmt_bytes(r.io['read_bytes_per_s'])}/s"
                     + (f" ({fmt_bytes(r.io['read_bytes_with_warmup'])} incl. warm-up)"
                        if r.io.get("read_bytes_with_warmup") is not None else "")))
        rows.append(("read calls (incl. page cache)", f"{fmt_bytes(r.io['rchar_per_s'])}/s"))
    if r.memory:
        m = r.memory
        rows.append(("memory, main (RSS start -> end)",
                     f"{fmt_bytes(m['main_rss_start_bytes'])} -> {fmt_bytes(m['main_rss_end_bytes'])}"))
        rows.append(("memory, workers (RSS start -> end)",
                     f"{fmt_bytes(m['workers_rss_start_bytes'])} -> {fmt_bytes(m['workers_rss_end_bytes'])}"))
        rows.append(("memory growth", ("YES " if m["growth_flag"] else "no, ") + f"{fmt_bytes(m['growth_bytes'])}"))
    if r.system:
        rows.append(("swap in use", fmt_bytes(r.system.get("swap_used_end_bytes"))))
        if r.system.get("iowait_share") is not None:
            rows.append(("CPU time in I/O wait (machine)", f"{r.system['iowait_share']:.1%}"))
    if r.cache is None:
        rows.append(("page cache", "not evicted (as found; --cold evicts)"))
    else:
        rows.append(("page cache", _cache_text(r.cache)))
    if r.warmup_s is not None:
        warm = f"{cfg.get('warmup', '?')} batches, {r.warmup_samples} images in {r.warmup_s:.2f} s (not measured)"
        rows.append(("warm-up", warm))
        if r.cache is not None and r.images_per_s_with_warmup is not None:
            rows.append(("images/s incl. warm-up (cold start)", f"{r.images_per_s_with_warmup:.1f}"))
    rows.append(("device", f"{r.device} ({r.timing})"))
    return rows


def _cache_text(c: dict) -> str:
    """The report's page-cache row for what :func:`evict_page_cache` returned."""
    after, total = c.get("cached_bytes_after"), c.get("bytes") or 0
    checked = total - (c.get("unmeasurable_bytes") or 0)
    if not c.get("files"):
        state = "not evicted (no local files)"
    elif c.get("unmeasurable_files") == c.get("files"):
        state = f"evicted, not measurable on this file system ({', '.join(sorted(c.get('unmeasurable_fs') or {}))})"
    elif after is None or not checked:
        state = "evicted (unchecked)"
    elif c.get("ignored"):
        state = f"NOT evicted, {after / checked:.0%} left"
    else:
        state = f"evicted, {after / checked:.0%} left"
    return f"{state} of {c.get('files', 0)} files, {fmt_bytes(total)}"


def format_report(report: RunReport, *, details: bool = False) -> str:
    """The aligned table of one run (``bench``): the rows of :data:`COMPACT_ROWS`, every row with
    ``details=True``; then the run's warnings."""
    text = format_table(_report_rows(report, details), header=("", report.label or "run"))
    if report.warnings:
        text += "\n" + "\n".join(f"warning: {w}" for w in report.warnings)
    return text


def comparison_headline(speedup: float, stall_before: float, stall_after: float) -> str:
    """``"2.9x faster; data stall 71% -> 6%"`` (or ``"1.3x slower; ..."``)."""
    if 0.95 <= speedup < 1.05:
        head = f"no clear difference ({speedup:.2f}x)"
    elif speedup >= 1:
        head = f"{speedup:.1f}x faster"
    elif speedup > 0:
        head = f"{1 / speedup:.1f}x slower ({speedup:.2f}x)"
    else:
        head = "no throughput"
    return f"{head}; data stall {stall_before:.0%} -> {stall_after:.0%}"


def verdict_headline(verdict: dict | None, speedup: float, stall_before: float, stall_after: float) -> str:
    """``verify``'s last line: the verdict of :func:`~shardfeed.readers.measure.verdict.judge_rounds`
    and the data stall (``"2.9x faster; rounds vary by 4%; data stall 71% -> 6%"``); without a
    verdict, :func:`comparison_headline`."""
    if not verdict:
        return comparison_headline(speedup, stall_before, stall_after)
    return f"{verdict['text']}; data stall {stall_before:.0%} -> {stall_after:.0%}"


def reencode_text(reencode: dict) -> str:
    """``{"resize": 256, "quality": 90, ...}`` (a manifest's ``options["reencode"]``) ->
    ``"resize 256, quality 90"``."""
    parts = []
    if reencode.get("resize"):
        mode = reencode.get("resize_mode")
        parts.append(f"resize {reencode['resize']}" + (f" ({mode})" if mode else ""))
    if reencode.get("quality"):
        parts.append(f"quality {reencode['quality']}")
    fmt = reencode.get("image_format")
    if fmt and fmt not in ("auto", "keep"):
        parts.append(f"format {fmt}")
    return ", ".join(parts) or "re-encoded"


def decode_cost_note(result: Any) -> str | None:
    """``verify``: when a side was re-encoded at pack time (``--resize``, ``--quality``,
    ``--image-format`` in its manifest), the line saying that the difference includes decode cost,
    with each side's CPU time per image; None when neither side was re-encoded."""
    changed = [(name, getattr(result, name).config.get("reencode")) for name in ("before", "after")]
    changed = [(name, r) for name, r in changed if r]
    if not changed:
        return None
    what = " and ".join(f"{name.upper()} was re-encoded at pack time ({reencode_text(r)})" for name, r in changed)
    text = f"the difference includes decode cost, not only reading: {what}"
    cpi = result.cpu_s_per_image
    if cpi:
        text += (f"; CPU per image BEFORE {cpi['before'] * 1000:.2f} ms, AFTER {cpi['after'] * 1000:.2f} ms")
    return text


#: Both sides of a ``verify`` using this share of the machine's cores or more are CPU-bound.
CPU_BOUND_SHARE = 0.85


def limit_note(result: Any) -> str | None:
    """``verify``: why both sides stall alike, when they do (a data stall of 10 % or more on both
    sides and no clear gain): the conversion to float on a CPU device, or saturated cores; None
    otherwise."""
    b, a = result.before, result.after
    verdict = result.verdict or {}
    if min(b.stall_share, a.stall_share) < 0.10 or verdict.get("kind") == "faster":
        return None
    if b.t_loader_wait_s is not None and a.t_loader_wait_s is not None and not b.device.startswith("cuda"):
        conv_b = b.t_wait_s.mean - b.t_loader_wait_s.mean
        conv_a = a.t_wait_s.mean - a.t_loader_wait_s.mean
        if conv_b >= 0.5 * b.t_wait_s.mean and conv_a >= 0.5 * a.t_wait_s.mean:
            size = b.config.get("image_size")
            return (f"most of each side's wait ({_ms(conv_b)} of {_ms(b.t_wait_s.mean)} ms and {_ms(conv_a)} of "
                    f"{_ms(a.t_wait_s.mean)} ms per batch) is the conversion of the batch to normalized float on "
                    f"the CPU, in the main process, the same work on both sides; the loaders' own wait is "
                    f"{_ms(b.t_loader_wait_s.mean)} -> {_ms(a.t_loader_wait_s.mean)} ms. On a GPU the conversion "
                    f"runs on the device (--device cuda); here a smaller --image-size (now {size}) cuts it")
    if b.cpu and a.cpu and min(b.cpu["util_share"], a.cpu["util_share"]) >= CPU_BOUND_SHARE:
        return (f"both sides keep the CPU busy ({b.cpu['util_share']:.0%} and {a.cpu['util_share']:.0%} of "
                f"{b.cpu['cpu_count']} cores): decoding and resizing, not reading, set the pace on this storage; "
                "packing pays where reads are slow (network or cold cloud storage), and "
                "`shardfeed pack --resize N` or more cores cut the decoding")
    return None


def verify_headline(result: Any) -> str:
    """``verify``'s verdict line for a :func:`~shardfeed.readers.measure.verify.compare_sources`
    result: :func:`verdict_headline`, then :func:`decode_cost_note` when a side was re-encoded."""
    head = verdict_headline(result.verdict, result.speedup, result.stall_share_before, result.stall_share_after)
    note = decode_cost_note(result)
    return f"{head} ({note})" if note else head


def comparison_rows(result: Any, *, details: bool = False) -> list[tuple[str, str, str]]:
    """The rows of ``verify``'s side-by-side table (a :class:`~shardfeed.readers.measure.verify.VerifyReport`):
    ``(name, BEFORE, AFTER)``; those of :data:`COMPACT_ROWS`, every row with ``details=True``."""
    rb, ra = _report_rows(result.before, details), _report_rows(result.after, details)
    return [(name, vb, va) for (name, vb), (_, va) in zip(rb, ra)]


def report_rows(report: RunReport, *, details: bool = False) -> list[tuple[str, str]]:
    """The rows of one run's table (``bench``): ``(name, value)``; those of :data:`COMPACT_ROWS`,
    every row with ``details=True``."""
    return _report_rows(report, details)


TUNE_HEADER = ("step", "round", "workers", "pin", "prefetch", "persistent", "images/s", "stall", "took s", "best")


def tune_rows(result: Any) -> list[tuple[str, ...]]:
    """The rows of ``tune``'s table, one per trial in the order run (columns :data:`TUNE_HEADER`;
    ``*`` marks the best: the median round of the setting kept)."""
    rows = []
    for t in result.trials:
        o = t["options"]
        workers = o.get("num_workers")
        rows.append((t["step"], str(t.get("round", "")), str(workers), str(o.get("pin_memory")),
                     str(o.get("prefetch_factor")) if workers else "-",
                     str(o.get("persistent_workers")) if workers else "-", f"{t['images_per_s']:.1f}",
                     f"{t['stall_share']:.0%}", f"{t['seconds']:.1f}", "*" if t is result.best else ""))
    return rows


def _rounds_lines(verdict: dict, repeats: int) -> list[str]:
    lines = [f"rounds: {repeats}, alternating (the median run of each side is shown above); images/s in run order:"]
    for name in ("before", "after"):
        d = verdict[name]
        spread = "" if d["spread_share"] is None or len(d["rounds"]) < 2 else f", spread {d['spread_share']:.0%}"
        lines.append(f"  {name.upper():6s} {' '.join(f'{x:.0f}' for x in d['rounds'])} "
                     f"(median {d['median']:.0f}{spread})")
    if verdict.get("others_cpu_share_max") is not None:
        lines.append(f"  other processes took up to {verdict['others_cpu_share_max']:.0%} of the CPU during a run")
    return lines


def _settle_text(settle: dict | None) -> str | None:
    if not settle:
        return None
    if not settle.get("method"):
        return "disk not settled: no sync() on this platform"
    dirty = settle.get("dirty_bytes_before")
    what = f"{fmt_bytes(dirty)} of dirty pages" if dirty is not None else "dirty pages"
    return f"disk settled before measuring: sync() wrote back {what} in {settle['seconds']:.1f} s"


def _warm_text(warm: dict | None) -> str | None:
    if not warm:
        return None
    if warm.get("skipped"):
        return f"page cache not warmed: {warm['skipped']}"
    cached, total = warm.get("cached_bytes_after"), warm.get("bytes") or 0
    if warm.get("residency"):
        share = f" ({warm['residency'].split(':')[0]})"
    else:
        share = f" ({cached / total:.0%} of it cached)" if cached is not None and total else ""
    return (f"page cache warmed before measuring: read {fmt_bytes(warm['read_bytes'])} of both datasets "
            f"in {warm['seconds']:.1f} s{share}")


def format_comparison(result: Any, *, details: bool = False) -> str:
    """Both median runs side by side, the rounds, then the verdict (``verify``).

    The default is compact: the rows of :data:`COMPACT_ROWS`, the warnings, the rounds (the
    verdict's evidence), the verdict and its advice. ``details=True`` adds every other row, how the
    disk was settled and the cache warmed, and each side's median CPU time per image.
    """
    b, a = result.before, result.after
    text = format_table(comparison_rows(result, details=details), header=("", "BEFORE", "AFTER"))
    warnings = [f"before: {w}" for w in b.warnings] + [f"after: {w}" for w in a.warnings]
    if warnings:
        text += "\n" + "\n".join(f"warning: {w}" for w in dict.fromkeys(warnings))
    verdict = result.verdict
    lines = [_settle_text(result.settle), _warm_text(result.warm_cache)] if details else []
    if verdict:
        lines += _rounds_lines(verdict, result.repeats)
    cpi = result.cpu_s_per_image
    if cpi and details:
        lines.append(f"  CPU per image (main + workers), median: BEFORE {cpi['before'] * 1000:.2f} ms, "
                     f"AFTER {cpi['after'] * 1000:.2f} ms (little moved by other processes' load)")
    why = limit_note(result)
    if why:
        lines.append(f"why: {why}")
    text += "".join(f"\n{line}" for line in lines if line)
    text += "\n" + verify_headline(result)
    if verdict:
        text += "".join(f"\nadvice: {line}" for line in verdict["advice"])
    return text


def plot_runs(runs: Sequence[RunReport], path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Draw the runs' delivery figure (:func:`~shardfeed.readers.measure.figures.plot_delivery`) into a PNG.

    On one axis the images each run delivered over time; beside it each run's time split into
    waiting for data and compute; below, the wait of every batch over time.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'shardfeed[plot]'``).
    """
    from .figures import plot_delivery, series_of_run

    return plot_delivery([series_of_run(r) for r in runs], path, title=title)
