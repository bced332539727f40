"""WebDataset over HTTP from real servers on 127.0.0.1: nginx (answers Range) and Python's
http.server (ignores Range) give the same samples as the local read; failures name the URL."""

from __future__ import annotations

import http.server
import json
import shutil
import time

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import DataSourceError, ManifestError
from shardfeed.readers.format.offset_index import read_index
from shardfeed.readers.storage.http_io import HttpLocation

pytestmark = pytest.mark.network


def _raw(source, **kw):
    return [(s.key, s.data, s.label, s.meta["path"]) for s in open_dataset(source, decode=False, shuffle=False, **kw)]


@pytest.fixture(scope="module")
def local_samples(packed_wds):
    return _raw(packed_wds)


@pytest.mark.parametrize("server", ["nginx_server", "simple_http_server"])
def test_http_same_samples_as_local(server, request, packed_wds, local_samples):
    base = request.getfixturevalue(server)
    assert _raw(f"{base}/wds/") == local_samples
    assert _raw(f"{base}/wds/manifest.json") == local_samples
    # ranges that start and end inside shards (3 ranks of 20 samples over shards of 16)
    parts = [_raw(f"{base}/wds/", rank=r, world_size=3) for r in range(3)]
    assert [len(p) for p in parts] == [20, 20, 20]
    assert sorted(x for p in parts for x in p) == sorted(local_samples)
    # decoded samples too
    decoded = list(open_dataset(f"{base}/wds/", shuffle=False, image_size=8))
    local = list(open_dataset(packed_wds, shuffle=False, image_size=8))
    assert all(a[1] == b[1] and a[0].equal(b[0]) for a, b in zip(decoded, local)) and len(decoded) == 60


def test_range_answered_or_not(nginx_server, simple_http_server, packed_wds):
    off = read_index(packed_wds / "shard-000000.sfidx")[3]
    s, at = HttpLocation(f"{nginx_server}/wds/").open("shard-000000.tar", off, off + 512)
    with s:
        assert (s.ranged, at) == (True, off)
        assert s.read(512) == (packed_wds / "shard-000000.tar").read_bytes()[off:off + 512]
    s, at = HttpLocation(f"{simple_http_server}/wds/").open("shard-000000.tar", off)
    with s:
        assert (s.ranged, at) == (False, 0)


@pytest.mark.timeout(30)
def test_missing_files_name_the_url(nginx_server, packed_root, tmp_path, start_http_server):
    with pytest.raises(ManifestError, match=rf"{nginx_server}/nothing/manifest.json: not found"):
        open_dataset(f"{nginx_server}/nothing/", timeout_s=2, retries=1)
    # a shard missing on the server: refused at open, or a 404 naming it when not checked
    site = tmp_path / "site"
    shutil.copytree(packed_root / "wds", site / "wds")
    (site / "wds" / "shard-000002.tar").unlink()
    base = start_http_server(site)
    with pytest.raises(ManifestError, match=rf"{base}/wds/shard-000002.tar: listed in manifest.json but missing"):
        open_dataset(f"{base}/wds/", timeout_s=2, retries=1)
    ds = open_dataset(f"{base}/wds/", timeout_s=2, retries=1, check_files=False, shuffle=False)
    with pytest.raises(DataSourceError, match=rf"{base}/wds/shard-000002.tar: a file of this shard is missing "
                                              r"\(.*HTTP 404"):
        list(ds)


class _ClosingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the manifest and HEAD; for shard GETs sends the headers and 700 bytes, then hangs up
    (after ``stall_s`` seconds)."""

    stall_s = 0.0

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_GET(self):
        if not self.path.endswith(".tar"):
            return super().do_GET()
        self.answer_shard_get()
        self.close_connection = True

    def answer_shard_get(self):
        f = self.send_head()
        if f:
            with f:
                self.wfile.write(f.read(700))
            self.wfile.flush()
            time.sleep(self.stall_s)


class _HangUpHandler(_ClosingHandler):
    """Closes the connection without answering shard GETs."""

    def answer_shard_get(self):
        pass


class _StallHandler(_ClosingHandler):
    """Sends the headers and 700 bytes of a shard, then stalls (keeps the connection open)."""

    stall_s = 4.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("handler", [_ClosingHandler, _HangUpHandler, _StallHandler],
                         ids=["cut-body", "hang-up", "stall"])
def test_server_closing_the_connection(handler, packed_root, start_http_server):
    base = start_http_server(packed_root, handler)
    ds = open_dataset(f"{base}/wds/", timeout_s=0.5, retries=1, shuffle=False, decode=False)
    with pytest.raises(DataSourceError, match=rf"{base}/wds/shard-00000\d.tar"):
        list(ds)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(30)
def test_refused(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/data/"
    with pytest.raises(DataSourceError, match=rf"{url}manifest.json: GET failed after 2 attempts"):
        open_dataset(url, timeout_s=2, retries=1)


@pytest.fixture(scope="module")
def https_server(packed_root, tmp_path_factory):
    """``shardfeed serve``'s server behind TLS with a self-signed certificate for 127.0.0.1."""
    import ssl
    import subprocess
    import threading

    from shardfeed.convert.tools.serve import make_server

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    srv = make_server(packed_root)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    accepted = []  # one entry per TCP connection accepted (the TLS handshake runs in accept)
    real_accept = srv.socket.accept

    def counting_accept():
        accepted.append(1)
        return real_accept()

    srv.socket.accept = counting_accept
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"https://127.0.0.1:{srv.server_address[1]}", cert, accepted
    srv.shutdown()
    srv.server_close()


