"""``shardfeed bench``, ``shardfeed verify`` and ``shardfeed tune``: the measuring commands.

Plain click commands (:mod:`shardfeed.convert.cli` attaches every command in :data:`COMMANDS`),
thin layers over :func:`~shardfeed.readers.measure.bench_source`,
:func:`~shardfeed.readers.measure.compare_sources` and :func:`~shardfeed.readers.measure.tune_loader`;
heavy modules (torch, the readers) are imported inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import click

from .common import (FiniteFloat, OnErrorChoice, SizeParam, check_report_path, command, deprecated_option, echo,
                     json_option, num_workers_options, write_json_report)
from .storage_options import storage_option, storage_options_of

__all__ = ["COMMANDS", "bench", "verify", "tune", "harness_options", "loader_options", "html_option", "write_html",
           "check_plot"]


def harness_options(f: Callable) -> Callable:
    """The options of the training-loop harness (kebab-case of :func:`run_training_loop`)."""
    opts = [
        click.option("--batch-size", "-b", type=click.IntRange(min=1), default=64, show_default=True,
                     help="Images per batch."),
        click.option("--image-size", type=click.IntRange(min=0), default=224, show_default=True,
                     help="The loader's image_size: shorter side resized to N, centre crop NxN "
                          "(random-resized crop with --train); 0 keeps decoded sizes."),
        click.option("--model", "-m", default="tiny", show_default=True, metavar="NAME",
                     help="tiny (small CNN), resnet18, resnet50, none (no compute: the loader's ceiling), or "
                          "module:callable / file.py:callable (called with num_classes=N)."),
        click.option("--compute-ms", type=FiniteFloat(min=0), default=None, metavar="MS",
                     help="Replace the model by a step that waits MS ms without using the CPU (as a GPU step "
                          "does): would this loader keep up with a GPU needing MS ms per step?"),
        click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N",
                     help="Where the loop runs (auto: CUDA when available)."),
        click.option("--warmup", type=click.IntRange(min=0), default=10, show_default=True,
                     help="Batches run before measuring (not counted)."),
        click.option("--batches", type=click.IntRange(min=1), default=100, show_default=True,
                     help="Batches measured per run."),
        click.option("--channels-last", is_flag=True, help="Channels-last memory format for batch and model."),
        click.option("--threads", "num_threads", type=click.IntRange(min=1), default=None,
                     help="torch threads of the step in the main process [default on the CPU: cores minus "
                          "loader workers, at least 1; on CUDA: torch's]."),
        click.option("--cold", is_flag=True,
                     help="Evict the dataset's files from the page cache before each run "
                          "(posix_fadvise DONTNEED), so the disk is measured, not RAM."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def loader_options(f: Callable, *, sweep: bool = False) -> Callable:
    """``make_loader`` / ``open_dataset`` options (``sweep=True`` leaves out the knobs tune sweeps)."""
    opts = []
    if not sweep:
        opts += [
            click.option("--pin-memory/--no-pin-memory", default=None,
                         help="Pinned host memory for non-blocking copies [default: on with CUDA]."),
            click.option("--prefetch-factor", type=click.IntRange(min=1), default=2, show_default=True,
                         help="Batches each worker prepares ahead."),
            click.option("--persistent-workers/--no-persistent-workers", default=True, show_default=True,
                         help="Keep workers alive between epochs."),
        ]
    opts += [
        click.option("--shuffle/--no-shuffle", default=True, show_default=True, help="Shuffle samples."),
        click.option("--seed", type=int, default=0, show_default=True, help="Shuffle / augmentation seed."),
        click.option("--drop-last", is_flag=True, help="Drop the last partial batch of an epoch."),
        click.option("--train", is_flag=True, help="Training transform (random-resized crop) instead of eval."),
        click.option("--decoder", type=click.Choice(["auto", "simplejpeg", "pil", "cv2"]), default="auto",
                     show_default=True, help="Image decoder of the readers (auto: simplejpeg where installed)."),
        click.option("--on-error", type=OnErrorChoice(), default="raise", show_default=True,
                     help="An unreadable or undecodable sample stops the run, or is skipped and counted."),
        click.option("--follow-external-links", is_flag=True,
                     help="An image folder: read images through symbolic links whose target lies outside it "
                          "(a git-annex or DVC store). Without it such a link is refused, naming it."),
        click.option("--cache", type=click.Choice(["memory"]), default=None,
                     help="memory: the reader loads every sample's bytes into RAM once [default: no cache]."),
        click.option("--shuffle-buffer", type=click.IntRange(min=1), default=None,
                     help="WebDataset: samples in each worker's shuffle buffer [default: the reader's]."),
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
                     help="A remote WebDataset (http(s)://, s3://): keep each shard and index in DIR once "
                          "downloaded, and read it from there [default: read from the remote]."),
        click.option("--cache-limit", type=SizeParam(), default=None, metavar="SIZE",
                     help="With --cache-dir: the most DIR may hold (e.g. 50GB); least recently used shards go "
                          "first [default: no limit]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f if sweep else num_workers_options(f)


def _sweep_loader_options(f: Callable) -> Callable:
    return loader_options(f, sweep=True)


_HARNESS_KEYS = ("batch_size", "image_size", "model", "compute_ms", "device", "warmup", "batches", "channels_last",
                 "num_threads")
_LOADER_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "shuffle", "seed", "drop_last",
                "train", "decoder", "on_error", "cache", "shuffle_buffer", "cache_dir", "cache_limit",
                "follow_external_links")


def _split_kwargs(kwargs: dict) -> dict:
    """The keyword arguments of :func:`bench_source` from the command's options, with the
    command line's storage options (``--storage-option``, passed on to ``open_dataset``)."""
    out: dict[str, Any] = {k: kwargs[k] for k in _HARNESS_KEYS if k in kwargs}
    ctx = click.get_current_context(silent=True)
    storage_options = storage_options_of(ctx) if ctx is not None else {}
    if storage_options:
        out["storage_options"] = storage_options
    if out.get("image_size") == 0:
        out["image_size"] = None
    for k in _LOADER_KEYS:
        if k in kwargs and not (k in ("cache", "shuffle_buffer", "cache_dir", "cache_limit") and kwargs[k] is None) \
                and not (k == "follow_external_links" and not kwargs[k]):  # given only when asked
            out[k] = kwargs[k]
    return out


