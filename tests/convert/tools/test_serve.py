"""`shardfeed.convert.tools.serve`: the threaded HTTP server with Range support (127.0.0.1 only).

Expectations come from the files on disk, fetched with the standard library's ``http.client``.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from shardfeed.convert.tools.serve import parse_range, serve_directory

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve")
    (root / "blob.bin").write_bytes(os.urandom(100_000))
    (root / "sub").mkdir()
    (root / "sub" / "small.tar").write_bytes(b"0123456789")
    (root / "empty.idx").write_bytes(b"")
    return root


def _request(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, u.path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def test_parse_range():
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-3", 10) == (0, 3)
    assert parse_range("bytes=5-", 10) == (5, 9)
    assert parse_range("bytes=-4", 10) == (6, 9)
    assert parse_range("bytes=-40", 10) == (0, 9)
    assert parse_range("bytes=8-100", 10) == (8, 9)
    assert parse_range("bytes=10-", 10) == "unsatisfiable"
    assert parse_range("bytes=0-1,4-5", 10) is None  # multi-range: whole file
    assert parse_range("items=0-1", 10) is None
    assert parse_range("bytes=5-2", 10) is None


def test_binds_loopback_by_default(served_dir):
    with serve_directory(served_dir) as (url, server):
        assert server.server_address[0] == "127.0.0.1"
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")


def test_get_head_and_ranges(served_dir):
    data = (served_dir / "blob.bin").read_bytes()
    with serve_directory(served_dir) as (url, _):
        status, headers, body = _request(url + "blob.bin")
        assert status == 200 and body == data
        assert headers["content-length"] == str(len(data)) and headers["accept-ranges"] == "bytes"

        status, headers, body = _request(url + "blob.bin", "HEAD")
        assert status == 200 and body == b"" and headers["content-length"] == str(len(data))

        for rng, (a, b) in {"bytes=0-511": (0, 511), "bytes=1000-": (1000, len(data) - 1),
                            "bytes=-100": (len(data) - 100, len(data) - 1),
                            "bytes=99990-200000": (99990, len(data) - 1)}.items():
            status, headers, body = _request(url + "blob.bin", headers={"Range": rng})
            assert status == 206, rng
            assert body == data[a:b + 1]
            assert headers["content-range"] == f"bytes {a}-{b}/{len(data)}"
            assert headers["content-length"] == str(b - a + 1)

        status, headers, _ = _request(url + "blob.bin", "HEAD", {"Range": "bytes=10-19"})
        assert status == 206 and headers["content-length"] == "10"

        status, headers, _ = _request(url + "blob.bin", headers={"Range": f"bytes={len(data)}-"})
        assert status == 416 and headers["content-range"] == f"bytes */{len(data)}"

        status, _, body = _request(url + "sub/small.tar", headers={"Range": "bytes=2-4"})
        assert status == 206 and body == b"234"
        status, headers, body = _request(url + "empty.idx")
        assert status == 200 and body == b"" and headers["content-length"] == "0"


def test_no_escape_and_missing(served_dir):
    (served_dir.parent / "secret.txt").write_bytes(b"secret")
    with serve_directory(served_dir) as (url, _):
        status, _, body = _request(url + "../secret.txt")
        assert status == 404 and b"secret" not in body
        status, _, _ = _request(url + "%2e%2e/secret.txt")
        assert status == 404
        status, _, _ = _request(url + "nope.tar")
        assert status == 404


def test_server_without_ranges(served_dir):
    data = (served_dir / "blob.bin").read_bytes()
    with serve_directory(served_dir, support_ranges=False) as (url, _):
        status, headers, body = _request(url + "blob.bin", headers={"Range": "bytes=10-19"})
        assert status == 200 and body == data and "accept-ranges" not in headers


def test_threaded_concurrent_requests(served_dir):
    data = (served_dir / "blob.bin").read_bytes()
    results = []
    with serve_directory(served_dir) as (url, _):
        def fetch(i):
            a = i * 1000
            status, _, body = _request(url + "blob.bin", headers={"Range": f"bytes={a}-{a + 999}"})
            results.append(status == 206 and body == data[a:a + 1000])

        threads = [threading.Thread(target=fetch, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == [True] * 16


def test_keep_alive_connection(served_dir):
    data = (served_dir / "blob.bin").read_bytes()
    with serve_directory(served_dir) as (url, _):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        try:
            for a in (0, 5000, 90000):
                conn.request("GET", "/blob.bin", headers={"Range": f"bytes={a}-{a + 99}"})
                resp = conn.getresponse()
                assert resp.status == 206 and resp.read() == data[a:a + 100]
        finally:
            conn.close()


# ---------------------------------------------------------------------------------------------
# what is served: regular files inside the folder, reached without links, nothing hidden

@pytest.fixture()
def tricky_dir(tmp_path) -> tuple[Path, bytes]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"outside-secret")
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    shard = os.urandom(2000)
    (root / "data" / "shard-000000.tar").write_bytes(shard)
    (root / "manifest.json").write_bytes(b"{}")
    (root / ".private").mkdir()
    (root / ".private" / "key").write_bytes(b"hidden-key")
    (root / ".shardfeed.lock").write_bytes(b"hidden-lock")
    (root / "data" / ".partial.tar").write_bytes(b"hidden-partial")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linkdir").symlink_to(outside)
    (root / "inside-link.tar").symlink_to(root / "data" / "shard-000000.tar")
    os.mkfifo(root / "fifo")
    return root, shard


@pytest.mark.parametrize("path", [
    "/link.txt", "/linkdir/secret.txt", "/linkdir/", "/inside-link.tar", "/.private/key", "/.shardfeed.lock",
    "/data/.partial.tar", "/%2eprivate/key", "/data/%2e%2e/.shardfeed.lock", "/.private/", "/fifo",
    "/data/%2e%2e/%2e%2e/outside/secret.txt", "/data/..%2f..%2foutside/secret.txt"])
def test_links_hidden_files_and_special_files_are_not_served(tricky_dir, path):
    root, _ = tricky_dir
    with serve_directory(root) as (url, _):
        for method in ("GET", "HEAD"):
            status, _, body = _request(url.rstrip("/") + path, method)
            assert status == 404, (method, path, status)
            assert b"secret" not in body and b"hidden" not in body


def test_listings_leave_out_links_and_hidden_names(tricky_dir):
    root, shard = tricky_dir
    with serve_directory(root) as (url, _):
        status, _, body = _request(url)
        assert status == 200
        links = set(re.findall(r'href="([^"]*)"', body.decode()))
        assert links == {"data/", "manifest.json"}
        status, _, body = _request(url + "data/")
        assert status == 200 and set(re.findall(r'href="([^"]*)"', body.decode())) == {"shard-000000.tar"}
        status, headers, _ = _request(url + "data")
        assert status == 301 and headers["location"].endswith("/data/")
        status, _, body = _request(url + "data/shard-000000.tar")
        assert status == 200 and body == shard


# ---------------------------------------------------------------------------------------------
# malformed Range headers always get an answer

@pytest.mark.parametrize("rng,status", [
    ("bytes=" + "9" * 4400 + "-", 416),
    ("bytes=0-" + "9" * 4400, 206),
    ("bytes=-" + "9" * 4400, 206),
    ("bytes=" + "1" * 5000 + "-" + "2" * 5000, 416),
    ("bytes=-5-10", 200), ("bytes=--5", 200), ("bytes=-0", 416), ("bytes=10-5", 200),
    ("bytes=abc-def", 200), ("bytes=", 200), ("bytes=-", 200), ("bytes", 200), ("garbage", 200),
    ("bytes=0-1,5-9", 200), ("bytes=0-1,,,," * 200, 200), ("bytes=\u0663-\u0665", 200),
    ("bytes=0x10-0x20", 200), ("bytes=1e3-", 200), ("bytes=" + "0" * 5000 + "1-2", 206),
    ("items=0-1", 200),
])
def test_every_malformed_range_gets_an_answer(served_dir, rng, status):
    data = (served_dir / "sub" / "small.tar").read_bytes()
    with serve_directory(served_dir) as (url, _):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        try:
            conn.putrequest("GET", "/sub/small.tar")
            conn.putheader("Range", rng.encode("utf-8"))
            conn.endheaders()
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    assert resp.status == status, (rng[:40], resp.status)
    if status == 200:
        assert body == data
    elif status == 206:
        first, last = map(int, resp.getheader("Content-Range").split()[1].split("/")[0].split("-"))
        assert body == data[first:last + 1] and len(body) > 0
    else:
        assert resp.getheader("Content-Range") == f"bytes */{len(data)}"


def test_parse_range_never_raises_on_huge_numbers():
    assert parse_range("bytes=" + "9" * 5000 + "-", 10) == "unsatisfiable"
    assert parse_range("bytes=2-" + "9" * 5000, 10) == (2, 9)
    assert parse_range("bytes=-" + "9" * 5000, 10) == (0, 9)


# ---------------------------------------------------------------------------------------------
# bounded connections: slow clients cannot lock others out

def _slow_client(port: int, drip: bool) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /blob.bin HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    if drip:
        def keep_dripping():
            try:
                for _ in range(200):
                    time.sleep(0.1)
                    s.sendall(b"X")
            except OSError:
                pass
        threading.Thread(target=keep_dripping, daemon=True).start()
    return s


def _closed_by_server(s: socket.socket, within_s: float) -> bool:
    s.settimeout(within_s)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except ConnectionResetError:
        return True
    except (TimeoutError, socket.timeout):
        return False


def test_slow_clients_are_bounded_in_count_and_time(served_dir):
    data = (served_dir / "blob.bin").read_bytes()
    cap, timeout_s = 4, 1.0
    with serve_directory(served_dir, max_connections=cap, timeout_s=timeout_s) as (url, server):
        port = server.server_address[1]
        slow = [_slow_client(port, drip=(i % 3 == 0)) for i in range(10)]
        try:
            time.sleep(0.3)
            handlers = [t for t in threading.enumerate() if "process_request_thread" in t.name]
            assert 0 < len(handlers) <= cap
            t0 = time.monotonic()
            status, _, body = _request(url + "blob.bin")
            waited = time.monotonic() - t0
            assert status == 200 and body == data
            assert waited < 3 * timeout_s + 2  # the queue ahead of it drains in waves of `cap`
            for s in slow:  # every slow client, the dripping ones too, was cut off
                assert _closed_by_server(s, within_s=4 * timeout_s)
        finally:
            for s in slow:
                s.close()


def test_idle_keep_alive_connection_is_closed(served_dir):
    with serve_directory(served_dir, timeout_s=0.5) as (url, server):
        s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        try:
            s.sendall(b"GET /sub/small.tar HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"0123456789"):
                got += s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert _closed_by_server(s, within_s=5)
            assert time.monotonic() - t0 < 3
        finally:
            s.close()


def test_many_stalled_clients_do_not_lock_out_a_normal_one(served_dir):
    """Default limits: 66 clients that never finish their headers, and a normal request still
    gets its answer at once."""
    data = (served_dir / "blob.bin").read_bytes()
    with serve_directory(served_dir) as (url, server):
        slow = [_slow_client(server.server_address[1], drip=False) for _ in range(66)]
        try:
            t0 = time.monotonic()
            status, _, body = _request(url + "blob.bin")
            assert status == 200 and body == data and time.monotonic() - t0 < 5
        finally:
            for s in slow:
                s.close()
