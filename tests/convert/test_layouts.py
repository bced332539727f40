"""Layouts beyond the class folder: labels from a file, sidecar files, no labels, any iterable of
samples (``write_dataset``). Every right value comes from the files the fixtures plant: image
bytes, labels from the planted label rows (or the training split's sorted class folders),
sidecar bytes; never from shardfeed's own output."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert import write_dataset
from shardfeed.convert.write.layouts import LayoutOptions, pack_layout, read_labels_file
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.tools.unpack import unpack
from shardfeed.readers import open_dataset
from shardfeed.readers.format.manifest import Manifest
from shardfeed.readers.storage.local_manifest import load_manifest

CLASSES = ["n01440764", "n01443537", "n01484850"]  # synset ids, as ImageNet names its classes


def _jpeg(seed: int, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(6 + seed % 3, 7, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _pack(src, out, *, fmt="wds", labels_file=None, no_labels=False, sidecars=(), require=False, **kw):
    options = PackOptions(format=fmt, workers=1, max_count=kw.pop("max_count", 4), **kw)
    return pack_layout(src, out, options, LayoutOptions(labels_file=labels_file, no_labels=no_labels,
                                                        sidecars=tuple(sidecars), require_sidecars=require))


def _raw(out, **kw) -> dict[str, tuple]:
    """``{meta path: (bytes, label, *fields)}`` read through open_dataset (raw samples)."""
    got = {}
    for item in open_dataset(out, decode=False, shuffle=False, **kw):
        s, fields = (item if kw.get("fields") else (item, {}))
        assert s.meta["path"] not in got
        got[s.meta["path"]] = (s.data, s.label, *[fields[f] for f in kw.get("fields", ())])
    return got


def _loader_labels(out, **kw) -> list:
    from shardfeed.readers.loader import make_loader

    loader = make_loader(open_dataset(out, image_size=4, **kw), batch_size=3, num_workers=2)
    got = []
    for batch in loader:
        assert batch[0].shape[1:] == (3, 4, 4)
        rows = zip(batch[1].tolist(), *batch[2:])
        got += [tuple(r) for r in rows]
    return got


def _unpacked(tmp: Path, out) -> dict[str, bytes]:
    dest = tmp / "unpacked"
    unpack(out, dest)
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def _upstream_wds(out) -> list[dict]:
    import webdataset

    m = json.loads((Path(out) / "manifest.json").read_text())
    urls = [str(Path(out) / s["name"]) for s in m["shards"]]
    return list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))


def _hf(out, tmp: Path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp / "hf"))
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp / "hfcache"))
    for col, feature in list(ds.features.items()):
        if isinstance(feature, datasets.Image):
            ds = ds.cast_column(col, datasets.Image(decode=False))
    return ds


# ---------------------------------------------------------------------------------------------
# fixtures: planted folders


@pytest.fixture(scope="session")
def train_folder(tmp_path_factory) -> Path:
    """An ImageNet-style training split: one folder per synset."""
    root = tmp_path_factory.mktemp("train") / "train"
    for i in range(9):
        (root / CLASSES[i % 3]).mkdir(parents=True, exist_ok=True)
        (root / CLASSES[i % 3] / f"t{i}.JPEG").write_bytes(_jpeg(100 + i))
    return root


@pytest.fixture(scope="session")
def packed_train(train_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ptrain") / "train"
    pack(train_folder, out, PackOptions(workers=1, max_count=4))
    return out


@pytest.fixture(scope="session")
def flat_val(tmp_path_factory) -> tuple[Path, Path, dict]:
    """An ImageNet-style validation split: a flat folder and a label file (CSV, no header) naming
    synsets; two classes only appear (the third has no validation image here)."""
    d = tmp_path_factory.mktemp("val")
    root = d / "val"
    root.mkdir()
    labels = {}
    for i in range(7):
        name = f"ILSVRC2012_val_{i + 1:08d}.JPEG"
        (root / name).write_bytes(_jpeg(i))
        labels[name] = CLASSES[1 + i % 2]
    csv_path = d / "LOC_val_solution.csv"
    csv_path.write_text("".join(f"{k},{v}\n" for k, v in labels.items()))
    return root, csv_path, labels


@pytest.fixture(scope="session")
def sidecar_folder(tmp_path_factory) -> Path:
    """img2dataset's layout in two sub-folders: x.jpg + x.txt + x.json + x.mask.png (one mask missing)."""
    root = tmp_path_factory.mktemp("side") / "src"
    for i in range(6):
        d = root / ("a" if i < 3 else "b/c")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:03d}.jpg").write_bytes(_jpeg(200 + i))
        (d / f"{i:03d}.txt").write_text(f"a photo number {i} — café", encoding="utf-8")
        (d / f"{i:03d}.json").write_text(json.dumps({"boxes": [[i, 1, 2, 3]], "id": i}))
        if i != 4:
            (d / f"{i:03d}.mask.png").write_bytes(_jpeg(300 + i, "PNG"))
    return root


