"""Class order: the sorted folder names, exactly as torchvision's ``ImageFolder`` sorts them.

torchvision (``torchvision/datasets/folder.py``, ``find_classes``) takes
``sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())``: Python's ``str``
order, by code point, so upper case sorts before lower case (``Bird, Zebra, ant, cat``) and
non-ASCII names after ASCII ones. The expectation below is written out by hand, checked against
plain ``sorted()`` of the names created and against that rule applied to the folder (and against
torchvision itself where it is installed); a case-insensitive or locale-aware sort fails it.
"""

from __future__ import annotations

import os

import pytest

from shardfeed.readers import open_dataset

#: The order torchvision gives for the fixture's class folders, written out (code point order:
#: "B" 0x42 < "Z" 0x5A < "a" 0x61 < "c" 0x63 < "Ö" 0xD6 < "é" 0xE9 < "東" 0x6771).
EXPECTED = ["Bird", "Zebra", "ant", "cat", "Öl", "élan", "東京"]


def _torchvision_rule(directory) -> list[str]:
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


@pytest.fixture(scope="module")
def expected(mixed_case_folder) -> dict[str, tuple[bytes, int]]:
    """``{relative_path: (bytes, label)}`` with labels from :data:`EXPECTED`."""
    names = os.listdir(mixed_case_folder)  # directory order, unsorted
    assert EXPECTED == sorted(names) == _torchvision_rule(mixed_case_folder)
    assert EXPECTED != sorted(names, key=str.casefold)  # the fixture tells the two apart
    try:
        from torchvision.datasets.folder import find_classes
    except ImportError:
        pass
    else:
        assert find_classes(str(mixed_case_folder))[0] == EXPECTED
    out = {}
    for label, cls in enumerate(EXPECTED):
        for f in sorted((mixed_case_folder / cls).iterdir()):
            out[f"{cls}/{f.name}"] = (f.read_bytes(), label)
    return out


def test_scan_gives_torchvisions_class_order(mixed_case_folder, expected):
    from shardfeed.readers.format.imagefolder import find_classes, scan_image_folder

    assert find_classes(mixed_case_folder) == EXPECTED
    scan = scan_image_folder(mixed_case_folder)
    assert scan.classes == EXPECTED
    assert sorted((f.rel, f.label) for f in scan.files) == sorted((p, y) for p, (_, y) in expected.items())


def _check(samples, expected):
    assert sorted((s.meta["path"], s.data, s.label) for s in samples) == \
        sorted((p, d, y) for p, (d, y) in expected.items())


def test_folder_source_labels(mixed_case_folder, expected):
    ds = open_dataset(mixed_case_folder, decode=False, shuffle=False)
    assert list(ds.classes) == EXPECTED
    _check([ds[i] for i in range(len(ds))], expected)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_packed_class_order_and_labels(fmt, mixed_case_folder, expected, tmp_path):
    import json

    from shardfeed.convert.write.pack import PackOptions, pack

    out = tmp_path / fmt
    pack(mixed_case_folder, out, PackOptions(format=fmt, workers=1, seed=0, max_count=8))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["classes"] == EXPECTED
    ds = open_dataset(out, decode=False, shuffle=False)
    assert list(ds.classes) == EXPECTED
    samples = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    _check(samples, expected)
