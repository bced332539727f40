"""The object-store fault policy against real servers on 127.0.0.1: set-up errors (credentials,
region, endpoint) fail at once naming what to set; credentials that expire mid-epoch raise even
under ``on_error="skip"``; a listing that never ends is stopped naming the endpoint."""

from __future__ import annotations

import http.server
import logging
import re
import threading
import time
from pathlib import Path

import pytest

from .conftest import SECRET

pytestmark = pytest.mark.network


# ---------------------------------------------------------------------------------------------
# a small S3 server: GetObject / HeadObject of a local folder, turning to an error mid-epoch

class _S3Files(http.server.BaseHTTPRequestHandler):
    """Path-style S3 ``GET``/``HEAD /BUCKET/KEY`` (``Range`` answered) of the files under
    ``server.root``; after ``server.fail_after`` shard GETs every request is answered with
    ``server.fail`` = ``(status, code)`` as S3's XML error."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _error(self, status: int, code: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>injected</Message>'
                "<RequestId>1</RequestId></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        srv = self.server
        path = self.path.split("?", 1)[0]
        _, _, key = path.lstrip("/").partition("/")
        with srv.lock:
            if key.endswith(".tar") and self.command == "GET":
                srv.tar_gets += 1
            failing = srv.tar_gets > srv.fail_after
        if failing:
            return self._error(*srv.fail)
        f = srv.root / key
        if not key or not f.is_file():
            return self._error(404, "NoSuchKey")
        data = f.read_bytes()
        if key in srv.trickle and self.command == "GET":  # a byte every 0.3 s
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.3)
            except OSError:
                pass
            self.close_connection = True
            return
        start, stop = 0, len(data)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if m:
            start, stop = int(m.group(1)), min(len(data), int(m.group(2)) + 1 if m.group(2) else len(data))
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data[start:stop])


@pytest.fixture
def s3_files():
    """``start(root, fail_after, fail) -> endpoint`` of a :class:`_S3Files` server."""
    servers = []

    def start(root: Path, fail_after: int, fail: tuple[int, str], trickle: tuple[str, ...] = ()) -> str:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _S3Files)
        srv.daemon_threads = True
        srv.trickle = set(trickle)
        srv.handle_error = lambda request, address: None
        srv.root, srv.fail_after, srv.fail, srv.tar_gets, srv.lock = Path(root), fail_after, fail, 0, threading.Lock()
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("status,code", [(400, "ExpiredToken"), (403, "RequestTimeTooSkewed"),
                                         (403, "InvalidAccessKeyId"), (403, "SignatureDoesNotMatch"),
                                         (403, "AccessDenied"), (401, "Unauthorized")])
def test_credentials_failing_mid_epoch_raise_even_under_skip(status, code, s3_endpoint, s3_files, packed_root,
                                                             tiny_folder_expected):
    """The first shard is read, then every request is refused: ``on_error="skip"`` must not turn
    that into an epoch of skipped samples; the error names the URL and what to renew."""
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import StorageAccessError

    endpoint = s3_files(packed_root, 1, (status, code))
    ds = open_dataset("s3://bkt/wds/", decode=False, shuffle=False, on_error="skip", retries=2,
                      storage_options={"endpoint_url": endpoint})
    got = []
    with pytest.raises(StorageAccessError, match=r"s3://bkt/wds/shard-000001\.tar: .*(renew|clock|credentials)") as e:
        for s in ds:
            got.append((s.meta["path"], bytes(s.data), s.label))
    assert len(got) == 16  # the first shard, intact
    assert all(tiny_folder_expected[p] == (d, lbl) for p, d, lbl in got)
    assert SECRET not in str(e.value)


def test_a_damaged_shard_is_still_skipped(s3_endpoint, s3_files, packed_root, tmp_path, tiny_folder_expected):
    """What skip is for: a shard whose bytes are damaged loses its samples, the rest are read."""
    import shutil

    from shardfeed.readers import open_dataset

    shutil.copytree(packed_root / "wds", tmp_path / "wds")
    shard = tmp_path / "wds" / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[:512] = b"\xff" * 512  # the first header destroyed
    shard.write_bytes(bytes(data))
    endpoint = s3_files(tmp_path, 10 ** 6, (500, "InternalError"))
    ds = open_dataset("s3://bkt/wds/", decode=False, shuffle=False, on_error="skip", check_files=False,
                      storage_options={"endpoint_url": endpoint})
    got = {s.meta["path"]: (bytes(s.data), s.label) for s in ds}
    assert 0 < len(got) < len(tiny_folder_expected)
    assert all(tiny_folder_expected[p] == v for p, v in got.items())


# ---------------------------------------------------------------------------------------------
# set-up errors: at once, naming what to set

@pytest.mark.parametrize("options,env,expect", [
    ({"key": "AKIAONLYTHEKEY1"}, {}, r"incomplete AWS credentials.*aws_secret_access_key.*AWS_SECRET_ACCESS_KEY"),
    ({}, {"AWS_SECRET_ACCESS_KEY": None}, r"incomplete AWS credentials.*AWS_SECRET_ACCESS_KEY missing"),
    ({"region_name": "not a region!"}, {}, r"no usable region .*set AWS_REGION"),
    ({"endpoint_url": "127.0.0.1 9000"}, {}, r"unusable endpoint '127.0.0.1 9000'.*AWS_ENDPOINT_URL"),
])
def test_setup_errors_fail_at_once_naming_what_to_set(options, env, expect, s3_endpoint, monkeypatch, caplog):
    from shardfeed.readers.errors import StorageAccessError
    from shardfeed.readers.storage.objstore import StoreLocation

    for k, v in env.items():
        monkeypatch.delenv(k) if v is None else monkeypatch.setenv(k, v)
    loc = StoreLocation("s3://data/wds/", storage_options=options, retries=3)
    with caplog.at_level(logging.DEBUG, logger="shardfeed"), pytest.raises(StorageAccessError, match=expect) as e:
        loc.read_bytes("manifest.json")
    assert "attempt" not in caplog.text and "attempts" not in str(e.value)  # not retried
    assert "s3://data/wds/" in str(e.value) and SECRET not in str(e.value)


def test_cli_names_missing_secret_key_once(s3_packed, monkeypatch):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "AWS_SECRET_ACCESS_KEY"}
    r = subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "inspect", s3_packed[0]],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "AWS_SECRET_ACCESS_KEY" in r.stderr and "attempts" not in r.stderr


# ---------------------------------------------------------------------------------------------
# a listing that never ends

class _EndlessListing(http.server.BaseHTTPRequestHandler):
    """Speaks enough ListObjectsV2 to misbehave: every page holds one new key and says
    ``IsTruncated``; ``server.mode`` picks the continuation token: ``"same"`` (always ``tok``),
    ``"new"`` (a new one each page) or ``"none"`` (no token). ``"twice"``: two pages, one key, the
    last not truncated; ``"outside"``: one page, a key outside the prefix. Object GETs are 404 NoSuchKey."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        srv = self.server
        if "list-type=2" not in self.path:
            return self._send(404, b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code>'
                                   b"<Message>none</Message></Error>")
        with srv.lock:
            srv.pages += 1
            n = srv.pages
        token = {"same": "<NextContinuationToken>tok</NextContinuationToken>", "none": "", "outside": "",
                 }.get(srv.mode, f"<NextContinuationToken>tok-{n}</NextContinuationToken>")
        truncated = "false" if srv.mode == "outside" or (srv.mode == "twice" and n == 2) else "true"
        key = {"twice": "x/cls/img-000000001.jpg", "outside": "y/cls/img.jpg"}.get(srv.mode, f"x/cls/img-{n:09d}.jpg")
        body = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
                f'2006-03-01/"><Name>bkt</Name><Prefix>x/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>'
                f"<IsTruncated>{truncated}</IsTruncated>{token}<Contents><Key>{key}</Key>"
                "<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag><Size>3</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>").encode()
        self._send(200, body)