def _planted_sidecars(root: Path) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for p in sorted(root.rglob("*.jpg")):
        rel = str(p.relative_to(root))
        stem = p.with_suffix("")
        out[rel] = {f: Path(f"{stem}.{f}").read_bytes() for f in ("txt", "json", "mask.png")
                    if Path(f"{stem}.{f}").exists()}
    return out


# ---------------------------------------------------------------------------------------------
# (a) a flat folder with a CSV of labels


@pytest.fixture(scope="session")
def csv_dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("csv")
    src = d / "images"
    src.mkdir()
    rows = {}
    for i in range(8):
        (src / f"img_{i}.png" if i % 4 == 0 else src / f"img_{i}.jpg").write_bytes(
            _jpeg(i, "PNG") if i % 4 == 0 else _jpeg(i))
    for p in sorted(src.iterdir()):
        rows[p.name] = ["cat", "dog", "emu"][int(p.stem[-1]) % 3]
    (d / "labels.csv").write_text("path,label\n" + "".join(f"{k},{v}\n" for k, v in rows.items()))
    out = d / "out"
    _pack(src, out, labels_file=d / "labels.csv", max_count=3)
    classes = sorted(set(rows.values()))  # class names sorted, as ImageFolder sorts folders
    want = {k: ((src / k).read_bytes(), classes.index(v)) for k, v in rows.items()}
    return src, out, want, classes


@pytest.mark.multiprocess
@pytest.mark.interop
def test_flat_folder_with_a_csv_of_labels_reads_back_exactly(csv_dataset, tmp_path, monkeypatch):
    src, out, want, classes = csv_dataset
    m = load_manifest(out)
    assert m.classes == classes and m.num_samples == 8 and [s.num_samples for s in m.shards] == [3, 3, 2]
    assert _raw(out) == want
    assert sorted(label for label, in _loader_labels(out)) == sorted(v[1] for v in want.values())
    assert _unpacked(tmp_path, out) == {k: v[0] for k, v in want.items()}
    up = _upstream_wds(out)
    assert {json.loads(s["json"])["path"]: (s.get("jpg", s.get("png")), int(s["cls"])) for s in up} == want
    ds = _hf(out, tmp_path, monkeypatch)
    assert ds.features["cls"].names == classes
    assert {r["json"]["path"]: ((r["jpg"] or r["png"])["bytes"], r["cls"]) for r in ds} == want


def test_labels_file_and_folder_must_agree_or_are_skipped_and_named(csv_dataset, tmp_path):
    src, _, want, _ = csv_dataset
    rows = dict(list({k: "cat" for k in want}.items())[:-1])  # the last image has no row
    rows["gone.jpg"] = "dog"  # a row naming no image
    lf = tmp_path / "labels.jsonl"
    lf.write_text("".join(json.dumps({"path": k, "label": v}) + "\n" for k, v in rows.items()))
    last = sorted(want)[-1]
    with pytest.raises(ValueError, match=r"1 image\(s\) .* no row .*" + last + r".*1 row\(s\) .* gone\.jpg"):
        _pack(src, tmp_path / "o1", labels_file=lf)
    assert not (tmp_path / "o1" / "manifest.json").exists()
    _pack(src, tmp_path / "o2", labels_file=lf, on_error="skip")
    m = load_manifest(tmp_path / "o2")
    assert sorted(s["path"] for s in m.skipped) == sorted([last, "gone.jpg"])
    assert set(_raw(tmp_path / "o2")) == set(want) - {last}


@pytest.mark.parametrize("row, problem", [("../etc/passwd.jpg,cat", "without '..'"),
                                          ("/abs/x.jpg,cat", "relative to SRC"),
                                          ("a.jpg,cat\na.jpg,dog", "listed twice"),
                                          ("a.jpg,cat,extra", "3 columns"),
                                          ("a.jpg,cat\nb.jpg,3", "mix class names and integer")])
