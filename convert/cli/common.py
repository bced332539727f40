"""What every shardfeed command shares (the CLI conventions: docs/format.md, "Command-line conventions").

Every reporting command takes ``--json PATH`` (``-`` for stdout); sizes accept ``KB/MB/GB``
(powers of 1000) and ``KiB/MiB/GiB``; library errors become one line on stderr and a non-zero
exit status, never a traceback (set ``SHARDFEED_DEBUG=1`` to see it).

The option sets used by several commands are declared here, once: :func:`pack_options` (``pack``
and ``convert``), :func:`reencode_options` (``pack``). Spellings are one per concept:
``--workers``/``-j`` are packing processes, ``--num-workers`` DataLoader workers, ``--on-error``
is ``raise|skip``; old spellings still work and print a one-line deprecation message
(:func:`deprecated`).

Beside it: the object-store options (:mod:`~shardfeed.convert.cli.storage_options`) and the
progress bars (:mod:`~shardfeed.convert.cli.progress`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from typing import Any, Callable

import click

from shardfeed.readers.background import expect_children_to_end, signal_main_thread_again
from shardfeed.readers.runtime import set_signal, set_unraisablehook

__all__ = ["SizeParam", "FiniteFloat", "write_json_report", "json_option", "fail_cleanly", "one_line", "command",
           "EXIT_ERROR", "EXIT_INTERRUPTED", "quiet", "echo", "deprecated", "OnErrorChoice",
           "pack_options", "reencode_options", "num_workers_options", "deprecated_option", "PACK_OPTION_NAMES",
           "LocalPath", "verbosity_options",
           "set_log_level", "EXIT_TERMINATED", "Terminated", "stop_on_sigterm", "interrupt_behind",
           "interrupts_end_in_one_line", "check_report_path",
           "FormatChoice"]

#: Exit status when a command fails on bad input or a fault it reports.
EXIT_ERROR = 1
#: Exit status after Ctrl-C (128 + SIGINT), as shells do.
EXIT_INTERRUPTED = 130
#: Exit status after SIGTERM (128 + SIGTERM), as shells do.
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM (see :func:`stop_on_sigterm`): the command stops as on
    Ctrl-C (worker pools terminated, partial files removed, one line), and exits with 143."""


#: The process that installed :func:`_raise_terminated` (a forked child inherits the handler).
_sigterm_owner_pid: int | None = None
#: Set once this process received SIGTERM: an error raised after it (a DataLoader worker the same
#: signal killed) ends the command as the signal, even where :class:`Terminated` itself was lost.
_sigterm_received = False


def _raise_terminated(signum, frame):
    import signal

    global _sigterm_received
    if os.getpid() != _sigterm_owner_pid:
        # a child forked before it could reset SIGTERM (a DataLoader worker starting up when the
        # process group is signalled): die of the signal, silently, as an unhandled SIGTERM does
        set_signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _sigterm_received = True
    expect_children_to_end()  # the workers die of the same signal: no "killed by signal" error
    raise Terminated()


def sigterm_received() -> bool:
    """True once this process received SIGTERM under :func:`stop_on_sigterm`."""
    return _sigterm_received and os.getpid() == _sigterm_owner_pid


def _unraisable_rearms_interrupt(unraisable) -> None:
    """``sys.unraisablehook`` while :func:`stop_on_sigterm` is in force.

    A signal handler (SIGTERM's, and Ctrl-C's ``KeyboardInterrupt``) runs wherever the main thread
    is: inside a ``__del__``, a weakref callback or an at-fork hook (``logging``'s, run by every
    ``fork`` of a DataLoader worker) the exception it raises cannot propagate and Python prints
    "Exception ignored" and goes on, as if the signal never came. Here the signal is sent to the
    main thread again once the callback has returned
    (:func:`~shardfeed.readers.background.signal_main_thread_again`), so the command still stops.
    Once SIGTERM came, other unraisable errors (objects the stop left half-built,
    failing in ``__del__``) are not news and are shown only with ``SHARDFEED_DEBUG=1``; any other
    goes to the hook that was in place.
    """
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and os.getpid() == _sigterm_owner_pid:
        import signal

        signal_main_thread_again(signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT)
        return
    if sigterm_received() and not os.environ.get("SHARDFEED_DEBUG"):
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def _unraisable_after_interrupt(unraisable) -> None:
    """``sys.unraisablehook`` once a command was interrupted: objects the interrupt left half-built
    (a DataLoader iterator whose workers were starting) fail in ``__del__`` on the way out; that
    is not news after "shardfeed: interrupted" (shown with ``SHARDFEED_DEBUG=1``)."""


