"""Faults in the source folder: broken links, symlink loops and names that
are not UTF-8. Right values come from the files written here (bytes, true class folder), read
back with the standard library's tarfile."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _img(seed: int, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(6, 5, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def _shard_samples(out: Path) -> list[dict]:
    """Every sample of the shards via tarfile: {"data", "cls", "meta"}."""
    samples: dict[str, dict] = {}
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                data = tf.extractfile(m).read()
                s = samples.setdefault(key, {})
                if ext == "cls":
                    s["cls"] = int(data)
                elif ext == "json":
                    s["meta"] = json.loads(data)
                else:
                    s["data"] = data
    return list(samples.values())


def _classes_torchvision(root: Path) -> list[str]:
    """torchvision's find_classes rule: sorted sub-folder names (links followed)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


# ---------------------------------------------------------------------------------------------
# item 7: symlink loops

@pytest.mark.parametrize("variant", ["loop-to-root", "links-into-other-classes"])
def test_symlinked_folders_never_move_an_image_to_another_class(variant, tmp_path):
    """Links back to the root or into another class add nothing, whichever the walk meets first
    (``aaa/`` sorts before the class it links into, ``zzz/`` after): every image once, true class."""
    root = tmp_path / "src"
    files = {"aaa/a0.png": _img(0), "cat/c0.png": _img(1), "cat/sub/c1.png": _img(2),
             "dog/d0.png": _img(3), "dog/sub/d1.png": _img(4), "zzz/z0.png": _img(5), "zzz/deep/z1.png": _img(6)}
    _write(root, files)
    if variant == "loop-to-root":
        os.symlink("..", root / "cat" / "loop")                  # cat/loop -> the image folder
        os.symlink("../../..", root / "dog" / "sub" / "up")      # dog/sub/up -> the image folder
    else:
        os.symlink("../zzz/deep", root / "aaa" / "alias")         # met before zzz/deep in sorted order
        os.symlink("../dog", root / "cat" / "dogs")               # a whole other class
        os.symlink("../../cat/sub", root / "zzz" / "deep" / "back")
    out = tmp_path / "out"
    report = pack(root, out, PackOptions(workers=1, max_count=3))
    classes = _classes_torchvision(root)
    true = {rel: (data, classes.index(rel.split("/")[0])) for rel, data in files.items()}
    got = _shard_samples(out)
    assert sorted(s["meta"]["path"] for s in got) == sorted(true)  # each image once, by its real path
    for s in got:
        assert (s["data"], s["cls"], s["meta"]["class"]) == (true[s["meta"]["path"]][0], true[s["meta"]["path"]][1],
                                                            s["meta"]["path"].split("/")[0])
    assert report.num_samples == len(files) and not report.skipped


def test_class_folder_linked_into_another_class_adds_nothing(tmp_path):
    """``alias -> cat/sub`` sorts before ``cat``: cat/sub's images stay in cat; alias keeps its
    index (torchvision's) and holds nothing."""
    root = tmp_path / "src"
    files = {"cat/c.png": _img(1), "cat/sub/s.png": _img(2), "dog/d.png": _img(3)}
    _write(root, files)
    os.symlink("cat/sub", root / "alias")
    report = pack(root, tmp_path / "out", PackOptions(workers=1))
    classes = _classes_torchvision(root)
    assert classes == ["alias", "cat", "dog"] and report.empty_classes == ["alias"]
    got = {s["meta"]["path"]: (s["data"], s["cls"]) for s in _shard_samples(tmp_path / "out")}
    assert got == {rel: (data, classes.index(rel.split("/")[0])) for rel, data in files.items()}


def test_link_to_a_folder_outside_is_followed_once(tmp_path):
    """A folder outside the image folder reached by two links is packed once (links out of SRC
    followed on request), under the link whose path sorts first (``cat/x`` before ``dog/y``)."""
    root, outside = tmp_path / "src", tmp_path / "outside"
    _write(root, {"cat/c.png": _img(1), "dog/d.png": _img(2)})
    _write(outside, {"o.png": _img(3)})
    os.symlink(outside, root / "dog" / "y")
    os.symlink(outside, root / "cat" / "x")
    pack(root, tmp_path / "out", PackOptions(workers=1, follow_external_links=True))
    got = {s["meta"]["path"]: (s["data"], s["cls"]) for s in _shard_samples(tmp_path / "out")}
    assert got == {"cat/c.png": (_img(1), 0), "dog/d.png": (_img(2), 1), "cat/x/o.png": (_img(3), 0)}


# ---------------------------------------------------------------------------------------------
# item 6: broken links