def test_a_bad_labels_file_is_refused_naming_the_line(tmp_path, row, problem):
    lf = tmp_path / "l.csv"
    lf.write_text(row + "\n")
    with pytest.raises(ValueError, match=problem):
        read_labels_file(lf)


def test_labels_file_rows_and_field_lengths_are_bounded(tmp_path, monkeypatch):
    from shardfeed.convert.write import label_files  # where the limits live

    lf = tmp_path / "l.csv"
    lf.write_text("".join(f"x{i}.jpg,{i % 2}\n" for i in range(20)))
    monkeypatch.setattr(label_files, "MAX_LABEL_ROWS", 10)
    with pytest.raises(ValueError, match="more than 10 rows"):
        read_labels_file(lf)
    monkeypatch.setattr(label_files, "MAX_LABEL_ROWS", 100)
    lf.write_text("a" * 5000 + ".jpg,cat\n")
    with pytest.raises(ValueError, match="longer than 4096"):
        read_labels_file(lf)
    monkeypatch.setattr(label_files, "MAX_LABELS_FILE_BYTES", 100)
    with pytest.raises(ValueError, match="over the 100 bytes"):
        read_labels_file(lf)


# ---------------------------------------------------------------------------------------------
# (b) an ImageNet-style validation folder against the training classes


@pytest.mark.multiprocess
@pytest.mark.interop
def test_imagenet_style_validation_folder_packs_to_the_training_classes(packed_train, train_folder, flat_val,
                                                                        tmp_path, monkeypatch):
    root, csv_path, labels = flat_val
    train_classes = sorted(d.name for d in train_folder.iterdir())  # torchvision ImageFolder's order
    out = tmp_path / "val"
    r = CliRunner().invoke(_cli(), ["pack", str(root), str(out), "--labels", str(csv_path), "--classes-from",
                                    str(packed_train), "-j", "1"])
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    assert m.classes == train_classes and m.class_to_idx == {c: i for i, c in enumerate(train_classes)}
    want = {k: ((root / k).read_bytes(), train_classes.index(v)) for k, v in labels.items()}
    assert _raw(out) == want
    # the training split's own labels agree with its folders
    assert {k.split("/")[0] for k in _raw(packed_train)} <= set(train_classes)
    assert all(lab == train_classes.index(p.split("/")[0]) for p, (_, lab) in _raw(packed_train).items())
    assert sorted(x for x, in _loader_labels(out)) == sorted(v[1] for v in want.values())
    assert _unpacked(tmp_path, out) == {k: v[0] for k, v in want.items()}
    assert {json.loads(s["json"])["path"]: (s["jpg"], int(s["cls"])) for s in _upstream_wds(out)} == want
    ds = _hf(out, tmp_path, monkeypatch)
    assert ds.features["cls"].names == train_classes
    assert {r["json"]["path"]: (r["jpg"]["bytes"], r["cls"]) for r in ds} == want


def test_integer_labels_and_a_classes_file(flat_val, tmp_path):
    root, _, labels = flat_val
    classes_file = tmp_path / "classes.txt"
    classes_file.write_text("# one synset a line\n" + "\n".join(CLASSES) + "\n")
    lf = tmp_path / "val.tsv"
    lf.write_text("path\tlabel\n" + "".join(f"{k}\t{CLASSES.index(v)}\n" for k, v in labels.items()))
    out = tmp_path / "val_int"
    r = CliRunner().invoke(_cli(), ["pack", str(root), str(out), "--labels", str(lf), "--classes-from",
                                    str(classes_file), "--format", "lmdb", "-j", "1"])
    assert r.exit_code == 0, r.output
    assert load_manifest(out).classes == CLASSES
    assert _raw(out) == {k: ((root / k).read_bytes(), CLASSES.index(v)) for k, v in labels.items()}
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{next(iter(labels))},n99999999\n")
    r = CliRunner().invoke(_cli(), ["pack", str(root), str(tmp_path / "o"), "--labels", str(bad), "--classes-from",
                                    str(classes_file), "--on-error", "skip"])
    assert r.exit_code != 0 and "n99999999" in r.output


# ---------------------------------------------------------------------------------------------
# (c) sidecar files


def _pack_sidecars(folder, tmp_path_factory, fmt):
    out = tmp_path_factory.mktemp("sidepacked") / fmt
    _pack(folder, out, fmt=fmt, no_labels=True, sidecars=("txt", "json", "mask.png"), max_count=4)
    return out


