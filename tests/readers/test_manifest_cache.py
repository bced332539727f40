"""A node's processes share one parsed manifest: the compact form in the per-user cache folder.

Each test plants a large ``manifest.json`` (above the cache threshold) and compares what is loaded
with the planted document, through real files and real processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardfeed.readers.errors import ManifestError
from shardfeed.readers.format.manifest import Manifest
from shardfeed.readers.format.manifest_table import (
    ShardTable,
    decode_manifest_table,
    encode_manifest_table,
)
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.storage.manifest_cache import MIN_SHARED_MANIFEST_BYTES, parse_manifest

SHARDS = 4000


def planted_doc(shards: int = SHARDS, bytes_of_first: int = 1000) -> dict:
    entries = []
    for i in range(shards):
        e = {"name": f"shard-{i:06d}.tar", "num_samples": 3 + i % 5, "num_bytes": bytes_of_first + i,
             "sha256": hashlib.sha256(b"s%d" % i).hexdigest()}
        if i % 3:
            e["index"] = f"shard-{i:06d}.sfidx"
            e["index_sha256"] = hashlib.sha256(b"i%d" % i).hexdigest()
        if i % 2:
            e["extensions"] = {"jpg": 1 + i % 5, "png": 2} if i % 4 == 1 else {"png": 3 + i % 5}
        entries.append(e)
    return {"format": "webdataset", "version": 3, "created_by": "test", "labels": "class",
            "num_samples": sum(e["num_samples"] for e in entries), "classes": ["cat", "dög"],
            "class_to_idx": {"cat": 0, "dög": 1}, "shards": entries, "skipped": [{"path": "x", "reason": "r"}],
            "options": {"shard_size": "1MB"}, "files": {"found": 1}, "fields": {"txt": {"count": 2, "missing": 1}}}


def plant(folder: Path, doc: dict) -> bytes:
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(doc, indent=1).encode()
    assert len(raw) >= MIN_SHARED_MANIFEST_BYTES
    (folder / "manifest.json").write_bytes(raw)
    return raw


def shard_dicts(manifest: Manifest) -> list[dict]:
    return [s.to_json() for s in manifest.shards]


def cache_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.sfman"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("SHARDFEED_MANIFEST_CACHE", str(folder))
    return folder


_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from shardfeed.readers.format import manifest_table
    from shardfeed.readers.storage import manifest_cache

    builds, go = Path(sys.argv[2]), Path(sys.argv[3])
    encode = manifest_table.encode_manifest_table
    def counted(*a, **k):
        with open(builds, "a") as f:
            f.write(f"{os.getpid()}\\n")
        return encode(*a, **k)
    manifest_cache.encode_manifest_table = counted
    for _ in range(3000):  # every process starts its open at once (bounded wait)
        if go.exists():
            break
        time.sleep(0.01)
    from shardfeed.readers.storage.local_manifest import load_manifest
    m = load_manifest(sys.argv[1], check_files=False)
    print(json.dumps({"table": type(m.shards).__name__, "num_samples": m.num_samples,
                      "shards": [s.to_json() for s in m.shards], "classes": m.classes}))
""")


def run_children(folder: Path, tmp: Path, count: int) -> tuple[list[dict], list[str]]:
    builds, go = tmp / "builds.txt", tmp / "go"
    go.unlink(missing_ok=True)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(folder), str(builds), str(go)],
                              stdout=subprocess.PIPE, env=os.environ.copy()) for _ in range(count)]
    go.touch()
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        outs.append(json.loads(out))
    return outs, builds.read_text().split() if builds.exists() else []