def check_plot(plot: str | None) -> None:
    """Refuse ``--plot`` before any work when matplotlib is missing (the install command named)."""
    if not plot:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.UsageError("--plot needs matplotlib: pip install 'shardfeed[plot]' "
                               "(or pip install matplotlib)") from None


def _check_plot_path(ctx, param, value):
    """Refuse a ``--plot`` path whose folder is missing (or a folder, a URL) before any measuring."""
    return None if value is None else check_report_path(value, ctx, param, example="figure.png", allow_stdout=False)


def details_option(f: Callable) -> Callable:
    """Add ``--details``: every row of the report, not only the compact default."""
    return click.option("--details", is_flag=True,
                        help="Show every row of the report (CPU per process, disk reads, memory, swap, the warm-up, "
                             "how the disk was settled), not only images/s, the data stall, the wait and compute per "
                             "batch, CPU per image and the verdict.")(f)


def html_option(f: Callable) -> Callable:
    """Add ``--html PATH``: one self-contained page (figure, tables, verdict, the JSON)."""
    return click.option("--html", "html_path", metavar="PATH.html", default=None, callback=_check_html_path,
                        help="Also write one self-contained HTML page: the figure (with matplotlib), the tables, "
                             "the verdict and the full JSON report.")(f)


def _check_html_path(ctx, param, value):
    return None if value is None else check_report_path(value, ctx, param, example="report.html", allow_stdout=False)


def write_html(path: str, command_name: str, *, headline: str, report_json: Any, tables: list,
               notes: list[str], draw: Callable[[Path], Any] | None, json_path: str | None,
               tone: str = "neutral") -> None:
    """Write the ``--html`` page of a measuring command and say where it is (``tone``: the banner's
    colour, see :func:`~shardfeed.readers.measure.html_report.banner_tone`)."""
    import datetime

    from shardfeed.readers.format.manifest import created_by
    from shardfeed.readers.measure import write_html_report

    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    out = write_html_report(path, title=f"shardfeed {command_name}", subtitle=f"{when} · {created_by()}",
                            headline=headline, report_json=report_json, tables=tables, notes=notes, draw=draw,
                            tone=tone)
    echo(f"html: {out}", json_path)


def _progress(json_path: str | None) -> Callable[[str], None]:
    return lambda line: click.echo(f"shardfeed: {line}", err=True)


@command("bench", reads=("source",), short_help="Measure one loader on a dataset: images/s, data stall.")
@storage_option
@click.argument("source")
@harness_options
@loader_options
@click.option("--plot", metavar="PATH.png", default=None, callback=_check_plot_path,
              help="Draw the images delivered over time, the time spent waiting vs computing, and the wait of "
                   "every batch (needs matplotlib).")
