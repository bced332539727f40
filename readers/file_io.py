"""Small local files written and read safely: atomic writes and bounded reads of control files.

A control file is one shardfeed writes beside a dataset to describe it or its pack (the manifest,
a pack plan, a shard record, a path index, a report). It is written whole or not at all
(:func:`write_bytes_atomic`) and read with a bound (:func:`read_small_file`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import ManifestError

__all__ = ["MAX_CONTROL_FILE_BYTES", "read_at_most", "read_small_file", "write_temp_beside", "write_bytes_atomic"]

#: A control file larger than this is refused (a manifest of 10 million samples' shards is a few MiB).
MAX_CONTROL_FILE_BYTES = 256 << 20


def read_small_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_CONTROL_FILE_BYTES,
                    what: str = "the file", error: type[Exception] = ManifestError) -> bytes:
    """The content of a local control file (a manifest, a pack plan, a shard record), bounded.

    The file is opened non-blocking (a FIFO does not wait for a writer) and must be a regular
    file (a link to ``/dev/zero``, a FIFO or a device is refused before anything is read); at most
    ``max_bytes + 1`` bytes are read.

    Args:
        path: the file (a link is followed).
        max_bytes: the largest size accepted, in bytes.
        what: how a message names the file (``"the manifest"``).
        error: the exception class raised for a file that is not regular or too large.

    Raises:
        FileNotFoundError, OSError: the file cannot be opened or read.
        error: not a regular file, or larger than ``max_bytes`` (the message names the file).
    """
    import stat

    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise error(f"{path}: {what} is not a regular file (a folder, a FIFO, a device or a link to one); refused")
    with os.fdopen(fd, "rb") as f:
        data = read_at_most(f, max_bytes, chunk_bytes=16 << 20)
    if data is None:
        raise error(f"{path}: {what} is more than {max_bytes:,} bytes; refused (is this the right file?)")
    return data


def read_at_most(f: BinaryIO | Callable[[int], bytes], max_bytes: int, *,
                 chunk_bytes: int = 1 << 20) -> bytes | None:
    """The rest of the open binary file ``f`` when it holds at most ``max_bytes`` more bytes, else
    None. Read in chunks of ``chunk_bytes``, so memory follows what the file holds (a pipe or a
    growing file too), never the bound; at most ``max_bytes + 1`` bytes are read. ``f`` may also
    be a function ``read(n) -> bytes`` (a response body; ``b""`` at its end)."""
    read = f if callable(f) else f.read
    chunks, got = [], 0
    while got <= max_bytes:
        chunk = read(min(max_bytes + 1 - got, chunk_bytes))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return None if got > max_bytes else b"".join(chunks)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def write_temp_beside(path: str | os.PathLike[str], data: bytes) -> str:
    """Write ``data`` to a new temporary file beside ``path`` (``.NAME.XXXXXXXX.tmp``, fsynced,
    the usual mode) and return its path; the caller renames it over ``path`` or removes it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file its usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink_missing_ok(tmp)
        raise
    return tmp


def _unlink_missing_ok(path: str | os.PathLike[str]) -> None:
    """Remove ``path``; one already gone is fine (the clean-up of a failed write)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, fsync, rename."""
    tmp = write_temp_beside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_missing_ok(tmp)
        raise