def interrupt_behind(exc: BaseException, max_depth: int = 16) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (:class:`Terminated`) that ``exc`` was raised while handling, if any.

    Stopping a loop often raises a second error on the way out: PyTorch's SIGCHLD handler raises
    ``RuntimeError: DataLoader worker (pid N) is killed by signal: Terminated`` when the workers got
    the same SIGTERM (``timeout``, a container stopping, Ctrl-C to the process group), a pipe breaks.
    Such an error stands for the interrupt, which it carries as ``__context__``; the chain is
    followed at most ``max_depth`` links. Returns None when no interrupt is behind ``exc``.
    """
    seen = exc.__context__
    for _ in range(max_depth):
        if seen is None:
            return None
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__context__
    return None


def stop_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``, a container stopping) stop the command as Ctrl-C does.

    Without this the main process dies at once and its worker processes, left alone, print a
    ``BrokenPipeError`` traceback each. Worker processes should reset SIGTERM to ``SIG_DFL`` (the
    packers' pool initialisers do); one signalled before it could (a DataLoader worker still
    starting) dies of the signal without a traceback, as the handler only raises in this process.
    It also installs :func:`_unraisable_rearms_interrupt` as ``sys.unraisablehook``, so that a
    signal whose exception Python could not propagate (raised inside a ``__del__`` or an at-fork
    hook) still stops the command.
    """
    import signal
    import threading

    global _sigterm_owner_pid, _previous_unraisablehook
    if threading.current_thread() is threading.main_thread():
        _sigterm_owner_pid = os.getpid()
        set_signal(signal.SIGTERM, _raise_terminated)
        if sys.unraisablehook is not _unraisable_rearms_interrupt:
            _previous_unraisablehook = set_unraisablehook(_unraisable_rearms_interrupt)


class SizeParam(click.ParamType):
    """A byte size: ``256MB`` (powers of 1000), ``1GiB`` (powers of 1024) or a byte count."""

    name = "size"

    def convert(self, value, param, ctx):
        from shardfeed.readers.sizes import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class FiniteFloat(click.FloatRange):
    """A ``click.FloatRange`` that also refuses ``nan`` and ``inf`` (which pass every range test,
    or overflow timers), naming the option."""

    def convert(self, value, param, ctx):
        import math

        value = super().convert(value, param, ctx)
        if not math.isfinite(value):
            self.fail(f"{value} is not a finite number", param, ctx)
        return value


def write_json_report(path: str | None, report: Any) -> None:
    """Write ``report`` as JSON to ``path`` (``-``: stdout); nothing when ``path`` is None."""
    if not path:
        return
    text = json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n"
    if path == "-":
        click.echo(text, nl=False)
    else:
        from shardfeed.readers.file_io import write_bytes_atomic

        write_bytes_atomic(path, text.encode("utf-8"))


def check_report_path(value: str, ctx, param, *, example: str = "report.json", allow_stdout: bool = True) -> str:
    """A local path a report is written to: ``-`` (stdout, when allowed), a path whose folder
    exists, ``file://`` stripped; a URL or a folder is refused naming the fix."""
    if value == "-" and allow_stdout:
        return value
    from shardfeed.readers.storage.opener import url_scheme

    scheme = url_scheme(value)
    if scheme == "file":
        value = value[len("file://"):]
    elif scheme is not None:
        stdout = " (or '-' for stdout)" if allow_stdout else ""
        raise click.BadParameter(f"{value}: the report is written to a local path{stdout}, not a URL; "
                                 "write it locally, then upload it", ctx, param)
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        raise click.BadParameter(f"folder {parent} does not exist: create it or choose another path", ctx, param)
    if os.path.isdir(value):
        raise click.BadParameter(f"{value} is a folder: give a file path such as {value.rstrip('/')}/{example}",
                                 ctx, param)
    return value