def test_broken_link_in_a_class_stops_the_pack_naming_it_or_is_skipped(tmp_path):
    root = tmp_path / "src"
    files = {"cat/c.png": _img(1), "dog/d.png": _img(2)}
    _write(root, files)
    os.symlink(tmp_path / "gone.jpg", root / "cat" / "gone.jpg")
    os.symlink(tmp_path / "gone.txt", root / "dog" / "notes.txt")  # not an image name: ignored as before
    with pytest.raises(ValueError, match=r"cat/gone\.jpg: broken symbolic link \(points to .*gone\.jpg\).*"
                                         r"--on-error skip"):
        pack(root, tmp_path / "out1", PackOptions(workers=1))
    assert not (tmp_path / "out1").exists()
    report = pack(root, tmp_path / "out2", PackOptions(workers=1, on_error="skip"))
    manifest = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert [(s["path"], s["reason"].split(" (")[0]) for s in manifest["skipped"]] == \
        [("cat/gone.jpg", "broken symbolic link")]
    assert manifest["files"]["skipped"] == 1 and report.num_samples == 2
    assert {s["meta"]["path"]: s["data"] for s in _shard_samples(tmp_path / "out2")} == files
    assert [i["path"] for i in report.ignored] == ["dog/notes.txt"]
    pack(root, tmp_path / "db", PackOptions(workers=1, on_error="skip", format="lmdb"))
    manifest = json.loads((tmp_path / "db" / "manifest.json").read_text())
    assert [s["path"] for s in manifest["skipped"]] == ["cat/gone.jpg"] and manifest["num_samples"] == 2
    # the CLI: one line naming the file, no traceback
    r = subprocess.run([*SHARDFEED, "pack", str(root), str(tmp_path / "out3")], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "cat/gone.jpg: broken symbolic link" in r.stderr


# ---------------------------------------------------------------------------------------------
# item 8: names that are not UTF-8

@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file systems refuse names that are not UTF-8")
def test_names_not_utf8_are_named_escaped_and_skippable(tmp_path):
    root = tmp_path / "src"
    files = {"cat/c.png": _img(1), "dog/d.png": _img(2)}
    _write(root, files)
    broot = os.fsencode(root)
    with open(os.path.join(broot, b"cat", b"caf\xe9.png"), "wb") as f:  # Latin-1 file name
        f.write(_img(3))
    os.mkdir(os.path.join(broot, b"r\xe9seau"))                            # Latin-1 class folder
    with open(os.path.join(broot, b"r\xe9seau", b"x.png"), "wb") as f:
        f.write(_img(4))
    with pytest.raises(ValueError, match=r"cat/caf%E9\.png: name not valid UTF-8.*convmv.*--on-error skip"):
        pack(root, tmp_path / "out1", PackOptions(workers=1))
    r = subprocess.run([*SHARDFEED, "pack", str(root), str(tmp_path / "out3")], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "codec" not in r.stderr
    assert "caf%E9.png: name not valid UTF-8" in r.stderr

    pack(root, tmp_path / "out2", PackOptions(workers=1, on_error="skip"))
    manifest = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert sorted(s["path"] for s in manifest["skipped"]) == ["cat/caf%E9.png", "r%E9seau/x.png"]
    # the class keeps its torchvision index, under its escaped name; the others keep theirs
    tv = _classes_torchvision(root)
    assert manifest["classes"] == [c.replace("\udce9", "%E9") for c in tv]
    got = {s["meta"]["path"]: (s["data"], s["cls"]) for s in _shard_samples(tmp_path / "out2")}
    assert got == {rel: (data, tv.index(rel.split("/")[0])) for rel, data in files.items()}


# ---------------------------------------------------------------------------------------------
# item 9: one name policy (pack refuses or skips what unpack would refuse)

def test_backslash_names_are_refused_at_pack_time_and_unpack_writes_back_what_pack_accepted(tmp_path):
    from shardfeed.convert.tools.unpack import unpack

    root = tmp_path / "src"
    files = {"cat/c.png": _img(1), "dog/d.png": _img(2), "dog/sub/e.png": _img(5)}
    _write(root, files)
    (root / "cat" / "a\\b.png").write_bytes(_img(3))       # a backslash in a file name
    (root / "back\\slash").mkdir()                        # ... and in a class name
    (root / "back\\slash" / "x.png").write_bytes(_img(4))
    with pytest.raises(ValueError, match=r"back%5Cslash/x\.png: name holds a backslash.*rename it.*and 1 more.*"
                                         r"--on-error skip"):
        pack(root, tmp_path / "out1", PackOptions(workers=1))
    report = pack(root, tmp_path / "out2", PackOptions(workers=1, on_error="skip"))
    manifest = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert sorted(s["path"] for s in manifest["skipped"]) == ["back%5Cslash/x.png", "cat/a%5Cb.png"]
    tv = _classes_torchvision(root)  # the class keeps its index, under its escaped name
    assert manifest["classes"] == [c.replace("\\", "%5C") for c in tv] and report.num_samples == 3
    # unpack writes back every packed file, byte for byte; it refuses nothing pack accepted
    unpack(tmp_path / "out2", tmp_path / "back")
    got = {str(p.relative_to(tmp_path / "back")): p.read_bytes() for p in (tmp_path / "back").rglob("*.png")}
    assert got == files
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == sorted(manifest["classes"])