@pytest.fixture
def endless_listing():
    servers = []

    def start(mode: str):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EndlessListing)
        srv.daemon_threads = True
        srv.mode, srv.pages, srv.lock = mode, 0, threading.Lock()
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        start.server = srv
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,pages,expect", [
    ("same", 2, r"repeats a continuation token after 2 pages \(2 keys\)"),
    ("none", 1, r"says it is truncated after 1 pages \(1 keys\) but gives no continuation token"),
    ("new", 7, r"is still truncated after 7 pages \(7 keys\)"),
])
def test_a_listing_that_never_ends_is_stopped_naming_the_endpoint(mode, pages, expect, endless_listing, s3_endpoint,
                                                                  monkeypatch):
    from shardfeed.readers.storage import objstore
    from shardfeed.readers.errors import DataSourceError

    monkeypatch.setattr(objstore, "MAX_LIST_PAGES", 7)
    endpoint = endless_listing(mode)
    loc = objstore.StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": endpoint})
    with pytest.raises(DataSourceError, match=rf"s3://bkt/x/: the listing from {endpoint} {expect}"):
        loc.list_objects()
    assert endless_listing.server.pages == pages


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,expect", [
    ("twice", r"lists s3://bkt/x/cls/img-000000001.jpg twice"),
    ("outside", r"holds the key 'y/cls/img.jpg', not below 'x/'"),
])
def test_a_listing_with_a_key_twice_or_outside_the_prefix_is_refused(mode, expect, endless_listing, s3_endpoint):
    """Such a key would be packed twice, or packed under a name of the prefix it is not in."""
    from shardfeed.readers.storage import objstore
    from shardfeed.readers.errors import DataSourceError

    endpoint = endless_listing(mode)
    loc = objstore.StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": endpoint})
    with pytest.raises(DataSourceError, match=rf"s3://bkt/x/: the listing from {endpoint} {expect}"):
        loc.list_objects()


