"""Object stores against a real S3-API server on 127.0.0.1 (moto's standalone server,
started once for the session by ``conftest.py``): readers identical to local for several ranks and
real DataLoader workers, a folder in a bucket, pack to a bucket byte-identical to a local pack,
resume after ``kill -9``, the fault policy (403, 404, missing bucket, expired credentials,
throttling, a stalled server, a wrong endpoint) and credentials absent from every message."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ACCESS_KEY, SECRET

pytestmark = pytest.mark.network

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]
HOOKED = Path(__file__).resolve().parents[1] / "hooked_cli.py"


def _cli(*args, **kw):
    return subprocess.run([*SHARDFEED, *map(str, args)], capture_output=True, text=True, **kw)


def _samples(loader) -> list[tuple[str, bytes, int]]:
    return [(s.meta["path"], bytes(s.data), s.label) for batch in loader for s in batch]


def _download(client, bucket: str, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix):]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


# ---------------------------------------------------------------------------------------------
# readers

@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [1, 3])
def test_loader_from_bucket_equals_local_for_ranks_and_workers(s3_packed, packed_wds, tiny_folder_expected,
                                                               world_size):
    from shardfeed.readers import make_loader

    url, _ = s3_packed
    union = []
    for rank in range(world_size):
        opts = dict(batch_size=5, num_workers=2, decode=False, seed=3, rank=rank, world_size=world_size,
                    pad=False, collate_fn=list)
        local = _samples(make_loader(str(packed_wds), **opts))
        remote = _samples(make_loader(url, **opts))
        assert remote == local  # the same samples in the same order: the same epoch split
        union += remote
    assert len(union) == len(tiny_folder_expected) // world_size * world_size
    for path, data, label in union:
        assert tiny_folder_expected[path] == (data, label)


def test_open_dataset_manifest_url_and_storage_options(s3_packed, s3_endpoint, tiny_folder_expected):
    from shardfeed.readers import open_dataset

    url, _ = s3_packed
    ds = open_dataset(url + "manifest.json", decode=False, shuffle=False,
                      storage_options={"endpoint_url": s3_endpoint, "region_name": "us-east-1"})
    got = {s.meta["path"]: (bytes(s.data), s.label) for s in ds}
    assert got == tiny_folder_expected


@pytest.mark.multiprocess
def test_image_folder_in_a_bucket_reads_like_the_local_folder(s3_packed, tiny_image_folder, tiny_folder_expected):
    from shardfeed.readers import make_loader, open_dataset

    _, folder = s3_packed
    ds = open_dataset(folder, decode=False)
    assert [ds.rel_path(i) for i in range(len(ds))] == sorted(tiny_folder_expected)  # ImageFolder order
    opts = dict(batch_size=7, num_workers=2, decode=False, seed=1, collate_fn=list)
    remote = _samples(make_loader(folder, **opts))
    assert remote == _samples(make_loader(str(tiny_image_folder), **opts))
    assert {p: (d, lbl) for p, d, lbl in remote} == tiny_folder_expected
    images, labels = next(iter(make_loader(folder, batch_size=4, num_workers=0, image_size=16)))
    assert tuple(images.shape) == (4, 3, 16, 16) and str(images.dtype) == "torch.uint8"


def test_lmdb_in_a_bucket_is_refused_pointing_to_stage(s3_client, s3_bucket, packed_root):
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import UnsupportedURLError

    if not (packed_root / "lmdb").exists():
        pytest.skip("no LMDB packer")
    bucket = s3_bucket("lmdb")
    for p in (packed_root / "lmdb").iterdir():
        s3_client.put_object(Bucket=bucket, Key="db/" + p.name, Body=p.read_bytes())
    with pytest.raises(UnsupportedURLError, match=r"s3://lmdb/db/.*shardfeed stage"):
        open_dataset("s3://lmdb/db/")


def test_unsupported_schemes_are_refused_naming_the_url():
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import UnsupportedURLError

    with pytest.raises(UnsupportedURLError, match=r"gs://b/x: gs:// is not supported.*AWS_ENDPOINT_URL"):
        open_dataset("gs://b/x")
    with pytest.raises(UnsupportedURLError, match=r"hdfs://h/x: hdfs:// URLs are not supported"):
        open_dataset("hdfs://h/x")


# ---------------------------------------------------------------------------------------------
# the fault policy; credentials never shown

def _no_secret(text: str) -> None:
    assert SECRET not in text


def test_missing_object_and_missing_bucket(s3_packed):
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import DataSourceError, ManifestError
    from shardfeed.readers.storage.objstore import StoreLocation

    with pytest.raises(ManifestError, match=r"s3://data/nothing-here/x.json: not found") as e1:
        open_dataset("s3://data/nothing-here/x.json")
    with pytest.raises(FileNotFoundError, match=r"s3://data/wds/nope.tar: not found in the bucket \(HTTP 404"):
        StoreLocation("s3://data/wds/").read_bytes("nope.tar")
    with pytest.raises(DataSourceError, match=r"bucket 'no-such-bucket' does not exist at http://127.0.0.1") as e2:
        open_dataset("s3://no-such-bucket/wds/")
    for e in (e1, e2):
        _no_secret(str(e.value))


@pytest.mark.parametrize("status,code,expect", [
    (403, "AccessDenied", r"access denied \(HTTP 403 AccessDenied\); check the credentials"),
    (400, "ExpiredToken", r"the credentials have expired \(HTTP 400 ExpiredToken\)"),
    (403, "InvalidAccessKeyId", r"the store rejects the credentials"),
])
def test_permanent_errors_are_immediate_and_named(error_server, status, code, expect):
    from shardfeed.readers.storage.objstore import StoreLocation

    endpoint = error_server(status, code)
    loc = StoreLocation("s3://bkt/data/", storage_options={"endpoint_url": endpoint}, retries=3, timeout_s=5)
    with pytest.raises(Exception, match=expect) as e:
        loc.read_bytes("manifest.json")
    assert "s3://bkt/data/manifest.json" in str(e.value)
    assert error_server.server.hits == 1  # not retried
    _no_secret(str(e.value))


def test_throttling_is_retried_then_named(error_server):
    from shardfeed.readers.errors import DataSourceError
    from shardfeed.readers.storage.objstore import StoreLocation

    endpoint = error_server(503, "SlowDown", "Please reduce your request rate.")
    loc = StoreLocation("s3://bkt/data/", storage_options={"endpoint_url": endpoint}, retries=2, timeout_s=5)
    with pytest.raises(DataSourceError, match=r"failed after 3 attempts \(HTTP 503 SlowDown: the store is throttling"):
        loc.read_bytes("shard-000000.tar")
    assert error_server.server.hits == 3


def test_stalled_server_ends_within_the_bounded_timeout(stalled_endpoint):
    from shardfeed.readers.errors import DataSourceError
    from shardfeed.readers.storage.objstore import StoreLocation

    loc = StoreLocation("s3://bkt/data/", storage_options={"endpoint_url": stalled_endpoint}, retries=1, timeout_s=0.5)
    with pytest.raises(DataSourceError, match=r"failed after 2 attempts .*did not answer within 0.5 s") as e:
        loc.open("shard-000000.tar", 100)
    _no_secret(str(e.value))


def test_wrong_endpoint_names_it(closed_endpoint):
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import DataSourceError

    with pytest.raises(DataSourceError, match=r"cannot reach the store at http://127.0.0.1:\d+ .*AWS_ENDPOINT_URL"):
        open_dataset("s3://bkt/data/", storage_options={"endpoint_url": closed_endpoint}, retries=1)


def test_a_cut_stream_resumes_at_the_failed_byte(s3_packed, packed_wds):
    """Closing the connection under a stream (as a server that drops it does) is retried from the
    byte where it stopped: the bytes read equal the file's."""
    from shardfeed.readers.storage.objstore import StoreLocation

    loc = StoreLocation(s3_packed[0])
    want = (packed_wds / "shard-000000.tar").read_bytes()
    stream, start = loc.open("shard-000000.tar", 1000)
    got = stream.read(3000)
    stream._resp._raw_stream.close()  # the connection dies mid-body
    got += stream.read(-1)
    assert start == 1000 and got == want[1000:]


