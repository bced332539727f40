"""The one check of a command's output paths against what it reads and writes, run before the
command (:func:`~shardfeed.convert.cli.common.command` wraps every command in it); the rule
itself is :mod:`shardfeed.convert.write.overlap`."""

from __future__ import annotations

import functools
from typing import Callable

import click

__all__ = ["REPORT_PARAMS", "refusing_outputs_on_inputs"]


#: The parameters that name a report a command writes (``--json``, ``--html``, ``--plot``).
REPORT_PARAMS = ("json_path", "html_path", "plot")


def _param_label(param: click.Parameter) -> str:
    """How a message names a parameter: ``--json`` for an option, ``SRC`` for an argument."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return (param.metavar or param.name or "").upper()


def refusing_outputs_on_inputs(f: Callable, reads: tuple[str, ...], writes: tuple[str, ...]) -> Callable:
    """``f`` that first refuses, before any work, an output path landing on an input
    (:func:`shardfeed.convert.write.overlap.refuse_outputs_on_inputs`): the reports of
    :data:`REPORT_PARAMS` and the folders named in ``writes`` against the paths named in ``reads``
    (and ``--storage-option-file``); a report inside a folder of ``writes`` is refused too."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from ..write.overlap import refuse_outputs_on_inputs

        ctx = click.get_current_context()
        labels = {p.name: _param_label(p) for p in ctx.command.params}
        outputs = {labels[n]: kwargs.get(n) for n in (*writes, *REPORT_PARAMS) if n in labels}
        inputs = {labels[n]: kwargs.get(n) for n in reads if n in labels}
        inputs["--storage-option-file"] = ctx.meta.get("shardfeed_storage_options", {}).get("file_path")
        written = {labels[n]: kwargs.get(n) for n in writes if n in labels}
        refuse_outputs_on_inputs(written, inputs)  # an OUT in SRC: one error line, as the library says it
        try:
            refuse_outputs_on_inputs(outputs, inputs, written=written)
        except ValueError as exc:  # a report path: a bad option value
            raise click.UsageError(str(exc), ctx) from None
        return f(*args, **kwargs)

    return wrapper
