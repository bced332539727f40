"""HTTP sources against one small real server on 127.0.0.1 that misbehaves on request: bodies
without ``Content-Length`` (chunked, closed by the server) and cut ones, endless and trickling
bodies, a huge ``Content-Length``, ``Content-Encoding: gzip``, a refused ``HEAD``, ``403`` in the
middle of an epoch, Basic authentication. Expected values come from the files the server serves."""

from __future__ import annotations

import base64
import gzip
import http.server
import logging
import re
import shutil
import threading
import time
import zlib
from pathlib import Path

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import DataSourceError, StorageAccessError
from shardfeed.readers.storage.http_io import HttpLocation, HttpRangeStream, http_get, index_size_cap

pytestmark = pytest.mark.network

PASSWORD = "Sf-HTTP-pa55word-DoNotPrint"


class _Server(http.server.BaseHTTPRequestHandler):
    """Serves ``server.root`` with ``Range`` (206) and misbehaves as ``server.opts`` says:

    ``framing``: ``"length"`` | ``"chunked"`` | ``"close"`` (no length, the server closes);
    ``cut_once``: ``{path: bytes}``: the next GET of ``path`` sends that many body bytes and closes;
    ``endless``: paths whose GET sends spaces forever; ``trickle``: paths sent a byte every 0.3 s
    (``trickle_headers``: the headers too); ``huge_length``: paths answered with
    ``Content-Length: 10**15``; ``encode``: ``{path_suffix: "gzip" | "deflate"}``, the body
    encoded with that ``Content-Encoding`` (a range too, as a misconfigured server does);
    ``encode_whole``: the same for whole-file answers only (``HEAD`` included), ranges sent as identity;
    ``head_status``: the status every HEAD gets (403, 405); ``fail_after``/``fail_status``: after
    that many shard GETs every request gets ``fail_status``; ``password``: Basic auth required.
    ``server.log`` records ``(method, path, Range, Authorization)``.
    """

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _plain(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="data"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        srv, o = self.server, self.server.opts
        path = self.path.split("?", 1)[0]
        with srv.lock:
            srv.log.append((self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
            if path.endswith(".tar") and self.command == "GET":
                srv.tar_gets += 1
            failing = srv.tar_gets > o.get("fail_after", 10 ** 9)
            cut = o.get("cut_once", {}).pop(path, None) if self.command == "GET" else None
        if o.get("password"):
            want = "Basic " + base64.b64encode(f"reader:{o['password']}".encode()).decode()
            if self.headers.get("Authorization") != want:
                return self._plain(401, b"authentication required")
        if failing:
            return self._plain(o.get("fail_status", 403), b"expired")
        if self.command == "HEAD" and o.get("head_status"):
            return self._plain(o["head_status"])
        if path in o.get("endless", ()):
            return self._endless()
        if path in o.get("trickle", ()):
            return self._trickle(path)
        f = srv.root / path.lstrip("/")
        if not f.is_file():
            return self._plain(404, b"not found")
        data = f.read_bytes()
        if path in o.get("huge_length", ()):
            self.send_response(200)
            self.send_header("Content-Length", str(10 ** 15))
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return
        start, stop = 0, len(data)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if m:
            start, stop = int(m.group(1)), min(len(data), int(m.group(2)) + 1 if m.group(2) else len(data))
        body = data[start:stop]
        coding = next((c for suffix, c in o.get("encode", {}).items() if path.endswith(suffix)), None)
        if not m:
            coding = coding or next((c for suffix, c in o.get("encode_whole", {}).items() if path.endswith(suffix)),
                                    None)
        if coding:
            body = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        if coding:
            self.send_header("Content-Encoding", coding)
        framing = o.get("framing", "length")
        if framing == "length":
            self.send_header("Content-Length", str(len(body)))
        elif framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut is not None:
            body = body[:cut]
        if framing == "chunked":
            for i in range(0, len(body), 1000):
                part = body[i:i + 1000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            if cut is None:
                self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(body)
        if cut is not None:
            self.wfile.flush()
            self.close_connection = True

    def _endless(self):
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        block = b" " * 65536
        try:
            while True:
                self.wfile.write(block)
        except OSError:
            pass
        self.close_connection = True

    def _trickle(self, path: str):
        body = (self.server.root / path.lstrip("/")).read_bytes()
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nX-Padding: {'p' * 50}\r\n\r\n".encode()
        out = head + body if self.server.opts.get("trickle_headers") else body
        if not self.server.opts.get("trickle_headers"):
            self.wfile.write(head)
        try:
            for i in range(len(out)):
                self.wfile.write(out[i:i + 1])
                self.wfile.flush()
                time.sleep(0.3)
        except OSError:
            pass
        self.close_connection = True


@pytest.fixture
def serve(packed_root):
    """``serve(root=packed_root, **opts) -> (base_url, server)``."""
    servers = []

    def start(root: Path = packed_root, **opts):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
        srv.daemon_threads = True
        srv.root, srv.opts, srv.log, srv.tar_gets, srv.lock = Path(root), opts, [], 0, threading.Lock()
        srv.handle_error = lambda request, address: None  # clients hanging up on a misbehaving answer
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _samples(source, **kw) -> list:
    return [(s.meta["path"], bytes(s.data), s.label) for s in open_dataset(source, decode=False, shuffle=False, **kw)]


@pytest.fixture(scope="module")
def local(packed_wds):
    return _samples(packed_wds)


# ---------------------------------------------------------------------------------------------
# bodies without Content-Length, read exactly

@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_bodies_without_content_length_are_read_exactly(framing, serve, packed_root, local, tiny_folder_expected):
    base, _ = serve(framing=framing)
    assert http_get(f"{base}/wds/manifest.json") == (packed_root / "wds/manifest.json").read_bytes()
    parts = [_samples(f"{base}/wds/", rank=r, world_size=3) for r in range(3)]  # ranges inside shards
    assert sorted(x for p in parts for x in p) == sorted(local)
    assert {p: (d, lbl) for p, d, lbl in local} == tiny_folder_expected


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_a_cut_body_without_content_length_is_resumed_not_handed_out_short(framing, serve, packed_root):
    """A range whose body the server closes early: without a Content-Length only the
    Content-Range says how much is due; the read resumes at the byte where it stopped."""
    source = (packed_root / "wds/shard-000000.tar").read_bytes()
    base, srv = serve(framing=framing, cut_once={"/wds/shard-000000.tar": 3000})
    with HttpRangeStream(f"{base}/wds/shard-000000.tar", 1024, len(source)) as s:
        got = b""
        while chunk := s.read(4096):
            got += chunk
    assert got == source[1024:]
    assert [r for m, p, r, _ in srv.log if m == "GET"] == [f"bytes=1024-{len(source) - 1}",
                                                           f"bytes=4024-{len(source) - 1}"]


# ---------------------------------------------------------------------------------------------
# size caps and the overall deadline

@pytest.mark.timeout(60)
def test_an_endless_manifest_is_refused_at_the_cap(serve, monkeypatch):
    from shardfeed.readers.storage import http_io

    assert http_io.MAX_MANIFEST_BYTES == 256 << 20
    monkeypatch.setattr(http_io, "MAX_MANIFEST_BYTES", 4 << 20)  # the same rule, a smaller cap: a fast test
    base, _ = serve(endless={"/wds/manifest.json"})
    with pytest.raises(DataSourceError, match=rf"{base}/wds/manifest.json: the manifest sends more than "
                                              r"4,194,304 bytes; refused"):
        HttpLocation(f"{base}/wds/", retries=2).load_manifest()


def test_a_huge_content_length_is_refused_before_reading(serve):
    base, srv = serve(huge_length={"/wds/manifest.json"})
    with pytest.raises(DataSourceError, match=rf"{base}/wds/manifest.json: the manifest is "
                                              r"1,000,000,000,000,000 bytes \(Content-Length\), more than the "
                                              r"268,435,456 accepted"):
        open_dataset(f"{base}/wds/", retries=2)
    assert len([e for e in srv.log if e[1] == "/wds/manifest.json"]) == 1  # refused, not retried


def test_an_index_larger_than_its_shard_needs_is_refused(serve, packed_root, tmp_path):
    shutil.copytree(packed_root / "wds", tmp_path / "wds")
    index = tmp_path / "wds" / "shard-000001.sfidx"
    cap = index_size_cap(16)
    index.write_bytes(index.read_bytes() + b"\0" * cap)  # 16 samples: at most 8 * 16 + slack bytes
    base, _ = serve(root=tmp_path)
    with pytest.raises(DataSourceError, match=rf"{base}/wds/shard-000001.sfidx: the offset index is "
                                              rf"{cap + 128:,} bytes \(Content-Length\), more than the {cap:,}"):
        _samples(f"{base}/wds/", rank=1, world_size=3)  # rank 1 starts inside shard 1: reads its index


@pytest.mark.timeout(60)
@pytest.mark.parametrize("headers_too", [False, True])
def test_a_trickling_manifest_ends_at_the_deadline(headers_too, serve):
    """A byte every 0.3 s never trips the 10 s per-read timeout; the deadline ends the request."""
    base, _ = serve(trickle={"/wds/manifest.json"}, trickle_headers=headers_too)
    t0 = time.monotonic()
    with pytest.raises(DataSourceError, match=rf"{base}/wds/manifest.json: no complete answer within 1.5 s"):
        HttpLocation(f"{base}/wds/", deadline_s=1.5, retries=2).load_manifest()
    assert time.monotonic() - t0 < 20  # one attempt and no hang (the manifest would take minutes)


def test_a_trickling_shard_body_ends_at_the_deadline_of_each_read(serve):
    """Headers at once, then a byte every 0.3 s: each read gives up at the deadline, is retried from
    the same byte, and the stream fails after its retries instead of reading for ever."""
    base, _ = serve(trickle={"/wds/shard-000000.tar"})
    stream = HttpRangeStream(f"{base}/wds/shard-000000.tar", deadline_s=1.5, retries=1)
    t0 = time.monotonic()
    with pytest.raises(DataSourceError, match=r"shard-000000\.tar: reading at byte 0 failed after 2 attempts "
                                              r"\(TimeoutError: .* in 1\.5 s: the server sends the body a trickle"):
        stream.read(1 << 16)
    assert time.monotonic() - t0 < 15  # two attempts of 1.5 s (the shard would take hours)
    stream.close()


# ---------------------------------------------------------------------------------------------
# content codings

@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_an_encoded_manifest_is_decoded(coding, serve, local):
    base, _ = serve(encode={"manifest.json": coding})
    assert _samples(f"{base}/wds/") == local


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_encoded_range_is_refused_naming_the_encoding(framing, serve):
    base, _ = serve(encode={".tar": "gzip"}, framing=framing)
    with pytest.raises(DataSourceError, match=r"shard-000000.tar: the server sent a byte range with "
                                              r"Content-Encoding: gzip"):
        HttpRangeStream(f"{base}/wds/shard-000000.tar", 512, 2048)


def test_a_manifest_that_decodes_past_the_cap_is_refused(serve, packed_root, tmp_path, monkeypatch):
    from shardfeed.readers.storage import http_io

    monkeypatch.setattr(http_io, "MAX_MANIFEST_BYTES", 1 << 20)
    (tmp_path / "wds").mkdir()
    (tmp_path / "wds" / "manifest.json").write_bytes(b" " * (8 << 20))  # 8 MiB of spaces: ~8 KiB gzipped
    base, _ = serve(root=tmp_path, encode={"manifest.json": "gzip"})
    with pytest.raises(DataSourceError, match=r"the manifest decodes to more than 1,048,576 bytes"):
        HttpLocation(f"{base}/wds/").load_manifest()


# ---------------------------------------------------------------------------------------------
# HEAD refused

@pytest.mark.parametrize("status", [403, 405])
def test_a_server_refusing_head_is_read_with_a_ranged_get_for_sizes(status, serve, local):
    base, srv = serve(head_status=status)
    assert _samples(f"{base}/wds/") == local
    assert ("GET", "/wds/shard-000000.tar", "bytes=0-0", None) in srv.log


def test_sizes_from_the_ranged_get_still_catch_a_truncated_shard(serve, packed_root, tmp_path):
    from shardfeed.readers.errors import ManifestError

    shutil.copytree(packed_root / "wds", tmp_path / "wds")
    shard = tmp_path / "wds" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])
    base, _ = serve(root=tmp_path, head_status=405)
    with pytest.raises(ManifestError, match=rf"{base}/wds/shard-000001.tar: \d+ bytes on the server but"):
        open_dataset(f"{base}/wds/")


# ---------------------------------------------------------------------------------------------
# access refused mid-epoch; Basic authentication

@pytest.mark.parametrize("status", [401, 403])
def test_access_refused_mid_epoch_raises_even_under_skip(status, serve, tiny_folder_expected):
    base, _ = serve(fail_after=1, fail_status=status)
    ds = open_dataset(f"{base}/wds/", decode=False, shuffle=False, on_error="skip", check_files=False)
    got = []
    with pytest.raises(StorageAccessError, match=rf"{base}/wds/shard-000001.tar: HTTP {status} .*renew"):
        for s in ds:
            got.append((s.meta["path"], bytes(s.data), s.label))
    assert len(got) == 16 and all(tiny_folder_expected[p] == (d, lbl) for p, d, lbl in got)


def test_user_and_password_in_the_url_are_sent_as_basic_auth_and_never_shown(serve, local, caplog):
    base, srv = serve(password=PASSWORD)
    url = base.replace("http://", f"http://reader:{PASSWORD}@") + "/wds/"
    with caplog.at_level(logging.DEBUG, logger="shardfeed"):
        assert _samples(url) == local
    wrong = base.replace("http://", "http://reader:wrong-Pa55word@") + "/wds/"
    with pytest.raises(StorageAccessError, match=r"HTTP 401") as e:
        open_dataset(wrong)
    assert PASSWORD not in caplog.text and "wrong-Pa55word" not in str(e.value)
    assert all(auth is not None for _, _, _, auth in srv.log)


@pytest.mark.multiprocess
def test_loader_workers_forked_after_http_requests_read_everything(serve, tiny_folder_expected):
    """The parent's requests started the deadline watchdog; forked workers get their own."""
    from shardfeed.readers import make_loader

    base, _ = serve(framing="chunked")
    loader = make_loader(f"{base}/wds/", batch_size=5, num_workers=2, decode=False, seed=1, collate_fn=list)
    got = {s.meta["path"]: (bytes(s.data), s.label) for batch in loader for s in batch}
    assert got == tiny_folder_expected


# ---------------------------------------------------------------------------------------------
# HTTP_PROXY

class _ForwardProxy(http.server.BaseHTTPRequestHandler):
    """A forward proxy for absolute-form GET/HEAD (RFC 9112 3.2.2) requiring
    ``Proxy-Authorization`` ``server.auth``; records each target in ``server.seen``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        import http.client
        import urllib.parse

        srv = self.server
        srv.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if self.headers.get("Proxy-Authorization") != srv.auth:
            self.send_response(407)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        u = urllib.parse.urlsplit(self.path)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-authorization", "connection")}
        conn.request(self.command, u.path + (f"?{u.query}" if u.query else ""), headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if self.command == "GET" else resp.getheader(
            "Content-Length", "0")))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)
        conn.close()

    do_GET = do_HEAD = _forward


def test_http_proxy_from_the_environment_is_used_with_its_credentials(serve, local, monkeypatch):
    base, origin = serve()
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ForwardProxy)
    proxy.daemon_threads = True
    proxy.seen, proxy.auth = [], "Basic " + base64.b64encode(f"p:{PASSWORD}".encode()).decode()
    threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://p:{PASSWORD}@127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert _samples(f"{base}/wds/") == local
        assert proxy.seen and all(path.startswith(f"{base}/wds/") for _, path, _ in proxy.seen)
        assert len(origin.log) == len(proxy.seen)  # everything went through the proxy
        # a wrong proxy password: one clear error naming the proxy's answer, no password shown
        monkeypatch.setenv("HTTP_PROXY", f"http://p:wrong-Pa55@127.0.0.1:{proxy.server_address[1]}")
        with pytest.raises(StorageAccessError, match=r"HTTP 407") as e:
            open_dataset(f"{base}/wds/")
        assert "wrong-Pa55" not in str(e.value) and PASSWORD not in str(e.value)
        # NO_PROXY bypasses it
        monkeypatch.setenv("HTTP_PROXY", f"http://p:{PASSWORD}@127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        before = len(proxy.seen)
        assert _samples(f"{base}/wds/") == local
        assert len(proxy.seen) == before
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_cli_reports_of_a_url_with_a_password_never_show_it(serve, tmp_path):
    import json
    import subprocess
    import sys

    base, _ = serve(password=PASSWORD)
    url = base.replace("http://", f"http://reader:{PASSWORD}@") + "/wds/"
    for cmd in (["inspect", url, "--json", "-"], ["check", url, "--json", str(tmp_path / "c.json")]):
        r = subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "-vv", *cmd], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        written = r.stdout + r.stderr + ((tmp_path / "c.json").read_text() if cmd[0] == "check" else "")
        assert PASSWORD not in written and "shard-000000.tar" in written
        if cmd[0] == "inspect":
            assert json.loads(r.stdout)  # the JSON report, whole


def test_the_index_cap_is_bounded_by_what_the_shard_can_hold():
    """A manifest claiming a trillion samples in a 1 MiB shard gets no terabyte cap."""
    from shardfeed.readers.storage.http_io import INDEX_SLACK_BYTES, MAX_WHOLE_READ_BYTES

    assert index_size_cap(16) == 8 * 16 + INDEX_SLACK_BYTES
    assert index_size_cap(10 ** 12, 1 << 20) == 8 * ((1 << 20) // 512) + INDEX_SLACK_BYTES
    assert index_size_cap(10 ** 12) == MAX_WHOLE_READ_BYTES


def test_the_deadline_watchdog_keeps_no_more_than_its_armed_requests():
    """Thousands of finished requests leave a bounded heap behind (disarmed entries are dropped)."""
    import socket

    from shardfeed.readers.storage.http_io import _WATCHDOG

    with socket.socket() as s:
        for _ in range(5000):
            _WATCHDOG.disarm(_WATCHDOG.arm(time.monotonic() + 3600, s))
        held = _WATCHDOG.arm(time.monotonic() + 3600, s)
        assert len(_WATCHDOG._heap) <= 1025 and not held[3]
        _WATCHDOG.disarm(held)
        fired = _WATCHDOG.arm(time.monotonic() + 0.05, s)  # past its deadline: the socket is shut down
        deadline = time.monotonic() + 5
        while not fired[3] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired[3]


def test_a_host_name_with_an_empty_label_is_an_error_naming_the_url():
    from shardfeed.readers.errors import DataSourceError
    from shardfeed.readers.storage.http_io import http_get

    with pytest.raises(DataSourceError, match=r"http://a\.\.b/blob: .*label empty or too long"):
        http_get("http://a..b/blob", retries=0)


def test_a_server_that_encodes_whole_files_but_not_ranges_reads_the_intact_dataset(serve, local):
    # HEAD's Content-Length is then the gzip body's length, not the shard's size: the size comes
    # from a ranged GET's Content-Range, and the dataset reads whole
    base, srv = serve(encode_whole={".tar": "gzip", ".sfidx": "gzip"})
    assert _samples(f"{base}/wds/") == local
    assert any(method == "HEAD" for method, *_ in srv.log)