@details_option
@html_option
@json_option
def bench(source: str, cold: bool, plot: str | None, details: bool, html_path: str | None, json_path: str | None,
          **kwargs: Any) -> None:
    """Measure one loader on SOURCE (image folder, packed dataset or URL) with a training loop.

    \b
    Per batch: the wait for data (incl. the copy to the device) and the compute step; the report
    gives images/s, mean/p50/p95 of both, the data-stall share, CPU/disk/memory of the loader
    processes and, on CUDA, GPU utilisation from NVML.

    \b
    Examples:
      shardfeed bench out/train-wds --model resnet50 --batch-size 256
      shardfeed bench data/train --compute-ms 50 --num-workers 8     # would it keep up with 50 ms steps?
      shardfeed bench out/train-lmdb --model none --cold --json report.json
    """
    from shardfeed.readers.measure import HtmlTable, bench_source, format_report, plot_runs, report_rows

    check_plot(plot)
    report = bench_source(source, cold=cold, **_split_kwargs(kwargs))
    report.label = report.label or "bench"
    echo(format_report(report, details=details), json_path)
    headline = f"{report.images_per_s:,.1f} images/s, data stall {report.stall_share:.0%}"
    write_json_report(json_path, report.to_json())  # first: a figure or page that fails loses no measurement
    if plot:
        echo(f"plot: {plot_runs([report], plot, title=headline)}", json_path)
    if html_path:
        write_html(html_path, "bench", headline=headline, report_json=report.to_json(),
                   tables=[HtmlTable("The run", ("", report.label), report_rows(report, details=details))],
                   notes=report.warnings,
                   draw=lambda p: plot_runs([report], p), json_path=json_path)


def _same_dataset(before: str, after: str) -> str | None:
    """The dataset both arguments name (a resolved path, or the URL), or None when they differ.

    A ``manifest.json`` path names its folder; URLs are compared without a trailing slash.
    """
    if "://" in before or "://" in after:
        return before.rstrip("/") if before.rstrip("/") == after.rstrip("/") else None

    def folder(arg: str) -> Path:
        p = Path(arg).expanduser()
        return p.parent if p.name == "manifest.json" else p

    try:
        a, b = folder(before).resolve(), folder(after).resolve()
    except (OSError, RuntimeError):
        return None
    return str(a) if a == b else None


@command("verify", reads=("before", "after"),
         short_help="The same training loop before and after packing, side by side.")
@storage_option
@click.argument("before")
@click.argument("after")
@harness_options
@loader_options
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Alternating rounds (before/after, then after/before, ...); the median run of each is reported, "
                   "and a verdict only when the rounds agree beyond their spread (3 or more recommended).")
@click.option("--deep", is_flag=True, help="Also compare every sample's bytes and label (matched by original path).")
@click.option("--warm-cache/--no-warm-cache", default=True, show_default=True,
              help="Without --cold: read both datasets once before the first run, so neither side's first run "
                   "reads from the disk. --no-warm-cache skips it, e.g. on storage that caches nothing (a FUSE "
                   "mount without keep_cache), where the read only costs time.")
@click.option("--min-speedup", type=FiniteFloat(min=0, min_open=True), default=None, metavar="X",
              help="Exit with status 1 when AFTER is less than X times as fast as BEFORE.")
@click.option("--plot", metavar="PATH.png", default=None, callback=_check_plot_path,
              help="Draw both sides on one axis: the images each delivered over time, the time each spent waiting "
                   "vs computing, and the wait of every batch (needs matplotlib).")
@details_option
@html_option
@json_option
def verify(before: str, after: str, cold: bool, repeats: int, deep: bool, warm_cache: bool,
           min_speedup: float | None, plot: str | None, details: bool, html_path: str | None, json_path: str | None,
           **kwargs: Any) -> None:
    """Same training loop, same device, BEFORE (e.g. the image folder) vs AFTER (its packed form).

    \b
    First checks that AFTER holds the same samples and classes as BEFORE (counts and class map;
    --deep: every sample's bytes), then runs the loop over both with the same model, batch size
    and loader settings, alternately for --repeats rounds, and prints both reports side by side
    with the speed-up ("2.9x faster; data stall 71% -> 6%"). Exit status 0 when the measurement
    ran (1 with --min-speedup X and a smaller speed-up).

    \b
    Examples:
      shardfeed verify data/train out/train-wds
      shardfeed verify data/train out/train-lmdb --cold --repeats 3 --model resnet18
      shardfeed verify data/train out/train-wds --compute-ms 30 --min-speedup 1.5 --json verify.json
    """
    from shardfeed.readers.measure import HtmlTable, compare_sources, comparison_rows, plot_runs
    from shardfeed.readers.measure.html_report import banner_tone

    check_plot(plot)
    opts = _split_kwargs(kwargs)
    same = _same_dataset(before, after)
    if same is not None:
        from shardfeed.readers.storage.redact import shown_source

        click.echo(f"shardfeed: warning: BEFORE and AFTER are the same dataset ({shown_source(same)}): the "
                   "comparison measures noise only", err=True)
    if deep:
        click.echo("shardfeed: comparing every sample of both datasets (--deep)...", err=True)
    result = compare_sources(before, after, repeats=repeats, cold=cold, deep=deep, warm_cache=warm_cache,
                             progress=_progress(json_path), **opts)
    result.min_speedup = min_speedup
    echo(result.summary(details=details), json_path)
    headline = result.headline()
    sides = [result.before, result.after]
    out = result.to_json()
    write_json_report(json_path, out)  # first: a figure or page that fails loses no measurement
    if plot:
        echo(f"plot: {plot_runs(sides, plot, title=headline)}", json_path)
    if html_path:
        notes = [f"{side}: {w}" for side, r in zip(("BEFORE", "AFTER"), sides) for w in r.warnings]
        notes += [f"advice: {a}" for a in (result.verdict or {}).get("advice", [])]
        write_html(html_path, "verify", headline=headline, report_json=out,
                   tables=[HtmlTable("Before and after (each side's median run)", ("", "BEFORE", "AFTER"),
                                     comparison_rows(result, details=details))],
                   notes=notes, draw=lambda p: plot_runs(sides, p), json_path=json_path,
                   tone=banner_tone(result.verdict))
    if min_speedup is not None and result.speedup < min_speedup:
        click.echo(f"shardfeed: error: speed-up {result.speedup:.2f}x is below --min-speedup {min_speedup}",
                   err=True)
        sys.exit(1)