@pytest.fixture(scope="session")
def sidecar_wds(sidecar_folder, tmp_path_factory):
    return _pack_sidecars(sidecar_folder, tmp_path_factory, "wds")


@pytest.fixture(scope="session")
def sidecar_lmdb(sidecar_folder, tmp_path_factory):
    return _pack_sidecars(sidecar_folder, tmp_path_factory, "lmdb")


@pytest.fixture(params=["wds", "lmdb"])
def sidecar_dataset(request):
    return request.getfixturevalue(f"sidecar_{request.param}")


@pytest.mark.multiprocess
def test_sidecars_are_fields_of_their_sample_and_read_back_exactly(sidecar_dataset, sidecar_folder, tmp_path):
    planted = _planted_sidecars(sidecar_folder)
    m = load_manifest(sidecar_dataset)
    assert m.version == 3 and m.labels == "none" and m.classes == []
    assert m.fields == {"json": {"member": "sidecar.json", "count": 6, "missing": 0},
                        "mask.png": {"member": "mask.png", "count": 5, "missing": 1},
                        "txt": {"member": "txt", "count": 6, "missing": 0}}
    assert m.num_samples == 6  # no x.mask.png was taken for an image
    # 6 images, 6 .txt, 6 .json, 5 .mask.png planted
    assert m.files == {"found": 23, "packed": 6, "skipped": 0, "ignored": 0, "sidecars": 17}
    got = _raw(sidecar_dataset, fields=("txt", "json", "mask.png"))
    assert set(got) == set(planted)
    for rel, (data, label, txt, js, mask) in got.items():
        side = planted[rel]
        assert data == (sidecar_folder / rel).read_bytes() and label == -1
        assert txt == side["txt"].decode("utf-8") and js == json.loads(side["json"])
        assert mask == side.get("mask.png")
    # decoded: (image, label, *fields), collated by make_loader as lists
    rows = _loader_labels(sidecar_dataset, fields=("txt", "mask.png"))
    assert sorted((lab, txt, mask) for lab, txt, mask in rows) == sorted(
        (-1, s["txt"].decode(), s.get("mask.png")) for s in planted.values())
    # unpack writes every file back byte-identical
    files = {str(p.relative_to(sidecar_folder)): p.read_bytes() for p in sidecar_folder.rglob("*") if p.is_file()}
    assert _unpacked(tmp_path, sidecar_dataset) == files


@pytest.mark.interop
def test_sidecars_through_upstream_webdataset_and_hugging_face(sidecar_wds, sidecar_folder, tmp_path, monkeypatch):
    sidecar_dataset = sidecar_wds
    planted = _planted_sidecars(sidecar_folder)
    up = {json.loads(s["json"])["path"]: s for s in _upstream_wds(sidecar_dataset)}
    assert set(up) == set(planted)
    for rel, s in up.items():
        assert "cls" not in s and s["jpg"] == (sidecar_folder / rel).read_bytes()
        assert (s["txt"], s["sidecar.json"], s.get("mask.png")) == (
            planted[rel]["txt"], planted[rel]["json"], planted[rel].get("mask.png"))
    ds = _hf(sidecar_dataset, tmp_path, monkeypatch)
    assert "cls" not in ds.features
    seen = {}
    for r in ds:
        rel = r["json"]["path"]
        seen[rel] = (r["jpg"]["bytes"], r["txt"], (r["mask.png"] or {}).get("bytes"), r["sidecar.json"]["id"])
    assert seen == {rel: ((sidecar_folder / rel).read_bytes(), s["txt"].decode(), s.get("mask.png"),
                          json.loads(s["json"])["id"]) for rel, s in planted.items()}


def test_convert_and_check_carry_the_sidecars(sidecar_dataset, sidecar_folder, tmp_path):
    from shardfeed.convert.tools.check import check_dataset
    from shardfeed.convert.tools.convert import convert_dataset

    assert check_dataset(sidecar_dataset).ok
    other = "lmdb" if sidecar_dataset.name == "wds" else "wds"
    convert_dataset(sidecar_dataset, tmp_path / "conv", format=other, max_count=2)
    assert load_manifest(tmp_path / "conv").fields == load_manifest(sidecar_dataset).fields
    assert _raw(tmp_path / "conv", fields=("txt", "json", "mask.png")) == _raw(
        sidecar_dataset, fields=("txt", "json", "mask.png"))