def _check_json_path(ctx, param, value):
    """Refuse a ``--json`` path whose folder does not exist before any work is done."""
    if value is None:
        return value
    return check_report_path(value, ctx, param)


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


@contextlib.contextmanager
def interrupts_end_in_one_line():
    """Ctrl-C and SIGTERM (:class:`Terminated`) inside the block end the command with one line on
    stderr and status 130 or 143; an error raised on the way out of one (a DataLoader worker killed
    by the same signal) stands for the interrupt (:func:`interrupt_behind`)."""
    try:
        try:
            yield
        except Exception as exc:
            interrupt = interrupt_behind(exc)
            if interrupt is None and sigterm_received():
                interrupt = Terminated()  # raised after a SIGTERM whose own exception was lost
            if interrupt is None:
                raise
            raise interrupt from None
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        if not os.environ.get("SHARDFEED_DEBUG"):
            set_unraisablehook(_unraisable_after_interrupt)
        click.echo(f"shardfeed: {'terminated' if terminated else 'interrupted'}", err=True)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


def fail_cleanly(f: Callable) -> Callable:
    """Turn library errors into one line on stderr and a non-zero exit (no traceback)."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from shardfeed.readers.errors import ShardfeedError

        from ..write.ownership import cli_flags

        try:
            # messages name options by their flags (--overwrite), not PackOptions fields
            with interrupts_end_in_one_line(), cli_flags():
                return f(*args, **kwargs)
        except click.ClickException:
            raise
        except (ShardfeedError, ValueError, OSError, LookupError) as exc:
            msg = one_line(exc)
            if isinstance(exc, IsADirectoryError) and exc.filename:
                msg = f"{exc.filename}: is a folder where a file is expected; remove or rename it (or give the file)"
            elif isinstance(exc, OSError) and exc.filename and str(exc.filename) not in msg:
                msg = f"{exc.filename}: {msg}"
            from shardfeed.readers.storage.objstore import scrub

            click.echo(f"shardfeed: error: {scrub(msg)}", err=True)  # no user:password@ of a URL, no AWS secret
            if os.environ.get("SHARDFEED_DEBUG"):
                raise
            sys.exit(EXIT_ERROR)

    return wrapper


class LocalPath(click.ParamType):
    """A ``click.Path`` that refuses URLs (``s3://b/x``, ``http://h/x``, ``gs://...``) naming the URL
    and what the command accepts, instead of taking ``s3:`` for a local folder name.
    Wraps the ``click.Path`` it replaces; :func:`command` puts it on every ``click.Path`` parameter."""

    def __init__(self, inner: click.Path, command_name: str):
        self.inner = inner
        self.command_name = command_name
        self.name = inner.name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_metavar(self, *args, **kwargs):
        return self.inner.get_metavar(*args, **kwargs)

    def to_info_dict(self):
        return self.inner.to_info_dict()

    def shell_complete(self, ctx, param, incomplete):
        return self.inner.shell_complete(ctx, param, incomplete)

    def convert(self, value, param, ctx):
        from shardfeed.readers.storage.opener import url_scheme

        scheme = url_scheme(value) if isinstance(value, str) else None
        if scheme is not None and scheme != "file":
            from shardfeed.readers.storage.objstore import is_s3_url

            what = (param.human_readable_name if param is not None else "this path").upper()
            hint = ""
            if is_s3_url(value) and self.command_name in ("unpack", "stage", "convert"):
                hint = "; to read from the bucket give it as the SRC; to write to one, write locally and " \
                       "`shardfeed pack` / upload it"
            elif is_s3_url(value) and self.command_name == "serve":
                hint = "; the readers read s3:// directly: make_loader('s3://...')"
            self.fail(f"{value}: {what} of `shardfeed {self.command_name}` must be a local path, not a URL{hint}",
                      param, ctx)
        if scheme == "file":
            value = value[len("file://"):]
        return self.inner.convert(value, param, ctx)


def set_log_level(obj: dict) -> None:
    """Apply ``obj``'s ``quiet``/``verbose`` to the ``shardfeed`` logging level (see :func:`main`)."""
    import logging

    level = logging.ERROR if obj.get("quiet") else (logging.WARNING, logging.INFO,
                                                   logging.DEBUG)[min(obj.get("verbose", 0), 2)]
    logging.getLogger().setLevel(level)


def _verbosity_after_command(ctx: click.Context, param: click.Parameter, value) -> None:
    """``-q``/``-v`` given after the command name: the same effect as before it."""
    if not value:
        return
    obj = ctx.find_root().ensure_object(dict)
    if param.name == "quiet":
        obj["quiet"] = True
    else:
        obj["verbose"] = obj.get("verbose", 0) + value
    set_log_level(obj)


def verbosity_options(f: Callable) -> Callable:
    """``-q/--quiet`` and ``-v/--verbose`` on a command, so ``shardfeed pack SRC OUT -q`` works as
    ``shardfeed -q pack SRC OUT`` does (they add to the group's; not passed to the command)."""
    f = click.option("-v", "--verbose", count=True, expose_value=False, callback=_verbosity_after_command,
                     help="More log output (-vv for debug); same as before the command name.")(f)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_verbosity_after_command,
                        help="No progress bar and no warnings; same as before the command name.")(f)


