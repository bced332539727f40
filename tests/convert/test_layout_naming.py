"""The one naming rule of the layout packs (labels files, sidecars, unlabelled folders): an image is
an image whatever its stem, a sidecar file is an image's stem plus a requested suffix, links are
followed as a class-folder pack follows them, and nothing is dropped without its reason."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.layouts import LayoutOptions, pack_layout
from shardfeed.convert.write.pack import PackOptions, pack


def _img(seed: int, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(5 + seed % 4, 6, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _members(out: Path) -> dict[str, dict[str, bytes]]:
    """``{meta path: {member extension: bytes}}`` of every sample of OUT's tar shards (stdlib tarfile)."""
    got: dict[str, dict[str, bytes]] = {}
    for name in sorted(p.name for p in out.glob("*.tar")):
        with tarfile.open(out / name) as tf:
            samples: dict[str, dict[str, bytes]] = {}
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                assert ext not in samples.setdefault(key, {}), f"{m.name} written twice"
                samples[key][ext] = tf.extractfile(m).read()
        for parts in samples.values():
            path = json.loads(parts["json"])["path"]
            assert path not in got
            got[path] = parts
    return got


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


DOTTED = {"img.jpg": _img(1), "img.v2.jpg": _img(2), "f.0001.png": _img(3, "PNG"), "f.0002.png": _img(4, "PNG"),
          "f.png": _img(5, "PNG"), "shot.2024-01-02T10.30.jpg": _img(6)}


@pytest.mark.parametrize("layout", ["flat", "labels", "sidecars", "no-labels"])
def test_an_image_whose_name_extends_another_images_stem_is_an_image(tmp_path, layout):
    src = tmp_path / "src"
    _write(src, DOTTED)
    kw: dict = {"no_labels": layout in ("sidecars", "no-labels")}
    side = {}
    if layout == "labels":
        (tmp_path / "labels.csv").write_text("".join(f"{rel},{i % 2}\n" for i, rel in enumerate(DOTTED)))
        kw["labels_file"] = tmp_path / "labels.csv"
    if layout == "sidecars":
        side = {"img.txt": b"caption of img", "img.v2.txt": b"caption of img.v2", "f.0001.txt": b"frame 1"}
        _write(src, side)
        kw["sidecars"] = ("txt",)
    report = pack_layout(src, tmp_path / "out", PackOptions(workers=1), LayoutOptions(**kw))
    got = _members(tmp_path / "out")
    assert sorted(got) == sorted(DOTTED)
    for rel, data in DOTTED.items():
        assert got[rel][rel.rsplit(".", 1)[1]] == data
        if layout == "labels":
            assert int(got[rel]["cls"]) == list(DOTTED).index(rel) % 2
        sidecar = side.get(rel.rsplit(".", 1)[0] + ".txt")
        assert got[rel].get("txt") == sidecar
    assert report.files["packed"] == len(DOTTED) and report.files["ignored"] == 0


def test_a_requested_sidecar_file_is_never_an_image_and_an_orphan_is_listed(tmp_path):
    src = tmp_path / "src"
    _write(src, {"x.jpg": _img(1), "x.mask.png": _img(2, "PNG"), "x.txt": b"cap", "y.txt": b"no image",
                 "z.mask.png": _img(3, "PNG")})
    report = pack_layout(src, tmp_path / "out", PackOptions(workers=1),
                         LayoutOptions(no_labels=True, sidecars=("txt", "mask.png")))
    got = _members(tmp_path / "out")
    # z.mask.png has no image of stem z: an image by its extension; x.mask.png is x's sidecar
    assert sorted(got) == ["x.jpg", "z.mask.png"]
    assert got["x.jpg"]["mask.png"] == _img(2, "PNG") and got["x.jpg"]["txt"] == b"cap"
    assert got["z.mask.png"]["png"] == _img(3, "PNG")
    assert report.ignored == [{"path": "y.txt", "reason": "sidecar file without an image of the same stem"}]