def test_require_sidecars_names_the_image_without_one(sidecar_folder, tmp_path):
    with pytest.raises(ValueError, match=r"b/c/004\.jpg: no sidecar file b/c/004\.mask\.png"):
        _pack(sidecar_folder, tmp_path / "o", sidecars=("mask.png",), require=True)
    _pack(sidecar_folder, tmp_path / "o2", sidecars=("mask.png",), require=True, on_error="skip")
    m = load_manifest(tmp_path / "o2")
    assert [s["path"] for s in m.skipped] == ["b/c/004.jpg"] and m.num_samples == 5


def test_a_field_that_is_not_stored_is_refused_naming_the_fields(sidecar_dataset):
    with pytest.raises(ValueError, match="no field.*'caption'.*json, mask.png, txt"):
        open_dataset(sidecar_dataset, fields=("caption",))


def test_sidecars_inside_class_folders_keep_the_folder_labels(tmp_path):
    src = tmp_path / "src"
    for i, c in enumerate(["b", "a", "b"]):
        (src / c).mkdir(parents=True, exist_ok=True)
        (src / c / f"{i}.jpg").write_bytes(_jpeg(i))
        (src / c / f"{i}.txt").write_text(f"t{i}")
    _pack(src, tmp_path / "o", sidecars=("txt",))
    assert _raw(tmp_path / "o", fields=("txt",)) == {
        f"{c}/{i}.jpg": ((src / c / f"{i}.jpg").read_bytes(), ["a", "b"].index(c), f"t{i}")
        for i, c in enumerate(["b", "a", "b"])}


# ---------------------------------------------------------------------------------------------
# (d) an unlabelled folder


@pytest.mark.multiprocess
@pytest.mark.interop
def test_unlabelled_folder_packs_without_labels_and_reads_label_minus_one(tmp_path, monkeypatch):
    src = tmp_path / "corpus"
    src.mkdir()
    want = {}
    for i in range(5):
        (src / f"{i}.jpg").write_bytes(_jpeg(50 + i))
        want[f"{i}.jpg"] = ((src / f"{i}.jpg").read_bytes(), -1)
    out = tmp_path / "out"
    r = CliRunner().invoke(_cli(), ["pack", str(src), str(out), "--max-count", "2", "-j", "1"])  # no sub-folders
    assert r.exit_code == 0, r.output
    m = load_manifest(out)
    assert (m.version, m.labels, m.classes, m.class_to_idx) == (3, "none", [], {})
    assert _raw(out) == want
    assert sorted(_loader_labels(out)) == [(-1,)] * 5
    assert _unpacked(tmp_path, out) == {k: v[0] for k, v in want.items()}
    up = _upstream_wds(out)
    assert all("cls" not in s for s in up)
    assert {json.loads(s["json"])["path"]: s["jpg"] for s in up} == {k: v[0] for k, v in want.items()}
    ds = _hf(out, tmp_path, monkeypatch)
    assert "cls" not in ds.features
    assert {row["json"]["path"]: row["jpg"]["bytes"] for row in ds} == {k: v[0] for k, v in want.items()}


# ---------------------------------------------------------------------------------------------
# (e) any iterable of samples


@pytest.mark.multiprocess
@pytest.mark.interop
def test_write_dataset_from_a_generator_of_dicts(tmp_path, monkeypatch):
    images = {f"cap/{i}.jpg": _jpeg(80 + i) for i in range(7)}
    captions = {k: f"caption {i}" for i, k in enumerate(images)}

    def samples():  # the README's example: paths and captions
        for k, data in images.items():
            yield {"image": data, "ext": ".jpg", "path": k, "txt": captions[k], "label": int(k[4]) % 2}

    out = tmp_path / "gen"
    m = write_dataset(samples(), out, max_count=3, classes=["even", "odd"])
    assert [s.num_samples for s in m.shards] == [3, 3, 1]  # the one rollover rule: closes before a 4th
    assert m.fields == {"txt": {"member": "txt", "count": 7, "missing": 0}}
    want = {k: (d, int(k[4]) % 2, captions[k]) for k, d in images.items()}
    assert _raw(out, fields=("txt",)) == want
    assert sorted(_loader_labels(out, fields=("txt",))) == sorted((v[1], v[2]) for v in want.values())
    assert (out / "shardindex.json").exists() and all((out / s.index).exists() for s in m.shards)
    assert _unpacked(tmp_path, out) == {**images, **{k[:-4] + ".txt": c.encode() for k, c in captions.items()}}
    up = _upstream_wds(out)
    assert {json.loads(s["json"])["path"]: (s["jpg"], int(s["cls"]), s["txt"].decode()) for s in up} == want
    ds = _hf(out, tmp_path, monkeypatch)
    assert ds.features["cls"].names == ["even", "odd"]
    assert {r["json"]["path"]: (r["jpg"]["bytes"], r["cls"], r["txt"]) for r in ds} == want