def test_processes_get_the_planted_manifest_and_build_the_cache_once(tmp_path, cache):
    doc = planted_doc()
    plant(tmp_path / "ds", doc)
    outs, builds = run_children(tmp_path / "ds", tmp_path, 4)
    assert len(builds) == 1  # concurrent first opens: one process parsed and wrote it
    for out in outs:
        assert out["shards"] == doc["shards"]
        assert out["num_samples"] == doc["num_samples"] and out["classes"] == ["cat", "dög"]
    assert all(out["table"] == "ShardTable" for out in outs)
    assert len(cache_files(cache)) == 1
    later, builds = run_children(tmp_path / "ds", tmp_path, 1)  # a later process maps it
    assert len(builds) == 1 and later[0]["shards"] == doc["shards"] and later[0]["table"] == "ShardTable"


def test_mapped_manifest_equals_the_json_parsed_independently(tmp_path, cache):
    raw = plant(tmp_path / "ds", planted_doc())
    load_manifest(tmp_path / "ds", check_files=False)  # builds
    m = load_manifest(tmp_path / "ds", check_files=False)  # maps
    assert isinstance(m.shards, ShardTable)
    parsed = Manifest.from_json(json.loads(raw), "planted")
    assert m == parsed and parsed == m
    assert m.to_json() == parsed.to_json()
    assert m.shards[-1] == parsed.shards[-1] and m.shards[10:13] == parsed.shards[10:13]
    assert pickle.loads(pickle.dumps(m)) == parsed
    with pytest.raises(IndexError):
        m.shards[SHARDS]
    first, *rest = m.shards  # each entry is the caller's copy
    first.num_bytes = -1
    rest[0].extensions["jpg"] = -1
    assert m.shards[0].num_bytes == 1000 and m.shards[1].extensions == {"jpg": 2, "png": 2}
    assert [s.extensions for s in m.shards][5] == {"jpg": 1, "png": 2}


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_damaged_cache_file_is_rebuilt(tmp_path, cache, damage):
    doc = planted_doc()
    plant(tmp_path / "ds", doc)
    load_manifest(tmp_path / "ds", check_files=False)
    (path,) = cache_files(cache)
    good = path.read_bytes()
    bad = {"truncate": good[:len(good) // 2], "flip": good[:5000] + bytes([good[5000] ^ 1]) + good[5001:],
           "empty": b"", "garbage": os.urandom(len(good))}[damage]
    path.write_bytes(bad)
    m = load_manifest(tmp_path / "ds", check_files=False)
    assert shard_dicts(m) == doc["shards"]
    assert path.read_bytes() == good  # rebuilt


def test_out_of_range_record_with_a_matching_digest_is_refused(tmp_path):
    raw = json.dumps(planted_doc(shards=50)).encode()
    digest = hashlib.sha256(raw).digest()
    good = encode_manifest_table(Manifest.from_json(raw, "x"), digest)
    assert decode_manifest_table(good, digest) == Manifest.from_json(raw, "x")
    body = bytearray(good[:-32])
    head = 8 + 4 + 4 + 8 + 8 + 8 + 32
    meta_len = int.from_bytes(body[24:32], "little")
    name_off_at = head + meta_len + 24  # first record's name offset
    body[name_off_at:name_off_at + 4] = b"\xff\xff\xff\xff"
    crafted = bytes(body) + hashlib.sha256(body).digest()
    with pytest.raises(ValueError, match="out of range"):
        decode_manifest_table(crafted, digest)
    with pytest.raises(ValueError, match="another manifest"):
        decode_manifest_table(good, bytes(32))


def test_changed_manifest_is_not_served_from_the_old_cache(tmp_path, cache):
    plant(tmp_path / "ds", planted_doc(bytes_of_first=1000))
    assert load_manifest(tmp_path / "ds", check_files=False).shards[0].num_bytes == 1000
    plant(tmp_path / "ds", planted_doc(bytes_of_first=777))
    m = load_manifest(tmp_path / "ds", check_files=False)
    assert m.shards[0].num_bytes == 777 and m.shards[5].num_bytes == 782
    assert len(cache_files(cache)) == 2


def test_small_manifest_and_unsafe_folder_are_parsed_in_place(tmp_path):
    small = json.dumps(planted_doc(shards=20)).encode()
    m = parse_manifest(small, "small", cache_dir=tmp_path / "c1")
    assert not (tmp_path / "c1").exists() and isinstance(m.shards, list)
    open_folder = tmp_path / "c2"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o777)
    raw = json.dumps(planted_doc()).encode()
    m = parse_manifest(raw, "big", cache_dir=open_folder)
    assert isinstance(m.shards, list) and not list(open_folder.iterdir())
    assert shard_dicts(m) == planted_doc()["shards"]