def command(*args, reads: tuple[str, ...] = (), writes: tuple[str, ...] = (), **kwargs) -> Callable:
    """``click.command`` with clean error handling (see :func:`fail_cleanly`); its ``click.Path``
    parameters refuse URLs (:class:`LocalPath`); ``-q``/``-v`` are accepted after the command name
    too (:func:`verbosity_options`).

    ``reads`` names the parameters holding paths the command reads (SRC, a labels file), ``writes``
    those holding folders it writes (OUT): before the command runs, no report (``--json``,
    ``--html``, ``--plot``) and no folder of ``writes`` may land on or inside what ``reads`` names,
    and no report inside a folder of ``writes`` (:mod:`shardfeed.convert.write.overlap`): a report is a
    usage error (status 2), a folder one error line (status 1).
    """

    def deco(f):
        from .outputs import refusing_outputs_on_inputs

        checked = refusing_outputs_on_inputs(f, tuple(reads), tuple(writes))
        cmd = click.command(*args, **kwargs)(verbosity_options(fail_cleanly(checked)))
        for param in cmd.params:
            if isinstance(param.type, click.Path):
                param.type = LocalPath(param.type, cmd.name)
        return cmd

    return deco


def quiet() -> bool:
    """True when the ``shardfeed`` group got ``-q/--quiet`` (no progress bars)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx else None
    return bool((obj or {}).get("quiet", False))


def echo(text: str, json_path: str | None) -> None:
    """Human output: stdout, or stderr when the JSON report goes to stdout (``--json -``)."""
    click.echo(text, err=json_path == "-")


def deprecated(old: str, new: str) -> None:
    """Print the one-line deprecation message of an old option spelling (stderr)."""
    click.echo(f"shardfeed: warning: {old} is deprecated: use {new}", err=True)


class OnErrorChoice(click.Choice):
    """``raise|skip`` in any case, for every command's ``--on-error``; the old ``fail`` (pack's former
    spelling, any case) is read as ``raise`` with a deprecation line."""

    def __init__(self) -> None:
        super().__init__(["raise", "skip"], case_sensitive=False)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.lower() == "fail":
            deprecated("--on-error fail", "--on-error raise")
            return "raise"
        return super().convert(value, param, ctx)


class FormatChoice(click.Choice):
    """``--format``: every format of the registry and its aliases
    (:func:`shardfeed.readers.format.registry.format_choices`), any case; read each time it is used, so a
    format registered after this module was imported is offered and listed by ``--help`` too."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=False)

    @property
    def choices(self) -> tuple[str, ...]:
        from shardfeed.readers.format.registry import format_choices

        return tuple(format_choices())

    @choices.setter
    def choices(self, value) -> None:
        pass  # the registry is the one list


