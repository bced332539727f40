"""`pack --append` and files at paths the dataset holds: a changed one is refused by name unless
`--skip-changed`; the summary counts the classes of the new images.

The expectations come from the planted files (their bytes, sizes and times), never from the
append's own output.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfeed.convert.write.append import ChangedFilesError
from shardfeed.convert.cli import main
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.write.path_index import is_path_index
from shardfeed.readers import open_dataset


def _bytes(seed: int, n: int = 300) -> bytes:
    """Distinct JPEG-looking bytes (a pack stores them as they are)."""
    return b"\xff\xd8\xff\xe0" + hashlib.sha256(str(seed).encode()).digest() * (n // 32) + b"\xff\xd9"


def _plant(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _read(out: Path) -> dict[str, bytes]:
    return {s.meta["path"]: s.data for s in open_dataset(out, decode=False, shuffle=False)}


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _options(**kw) -> PackOptions:
    return PackOptions(workers=1, max_count=3, **kw)


@pytest.fixture()
def packed(tmp_path):
    planted = {f"cat/c{i}.jpg": _bytes(i) for i in range(3)} | {f"dog/d{i}.jpg": _bytes(10 + i) for i in range(2)}
    _plant(tmp_path / "src", planted)
    out = tmp_path / "out"
    pack(tmp_path / "src", out, _options())
    return tmp_path / "src", out, planted


def test_a_changed_file_at_a_packed_path_is_refused_by_name_and_nothing_is_written(packed):
    src, out, planted = packed
    (src / "cat/c1.jpg").write_bytes(_bytes(99, 600))  # new bytes, another size
    _plant(src, {"dog/d5.jpg": _bytes(50)})
    before = _files(out)
    new_size, old_size = len(_bytes(99, 600)), len(planted["cat/c1.jpg"])
    with pytest.raises(ChangedFilesError, match=f"size is {new_size} bytes, the packed image's {old_size}") as err:
        pack(src, out, _options(append=True))
    assert str(src / "cat/c1.jpg") in str(err.value) and "--skip-changed" in str(err.value)
    assert "--overwrite" in str(err.value)
    assert err.value.paths == [str(src / "cat/c1.jpg")]
    assert _files(out) == before  # nothing written, the dataset as it was
    r = CliRunner().invoke(main, ["pack", str(src), str(out), "--append", "--workers", "1"])
    assert r.exit_code == 1 and "cat/c1.jpg" in r.output and "--skip-changed" in r.output


def test_skip_changed_leaves_the_packed_image_and_counts_it(packed):
    src, out, planted = packed
    (src / "cat/c1.jpg").write_bytes(_bytes(99, 600))
    _plant(src, {"dog/d5.jpg": _bytes(50)})
    r = CliRunner().invoke(main, ["pack", str(src), str(out), "--append", "--skip-changed", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "5 images already in it skipped (1 of them changed since they were packed" in r.output
    assert _read(out) == planted | {"dog/d5.jpg": _bytes(50)}  # the packed bytes of cat/c1.jpg stay
    (src / "cat/c1.jpg").write_bytes(_bytes(98, 900))  # the path index keeps the packed file's record
    with pytest.raises(ChangedFilesError, match="cat/c1.jpg"):
        pack(src, out, _options(append=True))


def test_a_file_touched_with_the_same_size_is_refused_naming_its_time(packed):
    src, out, planted = packed
    st = os.stat(src / "dog/d1.jpg")
    os.utime(src / "dog/d1.jpg", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ChangedFilesError, match="modification time differs") as err:
        pack(src, out, _options(append=True))
    assert err.value.paths == [str(src / "dog/d1.jpg")]
    report = pack(src, out, _options(append=True, skip_changed=True))
    assert report.num_samples == 0 and report.extra["duplicates"] == 5 and report.extra["changed"] == 1


def test_without_a_path_index_the_shards_give_the_packed_sizes(packed):
    src, out, planted = packed
    (out / ".shardfeed-paths").unlink()  # the paths and image sizes are read from the shards
    (src / "dog/d0.jpg").write_bytes(_bytes(77, 100))
    (src / "cat/c2.jpg").write_bytes(_bytes(78, 900))
    with pytest.raises(ChangedFilesError, match="1 more changed files") as err:
        pack(src, out, _options(append=True))
    assert sorted(err.value.paths) == [str(src / "cat/c2.jpg"), str(src / "dog/d0.jpg")]


def test_an_index_of_the_earlier_version_is_read_from_the_shards_and_still_owned(packed):
    src, out, planted = packed
    index = out / ".shardfeed-paths"
    old = b"SFPATHS1" + index.read_bytes()[8:64 + 8 * 5]  # the hashes-only version: no sizes
    assert is_path_index(old)
    index.write_bytes(old)
    (src / "cat/c0.jpg").write_bytes(_bytes(66, 700))
    with pytest.raises(ChangedFilesError, match="cat/c0.jpg"):
        pack(src, out, _options(append=True))
    pack(src, out, _options(overwrite=True))  # the old index is the dataset's own: replaced, not refused
    assert index.read_bytes()[:8] == b"SFPATHS2"


def test_the_summary_counts_the_classes_of_the_new_images(tmp_path):
    src = tmp_path / "src"
    _plant(src, {f"class{c:02d}/i{i}.jpg": _bytes(100 * c + i) for c in range(11) for i in range(2)})
    out = tmp_path / "out"
    pack(src, out, _options())
    new = tmp_path / "new"
    _plant(new, {f"class03/n{i}.jpg": _bytes(5000 + i) for i in range(5)})
    r = CliRunner().invoke(main, ["pack", str(new), str(out), "--append", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("packed 5 samples in 1 class into")
    assert "appended: 0 new classes; the dataset holds 27 samples in 11 classes" in r.output
    more = tmp_path / "more"
    _plant(more, {"class01/m0.jpg": _bytes(6000), "zebra/z0.jpg": _bytes(6001), "yak/y0.jpg": _bytes(6002)})
    report = pack(more, out, _options(append=True))
    assert report.num_classes == 3 and report.extra["new_classes"] == 2
    assert "appended: 2 new classes; the dataset holds 30 samples in 13 classes" in report.summary()


def test_skip_changed_without_append_is_refused(tmp_path):
    with pytest.raises(ValueError, match="applies to an append only"):
        PackOptions(skip_changed=True)
