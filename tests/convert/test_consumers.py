"""Other tools read a packed mixed JPEG/PNG dataset exactly: NVIDIA DALI
(with its own wds2idx index beside shardfeed's), wids (shardindex.json) and Hugging Face
``datasets`` (the dataset card). Right values come from the source folder: every image once,
bytes equal to its file, label = its folder's index in sorted order.

Each consumer is an optional package (``pip install -e .[interop]``, which ``make install``
does); a test whose consumer is missing is skipped naming it. Reproduce one consumer's check:
``.venv/bin/python -P -m pytest -q tests/convert/test_consumers.py -k dali`` (``wids``, ``datasets``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack

pytestmark = pytest.mark.interop

_INSTALL = "install the interop extra: pip install -e '.[interop]' (make install does)"


def _image(seed: int, fmt: str, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    shape = (6 + seed % 5, 7 + seed % 3) + ((3,) if mode == "RGB" else ())
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=shape, dtype=np.uint8), mode).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """40 images in 3 classes, a third PNG (some greyscale), the rest JPEG (``.jpg`` and ``.JPEG``)."""
    root = tmp_path_factory.mktemp("mixed") / "src"
    for i in range(40):
        cls = ("bird", "cat", "dog")[i % 3]
        if i % 3 == 1:
            name, data = f"p{i:02d}.png", _image(i, "PNG", "L" if i % 2 else "RGB")
        else:
            name, data = f"j{i:02d}." + ("JPEG" if i % 5 == 0 else "jpg"), _image(i, "JPEG")
        (root / cls).mkdir(parents=True, exist_ok=True)
        (root / cls / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def expected(source) -> dict[str, tuple[bytes, int]]:
    classes = sorted(d.name for d in source.iterdir() if d.is_dir())
    return {f"{c}/{p.name}": (p.read_bytes(), classes.index(c))
            for c in classes for p in sorted((source / c).iterdir())}


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "wds"
    pack(source, out, PackOptions(max_count=7, workers=1, seed=3))
    return out


def _ext(path: str) -> str:
    e = path.rsplit(".", 1)[1].lower()
    return {"jpeg": "jpg"}.get(e, e)


def test_manifest_records_the_extensions_present(packed, expected):
    m = json.loads((packed / "manifest.json").read_text())
    counts: dict[str, int] = {}
    for p in expected:
        counts[_ext(p)] = counts.get(_ext(p), 0) + 1
    assert m["extensions"] == counts == {"jpg": 27, "png": 13}
    # and `inspect` shows them
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "inspect", str(packed)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "jpg (27), png (13)" in r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# NVIDIA DALI

def _wds2idx() -> str:
    pytest.importorskip("nvidia.dali", reason=f"NVIDIA DALI is not installed; {_INSTALL}")
    exe = shutil.which("wds2idx") or str(Path(sys.executable).parent / "wds2idx")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"DALI's wds2idx command is not installed; {_INSTALL}")
    return exe


def _dali_read(tars: list[Path], exts: list[str], index_paths: list[Path] | None) -> list[tuple[bytes, int, dict]]:
    """Every sample of ``tars`` through DALI's webdataset reader on the CPU: (image, cls, json)."""
    from nvidia.dali import fn, pipeline_def

    batch = 4

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None)  # CPU only
    def pipe():
        kw = {"index_paths": [str(i) for i in index_paths]} if index_paths else {}
        image, cls, meta = fn.readers.webdataset(paths=[str(t) for t in tars], ext=[";".join(exts), "cls", "json"],
                                                 missing_component_behavior="error", random_shuffle=False,
                                                 name="reader", **kw)
        return image, cls, meta

    p = pipe()
    p.build()
    n = p.epoch_size("reader")
    got = []
    while len(got) < n:
        images, classes, metas = p.run()
        for i in range(len(images)):
            got.append((bytes(np.array(images.at(i))), int(bytes(np.array(classes.at(i)))),
                        json.loads(bytes(np.array(metas.at(i))))))
    return got[:n]


