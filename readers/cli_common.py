"""Helpers shared by every shardfeed command (the CLI conventions of DESIGN.md).

Every reporting command takes ``--json PATH`` (``-`` for stdout); sizes accept ``KB/MB/GB``
(powers of 1000) and ``KiB/MiB/GiB``; library errors become one line on stderr and a non-zero
exit status, never a traceback (set ``SHARDFEED_DEBUG=1`` to see it).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

import click

__all__ = ["SizeParam", "write_json_report", "json_option", "fail_cleanly", "one_line", "command", "progress_bar",
           "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "Terminated", "stop_on_sigterm"]

#: Exit status when a command fails on bad input or a fault it reports.
EXIT_ERROR = 1
#: Exit status after Ctrl-C (128 + SIGINT), as shells do.
EXIT_INTERRUPTED = 130
#: Exit status after SIGTERM (128 + SIGTERM), as shells do.
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM (see :func:`stop_on_sigterm`): the command stops as on
    Ctrl-C (worker pools terminated, partial files removed, one line), and exits with 143."""


def _raise_terminated(signum, frame):
    raise Terminated()


def stop_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``, a container stopping) stop the command as Ctrl-C does.

    Without this the main process dies at once and its worker processes, left alone, print a
    ``BrokenPipeError`` traceback each. Worker processes must reset SIGTERM to ``SIG_DFL`` (the
    packers' pool initialisers do), so that terminating the pool stays silent.
    """
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


class SizeParam(click.ParamType):
    """A byte size: ``256MB`` (powers of 1000), ``1GiB`` (powers of 1024) or a byte count."""

    name = "size"

    def convert(self, value, param, ctx):
        from shardfeed.readers.format import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def write_json_report(path: str | None, report: Any) -> None:
    """Write ``report`` as JSON to ``path`` (``-``: stdout); nothing when ``path`` is None."""
    if not path:
        return
    text = json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n"
    if path == "-":
        click.echo(text, nl=False)
    else:
        from shardfeed.readers.format import write_bytes_atomic

        write_bytes_atomic(path, text.encode("utf-8"))


def _check_json_path(ctx, param, value):
    """Refuse a ``--json`` path whose folder does not exist before any work is done."""
    if value in (None, "-"):
        return value
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        raise click.BadParameter(f"folder {parent} does not exist: create it or choose another path", ctx, param)
    if os.path.isdir(value):
        raise click.BadParameter(f"{value} is a folder: give a file path such as {value.rstrip('/')}/report.json",
                                 ctx, param)
    return value


def json_option(f: Callable) -> Callable:
    """Add ``--json PATH`` (the full report as JSON; ``-`` for stdout), checked before any work."""
    return click.option("--json", "json_path", metavar="PATH", default=None, callback=_check_json_path,
                        help="Also write the full report as JSON to PATH ('-' for stdout).")(f)


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` as one line: a DataLoader worker's wrapped traceback keeps its last line."""
    msg = str(exc) or type(exc).__name__
    if "Traceback (most recent call last)" in msg:
        last = [ln for ln in msg.splitlines() if ln.strip()][-1].strip()
        name = type(exc).__name__
        msg = last[len(name) + 2:] if last.startswith(name + ": ") else last
    return msg


def fail_cleanly(f: Callable) -> Callable:
    """Turn library errors into one line on stderr and a non-zero exit (no traceback)."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from shardfeed.readers.errors import ShardfeedError

        try:
            return f(*args, **kwargs)
        except KeyboardInterrupt as exc:
            terminated = isinstance(exc, Terminated)
            click.echo(f"shardfeed: {'terminated' if terminated else 'interrupted'}", err=True)
            sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
        except click.ClickException:
            raise
        except (ShardfeedError, ValueError, OSError, LookupError) as exc:
            msg = one_line(exc)
            if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in msg:
                msg = f"{exc.filename}: {msg}"
            click.echo(f"shardfeed: error: {msg}", err=True)
            if os.environ.get("SHARDFEED_DEBUG"):
                raise
            sys.exit(EXIT_ERROR)

    return wrapper


def command(*args, **kwargs) -> Callable:
    """``click.command`` with clean error handling (see :func:`fail_cleanly`)."""

    def deco(f):
        return click.command(*args, **kwargs)(fail_cleanly(f))

    return deco


class _NoBar:
    """Stands in for a tqdm bar when none is shown."""

    n = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(total_samples: int, total_bytes: int, desc: str, quiet: bool):
    """A tqdm bar counting images, with MB/s in its postfix; returns (bar, callback).

    The callback is ``update(num_samples, input_bytes, output_bytes=0)`` and is thread-safe; once
    a caller reports output bytes (``pack --resize``), the postfix shows input -> output MB. No bar
    (and no ``tqdm`` import, ~30 ms of a short command's start-up) with ``quiet`` or when stderr
    is not a terminal (a log file would fill with carriage-return redraws).
    """
    if quiet or not _stderr_is_tty():
        return _NoBar(), lambda n, nbytes, output_bytes=0: None
    import threading
    import time

    from tqdm import tqdm

    bar = tqdm(total=total_samples, unit="img", unit_scale=True, desc=desc, disable=quiet,
               dynamic_ncols=True, file=sys.stderr, smoothing=0.1)
    state = {"in": 0, "out": 0, "t0": time.perf_counter(), "last": 0.0}
    lock = threading.Lock()

    def update(n: int, nbytes: int, output_bytes: int = 0) -> None:
        with lock:
            state["in"] += nbytes
            state["out"] += output_bytes
            bar.update(n)
            now = time.perf_counter()
            if now - state["last"] > 0.25 or bar.n >= total_samples:
                state["last"] = now
                mb_s = state["in"] / 1e6 / max(now - state["t0"], 1e-9)
                done = f"{state['in'] / 1e6:.0f}/{total_bytes / 1e6:.0f} MB"
                if state["out"]:
                    done += f" -> {state['out'] / 1e6:.1f} MB, {mb_s:.1f} MB/s in"
                else:
                    done += f", {mb_s:.1f} MB/s"
                bar.set_postfix_str(done, refresh=False)

    return bar, update


