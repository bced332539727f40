"""Connection reuse of the HTTP reader against a real keep-alive server on 127.0.0.1 that counts
the connections it accepts: sequential ranged reads share one connection, a stream closed before
its end never hands its leftover bytes to the next request, a forked process opens its own.
Expected bytes are the server's planted file."""

from __future__ import annotations

import http.server
import logging
import multiprocessing
import os
import re
import threading
import time

import pytest

from shardfeed.readers.storage import http_io
from shardfeed.readers.errors import DataSourceError
from shardfeed.readers.storage.http_io import HttpLocation, http_get

pytestmark = pytest.mark.network

BLOB = bytes((i * 7 + i // 251) % 256 for i in range(300_000))


class _RangeServer(http.server.BaseHTTPRequestHandler):
    """Serves ``BLOB`` as ``/data/blob.bin`` over HTTP/1.1 keep-alive, answering ``Range`` with
    206; ``server.connections`` counts accepted connections, ``server.requests`` requests."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        with self.server.lock:
            self.server.requests += 1
        if self.path == "/data/trickle":  # the status line and headers, a byte every 0.2 s
            for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100 + b"\r\nContent-Length: 2\r\n\r\nok":
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    break
                time.sleep(0.2)
            self.close_connection = True
            return
        if self.path.split("?")[0] != "/data/blob.bin":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            first = int(m[1])
            last = min(int(m[2]) if m[2] else len(BLOB) - 1, len(BLOB) - 1)
            body = BLOB[first:last + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(BLOB)}")
        else:
            body = BLOB
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeServer)
    srv.daemon_threads = True
    srv.lock = threading.Lock()
    srv.connections = srv.requests = 0
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _loc(srv) -> HttpLocation:
    # a port of its own in every test: no connection of another test's server is in the pool
    return HttpLocation(f"http://127.0.0.1:{srv.server_address[1]}/data/")


def _read_range(loc: HttpLocation, start: int, end: int) -> bytes:
    s, at = loc.open("blob.bin", start, end)
    with s:
        assert at == start
        return s.read(end - start)


def test_sequential_ranged_reads_share_one_connection(server):
    loc = _loc(server)
    spans = [(i * 9_000, i * 9_000 + 5_000 + i) for i in range(25)]
    for start, end in spans:
        assert _read_range(loc, start, end) == BLOB[start:end]
    assert loc.read_bytes("blob.bin") == BLOB
    assert server.requests == 26
    assert server.connections == 1


def test_a_stream_closed_before_its_end_does_not_pass_its_bytes_to_the_next_request(server):
    loc = _loc(server)
    s, _ = loc.open("blob.bin", 1_000, 250_000)
    assert s.read(10) == BLOB[1_000:1_010]  # most of the 249,000 bytes are left unread
    s.close()
    assert _read_range(loc, 5, 105) == BLOB[5:105]
    assert http_get(f"http://127.0.0.1:{server.server_address[1]}/data/blob.bin") == BLOB
    assert server.connections == 2  # the cut stream's connection was closed, the next one reused


def test_a_short_unread_rest_and_head_requests_keep_the_connection(server):
    """A shard read to its last sample leaves the tar end blocks unread; HEAD answers have no body."""
    loc = _loc(server)
    url = f"http://127.0.0.1:{server.server_address[1]}/data/blob.bin"
    assert http_io._http_head_size(url, 10.0, 0) == len(BLOB)
    s, _ = loc.open("blob.bin", 1_000)
    assert s.read(len(BLOB) - 11_000) == BLOB[1_000:-10_000]  # 10,000 bytes (under DRAIN_MAX_BYTES) left
    s.close()
    assert http_io._http_head_size(url, 10.0, 0) == len(BLOB)
    assert _read_range(loc, 7, 9_007) == BLOB[7:9_007]
    assert server.requests == 4
    assert server.connections == 1


def test_the_deadline_holds_on_a_reused_connection(server):
    """The watchdog is armed on every request's socket, a pooled one too: headers sent a byte
    every 0.2 s (each read within its timeout) end at the deadline."""
    base = f"http://127.0.0.1:{server.server_address[1]}/data"
    assert http_get(f"{base}/blob.bin") == BLOB  # the pool now holds this connection
    t0 = time.monotonic()
    with pytest.raises(DataSourceError, match=r"/data/trickle: no complete answer within 1 s"):
        http_get(f"{base}/trickle", deadline_s=1.0, retries=0)
    assert time.monotonic() - t0 < 10  # the trickle alone would take 30 s
    assert server.connections == 1  # the trickling answer came on the reused connection


def test_the_transport_debug_records_name_no_credential(server, caplog):
    """urllib3 logs each request's path at DEBUG: a signature in the query and the URL's
    password never reach a record."""
    password, signature = "Pool-pa55word-DoNotPrint", "SiGnAtUrE0123456789abcdef"
    url = f"http://reader:{password}@127.0.0.1:{server.server_address[1]}/data/blob.bin?X-Amz-Signature={signature}"
    with caplog.at_level(logging.DEBUG):
        assert http_get(url) == BLOB
        assert http_get(url) == BLOB
    assert any(r.name.startswith("urllib3") for r in caplog.records)  # the transport did log the requests
    assert password not in caplog.text and signature not in caplog.text


def _child_read(loc: HttpLocation, q) -> None:
    try:
        q.put(_read_range(loc, 200, 64_000))
    except BaseException as exc:  # reported to the parent
        q.put(repr(exc))


@pytest.mark.multiprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork start method")
def test_a_forked_process_opens_its_own_connection(server):
    loc = _loc(server)
    assert _read_range(loc, 0, 1_000) == BLOB[:1_000]  # the parent's pool now holds an idle connection
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(loc, q))
    p.start()
    got = q.get(timeout=60)
    p.join(60)
    assert got == BLOB[200:64_000]
    assert _read_range(loc, 70_000, 71_000) == BLOB[70_000:71_000]  # the parent's connection still works
    assert server.connections == 2  # one in the parent (reused), one of the child's own