def test_cli_errors_carry_no_credentials(s3_packed, tiny_image_folder, tmp_path):
    cases = [
        ("inspect", "s3://no-such-bucket/x"),
        ("check", "s3://data/nothing/"),
        ("stage", "s3://data/nothing/", tmp_path / "s"),
        ("pack", tiny_image_folder, "s3://no-such-bucket/out", "--format", "wds"),
        ("inspect", "s3://data/wds/", "--storage-option", "secret=" + SECRET + "2", "--storage-option",
         "endpoint_url=http://127.0.0.1:9"),
    ]
    for args in cases:
        r = _cli(*args)
        assert r.returncode != 0, args
        assert "Traceback" not in r.stderr
        assert SECRET not in r.stdout + r.stderr, args
        assert r.stderr.splitlines()[-1].startswith("shardfeed: error: s3://"), (args, r.stderr)


@pytest.mark.parametrize("args", [
    ("pack", "SRC", "gs://bucket/train"),
    ("unpack", "s3://data/wds/", "s3://data/out"),
    ("stage", "s3://data/wds/", "http://host/x"),
    ("serve", "s3://data/wds/"),
])
def test_urls_a_command_cannot_handle_are_refused(args, tiny_image_folder, tmp_path):
    args = [str(tiny_image_folder) if a == "SRC" else a for a in args]
    r = _cli(*args, cwd=tmp_path)
    assert r.returncode != 0
    bad = [a for a in args if "://" in a][-1]
    assert bad in r.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written locally (no folder named 's3:')"