def _annex_tree(tmp_path: Path) -> Path:
    """SRC whose class folder and files are links into a store beside it (git-annex, DVC)."""
    store = tmp_path / "store"
    _write(store, {"objects/k1": _img(11), "objects/k2": _img(12), "birds/b1.jpg": _img(13), "birds/b1.txt": b"bird"})
    src = tmp_path / "repo" / "src"
    _write(src, {"cat/c.jpg": _img(14), "cat/c.txt": b"cat", "cat/d.txt": b"dee"})
    os.symlink(store / "birds", src / "bird")                    # a symlinked class folder
    os.symlink(store / "objects" / "k1", src / "cat" / "a.jpg")  # symlinked files
    os.symlink(store / "objects" / "k2", src / "cat" / "d.jpg")
    os.symlink(src / "cat", src / "cat" / "loop")               # a loop: walked once
    return src


#: links out of SRC are followed only when asked (a git-annex or DVC store)
_FOLLOW = PackOptions(workers=1, follow_external_links=True)


def test_symlinked_class_folders_and_files_are_packed_as_a_plain_pack_packs_them(tmp_path):
    src = _annex_tree(tmp_path)
    pack(src, tmp_path / "plain", _FOLLOW)
    pack_layout(src, tmp_path / "side", _FOLLOW, LayoutOptions(sidecars=("txt",)))
    plain, side = _members(tmp_path / "plain"), _members(tmp_path / "side")
    expected = {"bird/b1.jpg": (_img(13), 0, b"bird"), "cat/a.jpg": (_img(11), 1, None),
                "cat/c.jpg": (_img(14), 1, b"cat"), "cat/d.jpg": (_img(12), 1, b"dee")}
    assert {p: (m["jpg"], int(m["cls"])) for p, m in plain.items()} == {p: v[:2] for p, v in expected.items()}
    assert {p: (m["jpg"], int(m["cls"]), m.get("txt")) for p, m in side.items()} == expected


def test_symlinked_files_are_packed_unlabelled_and_with_a_labels_file(tmp_path):
    src = _annex_tree(tmp_path)
    pack_layout(src, tmp_path / "none", _FOLLOW, LayoutOptions(no_labels=True))
    assert sorted(_members(tmp_path / "none")) == ["bird/b1.jpg", "cat/a.jpg", "cat/c.jpg", "cat/d.jpg"]
    (tmp_path / "labels.csv").write_text("bird/b1.jpg,1\ncat/a.jpg,0\ncat/c.jpg,0\ncat/d.jpg,1\n")
    pack_layout(src, tmp_path / "lab", _FOLLOW, LayoutOptions(labels_file=tmp_path / "labels.csv"))
    got = _members(tmp_path / "lab")
    assert {p: (m["jpg"], int(m["cls"])) for p, m in got.items()} == {
        "bird/b1.jpg": (_img(13), 1), "cat/a.jpg": (_img(11), 0), "cat/c.jpg": (_img(14), 0),
        "cat/d.jpg": (_img(12), 1)}


