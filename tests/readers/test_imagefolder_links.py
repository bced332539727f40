"""The link rule of the readers' image-folder source (the pack's rule and wording): a symbolic
link whose target lies inside the folder is followed; one whose target lies outside is refused,
naming the link, its target and the fix, unless ``follow_external_links`` is given."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.readers import open_dataset
from shardfeed.readers.format.imagefolder import scan_image_folder
from shardfeed.readers.measure import dataset_files


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(6, 5, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


@pytest.fixture
def linked(tmp_path) -> Path:
    """SRC with a class folder, a folder and an image linked out of it, and links inside it."""
    src, store = tmp_path / "src", tmp_path / "store"
    _write(src, {"cat/c.png": _png(1), "dog/d.png": _png(2), "dog/inside/i.png": _png(3)})
    _write(store, {"birds/b.png": _png(4), "k1": _png(5), "more/m.png": _png(6)})
    os.symlink(store / "birds", src / "bird")              # a class folder out of SRC
    os.symlink(store / "k1", src / "cat" / "a.png")        # an image out of SRC
    os.symlink(store / "more", src / "dog" / "more")       # a folder out of SRC
    os.symlink(src / "dog" / "inside" / "i.png", src / "cat" / "alias.png")  # a file inside SRC
    os.symlink("../dog/inside", src / "cat" / "in")        # a folder inside SRC (walked once: under dog)
    return src


def _read(ds) -> dict[str, bytes]:
    out = {}
    for i in range(len(ds)):
        s = ds[i]
        out[s.meta["path"]] = s.data
    return out


def test_folder_source_refuses_a_link_out_of_the_folder_naming_it(linked, tmp_path):
    with pytest.raises(ValueError) as err:
        open_dataset(linked, decode=False)
    msg = str(err.value)
    assert msg.startswith(f"{linked / 'bird'}: link out of SRC (points to {tmp_path / 'store' / 'birds'})"), msg
    assert "--follow-external-links" in msg and "follow_external_links=True" in msg and "2 more" in msg


def test_folder_source_follows_links_out_of_the_folder_when_asked(linked):
    got = _read(open_dataset(linked, decode=False, shuffle=False, follow_external_links=True))
    assert got == {"bird/b.png": _png(4), "cat/a.png": _png(5), "cat/alias.png": _png(3), "cat/c.png": _png(1),
                   "dog/d.png": _png(2), "dog/inside/i.png": _png(3), "dog/more/m.png": _png(6)}


def test_links_inside_the_folder_are_followed_by_default(linked):
    for link in ("bird", "cat/a.png", "dog/more"):
        os.unlink(linked / link)
    got = _read(open_dataset(linked, decode=False, shuffle=False))
    assert got == {"cat/alias.png": _png(3), "cat/c.png": _png(1), "dog/d.png": _png(2),
                   "dog/inside/i.png": _png(3)}


def test_a_flat_folder_refuses_an_image_linked_out_of_it(tmp_path):
    src = tmp_path / "flat"
    _write(src, {"a.png": _png(1)})
    _write(tmp_path, {"elsewhere.png": _png(2)})
    os.symlink(tmp_path / "elsewhere.png", src / "b.png")
    with pytest.raises(ValueError, match=r"flat/b\.png: link out of SRC \(points to .*elsewhere\.png\)"):
        open_dataset(src, decode=False)
    got = _read(open_dataset(src, decode=False, shuffle=False, follow_external_links=True))
    assert got == {"a.png": _png(1), "b.png": _png(2)}


def test_scan_lists_links_out_of_the_folder_as_unpackable(linked):
    scan = scan_image_folder(linked)
    assert sorted((u["path"], u["reason"].split(" (")[0]) for u in scan.unpackable) == [
        ("bird", "link out of SRC"), ("cat/a.png", "link out of SRC"), ("dog/more", "link out of SRC")]
    assert sorted(f.rel for f in scan.files) == ["cat/alias.png", "cat/c.png", "dog/d.png", "dog/inside/i.png"]


def test_page_cache_files_follow_the_same_rule(linked, tmp_path):
    store = os.path.realpath(tmp_path / "store")
    inside = dataset_files(linked)
    assert inside and not any(str(f).startswith(store) for f in inside)
    followed = dataset_files(linked, follow_external_links=True)
    assert sorted(str(f) for f in followed if str(f).startswith(store)) == sorted(
        os.path.join(store, p) for p in ("birds/b.png", "k1", "more/m.png"))


def test_verify_check_reads_the_folder_by_the_rule_and_a_packed_dataset_ignores_it(linked, tmp_path):
    from shardfeed.convert.write.pack import PackOptions, pack
    from shardfeed.readers.measure import check_same_samples

    out = tmp_path / "out"
    pack(linked, out, PackOptions(workers=1, follow_external_links=True))
    with pytest.raises(ValueError, match=r"bird: link out of SRC"):
        check_same_samples(linked, out)
    assert check_same_samples(linked, out, deep=True, follow_external_links=True)["num_samples"] == 7


@pytest.mark.parametrize("command", ["bench", "verify", "tune"])
def test_measuring_commands_take_the_link_flag(command):
    from click.testing import CliRunner

    from shardfeed.convert.cli import main

    r = CliRunner().invoke(main, [command, "--help"])
    assert r.exit_code == 0 and "--follow-external-links" in r.output, r.output