# ---------------------------------------------------------------------------------------------
# pack to a bucket, tools from a bucket

@pytest.mark.slow
def test_pack_to_bucket_is_byte_identical_to_local(tiny_image_folder, s3_client, s3_bucket, tmp_path):
    bucket = s3_bucket("packs")
    local = tmp_path / "local"
    r = _cli("pack", tiny_image_folder, local, "--format", "wds", "--max-count", 16)
    assert r.returncode == 0, r.stderr
    r = _cli("pack", tiny_image_folder, f"s3://{bucket}/tiny", "--format", "wds", "--max-count", 16,
             "--json", tmp_path / "r.json", env={**__import__("os").environ, "SHARDFEED_STAGING_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert _download(s3_client, bucket, "tiny/") == {p.name: p.read_bytes() for p in local.iterdir()}
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["output"] == f"s3://{bucket}/tiny/" and SECRET not in json.dumps(report)
    assert not any(p.name.startswith("shardfeed-staging") for p in tmp_path.iterdir())
    # a second pack to the same prefix is refused; --overwrite replaces it
    r = _cli("pack", tiny_image_folder, f"s3://{bucket}/tiny", "--format", "wds")
    assert r.returncode != 0 and "not empty" in r.stderr
    r = _cli("pack", tiny_image_folder, f"s3://{bucket}/tiny", "--format", "lmdb")
    assert r.returncode != 0 and "local disk only" in r.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_pack_to_bucket_resumes_after_kill_9(tiny_image_folder, s3_client, s3_bucket, tmp_path):
    import os

    bucket = s3_bucket("killed")
    local = tmp_path / "local"
    assert _cli("pack", tiny_image_folder, local, "--format", "wds", "--max-count", 4).returncode == 0
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path / "staging")}
    (tmp_path / "staging").mkdir()
    url = f"s3://{bucket}/t"
    proc = subprocess.Popen([sys.executable, "-P", str(HOOKED), json.dumps({"upload_delay_s": 0.25}), "-q", "pack",
                             str(tiny_image_folder), url, "--format", "wds", "--max-count", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    tars = []
    while time.monotonic() < deadline and len(tars) < 3:
        resp = s3_client.list_objects_v2(Bucket=bucket, Prefix="t/")
        tars = [o for o in resp.get("Contents", []) if o["Key"].endswith(".tar")]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    names = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="t/").get("Contents", [])}
    assert len(tars) >= 3 and "t/manifest.json" not in names, "a killed pack must not look complete"
    r = _cli("pack", tiny_image_folder, url, "--format", "wds", "--max-count", 4, "--json", "-", env=env)
    assert r.returncode != 0 and "unfinished pack" in r.stderr
    r = _cli("pack", tiny_image_folder, url, "--format", "wds", "--max-count", 4, "--resume", "--json",
             tmp_path / "r.json", env=env)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["extra"]["upload_skipped"] >= 3  # found complete by listing + size + sha256
    assert _download(s3_client, bucket, "t/") == {p.name: p.read_bytes() for p in local.iterdir()}


