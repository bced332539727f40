"""Helpers of the exit tests: loopback HTTP servers that hold their answers, and child programs
whose ``atexit`` hook, registered before shardfeed is imported (so it runs after shardfeed's own,
right before the interpreter finalizes), lists the reader threads still alive."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import sys
import textwrap
import threading
import time
from typing import Iterator

#: what every child starts with: ``wait_for(path)``, and with ``left_hook`` the exit listing
_PRELUDE = '''import atexit, threading, time
from pathlib import Path
def wait_for(path, tries=600):
    """True once ``path`` exists (polled every 50 ms, at most ``tries`` times)."""
    for _ in range(tries):
        if Path(path).exists():
            return True
        time.sleep(0.05)
    return False
'''
_LEFT_HOOK = '''def _left():
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("shardfeed-"))
    print("LEFT", names, flush=True)
    print("LEFT_T", time.monotonic(), flush=True)
atexit.register(_left)
'''


def run_child(body: str, *, left_hook: bool = True, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``body`` (dedented) in a fresh interpreter after the prelude; returns the finished
    process and the monotonic time it ended at (its stdout has ``LEFT [...]`` with ``left_hook``)."""
    code = _PRELUDE + (_LEFT_HOOK if left_hook else "") + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic()


def printed_time(stdout: str, mark: str = "T") -> float:
    """The monotonic time a child printed as ``T <seconds>`` (``mark``: ``LEFT_T``, the time the
    exit listing ran, right after shardfeed's exit hook)."""
    return float(next(line for line in stdout.splitlines() if line.startswith(mark + " "))[len(mark) + 1:])


class StallingHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a 1 MiB ``Content-Length``, sends 1,000 bytes, writes the marker
    file, then sends nothing more until ``server.release`` is set."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        self.wfile.write(b"x" * 1000)
        self.wfile.flush()
        self.server.marker.write_text("stalled")
        self.server.release.wait(60)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(handler: type, **attrs) -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    """A threading HTTP server on 127.0.0.1 with ``handler``; ``attrs`` set on it, plus
    ``requests`` (a list) and ``release`` (an event set on the way out). Yields
    ``(base_url, server)``."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    srv.requests, srv.release = [], threading.Event()
    for name, value in attrs.items():
        setattr(srv, name, value)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv
    finally:
        srv.release.set()
        srv.shutdown()
        srv.server_close()
