"""Layout packs (a labels file with sidecar files) on every executor: ``--workers 2`` and
``--executor ray`` write the bytes of the one-process pack, and those bytes hold the planted
images, labels and sidecar files (read back with ``tarfile``).

Expectations are the planted files: each image's bytes, its label row (classes sorted by name),
and its ``.txt``/``.json`` sidecar bytes.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.layouts import LayoutOptions
from shardfeed.convert.write.pack import PackOptions, pack

LABELS = ("cat", "dog", "emu")


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(8 + seed % 5, 9, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, Path, dict[str, dict]]:
    """``(SRC, labels file, {rel: {"image", "label", "txt"?, "json"?}})``: 17 images, some in a
    sub-folder, some named ``x.v2.jpg``; every other one has a ``.txt``, every fifth a ``.json``."""
    root = tmp_path_factory.mktemp("layout_exec")
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    want: dict[str, dict] = {}
    rows = ["path,label"]
    for i in range(17):
        rel = f"{'sub/' if i % 3 == 0 else ''}img{i:02d}.{'v2.' if i % 7 == 0 else ''}jpg"
        item = {"image": _jpeg(i), "label": LABELS[i % 3]}
        (src / rel).write_bytes(item["image"])
        stem = rel[:-len(".jpg")]
        if i % 2 == 0:
            item["txt"] = f"caption {i} ".encode() * (i % 4 + 1)
            (src / f"{stem}.txt").write_bytes(item["txt"])
        if i % 5 == 0:
            item["json"] = json.dumps({"i": i}).encode()
            (src / f"{stem}.json").write_bytes(item["json"])
        rows.append(f"{rel},{item['label']}")
        want[rel] = item
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return src, root / "labels.csv", want


def _options(**kw) -> PackOptions:
    return PackOptions(format="wds", max_count=3, **kw)


def _layout(labels: Path) -> LayoutOptions:
    return LayoutOptions(labels_file=labels, sidecars=("txt", "json"))


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _read_back(out: Path) -> dict[str, dict]:
    """``{path: {"image", "label", "txt"?, "json"?}}`` from the shards' members."""
    got: dict[str, dict] = {}
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            key, ext = name.split(".", 1)
            if ext != "json":
                continue
            meta = json.loads(data)
            item = {"image": members[f"{key}.jpg"], "label": LABELS[int(members[f"{key}.cls"])]}
            for field, member in (("txt", "txt"), ("json", "sidecar.json")):
                if f"{key}.{member}" in members:
                    item[field] = members[f"{key}.{member}"]
            got[meta["path"]] = item
    return got


@pytest.fixture(scope="module")
def one_process(planted, tmp_path_factory) -> Path:
    src, labels, _ = planted
    out = tmp_path_factory.mktemp("j1") / "out"
    pack(src, out, _options(workers=1), layout=_layout(labels))
    return out


def test_a_labels_file_and_sidecars_pack_holds_the_planted_files(planted, one_process):
    _, _, want = planted
    assert _read_back(one_process) == want
    assert len(list(one_process.glob("*.tar"))) == 6  # 17 samples, 3 a shard


@pytest.mark.multiprocess
def test_two_workers_write_the_bytes_of_one(planted, one_process, tmp_path):
    src, labels, _ = planted
    report = pack(src, tmp_path / "j2", _options(workers=2), layout=_layout(labels))
    assert _files(tmp_path / "j2") == _files(one_process)
    assert report.workers == 2 and report.extra["num_tasks"] == 6


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for the module."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_ray_writes_the_bytes_of_one_process(ray_cluster, planted, one_process, tmp_path):
    src, labels, _ = planted
    report = pack(src, tmp_path / "ray", _options(workers=2, executor="ray"), layout=_layout(labels))
    assert _files(tmp_path / "ray") == _files(one_process)
    assert _read_back(tmp_path / "ray") == planted[2]
    assert report.extra["executor"] == "ray" and report.extra["num_tasks"] == 6


def _lmdb_samples(out: Path) -> dict[str, dict]:
    """``{path: {"image", "label", "txt"?, "json"?}}`` read back through the readers."""
    from shardfeed.readers import open_dataset

    got = {}
    for s, fields in open_dataset(out, decode=False, shuffle=False, fields=("txt", "json")):
        item = {"image": bytes(s.data), "label": LABELS[s.label]}
        item.update({f: v.encode() if isinstance(v, str) else v for f, v in fields.items() if v is not None})
        got[s.meta["path"]] = item
    return got


def test_an_interrupted_lmdb_layout_pack_resumes_after_its_last_commit(planted, tmp_path, monkeypatch):
    """Stopped at its 12th file read with a commit every 2 records, ``--resume`` keeps the
    committed records (it reads fewer files than a whole pack) and ends holding every planted sample."""
    from shardfeed.convert.write import layout_shards
    from shardfeed.convert.writers.lmdb import LmdbWriter

    src, labels, want = planted
    monkeypatch.setitem(LmdbWriter.__init__.__kwdefaults__, "commit_count", 2)
    real_read, calls = layout_shards.read_checked, {"n": 0}

    def counted(*args):
        calls["n"] += 1
        if calls["n"] == 12 and calls.get("stop"):
            raise KeyboardInterrupt
        return real_read(*args)

    monkeypatch.setattr(layout_shards, "read_checked", counted)
    out = tmp_path / "lmdb"
    options = dict(format="lmdb", workers=1)
    calls["stop"] = True
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, PackOptions(**options), layout=_layout(labels))
    assert (out / "data.mdb").exists() and not (out / "manifest.json").exists()
    calls.update(n=0, stop=False)
    report = pack(src, out, PackOptions(**options, resume=True), layout=_layout(labels))
    total_reads = len(want) + sum(("txt" in v) + ("json" in v) for v in want.values())
    assert 0 < calls["n"] < total_reads - 4  # the committed samples were not read again
    assert report.num_samples == len(want)
    got = _lmdb_samples(out)
    assert {p: {k: v for k, v in item.items() if k != "json"} for p, item in got.items()} == {
        p: {k: v for k, v in item.items() if k != "json"} for p, item in want.items()}
    assert {p: item["json"] for p, item in got.items() if "json" in item} == {
        p: json.loads(item["json"]) for p, item in want.items() if "json" in item}
    fields = json.loads((out / "manifest.json").read_text())["fields"]
    assert fields["txt"]["count"] == sum("txt" in v for v in want.values())


