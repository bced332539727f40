"""A small threaded HTTP file server with ``Range`` support, for tests and quick sharing.

``shardfeed serve PATH`` and the test suites use it to put a packed dataset behind
``http://127.0.0.1:PORT/`` so that ``open_dataset("http://...")`` can read it from other
processes or machines. It answers:

* ``GET`` with the whole file (``200``, ``Content-Length``, ``Accept-Ranges: bytes``);
* ``GET`` with ``Range: bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` with ``206 Partial Content``
  and ``Content-Range: bytes a-b/size`` (an unsatisfiable range gets ``416`` with
  ``Content-Range: bytes */size``; a multi-range request is answered with the whole file, as
  RFC 9110 allows);
* ``HEAD`` with the headers of the ``GET``, ``Content-Length`` included.

File bodies go out with ``socket.sendfile`` (zero-copy). It binds to loopback (``127.0.0.1``)
unless told otherwise.

What it serves: only regular files and folders inside the served folder, reached without any
symbolic link (a link is never followed, even one pointing inside), and nothing hidden (no path
component starting with ``.``: ``.shardfeed.lock``, ``.git``, ``.private/key``). Everything else
answers ``404``, and listings leave it out.

Bounds: at most ``max_connections`` connections are handled at once (more wait in the listen
queue until one ends), and a request's line and headers must arrive within ``timeout_s`` seconds
of the connection (or of the previous answer on a keep-alive connection), however slowly they
drip; a client that stops reading an answer for ``timeout_s`` is dropped too. A malformed or
absurd ``Range`` header (huge or negative numbers, garbage) gets a proper answer, ``200`` with
the whole file or ``416``, never a dropped connection.

This is a convenience, not a production server: it has no TLS, no authentication, no caching
headers beyond ``Last-Modified``. To serve a dataset to a cluster, use a real web server (nginx
answers ``Range`` requests out of the box) or an object store; ``docs/packing.md`` ("Dataset
tools", serve) has an nginx ``location`` block.

``support_ranges=False`` gives a server that ignores ``Range`` headers (always ``200`` with the
whole file), like Python's own ``http.server``: readers must work against both kinds.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import html
import http.server
import io
import logging
import os
import re
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Iterator

__all__ = ["RangeRequestHandler", "make_server", "serve_directory", "parse_range", "LOOPBACK", "server_url",
           "DEFAULT_MAX_CONNECTIONS", "DEFAULT_TIMEOUT_S"]

log = logging.getLogger(__name__)

#: The default bind address: loopback only.
LOOPBACK = "127.0.0.1"
#: Connections handled at once by default (each holds one thread).
DEFAULT_MAX_CONNECTIONS = 128
#: Seconds a request's line and headers may take to arrive, and a keep-alive connection may idle.
DEFAULT_TIMEOUT_S = 15.0
_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*$", re.IGNORECASE | re.ASCII)
#: Byte positions are compared as numbers only up to this many digits (more: "past any file").
_MAX_DIGITS = 19
_HUGE = 10 ** _MAX_DIGITS


def _position(digits: str) -> int:
    """A byte position from its decimal digits; anything longer than 19 digits is "past any file"
    (no 4,300-digit ``int`` conversion, which Python refuses with a ``ValueError``)."""
    digits = digits.lstrip("0") or "0"
    return _HUGE if len(digits) > _MAX_DIGITS else int(digits)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """Interpret a ``Range`` header against a file of ``size`` bytes.

    Args:
        header: the header value (``"bytes=0-1023"``), or None.
        size: the file size, bytes.

    Returns:
        ``(first, last)`` inclusive byte positions for a satisfiable single range; ``None`` when the
        whole file should be sent (no header, a multi-range or malformed header — garbage, a
        negative or reversed range — which RFC 9110 lets a server ignore); the string
        ``"unsatisfiable"`` when the range lies past the end (a start of any number of digits).
        Never raises.
    """
    if not header or not isinstance(header, str):
        return None
    m = _RANGE_RE.match(header)
    if not m:
        return None  # multi-range ("bytes=0-1,5-9") or another unit: send the whole file
    first_s, last_s = m.groups()
    if not first_s and not last_s:
        return None
    if not first_s:  # suffix range: the last N bytes
        n = _position(last_s)
        if n == 0:
            return "unsatisfiable"
        return (max(size - n, 0), size - 1) if size else "unsatisfiable"
    first = _position(first_s)
    last = _position(last_s) if last_s else size - 1
    if last_s and last < first:
        return None  # invalid: ignore the header
    if first >= size:
        return "unsatisfiable"
    return first, min(last, size - 1)


class RangeRequestHandler(http.server.SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` that answers single byte ranges and logs through ``logging``.

    Set the class attribute ``support_ranges = False`` (see :func:`make_server`) to ignore
    ``Range`` headers like the standard library's server does.
    """

    protocol_version = "HTTP/1.1"
    support_ranges = True
    server_version = "shardfeed-serve"
    #: Seconds for a request's line and headers to arrive (and for a stalled send).
    timeout_s = DEFAULT_TIMEOUT_S

    def setup(self):  # noqa: D102 (standard library hook)
        self.timeout = self.timeout_s  # socket timeout of every send and receive
        super().setup()
        self._deadline = time.monotonic() + self.timeout_s
        self.rfile.close()  # the plain socket reader: replaced by one that keeps the deadline
        self.rfile = io.BufferedReader(_DeadlineReader(self), buffer_size=64 << 10)

    def handle_one_request(self):  # noqa: D102 (standard library hook)
        self._deadline = time.monotonic() + self.timeout_s
        super().handle_one_request()

    def parse_request(self):  # noqa: D102 (standard library hook)
        ok = super().parse_request()
        self.connection.settimeout(self.timeout_s)  # the headers are in: back to the send timeout
        return ok

    def _served_path(self) -> tuple[str, os.stat_result] | None:
        """The file system path of the request and its ``lstat``, or None when it is not served:
        a hidden component, a symbolic link anywhere below the root, not a regular file or folder,
        outside the root."""
        raw = self.path.split("?", 1)[0].split("#", 1)[0]
        try:
            rel = urllib.parse.unquote(raw, errors="surrogatepass")
        except UnicodeDecodeError:
            rel = urllib.parse.unquote(raw)
        parts = [p for p in rel.split("/") if p]
        if any(p.startswith(".") or "\\" in p or "\0" in p or os.sep in p for p in parts):
            return None  # hidden, "..", or a separator smuggled in
        root = self.directory
        path = root
        try:
            st = os.lstat(path)
            for p in parts:
                path = os.path.join(path, p)
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    return None
        except (OSError, ValueError):
            return None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return None
        real = os.path.realpath(path)
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            return None
        return path, st

    def send_head(self):  # noqa: D102 (standard library hook)
        self._body = (0, None)
        found = self._served_path()
        if found is None:
            self.send_error(404, "File not found")
            return None
        path, st = found
        if stat.S_ISDIR(st.st_mode):
            if not self.path.split("?", 1)[0].endswith("/"):
                self.send_response(301)
                parts = urllib.parse.urlsplit(self.path)
                self.send_header("Location", urllib.parse.urlunsplit(parts._replace(path=parts.path + "/")))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self.list_directory(path)
        if self.path.split("?", 1)[0].endswith("/"):
            self.send_error(404, "File not found")
            return None
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            f = os.fdopen(fd, "rb")
        except OSError:
            self.send_error(404, "File not found")
            return None
        try:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                f.close()
                self.send_error(404, "File not found")
                return None
            size = st.st_size
            rng = parse_range(self.headers.get("Range"), size) if self.support_ranges else None
            if rng == "unsatisfiable":
                f.close()
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            if rng is None:
                first, last = 0, size - 1
                self.send_response(200)
            else:
                first, last = rng
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Length", str(last - first + 1))
            if self.support_ranges:
                self.send_header("Accept-Ranges", "bytes")
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.end_headers()
        except BaseException:
            f.close()
            raise
        self._body = (first, last - first + 1)
        return f

    def list_directory(self, path):  # noqa: D102 (standard library hook)
        """An HTML listing of the folder's regular files and folders; hidden names and symbolic
        links are left out."""
        try:
            names = os.listdir(path)
        except OSError:
            self.send_error(404, "No permission to list directory")
            return None
        entries = []
        for name in sorted(names, key=str.lower):
            if name.startswith("."):
                continue
            try:
                mode = os.lstat(os.path.join(path, name)).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                entries.append(name + "/")
            elif stat.S_ISREG(mode):
                entries.append(name)
        title = html.escape(f"Directory listing for {urllib.parse.unquote(self.path.split('?', 1)[0])}",
                            quote=False)
        items = "".join(f'<li><a href="{urllib.parse.quote(e, errors="surrogatepass")}">'
                        f"{html.escape(e, quote=False)}</a></li>\n" for e in entries)
        body = (f'<!DOCTYPE HTML>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
                f"</head>\n<body>\n<h1>{title}</h1>\n<hr>\n<ul>\n{items}</ul>\n<hr>\n</body>\n</html>\n"
                ).encode("utf-8", "surrogateescape")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def copyfile(self, source, outputfile):  # noqa: D102 (standard library hook)
        offset, count = getattr(self, "_body", (0, None))
        self._body = (0, None)
        if count is None:
            return super().copyfile(source, outputfile)
        if count <= 0:
            return
        outputfile.flush()
        try:
            self.connection.sendfile(source, offset, count)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client hung up (e.g. it only wanted the first bytes)

    def guess_type(self, path):  # noqa: D102
        if str(path).endswith((".tar", ".sfidx", ".idx", ".mdb")):
            return "application/octet-stream"
        return super().guess_type(path)

    def log_message(self, format, *args):  # noqa: A002 (standard library signature)
        log.debug("%s %s", self.address_string(), format % args)

    def handle(self):  # noqa: D102
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass


class _DeadlineReader(io.RawIOBase):
    """The socket's receiving side, each receive bounded by what is left of the handler's deadline
    (so a client dripping one header byte a second is still cut off at ``timeout_s``)."""

    def __init__(self, handler: RangeRequestHandler):
        self._handler = handler
        self._sock = handler.connection

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        left = self._handler._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request not received within {self._handler.timeout_s:g} s")
        self._sock.settimeout(min(left, self._handler.timeout_s))
        return self._sock.recv_into(b)


class _Server(http.server.ThreadingHTTPServer):
    """Threaded server with at most ``max_connections`` handler threads at once."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address, handler, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closing = threading.Event()
        super().__init__(address, handler)

    def process_request(self, request, client_address):  # noqa: D102 (standard library hook)
        while not self._slots.acquire(timeout=0.1):  # full: the next connection waits in the listen queue
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):  # noqa: D102 (standard library hook)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def shutdown(self):  # noqa: D102
        self._closing.set()
        super().shutdown()


def make_server(path: str | os.PathLike, host: str = LOOPBACK, port: int = 0, *,
                support_ranges: bool = True, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> http.server.ThreadingHTTPServer:
    """Create (not start) a threaded HTTP server for the folder ``path``.

    Args:
        path: the folder to serve (a packed dataset directory, typically).
        host: the address to bind; loopback by default. ``0.0.0.0`` exposes every file below
            ``path`` to the network, without authentication.
        port: the TCP port; 0 picks a free one (read it from ``server.server_address[1]``).
        support_ranges: False ignores ``Range`` headers (always the whole file), like Python's
            ``http.server``.
        max_connections: connections handled at once (one thread each); more wait in the
            listen queue.
        timeout_s: seconds a request's line and headers may take to arrive (from the connection,
            or from the previous answer on a keep-alive connection), and a send may stall.

    Returns:
        The bound server; call ``serve_forever()`` (and ``server_close()`` when done).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        NotADirectoryError: ``path`` is a file.
        ValueError: ``max_connections`` below 1 or ``timeout_s`` not positive.
        OSError: the address cannot be bound (port in use, permission).
    """
    if not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections must be a positive integer, got {max_connections!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such directory to serve")
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: is a file; serve the dataset's directory")
    handler_cls = type("Handler", (RangeRequestHandler,), {"support_ranges": support_ranges,
                                                           "timeout_s": float(timeout_s)})
    handler = functools.partial(handler_cls, directory=str(root.resolve()))
    return _Server((host, port), handler, max_connections)


def server_url(server: http.server.HTTPServer) -> str:
    """The base URL of a bound server, ending in ``/`` (``http://127.0.0.1:PORT/``)."""
    host, port = server.server_address[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


@contextlib.contextmanager
def serve_directory(path: str | os.PathLike, host: str = LOOPBACK, port: int = 0, *,
                    support_ranges: bool = True, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    """Serve ``path`` over HTTP from a background thread for the duration of a ``with`` block.

    Example::

        with serve_directory("out/train") as (url, server):
            ds = open_dataset(url)          # url = "http://127.0.0.1:PORT/"

    Args:
        path, host, port, support_ranges, max_connections, timeout_s: as :func:`make_server`.

    Yields:
        ``(url, server)``: the base URL (ending in ``/``) and the running server.

    Raises:
        As :func:`make_server`.
    """
    server = make_server(path, host, port, support_ranges=support_ranges, max_connections=max_connections,
                         timeout_s=timeout_s)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name=f"shardfeed-serve-{server.server_address[1]}", daemon=True)
    thread.start()
    try:
        yield server_url(server), server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