@pytest.mark.timeout(60)
def test_https_with_a_trusted_certificate_reads_the_original_files(https_server, tiny_folder_expected,
                                                                      monkeypatch):
    base, cert, _ = https_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    got = open_dataset(f"{base}/wds/", decode=False, shuffle=False)
    samples = list(got)
    assert sorted((s.meta["path"], s.data, s.label) for s in samples) == \
        sorted((p, d, y) for p, (d, y) in tiny_folder_expected.items())
    # two ranks split it over ranged reads
    parts = [[s.meta["path"] for s in open_dataset(f"{base}/wds/", decode=False, shuffle=False, rank=r,
                                                   world_size=2)] for r in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(tiny_folder_expected)


@pytest.mark.timeout(60)
def test_https_with_an_untrusted_certificate_says_so_without_retrying(https_server, monkeypatch, tmp_path):
    base, _, accepted = https_server
    empty = tmp_path / "no-ca.pem"
    empty.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(empty))  # trust nothing
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    before = len(accepted)
    with pytest.raises(DataSourceError, match=r"https://127\.0\.0\.1:\d+/wds/manifest\.json: the server's TLS "
                                              r"certificate is not trusted .*SSL_CERT_FILE"):
        open_dataset(f"{base}/wds/", retries=2)
    assert len(accepted) - before == 1  # one connection: not retried


@pytest.mark.timeout(60)
def test_many_shards_open_with_bounded_head_checks(packed_wds, tmp_path, start_http_server, tiny_folder_expected):
    """Opening a URL checks at most HEAD_CHECK_MAX_SHARDS shards up front; a shard missing on the
    server that was not checked is a DataSourceError naming it when read (skippable)."""
    from shardfeed.readers.storage import http_io

    d = tmp_path / "d"
    shutil.copytree(packed_wds, d)
    base = start_http_server(d)
    shards = sorted(p.name for p in d.glob("*.tar"))
    assert len(shards) >= 3
    missing = shards[1]
    (d / missing).unlink()
    with pytest.raises(ManifestError, match=missing):  # every shard checked: the gap is found at open
        open_dataset(f"{base}/")
    heads = []
    real = http_io._http_head_size

    def counting(url, *a, **k):
        heads.append(url)
        return real(url, *a, **k)

    try:
        http_io._http_head_size = counting
        loc = http_io.HttpLocation(f"{base}/")
        manifest = loc.load_manifest(check_files=False)
        loc.check_files(manifest, max_shards=2)  # first and last only: the missing middle one is not seen
        assert sorted(u.rsplit("/", 1)[1] for u in heads) == sorted(
            [shards[0], shards[-1], shards[0][:-4] + ".sfidx", shards[-1][:-4] + ".sfidx"])
    finally:
        http_io._http_head_size = real
    with pytest.raises(DataSourceError, match=rf"{missing}: a file of this shard is missing"):
        list(open_dataset(f"{base}/", decode=False, shuffle=False, check_files=False))
    ds = open_dataset(f"{base}/", decode=False, shuffle=False, check_files=False, on_error="skip")
    got = list(ds)
    n_missing = json.loads((d / "manifest.json").read_text())["shards"][1]["num_samples"]
    assert len(got) == len(tiny_folder_expected) - n_missing and ds.skipped == n_missing
    for s in got:
        assert s.data == tiny_folder_expected[s.meta["path"]][0]


class _ConnectProxy(http.server.BaseHTTPRequestHandler):
    """A CONNECT-only proxy (RFC 9110 9.3.6): relays bytes both ways; ``server.tunnels`` records
    each target."""

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_CONNECT(self):
        import select
        import socket

        host, _, port = self.path.rpartition(":")
        self.server.tunnels.append(self.path)
        upstream = socket.create_connection((host, int(port)), timeout=10)
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        peers = {self.connection: upstream, upstream: self.connection}
        try:
            while True:
                ready, _, _ = select.select(list(peers), [], [], 10)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            pass
        finally:
            upstream.close()


@pytest.mark.timeout(60)
def test_https_through_an_http_proxy_tunnel(https_server, tiny_folder_expected, monkeypatch):
    import threading

    base, cert, _ = https_server
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ConnectProxy)
    proxy.daemon_threads, proxy.tunnels = True, []
    threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        got = {s.meta["path"]: (s.data, s.label) for s in open_dataset(f"{base}/wds/", decode=False)}
        assert got == tiny_folder_expected
        assert proxy.tunnels and set(proxy.tunnels) == {base.split("://")[1]}
    finally:
        proxy.shutdown()
        proxy.server_close()