@pytest.mark.multiprocess
def test_a_skipped_image_leaves_the_same_shards_for_one_and_two_workers(planted, tmp_path):
    """A broken image (``on_error="skip"``) is listed with its key and leaves its planned shard one
    sample short; the other samples are the planted ones, the same bytes for any worker count."""
    import shutil

    src, labels, want = planted
    broken = tmp_path / "src"
    shutil.copytree(src, broken)
    (broken / "img04.jpg").write_bytes(b"")  # empty: not an image
    outs = {}
    for j in (1, 2):
        outs[j] = tmp_path / f"j{j}"
        report = pack(broken, outs[j], _options(workers=j, on_error="skip"), layout=_layout(labels))
        assert [s["path"] for s in report.skipped] == ["img04.jpg"] and report.skipped[0]["key"] is not None
    assert _files(outs[2]) == _files(outs[1])
    assert _read_back(outs[1]) == {rel: item for rel, item in want.items() if rel != "img04.jpg"}


@pytest.mark.multiprocess
def test_a_reencoded_layout_pack_writes_the_same_bytes_for_one_and_two_workers(planted, tmp_path):
    """Re-encoded images (cut from their encoded sizes): the same shards for any worker count; the
    sidecar files are stored as they are and every image is the resized one."""
    src, labels, want = planted
    outs = {}
    for j in (1, 2):
        outs[j] = tmp_path / f"j{j}"
        pack(src, outs[j], _options(workers=j, reencode={"resize": 6}, max_bytes=8192), layout=_layout(labels))
    assert _files(outs[2]) == _files(outs[1])
    got = _read_back(outs[1])
    assert {p: {k: v for k, v in item.items() if k != "image"} for p, item in got.items()} == {
        p: {k: v for k, v in item.items() if k != "image"} for p, item in want.items()}
    assert all(min(Image.open(io.BytesIO(item["image"])).size) == 6 for item in got.values())


def test_an_interrupted_reencoded_layout_pack_resumes_to_the_same_bytes(planted, tmp_path, monkeypatch):
    """Stopped at its 30th file read (chunks of 2 samples: some 3-sample shards finished),
    ``--resume`` keeps the finished shards (it reads fewer files than a whole pack) and ends with
    the bytes of an uninterrupted pack."""
    from shardfeed.convert.write import layout_shards
    from shardfeed.convert.writers import webdataset

    monkeypatch.setattr(webdataset, "CHUNK_SAMPLES", 2)

    src, labels, want = planted
    options = dict(workers=1, reencode={"resize": 6})
    pack(src, tmp_path / "whole", _options(**options), layout=_layout(labels))
    real_read, calls = layout_shards.read_checked, {"n": 0, "stop": True}

    def counted(*args):
        calls["n"] += 1
        if calls["n"] == 30 and calls["stop"]:
            raise KeyboardInterrupt
        return real_read(*args)

    monkeypatch.setattr(layout_shards, "read_checked", counted)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, _options(**options), layout=_layout(labels))
    assert (out / "shard-000000.tar").exists() and not (out / "manifest.json").exists()
    calls.update(n=0, stop=False)
    pack(src, out, _options(**options, resume=True), layout=_layout(labels))
    total_reads = len(want) + sum(("txt" in v) + ("json" in v) for v in want.values())
    assert 0 < calls["n"] < total_reads
    whole = _files(tmp_path / "whole")
    assert sorted(_files(out)) == sorted(whole)
    # the dataset card names its folder; the shards, indexes and manifest are the same
    assert {n: b for n, b in _files(out).items() if n != "README.md"} == {
        n: b for n, b in whole.items() if n != "README.md"}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_lmdb_layout_pack_is_the_same_for_one_worker_two_and_ray(ray_cluster, planted, tmp_path):
    src, labels, want = planted
    outs = {}
    for name, kw in {"j1": dict(workers=1), "j2": dict(workers=2), "ray": dict(workers=2, executor="ray")}.items():
        outs[name] = tmp_path / name
        report = pack(src, outs[name], PackOptions(format="lmdb", **kw), layout=_layout(labels))
        assert report.extra["executor"] == kw.get("executor", "local")
    assert _lmdb_samples(outs["j1"]) == {
        p: {**item, "json": json.loads(item["json"])} if "json" in item else item for p, item in want.items()}
    for name in ("j2", "ray"):
        assert (outs[name] / "data.mdb").read_bytes() == (outs["j1"] / "data.mdb").read_bytes()
        assert (outs[name] / "manifest.json").read_bytes() == (outs["j1"] / "manifest.json").read_bytes()
