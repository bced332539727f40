"""One writer per output folder.

Every command that writes a dataset or an image folder (``pack``, ``convert``, ``index``,
``stage``, ``unpack``) holds an exclusive lock on ``OUT/.shardfeed.lock`` while it writes. A
second command on the same OUT fails at once, naming the holder (PID, host, command, start
time), instead of both writing and one of them reporting success over a dataset with missing
shards.

The lock is ``fcntl.flock`` on the file (released by the kernel when its process dies, however it
dies), and the file holds the holder's description as JSON for the message: the subcommand, PID,
host and start time only (never the command line, which may carry credentials: a
``--storage-option secret=...``, a URL's password, a pre-signed URL's token), in a file of mode
0600. A lock file left by a process that no longer runs (``kill -9``, a crash, a reboot) is
therefore not locked: the next command takes it over and logs that it did. The file is removed
when the command ends. The lock file is opened without following a symbolic link and refused
when it is not a plain file with one link (a planted ``OUT/.shardfeed.lock -> FILE`` would
otherwise have FILE truncated).
(``flock`` locks are local to a machine on most network file systems: two hosts writing the same
NFS folder are not stopped.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from shardfeed.readers.errors import ShardfeedError

__all__ = ["LOCK_NAME", "OutputBusyError", "output_lock", "listing", "check_not_busy", "open_lock_file"]

log = logging.getLogger(__name__)

#: The lock file inside OUT (hidden: ImageFolder readers skip it; shardfeed's own checks ignore it).
LOCK_NAME = ".shardfeed.lock"


class OutputBusyError(ShardfeedError, BlockingIOError):
    """Another shardfeed command is writing the same output folder (the message names it)."""


def listing(out: Path) -> list[Path]:
    """The entries of ``out`` other than the lock file (what "is OUT empty?" looks at)."""
    return [p for p in out.iterdir() if p.name != LOCK_NAME]


def open_lock_file(path: Path, *, create: bool = True) -> int | None:
    """Open the lock file ``path`` read-write without following a link (created 0600 if missing).

    Returns:
        The file descriptor; None when ``create`` is False and there is no lock file.

    Raises:
        OutputBusyError: never; see :func:`output_lock`.
        OSError: ``path`` is a symbolic link, not a plain file, or has other hard links (the
            message names it and the fix), or cannot be opened.
    """
    import stat

    from .tarwriter import open_own_file

    fd = open_own_file(path, create=create, mode=0o600, where="an output folder", fix="choose another output folder",
                       what="shardfeed's lock file")
    if fd is None:
        return None
    st = os.fstat(fd)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)  # a lock file of an older run: readable by its owner only
    return fd


def check_not_busy(out: str | os.PathLike) -> None:
    """Raise :class:`OutputBusyError` when another live command holds ``out``'s lock (nothing is created).

    For checks made before the lock is taken (the CLI checks OUT before scanning SRC), so that a
    second command is told the folder is busy rather than what the first one's files look like.
    """
    path = Path(out) / LOCK_NAME
    try:
        import fcntl
    except ImportError:
        return
    if not os.path.lexists(path):
        return
    fd = open_lock_file(path, create=False)
    if fd is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        raise OutputBusyError(_busy_message(Path(out), holder)) from None
    except OSError:
        return  # no flock on this file system: output_lock warns
    finally:
        os.close(fd)


def _busy_message(out: Path, holder: dict) -> str:
    return (f"{out}: another shardfeed command is writing this folder: {_describe(holder)}; "
            "wait for it to finish (or stop it), or choose another output folder")


def _describe(info: dict) -> str:
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return (f"PID {info.get('pid', '?')} on host {info.get('host', '?')} "
            f"(`{info.get('command', '?')}`, since {when})")


@contextlib.contextmanager
def output_lock(out: str | os.PathLike, command: str) -> Iterator[Path]:
    """Hold the exclusive lock of the output folder ``out`` (created if missing) while writing it.

    Args:
        out: the output folder.
        command: what writes it, for the other command's message (``"pack"``, ``"unpack"``...).

    Yields:
        The lock file's path.

    Raises:
        OutputBusyError: another live process holds the lock (names its PID, host and command).
        NotADirectoryError: ``out`` is a file.
        OSError: the folder or the lock file cannot be created (permissions).
    """
    out = Path(out)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (shardfeed's packers are tested on Linux)
        yield out / LOCK_NAME
        return
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is a file; choose a folder for the output")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise OutputBusyError(_busy_message(out, holder)) from None
        except OSError as exc:  # a file system without flock (some FUSE or network mounts): write unlocked
            os.close(fd)
            log.warning("%s: cannot lock (%s); writing without the one-writer lock", path, exc.strerror)
            fd = None
            break
        except BaseException:
            os.close(fd)
            raise
        # the holder before us may have removed the file between our open and our lock: lock the file at the path
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    if fd is None:
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return
    try:
        previous = _read(fd)
        if previous:
            log.info("%s: taking over a stale lock of %s, which no longer runs", path, _describe(previous))
        # the subcommand, never the command line: it may carry credentials
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": str(command),
                "since": time.time()}
        data = (json.dumps(info) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        yield path
    finally:
        try:
            os.unlink(path)  # while holding the lock: a process waiting on the old file retries (above)
        except FileNotFoundError:
            pass
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty: a command that failed before writing leaves no folder


def _read(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw) if raw.strip() else {}
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}
