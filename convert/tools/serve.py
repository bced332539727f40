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

File bodies go out with ``socket.sendfile`` (zero-copy). Paths cannot escape the served folder
(the standard library's ``translate_path`` drops ``..`` components). It binds to loopback
(``127.0.0.1``) unless told otherwise.

This is a convenience, not a production server: it has no TLS, no authentication, no caching
headers beyond ``Last-Modified``. To serve a dataset to a cluster, use a real web server (nginx
answers ``Range`` requests out of the box) or an object store; see the README for an nginx
``location`` block.

``support_ranges=False`` gives a server that ignores ``Range`` headers (always ``200`` with the
whole file), like Python's own ``http.server``: readers must work against both kinds.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import http.server
import logging
import os
import re
import threading
from pathlib import Path
from typing import Iterator

__all__ = ["RangeRequestHandler", "make_server", "serve_directory", "parse_range", "LOOPBACK", "server_url"]

log = logging.getLogger(__name__)

#: The default bind address: loopback only.
LOOPBACK = "127.0.0.1"
_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """Interpret a ``Range`` header against a file of ``size`` bytes.

    Args:
        header: the header value (``"bytes=0-1023"``), or None.
        size: the file size, bytes.

    Returns:
        ``(first, last)`` inclusive byte positions for a satisfiable single range; ``None`` when the
        whole file should be sent (no header, a multi-range or malformed header, which RFC 9110
        lets a server ignore); the string ``"unsatisfiable"`` when the range lies past the end.
    """
    if not header:
        return None
    m = _RANGE_RE.match(header)
    if not m:
        return None  # multi-range ("bytes=0-1,5-9") or another unit: send the whole file
    first_s, last_s = m.groups()
    if not first_s and not last_s:
        return None
    if not first_s:  # suffix range: the last N bytes
        n = int(last_s)
        if n == 0:
            return "unsatisfiable"
        return (max(size - n, 0), size - 1) if size else "unsatisfiable"
    first = int(first_s)
    last = int(last_s) if last_s else size - 1
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

    def send_head(self):  # noqa: D102 (standard library hook)
        self._body = (0, None)
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            return super().send_head()  # redirect / index.html / listing, as the standard server
        if path.endswith("/"):
            self.send_error(404, "File not found")
            return None
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(404, "File not found")
            return None
        try:
            st = os.fstat(f.fileno())
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
        except (BrokenPipeError, ConnectionResetError):
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
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(path: str | os.PathLike, host: str = LOOPBACK, port: int = 0, *,
                support_ranges: bool = True) -> http.server.ThreadingHTTPServer:
    """Create (not start) a threaded HTTP server for the folder ``path``.

    Args:
        path: the folder to serve (a packed dataset directory, typically).
        host: the address to bind; loopback by default. ``0.0.0.0`` exposes every file below
            ``path`` to the network, without authentication.
        port: the TCP port; 0 picks a free one (read it from ``server.server_address[1]``).
        support_ranges: False ignores ``Range`` headers (always the whole file), like Python's
            ``http.server``.

    Returns:
        The bound server; call ``serve_forever()`` (and ``server_close()`` when done).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        NotADirectoryError: ``path`` is a file.
        OSError: the address cannot be bound (port in use, permission).
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such directory to serve")
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: is a file; serve the dataset's directory")
    handler_cls = type("Handler", (RangeRequestHandler,), {"support_ranges": support_ranges})
    handler = functools.partial(handler_cls, directory=str(root.resolve()))
    return _Server((host, port), handler)


def server_url(server: http.server.HTTPServer) -> str:
    """The base URL of a bound server, ending in ``/`` (``http://127.0.0.1:PORT/``)."""
    host, port = server.server_address[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


@contextlib.contextmanager
def serve_directory(path: str | os.PathLike, host: str = LOOPBACK, port: int = 0, *,
                    support_ranges: bool = True) -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    """Serve ``path`` over HTTP from a background thread for the duration of a ``with`` block.

    Example::

        with serve_directory("out/train") as (url, server):
            ds = open_dataset(url)          # url = "http://127.0.0.1:PORT/"

    Args:
        path, host, port, support_ranges: as :func:`make_server`.

    Yields:
        ``(url, server)``: the base URL (ending in ``/``) and the running server.

    Raises:
        As :func:`make_server`.
    """
    server = make_server(path, host, port, support_ranges=support_ranges)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name=f"shardfeed-serve-{server.server_address[1]}", daemon=True)
    thread.start()
    try:
        yield server_url(server), server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
