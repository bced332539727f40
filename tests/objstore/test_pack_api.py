"""``pack()`` and ``convert_dataset()`` from Python take bucket URLs as the CLI does: the objects a
pack to (or from) a bucket leaves are the bytes ``shardfeed pack`` leaves, a convert to a bucket
gives the bytes of a local convert, and an unsupported scheme is refused before anything is written
(against a real S3-API server on 127.0.0.1, ``conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shardfeed.convert.pack import PackOptions, pack
from shardfeed.readers.errors import UnsupportedURLError

pytestmark = pytest.mark.network

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]


def _cli(*args, **kw):
    return subprocess.run([*SHARDFEED, *map(str, args)], capture_output=True, text=True, **kw)


def _download(client, bucket: str, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix):]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.slow
def test_pack_from_python_to_a_bucket_equals_the_cli(tiny_image_folder, s3_client, s3_bucket, tmp_path,
                                                    monkeypatch):
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path))
    bucket = s3_bucket("api-pack")
    r = _cli("pack", tiny_image_folder, f"s3://{bucket}/cli", "--format", "wds", "--max-count", 16)
    assert r.returncode == 0, r.stderr
    report = pack(tiny_image_folder, f"s3://{bucket}/api", PackOptions(format="wds", max_count=16))
    by_cli, by_api = _download(s3_client, bucket, "cli/"), _download(s3_client, bucket, "api/")
    assert sorted(by_api) == sorted(by_cli)
    assert [k for k in by_cli if by_api[k] != by_cli[k]] == []
    assert "manifest.json" in by_api and any(k.endswith(".tar") for k in by_api)
    assert report.output == f"s3://{bucket}/api/" and report.extra["uploaded"] > 0
    assert not any(tmp_path.iterdir()), "the staging folder is removed"
    assert not (tmp_path.parent / "s3:").exists() and not os.path.exists("s3:")
    # the bucket OUT is checked as the CLI checks it: a second pack is refused, naming the fix
    with pytest.raises(ValueError, match="not empty"):
        pack(tiny_image_folder, f"s3://{bucket}/api", PackOptions(format="wds", max_count=16))
    with pytest.raises(UnsupportedURLError, match="local disk only"):
        pack(tiny_image_folder, f"s3://{bucket}/lmdb", PackOptions(format="lmdb"))


@pytest.mark.slow
def test_pack_from_python_from_a_bucket_folder_equals_the_cli(s3_packed, s3_client, s3_bucket, tmp_path,
                                                             monkeypatch):
    _, folder = s3_packed
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path / "staging"))
    (tmp_path / "staging").mkdir()
    r = _cli("pack", folder, tmp_path / "cli", "--format", "wds", "--max-count", 16)
    assert r.returncode == 0, r.stderr
    report = pack(folder, tmp_path / "api", PackOptions(format="wds", max_count=16))
    assert _files(tmp_path / "api") == _files(tmp_path / "cli")
    assert report.source == folder
    bucket = s3_bucket("api-bucket2bucket")
    r = _cli("pack", folder, f"s3://{bucket}/cli", "--format", "wds", "--max-count", 16)
    assert r.returncode == 0, r.stderr
    pack(folder, f"s3://{bucket}/api", PackOptions(format="wds", max_count=16))
    assert _download(s3_client, bucket, "api/") == _download(s3_client, bucket, "cli/")
    assert list((tmp_path / "staging").iterdir()) == []  # the mirror and the staging folder are removed


@pytest.mark.parametrize("url", ["gs://bucket/train", "ftp://host/train"])
def test_pack_from_python_refuses_other_schemes_writing_nothing(url, tiny_image_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedURLError, match=url.split("/")[0]):
        pack(tiny_image_folder, url, PackOptions(format="wds"))
    assert not any(tmp_path.iterdir()), "nothing may be written locally (no folder named 'gs:')"


@pytest.mark.slow
def test_convert_to_a_bucket_gives_the_local_convert(s3_packed, s3_client, s3_bucket, tmp_path, monkeypatch):
    from shardfeed.convert.tools.convert import convert_dataset

    url, _ = s3_packed
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path / "staging"))
    (tmp_path / "staging").mkdir()
    local = convert_dataset(url, tmp_path / "local", format="wds", max_count=7)
    bucket = s3_bucket("converted")
    r = _cli("convert", url, f"s3://{bucket}/cli", "--format", "wds", "--max-count", 7)
    assert r.returncode == 0, r.stderr
    report = convert_dataset(url, f"s3://{bucket}/api", format="wds", max_count=7)
    expected = _files(tmp_path / "local")
    assert _download(s3_client, bucket, "cli/") == expected
    assert _download(s3_client, bucket, "api/") == expected
    assert report.output == f"s3://{bucket}/api/" and report.num_samples == local.num_samples == 60
    assert list((tmp_path / "staging").iterdir()) == []
    # OUT is checked with the rule of a local OUT: not empty is refused, --overwrite replaces ours
    with pytest.raises(ValueError, match="not empty"):
        convert_dataset(url, f"s3://{bucket}/api", format="wds", max_count=7)
    convert_dataset(url, f"s3://{bucket}/api", format="wds", max_count=30, overwrite=True)
    convert_dataset(url, tmp_path / "local30", format="wds", max_count=30)
    assert _download(s3_client, bucket, "api/") == _files(tmp_path / "local30")
    with pytest.raises(UnsupportedURLError, match="local disk only"):
        convert_dataset(url, f"s3://{bucket}/lmdb", format="lmdb")
