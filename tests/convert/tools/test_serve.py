"""`shardfeed.convert.tools.serve`: the threaded HTTP server with Range support (127.0.0.1 only).

Expectations come from the files on disk, fetched with the standard library's ``http.client``.
"""

from __future__ import annotations

import http.client
import os
import threading
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
