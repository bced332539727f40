"""`shardfeed pack --format lmdb` and the LMDB writer: byte-exact round trip, a map that grows,
resume after kill -9, read-only opening, no pickle.

Expectations come from the source folders themselves (file bytes; label = index of the class
folder among the sorted class folders), and records are read back with ``lmdb`` and ``msgpack``
alone (the documented layout), not with shardfeed's readers — except where the shared read-only
helpers are the thing under test.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import lmdb
import msgpack
import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.writers.lmdb import LmdbWriter
from shardfeed.convert.writers.lmdb_store import PACK_STATE_KEY
from shardfeed.convert.write.faults import FaultHooks
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.readers.errors import IncompleteDatasetError
from shardfeed.readers.format.manifest import LMDB_MANIFEST_KEY, Sample, decode_record
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.storage.lmdb_io import open_lmdb_readonly, read_lmdb_manifest

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}


def _noise(seed: int, w: int, h: int, fmt: str) -> bytes:
    """Random-noise image bytes (noise does not compress: the file is about w*h*3 bytes as PNG)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    img = Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
    img.save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {"compress_level": 1}))
    return buf.getvalue()


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def expected_from_folder(root: Path) -> dict[str, tuple[bytes, int, str]]:
    """``{relative path: (bytes, label, class)}`` as torchvision's ImageFolder would see the folder."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    out = {}
    for label, cls in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith(".") or Path(name).suffix.lower() not in IMAGE_EXTS:
                    continue
                p = Path(dirpath) / name
                out[p.relative_to(root).as_posix()] = (p.read_bytes(), label, cls)
    return out


def read_db_plain(out: Path) -> dict[bytes, bytes]:
    """Every key/value of ``out/data.mdb``, read with the lmdb module only (read-only, no lock)."""
    env = lmdb.open(str(out), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def sample_records(db: dict[bytes, bytes]) -> dict[bytes, dict]:
    """Decode the sample records with msgpack alone (the README's recipe)."""
    return {k: msgpack.unpackb(v, raw=False) for k, v in db.items()
            if not k.startswith((b"__shardfeed_", b"!shardfeed_"))}


def check_round_trip(src: Path, out: Path) -> dict[bytes, dict]:
    expected = expected_from_folder(src)
    db = read_db_plain(out)
    recs = sample_records(db)
    assert len(recs) == len(expected)
    seen = set()
    for key, rec in recs.items():
        data, label, cls = expected[rec["meta"]["path"]]
        assert rec["v"] == 1
        assert rec["key"].encode() == key and key.isdigit()
        assert rec["data"] == data, rec["meta"]["path"]
        assert rec["label"] == label and rec["meta"]["class"] == cls
        assert rec["crc32"] == zlib.crc32(data)
        suffix = Path(rec["meta"]["path"]).suffix.lower().lstrip(".")
        assert rec["ext"] == {"jpeg": "jpg", "tiff": "tif"}.get(suffix, suffix)
        seen.add(rec["meta"]["path"])
    assert seen == set(expected)
    # the manifest: written beside the database and inside it, the same, with the file's size
    manifest_json = (out / "manifest.json").read_bytes()
    assert db[LMDB_MANIFEST_KEY] == manifest_json
    m = json.loads(manifest_json)
    assert m["format"] == "lmdb" and m["num_samples"] == len(expected)
    assert m["classes"] == sorted({c for _, _, c in expected.values()})
    assert m["shards"] == [{"name": "data.mdb", "num_samples": len(expected),
                            "num_bytes": (out / "data.mdb").stat().st_size}]
    assert PACK_STATE_KEY not in db
    return recs


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes, JPEG/PNG, an upper-case extension, a nested folder, a hidden file and a text file."""
    root = tmp_path_factory.mktemp("lmdb_src")
    files = {}
    for i in range(45):
        cls = ["ant", "bee", "cat"][i % 3]
        fmt = "PNG" if i % 4 == 0 else "JPEG"
        ext = {0: "png", 1: "jpg", 2: "JPEG", 3: "jpg"}[i % 4]
        sub = "deep/er/" if i % 7 == 0 else ""
        files[f"{cls}/{sub}img_{i:03d}.{ext}"] = _noise(i, 20 + i % 30, 16 + i % 11, fmt)
    files["cat/.hidden.jpg"] = _noise(99, 8, 8, "JPEG")
    files["bee/readme.txt"] = b"not an image"
    return _write(root, files)


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lmdb_out") / "db"
    pack(folder, out, PackOptions(format="lmdb", workers=1))
    return out


def test_round_trip_every_image_and_label(folder, packed):
    recs = check_round_trip(folder, packed)
    assert len(recs) == 45


@pytest.mark.multiprocess
def test_workers_give_the_same_database(folder, packed, tmp_path):
    out = tmp_path / "j2"
    report = pack(folder, out, PackOptions(format="lmdb", workers=2))
    check_round_trip(folder, out)
    assert (out / "data.mdb").read_bytes() == (packed / "data.mdb").read_bytes()
    ratio = report.extra["lmdb_file_to_payload_ratio"]
    assert ratio == pytest.approx((out / "data.mdb").stat().st_size / report.input_bytes, rel=1e-3)
    # the local executor counts the reader tasks it ran (chunks of at most 256 samples)
    n = report.num_samples + len(report.skipped)
    assert report.extra["executor"] == "local" and -(-n // 256) <= report.extra["num_tasks"] <= n


def test_tiny_map_grows_instead_of_failing(tmp_path):
    src = _write(tmp_path / "src", {f"c{i % 2}/n{i:02d}.png": _noise(i, 256, 256, "PNG") for i in range(20)})
    sizes = [p.stat().st_size for p in src.rglob("*.png")]
    assert min(sizes) > 150_000  # ~200 KB each: noise does not compress
    report = pack(src, tmp_path / "out", PackOptions(format="lmdb", workers=1, map_size=64 * 1024))
    assert report.extra["lmdb_map_resizes"] >= 1
    check_round_trip(src, tmp_path / "out")


@pytest.mark.parametrize("map_size", [None, 64 * 1024])
def test_small_first_image_then_large_ones(tmp_path, map_size):
    files = {"a/000_small.png": _noise(0, 4, 4, "PNG")}
    files.update({f"a/{i:03d}_large.jpg": _noise(i, 300, 260, "JPEG") for i in range(1, 9)})
    files["b/001_large.png"] = _noise(50, 280, 280, "PNG")
    src = _write(tmp_path / "src", files)
    out = tmp_path / "out"
    pack(src, out, PackOptions(format="lmdb", workers=1, shuffle=False, map_size=map_size))
    recs = check_round_trip(src, out)
    assert recs[min(recs)]["meta"]["path"] == "a/000_small.png"  # the small one really came first


def test_skip_lists_the_file_and_keeps_the_rest(tmp_path):
    files = {f"c/ok_{i}.jpg": _noise(i, 16, 16, "JPEG") for i in range(6)}
    files["c/broken.jpg"] = b"\xff\xd8\xff\xe0 this is not a jpeg"
    src = _write(tmp_path / "src", files)
    out = tmp_path / "out"
    report = pack(src, out, PackOptions(format="lmdb", workers=1, on_error="skip", decode_check=True))
    assert [s["path"] for s in report.skipped] == ["c/broken.jpg"]
    assert report.skipped[0]["key"].isdigit() and report.skipped[0]["reason"]
    recs = sample_records(read_db_plain(out))
    assert sorted(r["meta"]["path"] for r in recs.values()) == sorted(p for p in files if "ok_" in p)
    assert report.skipped[0]["key"].encode() not in recs
    assert json.loads((out / "manifest.json").read_text())["skipped"] == report.skipped


def test_no_pickle_anywhere(packed, monkeypatch):
    db = read_db_plain(packed)

    def refuse(*a, **k):
        raise AssertionError("pickle must never be used to load a record")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    n = 0
    for key, value in db.items():
        assert not value.startswith(b"\x80"), f"{key!r} looks like a pickle"
        if key == LMDB_MANIFEST_KEY:
            json.loads(value)
            continue
        rec = decode_record(value, source=str(key))
        assert rec["key"].encode() == key
        n += 1
    env = open_lmdb_readonly(packed)
    try:
        assert read_lmdb_manifest(env).num_samples == n
    finally:
        env.close()


def _chmod_tree(root: Path, dir_mode: int, file_mode: int) -> None:
    for p in root.rglob("*"):
        p.chmod(file_mode if p.is_file() else dir_mode)
    root.chmod(dir_mode)


def _read_all_sha256(path: str) -> str:
    env = open_lmdb_readonly(path)
    try:
        manifest = read_lmdb_manifest(env)
        h = hashlib.sha256()
        with env.begin() as txn:
            for k, v in txn.cursor():
                if k != LMDB_MANIFEST_KEY:
                    rec = decode_record(bytes(v), source=str(k))
                    h.update(bytes(k) + rec["data"] + str(rec["label"]).encode())
        return f"{manifest.num_samples}:{h.hexdigest()}"
    finally:
        env.close()


def test_read_only_copy_opens_and_reads(folder, packed, call_on_read_only_folder):
    expected = expected_from_folder(folder)
    records = sample_records(read_db_plain(packed))
    h = hashlib.sha256()
    for k in sorted(records):
        h.update(k + expected[records[k]["meta"]["path"]][0] + str(expected[records[k]["meta"]["path"]][1]).encode())
    want = f"{len(expected)}:{h.hexdigest()}"
    ro = Path(tempfile.mkdtemp(prefix="shardfeed-ro-", dir="/tmp"))
    try:
        shutil.copy2(packed / "data.mdb", ro / "data.mdb")  # no lock.mdb, and none can be created
        shutil.copy2(packed / "manifest.json", ro / "manifest.json")
        _chmod_tree(ro, 0o555, 0o444)
        assert call_on_read_only_folder(_read_all_sha256, ro) == want
        assert sorted(p.name for p in ro.iterdir()) == ["data.mdb", "manifest.json"]
    finally:
        _chmod_tree(ro, 0o755, 0o644)
        shutil.rmtree(ro)


def test_unfinished_database_is_refused(tmp_path):
    out = tmp_path / "w"
    with pytest.raises(RuntimeError):
        with LmdbWriter(out, classes=["a"]) as w:
            w.write(Sample("000000000", b"abc", "jpg", 0, {"path": "a/x.jpg", "class": "a"}))
            raise RuntimeError("interrupted")
    assert LMDB_MANIFEST_KEY not in read_db_plain(out)
    env = open_lmdb_readonly(out)
    try:
        with pytest.raises(IncompleteDatasetError, match="--resume"):
            read_lmdb_manifest(env)
    finally:
        env.close()
    with pytest.raises(IncompleteDatasetError):
        load_manifest(out)
    with pytest.raises(FileNotFoundError):
        open_lmdb_readonly(tmp_path / "nothing")


def test_writer_protocol(tmp_path):
    out = tmp_path / "w"
    samples = [Sample(f"{i:09d}", _noise(i, 10, 10, "PNG"), "png", i % 2, {"path": f"c{i % 2}/{i}.png",
                                                                           "class": f"c{i % 2}"}) for i in range(7)]
    with LmdbWriter(out, classes=["c0", "c1"], commit_count=2) as w:
        for s in samples:
            w.write(s)
        with pytest.raises(ValueError, match="not after"):
            w.write(samples[0])
    m = w.close()
    assert m.num_samples == 7 and m.shards[0].num_bytes == (out / "data.mdb").stat().st_size
    db = read_db_plain(out)
    assert db[LMDB_MANIFEST_KEY] == (out / "manifest.json").read_bytes()
    recs = sample_records(db)
    assert [(r["key"], r["data"], r["label"], r["ext"]) for r in recs.values()] == \
        [(s.key, s.data, s.label, s.ext) for s in samples]
    with pytest.raises(FileExistsError):
        LmdbWriter(out, classes=["c0"])


def test_compaction_keeps_records(folder, tmp_path, monkeypatch):
    import shardfeed.convert.writers.lmdb_store as store

    monkeypatch.setattr(store, "COMPACT_MIN_FREE_BYTES", 0)
    monkeypatch.setattr(store, "COMPACT_MIN_FREE_FRACTION", 0.0)
    report = pack(folder, tmp_path / "out", PackOptions(format="lmdb", workers=1,
                                                        faults=FaultHooks(lmdb_commit_count=3)))
    assert report.extra["lmdb_compacted"] is True
    check_round_trip(folder, tmp_path / "out")
    assert not list((tmp_path / "out").glob(".*"))


def test_cli_refuses_tar_only_options(folder, tmp_path):
    r = subprocess.run([*SHARDFEED, "pack", str(folder), str(tmp_path / "o"), "--format", "lmdb",
                        "--max-count", "5"], capture_output=True, text=True)
    assert r.returncode != 0 and "--max-count" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def kill_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lmdb_kill_src")
    files = {f"k{i % 4}/img_{i:03d}.{'png' if i % 5 == 0 else 'jpg'}":
             _noise(i, 40, 30, "PNG" if i % 5 == 0 else "JPEG") for i in range(160)}
    files["k1/broken_a.jpg"] = b"\xff\xd8\xff not a jpeg"
    files["k3/broken_b.png"] = b"\x89PNG\r\n\x1a\n truncated"
    return _write(root, files)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_after_kill_9_gives_the_same_records(hooked_cli, kill_folder, tmp_path, lmdb_entries):
    args = ["--format", "lmdb", "-j", "2", "--on-error", "skip", "--decode-check"]
    ref = tmp_path / "ref"
    pack(kill_folder, ref, PackOptions(format="lmdb", workers=1, on_error="skip", decode_check=True))
    out = tmp_path / "killed"
    hooks = {"lmdb_commit_count": 5, "lmdb_commit_delay_s": 0.1}
    proc = subprocess.Popen([*hooked_cli(hooks), "-q", "pack", str(kill_folder), str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and lmdb_entries(out) < 30 and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the pack finished before it could be killed: " + proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = lmdb_entries(out)
    assert 30 <= killed_at < 160
    assert not (out / "manifest.json").exists(), "a killed pack must not look complete"
    assert LMDB_MANIFEST_KEY not in read_db_plain(out)
    with pytest.raises(IncompleteDatasetError):
        load_manifest(out)

    r = subprocess.run([*SHARDFEED, "pack", str(kill_folder), str(out), *args, "--resume", "--json", "-"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["shards_resumed"] == 1
    assert report["extra"]["lmdb_records_resumed"] >= 29  # one record of the killed run may be the state key

    got, want = read_db_plain(out), read_db_plain(ref)
    assert {k: v for k, v in got.items() if k != LMDB_MANIFEST_KEY} == \
           {k: v for k, v in want.items() if k != LMDB_MANIFEST_KEY}
    m_got, m_want = json.loads(got[LMDB_MANIFEST_KEY]), json.loads(want[LMDB_MANIFEST_KEY])
    for m in (m_got, m_want):
        m["shards"][0].pop("num_bytes")
        for item in m["skipped"]:  # decode errors may name a memory address (BytesIO repr)
            assert item.pop("reason")
    assert m_got == m_want
    assert sorted(s["path"] for s in m_got["skipped"]) == ["k1/broken_a.jpg", "k3/broken_b.png"]
    assert got[LMDB_MANIFEST_KEY] == (out / "manifest.json").read_bytes()
    check_round_trip_paths = {r["meta"]["path"] for r in sample_records(got).values()}
    assert check_round_trip_paths == set(expected_from_folder(kill_folder)) - {"k1/broken_a.jpg",
                                                                                "k3/broken_b.png"}


def test_resume_after_the_final_commit(folder, packed, tmp_path, monkeypatch):
    """Killed between the database's final transaction and manifest.json: resume just finishes."""
    from shardfeed.readers.format import manifest as fmt

    out = tmp_path / "out"
    real_write = fmt.Manifest.write

    def dies(self, root):
        raise OSError("simulated crash before manifest.json")

    monkeypatch.setattr(fmt.Manifest, "write", dies)
    with pytest.raises(OSError, match="simulated"):
        pack(folder, out, PackOptions(format="lmdb", workers=1))
    assert LMDB_MANIFEST_KEY in read_db_plain(out) and not (out / "manifest.json").exists()
    monkeypatch.setattr(fmt.Manifest, "write", real_write)
    report = pack(folder, out, PackOptions(format="lmdb", workers=1, resume=True))
    assert report.extra["lmdb_records_resumed"] == 45 and report.shards_resumed == 1
    check_round_trip(folder, out)
    assert read_db_plain(out) == read_db_plain(packed)


def test_failure_keeps_committed_batches_for_resume(tmp_path, monkeypatch):
    files = {f"c/{i:02d}.jpg": _noise(i, 16, 16, "JPEG") for i in range(12)}
    files["c/05_broken.jpg"] = b"\xff\xd8\xff not a jpeg"
    src = _write(tmp_path / "src", files)
    out = tmp_path / "out"
    opts = dict(format="lmdb", workers=1, shuffle=False, decode_check=True, faults=FaultHooks(lmdb_commit_count=2))
    with pytest.raises(ValueError, match="05_broken.jpg"):
        pack(src, out, PackOptions(**opts))
    # the six files before the broken one were committed before the error was raised
    assert sorted(r["meta"]["path"] for r in sample_records(read_db_plain(out)).values()) == \
        [f"c/{i:02d}.jpg" for i in range(6)]
    (src / "c/05_broken.jpg").unlink()
    # the plan changed (a file is gone): resume refuses, overwrite rebuilds
    with pytest.raises(ValueError, match=r"1 file\(s\) removed: c/05_broken\.jpg"):
        pack(src, out, PackOptions(**opts, resume=True))
    pack(src, out, PackOptions(**opts, overwrite=True))
    check_round_trip(src, out)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 300_000])
def test_record_bytes_are_the_documented_msgpack_map(size):
    """encode_record assembles the record without packing the image twice: the bytes must be
    exactly msgpack's encoding of the documented map, field order included."""
    import zlib

    import msgpack

    from shardfeed.readers.format.manifest import LMDB_RECORD_VERSION, encode_record

    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    meta = {"path": "ünï/cat 1.jpg", "class": "ünï"}
    want = msgpack.packb({"v": LMDB_RECORD_VERSION, "key": "000000042", "ext": "jpg", "label": 7, "meta": meta,
                          "crc32": zlib.crc32(data), "data": data}, use_bin_type=True)
    assert encode_record("000000042", data, "jpg", 7, meta) == want