def test_cache_off_parses_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFEED_MANIFEST_CACHE", "off")
    plant(tmp_path / "ds", planted_doc())
    assert isinstance(load_manifest(tmp_path / "ds", check_files=False).shards, list)


@pytest.fixture
def share_every_manifest(cache, monkeypatch) -> Path:
    from shardfeed.readers.storage import manifest_cache

    monkeypatch.setattr(manifest_cache, "MIN_SHARED_MANIFEST_BYTES", 0)
    return cache


def test_reader_on_the_mapped_manifest_reads_the_packed_samples_and_stops_on_a_rebuild(
        tiny_image_folder, mixed_case_folder, tmp_path, share_every_manifest):
    import torch

    from shardfeed.convert.write.pack import PackOptions, pack
    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import DatasetChangedError

    opts = dict(format="wds", max_count=16, workers=1, seed=0)
    pack(tiny_image_folder, tmp_path / "ds", PackOptions(**opts))
    files = sorted(p for p in tiny_image_folder.rglob("*") if p.is_file())
    planted = sorted(p.read_bytes() for p in files)
    open_dataset(str(tmp_path / "ds"))  # builds the compact form
    ds = open_dataset(str(tmp_path / "ds"), decode=False, shuffle=False)
    assert isinstance(ds.manifest.shards, ShardTable) and len(cache_files(share_every_manifest)) == 1
    assert sorted(s.data for s in ds) == planted
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn")  # the table pickled to workers
    assert sorted(s.data for s in loader) == planted
    it = iter(open_dataset(str(tmp_path / "ds"), decode=False, shuffle=False))
    next(it)
    pack(mixed_case_folder, tmp_path / "ds", PackOptions(**opts, overwrite=True))
    with pytest.raises(DatasetChangedError, match="changed since the dataset was opened"):
        for _ in it:
            pass
    rebuilt = open_dataset(str(tmp_path / "ds"), decode=False, shuffle=False)  # the new manifest, its own copy
    want = sorted(p.read_bytes() for p in mixed_case_folder.rglob("*") if p.is_file())
    assert sorted(s.data for s in rebuilt) == want and len(cache_files(share_every_manifest)) == 2


def test_manifest_over_http_is_shared_too(tmp_path, cache, start_http_server):
    from shardfeed.readers.storage.opener import open_location

    doc = planted_doc()
    plant(tmp_path / "ds", doc)
    url = start_http_server(tmp_path / "ds")
    open_location(url).load_manifest(check_files=False)
    m = open_location(url).load_manifest(check_files=False)
    assert isinstance(m.shards, ShardTable) and shard_dicts(m) == doc["shards"]
    assert len(cache_files(cache)) == 1