def test_write_dataset_writes_the_same_shards_as_pack_for_the_same_samples(train_folder, tmp_path):
    """A class-folder pack (sorted order) and write_dataset of the same files, labels and paths:
    byte-identical shards and indexes."""
    pack(train_folder, tmp_path / "packed", PackOptions(workers=1, max_count=4, shuffle=False))
    classes = sorted(d.name for d in train_folder.iterdir())
    files = [(c, p) for c in classes for p in sorted((train_folder / c).iterdir())]
    write_dataset(({"image": p.read_bytes(), "ext": "jpg", "label": c, "path": f"{c}/{p.name}"} for c, p in files),
                  tmp_path / "written", max_count=4, classes=classes)
    for name in sorted(os.listdir(tmp_path / "packed")):
        if name.endswith((".tar", ".sfidx")):
            assert (tmp_path / "packed" / name).read_bytes() == (tmp_path / "written" / name).read_bytes(), name


def test_write_dataset_refuses_bad_samples_naming_them(tmp_path):
    with pytest.raises(ValueError, match="sample 1 .*has no label"):
        write_dataset(iter([{"image": b"x", "ext": "jpg", "label": 0}, {"image": b"y", "ext": "jpg", "path": "b"}]),
                      tmp_path / "o1")
    assert not (tmp_path / "o1" / "manifest.json").exists()
    with pytest.raises(ValueError, match="field 'png' is an image extension"):
        write_dataset([{"image": b"x", "ext": "jpg", "png": b"p"}], tmp_path / "o2")
    with pytest.raises(ValueError, match="'image' must be the encoded image bytes"):
        write_dataset([{"ext": "jpg"}], tmp_path / "o3")


# ---------------------------------------------------------------------------------------------
# manifest versions


def test_manifest_versions_1_2_and_3_are_read(packed_train, tmp_path):
    import shutil

    want = _raw(packed_train)
    for version in (1, 2):
        d = tmp_path / f"v{version}"
        shutil.copytree(packed_train, d)
        m = json.loads((d / "manifest.json").read_text())
        m["version"] = version
        m["fields"] = {"txt": {"member": "txt", "count": 1}}  # not a field in a version-1/2 manifest: ignored
        m["labels"] = "none"
        (d / "manifest.json").write_text(json.dumps(m))
        got = load_manifest(d)
        assert (got.version, got.fields, got.labels) == (version, {}, "class")
        assert _raw(d) == want


def test_manifest_version_4_is_refused(packed_train):
    from shardfeed.readers.errors import ManifestError

    with pytest.raises(ManifestError, match="version 4 is not supported.*upgrade"):
        Manifest.from_json({**json.loads((packed_train / "manifest.json").read_text()), "version": 4})


def _cli():
    from shardfeed.convert.cli import main

    return main



@pytest.mark.interop
def test_dali_reads_the_sidecars_by_extension(sidecar_wds, sidecar_folder):
    from nvidia.dali import fn, pipeline_def

    planted = _planted_sidecars(sidecar_folder)
    tars = [str(sidecar_wds / s.name) for s in load_manifest(sidecar_wds).shards]

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)  # CPU only
    def pipe():
        image, txt, side, meta = fn.readers.webdataset(paths=tars, ext=["jpg", "txt", "sidecar.json", "json"],
                                                       missing_component_behavior="error", random_shuffle=False,
                                                       name="reader")
        return image, txt, side, meta

    p = pipe()
    p.build()
    n = p.epoch_size("reader")
    got = {}
    while len(got) < n:
        outs = p.run()
        for i in range(len(outs[0])):
            image, txt, side, meta = (bytes(np.array(out.at(i))) for out in outs)
            got[json.loads(meta)["path"]] = (image, txt, side)
    assert got == {rel: ((sidecar_folder / rel).read_bytes(), s["txt"], s["json"]) for rel, s in planted.items()}