@pytest.mark.slow
def test_tools_read_from_a_bucket(s3_packed, packed_wds, tmp_path):
    url, folder = s3_packed
    r = _cli("check", url)
    assert r.returncode == 0 and "OK" in r.stdout + r.stderr, r.stderr
    r = _cli("inspect", url, "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_samples"] == 60
    r = _cli("inspect", folder, "--json", "-")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["format"] == "imagefolder" and report["num_samples"] == 60
    assert [c["count"] for c in report["classes"]] == [20, 20, 20]
    r = _cli("stage", url, tmp_path / "staged")
    assert r.returncode == 0, r.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "staged").iterdir()} == \
        {p.name: p.read_bytes() for p in packed_wds.iterdir() if p.name != ".shardfeed-paths"}  # not staged
    r = _cli("index", url, "--out", tmp_path / "ix")
    assert r.returncode == 0, r.stderr
    for idx in packed_wds.glob("*.sfidx"):
        assert (tmp_path / "ix" / idx.name).read_bytes() == idx.read_bytes()


@pytest.mark.slow
def test_pack_from_a_bucket_folder_gives_the_local_shards(s3_packed, tiny_image_folder, s3_client, s3_bucket, tmp_path):
    """SRC in a bucket (classes by listing, one GET per image) packs to the same shards and indexes
    as the local folder; OUT in a bucket too."""
    import os

    _, folder = s3_packed
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path / "staging")}
    (tmp_path / "staging").mkdir()
    local = tmp_path / "local"
    assert _cli("pack", tiny_image_folder, local, "--format", "wds", "--max-count", 16).returncode == 0
    r = _cli("pack", folder, tmp_path / "from-bucket", "--format", "wds", "--max-count", 16, "--json",
             tmp_path / "r.json", env=env)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["source"] == folder
    # the manifest records the bucket's URL, never the removed mirror folder; a local pack its path
    assert json.loads((tmp_path / "from-bucket" / "manifest.json").read_text())["options"]["source"] == folder
    assert json.loads((local / "manifest.json").read_text())["options"]["source"] == str(tiny_image_folder)
    # the listing and download are reported apart from the pack's own time and images/s
    assert report["extra"]["download_seconds"] > 0
    assert "listing and downloading SRC from the bucket" in r.stdout + r.stderr
    # a rerun with --resume finds this finished dataset (the same source), and packs nothing
    r = _cli("pack", folder, tmp_path / "from-bucket", "--format", "wds", "--max-count", 16, "--resume", env=env)
    assert r.returncode == 0 and "already holds this finished dataset" in r.stdout + r.stderr, r.stderr
    shards = lambda d: {p.name: p.read_bytes() for p in d.iterdir() if p.suffix in (".tar", ".sfidx")}  # noqa: E731
    assert shards(tmp_path / "from-bucket") == shards(local)
    bucket = s3_bucket("bucket2bucket")
    r = _cli("pack", folder, f"s3://{bucket}/x", "--format", "wds", "--max-count", 16, env=env)
    assert r.returncode == 0, r.stderr
    got = _download(s3_client, bucket, "x/")
    assert {k: v for k, v in got.items() if k.endswith((".tar", ".sfidx"))} == shards(local)
    assert list((tmp_path / "staging").iterdir()) == []  # the mirror and the staging folder are removed


@pytest.mark.slow
@pytest.mark.multiprocess
def test_verify_before_may_be_a_folder_in_a_bucket(s3_packed, tmp_path):
    url, folder = s3_packed
    r = _cli("verify", folder, url, "--batches", 2, "--warmup", 1, "--repeats", 1, "--batch-size", 8,
             "--num-workers", 1, "--image-size", 16, "--json", tmp_path / "v.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "v.json").read_text())
    assert SECRET not in json.dumps(report)
    text = json.dumps(report)
    assert folder in text and url in text


def test_anonymous_access_to_a_public_bucket(s3_client, s3_bucket, packed_wds, tiny_folder_expected):
    """``anon=true`` sends unsigned requests: a public-read object is read, a private one is 403
    with a message saying the bucket is not public."""
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import DataSourceError

    bucket = s3_bucket("public")
    for p in packed_wds.iterdir():
        s3_client.put_object(Bucket=bucket, Key="pub/" + p.name, Body=p.read_bytes(), ACL="public-read")
        s3_client.put_object(Bucket=bucket, Key="priv/" + p.name, Body=p.read_bytes())
    ds = open_dataset(f"s3://{bucket}/pub/", decode=False, shuffle=False, storage_options={"anon": True})
    assert {s.meta["path"]: (bytes(s.data), s.label) for s in ds} == tiny_folder_expected
    with pytest.raises(DataSourceError, match=r"access denied \(HTTP 403 .*the bucket is not public"):
        open_dataset(f"s3://{bucket}/priv/", storage_options={"anon": "true"})


def test_retries_log_no_credentials(error_server, caplog):
    import logging

    from shardfeed.readers.errors import DataSourceError
    from shardfeed.readers.storage.objstore import StoreLocation

    endpoint = error_server(503, "SlowDown", "reduce your rate " + SECRET)  # even a server echoing it
    loc = StoreLocation("s3://bkt/x/", storage_options={"endpoint_url": endpoint, "key": ACCESS_KEY, "secret": SECRET},
                        retries=1)
    with caplog.at_level(logging.DEBUG), pytest.raises(DataSourceError) as e:
        loc.read_bytes("a.tar")
    assert "attempt 1 of 2" in caplog.text
    assert SECRET not in caplog.text and SECRET not in str(e.value) and SECRET not in repr(loc)


def test_without_the_client_the_message_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['boto3'] = None\n"
            "from shardfeed.readers import open_dataset\n"
            "try:\n    open_dataset('s3://bucket/x/')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert "UnsupportedURLError" in r.stdout and "pip install 'shardfeed[s3]'" in r.stdout, r.stdout + r.stderr


def test_storage_option_is_checked():
    r = _cli("inspect", "s3://bucket/x", "--storage-option", "colour=blue")
    assert r.returncode != 0 and "storage option 'colour' is not one shardfeed knows" in r.stderr


@pytest.mark.slow
def test_unpack_and_convert_from_a_bucket(s3_packed, tiny_folder_expected, tmp_path):
    from shardfeed.readers import open_dataset

    url, _ = s3_packed
    r = _cli("unpack", url, tmp_path / "unpacked")
    assert r.returncode == 0, r.stderr
    got = {p.relative_to(tmp_path / "unpacked").as_posix(): p.read_bytes()
           for p in (tmp_path / "unpacked").rglob("*") if p.is_file()}
    assert got == {rel: data for rel, (data, _) in tiny_folder_expected.items()}
    r = _cli("convert", url, tmp_path / "lmdb", "--format", "lmdb")
    if r.returncode != 0 and "lmdb" in r.stderr.lower() and "install" in r.stderr.lower():
        pytest.skip(r.stderr)
    assert r.returncode == 0, r.stderr
    ds = open_dataset(tmp_path / "lmdb", decode=False)
    assert {ds[i].meta["path"]: (bytes(ds[i].data), ds[i].label) for i in range(len(ds))} == tiny_folder_expected


def test_a_failed_pack_to_a_bucket_never_looks_finished(tiny_image_folder, s3_client, s3_bucket, tmp_path):
    import os
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_image_folder, src)
    (src / "dog" / "zz_empty.jpg").write_bytes(b"")
    bucket = s3_bucket("failed")
    env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path)}
    r = _cli("pack", src, f"s3://{bucket}/f", "--format", "wds", "--max-count", 4, env=env)
    assert r.returncode != 0 and "zz_empty.jpg" in r.stderr
    names = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="f/").get("Contents", [])}
    assert "f/manifest.json" not in names
    r = _cli("pack", src, f"s3://{bucket}/f", "--format", "wds", "--max-count", 4, env=env)
    assert r.returncode != 0 and "unfinished pack" in r.stderr


