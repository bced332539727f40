"""``--storage-option KEY=VALUE`` and ``--storage-option-file PATH``: object-store client options
given on the command line, checked once and handed to the library call as ``storage_options=``.

A command declares them with :func:`storage_option` and reads them with :func:`storage_options_of`.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import click

from .common import quiet

__all__ = ["MAX_STORAGE_OPTION_FILE_BYTES", "read_storage_option_file", "storage_option", "storage_options_of"]


#: Largest storage-option file read (key=value lines or a JSON object: a few hundred bytes).
MAX_STORAGE_OPTION_FILE_BYTES = 1 << 20


def read_storage_option_file(path: str | os.PathLike) -> dict:
    """Storage options from a file: ``KEY=VALUE`` lines (``#`` comments, blank lines allowed) or
    one JSON object (``{"key": ..., "secret": ...}``).

    A file holding credentials must be its owner's alone: one that other users can read or write
    (``mode & 0o077``, as ssh refuses a private key) is refused, with the fix (``chmod 600``). The
    values are never echoed in an error.

    Raises:
        ValueError: the file is open to other users, too large, or malformed (names the line, never its value).
        OSError: the file cannot be read.
    """
    import stat

    from shardfeed.readers.storage.objstore import looks_like_option_key, unreadable_option_message

    path = os.fspath(path)
    # Non-blocking: opening a FIFO does not wait for a writer (it is then refused as not a plain file).
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a plain file; give a file of KEY=VALUE lines or a JSON object")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise ValueError(f"{path}: holds credentials but other users may read or write it (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); make it yours alone: chmod 600 {path}")
        raw = f.read(MAX_STORAGE_OPTION_FILE_BYTES + 1)
    if len(raw) > MAX_STORAGE_OPTION_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_STORAGE_OPTION_FILE_BYTES} bytes; a storage-option file holds "
                         "a few KEY=VALUE lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; give KEY=VALUE lines or a JSON object") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError(f"{path}: JSON nested too deeply; a storage-option file is one flat object "
                             '({"key": "value", ...})') from None
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON (line {getattr(exc, 'lineno', '?')}); give one JSON object "
                             "or KEY=VALUE lines") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the JSON must be one object of storage options")
        nested = sorted(str(k) for k, v in data.items() if isinstance(v, (dict, list)) or v is None)
        if nested:
            raise ValueError(f"{path}: option {', '.join(nested)} is not a plain value; a storage-option file is one "
                             'flat object of strings, numbers and booleans ({"key": "value", ...})')
        return {str(k): v if isinstance(v, (bool, int)) else str(v) for k, v in data.items()}
    options = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}: line {n}: expected KEY=VALUE")
        if not looks_like_option_key(key.strip()):  # a KEY: VALUE line: the "key" holds the value
            raise ValueError(f"{path}: line {n}: {unreadable_option_message(key)}")
        options[key.strip()] = value.strip()
    return options


#: Storage-option keys that carry credentials.
_CREDENTIAL_KEYS = frozenset({"key", "aws_access_key_id", "secret", "aws_secret_access_key", "token",
                              "aws_session_token"})


def _merge_storage_options(ctx: click.Context, param: click.Parameter, value, which: str) -> None:
    """Keep each storage-option parameter's parsed value in ``ctx.meta`` (whichever click
    processes first), for :func:`storage_options_of`."""
    from shardfeed.readers.storage.objstore import parse_storage_options

    given = ctx.meta.setdefault("shardfeed_storage_options", {})
    try:
        if which == "file":
            given["file_path"] = value  # an input: no report may be written over it
            given["file"] = parse_storage_options(read_storage_option_file(value)) if value else {}
        else:
            given["pairs"] = parse_storage_options(value or ())
    except (ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    typed = sorted(k for k in given.get("pairs", {}) if k in _CREDENTIAL_KEYS)
    if which == "pairs" and typed and not quiet():
        click.echo(f"shardfeed: warning: --storage-option {', '.join(typed)}=... on the command line is visible to "
                   "every local user (`ps`); put credentials in AWS_* environment variables, a profile "
                   "(AWS_PROFILE) or --storage-option-file PATH (chmod 600)", err=True)


def _set_storage_options(ctx: click.Context, param: click.Parameter, value) -> None:
    _merge_storage_options(ctx, param, value, "pairs")


def _set_storage_option_file(ctx: click.Context, param: click.Parameter, value) -> None:
    _merge_storage_options(ctx, param, value, "file")


def storage_options_of(ctx: click.Context) -> dict:
    """The object-store options the command line gave (``--storage-option-file``'s, each
    ``--storage-option`` over them), checked; ``{}`` when none were given. A command passes them
    to the library call as ``storage_options=`` (nothing else carries them)."""
    given = ctx.meta.get("shardfeed_storage_options", {})
    return {**given.get("file", {}), **given.get("pairs", {})}


def storage_option(f: Callable) -> Callable:
    """``--storage-option KEY=VALUE`` (repeatable) and ``--storage-option-file PATH``: object-store
    client options for ``s3://`` paths (``endpoint_url``, ``region_name``, ``profile``,
    ``anon=true`` ...; see :mod:`shardfeed.readers.storage.objstore`). The values are not passed to the
    command function as parameters: it reads them with :func:`storage_options_of` (the file's
    first, each ``--storage-option`` over them) and passes them to the library call it makes, as
    ``storage_options=``. Credentials belong in the
    environment (``AWS_*``), a profile or the file: a ``--storage-option secret=...`` is visible to
    every local user in ``ps``."""
    f = click.option("--storage-option-file", "storage_option_file", default=None, metavar="PATH",
                     callback=_set_storage_option_file, expose_value=False,
                     help="Read object-store options from PATH: KEY=VALUE lines or a JSON object (the keys of "
                          "--storage-option). For credentials: unlike the command line, the file is not shown "
                          "by `ps`; it must be readable by its owner only (chmod 600).")(f)
    return click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
                        callback=_set_storage_options, expose_value=False,
                        help="Object-store client option for s3:// paths (repeatable): endpoint_url=URL, "
                             "region_name=R, profile=P, anon=true. Credentials: the AWS chain (AWS_ACCESS_KEY_ID, "
                             "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws, roles) or "
                             "--storage-option-file; key=/secret=/token= given here are visible to every local "
                             "user in `ps`.")(f)
