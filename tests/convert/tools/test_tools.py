"""The dataset tools: inspect, check, unpack, convert, stage, index, serve.

Expectations come from the source folder itself (its files' bytes, and labels from the sorted
class folder names, as torchvision's ImageFolder assigns them), or from the files on disk read
with the standard library (``tarfile``, ``hashlib``) — never from the code's own output. HTTP
servers bind 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main as cli
from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.tools.check import check_dataset
from shardfeed.convert.tools.common import iter_raw_samples, safe_relative_path
from shardfeed.convert.tools.convert import convert_dataset
from shardfeed.convert.tools.index import expand_braces, index_shards
from shardfeed.convert.tools.inspect import inspect_dataset
from shardfeed.convert.tools.serve import serve_directory
from shardfeed.convert.tools.stage import stage
from shardfeed.convert.tools.unpack import unpack
from shardfeed.convert.writers.webdataset import WebDatasetWriter
from shardfeed.readers.format.manifest import Sample
from shardfeed.readers.format.offset_index import read_index

CLASSES = ["bird", "cat", "dog", "empty"]  # sorted, as ImageFolder finds them; "empty" holds nothing


def _image(seed: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    w, h = 8 + seed % 9, 8 + seed % 7
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _staged_files(root: Path) -> dict[str, bytes]:
    """What `stage` copies of the dataset at ``root``: every file but the path index, a cache for
    `pack --append` that an append rebuilds from the shards."""
    return {k: v for k, v in _folder_files(root).items() if k != ".shardfeed-paths"}


def _folder_files(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root``, by ``/``-separated relative path."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def _label_of(rel: str) -> int:
    return CLASSES.index(rel.split("/", 1)[0])


@pytest.fixture(scope="session")
def src(tmp_path_factory) -> Path:
    """60 tiny JPEG/PNG images in 3 classes + an empty class; nested, dotted, unicode and long names."""
    root = tmp_path_factory.mktemp("tools_src")
    names = []
    for i in range(54):
        cls = CLASSES[i % 3]
        names.append(f"{cls}/img_{i:03d}.{'png' if i % 4 == 0 else 'jpg'}")
    names += ["cat/deep/er/x.y.z.jpg", "dog/ünïcødé_名前.png", "bird/UPPER.JPG",
              "dog/" + "d" * 110 + "/long.jpg", "cat/a b (1).jpeg", "bird/sub/two.png"]
    for i, rel in enumerate(names):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_image(i, "PNG" if rel.lower().endswith(".png") else "JPEG"))
    (root / "empty").mkdir()
    return root


@pytest.fixture(scope="session")
def wds(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tools_wds") / "wds"
    pack(src, out, PackOptions(format="wds", max_count=16, workers=1))
    return out


@pytest.fixture(scope="session")
def lmdb_ds(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tools_lmdb") / "lmdb"
    pack(src, out, PackOptions(format="lmdb", workers=1))
    return out


def _copy(ds: Path, tmp_path: Path, name: str = "copy") -> Path:
    dest = tmp_path / name
    shutil.copytree(ds, dest)
    return dest


def _run(*args) -> "CliRunner.Result":
    return CliRunner().invoke(cli, ["-q", *map(str, args)], catch_exceptions=False)


def _expected_samples(src: Path) -> dict[str, tuple[bytes, int]]:
    """Original path -> (bytes, label), from the source folder alone."""
    return {rel: (data, _label_of(rel)) for rel, data in _folder_files(src).items()}


# ---------------------------------------------------------------------------------------------
# inspect

@pytest.mark.parametrize("fixture", ["wds", "lmdb_ds"])
def test_inspect_counts_classes_from_data(request, src, fixture):
    ds = request.getfixturevalue(fixture)
    report = inspect_dataset(ds)
    expected = {c: 0 for c in CLASSES}
    for rel in _folder_files(src):
        expected[rel.split("/", 1)[0]] += 1
    assert report["num_samples"] == sum(expected.values()) == 60
    assert report["class_counts_from"] == "data"
    assert {c["name"]: c["count"] for c in report["classes"]} == expected
    assert report["format"] == ("lmdb" if fixture == "lmdb_ds" else "webdataset")
    assert report["created_by"].startswith("shardfeed ")
    ex = report["examples"][0]
    assert _folder_files(src)[ex["meta"]["path"]].__len__() == ex["num_bytes"]


def test_inspect_exits_1_on_a_missing_offset_index_keeping_the_report(wds, tmp_path):
    ds = _copy(wds, tmp_path, "bad_index")
    (ds / "shard-000001.sfidx").unlink()
    res = _run("inspect", ds)
    assert res.exit_code == 1, res.output
    assert "problem: " in res.stdout and "shard-000001.sfidx" in res.stdout
    assert "shard-000000.tar" in res.stdout  # the report itself is still printed
    res = _run("inspect", ds, "--json", "-")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert report["num_samples"] == 60 and report["problems"]
    assert _run("inspect", wds).exit_code == 0


@pytest.mark.parametrize("damage", ["ones", "short"])
def test_inspect_exits_1_on_a_damaged_offset_index(wds, tmp_path, damage):
    ds = _copy(wds, tmp_path, "bad_index")
    index = ds / "shard-000000.sfidx"
    original = index.read_bytes()
    index.write_bytes(b"\xff" * len(original) if damage == "ones" else original[:-8])
    res = _run("inspect", ds)
    assert res.exit_code == 1, res.output
    problems = [line for line in res.stdout.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1 and "shard-000000.sfidx" in problems[0] and "shardfeed index" in problems[0]
    assert "shard-000003.tar" in res.stdout  # the report itself is still printed


def test_inspect_cli_json_over_http_and_folder(wds, src):
    with serve_directory(wds) as (url, _):
        res = _run("inspect", url, "--json", "-")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["num_samples"] == 60 and report["class_counts_from"] is None  # not downloaded by default
    assert report["num_shards"] == 4 and [s["num_samples"] for s in report["shards"]] == [16, 16, 16, 12]
    assert "not counted" in res.stderr

    res = _run("inspect", src, "--json", "-")
    assert res.exit_code == 0, res.output
    folder = json.loads(res.stdout)
    assert folder["format"] == "imagefolder" and folder["num_samples"] == 60
    assert [c["name"] for c in folder["classes"]] == CLASSES and folder["classes"][3]["count"] == 0


# ---------------------------------------------------------------------------------------------
# check

@pytest.mark.parametrize("fixture", ["wds", "lmdb_ds"])
def test_check_intact(request, fixture):
    report = check_dataset(request.getfixturevalue(fixture), decode=True)
    assert report.ok, report.problems
    assert report.num_samples_found == 60


def test_check_detects_one_flipped_byte_and_names_the_shard(wds, tmp_path):
    ds = _copy(wds, tmp_path)
    victim = ds / "shard-000002.tar"
    with tarfile.open(victim) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith((".jpg", ".png")))
    data = bytearray(victim.read_bytes())
    data[member.offset_data + member.size // 2] ^= 0x01
    victim.write_bytes(bytes(data))

    res = _run("check", ds, "--json", str(tmp_path / "check.json"))
    assert res.exit_code == 1
    assert "shard-000002.tar" in res.output and "sha256" in res.output
    report = json.loads((tmp_path / "check.json").read_text())
    assert not report["ok"]
    assert {p["shard"] for p in report["problems"]} == {"shard-000002.tar"}
    assert [s["ok"] for s in report["shards"]] == [True, True, False, True]


def test_check_detects_truncated_shard_and_bad_index(wds, tmp_path):
    ds = _copy(wds, tmp_path)
    tar = ds / "shard-000001.tar"
    tar.write_bytes(tar.read_bytes()[:3000])
    idx = ds / "shard-000003.sfidx"
    offsets = read_index(idx)
    idx.write_bytes(np.array(offsets[::-1], dtype="<u8").tobytes())
    report = check_dataset(ds)
    bad = {p["shard"] for p in report.problems}
    assert bad == {"shard-000001.tar", "shard-000003.tar"}
    assert any("truncated" in p["problem"] for p in report.problems if p["shard"] == "shard-000001.tar")
    assert any("offset index" in p["problem"] for p in report.problems if p["shard"] == "shard-000003.tar")


def test_check_lmdb_names_the_damaged_record(lmdb_ds, src, tmp_path):
    ds = _copy(lmdb_ds, tmp_path)
    original = (src / "cat/deep/er/x.y.z.jpg").read_bytes()
    db = bytearray((ds / "data.mdb").read_bytes())
    at = bytes(db).find(original)
    assert at > 0
    db[at + len(original) // 2] ^= 0xFF
    (ds / "data.mdb").write_bytes(bytes(db))
    # the key of that sample, read independently: the record whose meta path is that file
    key = next(s.key for _, s in iter_raw_samples(lmdb_ds) if s.meta["path"] == "cat/deep/er/x.y.z.jpg")
    report = check_dataset(ds)
    assert not report.ok
    assert [(p["key"], "CRC-32" in p["problem"]) for p in report.problems] == [(key, True)]


# ---------------------------------------------------------------------------------------------
# unpack

@pytest.mark.parametrize("fixture", ["wds", "lmdb_ds"])
def test_unpack_after_pack_gives_back_every_file(request, src, tmp_path, fixture):
    out = tmp_path / "restored"
    res = _run("unpack", request.getfixturevalue(fixture), out)
    assert res.exit_code == 0, res.output
    assert _folder_files(out) == _folder_files(src)
    assert sorted(p.name for p in out.iterdir()) == CLASSES  # the empty class folder too


def _tiny_wds(out: Path, metas: list[dict]) -> Path:
    with WebDatasetWriter(out, classes=["a"]) as w:
        for i, meta in enumerate(metas):
            w.write(Sample(f"{i:09d}", _image(i, "JPEG"), "jpg", 0, meta))
    return out


@pytest.mark.parametrize("bad", ["../escape.jpg", "/abs/olute.jpg", "a/../../x.jpg", "a//b.jpg"])
def test_unpack_refuses_paths_that_escape(tmp_path, bad):
    ds = _tiny_wds(tmp_path / "ds", [{"path": "a/ok.jpg", "class": "a"}, {"path": bad, "class": "a"}])
    with pytest.raises(ValueError, match="refusing"):
        unpack(ds, tmp_path / "out" / "inner")
    assert not (tmp_path / "out" / "escape.jpg").exists() and not Path("/abs/olute.jpg").exists()
    res = _run("unpack", ds, tmp_path / "out2")
    assert res.exit_code == 1 and "refusing" in res.stderr and "Traceback" not in res.output


def test_safe_relative_path():
    assert str(safe_relative_path("cat/x.y.jpg", what="t")) == "cat/x.y.jpg"
    for bad in ["", "/x", "..", "a/./b", "C:evil", "a\\b"]:
        with pytest.raises(ValueError):
            safe_relative_path(bad, what="t")


def test_unpack_refuses_non_empty_out(wds, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="not empty"):
        unpack(wds, tmp_path / "busy")


# ---------------------------------------------------------------------------------------------
# convert

def test_convert_wds_lmdb_wds_keeps_everything(wds, src, tmp_path):
    expected = _expected_samples(src)
    lmdb_out, wds_out = tmp_path / "lmdb", tmp_path / "wds2"
    assert _run("convert", wds, lmdb_out, "--format", "lmdb").exit_code == 0
    res = _run("convert", lmdb_out, wds_out, "--format", "wds", "--max-count", "7", "--max-bytes", "20KB")
    assert res.exit_code == 0, res.output

    original = {s.key: s for _, s in iter_raw_samples(wds)}
    for ds in (lmdb_out, wds_out):
        got = list(iter_raw_samples(ds))
        assert [s.key for _, s in got] == sorted(original)
        for _, s in got:
            data, label = expected[s.meta["path"]]
            assert s.data == data and s.label == label
            assert s.meta == {"path": s.meta["path"], "class": CLASSES[label]}
            assert s.ext == original[s.key].ext
        manifest = json.loads((ds / "manifest.json").read_text())
        assert manifest["classes"] == CLASSES and manifest["num_samples"] == 60
    # re-sharded by the new limits, read back with tarfile
    shards = sorted(wds_out.glob("*.tar"))
    for shard in shards:
        assert shard.stat().st_size <= 20_000
        with tarfile.open(shard) as tf:
            assert len([m for m in tf.getmembers() if m.name.endswith(".cls")]) <= 7
    assert len(shards) >= 60 // 7
    assert check_dataset(wds_out).ok and check_dataset(lmdb_out).ok


def test_convert_folder_is_pack(src, wds, tmp_path):
    out = tmp_path / "via_convert"
    report = convert_dataset(src, out, format="wds", max_count=16, workers=1)
    assert report.source_format == "imagefolder"
    for shard in sorted(wds.glob("*.tar")):
        assert (out / shard.name).read_bytes() == shard.read_bytes()


# ---------------------------------------------------------------------------------------------
# stage

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_stage_copies_verifies_and_resumes(wds, tmp_path):
    dest = tmp_path / "staged"
    res = _run("stage", wds, dest, "--min-free", "1KB", "--json", str(tmp_path / "s1.json"))
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(dest.resolve())
    assert _folder_files(dest) == _staged_files(wds)

    # an interruption: one shard gone, one left half-copied under its temporary name, one damaged,
    # and no manifest (stage writes it last)
    (dest / "shard-000000.tar").unlink()
    part = (dest / "shard-000001.tar").read_bytes()
    (dest / "shard-000001.tar").unlink()
    (dest / ".shard-000001.tar.stage.tmp").write_bytes(part[:5000])
    damaged = bytearray((dest / "shard-000002.tar").read_bytes())
    damaged[4000] ^= 0x10
    (dest / "shard-000002.tar").write_bytes(bytes(damaged))
    (dest / "manifest.json").unlink()

    # with no manifest, nothing records the damaged file as a staged one (a user's file may bear that
    # name): it is not replaced, and stays as it was until moved away
    with pytest.raises(ValueError, match=r"holds 1 entry where the dataset's files go .*'shard-000002\.tar'"):
        stage(wds, dest, min_free_bytes=1000)
    assert (dest / "shard-000002.tar").read_bytes() == bytes(damaged)
    (dest / "shard-000002.tar").rename(tmp_path / "moved-away.tar")

    report = stage(wds, dest, min_free_bytes=1000)
    assert report.ok
    assert sorted(report.copied) == ["shard-000000.tar", "shard-000002.tar"]
    assert report.resumed == ["shard-000001.tar"]
    assert "shard-000003.tar" in report.skipped and "shard-000000.sfidx" in report.skipped
    assert report.bytes_copied == sum((wds / n).stat().st_size for n in report.copied) + len(part) - 5000
    assert _folder_files(dest) == _staged_files(wds)
    assert not list(dest.glob(".*.tmp"))

    again = stage(wds, dest, min_free_bytes=1000)
    assert again.ok and not again.copied and not again.resumed and again.bytes_copied == 0


@pytest.mark.parametrize("overwrite", [False, True])
def test_stage_never_replaces_a_file_no_dataset_in_dest_names(wds, tmp_path, overwrite):
    """DEST without a manifest (new, or a stage stopped before it wrote one): a user's file at a name
    the dataset's files take is refused, named, and left as it was; so are the user's other files."""
    dest = tmp_path / "staged"
    dest.mkdir()
    (dest / "shard-000000.tar").write_bytes(b"USER DATA")
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"'shard-000000\.tar'\); nothing was replaced"):
        stage(wds, dest, min_free_bytes=1000, overwrite=overwrite)
    res = _run("stage", wds, dest, "--min-free", "1KB", *(["--overwrite"] if overwrite else []))
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1 and "shard-000000.tar" in res.stderr
    assert (dest / "shard-000000.tar").read_bytes() == b"USER DATA" and (dest / "notes.txt").read_text() == "mine"
    assert not (dest / "manifest.json").exists()


def test_stage_refuses_to_replace_a_different_dataset(src, wds, tmp_path):
    """DEST holds a finished dataset other than SRC: refused without --overwrite, DEST left as it was."""
    other = tmp_path / "other"  # the same images packed 30 per shard: same shard names, other bytes
    pack(src, other, PackOptions(format="wds", max_count=30, workers=1))
    dest = tmp_path / "staged"
    assert stage(other, dest, min_free_bytes=1000).ok
    before = _folder_files(dest)

    with pytest.raises(ValueError, match="--overwrite"):
        stage(wds, dest, min_free_bytes=1000)
    res = _run("stage", wds, dest, "--min-free", "1KB")
    assert res.exit_code == 1
    assert str(dest) in res.stderr and "--overwrite" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert _folder_files(dest) == before

    # the same dataset again (a cache refresh) still works, and --overwrite replaces the other one
    assert stage(other, dest, min_free_bytes=1000).ok
    res = _run("stage", wds, dest, "--min-free", "1KB", "--overwrite")
    assert res.exit_code == 0, res.output
    assert {k: v for k, v in _folder_files(dest).items() if k in _staged_files(wds)} == _staged_files(wds)
    assert check_dataset(dest).ok


def test_stage_refuses_when_free_space_is_short(wds, tmp_path):
    dest = tmp_path / "nospace"
    with pytest.raises(ValueError, match="must stay free"):
        stage(wds, dest, min_free_bytes=10**18)
    assert not list(dest.glob("*.tar")) and not (dest / "manifest.json").exists()
    res = _run("stage", wds, dest, "--min-free", "1000000TB")
    assert res.exit_code == 1 and "must stay free" in res.stderr


def test_stage_reports_a_damaged_source(wds, tmp_path):
    bad_src = _copy(wds, tmp_path, "bad_src")
    data = bytearray((bad_src / "shard-000003.tar").read_bytes())
    data[2000] ^= 0x01
    (bad_src / "shard-000003.tar").write_bytes(bytes(data))
    res = _run("stage", bad_src, tmp_path / "dest", "--min-free", "1KB", "--json", "-")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert not report["ok"] and [p["shard"] for p in report["problems"]] == ["shard-000003.tar"]
    assert not (tmp_path / "dest" / "manifest.json").exists()
    assert not (tmp_path / "dest" / "shard-000003.tar").exists()


@pytest.mark.network
@pytest.mark.parametrize("ranges", [True, False], ids=["range-server", "no-range-server"])
def test_stage_over_http_resumes_partial_file(wds, lmdb_ds, tmp_path, ranges):
    for ds in (wds, lmdb_ds):
        dest = tmp_path / ds.name
        dest.mkdir()
        first = sorted(p.name for p in ds.iterdir() if p.suffix in (".tar", ".mdb"))[0]
        (dest / f".{first}.stage.tmp").write_bytes((ds / first).read_bytes()[:3333])
        with serve_directory(ds, support_ranges=ranges) as (url, _):
            report = stage(url, dest, min_free_bytes=1000)
        assert report.ok, report.problems
        assert report.resumed == [first]
        want = {k: v for k, v in _staged_files(ds).items() if k != "lock.mdb"}
        assert _folder_files(dest) == want
    assert check_dataset(tmp_path / lmdb_ds.name).ok


# ---------------------------------------------------------------------------------------------
# serve: reading over HTTP gives the same samples as the local read

@pytest.mark.network
def test_http_read_equals_local_read(wds):
    local = [(n, tuple(s)) for n, s in iter_raw_samples(wds)]
    with serve_directory(wds) as (url, _):
        remote = [(n, tuple(s)) for n, s in iter_raw_samples(url)]
        assert check_dataset(url).ok
        from shardfeed.readers.sources.dataset import open_dataset

        via_reader = sorted((s.key, bytes(s.data), s.label) for s in open_dataset(url, decode=False, shuffle=False))
        assert via_reader == sorted((s[1][0], s[1][1], s[1][3]) for s in local)
    assert remote == local


# ---------------------------------------------------------------------------------------------
# index: shards written by other tools

def test_expand_braces():
    assert expand_braces("a-{000..002}.tar") == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert expand_braces("{x,y}-{1..2}") == ["x-1", "x-2", "y-1", "y-2"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError):
        expand_braces("a-{3..1}")


def test_index_makes_webdataset_shardwriter_output_readable(src, tmp_path):
    import webdataset as wdsl  # the upstream library, in this test only

    files = sorted(_folder_files(src).items())
    shard_dir = tmp_path / "upstream"
    shard_dir.mkdir()
    written = {}
    with wdsl.ShardWriter(str(shard_dir / "up-%06d.tar"), maxcount=25, verbose=0) as sink:
        for i, (rel, data) in enumerate(files):
            key = f"sample{i:05d}"
            ext = rel.rsplit(".", 1)[1].lower()
            sink.write({"__key__": key, ext: data, "cls": _label_of(rel), "json": {"path": rel}})
            written[key] = (data, _label_of(rel), rel)
    (tmp_path / "classes.txt").write_text("\n".join(CLASSES) + "\n")

    res = _run("index", shard_dir, "--classes", tmp_path / "classes.txt", "--json", "-")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["num_samples"] == 60 and report["num_shards"] == 3 and not report["problems"]
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    assert manifest["format"] == "webdataset" and manifest["classes"] == CLASSES
    assert [s["num_samples"] for s in manifest["shards"]] == [25, 25, 10]

    got = {s.key: (s.data, s.label, s.meta["path"]) for _, s in iter_raw_samples(shard_dir)}
    assert got == written
    counts = {c["name"]: c["count"] for c in inspect_dataset(shard_dir)["classes"]}
    assert counts == {c: sum(1 for v in written.values() if v[1] == i) for i, c in enumerate(CLASSES)}
    assert check_dataset(shard_dir).ok
    # every .idx offset is the start of a sample, as tarfile sees the archive
    for shard in manifest["shards"]:
        with tarfile.open(shard_dir / shard["name"]) as tf:
            firsts, seen = [], set()
            for m in tf.getmembers():
                key = m.name.split(".", 1)[0]
                if key not in seen:
                    seen.add(key)
                    firsts.append(m.offset)
        assert read_index(shard_dir / shard["index"]) == firsts
    from shardfeed.readers.sources.dataset import open_dataset

    ds = open_dataset(shard_dir, decode=False, shuffle=False)
    assert sorted((s.key, bytes(s.data), s.label) for s in ds) == sorted((k, v[0], v[1]) for k, v in written.items())


def test_index_plain_tar_reports_members_that_do_not_group(src, tmp_path):
    stage_dir = tmp_path / "loose"
    stage_dir.mkdir()
    files = sorted(_folder_files(src).items())[:6]
    for i, (rel, data) in enumerate(files):
        (stage_dir / f"k{i}.jpg").write_bytes(data)
        (stage_dir / f"k{i}.cls").write_text(str(_label_of(rel)))
    (stage_dir / "orphan.cls").write_text("1")      # a class without an image
    (stage_dir / "lonely.jpg").write_bytes(files[0][1])  # an image without a class
    shards = tmp_path / "plain"
    shards.mkdir()
    names = [f"k{i}.{e}" for i in range(3) for e in ("jpg", "cls")] + ["lonely.jpg", "orphan.cls"] + \
        [f"k{i}.{e}" for i in range(3, 6) for e in ("cls", "jpg")]  # the bad groups in the middle
    subprocess.run(["tar", "-cf", str(shards / "plain-0.tar"), "-C", str(stage_dir), *names], check=True)
    with pytest.raises(ValueError, match=r"plain file name"):  # a manifest elsewhere would name ../plain/...
        index_shards(str(shards / "plain-{0..0}.tar"), out=tmp_path / "meta")
    out = shards
    report = index_shards(str(shards / "plain-{0..0}.tar"))
    assert report.num_samples == 6
    assert sorted((p["shard"], p["key"]) for p in report.problems) == [
        ("plain-0.tar", "lonely"), ("plain-0.tar", "orphan")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["skipped"]) == 2
    got = [(s.key, s.data, s.label) for _, s in iter_raw_samples(out)]
    assert got == [(f"k{i}", data, _label_of(rel)) for i, (rel, data) in enumerate(files)]
    assert check_dataset(out).ok
    counts = {c["index"]: c["count"] for c in inspect_dataset(out)["classes"]}
    want = {}
    for rel, _ in files:
        want[_label_of(rel)] = want.get(_label_of(rel), 0) + 1
    assert {k: v for k, v in counts.items() if v} == want


def test_index_refuses_a_compressed_shard(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"\x1f\x8b\x08" + bytes(600))
    with pytest.raises(ValueError, match="compressed"):
        index_shards(tmp_path)


def test_commands_have_help():
    for name in ("inspect", "check", "unpack", "convert", "stage", "index", "serve"):
        res = _run(name, "--help")
        assert res.exit_code == 0 and "Example" in res.output, name


def test_import_convert_tools_without_torch():
    code = ("import sys, shardfeed.convert.tools.check, shardfeed.convert.tools.convert, "
            "shardfeed.convert.tools.index, shardfeed.convert.tools.inspect, shardfeed.convert.tools.serve, "
            "shardfeed.convert.tools.stage, "
            "shardfeed.convert.tools.unpack, shardfeed.convert.cli.tools, shardfeed.convert.writers.webdataset, "
            "shardfeed.convert.writers.lmdb;"
            "assert 'torch' not in sys.modules and 'webdataset' not in sys.modules, 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _flip_one_image_byte(dataset: Path) -> str:
    """Flip one byte inside the first image of the first shard (tar headers and sizes intact)."""
    shard = sorted(dataset.glob("*.tar"))[0]
    with tarfile.open(shard) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith((".jpg", ".png")))
    raw = bytearray(shard.read_bytes())
    raw[member.offset_data + member.size // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    return shard.name


@pytest.mark.parametrize("command", ["unpack", "convert"])
def test_a_shard_whose_bytes_changed_is_never_copied_silently(packed_wds, tmp_path, command):
    """A flipped byte inside an image (sizes intact) went through unpack (the damaged image
    written) and convert (re-stored with a fresh CRC: the damage laundered) with exit status 0;
    both now check each shard's sha256 against the manifest while reading it."""
    src = tmp_path / "src"
    shutil.copytree(packed_wds, src)
    shard = _flip_one_image_byte(src)
    out = tmp_path / "out"
    args = [command, str(src), str(out)] + (["--format", "lmdb"] if command == "convert" else [])
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1, r.output
    assert shard in r.output and "sha256" in r.output and "Traceback" not in r.output
    assert not (out / "manifest.json").exists()


def test_index_refuses_a_huge_class_index_instead_of_listing_every_class(tmp_path):
    """A foreign shard whose .cls says 99999999999999999999 made `index` build a list of 10**20
    class names (it never ended); without --classes the inferred class count is bounded."""
    jpg = _image(3, "JPEG")
    d = tmp_path / "foreign"
    d.mkdir()
    with tarfile.open(d / "a.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in (("x/1.jpg", jpg), ("x/1.cls", b"99999999999999999999"), ("x/2.jpg", jpg),
                           ("x/2.cls", b"0")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    r = CliRunner().invoke(cli, ["index", str(d)])
    assert r.exit_code == 1, r.output
    assert "99999999999999999999" in r.output and "--classes" in r.output
    assert not (d / "manifest.json").exists()


@pytest.mark.parametrize("command", ["check", "stage"])
def test_a_folder_where_a_shard_should_be_is_named_with_the_fix(packed_wds, tmp_path, command):
    """check/stage printed only "[Errno 21] Is a directory: '...shard-000000.tar'"."""
    src = tmp_path / "src"
    shutil.copytree(packed_wds, src)
    shard = sorted(src.glob("*.tar"))[0]
    shard.unlink()
    shard.mkdir()
    args = [command, str(src)] + ([str(tmp_path / "dest")] if command == "stage" else [])
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1, r.output
    line = [ln for ln in r.output.splitlines() if ln.startswith("shardfeed: error:")][0]
    assert shard.name in line and "is a folder" in line and "Errno" not in line


# ---------------------------------------------------------------------------------------------
# index --overwrite on a packed dataset, stage --overwrite, unpack counts


def _sidecar_src(root: Path) -> tuple[dict[str, bytes], dict[str, dict[str, bytes]]]:
    """Plant 12 images in 2 class folders, 8 of them with a ``.txt`` and 5 with a ``.json`` beside.

    Returns ``({image path: bytes}, {image path: {field: bytes}})``.
    """
    images, sidecars = {}, {}
    for i in range(12):
        rel = f"{'ab'[i % 2]}/img_{i:02d}.jpg"
        data = _image(100 + i, "JPEG")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        images[rel] = data
        sidecars[rel] = {}
        if i % 3 != 0:
            sidecars[rel]["txt"] = f"caption {i} é".encode()
            (root / rel).with_suffix(".txt").write_bytes(sidecars[rel]["txt"])
        if i % 2 == 0 or i == 5:
            sidecars[rel]["json"] = json.dumps({"i": i, "tag": "x" * i}).encode()
            (root / rel).with_suffix(".json").write_bytes(sidecars[rel]["json"])
    return images, sidecars


def _read_with_fields(ds: Path, fields=("txt", "json")) -> dict[str, tuple]:
    from shardfeed.readers.sources.dataset import open_dataset

    got = {}
    for s, f in open_dataset(ds, decode=False, shuffle=False, fields=fields):
        got[s.meta["path"]] = (s.data, {k: v for k, v in f.items() if v is not None})
    return got


@pytest.mark.parametrize("sidecars", [True, False])
def test_index_overwrite_rebuilds_a_missing_index_keeping_the_manifest(tmp_path, sidecars):
    images, planted = _sidecar_src(tmp_path / "src")
    out = tmp_path / "out"
    args = ["pack", tmp_path / "src", out, "--max-count", "7"] + (["--sidecars", "txt,json"] if sidecars else [])
    assert _run(*args).exit_code == 0
    old = json.loads((out / "manifest.json").read_bytes())
    lost = (out / "shard-000001.sfidx").read_bytes()
    (out / "shard-000001.sfidx").unlink()

    res = _run("index", out, "--overwrite")
    assert res.exit_code == 0, res.output
    new = json.loads((out / "manifest.json").read_bytes())
    assert (out / "shard-000001.sfidx").read_bytes() == lost
    assert {k: v for k, v in new.items() if k != "shards"} == {k: v for k, v in old.items() if k != "shards"}
    assert len(new["shards"]) == len(old["shards"]) == 2
    for a, b in zip(new["shards"], old["shards"]):
        assert a == b  # the same index file, so its name, size and sha256 entries are the same too
    assert new["shards"][1]["index_sha256"] == hashlib.sha256(lost).hexdigest()
    if not sidecars:
        return
    assert new["version"] == old["version"] == 3 and set(new["fields"]) == {"txt", "json"}
    got = _read_with_fields(out)
    assert {p: d for p, (d, _) in got.items()} == images
    decoded = {rel: {k: (v.decode() if k == "txt" else json.loads(v)) for k, v in f.items()}
               for rel, f in planted.items()}  # the reader gives text and parsed JSON
    assert {p: f for p, (_, f) in got.items()} == decoded
    restored = tmp_path / "restored"
    assert _run("unpack", out, restored).exit_code == 0
    expect = {**images}
    for rel, fields in planted.items():
        for k, v in fields.items():
            expect[rel[:-4] + "." + k] = v
    assert _folder_files(restored) == expect


def test_index_overwrite_with_the_manifests_classes_keeps_the_fields(tmp_path):
    """inspect's fix for a damaged index names the manifest's classes: the manifest stays as it was."""
    images, planted = _sidecar_src(tmp_path / "src")
    out = tmp_path / "out"
    assert _run("pack", tmp_path / "src", out, "--sidecars", "txt,json", "--max-count", "7").exit_code == 0
    old = (out / "manifest.json").read_bytes()
    lost = (out / "shard-000000.sfidx").read_bytes()
    (out / "shard-000000.sfidx").write_bytes(lost[:8])  # damaged
    (tmp_path / "classes.txt").write_text("a\nb\n")  # the planted class folders
    res = _run("index", out, "--overwrite", "--classes", tmp_path / "classes.txt")
    assert res.exit_code == 0, res.output
    assert (out / "manifest.json").read_bytes() == old
    assert (out / "shard-000000.sfidx").read_bytes() == lost
    assert {p: d for p, (d, _) in _read_with_fields(out).items()} == images
    assert {p: set(f) for p, (_, f) in _read_with_fields(out).items()} == {p: set(f) for p, f in planted.items()}


def test_index_overwrite_reindexes_shards_the_manifest_does_not_describe(tmp_path):
    """Shards changed since the manifest: they are indexed afresh and the manifest replaced."""
    images, _ = _sidecar_src(tmp_path / "src")
    out = tmp_path / "out"
    assert _run("pack", tmp_path / "src", out, "--max-count", "7").exit_code == 0
    (out / "shard-000001.tar").unlink()
    (out / "shard-000001.sfidx").unlink()
    res = _run("index", out, "--overwrite")
    assert res.exit_code == 0, res.output
    m = json.loads((out / "manifest.json").read_bytes())
    assert [s["name"] for s in m["shards"]] == ["shard-000000.tar"] and m["num_samples"] == 7
    assert "indexed_from" in m["options"]


def test_stage_overwrite_deletes_the_older_datasets_extra_shards_only(src, wds, tmp_path):
    """DEST holds an older dataset with more shards: --overwrite leaves only SRC's files and the user's."""
    small = tmp_path / "small"  # 2 shards where the staged dataset has 4 (wds: 60 images, 16 per shard)
    pack(src, small, PackOptions(format="wds", max_count=30, workers=1))
    dest = tmp_path / "staged"
    assert stage(wds, dest, min_free_bytes=1000).ok
    assert (dest / "shard-000003.tar").is_file() and (dest / "shard-000003.sfidx").is_file()

    res = _run("stage", small, dest, "--min-free", "1KB", "--overwrite")
    assert res.exit_code == 0, res.output
    assert _folder_files(dest) == _staged_files(small)
    assert sorted(p.name for p in dest.glob("shard-*.tar")) == ["shard-000000.tar", "shard-000001.tar"]

    # a file shardfeed did not write: refused by name as pack --overwrite refuses, nothing deleted
    assert stage(wds, tmp_path / "big", min_free_bytes=1000).ok
    (tmp_path / "big" / "notes.txt").write_bytes(b"mine")
    before = _folder_files(tmp_path / "big")
    res = _run("stage", small, tmp_path / "big", "--min-free", "1KB", "--overwrite")
    assert res.exit_code == 1 and "notes.txt" in res.stderr
    assert _folder_files(tmp_path / "big") == before


def test_unpack_counts_images_and_sidecar_files_apart(tmp_path):
    images, planted = _sidecar_src(tmp_path / "src")
    out = tmp_path / "out"
    assert _run("pack", tmp_path / "src", out, "--sidecars", "txt,json", "--max-count", "7").exit_code == 0
    side_bytes = sum(len(v) for f in planted.values() for v in f.values())
    num_side = sum(len(f) for f in planted.values())
    assert (len(images), num_side) == (12, 15)

    res = CliRunner().invoke(cli, ["unpack", str(out), str(tmp_path / "r"), "--json", str(tmp_path / "u.json")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "unpacked 12 images" in res.output and "and 15 sidecar files" in res.output
    report = json.loads((tmp_path / "u.json").read_bytes())
    assert report["num_files"] == 12 and report["num_bytes"] == sum(map(len, images.values()))
    assert report["num_sidecar_files"] == 15 and report["num_sidecar_bytes"] == side_bytes

    ordinary = tmp_path / "ordinary"
    pack(tmp_path / "src", ordinary, PackOptions(format="wds", workers=1))
    report = unpack(ordinary, tmp_path / "r3")  # no fields: the summary names no sidecar files
    assert (report.num_files, report.num_sidecar_files) == (12, 0) and "sidecar" not in report.summary()