@pytest.mark.timeout(60)
def test_a_listing_past_the_key_bound_is_stopped(endless_listing, s3_endpoint, monkeypatch):
    from shardfeed.readers.storage import objstore
    from shardfeed.readers.errors import DataSourceError

    monkeypatch.setattr(objstore, "MAX_LIST_KEYS", 5)
    endpoint = endless_listing("new")
    with pytest.raises(DataSourceError, match=rf"listing from {endpoint} passed 5 keys after 6 pages"):
        objstore.StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": endpoint}).list_objects()


@pytest.mark.timeout(60)
def test_inspect_of_a_prefix_whose_listing_repeats_ends_with_one_line(endless_listing, s3_endpoint):
    import subprocess
    import sys

    endpoint = endless_listing("same")
    r = subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "inspect", "s3://bkt/x/",
                        "--storage-option", f"endpoint_url={endpoint}"], capture_output=True, text=True, timeout=50)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"the listing from {endpoint} repeats a continuation token" in r.stderr
    assert endless_listing.server.pages == 2


# ---------------------------------------------------------------------------------------------
# whole-object reads: Content-Encoding decoded, sizes capped; encoded shards refused

def test_a_gzip_encoded_manifest_in_a_bucket_is_decoded(s3_client, s3_bucket, packed_wds, tiny_folder_expected):
    import gzip

    from shardfeed.readers import open_dataset

    bucket = s3_bucket("encoded")
    for p in packed_wds.iterdir():
        if p.name == "manifest.json":
            s3_client.put_object(Bucket=bucket, Key="ok/" + p.name, Body=gzip.compress(p.read_bytes()),
                                 ContentEncoding="gzip", ContentType="application/json")
        else:
            s3_client.put_object(Bucket=bucket, Key="ok/" + p.name, Body=p.read_bytes())
    ds = open_dataset(f"s3://{bucket}/ok/", decode=False, shuffle=False)
    assert {s.meta["path"]: (bytes(s.data), s.label) for s in ds} == tiny_folder_expected


def test_a_shard_stored_with_content_encoding_is_refused_naming_it(s3_client, s3_bucket, packed_wds):
    import gzip

    from shardfeed.readers.errors import DataSourceError
    from shardfeed.readers.storage.objstore import StoreLocation

    bucket = s3_bucket("encoded-shard")
    data = (packed_wds / "shard-000000.tar").read_bytes()
    s3_client.put_object(Bucket=bucket, Key="x/shard-000000.tar", Body=gzip.compress(data), ContentEncoding="gzip")
    with pytest.raises(DataSourceError, match=r"s3://encoded-shard/x/shard-000000.tar: the object is stored with "
                                              r"Content-Encoding: gzip"):
        StoreLocation(f"s3://{bucket}/x/").open("shard-000000.tar", 512, 4096)