def test_a_lock_held_too_long_is_not_waited_for(tmp_path, monkeypatch):
    import fcntl

    from shardfeed.readers.storage import manifest_cache

    monkeypatch.setattr(manifest_cache, "MANIFEST_LOCK_TIMEOUT_S", 0.05)
    doc = planted_doc()
    raw = json.dumps(doc).encode()
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    with open(folder / f"{hashlib.sha256(raw).hexdigest()}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process building it, stuck
        m = parse_manifest(raw, "big", cache_dir=folder)
    assert isinstance(m.shards, list) and shard_dicts(m) == doc["shards"]
    assert cache_files(folder) == []


def plant_crafted_cache(tmp_path, cache, edit) -> tuple[dict, Path]:
    """The planted manifest, and its cache file rewritten with ``edit`` applied to a parsed copy
    (a correct outer digest and manifest digest: only the content is hostile)."""
    doc = planted_doc()
    raw = plant(tmp_path / "ds", doc)
    digest = hashlib.sha256(raw).digest()
    hostile = Manifest.from_json(raw, "x")
    hostile.shards = list(hostile.shards)
    edit(hostile)
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = cache / f"{digest.hex()}.sfman"
    path.write_bytes(encode_manifest_table(hostile, digest))
    return doc, path


@pytest.mark.parametrize("field", ["name", "index"])
@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "a\0b", "s3://bucket/x.tar", ".hidden"])
def test_cache_file_naming_a_file_outside_the_dataset_is_refused(tmp_path, cache, field, name):
    def edit(m):
        setattr(m.shards[1], field, name)  # shard 1 has an offset index

    doc, _ = plant_crafted_cache(tmp_path, cache, edit)
    m = load_manifest(tmp_path / "ds", check_files=False)
    assert m.shards[0].to_json() == doc["shards"][0]
    with pytest.raises(ManifestError, match="manifest cache"):
        m.shards[1]
    with pytest.raises(ManifestError, match="manifest cache"):
        list(m.shards)


@pytest.mark.parametrize("edit", [
    lambda m: setattr(m, "classes", 5),
    lambda m: setattr(m, "class_to_idx", {"cat": 0, "dög": 0}),
    lambda m: setattr(m, "format", ["webdataset"]),
    lambda m: setattr(m.shards[1], "extensions", {"jpg": -4}),
    lambda m: setattr(m, "fields", {"../x": {"member": "../x", "count": 1, "missing": 0}}),
], ids=["classes", "class_to_idx", "format", "extensions", "fields"])
def test_cache_file_with_fields_a_manifest_may_not_hold_is_rebuilt(tmp_path, cache, edit):
    doc, path = plant_crafted_cache(tmp_path, cache, edit)
    m = load_manifest(tmp_path / "ds", check_files=False)
    assert (m.classes, m.class_to_idx, m.format) == (doc["classes"], doc["class_to_idx"], doc["format"])
    assert {k: (v["count"], v["missing"]) for k, v in m.fields.items()} == {"txt": (2, 1)}
    assert shard_dicts(m) == doc["shards"]
    assert m.shards[1].extensions == doc["shards"][1]["extensions"]
    raw = (tmp_path / "ds" / "manifest.json").read_bytes()
    rebuilt = decode_manifest_table(path.read_bytes(), hashlib.sha256(raw).digest())
    assert rebuilt.classes == doc["classes"]


def test_eviction_removes_only_the_files_the_cache_names(tmp_path, cache, monkeypatch):
    from shardfeed.readers.storage import manifest_cache

    monkeypatch.setattr(manifest_cache, "MAX_CACHED_MANIFESTS", 1)
    cache.mkdir(mode=0o700, parents=True)
    mine = {"thesis.sfman": b"chapter 1", "thesis.lock": b"keep", f"{'A' * 64}.sfman": b"upper-case hex"}
    for name, data in mine.items():
        (cache / name).write_bytes(data)
        os.utime(cache / name, ns=(1, 1))  # older than any cache file
    plant(tmp_path / "a", planted_doc(bytes_of_first=1))
    load_manifest(tmp_path / "a", check_files=False)
    plant(tmp_path / "b", planted_doc(bytes_of_first=2))
    load_manifest(tmp_path / "b", check_files=False)
    raw_b = (tmp_path / "b" / "manifest.json").read_bytes()
    assert [p.name for p in cache_files(cache) if p.name not in mine] == [f"{hashlib.sha256(raw_b).hexdigest()}.sfman"]
    assert {n: (cache / n).read_bytes() for n in mine} == mine
