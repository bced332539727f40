"""``shardfeed watch -- CMD`` and ``shardfeed doctor PATH``: diagnosing the user's own loop and storage.

Thin layers over :mod:`shardfeed.readers.integrations.autowatch` (the start-up hook that watches
every ``DataLoader`` of an unmodified script) and :func:`shardfeed.readers.measure.doctor.doctor`.
Neither command imports torch in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from shardfeed.readers.runtime import set_signal

from .common import FiniteFloat, command, echo, json_option, quiet, write_json_report
from .storage_options import storage_option, storage_options_of
from .measure import check_plot, html_option, write_html

__all__ = ["COMMANDS", "watch_cmd", "doctor_cmd", "SITECUSTOMIZE"]

#: The ``sitecustomize.py`` put first on the command's ``PYTHONPATH``: installs the hook, then
#: runs the ``sitecustomize`` it shadows (if any) so the environment's own start-up still happens.
SITECUSTOMIZE = '''\
import os, sys
try:
    from shardfeed.readers.integrations.autowatch import install as _shardfeed_install
    _shardfeed_install()
except Exception as _exc:  # never stop the user's script
    _hint = ""
    if isinstance(_exc, ModuleNotFoundError) and (_exc.name or "").split(".")[0] == "shardfeed":
        _hint = (f"; this Python ({sys.executable}) cannot import shardfeed: run the script with the Python "
                 "shardfeed is installed in (activate its environment, or give its .venv/bin/python)")
    print(f"shardfeed watch: not watching this process: {type(_exc).__name__}: {_exc}{_hint}", file=sys.stderr)
_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
import importlib.machinery as _m
_spec = _m.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
    import importlib.util as _u
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
'''


def _read_reports(folder: Path) -> list[dict]:
    docs = []
    for p in sorted(folder.glob("*.json")):
        try:
            docs.append(json.loads(p.read_text()))
        except (OSError, ValueError) as exc:
            click.echo(f"shardfeed: warning: unreadable watch report {p.name}: {exc}", err=True)
    return docs


def _summaries(docs: list[dict]) -> list[str]:
    from shardfeed.readers.measure.watch import WatchReport

    names = {f.name for f in __import__("dataclasses").fields(WatchReport)}
    out = []
    for doc in docs:
        for rep in doc.get("loaders", []):
            if "error" in rep:
                out.append(f"{rep.get('label')}: no report ({rep['error']})")
                continue
            prefix = f"[pid {doc.get('pid')}] " if len(docs) > 1 else ""
            out.append(prefix + WatchReport(**{k: v for k, v in rep.items() if k in names}).summary())
    return out


@command("watch", short_help="Run an unmodified training script and diagnose every DataLoader it iterates.",
         context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--device", default=None, metavar="cpu|cuda|cuda:N",
              help="Where the script's step runs [default: CUDA when the script has initialised it, synchronised "
                   "at each batch request so the stall is GPU idle time].")
@click.option("--sample-interval", "sample_interval_s", type=FiniteFloat(min=0.005), default=0.05, show_default=True,
              help="Seconds between two samples of the CPU, I/O and memory of the main process and workers.")
@click.option("--status-every", "status_every_s", type=FiniteFloat(min=0.1), default=None, metavar="S",
              help="Log a one-line status (data stall so far) every S seconds [default: off].")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Batches at the very start of each loader left out of the stall share (worker start-up).")
@json_option
@click.option("--plot", metavar="PATH.png", default=None,
              help="Draw, for every DataLoader watched, the samples delivered over time, the time spent waiting vs "
                   "stepping, and the wait of every batch (needs matplotlib).")
@html_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def watch_cmd(device: str | None, sample_interval_s: float, status_every_s: float | None, warmup: int,
              json_path: str | None, plot: str | None, html_path: str | None, cmd: tuple[str, ...]) -> None:
    """Run CMD (e.g. python train.py ARGS) unchanged and report, for every DataLoader it iterates,
    whether the loop is data-bound and why.

    \b
    The script is not edited: a start-up hook (sitecustomize on PYTHONPATH) wraps
    torch.utils.data.DataLoader.__iter__ in the script's process(es) with shardfeed.readers.watch,
    which times each batch's wait against the step and samples CPU, I/O, memory and GPU. The
    report prints when the script ends (also on Ctrl-C and on SIGTERM). SIGINT, SIGTERM, SIGHUP
    and SIGQUIT sent to watch are passed on to the script; the script's exit status is kept.
    With --json - the script's own output goes to stderr.

    \b
    Examples:
      shardfeed watch -- python train.py --epochs 1
      shardfeed watch --json watch.json -- python -m mypkg.train
      shardfeed watch --status-every 10 -- torchrun --nproc-per-node 2 train.py
    """
    if not cmd:
        raise click.UsageError("give the command to run after --, e.g. shardfeed watch -- python train.py")
    check_plot(plot)
    with tempfile.TemporaryDirectory(prefix="shardfeed-watch-") as tmp:
        site_dir, out_dir = Path(tmp) / "site", Path(tmp) / "reports"
        site_dir.mkdir()
        out_dir.mkdir()
        (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(site_dir)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        from shardfeed.readers.integrations.autowatch import ENV_DIR, ENV_OPTIONS

        env[ENV_DIR] = str(out_dir)
        opts: dict[str, Any] = {"sample_interval_s": sample_interval_s, "warmup": warmup}
        if device:
            opts["device"] = device
        if status_every_s:
            opts["status_every_s"] = status_every_s
        env[ENV_OPTIONS] = json.dumps(opts)
        # with --json -, stdout holds the JSON alone: the script's own output goes to stderr
        stdout = sys.stderr.fileno() if json_path == "-" else None
        try:
            proc = subprocess.Popen(list(cmd), env=env, stdout=stdout)
        except OSError as exc:
            raise click.ClickException(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
        rc = _wait_passing_signals_on(proc)
        rc = rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's status for that death
        docs = _read_reports(out_dir)
    lines = _summaries(docs)
    if not lines:
        lines = ["shardfeed watch: the command iterated no torch DataLoader (nothing to report; a process that "
                 "ends with os._exit() or is killed by a signal writes no report)"]
    for line in lines:
        echo(line, json_path)
    report = {"command": list(cmd), "exit_status": rc,
              "loaders": [rep for doc in docs for rep in doc.get("loaders", [])],
              "processes": [{"pid": d.get("pid"), "argv": d.get("argv"), "not_watched": d.get("not_watched", 0)}
                            for d in docs]}
    _draw_watch(report, plot, html_path, json_path)
    write_json_report(json_path, report)
    sys.exit(rc)


#: The signals ``watch`` passes on to the script (each would otherwise end ``watch`` alone, or be lost).
PASSED_ON_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                          if hasattr(signal, name))


def _wait_passing_signals_on(proc: subprocess.Popen) -> int:
    """Wait for the script; every terminating signal this process receives meanwhile is sent on to it.

    A signal to the whole process group (Ctrl-C in a terminal) reaches the script twice: the
    start-up hook takes a second SIGINT (or SIGTERM) soon after the first for the same stop. The
    script's exit status is returned (negative: killed by that signal).
    """
    def pass_on(signum, frame):
        if proc.returncode is None:
            try:
                os.kill(proc.pid, signum)
            except OSError:  # already gone
                pass

    previous = {}
    for sig in PASSED_ON_SIGNALS:
        try:
            previous[sig] = set_signal(sig, pass_on)
        except (OSError, ValueError):  # not settable here (not the main thread)
            continue
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            set_signal(sig, handler)


def _draw_watch(report: dict, plot: str | None, html_path: str | None, json_path: str | None) -> None:
    """``--plot`` and ``--html`` of ``watch``: one series per DataLoader watched."""
    if not (plot or html_path):
        return
    from shardfeed.readers.measure import HtmlTable, plot_delivery, series_of_watch

    loaders = [rep for rep in report["loaders"] if "error" not in rep and (rep.get("per_batch") or {}).get("t_step_s")]
    if not loaders:
        echo("no plot: no DataLoader batch was timed", json_path)
        return
    series = [series_of_watch(rep, f"{rep.get('label')} #{i + 1}" if len(loaders) > 1 else None)
              for i, rep in enumerate(loaders)]
    diag = [rep["diagnosis"] for rep in loaders]
    from shardfeed.readers.measure.watch_rules import kind_label

    headline = "; ".join(f"{kind_label(d)}: data stall {rep['stall_share']:.0%}" for d, rep in zip(diag, loaders))
    if plot:
        echo(f"plot: {plot_delivery(series, plot, title=headline)}", json_path)
    if html_path:
        rows = []
        for rep in loaders:
            w, st = rep["t_wait_s"], rep["t_step_s"]
            rows.append((str(rep.get("label")), str(rep["batches"]), f"{rep['stall_share']:.0%}",
                         f"{w['mean'] * 1e3:.1f} / {w['p95'] * 1e3:.1f}",
                         f"{st['mean'] * 1e3:.1f} / {st['p95'] * 1e3:.1f}",
                         f"{rep['samples_per_s']:.1f}" if rep.get("samples_per_s") else "n/a",
                         kind_label(rep["diagnosis"])))
        notes = [f"{rep.get('label')}: {rep['diagnosis']['text']}" for rep in loaders]
        notes += [f"advice: {a}" for rep in loaders for a in rep["diagnosis"].get("advice", [])]
        notes += [f"warning: {x}" for rep in loaders for x in rep.get("warnings", [])]
        table = HtmlTable("DataLoaders watched", ("loader", "batches", "data stall", "wait ms (mean / p95)",
                                                  "step ms (mean / p95)", "samples/s", "diagnosis"), rows)
        write_html(html_path, "watch", headline=headline, report_json=report, tables=[table], notes=notes,
                   draw=lambda p: plot_delivery(series, p), json_path=json_path)


@command("doctor", reads=("path",),
         short_help="Probe where a dataset lives and predict the loader ceiling, folder vs packed.")
@storage_option
@click.argument("path")
@click.option("--num-workers", type=click.IntRange(min=0), default=None,
              help="DataLoader workers of the prediction [default: the CPU count].")
@click.option("--max-files", type=click.IntRange(min=1), default=None,
              help="The most files sampled for latency, sizes and decode cost. An image folder's sample is "
                   "stratified by format and size and grows from 64 while the prediction's expected error is "
                   "above 10 % [default: 512 for an image folder, else 64].")
@click.option("--max-list", type=click.IntRange(min=1), default=200_000, show_default=True,
              help="Files listed at most (the count is then a lower bound).")
@click.option("--budget-s", type=FiniteFloat(min=0.1), default=30, show_default=True,
              help="Time budget of the probe, seconds.")
@click.option("--decoder", type=click.Choice(["auto", "simplejpeg", "pil", "cv2"]), default="auto", show_default=True,
              help="shardfeed's decoder for the decode cost.")
@click.option("--cold/--warm", default=True, show_default=True,
              help="Evict the sampled files from the page cache first (posix_fadvise DONTNEED), so the storage "
                   "is measured, not RAM.")
@click.option("--seed", type=int, default=0, show_default=True, help="The sample's seed.")
@click.option("--image-size", type=click.IntRange(min=1), default=None, metavar="N",
              help="Also count the loader's CPU work per image at image_size=N (reduced-scale decode, resize, "
                   "centre crop) [default: decoding only].")
@json_option
@click.pass_context
def doctor_cmd(ctx: click.Context, path: str, num_workers: int | None, max_files: int | None, max_list: int,
               budget_s: float, decoder: str, cold: bool, seed: int, image_size: int | None,
               json_path: str | None) -> None:
    """Probe PATH (an image folder or a packed dataset, local or mounted, or a WebDataset URL:
    http(s):// or s3://, or an image folder in a bucket: s3://BUCKET/PREFIX with class folders)
    without training: the
    file system, open and read latency, throughput, file sizes, decode cost on this CPU, cores,
    RAM and /dev/shm; then predict the loader ceiling (images/s) for the folder and its packed
    form and say which action helps and by about how much.

    \b
    The model: per image, open latency + first-read latency + the rest at the sequential
    throughput + decode, divided over the workers, capped by the cores' decode rate; packed: the
    bytes at the sequential throughput + decode. It is a ceiling (no collate, transforms or step).

    \b
    Examples:
      shardfeed doctor /mnt/nfs/imagenet/train --num-workers 8
      shardfeed doctor out/train-wds --json doctor.json
      shardfeed doctor https://data.example.com/train-wds --num-workers 16
      shardfeed doctor s3://bucket/train --storage-option endpoint_url=http://127.0.0.1:9000
    """
    from shardfeed.readers.measure.doctor import doctor

    report = doctor(path, num_workers=num_workers, max_files=max_files, max_list=max_list, budget_s=budget_s,
                    decoder=decoder, cold=cold, seed=seed, image_size=image_size,
                    storage_options=storage_options_of(ctx),
                    progress=None if quiet() else (lambda line: click.echo(f"shardfeed: {line}", err=True)))
    echo(report.summary(), json_path)
    write_json_report(json_path, report.to_json())


COMMANDS = [watch_cmd, doctor_cmd]