def test_an_interrupted_layout_pack_resumes_to_the_same_bytes(sidecar_folder, tmp_path, monkeypatch):
    """Interrupted at its 9th file read (shard 0 of the 2-sample shards complete, shard 1 not: the
    asserts below hold it), ``--resume`` writes exactly what an uninterrupted pack writes."""
    from shardfeed.convert.write import layout_shards

    whole = tmp_path / "whole"
    _pack(sidecar_folder, whole, no_labels=True, sidecars=("txt", "mask.png"), max_count=2)
    out = tmp_path / "cut"
    real_read, calls = layout_shards.read_checked, {"n": 0}

    def read_then_stop(*args):
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        return real_read(*args)

    monkeypatch.setattr(layout_shards, "read_checked", read_then_stop)
    with pytest.raises(KeyboardInterrupt):
        _pack(sidecar_folder, out, no_labels=True, sidecars=("txt", "mask.png"), max_count=2)
    assert not (out / "manifest.json").exists() and (out / "shard-000000.tar").exists()
    assert not (out / "shard-000001.tar").exists() and not list(out.glob(".*.tmp"))
    monkeypatch.setattr(layout_shards, "read_checked", real_read)
    with pytest.raises(ValueError, match="other options"):  # another max_count: refused, not mixed
        _pack(sidecar_folder, out, no_labels=True, sidecars=("txt", "mask.png"), max_count=3, resume=True)
    _pack(sidecar_folder, out, no_labels=True, sidecars=("txt", "mask.png"), max_count=2, resume=True)
    names = sorted(p.name for p in whole.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    for name in names:
        if name != "manifest.json":
            assert (whole / name).read_bytes() == (out / name).read_bytes(), name
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (whole, out))
    a["options"].pop("source"), b["options"].pop("source")
    assert a == b


@pytest.mark.interop
def test_wids_reads_the_sidecars_and_its_index_lists_them(sidecar_wds, sidecar_folder, tmp_path):
    import wids

    planted = _planted_sidecars(sidecar_folder)
    index = json.loads((sidecar_wds / "shardindex.json").read_text())
    assert index["fields"] == {"json": "sidecar.json", "mask.png": "mask.png", "txt": "txt"}
    ds = wids.ShardListDataset(str(sidecar_wds / "shardindex.json"), cache_dir=str(tmp_path / "c"),
                               transformations=[])
    got = {}
    for i in range(len(ds)):
        raw = {k: (v.read() if hasattr(v, "read") else v) for k, v in ds[i].items()}
        got[json.loads(raw[".json"])["path"]] = (raw[".jpg"], raw[".txt"], raw[".sidecar.json"], raw.get(".mask.png"))
    assert got == {rel: ((sidecar_folder / rel).read_bytes(), s["txt"], s["json"], s.get("mask.png"))
                   for rel, s in planted.items()}


def test_stage_copies_a_dataset_with_sidecars_that_reads_the_same(sidecar_wds, tmp_path):
    from shardfeed.convert.tools.stage import stage

    stage(sidecar_wds, tmp_path / "staged")
    fields = ("txt", "json", "mask.png")
    assert _raw(tmp_path / "staged", fields=fields) == _raw(sidecar_wds, fields=fields)


@pytest.mark.multiprocess
def test_loader_resume_keeps_the_fields_with_their_samples(sidecar_wds, sidecar_folder):
    """Stopped after one batch and resumed from ``state_dict()``: every sample once over both runs,
    each with its own caption."""
    from shardfeed.readers.loader import make_loader

    planted = _planted_sidecars(sidecar_folder)
    by_caption = {s["txt"].decode(): rel for rel, s in planted.items()}

    def loader():
        return make_loader(open_dataset(sidecar_wds, image_size=4, fields=("txt",), decode=True), batch_size=2,
                           num_workers=2, seed=5)

    first = loader()
    it = iter(first)
    seen = list(next(it)[2])
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    for batch in second:
        seen += batch[2]
    assert sorted(by_caption[c] for c in seen) == sorted(planted)


def test_a_csv_field_over_the_csv_limit_is_a_clear_error(tmp_path):
    import csv

    lf = tmp_path / "l.csv"
    lf.write_text('a.jpg,"' + "x" * (csv.field_size_limit() + 1) + '"\n')
    with pytest.raises(ValueError, match=r"l\.csv line 1: malformed CSV"):
        read_labels_file(lf)