def test_large_files_go_up_as_multipart_uploads(s3_client, s3_bucket, tmp_path, monkeypatch):
    import hashlib
    import os

    from shardfeed.readers.storage import objstore

    monkeypatch.setattr(objstore, "MULTIPART_THRESHOLD_BYTES", 5 << 20)  # S3's smallest part size
    data = os.urandom(11 << 20)
    (tmp_path / "big.tar").write_bytes(data)
    bucket = s3_bucket("multipart")
    loc = objstore.StoreLocation(f"s3://{bucket}/p/")
    sha = hashlib.sha256(data).hexdigest()
    loc.put_file("big.tar", tmp_path / "big.tar", sha256=sha)
    head = s3_client.head_object(Bucket=bucket, Key="p/big.tar")
    assert head["ETag"].strip('"').endswith("-3")  # three parts
    assert head["Metadata"]["sha256"] == sha and loc.head("big.tar")["sha256"] == sha
    assert s3_client.get_object(Bucket=bucket, Key="p/big.tar")["Body"].read() == data


def test_overwrite_never_deletes_objects_under_a_deeper_prefix(tiny_image_folder, s3_client, s3_bucket, tmp_path):
    """--overwrite deletes the pack's own objects only: a .tar/.idx one prefix deeper (another
    dataset's shards, someone's backup) is not ours, and the overwrite is refused naming it."""
    bucket = s3_bucket("nested-overwrite")
    env = {**__import__("os").environ, "SHARDFEED_STAGING_DIR": str(tmp_path)}
    r = _cli("pack", tiny_image_folder, f"s3://{bucket}/ds", "--format", "wds", env=env)
    assert r.returncode == 0, r.stderr
    s3_client.put_object(Bucket=bucket, Key="ds/backup/important.tar", Body=b"keep me")
    s3_client.put_object(Bucket=bucket, Key="ds/other/shard-000000.idx", Body=b"keep me too")
    r = _cli("pack", tiny_image_folder, f"s3://{bucket}/ds", "--format", "wds", "--overwrite", env=env)
    assert r.returncode != 0 and "backup/important.tar" in r.stderr and "Traceback" not in r.stderr
    assert s3_client.get_object(Bucket=bucket, Key="ds/backup/important.tar")["Body"].read() == b"keep me"
    assert s3_client.get_object(Bucket=bucket, Key="ds/other/shard-000000.idx")["Body"].read() == b"keep me too"
    assert "manifest.json" in _download(s3_client, bucket, "ds/")  # refused before anything was deleted


@pytest.mark.parametrize("value", ["maybe", "ture", ""])
def test_storage_option_anon_takes_a_boolean_only(value):
    """anon=maybe is refused, not kept as a (truthy) string that would send unsigned requests and blame a
    403 on the bucket."""
    r = _cli("inspect", "s3://bucket/x", "--storage-option", f"anon={value}")
    assert r.returncode == 2 and "anon" in r.stderr and "true or false" in r.stderr and "Traceback" not in r.stderr


def test_storage_option_max_pool_connections_takes_a_positive_integer():
    r = _cli("inspect", "s3://bucket/x", "--storage-option", "max_pool_connections=lots")
    assert r.returncode == 2 and "max_pool_connections" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [
    ("inspect", f"s3://AKIASHARDFEEDTEST01:{SECRET}@data/wds/"),
    ("check", f"s3://AKIASHARDFEEDTEST01:{SECRET}@data/wds/"),
    ("inspect", "s3://data/wds/", "--storage-option", f"secret:{SECRET}"),
])
def test_credentials_typed_into_the_command_line_are_never_echoed(args, s3_endpoint):
    """A key:secret@ in an s3:// URL reached botocore's multi-line bucket-name error, which repeated
    it; a KEY:VALUE typo of --storage-option was echoed whole."""
    r = _cli(*args)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert SECRET not in r.stdout + r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") if r.returncode == 2 else len(lines) == 1, r.stderr


def test_http_url_password_is_never_echoed(closed_endpoint):
    host = closed_endpoint.split("://")[1]
    r = _cli("inspect", f"http://user:{SECRET}@{host}/ds/")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert SECRET not in r.stdout + r.stderr and host in r.stderr, r.stderr


def test_an_image_folder_in_a_bucket_is_cached_in_memory(s3_packed, tiny_folder_expected):
    from shardfeed.readers import open_dataset

    _, folder = s3_packed
    ds = open_dataset(folder.rstrip("/"), cache="memory", decode=False)
    assert len(ds) == len(tiny_folder_expected)
    got = {}
    for i in range(len(ds)):
        s = ds[i]
        got[s.meta["path"]] = (bytes(s.data), s.label)
    assert got == tiny_folder_expected
