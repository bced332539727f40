"""HTTP retries against real servers on 127.0.0.1 that fail once (or twice) and then answer.

The README's promise (readers/storage/http_io.py): connection errors, 5xx answers and bodies cut short
are retried ``retries`` times, resuming at the byte where the failure happened; 4xx answers are
not retried. Every test counts the requests the server saw and the ``Range`` header each one
carried, and compares the bytes read with the file on disk; nothing is timed.

Two servers: :class:`_RangeServer` answers ``Range`` (206 + ``Content-Range``) and
:class:`_PlainServer` ignores it (Python's ``http.server``: 200, the whole file), so a resumed
read must skip what it already has.
"""

from __future__ import annotations

import http.server
import re
import threading

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import DataSourceError
from shardfeed.readers.format.offset_index import read_index
from shardfeed.readers.storage.http_io import HttpLocation, HttpRangeStream, http_get

pytestmark = pytest.mark.network

SHARD = "wds/shard-000000.tar"


class _PlainServer(http.server.SimpleHTTPRequestHandler):
    """Python's file server (ignores ``Range``) that records every request and can misbehave.

    Class attributes (set on a fresh subclass per test, see :func:`_server`):

    ``cuts``: ``{url_path: [file_offset, ...]}``: the next GET of that path sends the headers of
    a full answer, then the body only up to ``file_offset`` (absolute position in the file), and
    hangs up. One entry is used per request.
    ``statuses``: ``{url_path: [status, ...]}``: the next request of that path is answered with
    that status (no body). One entry per request.
    ``log``: ``[(method, path, range_header_or_None), ...]``, appended for every request.
    """

    cuts: dict = {}
    statuses: dict = {}
    log: list = []
    lock = threading.Lock()

    def log_message(self, format, *args):  # noqa: A002
        pass

    def _record(self) -> tuple[int | None, int | None]:
        with self.lock:
            self.log.append((self.command, self.path, self.headers.get("Range")))
            status = self.statuses.get(self.path, []).pop(0) if self.statuses.get(self.path) else None
            cut = self.cuts.get(self.path, []).pop(0) if self.cuts.get(self.path) and self.command == "GET" else None
        return status, cut

    def do_HEAD(self):
        status, _ = self._record()
        if status:
            return self._fail(status)
        super().do_HEAD()

    def do_GET(self):
        status, cut = self._record()
        if status:
            return self._fail(status)
        path = self.translate_path(self.path)
        try:
            with open(path, "rb") as f:
                body = f.read()
        except OSError:
            return self.send_error(404)
        start, stop = self._span(len(body))
        self.send_response(206 if (start, stop) != (0, len(body)) or self._ranged() else 200)
        if self._ranged():
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(body)}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        if cut is not None:
            assert start <= cut < stop, (start, cut, stop)
            self.wfile.write(body[start:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body[start:stop])

    def _ranged(self) -> bool:
        return False

    def _span(self, size: int) -> tuple[int, int]:
        return 0, size

    def _fail(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.close_connection = True


class _RangeServer(_PlainServer):
    """The same, answering ``Range: bytes=A-`` and ``bytes=A-B`` with 206 (RFC 9110)."""

    def _ranged(self) -> bool:
        return self.headers.get("Range") is not None

    def _span(self, size: int) -> tuple[int, int]:
        rng = self.headers.get("Range")
        if rng is None:
            return 0, size
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
        assert m, rng
        return int(m.group(1)), (int(m.group(2)) + 1 if m.group(2) else size)


@pytest.fixture
def server(packed_root, start_http_server):
    """``server(kind, cuts=..., statuses=...) -> (base_url, log)`` for a fresh misbehaving server."""

    def make(kind: str, *, cuts=None, statuses=None):
        base_cls = {"range": _RangeServer, "plain": _PlainServer}[kind]
        log: list = []
        cls = type(f"{base_cls.__name__}Once", (base_cls,), {
            "cuts": {f"/{k}": list(v) for k, v in (cuts or {}).items()},
            "statuses": {f"/{k}": list(v) for k, v in (statuses or {}).items()},
            "log": log, "lock": threading.Lock()})
        return start_http_server(packed_root, cls), log

    return make


def _gets(log, path=SHARD):
    """The ``Range`` headers of the GETs of ``path``, in order."""
    return [rng for method, p, rng in log if method == "GET" and p == f"/{path}"]


def _read_all(stream, chunk: int) -> bytes:
    out = []
    while True:
        b = stream.read(chunk)
        if not b:
            return b"".join(out)
        out.append(b)


# ---------------------------------------------------------------------------------------------
# a body cut short mid-stream, resumed at the exact byte


@pytest.mark.parametrize("kind", ["range", "plain"])
def test_cut_body_resumes_at_the_failed_byte_from_the_start(kind, server, packed_root):
    source = (packed_root / SHARD).read_bytes()
    cut1, cut2 = 700, len(source) // 2 + 3  # two cuts: every resume must be exact
    base, log = server(kind, cuts={SHARD: [cut1, cut2]})
    with HttpRangeStream(f"{base}/{SHARD}", retries=2) as s:
        got = _read_all(s, 512)
    assert got == source
    # the first GET asks for the whole file; each retry asks from the first byte not yet received
    assert _gets(log) == [None, f"bytes={cut1}-", f"bytes={cut2}-"]


@pytest.mark.parametrize("kind", ["range", "plain"])
def test_cut_body_of_a_range_resumes_at_the_failed_byte(kind, server, packed_root, packed_wds):
    source = (packed_root / SHARD).read_bytes()
    offsets = read_index(packed_wds / "shard-000000.sfidx")
    start, end = offsets[3], offsets[11]  # samples 3..10, as a worker's sub-range reads them
    cut = start + (end - start) // 3 + 1
    base, log = server(kind, cuts={SHARD: [cut]})
    stream, at = HttpLocation(f"{base}/wds/", retries=1).open("shard-000000.tar", start, end)
    with stream:
        got = _read_all(stream, 1000)
    if kind == "range":
        assert at == start and got == source[start:end]
    else:  # the server ignores Range: the stream starts at byte 0, the caller skips to ``start``
        assert at == 0 and got == source
    assert _gets(log) == [f"bytes={start}-{end - 1}", f"bytes={cut}-{end - 1}"]


@pytest.mark.parametrize("kind", ["range", "plain"])
def test_dataset_read_over_a_cut_connection_gives_the_original_samples(kind, server, packed_root,
                                                                      tiny_folder_expected):
    sizes = {f"wds/shard-00000{i}.tar": (packed_root / f"wds/shard-00000{i}.tar").stat().st_size for i in range(4)}
    cuts = {name: [size // 2] for name, size in sizes.items()}  # every shard's first GET is cut halfway
    base, log = server(kind, cuts=cuts)
    samples = list(open_dataset(f"{base}/wds/", decode=False, shuffle=False, retries=1))
    assert sorted((s.meta["path"], s.data, s.label) for s in samples) == \
        sorted((p, d, y) for p, (d, y) in tiny_folder_expected.items())
    for name, size in sizes.items():
        assert _gets(log, name) == [None, f"bytes={size // 2}-"], name


def test_a_body_cut_at_the_same_byte_on_every_attempt_fails_after_the_retries(server, packed_root):
    """Each read gets ``retries`` retries for the byte it is at (a retry that makes progress starts
    a new count); a server that never gets past byte 100 ends in an error naming URL and byte."""
    base, log = server("range", cuts={SHARD: [100, 100, 100, 100]})
    with pytest.raises(DataSourceError, match=rf"{base}/{SHARD}: reading at byte 100 failed after 3 attempts"):
        with HttpRangeStream(f"{base}/{SHARD}", retries=2) as s:
            _read_all(s, 64)
    assert _gets(log) == [None, "bytes=100-", "bytes=100-"]


# ---------------------------------------------------------------------------------------------
# status codes: 5xx retried, 4xx not


@pytest.mark.parametrize("status", [403, 401, 410])
def test_a_4xx_answer_is_not_retried(status, server):
    base, log = server("range", statuses={"wds/manifest.json": [status] * 3, SHARD: [status] * 3})
    with pytest.raises(DataSourceError, match=rf"{base}/wds/manifest.json: HTTP {status}"):
        http_get(f"{base}/wds/manifest.json", retries=2)
    assert _gets(log, "wds/manifest.json") == [None]  # exactly one request
    with pytest.raises(DataSourceError, match=rf"{base}/{SHARD}: HTTP {status}"):
        HttpRangeStream(f"{base}/{SHARD}", 512, retries=2)
    assert _gets(log) == ["bytes=512-"]


def test_a_403_on_the_manifest_ends_open_dataset_after_one_request(server):
    base, log = server("range", statuses={"wds/manifest.json": [403] * 3})
    with pytest.raises(DataSourceError, match=rf"{base}/wds/manifest.json: HTTP 403"):
        open_dataset(f"{base}/wds/", retries=2)
    assert log == [("GET", "/wds/manifest.json", None)]


@pytest.mark.parametrize("kind", ["range", "plain"])
def test_a_503_then_200_succeeds_after_one_retry(kind, server, packed_root, tiny_folder_expected):
    source = (packed_root / SHARD).read_bytes()
    base, log = server(kind, statuses={SHARD: [503], "wds/manifest.json": [503]})
    assert http_get(f"{base}/wds/manifest.json", retries=2) == (packed_root / "wds/manifest.json").read_bytes()
    assert _gets(log, "wds/manifest.json") == [None, None]
    with HttpRangeStream(f"{base}/{SHARD}", 100, retries=2) as s:
        got = _read_all(s, 4096)
    assert got == (source[100:] if kind == "range" else source)
    assert _gets(log) == ["bytes=100-", "bytes=100-"]  # one retry, same range


def test_a_503_then_200_through_open_dataset(server, packed_root, tiny_folder_expected):
    shards = [f"wds/shard-00000{i}.tar" for i in range(4)]
    base, log = server("range", statuses={"wds/manifest.json": [503], **{s: [503] for s in shards}})
    samples = list(open_dataset(f"{base}/wds/", decode=False, shuffle=False, retries=1, check_files=False))
    assert sorted((s.meta["path"], s.data, s.label) for s in samples) == \
        sorted((p, d, y) for p, (d, y) in tiny_folder_expected.items())
    assert _gets(log, "wds/manifest.json") == [None, None]
    for name in shards:
        assert len(_gets(log, name)) == 2, name  # the 503, then the answer


def test_503_on_every_attempt_fails_after_exactly_retries_plus_one_requests(server):
    base, log = server("range", statuses={"wds/manifest.json": [503] * 5})
    with pytest.raises(DataSourceError, match=rf"{base}/wds/manifest.json: GET failed after 3 attempts "
                                              r"\(HTTP 503"):
        http_get(f"{base}/wds/manifest.json", retries=2)
    assert len(_gets(log, "wds/manifest.json")) == 3


# ---------------------------------------------------------------------------------------------
# the rest of the stream's and the location's contract (mutants of http_io.py survived these gaps)


@pytest.mark.parametrize("kind", ["range", "plain"])
def test_read_sizes_and_total_bytes(kind, server, packed_root):
    source = (packed_root / SHARD).read_bytes()
    base, log = server(kind, cuts={SHARD: [len(source) // 3]})
    with HttpRangeStream(f"{base}/{SHARD}", retries=1) as s:
        assert s.total_bytes == len(source) and s.offset == 0
        assert s.read(0) == b""
        assert s.read(10) == source[:10]
        assert s.read() + s.read(-1) == source[10:]  # read() to the end, across the cut
        assert s.read(5) == b"" and s.offset == len(source)
    # the bytes before the cut are handed out (IncompleteRead's partial body), then the next read
    # resumes at the exact byte
    assert _gets(log) == [None, f"bytes={len(source) // 3}-"]
    with HttpRangeStream(f"{base}/{SHARD}", 100, 200, retries=1) as s:
        assert s.total_bytes == len(source)
        assert (s.offset, s.ranged) == ((100, True) if kind == "range" else (0, False))


def test_location_open_defaults_to_the_whole_file(server, packed_root):
    source = (packed_root / SHARD).read_bytes()
    base, log = server("range")
    stream, at = HttpLocation(f"{base}/wds/").open("shard-000000.tar")
    with stream:
        assert at == 0 and _read_all(stream, 1 << 16) == source
    assert _gets(log) == [None]


@pytest.mark.parametrize("timeout_s,retries,ok", [(0.5, 0, True), (0, 1, False), (1, -1, False)])
def test_location_options_are_checked(timeout_s, retries, ok):
    if ok:
        loc = HttpLocation("http://127.0.0.1:1/d/", timeout_s=timeout_s, retries=retries)
        assert (loc.timeout_s, loc.retries) == (timeout_s, retries)
    else:
        with pytest.raises(ValueError, match="timeout_s must be > 0 and retries >= 0"):
            HttpLocation("http://127.0.0.1:1/d/", timeout_s=timeout_s, retries=retries)


def test_a_shard_of_another_size_on_the_server_is_refused_at_open(packed_root, tmp_path, start_http_server):
    from shardfeed.readers.errors import ManifestError

    site = tmp_path / "site"
    import shutil

    shutil.copytree(packed_root / "wds", site / "wds")
    shard = site / "wds" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])  # one block pair short: truncated on the server
    base = start_http_server(site)
    with pytest.raises(ManifestError, match=rf"{base}/wds/shard-000001.tar: \d+ bytes on the server but \d+ in "
                                            r"manifest.json"):
        open_dataset(f"{base}/wds/", retries=0)


class _ChunkedServer(http.server.SimpleHTTPRequestHandler):
    """Answers GET with ``Transfer-Encoding: chunked`` and no ``Content-Length`` (as servers that
    compress or generate on the fly do), 1000 bytes a chunk; ignores ``Range``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_GET(self):
        try:
            with open(self.translate_path(self.path), "rb") as f:
                body = f.read()
        except OSError:
            return self.send_error(404)
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(0, len(body), 1000):
            part = body[i:i + 1000]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


def test_a_server_without_content_length(packed_root, start_http_server):
    source = (packed_root / SHARD).read_bytes()
    base = start_http_server(packed_root, _ChunkedServer)
    assert http_get(f"{base}/wds/manifest.json") == (packed_root / "wds/manifest.json").read_bytes()
    with HttpRangeStream(f"{base}/{SHARD}", 700) as s:
        assert (s.offset, s.ranged, s.total_bytes) == (0, False, None)  # no size announced
        assert _read_all(s, 4096) == source