def deprecated_option(old: str, new: str) -> Callable:
    """A Click callback for a hidden old spelling: prints :func:`deprecated` when the option is given."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is not None:
            deprecated(old, new)
        return value

    return callback


_deprecated_j = deprecated_option("-j for DataLoader workers", "--num-workers (-j is packing processes only)")


def num_workers_options(f: Callable) -> Callable:
    """``--num-workers N`` (DataLoader worker processes) and the old ``-j N`` (deprecated, hidden).

    The command receives ``num_workers`` (``-j`` folded in).
    """

    @functools.wraps(f)
    def wrapper(*args, num_workers_j=None, **kwargs):
        if num_workers_j is not None and kwargs.get("num_workers") is None:
            kwargs["num_workers"] = num_workers_j
        return f(*args, **kwargs)

    wrapper = click.option("-j", "num_workers_j", type=click.IntRange(min=0), default=None, hidden=True,
                           expose_value=True, callback=_deprecated_j)(wrapper)
    return click.option("--num-workers", type=click.IntRange(min=0), default=None,
                        help="DataLoader worker processes [default: min(4, CPU count)].")(wrapper)


def _pack_option_table() -> dict[str, tuple[tuple, dict]]:
    """``name -> (param_decls, attrs)`` of the options shared by ``pack`` and ``convert``."""
    fmt_choice = FormatChoice()
    return {
        "format": (("--format", "-f", "fmt"), dict(
            type=fmt_choice, default="wds", show_default=True,
            help="Output format: WebDataset .tar shards (wds) or one LMDB database (lmdb).")),
        "max_count": (("--max-count",), dict(
            type=click.IntRange(min=1), default=10000, show_default=True,
            help="WebDataset: samples per shard at most.")),
        "max_bytes": (("--max-bytes",), dict(
            type=SizeParam(), default="256MB", show_default=True,
            help="WebDataset: size of a shard file at most (headers and padding included); e.g. 512MB, 1GiB.")),
        "prefix": (("--prefix",), dict(
            default="shard", show_default=True, help="WebDataset: shard file prefix ({prefix}-000000.tar).")),
        "workers": (("--workers", "-j"), dict(
            type=click.IntRange(min=1), default=None,
            help="Processes that read and write shards [default: CPU count].")),
        "read_ahead": (("--read-ahead",), dict(
            type=click.IntRange(min=0, max=1024), default=32, show_default=True, metavar="N",
            help="Source reads in flight per shard being written (threads, at most 64 MiB read ahead; N <= 1024): "
                 "storage where every open waits (NFS, bucket mounts) is read N files at a time. 0 or 1: "
                 "one file after another. Same output bytes either way.")),
        "seed": (("--seed",), dict(
            type=int, default=0, show_default=True,
            help="Seed of the packing-order shuffle (so no shard holds one class only).")),
        "no_shuffle": (("--no-shuffle",), dict(
            is_flag=True, help="Keep sorted ImageFolder order instead of shuffling.")),
        "on_error": (("--on-error",), dict(
            type=OnErrorChoice(), default="raise", show_default=True,
            help="On an unreadable or (with --decode-check) undecodable file: stop naming it (raise), or skip "
                 "it and list it in the manifest (skip). The old spelling 'fail' still means raise.")),
        "decode_check": (("--decode-check",), dict(
            is_flag=True, help="Fully decode every image while packing (the readers' exact rules); bytes are "
                               "still stored unchanged.")),
        "max_decode_bytes": (("--max-decode-bytes",), dict(
            type=SizeParam(), default="512MiB", show_default=True, metavar="SIZE",
            help="With --decode-check: refuse (or with --on-error skip, skip) an image whose decode would take "
                 "more memory than this, read from its header before decoding (decompression bombs).")),
        "resume": (("--resume",), dict(
            is_flag=True,
            help="Finish an interrupted pack in OUT: complete shards are kept, the rest rewritten. Safe to "
                 "always pass: a missing or empty OUT is packed from the start, and OUT already holding this "
                 "command's finished dataset exits 0.")),
        "overwrite": (("--overwrite",), dict(
            is_flag=True,
            help="Replace the shardfeed dataset in OUT: deletes only what its manifest or pack plan names (shards, "
                 "indexes, card, state); anything else in OUT is refused by name, nothing deleted.")),
        "executor": (("--executor",), dict(
            type=click.Choice(["local", "ray"], case_sensitive=False), default="local", show_default=True,
            help="Where the tasks run: this machine's --workers processes, or a Ray cluster (one task per shard; "
                 "SRC and OUT must be on storage every node mounts at the same path). Same output bytes either "
                 "way. Needs pip install 'shardfeed[ray]'.")),
        "ray_address": (("--ray-address",), dict(
            default=None, metavar="ADDR",
            help="--executor ray: the cluster to use (auto, HOST:PORT) [default: $RAY_ADDRESS, else a local Ray "
                 "instance with --workers CPUs].")),
    }


#: Every option of :func:`pack_options`, in help order (the kebab-case of :class:`PackOptions`).
PACK_OPTION_NAMES = ("format", "max_count", "max_bytes", "prefix", "workers", "read_ahead", "seed", "no_shuffle",
                     "on_error", "decode_check", "max_decode_bytes", "resume", "overwrite", "executor", "ray_address")


def pack_options(*names: str, **overrides: dict) -> Callable[[Callable], Callable]:
    """Decorator adding the packing options (declared once, here) to a command.

    Args:
        *names: the options to add (:data:`PACK_OPTION_NAMES`; none: all of them).
        **overrides: per option, attributes that differ for this command
            (``format={"required": True, "default": None}``).

    Returns:
        The decorator; the command receives each option under its :class:`PackOptions` name
        (``fmt`` for ``--format``).
    """
    table = _pack_option_table()
    chosen = names or PACK_OPTION_NAMES
    unknown = set(chosen) - set(table)
    if unknown:
        raise ValueError(f"unknown pack options {sorted(unknown)}: choose from {PACK_OPTION_NAMES}")

    def deco(f: Callable) -> Callable:
        for name in reversed([n for n in PACK_OPTION_NAMES if n in chosen]):
            decls, attrs = table[name]
            merged = {**attrs, **overrides.get(name, {})}
            if merged.get("required") and merged.get("default") is None:
                merged.pop("default", None)  # Click counts an explicit default=None as a value given
            f = click.option(*decls, **merged)(f)
        return f

    return deco


def reencode_options(f: Callable) -> Callable:
    """Add ``--resize``, ``--resize-mode``, ``--upscale``, ``--quality`` and ``--image-format``.

    The command receives them as one keyword argument ``reencode`` (a
    :class:`~shardfeed.convert.write.reencode.ReencodeOptions`, or None when no re-encoding is asked,
    from :func:`~shardfeed.convert.write.reencode.make_reencode_options`), to pass on as
    ``PackOptions(reencode=...)``.
    """
    from shardfeed.convert.write.reencode import DEFAULT_QUALITY, IMAGE_FORMATS, RESIZE_MODES

    @functools.wraps(f)
    def wrapper(*args, resize, resize_mode, upscale, quality, image_format, **kwargs):
        from shardfeed.convert.write.reencode import make_reencode_options

        try:
            kwargs["reencode"] = make_reencode_options(resize=resize, resize_mode=resize_mode, upscale=upscale,
                                                       quality=quality, image_format=image_format)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        return f(*args, **kwargs)

    opts = [
        click.option("--resize", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Re-encode every image resized so that its shorter side (see --resize-mode) is N px "
                          "(aspect kept, Lanczos; never enlarged unless --upscale). Stored as JPEG (PNG with "
                          "alpha) unless --image-format; EXIF orientation applied, metadata and ICC dropped."),
        click.option("--resize-mode", type=click.Choice(RESIZE_MODES), default=None,
                     help="With --resize: shorter side -> N (shorter, the default), longer side -> N (longer), "
                          "or exactly NxN, center-cropped (fit)."),
        click.option("--upscale", is_flag=True, help="With --resize: also enlarge images smaller than N."),
        click.option("--quality", type=click.IntRange(1, 100), default=None, metavar="Q",
                     help=f"JPEG/WebP quality when re-encoding [default: {DEFAULT_QUALITY}]; alone, re-encodes "
                          "every image in its own format at that quality."),
        click.option("--image-format", type=click.Choice(IMAGE_FORMATS, case_sensitive=False), default=None,
                     help="Stored format when re-encoding [default: keep; with --resize: jpg, png for images "
                          "with alpha]. jpg/png/webp alone re-encode every image into that format."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper
