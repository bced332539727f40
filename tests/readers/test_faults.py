"""Bad input and faults on the reading side: named errors, counted skips, nothing hangs.

Cases: 1 damaged images read without ``--decode-check``, 6 every image mode
into one batch, 7 a 400-megapixel image among normal ones, 8 a truncated shard and a damaged tar
header, 9 a key whose members are not contiguous (and stray member groups between samples), 14
ranks x workers with uneven shards, 15 an LMDB environment opened before ``fork``/``spawn``, 16 a
read-only LMDB folder. The packing side is in ``tests/convert/test_bad_input_pack.py`` and
``tests/convert/test_bad_input_lmdb.py``.

Inputs are built here; expectations come from the source files (bytes, Pillow decodes, labels
from the folder names) or from Python's ``tarfile``, never from the readers' own output.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardfeed.readers import make_loader, open_dataset
from shardfeed.readers.errors import ImageTooLargeError
from shardfeed.readers.errors import CorruptDataError, IncompleteDatasetError

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]
SOURCES = ("wds", "lmdb", "folder")


def _noise(seed: int, fmt: str, size=(40, 30)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _pixels_sha(data: bytes) -> str:
    """Pillow's own RGB decode of an image file (the independent expectation)."""
    with Image.open(io.BytesIO(data)) as im:
        return hashlib.sha256(np.asarray(im.convert("RGB")).tobytes()).hexdigest()


def _pack(src: Path, out: Path, fmt: str, **kw) -> Path:
    from shardfeed.convert.write.pack import PackOptions, pack

    pack(src, out, PackOptions(format=fmt, workers=1, **kw))
    return out


def _tar_samples(shard: Path) -> list[dict]:
    """The samples of a shard read with ``tarfile``: key, members (with offsets), meta path."""
    out: list[dict] = []
    with tarfile.open(shard) as tf:
        for m in tf.getmembers():
            key, ext = m.name.split(".", 1)
            if not out or out[-1]["key"] != key:
                out.append({"key": key, "offset": m.offset, "members": []})
            data = tf.extractfile(m).read()
            out[-1]["members"].append(m)
            if ext == "json":
                out[-1]["path"] = json.loads(data)["path"]
    return out


# ---------------------------------------------------------------------------------------------
# case 1: damaged images packed without --decode-check