def test_sidecars_whose_suffixes_differ_only_in_case_are_refused_naming_both(tmp_path):
    src = tmp_path / "src"
    _write(src, {"a.jpg": _img(1), "a.TXT": b"upper", "a.txt": b"lower", "b.jpg": _img(2), "b.txt": b"b"})
    if len({p.name for p in src.iterdir()}) < 5:
        pytest.skip("a case-insensitive file system holds one of a.TXT and a.txt")
    with pytest.raises(ValueError, match=r"a\.TXT and .*a\.txt: both are the 'txt' sidecar file of a\.\*") as err:
        pack_layout(src, tmp_path / "out", PackOptions(workers=1), LayoutOptions(no_labels=True, sidecars=("txt",)))
    assert "rename or remove one" in str(err.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


_LAYOUTS = {
    "class folders": None,
    "sidecars": LayoutOptions(sidecars=("txt",)),
    "no labels": LayoutOptions(no_labels=True),
    "labels file": "labels",
}


def _layout(name: str, tmp_path: Path):
    if _LAYOUTS[name] == "labels":
        (tmp_path / "labels.csv").write_text("bird/b1.jpg,1\ncat/a.jpg,0\ncat/c.jpg,0\ncat/d.jpg,1\n")
        return LayoutOptions(labels_file=tmp_path / "labels.csv")
    return _LAYOUTS[name]


@pytest.mark.parametrize("name", list(_LAYOUTS))
def test_a_link_out_of_src_stops_every_layout_naming_link_target_and_fix(tmp_path, name):
    src = _annex_tree(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        pack(src, out, PackOptions(workers=1), layout=_layout(name, tmp_path))
    msg = str(err.value)
    # the first link out of SRC: the class folder "bird" -> store/birds (sorted before cat/a.jpg)
    assert msg.startswith(f"{src / 'bird'}: link out of SRC (points to {tmp_path / 'store' / 'birds'})"), msg
    assert "give the folder that holds both as SRC" in msg and "--follow-external-links" in msg
    assert "--on-error skip" in msg and "2 more" in msg
    assert _nothing_written(out)


@pytest.mark.parametrize("name", list(_LAYOUTS))
def test_links_out_of_src_are_skipped_and_counted_under_their_own_reason(tmp_path, name):
    src = _annex_tree(tmp_path)
    report = pack(src, tmp_path / "out", PackOptions(workers=1, on_error="skip"), layout=_layout(name, tmp_path))
    got = _members(tmp_path / "out")
    assert {p: m["jpg"] for p, m in got.items()} == {"cat/c.jpg": _img(14)}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    links = [s for s in manifest["skipped"] if s["reason"].startswith("link out of SRC (points to ")]
    assert sorted(s["path"] for s in links) == ["bird", "cat/a.jpg", "cat/d.jpg"]
    assert not any(_img(11) in p.read_bytes() or _img(13) in p.read_bytes() for p in (tmp_path / "out").iterdir()
                   if p.is_file())
    assert "3 link out of SRC" in report.summary()


def test_links_inside_src_are_followed_in_every_layout(tmp_path):
    src = tmp_path / "src"
    _write(src, {"cat/c.jpg": _img(1), "store/k1": _img(2), "store/birds/b.jpg": _img(3)})
    os.symlink(src / "store" / "k1", src / "cat" / "a.jpg")          # a file link inside SRC
    os.symlink(src / "store" / "birds", src / "cat" / "birds")       # a folder link inside SRC
    os.symlink("../cat", src / "cat" / "loop")                       # a loop: walked once
    pack(src, tmp_path / "plain", PackOptions(workers=1, extensions=("jpg",)))
    assert {p: m["jpg"] for p, m in _members(tmp_path / "plain").items()} == {
        "cat/a.jpg": _img(2), "cat/c.jpg": _img(1), "store/birds/b.jpg": _img(3)}
    pack_layout(src, tmp_path / "none", PackOptions(workers=1), LayoutOptions(no_labels=True))
    assert {p: m["jpg"] for p, m in _members(tmp_path / "none").items()} == {
        "cat/a.jpg": _img(2), "cat/c.jpg": _img(1), "store/birds/b.jpg": _img(3)}


# ---------------------------------------------------------------------------------------------
# member names: two things under one member name are refused before anything is written


def _nothing_written(out: Path) -> bool:
    return not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


def test_an_image_extension_that_is_a_reserved_member_is_refused_by_pack(tmp_path):
    src = tmp_path / "src"
    _write(src, {"cat/a.jpg": _img(1), "cat/b.json": _img(2)})  # an image named .json: member b.json twice
    with pytest.raises(ValueError, match=r"--extensions: image extension 'json' is the member 'json'"):
        pack(src, tmp_path / "out", PackOptions(workers=1, extensions=("jpg", "json")))
    assert _nothing_written(tmp_path / "out")


@pytest.mark.parametrize("exts, sidecars, both", [
    (("jpg",), ("json", "sidecar.json"), "field 'sidecar.json' and field 'json'"),
    (("jpg", "dat"), ("dat",), "field 'dat' and image extension 'dat'"),
    (("jpg", "txt"), ("caption",), "image extension 'txt' is the member 'txt'"),
])
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_a_sidecar_suffix_or_extension_that_names_a_taken_member_is_refused(tmp_path, exts, sidecars, both, fmt):
    src = tmp_path / "src"
    _write(src, {"x.jpg": _img(1), "x.json": b"{}", "x.sidecar.json": b"[1]", "x.dat": _img(2), "x.caption": b"c"})
    with pytest.raises(ValueError, match=rf"--extensions/--sidecars: {both}"):
        pack(src, tmp_path / "out", PackOptions(workers=1, format=fmt, extensions=exts),
             layout=LayoutOptions(no_labels=True, sidecars=sidecars))
    with pytest.raises(ValueError, match=both):
        pack_layout(src, tmp_path / "out", PackOptions(workers=1, format=fmt, extensions=exts),
                    LayoutOptions(no_labels=True, sidecars=sidecars))
    assert _nothing_written(tmp_path / "out")


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_write_dataset_refuses_fields_named_into_one_member(tmp_path, fmt):
    from shardfeed.convert import write_dataset

    with pytest.raises(ValueError, match=r"field 'sidecar.json' and field 'json' would both be stored as member "
                                         r"'sidecar.json'"):
        write_dataset([{"image": _img(1), "ext": "jpg"}], tmp_path / "a", format=fmt, fields=("json", "sidecar.json"))
    assert _nothing_written(tmp_path / "a")
    with pytest.raises(ValueError, match=r"sample 0 \(x.jpg\): field 'sidecar.json' and field 'json'"):
        write_dataset([{"image": _img(1), "ext": "jpg", "path": "x.jpg", "json": {"a": 1}, "sidecar.json": [1]}],
                      tmp_path / "b", format=fmt)
    assert not list((tmp_path / "b").glob("*.tar")) and not (tmp_path / "b" / "manifest.json").exists()
    with pytest.raises(ValueError, match=r"sample 1 \(y.dat\): field 'dat' and image extension 'dat'"):
        write_dataset([{"image": _img(1), "ext": "jpg", "path": "x.jpg", "dat": b"1"},
                       {"image": _img(2), "ext": "dat", "path": "y.dat"}], tmp_path / "c", format=fmt)
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_convert_and_check_refuse_a_dataset_whose_fields_share_a_member(tmp_path):
    from shardfeed.convert import check_dataset, convert_dataset, write_dataset
    from shardfeed.readers.errors import ManifestError

    src = tmp_path / "src"
    write_dataset([{"image": _img(1), "ext": "jpg", "json": {"a": 1}}], src)
    data = json.loads((src / "manifest.json").read_text())
    data["fields"]["sidecar.json"] = dict(data["fields"]["json"])  # as an older writer accepted it
    (src / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"field 'sidecar.json' and field 'json' would both be stored"):
        convert_dataset(src, tmp_path / "out", format="lmdb")
    assert _nothing_written(tmp_path / "out")
    with pytest.raises(ManifestError, match="would both be stored"):
        check_dataset(src)


# ---------------------------------------------------------------------------------------------
# what is left out is counted under its real reason


def test_what_a_layout_pack_leaves_out_is_counted_under_its_real_reason(tmp_path):
    src = tmp_path / "src"
    _write(src, {"img.jpg": _img(1), "img.v2.jpg": _img(2), "img.txt": b"cap", "lone.txt": b"no image",
                 "notes.md": b"# notes", ".DS_Store": b"x", "unlisted.jpg": _img(3)})
    os.symlink(tmp_path / "gone.jpg", src / "broken.jpg")
    (tmp_path / "labels.csv").write_text("img.jpg,a\nimg.v2.jpg,b\nmissing.jpg,a\n")
    report = pack_layout(src, tmp_path / "out", PackOptions(workers=1, on_error="skip"),
                         LayoutOptions(labels_file=tmp_path / "labels.csv", sidecars=("txt",)))
    assert sorted(_members(tmp_path / "out")) == ["img.jpg", "img.v2.jpg"]
    assert sorted((d["path"], d["reason"]) for d in report.ignored) == [
        (".DS_Store", "hidden file"), ("lone.txt", "sidecar file without an image of the same stem"),
        ("notes.md", "extension not packed")]
    skipped = {d["path"]: d["reason"] for d in report.skipped}
    assert skipped["unlisted.jpg"] == "no row in the labels file"
    assert skipped["missing.jpg"] == "listed in the labels file, no such image"
    assert skipped["broken.jpg"].startswith("broken symbolic link (points to ")
    assert len(skipped) == 3
    summary = report.summary()
    assert ("3 files skipped (1 broken symbolic link, 1 no row in the labels file, 1 listed in the labels file, "
            "no such image; listed in the manifest)") in summary
    assert "3 files ignored (1 hidden file, 1 sidecar file without an image of the same stem, " \
           "1 extension not packed)" in summary