def test_a_manifest_object_over_the_cap_is_refused(s3_client, s3_bucket, monkeypatch):
    from shardfeed.readers.storage import objstore
    from shardfeed.readers.errors import DataSourceError

    monkeypatch.setattr(objstore, "MAX_MANIFEST_BYTES", 1000)  # the rule with a small cap
    bucket = s3_bucket("big-manifest")
    s3_client.put_object(Bucket=bucket, Key="m/manifest.json", Body=b" " * 1001)
    with pytest.raises(DataSourceError, match=r"s3://big-manifest/m/manifest.json: the manifest is 1,001 bytes, "
                                              r"more than the 1,000 accepted"):
        objstore.StoreLocation(f"s3://{bucket}/m/").load_manifest()


@pytest.mark.timeout(60)
def test_a_trickling_manifest_ends_at_the_deadline(s3_endpoint, s3_files, packed_root):
    """A byte every 0.3 s never trips the per-read timeout; the deadline ends the read."""
    from shardfeed.readers.errors import DataSourceError
    from shardfeed.readers.storage.objstore import StoreLocation

    endpoint = s3_files(packed_root, 10 ** 6, (500, "InternalError"), trickle=("wds/manifest.json",))
    loc = StoreLocation("s3://bkt/wds/", storage_options={"endpoint_url": endpoint}, deadline_s=1.5, retries=2)
    with pytest.raises(DataSourceError, match=r"s3://bkt/wds/manifest.json: no complete answer within 1.5 s"):
        loc.load_manifest()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["same", "none"])
def test_a_listing_error_names_the_endpoint_option_in_the_callers_spelling(mode, endless_listing, s3_endpoint,
                                                                           monkeypatch):
    """Through the API the fix is ``storage_options={'endpoint_url': ...}``; on the command line it is
    ``--storage-option endpoint_url=...``: each caller is told the spelling it can type."""
    from shardfeed.readers.storage import objstore, store_urls
    from shardfeed.readers.errors import DataSourceError

    endpoint = endless_listing(mode)
    monkeypatch.setitem(store_urls._SPELLING, "cli", False)
    with pytest.raises(DataSourceError) as api:
        objstore.StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": endpoint}).list_objects()
    assert "storage_options={'endpoint_url': ...}" in str(api.value)
    assert "--storage-option" not in str(api.value)
    monkeypatch.setitem(store_urls._SPELLING, "cli", True)
    with pytest.raises(DataSourceError) as cli:
        objstore.StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": endpoint}).list_objects()
    assert "--storage-option endpoint_url=..." in str(cli.value)
    assert "storage_options=" not in str(cli.value)


@pytest.mark.parametrize("error_name,api_hint,cli_hint", [
    ("NoCredentialsError", "storage_options={'anon': True}", "--storage-option anon=true"),
    ("PartialCredentialsError", "storage_options={'key': ..., 'secret': ...}",
     "--storage-option key=... --storage-option secret=..."),
    ("ProfileNotFound", "storage_options={'profile': ...}", "--storage-option profile=..."),
    ("NoRegionError", "storage_options={'region_name': ...}", "--storage-option region_name=..."),
    ("EndpointConnectionError", "storage_options={'endpoint_url': ...}", "--storage-option endpoint_url=..."),
])
def test_a_set_up_error_names_the_option_in_the_callers_spelling(error_name, api_hint, cli_hint, monkeypatch):
    """Credentials, profile, region and endpoint faults: the fix is spelled as the caller types it."""
    from shardfeed.readers.storage import objstore, store_urls

    # botocore's exception classes are matched by name; a class of that name stands in for each
    fault = type(error_name, (Exception,), {})("could not connect to the endpoint URL")
    loc = objstore.StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": "http://127.0.0.1:9"})
    monkeypatch.setitem(store_urls._SPELLING, "cli", False)
    api = str(loc._config_error(fault, "s3://bkt/x/"))
    assert api_hint in api and "--storage-option" not in api
    monkeypatch.setitem(store_urls._SPELLING, "cli", True)
    cli = str(loc._config_error(fault, "s3://bkt/x/"))
    assert cli_hint in cli and "storage_options=" not in cli
