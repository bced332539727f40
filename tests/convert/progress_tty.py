"""Run a CLI command with its stderr on a pseudo-terminal (progress bars are drawn only on a
terminal), for the progress-bar tests."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios

__all__ = ["run_on_tty"]


def run_on_tty(argv: list[str], *, env: dict | None = None, timeout_s: float = 120) -> tuple[int, str, str]:
    """``(returncode, stdout, stderr)`` of ``argv`` run with stderr on a pty (stdout a pipe).

    ``TQDM_MININTERVAL=0`` (tqdm reads ``TQDM_*`` defaults from the environment) makes every update
    draw, so even a scan of a few files shows its counts.
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a new pty is 0 columns wide
    env = {**(env or os.environ), "TQDM_MININTERVAL": "0"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    rc = proc.wait(timeout=timeout_s)
    return rc, out, b"".join(chunks).decode(errors="replace")
