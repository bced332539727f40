"""`shardfeed pack --format wds`: scanning rules, byte-exact round trip, shard limits, determinism,
resume after kill -9, interoperability with GNU tar and upstream webdataset, CLI errors.

Every expectation is computed from the source folder itself (its files, their bytes and the sorted
class folder names), read back with the standard library's ``tarfile`` — never with shardfeed's
own reader.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}
SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]
#: the tricky folder links a class to a folder beside SRC: its packs follow that link
FOLLOW = "--follow-external-links"


def _jpeg(seed: int, size=(24, 16)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def _png(seed: int, size=(12, 20)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def build_tricky_folder(root: Path) -> None:
    """An ImageFolder with the cases the ImageFolder rules name (docs/format.md, "Samples and keys")."""
    files = {
        "cat/IMG_2020.05.01.jpg": _jpeg(1),
        "cat/photo.JPG": _jpeg(2),
        "cat/upper.JPEG": _jpeg(3),
        "cat/same_name.png": _png(4),
        "dog/same_name.png": _png(5),
        "dog/Mixed.Png": _png(6),
        "dog/sub/deeper/pic.jpeg": _jpeg(7),
        "v1.2/a.b.c.jpg": _jpeg(8),
        "v1.2/ünïcødé_名前.jpg": _jpeg(9),
        "v1.2/notes.txt": b"not an image",
        "v1.2/.DS_Store": b"\0\0\0\1Bud1",
        "v1.2/._a.b.c.jpg": os.urandom(4096),
        "v1.2/.ipynb_checkpoints/a.b.c-checkpoint.jpg": _jpeg(8),
        ".hidden_class/x.jpg": _jpeg(10),
        "README.txt": b"top-level file",
    }
    # original paths longer than 100, 155 and 255 bytes (each component below 255 bytes)
    files["long/" + "d" * 90 + "/" + "x" * 20 + ".jpg"] = _jpeg(11)                       # > 100
    files["long/" + "e" * 120 + "/" + "y" * 40 + ".png"] = _png(12)                       # > 155
    files["long/" + "f" * 200 + "/" + "g" * 60 + "/" + "z" * 30 + ".jpg"] = _jpeg(13)     # > 255
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "empty_class").mkdir()
    for i in range(14):  # enough samples for several shards
        (root / "dog" / f"many_{i:02d}.jpg").write_bytes(_jpeg(100 + i, size=(16 + i, 16)))
    # a symlinked folder inside a class (a link out of the image folder is followed with
    # --follow-external-links, as the tests here pass it; a link to another class folder adds
    # nothing) and a loop back to its class (not followed twice)
    (root / "linked_src").mkdir()
    (root / "linked_src" / "via_link.png").write_bytes(_png(20))
    (root.parent / "outside_src").mkdir(exist_ok=True)
    (root.parent / "outside_src" / "via_outside_link.png").write_bytes(_png(21))
    os.symlink(root / "linked_src", root / "cat" / "link")
    os.symlink(root.parent / "outside_src", root / "cat" / "outside")
    os.symlink(root / "cat", root / "cat" / "loop")


def expected_samples(root: Path) -> dict[str, tuple[bytes, int, str]]:
    """rel path -> (bytes, label, class), by ImageFolder rules implemented independently here."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    out = {}
    root_real = os.path.realpath(root)
    for label, c in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / c, followlinks=True):
            # a linked folder inside the image folder is reached without the link: not followed
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and not (
                os.path.islink(os.path.join(dirpath, d))
                and os.path.realpath(os.path.join(dirpath, d)).startswith(root_real + os.sep))]
            for f in filenames:
                if f.startswith(".") or os.path.splitext(f)[1].lower() not in IMAGE_EXTS:
                    continue
                full = Path(dirpath) / f
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                out[rel] = (full.read_bytes(), label, c)
    return out


def read_shards_stdlib(out: Path) -> list[dict]:
    """Samples of every shard via the stdlib tarfile, in order: {key, members: {ext: bytes}}."""
    samples = []
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                data = tf.extractfile(m).read()
                if not samples or samples[-1]["key"] != key or samples[-1]["shard"] != tar_path.name:
                    samples.append({"key": key, "shard": tar_path.name, "members": {}, "order": []})
                samples[-1]["members"][ext] = data
                samples[-1]["order"].append(ext)
    return samples


@pytest.fixture(scope="module")
def tricky(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tricky") / "src"
    root.mkdir()
    build_tricky_folder(root)
    return root


@pytest.fixture(scope="module")
def packed(tricky, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "wds"
    pack(tricky, out, PackOptions(follow_external_links=True, format="wds", max_count=4, workers=1))
    return out


def test_round_trip_every_image_byte_exact_with_label(tricky, packed):
    expected = expected_samples(tricky)
    samples = read_shards_stdlib(packed)
    assert len(samples) == len(expected)
    got = {}
    for s in samples:
        meta = json.loads(s["members"]["json"])
        img_ext = [e for e in s["members"] if e not in ("cls", "json")]
        assert len(img_ext) == 1
        got[meta["path"]] = (s["members"][img_ext[0]], int(s["members"]["cls"].decode("ascii")), meta["class"])
    assert got.keys() == expected.keys()
    for rel, (data, label, cls) in expected.items():
        assert got[rel] == (data, label, cls), rel


def test_names_paths_and_classes(tricky, packed):
    manifest = json.loads((packed / "manifest.json").read_text())
    assert manifest["classes"] == ["cat", "dog", "empty_class", "linked_src", "long", "v1.2"]
    assert manifest["class_to_idx"] == {c: i for i, c in enumerate(manifest["classes"])}
    paths = {json.loads(s["members"]["json"])["path"] for s in read_shards_stdlib(packed)}
    long_paths = sorted((p for p in paths if p.startswith("long/")), key=len)
    assert [len(p.encode()) > n for p, n in zip(long_paths, (100, 155, 255))] == [True] * 3
    assert "v1.2/ünïcødé_名前.jpg" in paths and "cat/IMG_2020.05.01.jpg" in paths
    assert {"cat/same_name.png", "dog/same_name.png"} <= paths
    # a linked folder outside the image folder is followed; a link to another class adds nothing
    # (its image keeps its own class)
    assert "cat/outside/via_outside_link.png" in paths and "linked_src/via_link.png" in paths
    assert "cat/link/via_link.png" not in paths
    assert not any("/." in p or p.startswith(".") for p in paths)
    # upper-case extensions map to canonical lower-case ones, each file once
    by_path = {json.loads(s["members"]["json"])["path"]: s for s in read_shards_stdlib(packed)}
    assert "jpg" in by_path["cat/photo.JPG"]["members"] and "jpg" in by_path["cat/upper.JPEG"]["members"]
    assert "png" in by_path["dog/Mixed.Png"]["members"]
    # accounting: packed + ignored = found
    f = manifest["files"]
    assert f["packed"] + f["skipped"] + f["ignored"] == f["found"]
    assert f["packed"] == len(expected_samples(tricky))


def test_keys_members_and_order(packed):
    samples = read_shards_stdlib(packed)
    keys = [s["key"] for s in samples]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert all(k.isdigit() and len(k) == 9 for k in keys)
    assert keys == [f"{i:09d}" for i in range(len(keys))]
    for s in samples:  # one contiguous group per key: image, then cls, then json
        assert s["order"][1:] == ["cls", "json"]
    # tar members carry fixed metadata
    with tarfile.open(sorted(packed.glob("*.tar"))[0]) as tf:
        for m in tf.getmembers():
            assert (m.mtime, m.uid, m.gid, m.mode, m.uname, m.gname) == (0, 0, 0, 0o644, "", "")


def test_manifest_hashes_sizes_and_offset_index(packed):
    manifest = json.loads((packed / "manifest.json").read_text())
    assert manifest["format"] == "webdataset" and manifest["version"] == 2
    total = 0
    for entry in manifest["shards"]:
        tar_bytes = (packed / entry["name"]).read_bytes()
        idx_bytes = (packed / entry["index"]).read_bytes()
        assert hashlib.sha256(tar_bytes).hexdigest() == entry["sha256"]
        assert hashlib.sha256(idx_bytes).hexdigest() == entry["index_sha256"]
        assert len(tar_bytes) == entry["num_bytes"]
        offsets = struct.unpack(f"<{len(idx_bytes) // 8}Q", idx_bytes)
        assert len(offsets) == entry["num_samples"]
        with tarfile.open(packed / entry["name"]) as tf:
            first_headers = {}
            for m in tf.getmembers():
                first_headers.setdefault(m.name.split(".", 1)[0], m.offset)
        assert list(offsets) == list(first_headers.values())
        for off, key in zip(offsets, first_headers):  # the header at each offset names its sample
            assert tar_bytes[off:off + 9].decode() == key
        total += entry["num_samples"]
    assert total == manifest["num_samples"]
    assert not list(packed.glob(".*tmp")) and not (packed / ".shardfeed-pack").exists()


def test_empty_class_keeps_index_and_warns(tricky, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        pack(tricky, tmp_path / "o", PackOptions(follow_external_links=True, workers=1))
    assert "empty_class" in caplog.text
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["class_to_idx"]["empty_class"] == 2


@pytest.mark.parametrize("max_count,max_bytes", [(3, 10**9), (1000, 12 * 1024), (5, 9000)])
def test_shard_limits(tricky, tmp_path, max_count, max_bytes):
    out = tmp_path / "o"
    pack(tricky, out, PackOptions(follow_external_links=True, max_count=max_count, max_bytes=max_bytes, workers=1))
    shards = sorted(out.glob("*.tar"))
    samples = read_shards_stdlib(out)
    per_shard = {}
    for s in samples:
        per_shard.setdefault(s["shard"], []).append(s)

    def sample_bytes(s):
        return sum(512 + -(-len(d) // 512) * 512 for d in s["members"].values())

    for i, shard in enumerate(shards):
        size = shard.stat().st_size
        count = len(per_shard[shard.name])
        assert size <= max_bytes and count <= max_count
        if i + 1 < len(shards):  # it closed only because the next sample would not fit
            nxt = per_shard[shards[i + 1].name][0]
            assert count == max_count or size + sample_bytes(nxt) > max_bytes


def test_workers_give_byte_identical_output(tricky, tmp_path):
    outs = []
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        pack(tricky, out, PackOptions(follow_external_links=True, max_count=3, workers=w))
        outs.append({p.name: p.read_bytes() for p in out.iterdir()})
    assert outs[0] == outs[1]


def test_no_shuffle_keeps_sorted_order_and_seed_changes_order(tricky, tmp_path):
    pack(tricky, tmp_path / "a", PackOptions(follow_external_links=True, shuffle=False, workers=1))
    paths = [json.loads(s["members"]["json"])["path"] for s in read_shards_stdlib(tmp_path / "a")]
    assert [p.split("/")[0] for p in paths] == sorted(p.split("/")[0] for p in paths)
    pack(tricky, tmp_path / "b", PackOptions(follow_external_links=True, seed=1, workers=1))
    paths_b = [json.loads(s["members"]["json"])["path"] for s in read_shards_stdlib(tmp_path / "b")]
    assert sorted(paths_b) == sorted(paths) and paths_b != paths


def test_gnu_tar_reads_every_member(packed, tmp_path):
    if not shutil.which("tar"):
        pytest.skip("GNU tar not installed")
    expected_members = []
    for tar_path in sorted(packed.glob("*.tar")):
        with tarfile.open(tar_path) as tf:
            expected_members += [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
        dest = tmp_path / tar_path.stem
        dest.mkdir()
        subprocess.run(["tar", "-xf", str(tar_path), "-C", str(dest)], check=True, capture_output=True)
        listing = subprocess.run(["tar", "-tf", str(tar_path)], check=True, capture_output=True, text=True)
        with tarfile.open(tar_path) as tf:
            assert listing.stdout.split() == tf.getnames()
    for name, data in expected_members:
        found = [p for p in tmp_path.glob(f"*/{name}")]
        assert len(found) == 1 and found[0].read_bytes() == data


def test_upstream_webdataset_reads_every_sample(tricky, packed):
    import webdataset
    urls = [str(p) for p in sorted(packed.glob("*.tar"))]
    expected = expected_samples(tricky)
    got = {}
    for sample in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False):
        meta = json.loads(sample["json"])
        img = [k for k in sample if k not in ("json", "cls", "__key__", "__url__", "__local_path__")]
        got[meta["path"]] = (sample[img[0]], int(sample["cls"]))
    assert got == {rel: (b, label) for rel, (b, label, _) in expected.items()}


def _run_cli(*args, env=None, **kw):
    return subprocess.run([*SHARDFEED, *map(str, args)], capture_output=True, text=True, env=env, **kw)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_after_kill_9_is_byte_identical(hooked_cli, tricky, tmp_path):
    ref = tmp_path / "ref"
    pack(tricky, ref, PackOptions(follow_external_links=True, max_count=2, workers=1))
    out = tmp_path / "killed"
    proc = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.06}), "-q", "pack", str(tricky), str(out),
                             "--max-count", "2", "-j", "1", FOLLOW], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("*.tar"))) < 3:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(out.glob("*.tar"))) >= 3
    assert not (out / "manifest.json").exists(), "a killed pack must not look complete"
    r = _run_cli("pack", tricky, out, "--max-count", 2, "-j", 2, "--resume", FOLLOW)
    assert r.returncode == 0, r.stderr
    assert "kept from the interrupted run" in r.stdout
    files = lambda d: {p.name: p.read_bytes() for p in d.iterdir()}  # noqa: E731
    assert files(out) == files(ref)


def test_resume_refuses_other_options(tricky, tmp_path):
    out = tmp_path / "o"
    (out / ".shardfeed-pack").mkdir(parents=True)
    (out / ".shardfeed-pack" / "plan.json").write_text('{"fingerprint": "other"}')
    r = _run_cli("pack", tricky, out, "--resume", FOLLOW)
    assert r.returncode != 0 and "other options" in r.stderr


@pytest.mark.parametrize("case", ["missing", "file", "not_empty", "inside", "same", "out_file"])
def test_cli_errors_one_line_no_traceback(tricky, tmp_path, case):
    src, out = tricky, tmp_path / "out"
    if case == "missing":
        src = tmp_path / "nope"
    elif case == "file":
        src = tmp_path / "f.jpg"
        src.write_bytes(_jpeg(1))
    elif case == "not_empty":
        out.mkdir()
        (out / "x.txt").write_text("x")
    elif case == "inside":
        out = tricky / "cat" / "out"
    elif case == "same":
        out = tricky
    elif case == "out_file":
        out.write_text("x")
    r = _run_cli("pack", src, out, FOLLOW)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("shardfeed: error:")]
    assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr
    if case != "missing":  # every check runs before the scan: nothing but the error line
        assert "WARNING" not in r.stderr and "img/s" not in r.stderr, r.stderr
    assert not (tricky / "cat" / "out").exists()


def test_a_link_out_of_src_stops_the_pack_naming_it_unless_followed_or_skipped(tricky, tmp_path):
    out = tmp_path / "out"
    r = _run_cli("pack", tricky, out, "-j", 1)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    error = r.stderr.rstrip().splitlines()[-1]
    assert error.startswith(f"shardfeed: error: {tricky / 'cat' / 'outside'}: link out of SRC (points to "
                            f"{os.path.realpath(tricky.parent / 'outside_src')})"), error
    assert "--follow-external-links" in error and "give the folder that holds both as SRC" in error
    assert not out.exists() or not any(out.iterdir())
    r = _run_cli("-q", "pack", tricky, out, "-j", 1, "--on-error", "skip", "--json", "-")
    assert r.returncode == 0, r.stderr
    expected = {p for p in expected_samples(tricky) if not p.startswith("cat/outside/")}
    got = {json.loads(s["members"]["json"])["path"] for s in read_shards_stdlib(out)}
    assert got == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["path"], s["reason"].split(" (")[0]) for s in manifest["skipped"]] == [
        ("cat/outside", "link out of SRC")]


def test_pack_help_names_the_link_flag():
    r = _run_cli("pack", "--help")
    assert "--follow-external-links" in r.stdout and "outside SRC" in r.stdout


def test_no_images_is_a_clear_error_and_no_class_folders_packs_unlabelled(tmp_path):
    (tmp_path / "noclass").mkdir()
    (tmp_path / "noclass" / "a.jpg").write_bytes(_jpeg(1))
    r = _run_cli("pack", tmp_path / "noclass", tmp_path / "o1")
    assert r.returncode == 0 and "no class folders: packing an unlabelled dataset" in r.stderr, r.stderr
    m = json.loads((tmp_path / "o1" / "manifest.json").read_text())
    assert (m["labels"], m["classes"], m["num_samples"]) == ("none", [], 1)
    (tmp_path / "noimg" / "c").mkdir(parents=True)
    (tmp_path / "noimg" / "c" / "a.txt").write_text("x")
    r = _run_cli("pack", tmp_path / "noimg", tmp_path / "o2")
    assert r.returncode != 0 and "no images" in r.stderr


def test_json_report_and_extensions_option(tricky, tmp_path):
    r = _run_cli("-q", "pack", tricky, tmp_path / "o", "--extensions", "png", "-j", "1", "--json", "-", FOLLOW)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    expected_png = [p for p in expected_samples(tricky) if p.lower().endswith(".png")]
    assert report["num_samples"] == len(expected_png)
    assert report["files"]["packed"] + report["files"]["ignored"] == report["files"]["found"]
    assert report["images_per_s"] > 0 and report["format"] == "webdataset"


def test_pack_does_not_import_torch_or_webdataset(tricky, tmp_path):
    code = ("import sys\nfrom shardfeed.convert.cli import main\n"
            "try:\n    main(['-q', 'pack', sys.argv[1], sys.argv[2], '-j', '2', '--follow-external-links'])\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "bad = [m for m in ('torch', 'webdataset') if m in sys.modules]\nprint('IMPORTED', bad)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tricky), str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert "IMPORTED []" in r.stdout, r.stdout + r.stderr


def test_extensions_parse_case_and_leading_dots():
    from shardfeed.readers.format.imagefolder import parse_extensions

    assert parse_extensions(".PNG, jpg,.JPEG") == ("png", "jpg", "jpeg")
    with pytest.raises(ValueError, match="without dots"):
        parse_extensions("tar.gz")