def test_dali_reads_every_sample_once_with_its_own_index_beside_shardfeeds(packed, expected, tmp_path):
    exe = _wds2idx()
    d = tmp_path / "wds"
    shutil.copytree(packed, d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    tars = sorted(d.glob("*.tar"))
    for t in tars:  # DALI's own tool writes shard-NNNNNN.idx: no longer shardfeed's file
        subprocess.run([exe, str(t)], check=True, capture_output=True)
    dali_idx = [t.with_suffix(".idx") for t in tars]
    assert all(p.read_bytes().startswith(b"v1.") for p in dali_idx)
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.suffix != ".idx"} == before
    from shardfeed.convert.tools.check import check_dataset

    assert check_dataset(d).ok  # shardfeed's dataset is untouched by DALI's indexes
    m = json.loads((d / "manifest.json").read_text())
    got = _dali_read(tars, sorted(m["extensions"]), dali_idx)
    assert len(got) == len(expected)
    assert sorted(meta["path"] for _, _, meta in got) == sorted(expected)  # each sample once
    for data, label, meta in got:
        assert (data, label) == expected[meta["path"]]


def test_shardfeed_index_never_overwrites_dalis_index(packed, expected, tmp_path):
    """Shards with DALI indexes and no manifest: `shardfeed index` writes its .sfidx beside them
    and leaves every .idx byte as DALI wrote it."""
    exe = _wds2idx()
    d = tmp_path / "foreign"
    d.mkdir()
    for t in sorted(packed.glob("*.tar")):
        shutil.copy2(t, d / t.name)
        subprocess.run([exe, str(d / t.name)], check=True, capture_output=True)
    dali = {p.name: p.read_bytes() for p in d.glob("*.idx")}
    r = subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "index", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {p.name: p.read_bytes() for p in d.glob("*.idx")} == dali
    assert len(list(d.glob("*.sfidx"))) == len(dali)
    from shardfeed.readers import open_dataset

    got = {s.meta["path"]: (s.data, s.label) for s in open_dataset(d, decode=False, shuffle=False, rank=1,
                                                                    world_size=2)}
    assert got and all(expected[p] == v for p, v in got.items())
    # DALI still reads them through its indexes
    assert len(_dali_read(sorted(d.glob("*.tar")), ["jpg", "png"], sorted(d.glob("*.idx")))) == len(expected)


# ---------------------------------------------------------------------------------------------
# wids

