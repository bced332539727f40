"""HTTP redirects against real servers on 127.0.0.1: a front server answers
every request (manifest, HEAD, ranged GETs) with a redirect to the server holding the files; the
samples read through it are the original files. Redirects that cannot be followed fail naming the
URL and the status, never read as an empty manifest."""

from __future__ import annotations

import http.server

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import DataSourceError
from shardfeed.readers.format.offset_index import read_index
from shardfeed.readers.storage.http_io import MAX_REDIRECTS, HttpLocation

pytestmark = pytest.mark.network


def _redirector(target: str, status: int = 302, relative_hop: bool = True):
    """A handler that redirects ``/old/NAME`` to ``/mid/NAME`` (a relative Location, when
    ``relative_hop``) and ``/mid/NAME`` to ``TARGET/wds/NAME`` (absolute): two hops per request."""

    class Redirect(http.server.SimpleHTTPRequestHandler):
        requests: list[tuple[str, str, str | None]] = []

        def log_message(self, format, *args):  # noqa: A002
            pass

        def _answer(self):
            Redirect.requests.append((self.command, self.path, self.headers.get("Range")))
            name = self.path.rsplit("/", 1)[1]
            if self.path.startswith("/old/"):
                loc = f"/mid/{name}" if relative_hop else f"http://{self.headers['Host']}/mid/{name}"
            elif self.path.startswith("/mid/"):
                loc = f"{target}/wds/{name}"
            elif self.path.startswith("/loop/"):
                loc = self.path
            elif self.path.startswith("/nolocation/"):
                loc = None
            else:
                self.send_error(404)
                return
            self.send_response(status)
            if loc:
                self.send_header("Location", loc)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _answer

    return Redirect


def _raw(source, **kw):
    return [(s.key, s.data, s.label, s.meta["path"]) for s in open_dataset(source, decode=False, shuffle=False, **kw)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirected_dataset_reads_the_original_files(status, nginx_server, packed_wds, tiny_folder_expected,
                                                     start_http_server, tmp_path):
    handler = _redirector(nginx_server, status)
    front = start_http_server(tmp_path, handler)
    got = _raw(f"{front}/old/")
    assert sorted((p, d, y) for _, d, y, p in got) == sorted((p, d, y) for p, (d, y) in tiny_folder_expected.items())
    # the manifest, the HEAD checks and the shard GETs all went through the redirects
    methods = {(m, path.rsplit("/", 1)[1].rsplit(".", 1)[-1]) for m, path, _ in handler.requests}
    assert {("GET", "json"), ("HEAD", "tar"), ("GET", "tar")} <= methods
    # ranged reads keep their Range header over both hops, and nginx answers it
    off = read_index(packed_wds / "shard-000000.sfidx")[3]
    handler.requests.clear()
    s, at = HttpLocation(f"{front}/old/").open("shard-000000.tar", off, off + 512)
    with s:
        assert (s.ranged, at) == (True, off)
        assert s.read(512) == (packed_wds / "shard-000000.tar").read_bytes()[off:off + 512]
    assert [r for _, _, r in handler.requests] == [f"bytes={off}-{off + 511}"] * 2
    # ranks split the dataset by ranged reads through the redirects
    parts = [_raw(f"{front}/old/", rank=r, world_size=3) for r in range(3)]
    assert sorted(x for p in parts for x in p) == sorted(got)


@pytest.mark.timeout(30)
def test_redirect_to_a_server_ignoring_range(simple_http_server, tiny_folder_expected, start_http_server, tmp_path):
    front = start_http_server(tmp_path, _redirector(simple_http_server, 302, relative_hop=False))
    parts = [_raw(f"{front}/old/", rank=r, world_size=2) for r in range(2)]
    assert sorted(p for part in parts for *_, p in part) == sorted(tiny_folder_expected)


@pytest.mark.timeout(30)
def test_redirects_that_cannot_be_followed_name_the_url_and_status(start_http_server, tmp_path):
    front = start_http_server(tmp_path, _redirector("http://127.0.0.1:9", 302))
    with pytest.raises(DataSourceError, match=rf"{front}/loop/manifest.json: more than {MAX_REDIRECTS} redirects "
                                              r"\(HTTP 302 Found"):
        open_dataset(f"{front}/loop/", timeout_s=2, retries=1)
    with pytest.raises(DataSourceError, match=rf"{front}/nolocation/manifest.json: HTTP 302 Found without a "
                                              "Location header"):
        open_dataset(f"{front}/nolocation/", timeout_s=2, retries=1)
    front300 = start_http_server(tmp_path, _redirector("http://127.0.0.1:9", 300))
    with pytest.raises(DataSourceError, match=rf"{front300}/old/manifest.json: HTTP 300 Multiple Choices"):
        open_dataset(f"{front300}/old/", timeout_s=2, retries=1)