@command("tune", reads=("source",), short_help="Sweep num_workers, pin_memory, prefetch_factor, persistent_workers.")
@storage_option
@click.argument("source")
@harness_options
@_sweep_loader_options
@click.option("--budget-s", type=FiniteFloat(min=1), default=300, show_default=True,
              help="Time budget of the whole sweep, seconds; trials that would not fit are skipped.")
@click.option("--max-num-workers", "max_workers", type=click.IntRange(min=0), default=None,
              help="Largest num_workers tried [default: 2 x CPU count].")
@click.option("--max-workers", "max_workers_old", type=click.IntRange(min=0), default=None, hidden=True,
              callback=deprecated_option("--max-workers", "--max-num-workers"))
@click.option("--rounds", type=click.IntRange(min=3), default=3, show_default=True,
              help="Rounds per setting, interleaved across the settings of a step; a setting is kept only when "
                   "it beats the one so far by more than the rounds' spread.")
@click.option("--plot", metavar="PATH.png", default=None, callback=_check_plot_path,
              help="Draw images/s of every setting tried, the one kept marked (needs matplotlib).")
@html_option
@json_option
def tune(source: str, cold: bool, budget_s: float, max_workers: int | None, max_workers_old: int | None,
         rounds: int, plot: str | None, html_path: str | None, json_path: str | None, **kwargs: Any) -> None:
    """Sweep the DataLoader knobs on SOURCE one at a time and print the best make_loader(...) call.

    \b
    The order practitioners follow by hand: num_workers (0, 1, 2, 4, 8, ... up to 2x the CPU
    count), then pin_memory with non-blocking copies (CUDA only), then prefetch_factor (2, 4),
    then persistent_workers, within --budget-s. Each step runs its settings in --rounds
    interleaved rounds and changes the setting so far only for one whose slowest round beats
    the other's fastest by more than the rounds' spread.

    \b
    Examples:
      shardfeed tune out/train-wds --model resnet50 --budget-s 600
      shardfeed tune data/train --compute-ms 40 --batches 30
    """
    from shardfeed.readers.measure import TUNE_HEADER, HtmlTable, plot_tune, tune_loader, tune_rows

    check_plot(plot)
    opts = _split_kwargs(kwargs)
    opts.setdefault("warmup", 5)
    max_workers = max_workers_old if max_workers is None else max_workers
    result = tune_loader(source, budget_s=budget_s, max_workers=max_workers, cold=cold, rounds=rounds,
                         progress=_progress(json_path), **opts)
    echo(result.summary(), json_path)
    out = result.to_json()
    write_json_report(json_path, out)  # first: a figure or page that fails loses no measurement
    if plot:
        echo(f"plot: {plot_tune(result, plot)}", json_path)
    if html_path:
        notes = [f"warning: {w}" for w in result.warnings] + [f"skipped: {s}" for s in result.skipped]
        notes += [f"advice: {a}" for a in result.advice]
        write_html(html_path, "tune", headline=f"{result.headline()} — {result.call}", report_json=out,
                   tables=[HtmlTable("Settings tried, in sweep order", TUNE_HEADER, tune_rows(result))], notes=notes,
                   draw=lambda p: plot_tune(result, p), json_path=json_path)


COMMANDS = [bench, verify, tune]