def test_wids_opens_the_dataset_from_its_shardindex(packed, expected, tmp_path):
    wids = pytest.importorskip("wids", reason=f"wids is not installed; {_INSTALL}")
    index = json.loads((packed / "shardindex.json").read_text())
    assert index["__kind__"] == "wids-shard-index-v1"
    ds = wids.ShardListDataset(str(packed / "shardindex.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == len(expected)
    seen = []
    for i in range(len(ds)):
        s = ds[i]
        raw = {k: (v.read() if hasattr(v, "read") else v) for k, v in s.items()}
        images = [k for k in raw if k.lstrip(".") in ("jpg", "png")]
        assert len(images) == 1
        meta = json.loads(raw[".json"])
        assert (raw[images[0]], int(raw[".cls"])) == expected[meta["path"]]
        seen.append(meta["path"])
    assert sorted(seen) == sorted(expected)


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets

def test_hugging_face_datasets_loads_every_sample_with_the_right_columns(packed, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    datasets = pytest.importorskip("datasets", reason=f"Hugging Face datasets is not installed; {_INSTALL}")
    ds = datasets.load_dataset(str(packed), split="train", cache_dir=str(tmp_path / "cache"))
    classes = sorted({p.split("/")[0] for p in expected})
    assert isinstance(ds.features["cls"], datasets.ClassLabel) and ds.features["cls"].names == classes
    assert isinstance(ds.features["jpg"], datasets.Image) and isinstance(ds.features["png"], datasets.Image)
    assert set(ds.features["json"]) == {"path", "class"}
    ds = ds.cast_column("jpg", datasets.Image(decode=False)).cast_column("png", datasets.Image(decode=False))
    assert len(ds) == len(expected)
    seen = []
    for row in ds:
        image = row["jpg"] or row["png"]
        assert (row["jpg"] is None) != (row["png"] is None)  # one image column per sample
        path = row["json"]["path"]
        assert (image["bytes"], row["cls"]) == expected[path] and row["json"]["class"] == path.split("/")[0]
        assert ("jpg" if row["jpg"] else "png") == _ext(path)
        seen.append(path)
    assert sorted(seen) == sorted(expected)


# ---------------------------------------------------------------------------------------------
# upstream webdataset (a dependency; no extra needed)

def test_upstream_webdataset_reads_every_sample_when_to_tuple_names_every_extension(packed, expected):
    import webdataset as wds

    m = json.loads((packed / "manifest.json").read_text())
    urls = [str(packed / s["name"]) for s in m["shards"]]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple(";".join(m["extensions"]), "cls",
                                                                              "json")
    got = [(bytes(img), int(cls), json.loads(meta)) for img, cls, meta in ds]
    assert len(got) == len(expected)
    assert sorted(meta["path"] for *_, meta in got) == sorted(expected)
    for data, label, meta in got:
        assert (data, label) == expected[meta["path"]]


def test_metadata_fields_skips_a_json_member_with_a_damaged_size(packed_wds, tmp_path):
    """The first json member of shard 0 claims 8 GiB: it is passed over (the other shards give the
    fields), with no read of that size."""
    import tarfile
    import tracemalloc

    from shardfeed.convert.write.consumers import metadata_fields
    from shardfeed.readers.storage.local_manifest import load_manifest

    d = tmp_path / "d"
    shutil.copytree(packed_wds, d)
    shard = d / "shard-000000.tar"
    with tarfile.open(shard) as tf:
        m = next(m for m in tf.getmembers() if m.name.endswith(".json"))
        expected = set(json.loads(tf.extractfile(m).read()))  # the fields, read before the damage
    raw = bytearray(shard.read_bytes())
    h = raw[m.offset:m.offset + 512]
    h[124:136] = b"77777777777\0"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    raw[m.offset:m.offset + 512] = h
    shard.write_bytes(bytes(raw))
    tracemalloc.start()
    try:
        fields = metadata_fields(d, load_manifest(d, check_files=False))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert set(fields) == expected and peak < 64 << 20


@pytest.mark.parametrize("max_count, phrase", [(100, "1 WebDataset shard packed"), (3, "WebDataset shards packed")])
def test_the_dataset_card_counts_its_shards_in_words(source, tmp_path, max_count, phrase):
    out = tmp_path / "out"
    pack(source, out, PackOptions(max_count=max_count))
    card = (out / "README.md").read_text()
    shards = len(list(out.glob("*.tar")))
    assert (shards == 1) == (max_count == 100)
    assert phrase in card and (shards == 1 or f"{shards} WebDataset shards packed" in card)


def test_the_dataset_card_names_classes_with_unicode_line_breaks_exactly(tmp_path):
    # YAML 1.1 (PyYAML, which Hugging Face reads the card with) folds NEL, LINE SEPARATOR and
    # PARAGRAPH SEPARATOR inside a quoted scalar: written as they are, the card names another class
    yaml = pytest.importorskip("yaml", reason="PyYAML (a dependency of Hugging Face datasets) is not installed")
    names = ["a\u2028b", "c\u0085d", "e\u2029f", "g\x7fh\x9ei", "plain"]
    src = tmp_path / "src"
    for i, name in enumerate(names):
        (src / name).mkdir(parents=True)
        (src / name / f"{i}.jpg").write_bytes(_image(i, "JPEG"))
    pack(src, tmp_path / "out", PackOptions(max_count=100))
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    front = yaml.safe_load(card.split("---\n")[1])
    cls = next(f for f in front["dataset_info"]["features"] if f["name"] == "cls")
    by_index = cls["dtype"]["class_label"]["names"]
    assert [by_index[str(i)] for i in range(len(names))] == sorted(names)