def test_lmdb_record_with_fields_is_version_2_and_checks_their_crc():
    import msgpack

    from shardfeed.readers.errors import CorruptDataError
    from shardfeed.readers.format.manifest import decode_record, encode_record

    plain = encode_record("000000001", b"img", "jpg", 3, {"path": "a.jpg"})
    assert msgpack.unpackb(plain)["v"] == 1 and "fields" not in msgpack.unpackb(plain)
    value = encode_record("000000001", b"img", "jpg", -1, {"path": "a.jpg"}, {"txt": b"hello"})
    rec = decode_record(value)
    assert (rec["v"], rec["label"], rec["fields"], rec["data"]) == (2, -1, {"txt": b"hello"}, b"img")
    damaged = value.replace(b"hello", b"jello")
    with pytest.raises(CorruptDataError, match="field.*txt fail their CRC-32"):
        decode_record(damaged)


def test_a_manifest_with_a_bad_field_is_refused(packed_train):
    from shardfeed.readers.errors import ManifestError

    m = json.loads((packed_train / "manifest.json").read_text())
    for fields, problem in [({"png": {"member": "png"}}, "image extension"),
                            ({"json": {"member": "json"}}, "member must be 'sidecar.json'"),
                            ({f"f{i}": {} for i in range(65)}, "more than the 64")]:
        with pytest.raises(ManifestError, match=problem):
            Manifest.from_json({**m, "version": 3, "fields": fields})


def test_cli_sidecars_option(sidecar_folder, tmp_path):
    out = tmp_path / "o"
    # the masks are not asked for: with png packed they would be images of their own (x.mask.png is an image)
    r = CliRunner().invoke(_cli(), ["pack", str(sidecar_folder), str(out), "--sidecars", ".TXT,json", "--no-labels",
                                    "--extensions", "jpg", "--require-sidecars", "-j", "1",
                                    "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert sorted(load_manifest(out).fields) == ["json", "txt"]
    assert json.loads((tmp_path / "r.json").read_text())["extra"]["layout"] == "unlabelled"
    r = CliRunner().invoke(_cli(), ["pack", str(sidecar_folder), str(tmp_path / "o2"), "--sidecars", "png"])
    assert r.exit_code != 0 and "image extension" in r.output


def test_layout_pack_reencodes_and_decode_checks_the_images_only(sidecar_folder, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(sidecar_folder, src)
    (src / "a" / "zz.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # decodes nowhere
    out = tmp_path / "o"
    _pack(src, out, no_labels=True, sidecars=("mask.png",), reencode={"resize": 4, "image_format": "png"},
          decode_check=True, on_error="skip")
    m = load_manifest(out)
    assert [s["path"] for s in m.skipped] == ["a/zz.jpg"] and m.num_samples == 6
    for s, fields in open_dataset(out, decode=False, fields=("mask.png",)):
        original = Image.open(src / s.meta["path"])
        assert s.ext == "png" and s.meta["orig_width"] == original.width
        assert min(Image.open(io.BytesIO(s.data)).size) == 4
        mask = src / (s.meta["path"][:-4] + ".mask.png")
        assert fields["mask.png"] == (mask.read_bytes() if mask.exists() else None)  # stored as it is


def test_layout_scan_follows_links_as_a_class_folder_pack_and_skips_hidden_files(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(_jpeg(1))
    (outside / "d").mkdir()
    (outside / "d" / "x.jpg").write_bytes(_jpeg(2))
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.jpg").write_bytes(_jpeg(3))
    (src / "inside.jpg").symlink_to(src / "ok.jpg")  # a link inside SRC: packed
    (src / "out.jpg").symlink_to(outside / "secret.jpg")  # a store out of SRC (git-annex, DVC): packed when asked
    (src / "dir").symlink_to(outside / "d", target_is_directory=True)
    (src / "again").symlink_to(src / "dir", target_is_directory=True)  # the same folder: walked once
    (src / "up").symlink_to(tmp_path, target_is_directory=True)  # a folder holding SRC: never followed
    (src / ".hidden.jpg").write_bytes(_jpeg(4))
    _pack(src, tmp_path / "o", no_labels=True, follow_external_links=True)
    assert _raw(tmp_path / "o") == {"inside.jpg": (_jpeg(3), -1), "ok.jpg": (_jpeg(3), -1),
                                    "out.jpg": (_jpeg(1), -1), "again/x.jpg": (_jpeg(2), -1)}
    m = load_manifest(tmp_path / "o")
    assert m.files["ignored"] == 1 and m.files["found"] == 5


@pytest.mark.network
def test_sidecars_read_over_http(sidecar_wds, start_http_server):
    url = start_http_server(sidecar_wds.parent) + f"/{sidecar_wds.name}/"
    fields = ("txt", "json", "mask.png")
    assert _raw(url, fields=fields) == _raw(sidecar_wds, fields=fields)