@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict:
    """50 good 40x30 images in 2 classes, a JPEG cut at 60 % and a PNG cut inside its image data;
    packed (no decode check) as WebDataset and LMDB."""
    base = tmp_path_factory.mktemp("faults_damaged")
    root = base / "src"
    for i in range(50):
        p = root / f"c{i % 2}" / f"good_{i:02d}.{'jpg' if i % 3 else 'png'}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_noise(i, "JPEG" if i % 3 else "PNG"))
    jpeg = _noise(100, "JPEG", size=(64, 64))
    (root / "c0" / "cut.jpg").write_bytes(jpeg[: int(len(jpeg) * 0.6)])
    png = _noise(101, "PNG", size=(64, 64))
    idat = png.index(b"IDAT")
    (root / "c1" / "cut.png").write_bytes(png[: idat + (len(png) - idat) // 2])
    good = Counter(_pixels_sha(p.read_bytes()) for p in root.rglob("good_*"))
    labels = Counter(int(p.parent.name[1]) for p in root.rglob("good_*"))
    return {"folder": root, "wds": _pack(root, base / "wds", "wds", max_count=20),
            "lmdb": _pack(root, base / "lmdb", "lmdb"), "good": good, "labels": labels,
            "bad": {"c0/cut.jpg", "c1/cut.png"}}


@pytest.mark.parametrize("kind", SOURCES)
def test_damaged_image_error_names_the_sample(kind, damaged):
    src = damaged[kind]
    with pytest.raises(CorruptDataError) as info:
        for _ in open_dataset(src, shuffle=False):
            pass
    msg = str(info.value)
    named = re.search(r"c[01]/cut\.(jpg|png)", msg)
    assert named, msg
    if kind == "wds":
        m = re.search(r"(shard-\d{6}\.tar) key (\d+)", msg)
        assert m, msg
        # the key named is the one tarfile finds for that original file in that shard
        paths = {s["key"]: s.get("path") for s in _tar_samples(src / m.group(1))}
        assert paths[m.group(2)] == named.group(0)
    elif kind == "lmdb":
        m = re.search(r"data\.mdb key (\d+)", msg)
        assert m, msg
        ds = open_dataset(src, decode=False)
        assert ds[int(m.group(1))].meta["path"] == named.group(0)  # keys are sample indices
    else:
        assert str(src / named.group(0)) in msg


@pytest.mark.multiprocess
def test_damaged_image_error_through_loader_workers(damaged):
    loader = make_loader(damaged["wds"], 8, num_workers=2, shuffle=False, persistent_workers=False, timeout=60)
    with pytest.raises(CorruptDataError, match=r"shard-\d{6}\.tar key \d+.*c[01]/cut\.(jpg|png)"):
        for _ in loader:
            pass


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", SOURCES)
def test_skip_drops_exactly_the_damaged_and_counts_once_per_epoch(kind, damaged, caplog):
    caplog.set_level(logging.WARNING, logger="shardfeed.readers")
    loader = make_loader(damaged[kind], 8, num_workers=2, on_error="skip", timeout=60)
    ds = loader.dataset
    for epoch in range(2):
        caplog.clear()
        batches = list(loader)
        assert len(batches) == len(loader) == 7  # 52 samples, batch 8: holes keep the batch count
        got = Counter(hashlib.sha256(img.permute(1, 2, 0).contiguous().numpy().tobytes()).hexdigest()
                      for images, _ in batches for img in images)
        assert got == damaged["good"]
        assert Counter(int(y) for _, labels in batches for y in labels) == damaged["labels"]
        assert ds.skipped == 2 and ds.skipped_in_epoch(epoch) == 2
        totals = [r.getMessage() for r in caplog.records if "samples skipped in epoch" in r.getMessage()]
        assert totals == [totals[0]] and f"2 samples skipped in epoch {epoch}" in totals[0], totals
    assert ds.skipped_total == 4


def test_skip_without_loader_drops_them_and_counts(damaged):
    ds = open_dataset(damaged["wds"], on_error="skip", decode=True)
    items = list(ds)
    assert len(items) == 50 and None not in items
    assert ds.skipped == 2 and ds.skipped_total == 2


# ---------------------------------------------------------------------------------------------
# case 6: every image mode into one batch

S = 24  # output side


def _mode_images() -> dict[str, Image.Image]:
    """One image per case, each in its own class folder (the label names the case)."""
    yy, xx = np.mgrid[0:64, 0:64]
    grad16 = (xx * 65535 // 63).astype(np.uint16)  # 0..65535 left to right
    pal = Image.new("P", (48, 32), 0)
    pal.putpalette([255, 0, 0, 0, 0, 255] + [0] * (256 * 3 - 6))
    pal.paste(1, (24, 0, 48, 32))  # left red (index 0), right blue (index 1) ...
    pal.info["transparency"] = 1   # ... and index 1 transparent: white
    rgba = np.zeros((32, 40, 4), np.uint8)
    rgba[..., 1] = 200
    rgba[..., 3] = 255
    rgba[:, 20:, 3] = 0  # right half transparent
    la = np.zeros((30, 30, 2), np.uint8)
    la[..., 0] = 60
    la[..., 1] = 255
    return {
        "a_gray": Image.fromarray((yy * 4).astype(np.uint8)),
        "b_cmyk_cyan": Image.new("CMYK", (40, 40), (255, 0, 0, 0)),
        "c_cmyk_magenta": Image.new("CMYK", (40, 40), (0, 255, 0, 0)),
        "d_cmyk_yellow": Image.new("CMYK", (40, 40), (0, 0, 255, 0)),
        "e_cmyk_dark": Image.new("CMYK", (40, 40), (0, 0, 0, 200)),
        "f_palette_trns": pal,
        "g_rgba": Image.fromarray(rgba, "RGBA"),
        "h_la": Image.fromarray(la, "LA"),
        "i_gray16": Image.fromarray(grad16),
    }


@pytest.fixture(scope="module")
def modes(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("faults_modes")
    root = base / "src"
    expected = {}
    for name, img in _mode_images().items():
        (root / name).mkdir(parents=True)
        if img.mode == "CMYK":
            path = root / name / "x.jpg"
            img.save(path, "JPEG", quality=100)
        else:
            path = root / name / "x.png"
            img.save(path)
        with Image.open(path) as im:  # what the file holds, per Pillow (CMYK: its convert("RGB"))
            expected[name] = (im.mode, np.asarray(im.convert("RGB")) if im.mode == "CMYK" else None)
    assert expected["i_gray16"][0].startswith("I")  # a real 16-bit PNG
    return {"folder": root, "wds": _pack(root, base / "wds", "wds"), "expected": expected,
            "names": sorted(expected)}


@pytest.mark.parametrize("kind", ["folder", "wds"])
def test_every_mode_into_one_rgb_batch(kind, modes):
    loader = make_loader(modes[kind], 16, num_workers=0, image_size=S, shuffle=False)
    (images, labels), = list(loader)
    assert images.dtype == torch.uint8 and tuple(images.shape) == (len(modes["names"]), 3, S, S)
    by_case = {modes["names"][int(y)]: img.numpy().astype(int) for img, y in zip(images, labels)}
    assert sorted(by_case) == modes["names"]
    c = S // 2
    for name in ("b_cmyk_cyan", "c_cmyk_magenta", "d_cmyk_yellow", "e_cmyk_dark"):
        want = modes["expected"][name][1][20, 20].astype(int)  # Pillow's convert("RGB") of the file
        nominal = {"b_cmyk_cyan": (0, 255, 255), "c_cmyk_magenta": (255, 0, 255),
                   "d_cmyk_yellow": (255, 255, 0), "e_cmyk_dark": (55, 55, 55)}[name]
        assert np.abs(want - nominal).max() <= 6, (name, want)  # the JPEG holds the colour
        assert np.abs(by_case[name][:, :, :] - want[:, None, None]).max() <= 4, name
    for name in ("a_gray", "h_la", "i_gray16"):  # grey stays grey: R == G == B
        x = by_case[name]
        assert (x[0] == x[1]).all() and (x[1] == x[2]).all(), name
    assert (by_case["h_la"] == 60).all()
    pal = by_case["f_palette_trns"]
    assert tuple(pal[:, c, 2]) == (255, 0, 0) and tuple(pal[:, c, S - 3]) == (255, 255, 255)
    rgba = by_case["g_rgba"]
    assert tuple(rgba[:, c, 2]) == (0, 200, 0) and tuple(rgba[:, c, S - 3]) == (255, 255, 255)
    row = by_case["i_gray16"][0, c]
    assert (np.diff(row) >= 0).all() and row[0] <= 10 and row[-1] >= 245, row  # the gradient survives


# ---------------------------------------------------------------------------------------------
# case 7: a 20000 x 20000 image among normal ones

@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("faults_huge")
    root = base / "src"
    (root / "a").mkdir(parents=True)
    for i in range(5):
        (root / "a" / f"ok_{i}.png").write_bytes(_noise(i, "PNG"))
    Image.new("1", (20000, 20000)).save(root / "a" / "huge.png")  # 400 Mpx, a small file
    return {"folder": root, "wds": _pack(root, base / "wds", "wds"), "lmdb": _pack(root, base / "lmdb", "lmdb"),
            "good": Counter(_pixels_sha(p.read_bytes()) for p in root.rglob("ok_*"))}


@pytest.mark.parametrize("kind", SOURCES)
def test_huge_image_named_error_or_skipped(kind, huge):
    with pytest.raises(ImageTooLargeError, match=r"400,000,000 pixels") as info:
        for _ in open_dataset(huge[kind], shuffle=False):
            pass
    assert "a/huge.png" in str(info.value)
    loader = make_loader(huge[kind], 4, num_workers=0, on_error="skip")
    batches = list(loader)
    assert len(batches) == len(loader) == 2
    got = Counter(hashlib.sha256(img.permute(1, 2, 0).contiguous().numpy().tobytes()).hexdigest()
                  for images, _ in batches for img in images)
    assert got == huge["good"] and loader.dataset.skipped == 1
    # a larger limit is the documented way to accept it (nothing decoded here: raw samples)
    assert len(list(open_dataset(huge[kind], decode=False, max_pixels=400_000_000))) == 6


# ---------------------------------------------------------------------------------------------
# case 8: a shard cut in the middle of a member, a damaged tar header

def _copy(packed: Path, dst: Path) -> Path:
    shutil.copytree(packed, dst)
    return dst


def _check_kept(samples, expected: dict, kept_paths: set[str]) -> None:
    """Every yielded sample is whole (bytes equal to its source file) and exactly ``kept_paths``."""
    got = [s.meta["path"] for s in samples]
    assert len(got) == len(set(got)) and set(got) == kept_paths
    for s in samples:
        assert (s.data, s.label) == expected[s.meta["path"]]


def test_truncated_shard_refused_at_its_first_read_then_read_up_to_the_cut(packed_wds, tiny_folder_expected, tmp_path):
    d = _copy(packed_wds, tmp_path / "d")
    shard = d / "shard-000001.tar"
    samples = _tar_samples(shard)
    size = shard.stat().st_size
    cut = int(size * 0.6)
    members = [(i, m) for i, s in enumerate(samples) for m in s["members"]]
    hit = next(((i, m) for i, m in members if m.offset_data <= cut < m.offset_data + m.size), None)
    if hit is None:  # 60 % fell on a header or padding: cut the next member's data in half
        hit = next((i, m) for i, m in members if m.offset_data > cut)
        cut = hit[1].offset_data + hit[1].size // 2
    cut_sample, cut_member = hit
    shard.write_bytes(shard.read_bytes()[:cut])

    # (a) the cheap check as the shard is opened for reading: the manifest's size disagrees
    ds = open_dataset(d, decode=False, shuffle=False)
    with pytest.raises(CorruptDataError, match=rf"shard-000001\.tar: {cut} bytes on disk but {size} in manifest.json"):
        list(ds)
    # (b) read anyway: the error names the shard and the member's byte offset
    with pytest.raises(CorruptDataError, match=rf"shard-000001\.tar.* byte offset {cut_member.offset}\b"):
        list(open_dataset(d, decode=False, shuffle=False, check_files=False))
    # under skip: the samples before the cut are kept, the rest of the shard dropped and counted
    ds = open_dataset(d, decode=False, shuffle=False, check_files=False, on_error="skip")
    out = list(ds)
    lost = {s["path"] for s in samples[cut_sample:]}
    _check_kept(out, tiny_folder_expected, set(tiny_folder_expected) - lost)
    assert ds.skipped == len(lost) == len(samples) - cut_sample


@pytest.mark.parametrize("member", [0, 1], ids=["first-header-of-a-sample", "second-header"])
def test_damaged_header_names_offset_and_keeps_samples_before(member, packed_wds, tiny_folder_expected, tmp_path):
    d = _copy(packed_wds, tmp_path / "d")
    shard = d / "shard-000002.tar"
    samples = _tar_samples(shard)
    k = 9
    bad = samples[k]["members"][member].offset
    raw = bytearray(shard.read_bytes())
    for j in range(5, 40):  # flip bytes of the name field (not the data, not the checksum field)
        raw[bad + j] ^= 0x5A
    shard.write_bytes(bytes(raw))  # same size: the open-time check passes

    with pytest.raises(CorruptDataError, match=rf"shard-000002\.tar.*byte offset {bad}\b"):
        list(open_dataset(d, decode=False, shuffle=False))
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    out = list(ds)
    lost = {s["path"] for s in samples[k:]}  # sample k is incomplete either way
    _check_kept(out, tiny_folder_expected, set(tiny_folder_expected) - lost)
    assert ds.skipped == len(samples) - k


@pytest.mark.parametrize("ext,bad", [("cls", b"x"), ("json", b"[")])
def test_raw_read_of_an_unreadable_label_or_meta_names_the_sample(ext, bad, packed_wds, tiny_folder_expected,
                                                                   tmp_path):
    """decode=False: a damaged .cls/.json member (same size, tar still valid) is a CorruptDataError
    naming the shard and key, not a bare ValueError; under skip only that sample is dropped."""
    d = _copy(packed_wds, tmp_path / "d")
    shard = d / "shard-000000.tar"
    samples = _tar_samples(shard)
    k = 3
    m = next(m for m in samples[k]["members"] if m.name.endswith("." + ext))
    raw = bytearray(shard.read_bytes())
    raw[m.offset_data] = bad[0]
    shard.write_bytes(bytes(raw))
    key = m.name.split(".")[0]
    with pytest.raises(CorruptDataError, match=rf"shard-000000\.tar key {key}: unreadable label or metadata"):
        list(open_dataset(d, decode=False, shuffle=False))
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    out = list(ds)
    _check_kept(out, tiny_folder_expected, set(tiny_folder_expected) - {samples[k]["path"]})
    assert ds.skipped == 1


@pytest.mark.multiprocess
def test_damaged_shard_under_loader_keeps_batch_count(packed_wds, tiny_folder_expected, tmp_path):
    d = _copy(packed_wds, tmp_path / "d")
    shard = d / "shard-000000.tar"
    raw = bytearray(shard.read_bytes())
    off = _tar_samples(shard)[5]["offset"]
    raw[off + 3] ^= 0xFF
    shard.write_bytes(bytes(raw))
    loader = make_loader(d, 10, num_workers=2, decode=False, on_error="skip", timeout=60)
    batches = list(loader)
    samples = [s for b in batches for s in b]
    assert len(batches) == len(loader) == 6
    assert len(samples) + loader.dataset.skipped == 60 and loader.dataset.skipped > 0
    for s in samples:
        assert (s.data, s.label) == tiny_folder_expected[s.meta["path"]]


# ---------------------------------------------------------------------------------------------
# case 9: members of one key not contiguous; stray member groups between samples

def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, payload in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload))


def _sample_members(i: int, cls: str, label: int) -> list[tuple[str, bytes]]:
    key = f"s{i:04d}"
    return [(f"{key}.png", _noise(i, "PNG", size=(8, 8))), (f"{key}.cls", str(label).encode()),
            (f"{key}.json", json.dumps({"path": f"{cls}/{i}.png", "class": cls}).encode())]


def test_split_key_is_an_error_naming_key_and_shard(tmp_path):
    d = tmp_path / "split"
    d.mkdir()
    members = [m for i in range(6) for m in _sample_members(i, f"c{i % 2}", i % 2)]
    late = members.pop(2 * 3 + 2)  # s0002.json moves after s0003's members
    members.insert(3 * 3 + 2, late)  # ... after s0003.json
    _write_tar(d / "part-0.tar", members)

    r = subprocess.run([*SHARDFEED, "index", str(d)], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "s0002" in r.stderr and "part-0.tar" in r.stderr, r.stderr
    assert not (d / "manifest.json").exists()

    # a manifest without offset index (as another tool would list the shard): the reader refuses too
    from shardfeed.readers.format.manifest import Manifest, ShardEntry

    raw = (d / "part-0.tar").read_bytes()
    Manifest("webdataset", 6, ["c0", "c1"], {"c0": 0, "c1": 1},
             [ShardEntry("part-0.tar", 6, len(raw), hashlib.sha256(raw).hexdigest())]).write(d)
    with pytest.raises(CorruptDataError, match=r"part-0\.tar.*'s0002' reappears"):
        list(open_dataset(d, decode=False, shuffle=False))
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    keys = [s.key for s in ds]
    assert keys[:2] == ["s0000", "s0001"] and len(keys) == len(set(keys))
    assert len(keys) + ds.skipped == 6


@pytest.mark.parametrize("where", ["between", "end", "both"])
def test_stray_members_listed_by_index_are_passed_over(where, tmp_path):
    """``shardfeed index`` leaves out member groups that are no sample: the reader must too."""
    from shardfeed.convert.tools.index import index_shards

    d = tmp_path / "stray"
    d.mkdir()
    members = [m for i in range(8) for m in _sample_members(i, f"c{i % 2}", i % 2)]
    lonely = [("lonely.jpg", _noise(50, "JPEG", size=(8, 8)))]
    notes = [("notes.txt", b"not a sample")]
    if where in ("between", "both"):
        members[9:9] = lonely  # between s0002 and s0003
        members[16:16] = notes  # between s0004 and s0005
    if where in ("end", "both"):
        members += lonely if where == "end" else [("tail.jpg", _noise(51, "JPEG", size=(8, 8)))]
    _write_tar(d / "part-0.tar", members)
    report = index_shards(d)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["num_samples"] == 8 and len(report.problems) >= 1
    want = {f"s{i:04d}": _noise(i, "PNG", size=(8, 8)) for i in range(8)}
    got = {s.key: s.data for s in open_dataset(d, decode=False, shuffle=False)}
    assert got == want
    # and split by sample ranges over ranks (ranges start and stop around the strays)
    parts = [[s.key for s in open_dataset(d, decode=False, rank=r, world_size=3)] for r in range(3)]
    assert [len(p) for p in parts] == [2, 2, 2] and len({k for p in parts for k in p}) == 6
    decoded = list(open_dataset(d, shuffle=False))
    assert len(decoded) == 8 and [y for _, y in decoded] == [i % 2 for i in range(8)]


# ---------------------------------------------------------------------------------------------
# case 14: ranks x workers, uneven shards: same batch count everywhere, nothing hangs

@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("faults_uneven")
    src = base / "src"
    for i in range(250):
        p = src / f"c{i % 3}" / f"{i:04d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_noise(i, "PNG", size=(8, 8)))
    three = _pack(src, base / "three", "wds", max_count=100)
    counts = [s["num_samples"] for s in json.loads((three / "manifest.json").read_text())["shards"]]
    assert counts == [100, 100, 50]
    small = base / "small_src"
    for i in range(23):
        p = small / f"c{i % 2}" / f"{i:04d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_noise(1000 + i, "PNG", size=(8, 8)))
    one = _pack(small, base / "one", "wds")
    # a copy of the three shards where one image's bytes are zeroed (decode fails there)
    bad = shutil.copytree(three, base / "bad")
    shard = bad / "shard-000000.tar"
    raw = bytearray(shard.read_bytes())
    first = _tar_samples(shard)[7]["members"][0]
    raw[first.offset_data:first.offset_data + first.size] = bytes(first.size)
    shard.write_bytes(bytes(raw))
    from shardfeed.readers.format.manifest import Manifest
    from shardfeed.readers.storage.local_manifest import load_manifest

    m = load_manifest(bad, check_files=False)
    m.shards[0].sha256 = hashlib.sha256(raw).hexdigest()
    Manifest.write(m, bad)
    files = {name: {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.png")}
             for name, folder in (("three", src), ("one", small))}
    return {"three": three, "one": one, "bad": bad, "files": files}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("name,per_rank", [("three", 125), ("one", 11)])
def test_two_ranks_four_workers_same_batch_count(name, per_rank, uneven):
    """Each rank's loader iterated fully, two epochs, with real workers (a worker may get nothing:
    23 samples, 2 ranks x 4 workers, batch 10)."""
    loaders = [make_loader(uneven[name], 10, num_workers=4, rank=r, world_size=2, decode=False,
                           persistent_workers=False, timeout=60) for r in range(2)]
    for _ in range(2):
        keys_by_rank = []
        for loader in loaders:
            batches = list(loader)
            assert len(loader) == len(batches) == -(-per_rank // 10)
            samples = [s for b in batches for s in b]
            assert len(samples) == per_rank
            for s in samples:
                assert s.data == uneven["files"][name][s.meta["path"]]
            keys_by_rank.append({s.key for s in samples})
        assert not keys_by_rank[0] & keys_by_rank[1]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_a_skipped_sample_on_one_rank_does_not_change_its_batch_count(uneven):
    counts, skipped, totals = [], [], []
    for rank in range(2):
        loader = make_loader(uneven["bad"], 10, num_workers=4, rank=rank, world_size=2, shuffle=False,
                             on_error="skip", image_size=8, persistent_workers=False, timeout=60)
        batches = list(loader)
        counts.append((len(loader), len(batches)))
        skipped.append(loader.dataset.skipped)
        totals.append(sum(len(y) for _, y in batches))
    assert counts == [(13, 13), (13, 13)]
    assert skipped == [1, 0] and totals == [124, 125]


# ---------------------------------------------------------------------------------------------
# cases 15 and 16: LMDB across fork / spawn, read-only folder

def _check_raw(samples, expected) -> None:
    assert sorted(s.meta["path"] for s in samples) == sorted(expected)
    for s in samples:
        assert (s.data, s.label) == expected[s.meta["path"]]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_lmdb_opened_by_parent_then_four_workers_two_epochs(ctx, packed_lmdb, tiny_folder_expected):
    ds = open_dataset(packed_lmdb, decode=False)
    first = ds[0]  # the parent opens the environment and reads before the workers start
    assert (first.data, first.label) == tiny_folder_expected[first.meta["path"]]
    loader = make_loader(ds, 8, num_workers=4, multiprocessing_context=ctx, persistent_workers=True, timeout=120)
    for _ in range(2):
        _check_raw([s for b in loader for s in b], tiny_folder_expected)
        s = ds[17]  # the parent reads between epochs, workers alive
        assert (s.data, s.label) == tiny_folder_expected[s.meta["path"]]
    del loader
    _check_raw([ds[i] for i in range(len(ds))], tiny_folder_expected)


def _data_mdb_vmflags(data_mdb: Path) -> list[set[str]]:
    """The ``VmFlags`` of this process's mappings of ``data_mdb`` (from ``/proc/self/smaps``)."""
    out, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            current = fields[5] if len(fields) > 5 else None
        elif line.startswith("VmFlags:") and current == str(data_mdb):
            out.append(set(fields[1:]))
    return out


def _mem_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


@pytest.mark.parametrize("share", [0.3, 0.7])
def test_lmdb_readahead_off_for_a_database_larger_than_half_the_ram(share, packed_lmdb, tiny_folder_expected,
                                                                      tmp_path):
    """README / readers/storage/lmdb_io.py: automatic readahead is on for a ``data.mdb`` up to half the
    physical memory, off above (LMDB then maps it with ``MADV_RANDOM``, which the kernel shows as
    the ``rr`` flag of the mapping in ``/proc/self/smaps``). The big file is the packed database
    grown sparse (no disk blocks) to ``share`` of ``MemTotal``."""
    d = _copy(packed_lmdb, tmp_path / "db")
    data = d / "data.mdb"
    size = int(share * _mem_total_bytes())
    with open(data, "r+b") as f:
        f.truncate(size)  # LMDB ignores the zeros past its last page
    assert data.stat().st_blocks * 512 < 64 << 20  # sparse: nothing of it is on the disk
    ds = open_dataset(d, decode=False, shuffle=False)
    _check_raw([ds[i] for i in range(len(ds))], tiny_folder_expected)
    flags = _data_mdb_vmflags(data.resolve())
    assert flags, "data.mdb is not mapped in this process"
    random_access = all("rr" in f for f in flags)
    assert random_access is (share > 0.5), flags
    # forced the other way, whatever the size (a fresh path: one environment per database and process)
    forced = _copy(packed_lmdb, tmp_path / "forced")
    with open(forced / "data.mdb", "r+b") as f:
        f.truncate(size)
    forced_on = share > 0.5
    ds = open_dataset(forced, decode=False, shuffle=False, readahead=forced_on)
    assert ds[0] is not None
    flags = _data_mdb_vmflags((forced / "data.mdb").resolve())
    assert flags and all(("rr" in f) is (not forced_on) for f in flags), flags


def _flip_image_byte(db: Path, image: bytes) -> bytes:
    """Flip one byte in the middle of ``image``'s bytes inside ``db/data.mdb`` (every copy of
    them, should LMDB hold a stale page too); returns the image as now stored."""
    raw = bytearray((db / "data.mdb").read_bytes())
    at = [m.start() for m in re.finditer(re.escape(image), bytes(raw))]
    assert at, "the image's bytes are not stored contiguously in data.mdb"
    mid = len(image) // 2
    for a in at:
        raw[a + mid] ^= 0x5A
    (db / "data.mdb").write_bytes(bytes(raw))
    flipped = bytearray(image)
    flipped[mid] ^= 0x5A
    return bytes(flipped)


def test_lmdb_flipped_image_byte_fails_its_crc(packed_lmdb, tiny_folder_expected, tmp_path):
    """README: each LMDB record's CRC-32 is checked on read. One image byte flipped in the file:
    ``on_error="raise"`` names the key, ``"skip"`` drops that sample only, ``verify=False`` hands
    back the damaged bytes."""
    import lmdb
    import msgpack

    d = _copy(packed_lmdb, tmp_path / "d")
    target = sorted(tiny_folder_expected)[25]
    image = tiny_folder_expected[target][0]
    env = lmdb.open(str(d), subdir=True, readonly=True, lock=False)
    with env.begin() as txn:  # the record's key, read with lmdb + msgpack (not the reader)
        keys = [k.decode() for k, v in txn.cursor() if not k.startswith(b"__shardfeed")
                and msgpack.unpackb(v, raw=False)["meta"]["path"] == target]
    env.close()
    assert len(keys) == 1
    flipped = _flip_image_byte(d, image)
    ds = open_dataset(d, decode=False, shuffle=False)
    with pytest.raises(CorruptDataError, match=rf"data\.mdb key {keys[0]} \(original file {re.escape(repr(target))}\): "
                                               r"image bytes fail their CRC-32 check"):
        [ds[i] for i in range(len(ds))]
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    _check_kept([s for s in (ds[i] for i in range(len(ds))) if s is not None], tiny_folder_expected,
                set(tiny_folder_expected) - {target})
    assert ds.skipped == 1
    ds = open_dataset(d, decode=False, shuffle=False, verify=False)
    got = {s.meta["path"]: (s.data, s.label) for s in (ds[i] for i in range(len(ds)))}
    assert got[target] == (flipped, tiny_folder_expected[target][1])
    del got[target]
    assert got == {p: v for p, v in tiny_folder_expected.items() if p != target}
    # the iterable path (a loader without workers) raises too, naming the key
    with pytest.raises(CorruptDataError, match=rf"key {keys[0]}"):
        list(make_loader(open_dataset(d, decode=False), 8, num_workers=0))


def _read_only_copy(packed: Path) -> Path:
    ro = Path(tempfile.mkdtemp(prefix="shardfeed-ro-", dir="/tmp"))
    shutil.copy2(packed / "data.mdb", ro / "data.mdb")  # no lock.mdb, and none can be created
    shutil.copy2(packed / "manifest.json", ro / "manifest.json")
    for p in ro.iterdir():
        p.chmod(0o444)
    ro.chmod(0o555)
    return ro


def _read_through_open_dataset(path: str) -> str:
    ds = open_dataset(path, decode=False, shuffle=False)
    raw = sorted((s.meta["path"], hashlib.sha256(s.data).hexdigest(), s.label) for s in ds)
    decoded = sum(1 for img, _ in open_dataset(path, image_size=8) if img.shape == (3, 8, 8))
    return json.dumps({"raw": raw, "decoded": decoded})


@pytest.mark.multiprocess
def test_read_only_lmdb_folder_opens_and_reads(packed_lmdb, tiny_folder_expected, call_on_read_only_folder):
    raw = sorted((p, hashlib.sha256(d).hexdigest(), y) for p, (d, y) in tiny_folder_expected.items())
    want = json.dumps({"raw": raw, "decoded": len(tiny_folder_expected)})
    ro = _read_only_copy(packed_lmdb)
    try:
        assert call_on_read_only_folder(_read_through_open_dataset, ro) == want
        assert sorted(p.name for p in ro.iterdir()) == ["data.mdb", "manifest.json"]
    finally:
        ro.chmod(0o755)
        shutil.rmtree(ro)


def test_unfinished_lmdb_is_refused(packed_lmdb, tmp_path):
    import lmdb

    d = _copy(packed_lmdb, tmp_path / "d")
    (d / "manifest.json").unlink()
    with pytest.raises(IncompleteDatasetError, match="--resume"):
        open_dataset(d)
    env = lmdb.open(str(d), subdir=True)
    with env.begin(write=True) as txn:
        txn.delete(b"__shardfeed_manifest__")
    env.close()
    shutil.copy2(packed_lmdb / "manifest.json", d / "manifest.json")  # a manifest, but the DB lacks its own
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        open_dataset(d)


@pytest.mark.parametrize("damage", ["no-data", "no-label", "label-nil", "no-crc32"])
def test_lmdb_record_with_damaged_fields_is_named_and_skippable(damage, packed_lmdb, tiny_folder_expected, tmp_path):
    """A record that is valid msgpack but lacks a field (or holds a wrong type) is a
    CorruptDataError naming the database and key, and ``on_error="skip"`` drops only it."""
    import lmdb
    import msgpack

    d = _copy(packed_lmdb, tmp_path / "d")
    key = b"000000002"
    env = lmdb.open(str(d), subdir=True, lock=True)
    with env.begin(write=True) as txn:
        rec = msgpack.unpackb(txn.get(key), raw=False)
        path = rec["meta"]["path"]
        field = {"no-data": "data", "no-label": "label", "no-crc32": "crc32"}.get(damage)
        if field:
            del rec[field]
        else:
            rec["label"] = None
        txn.put(key, msgpack.packb(rec, use_bin_type=True))
    env.close()
    with pytest.raises(CorruptDataError, match=rf"data\.mdb key 000000002 \(original file {re.escape(repr(path))}\): "
                                               r"damaged record"):
        ds = open_dataset(d, decode=False, shuffle=False)
        [ds[i] for i in range(len(ds))]
    ds = open_dataset(d, decode=False, shuffle=False, on_error="skip")
    out = [s for s in (ds[i] for i in range(len(ds))) if s is not None]
    _check_kept(out, tiny_folder_expected, set(tiny_folder_expected) - {path})
    assert ds.skipped == 1
    # `shardfeed check` reports it (and only it), without a traceback
    from shardfeed.convert.tools.check import check_dataset

    report = check_dataset(d)
    assert not report.ok
    assert [p["key"] for p in report.problems] == ["000000002"]
    assert "damaged record" in report.problems[0]["problem"]


def test_lmdb_repacked_to_the_same_path_is_read_anew(tiny_image_folder, tiny_folder_expected, tmp_path):
    """A database deleted and packed again at the same path, in the same process, is not read
    through the old (cached) environment."""
    out = tmp_path / "db"
    firsts = []
    for seed in (0, 1):
        if out.exists():
            shutil.rmtree(out)
        subprocess.run(SHARDFEED + ["-q", "pack", str(tiny_image_folder), str(out), "--format", "lmdb",
                                    "--seed", str(seed)], check=True, capture_output=True)
        ds = open_dataset(out, decode=False, shuffle=False)
        first = ds[0]
        assert first.data == tiny_folder_expected[first.meta["path"]][0]
        firsts.append(first.meta["path"])
    assert firsts[0] != firsts[1]  # the seeds order the samples differently
