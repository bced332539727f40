"""The ImageFolder scan's accounting of what it does not pack (expectations written out by hand):
loose files at the root, hidden folders and files, other extensions, things that are not regular
files; and links to folders, which torchvision follows (``os.walk(followlinks=True)``)."""

from __future__ import annotations

import os

import pytest

from shardfeed.readers.format.imagefolder import parse_extensions, scan_image_folder


@pytest.fixture
def odd_folder(tmp_path):
    root = tmp_path / "root"
    for d in ("cat", "dog", "fish", ".elsewhere/sub", ".cache"):
        (root / d).mkdir(parents=True)
    files = {"cat/a.jpg": b"a", "cat/B.PNG": b"b", "cat/.hidden.jpg": b"h", "cat/notes.txt": b"t",
             "dog/c.jpeg": b"c", "README.md": b"r", ".cache/x.jpg": b"x", ".elsewhere/sub/d.jpg": b"d"}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    os.mkfifo(root / "dog" / "pipe.jpg")
    os.symlink(root / ".elsewhere" / "sub", root / "dog" / "linked2")  # a folder link inside a class
    os.symlink(root / "missing", root / "dangling")  # a broken link at the root
    return root


def test_scan_accounts_for_everything_it_does_not_pack(odd_folder):
    scan = scan_image_folder(odd_folder)
    assert scan.classes == ["cat", "dog", "fish"]
    assert scan.empty_classes == ["fish"] and scan.class_to_idx == {"cat": 0, "dog": 1, "fish": 2}
    assert [(f.rel, f.label) for f in scan.files] == [("cat/B.PNG", 0), ("cat/a.jpg", 0),
                                                      ("dog/c.jpeg", 1), ("dog/linked2/d.jpg", 1)]
    assert sorted((i["path"], i["reason"]) for i in scan.ignored) == sorted([
        ("README.md", "not in a class folder"),
        ("dangling", "broken symbolic link"),
        ("cat/.hidden.jpg", "hidden file"),
        ("cat/notes.txt", "extension not packed"),
        ("dog/pipe.jpg", "not a regular file"),
        (".cache/x.jpg", "in a hidden folder"),
        (".elsewhere/sub/d.jpg", "in a hidden folder"),
    ])
    assert scan.num_found == 4 + 7


def test_parse_extensions():
    assert parse_extensions(" .PNG, jpg,,JPG ,.webp") == ("png", "jpg", "webp")
    assert parse_extensions([".Tif", "tif"]) == ("tif",)
    for bad in ("", " , ", "tar.gz", "a/b"):
        with pytest.raises(ValueError):
            parse_extensions(bad)


def test_take_a_range_and_a_list(odd_folder):
    files = scan_image_folder(odd_folder).files
    everything = [(f.rel, f.label, f.size) for f in files]
    assert [(f.rel, f.label, f.size) for f in files.take(range(1, 3))] == everything[1:3]
    assert [(f.rel, f.label, f.size) for f in files.take(range(0, 4, 2))] == everything[0:4:2]
    assert [(f.rel, f.label, f.size) for f in files.take([3, 0])] == [everything[3], everything[0]]
