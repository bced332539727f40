"""The ``shardfeed`` command line: the one front door (Click group).

Commands by group, each a thin layer over one library function: :mod:`.pack` (``pack``),
:mod:`.tools` (``inspect``, ``check``, ``unpack``, ``convert``, ``stage``, ``index``, ``serve``
over :mod:`shardfeed.convert.tools`), :mod:`.measure` (``bench``, ``verify``, ``tune`` over
:mod:`shardfeed.readers.measure`), :mod:`.diagnose` (``watch``, ``doctor``: the user's own loop
and storage); shared options, ``--json`` reports and progress bars live in
:mod:`.common`. Nothing outside this package imports Click.

Conventions (docs/format.md, "Command-line conventions"): every reporting command takes ``--json PATH`` (``-``
for stdout) and writes its full report there; sizes accept ``KB/MB/GB`` (powers of 1000) and
``KiB/MiB/GiB``; lists are comma-separated. Library errors become one line on stderr and a
non-zero exit status, never a traceback. Commands import their heavy modules lazily, so
``shardfeed pack`` never imports torch.
"""

from __future__ import annotations

import logging
import signal
import sys
import warnings

import click

from shardfeed.readers.runtime import set_signal

from .common import interrupts_end_in_one_line, set_log_level, stop_on_sigterm

__all__ = ["main"]

log = logging.getLogger("shardfeed")


class _Group(click.Group):
    """The ``shardfeed`` group: Ctrl-C or SIGTERM before a command's own handling starts (while
    its options are parsed, before its work) ends it as during the work: one line, status 130 or
    143 (Click's default is "Aborted!" and status 1)."""

    def invoke(self, ctx: click.Context):
        with interrupts_end_in_one_line():
            return super().invoke(ctx)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="shardfeed", prog_name="shardfeed")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress bar and no warnings (errors and the one-line summary still print).")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """shardfeed: pack image folders into WebDataset shards or LMDB, and read them back fast.

    \b
    Typical use:
      shardfeed pack data/train out/train-wds --format wds      # ImageFolder -> .tar shards
      shardfeed pack data/train out/train-lmdb --format lmdb    # ImageFolder -> one LMDB
      shardfeed verify data/train out/train-wds                 # same training loop, before vs after

    Every command explains its options with --help; every report has a --json form.
    """
    if hasattr(signal, "SIGXFSZ"):
        set_signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit gives EFBIG (a clear error), not death
    from shardfeed.readers.storage.objstore import use_cli_spelling

    use_cli_spelling()  # messages name --storage-option KEY=VALUE, not the API's storage_options={...}
    stop_on_sigterm()  # SIGTERM stops a command as Ctrl-C does: workers ended, partial files removed, one line
    # PyTorch warns about a worker count above the CPUs from two places (DataLoader() and iter()), so
    # with the default filter (once per place) tune/verify/bench printed the same advice twice: once
    warnings.filterwarnings("once", message=r"This DataLoader will create \d+ worker processes", category=UserWarning)
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="shardfeed: %(levelname)s: %(message)s", stream=sys.stderr)
    ctx.ensure_object(dict)
    ctx.obj["quiet"] = quiet
    ctx.obj["verbose"] = verbose
    if quiet or verbose:  # also where logging was configured before (basicConfig then does nothing)
        set_log_level(ctx.obj)


def _register_commands() -> None:
    """Attach every command of the group modules (each imports its heavy parts lazily)."""
    from . import diagnose, measure, pack, tools

    for module in (pack, tools, measure, diagnose):
        for cmd in module.COMMANDS:
            main.add_command(cmd)


_register_commands()
