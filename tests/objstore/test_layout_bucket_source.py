"""A layout pack (labels file, sidecar files) whose SRC is a folder in a bucket: the local mirror
gives the shards of the same folder packed from a local disk, downloads only the files the layout
scan reads, and counts the other objects as a local pack counts the files of the same tree
(against a real S3-API server on 127.0.0.1, ``conftest.py``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.layouts import LayoutOptions
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.readers.storage.objstore import StoreLocation

from .conftest import _upload_dir

pytestmark = pytest.mark.network


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(8 + seed % 4, 9, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _plant(src: Path) -> dict[str, dict[str, bytes]]:
    """A labels + sidecars layout below ``src``: ``{image rel: {"jpg": bytes, "txt"?: ..., "json"?: ...}}``;
    beside it a labels file, a README, an orphan sidecar file, a hidden file and a hidden folder."""
    (src / "sub").mkdir(parents=True)
    want: dict[str, dict[str, bytes]] = {}
    rows = ["path,label"]
    for i in range(11):
        rel = f"{'sub/' if i % 3 == 0 else ''}img{i:02d}.{'v2.' if i % 4 == 0 else ''}jpg"
        item = {"jpg": _jpeg(i)}
        (src / rel).write_bytes(item["jpg"])
        stem = rel[:-len(".jpg")]
        if i % 2 == 0:
            item["txt"] = f"caption {i}".encode()
            (src / f"{stem}.txt").write_bytes(item["txt"])
        if i % 5 == 0:
            item["json"] = json.dumps({"i": i}).encode()
            (src / f"{stem}.json").write_bytes(item["json"])
        rows.append(f"{rel},{'cat' if i % 3 else 'dog'}")
        want[rel] = item
    (src / "labels.csv").write_text("\n".join(rows) + "\n")
    (src / "README.md").write_bytes(b"x" * 5000)
    (src / "lonely.txt").write_text("no image of this stem")
    (src / ".DS_Store").write_bytes(b"\0")
    (src / ".cache").mkdir()
    (src / ".cache" / "old.jpg").write_bytes(_jpeg(99))
    return want


def _shards(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".tar", ".sfidx")}


@pytest.mark.slow
def test_a_labels_and_sidecars_layout_from_a_bucket_gives_the_local_shards(s3_client, s3_bucket, tmp_path,
                                                                           monkeypatch):
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(staging))
    src = tmp_path / "src"
    want = _plant(src)
    bucket = s3_bucket("layout-src")
    _upload_dir(s3_client, bucket, "flat/", src)
    url = f"s3://{bucket}/flat/"
    layout = LayoutOptions(labels_file=src / "labels.csv", sidecars=("txt", "json"))  # a local labels file
    options = PackOptions(format="wds", max_count=4, workers=1)
    local = pack(src, tmp_path / "local", options, layout=layout)

    read: list[str] = []
    original = StoreLocation.read_bytes

    def recording(self, name, **kw):
        read.append(name)
        return original(self, name, **kw)

    monkeypatch.setattr(StoreLocation, "read_bytes", recording)
    remote = pack(url, tmp_path / "remote", options, layout=layout)

    assert _shards(tmp_path / "remote") == _shards(tmp_path / "local")
    assert len(_shards(tmp_path / "local")) == 6  # 11 samples, 4 a shard: 3 tars and their indexes
    # the planted images and sidecar files are in the shards
    members: dict[str, bytes] = {}
    for name in sorted((tmp_path / "remote").glob("*.tar")):
        with tarfile.open(name) as tar:
            members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    for suffix, member in (("jpg", ".jpg"), ("txt", ".txt"), ("json", ".sidecar.json")):
        assert sorted(v for k, v in members.items() if k.endswith(member)) == \
            sorted(item[suffix] for item in want.values() if suffix in item)
    # only the images and sidecar files were downloaded: never the README, the labels file, hidden files
    assert sorted(read) == sorted([*want, "lonely.txt"] + [f"{r[:-4]}.{s}" for r, it in want.items()
                                                           for s in ("txt", "json") if s in it])
    # the manifest records the URL; found, ignored and skipped count as in the local pack
    by_bucket = json.loads((tmp_path / "remote" / "manifest.json").read_text())
    by_disk = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert by_bucket["options"].pop("source") == url and by_disk["options"].pop("source") == str(src.absolute())
    assert by_bucket == by_disk
    # 11 images, 6 .txt and 3 .json sidecar files; labels.csv, README.md, lonely.txt, .DS_Store and .cache/
    assert by_disk["files"]["found"] == 11 + 6 + 3 + 5 and by_disk["files"]["ignored"] == 5
    assert remote.source == url and remote.extra["download_seconds"] >= 0
    assert sorted(d["path"] for d in remote.ignored) == sorted(d["path"] for d in local.ignored)
    assert list(staging.iterdir()) == [], "the mirror is removed once the pack is finished"

    # the command line, with two workers: the same shards
    r = subprocess.run([sys.executable, "-P", "-m", "shardfeed.convert.cli", "pack", url, str(tmp_path / "cli"),
                        "--labels", str(src / "labels.csv"), "--sidecars", "txt,json", "--max-count", "4", "-j", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _shards(tmp_path / "cli") == _shards(tmp_path / "local")

    # a bucket OUT too: the objects are the local pack's files
    out_bucket = s3_bucket("layout-src-out")
    pack(url, f"s3://{out_bucket}/x", options, layout=layout)
    got = {o["Key"][2:]: s3_client.get_object(Bucket=out_bucket, Key=o["Key"])["Body"].read()
           for o in s3_client.list_objects_v2(Bucket=out_bucket, Prefix="x/")["Contents"]}
    assert {k: v for k, v in got.items() if k.endswith((".tar", ".sfidx"))} == _shards(tmp_path / "local")
    assert json.loads(got["manifest.json"])["options"]["source"] == url


def test_a_bucket_object_that_is_also_a_folder_is_refused_by_name(s3_client, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path))
    bucket = s3_bucket("layout-clash")
    for key in ("p/a.jpg", "p/a.jpg/b.jpg"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=_jpeg(1))
    with pytest.raises(ValueError, match=rf"s3://{bucket}/p/a.jpg: the object's name is also the folder"):
        pack(f"s3://{bucket}/p", tmp_path / "out", PackOptions(format="wds", workers=1),
             layout=LayoutOptions(no_labels=True))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_lmdb_layout_pack_from_a_bucket_holds_the_local_records(s3_client, s3_bucket, tmp_path, monkeypatch):
    from shardfeed.readers import open_dataset

    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path))
    src = tmp_path / "src"
    want = _plant(src)
    bucket = s3_bucket("layout-src-lmdb")
    _upload_dir(s3_client, bucket, "flat/", src)
    layout = LayoutOptions(labels_file=src / "labels.csv", sidecars=("txt",))
    options = PackOptions(format="lmdb", workers=1)
    pack(src, tmp_path / "local", options, layout=layout)
    pack(f"s3://{bucket}/flat", tmp_path / "remote", options, layout=layout)

    def records(folder: Path) -> list[tuple]:
        ds = open_dataset(folder, fields=("txt",), decode=False)
        return [(s.key, s.meta["path"], bytes(s.data), s.label, f.get("txt")) for s, f in ds]

    got = records(tmp_path / "remote")
    assert got == records(tmp_path / "local")
    assert {path: (data, txt) for _, path, data, _, txt in got} == \
        {rel: (item["jpg"], item["txt"].decode() if "txt" in item else None) for rel, item in want.items()}


@pytest.mark.slow
def test_an_interrupted_layout_pack_from_a_bucket_resumes_without_downloading_again(s3_client, s3_bucket, tmp_path,
                                                                                     monkeypatch):
    """The mirror stays after a stopped pack; ``resume`` finds every file there (size and mtime)
    and keeps the complete shards: the shards of the local pack, nothing downloaded twice."""
    from shardfeed.convert.write import layout_shards

    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(staging))
    src = tmp_path / "src"
    _plant(src)
    bucket = s3_bucket("layout-src-resume")
    _upload_dir(s3_client, bucket, "flat/", src)
    url = f"s3://{bucket}/flat/"
    layout = LayoutOptions(labels_file=src / "labels.csv", sidecars=("txt",))
    pack(src, tmp_path / "local", PackOptions(format="wds", max_count=3, workers=1), layout=layout)
    real_read, calls = layout_shards.read_checked, {"n": 0}

    def read_then_stop(*args):
        calls["n"] += 1
        if calls["n"] == 12:  # shard 0 (3 images, 2 captions) and shard 1 complete, shard 2 not
            raise KeyboardInterrupt
        return real_read(*args)

    monkeypatch.setattr(layout_shards, "read_checked", read_then_stop)
    with pytest.raises(KeyboardInterrupt):
        pack(url, tmp_path / "remote", PackOptions(format="wds", max_count=3, workers=1), layout=layout)
    monkeypatch.setattr(layout_shards, "read_checked", real_read)
    assert (tmp_path / "remote" / "shard-000000.tar").exists() and not (tmp_path / "remote" / "manifest.json").exists()
    assert len(list(staging.iterdir())) == 1, "the mirror is kept for the resumed pack"
    kept = (tmp_path / "remote" / "shard-000000.tar").stat().st_mtime_ns

    read: list[str] = []
    original = StoreLocation.read_bytes
    monkeypatch.setattr(StoreLocation, "read_bytes", lambda self, name, **kw: read.append(name) or original(
        self, name, **kw))
    pack(url, tmp_path / "remote", PackOptions(format="wds", max_count=3, workers=1, resume=True), layout=layout)
    assert read == []
    assert (tmp_path / "remote" / "shard-000000.tar").stat().st_mtime_ns == kept
    assert _shards(tmp_path / "remote") == _shards(tmp_path / "local")
    assert list(staging.iterdir()) == []


def test_objects_named_like_a_mirror_temporary_file_or_at_the_longest_name_pack_as_on_a_local_disk(
        s3_client, s3_bucket, tmp_path, monkeypatch):
    """``.a.jpg.tmp`` beside ``a.jpg`` is a hidden file of the folder, kept and counted as ignored;
    a 252-byte name (a valid local file name) is packed."""
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(staging))
    bucket = s3_bucket("layout-temp-names")
    long_name = "x" * 248 + ".jpg"
    planted = {"a.jpg": _jpeg(1), ".a.jpg.tmp": b"a hidden file", long_name: _jpeg(2)}
    for rel, data in planted.items():
        s3_client.put_object(Bucket=bucket, Key=f"p/{rel}", Body=data)
    pack(f"s3://{bucket}/p", tmp_path / "out", PackOptions(format="wds", workers=1),
         layout=LayoutOptions(no_labels=True))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["files"]["found"], manifest["files"]["packed"], manifest["files"]["ignored"]) == (3, 2, 1)
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        images = sorted(tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg"))
    assert images == sorted([planted["a.jpg"], planted[long_name]])
    assert list(staging.iterdir()) == []


def test_an_object_name_longer_than_a_local_file_name_is_refused_by_name(s3_client, s3_bucket, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("SHARDFEED_STAGING_DIR", str(tmp_path / "staging"))
    bucket = s3_bucket("layout-long-name")
    long_key = "p/sub/" + "x" * 300 + ".jpg"
    for key in ("p/a.jpg", long_key):
        s3_client.put_object(Bucket=bucket, Key=key, Body=_jpeg(1))
    read: list[str] = []
    original = StoreLocation.read_bytes
    monkeypatch.setattr(StoreLocation, "read_bytes", lambda self, name, **kw: read.append(name) or original(
        self, name, **kw))
    with pytest.raises(ValueError, match=rf"s3://{bucket}/{long_key}: a part of the object's name is longer than"):
        pack(f"s3://{bucket}/p", tmp_path / "out", PackOptions(format="wds", workers=1),
             layout=LayoutOptions(no_labels=True))
    assert read == [] and not (tmp_path / "out").exists()
