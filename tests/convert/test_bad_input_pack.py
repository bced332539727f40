"""Bad input and faults while packing: every file accounted for, nothing lost, nothing hangs.

Inputs are built here; expectations come from the files themselves (bytes, folder names).
"""

from __future__ import annotations

import io
import json
import resource
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.write.scan import scan_image_folder
from shardfeed.readers.errors import SourceChangedError

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _img_bytes(seed: int, fmt: str, size=(40, 30)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _samples_by_path(out: Path) -> dict[str, tuple[bytes, int]]:
    got = {}
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tf:
            members = {}
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = tf.extractfile(m).read()
        for mem in members.values():
            img = [v for k, v in mem.items() if k not in ("cls", "json")][0]
            got[json.loads(mem["json"])["path"]] = (img, int(mem["cls"]))
    return got


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> tuple[Path, set[str]]:
    """50 good images in 2 classes, a JPEG cut at 60 % and a PNG cut inside its image data."""
    root = tmp_path_factory.mktemp("damaged") / "src"
    for i in range(50):
        p = root / f"c{i % 2}" / f"good_{i:02d}.{'jpg' if i % 3 else 'png'}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_img_bytes(i, "JPEG" if i % 3 else "PNG"))
    jpeg = _img_bytes(100, "JPEG", size=(64, 64))
    (root / "c0" / "cut.jpg").write_bytes(jpeg[: int(len(jpeg) * 0.6)])
    png = _img_bytes(101, "PNG", size=(64, 64))
    idat = png.index(b"IDAT")
    (root / "c1" / "cut.png").write_bytes(png[: idat + (len(png) - idat) // 2])
    return root, {"c0/cut.jpg", "c1/cut.png"}


def test_decode_check_fails_naming_the_file(damaged, tmp_path):
    root, bad = damaged
    r = subprocess.run([*SHARDFEED, "pack", str(root), str(tmp_path / "o"), "--decode-check", "-j", "1",
                        "--no-shuffle"], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "cut.jpg" in r.stderr or "cut.png" in r.stderr, r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_decode_check_skip_lists_and_counts(damaged, tmp_path):
    root, bad = damaged
    out = tmp_path / "o"
    report = pack(root, out, PackOptions(decode_check=True, on_error="skip", workers=2, max_count=10))
    manifest = json.loads((out / "manifest.json").read_text())
    assert {s["path"] for s in manifest["skipped"]} == bad
    assert all(s["reason"] for s in manifest["skipped"])
    assert manifest["num_samples"] == 50 and report.num_samples == 50
    f = manifest["files"]
    assert (f["packed"], f["skipped"], f["found"]) == (50, 2, 52)
    assert f["packed"] + f["skipped"] + f["ignored"] == f["found"]
    got = _samples_by_path(out)
    for rel, (data, label) in got.items():
        assert data == (root / rel).read_bytes() and label == int(rel[1])


def test_without_decode_check_damaged_bytes_are_stored_unchanged(damaged, tmp_path):
    root, bad = damaged
    pack(root, tmp_path / "o", PackOptions(workers=1))
    got = _samples_by_path(tmp_path / "o")
    assert len(got) == 52 and all(got[b][0] == (root / b).read_bytes() for b in bad)


def test_huge_image_refused_by_pixel_limit_at_pack_time(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "ok.png").write_bytes(_img_bytes(1, "PNG"))
    Image.new("1", (20000, 20000)).save(root / "a" / "huge.png")  # 400 Mpx, a small file
    r = subprocess.run([*SHARDFEED, "pack", str(root), str(tmp_path / "o"), "--decode-check", "-j", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "huge.png" in r.stderr and "Traceback" not in r.stderr
    report = pack(root, tmp_path / "o2", PackOptions(decode_check=True, on_error="skip", workers=1))
    assert report.num_samples == 1 and [s["path"] for s in report.skipped] == ["a/huge.png"]


def test_classes_from_train_manifest_keeps_labels(tmp_path):
    for split, classes in (("train", ["0", "90", "180", "270"]), ("val", ["0", "90", "270"])):
        for c in classes:
            d = tmp_path / split / c
            d.mkdir(parents=True)
            (d / f"{split}_{c}.png").write_bytes(_img_bytes(int(c), "PNG"))
    pack(tmp_path / "train", tmp_path / "train_wds", PackOptions(workers=1))
    train_map = json.loads((tmp_path / "train_wds" / "manifest.json").read_text())["class_to_idx"]
    # class names that are numbers sort as strings, as torchvision's ImageFolder does
    assert train_map == {"0": 0, "180": 1, "270": 2, "90": 3}
    r = subprocess.run([*SHARDFEED, "pack", str(tmp_path / "val"), str(tmp_path / "val_wds"), "--classes-from",
                        str(tmp_path / "train_wds" / "manifest.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    val = json.loads((tmp_path / "val_wds" / "manifest.json").read_text())
    assert val["class_to_idx"] == train_map
    got = _samples_by_path(tmp_path / "val_wds")
    assert {rel: label for rel, (_, label) in got.items()} == {
        "0/val_0.png": 0, "90/val_90.png": 3, "270/val_270.png": 2}
    # without the map the labels would shift: val alone sorts to 0, 270, 90
    (tmp_path / "val" / "45").mkdir()
    (tmp_path / "val" / "45" / "x.png").write_bytes(_img_bytes(45, "PNG"))
    r = subprocess.run([*SHARDFEED, "pack", str(tmp_path / "val"), str(tmp_path / "val2"), "--classes-from",
                        str(tmp_path / "train_wds")], capture_output=True, text=True)
    assert r.returncode != 0 and "'45'" in r.stderr and "Traceback" not in r.stderr


def test_extension_case_variants_packed_exactly_once(tmp_path):
    root = tmp_path / "src"
    (root / "c").mkdir(parents=True)
    names = ["a.JPG", "b.jpeg", "c.Png", "d.JPEG", "e.jpg"]
    for i, n in enumerate(names):
        (root / "c" / n).write_bytes(_img_bytes(i, "PNG" if "png" in n.lower() else "JPEG"))
    pack(root, tmp_path / "o", PackOptions(workers=1))
    got = _samples_by_path(tmp_path / "o")
    assert sorted(got) == sorted(f"c/{n}" for n in names)


def test_source_file_changed_after_scan_is_named(tmp_path):
    root = tmp_path / "src"
    (root / "c").mkdir(parents=True)
    for i in range(6):
        (root / "c" / f"{i}.png").write_bytes(_img_bytes(i, "PNG"))
    scan = scan_image_folder(root)
    (root / "c" / "3.png").write_bytes(_img_bytes(99, "PNG", size=(50, 50)))
    (root / "c" / "4.png").unlink()
    with pytest.raises(SourceChangedError, match=r"c/[34]\.png"):
        pack(root, tmp_path / "o", PackOptions(workers=1), scan=scan)
    assert not (tmp_path / "o" / "manifest.json").exists()
    report = pack(root, tmp_path / "o2", PackOptions(workers=1, on_error="skip"), scan=scan)
    assert sorted(s["path"] for s in report.skipped) == ["c/3.png", "c/4.png"]
    assert report.num_samples == 4


@pytest.fixture(scope="module")
def medium(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("medium") / "src"
    for i in range(40):
        p = root / f"c{i % 4}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_img_bytes(i, "JPEG", size=(48, 48)))
    return root


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir()}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ctrl_c_exits_promptly_and_resume_finishes(hooked_cli, medium, tmp_path):
    ref = tmp_path / "ref"
    pack(medium, ref, PackOptions(max_count=4, workers=1))
    out = tmp_path / "o"
    proc = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.08}), "-q", "pack", str(medium), str(out),
                             "--max-count", "4", "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("*.tar"))) < 2:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)  # exits (the timeout only guards against a hang)
    assert proc.returncode == 130 and "interrupted" in err and "--resume" in err and "Traceback" not in err, err
    assert not (out / "manifest.json").exists()
    assert not list(out.glob(".*.tmp")), "partial shards must not be left behind"
    r = subprocess.run([*SHARDFEED, "pack", str(medium), str(out), "--max-count", "4", "--resume"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _files(out) == _files(ref)


@pytest.mark.slow
def test_disk_full_mid_pack_names_output_and_resume_works(medium, tmp_path):
    ref = tmp_path / "ref"
    pack(medium, ref, PackOptions(max_count=4, workers=1))
    out = tmp_path / "o"
    # RLIMIT_FSIZE caps every file this process writes: a shard cannot grow past half its size
    limit = (ref / "shard-000000.tar").stat().st_size // 2

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([*SHARDFEED, "pack", str(medium), str(out), "--max-count", "4", "-j", "1",
                        "--max-bytes", "1MB"], capture_output=True, text=True, preexec_fn=small_disk)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert str(out) in r.stderr and "--resume" in r.stderr, r.stderr
    assert not (out / "manifest.json").exists() and not list(out.glob(".*.tmp"))
    r = subprocess.run([*SHARDFEED, "pack", str(medium), str(out), "--max-count", "1000", "-j", "1", "--resume"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "other options" in r.stderr  # resume needs the same options
    r = subprocess.run([*SHARDFEED, "pack", str(medium), str(out), "--max-count", "4", "-j", "2", "--resume",
                        "--max-bytes", "1MB"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ref2 = tmp_path / "ref2"
    pack(medium, ref2, PackOptions(max_count=4, max_bytes=1_000_000, workers=1))
    assert _files(out) == _files(ref2)


def test_empty_image_file_is_an_error_or_skipped(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "ok.png").write_bytes(_img_bytes(1, "PNG"))
    (root / "a" / "zero.jpg").write_bytes(b"")
    r = subprocess.run([*SHARDFEED, "pack", str(root), str(tmp_path / "o"), "-j", "1"], capture_output=True, text=True)
    assert r.returncode != 0 and "zero.jpg" in r.stderr and "empty file" in r.stderr, r.stderr
    report = pack(root, tmp_path / "o2", PackOptions(on_error="skip", workers=1))
    assert report.num_samples == 1 and [s["path"] for s in report.skipped] == ["a/zero.jpg"]


def test_json_path_in_missing_folder_is_refused_before_any_work(tmp_path, medium):
    out = tmp_path / "o"
    r = subprocess.run([*SHARDFEED, "pack", str(medium), str(out), "--json", str(tmp_path / "nope" / "r.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
    assert not out.exists()


def test_non_empty_out_names_the_fix_in_the_callers_spelling(tmp_path):
    # a library user calling pack() reads the PackOptions field, a CLI user the flag
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    (src / "a.png").write_bytes(_img_bytes(0, "PNG"))
    out = tmp_path / "out"
    pack(tmp_path / "src", out, PackOptions())
    with pytest.raises(ValueError, match="not empty") as info:
        pack(tmp_path / "src", out, PackOptions())
    assert "PackOptions(overwrite=True)" in str(info.value) and "--overwrite" not in str(info.value)
    r = subprocess.run([*SHARDFEED, "pack", str(tmp_path / "src"), str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "not empty" in r.stderr and "use --overwrite" in r.stderr
    assert "PackOptions" not in r.stderr
    # a shard file no record names is the user's: named, never deleted
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "shard-000000.tar").write_bytes(b"left by another tool")
    with pytest.raises(ValueError, match=r"shard-000000\.tar"):
        pack(tmp_path / "src", stray, PackOptions(overwrite=True))
    assert (stray / "shard-000000.tar").read_bytes() == b"left by another tool"  # nothing touched
