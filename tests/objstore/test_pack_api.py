"""``pack()`` and ``convert_dataset()`` from Python take bucket URLs as the CLI does: the objects a
pack to (or from) a bucket leaves are the bytes ``shardfeed pack`` leaves, a convert to a bucket
gives the bytes of a local convert, and an unsupported scheme is refused before anything is written
(against a real S3-API server on 127.0.0.1, ``conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shardfeed.convert.write.pack import PackOptions, pack
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


@pytest.mark.parametrize("reencode", [None, {"resize": 16}], ids=["bytes-kept", "reencoded"])
def test_uploads_start_from_the_build_as_each_shard_is_complete(reencode, tiny_image_folder, s3_client, s3_bucket,
                                                                tmp_path, monkeypatch):
    """Each shard is handed to the uploader by the build's ``on_shard_end``, in shard order, while
    the build still runs (its manifest not yet written), never found by watching the folder."""
    import threading

    from shardfeed.convert.write import store_pack

    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path))
    calls = []
    real = store_pack._Uploader.shard_done

    def spy(self, entry, index):
        calls.append((index, entry.name, threading.current_thread() is threading.main_thread(),
                      (self.stage / "manifest.json").exists()))
        return real(self, entry, index)

    monkeypatch.setattr(store_pack._Uploader, "shard_done", spy)
    bucket = s3_bucket("hooked-" + ("reencoded" if reencode else "kept"))
    report = pack(tiny_image_folder, f"s3://{bucket}/h", PackOptions(format="wds", max_count=8, workers=2,
                                                                     reencode=reencode))
    names = sorted(k for k in _download(s3_client, bucket, "h/") if k.endswith(".tar"))
    assert report.num_shards == len(names) == 8  # 60 samples, 8 a shard
    assert [c[0] for c in calls] == list(range(8)) and [c[1] for c in calls] == names
    assert all(main and not finished for _, _, main, finished in calls)
    assert not [t for t in threading.enumerate() if t.name == "shardfeed-upload-watch"]


def test_the_card_of_a_bucket_pack_does_not_depend_on_upload_timing(tiny_image_folder, s3_client, s3_bucket,
                                                                    tmp_path, monkeypatch):
    """Every upload finishes (and its local copy would go) before the build writes the dataset
    card, which reads the first shards' samples: the card still equals a local pack's."""
    from shardfeed.convert.write import store_pack

    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path / "staging"))
    (tmp_path / "staging").mkdir()
    real = store_pack._Uploader.shard_done

    def upload_at_once(self, entry, index):
        real(self, entry, index)
        for f in list(self.futures):
            f.result()

    monkeypatch.setattr(store_pack._Uploader, "shard_done", upload_at_once)
    opts = dict(format="wds", max_count=8, workers=1)
    pack(tiny_image_folder, tmp_path / "local", PackOptions(**opts))
    bucket = s3_bucket("card-timing")
    pack(tiny_image_folder, f"s3://{bucket}/c", PackOptions(**opts))
    got = _download(s3_client, bucket, "c/")
    card = (tmp_path / "local" / "README.md").read_bytes()
    assert b'name: "path"' in card or b"name: path" in card  # the metadata fields were read from the shards
    assert got["README.md"] == card
    assert got == _files(tmp_path / "local")


@pytest.mark.parametrize("url", ["s3://bucket/captions", "http://127.0.0.1:9/captions"])
def test_write_dataset_refuses_a_url_writing_nothing(url, tmp_path, monkeypatch):
    from shardfeed.convert import write_dataset

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedURLError, match=rf"{url}: write_dataset writes a local folder.*shardfeed convert"):
        write_dataset([{"image": b"\xff\xd8\xff\xd9", "ext": "jpg"}], url)
    assert not any(tmp_path.iterdir()), "nothing may be written locally (no folder named 's3:')"


def test_a_layout_pack_to_a_bucket_writes_the_bytes_of_a_local_pack(s3_client, s3_bucket, tmp_path, monkeypatch):
    """--labels with --sidecars packed straight to a bucket gives the objects of the local pack's files,
    resumed or not; --no-labels / --sidecars packed locally reach a bucket by `shardfeed convert`."""
    import numpy as np
    from PIL import Image

    from shardfeed.readers import open_dataset

    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path / "staging"))
    (tmp_path / "staging").mkdir()
    src = tmp_path / "flat"
    src.mkdir()
    planted = {}
    for i in range(5):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(src / f"x{i}.png")
        (src / f"x{i}.txt").write_text(f"caption {i}")
        planted[f"x{i}.png"] = ((src / f"x{i}.png").read_bytes(), f"caption {i}")
    bucket = s3_bucket("layout-convert")
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\n" + "".join(f"x{i}.png,{'ab'[i % 2]}\n" for i in range(5)))
    flags = ("--labels", labels, "--sidecars", "txt", "--max-count", 2, "-j", 2)
    assert _cli("pack", src, tmp_path / "local", *flags).returncode == 0
    r = _cli("pack", src, f"s3://{bucket}/direct", *flags)
    assert r.returncode == 0, r.stderr
    assert _download(s3_client, bucket, "direct/") == _files(tmp_path / "local")
    assert len(list((tmp_path / "local").glob("*.tar"))) == 3
    r = _cli("pack", src, f"s3://{bucket}/direct", *flags, "--resume")  # this very dataset: nothing to do
    assert r.returncode == 0, r.stderr
    assert _download(s3_client, bucket, "direct/") == _files(tmp_path / "local")
    assert _cli("pack", src, tmp_path / "out", "--no-labels", "--sidecars", "txt").returncode == 0
    r = _cli("convert", tmp_path / "out", f"s3://{bucket}/captions", "--format", "wds")
    assert r.returncode == 0, r.stderr
    ds = open_dataset(f"s3://{bucket}/captions", fields=("txt",), decode=False)
    items = list(ds)  # (Sample, {name: value}) with decode=False
    assert {s.meta["path"]: (bytes(s.data), f["txt"]) for s, f in items} == planted
    assert [s.label for s, _ in items] == [-1] * len(planted)
