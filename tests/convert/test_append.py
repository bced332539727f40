"""`shardfeed pack SRC OUT --append`: new shards after the old ones, the old ones untouched.

Expectations come from the planted files (their bytes, their folders) and from hashes of the
shard files taken before the append, never from the append's own output.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main
from shardfeed.convert.write.pack import PackOptions, describe_interrupted, pack
from shardfeed.readers import open_dataset


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(8, 12, 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def _plant(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _read(out: Path) -> dict[str, tuple[bytes, int]]:
    got = {}
    for s in open_dataset(out, decode=False, shuffle=False):
        assert s.meta["path"] not in got
        got[s.meta["path"]] = (s.data, s.label)
    return got


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.iterdir()) if p.suffix in (".tar", ".sfidx")}


def _options(**kw) -> PackOptions:
    return PackOptions(workers=1, max_count=3, **kw)


@pytest.fixture()
def first_pack(tmp_path):
    """A dataset of classes ``cat`` and ``dog`` (5 images), and the planted bytes."""
    planted = {f"cat/c{i}.jpg": _jpeg(i) for i in range(3)} | {f"dog/d{i}.jpg": _jpeg(10 + i) for i in range(2)}
    _plant(tmp_path / "src1", planted)
    out = tmp_path / "out"
    pack(tmp_path / "src1", out, _options())
    return out, planted


def test_append_keeps_old_shards_and_classes_and_reads_the_union(tmp_path, first_pack):
    out, planted = first_pack
    before = _digests(out)
    old_names = sorted(json.loads((out / "manifest.json").read_text())["shards"], key=lambda s: s["name"])
    # a new class (sorted before the old ones: it still comes after them) and new images of an old one
    new = {"ant/a0.jpg": _jpeg(20), "ant/a1.jpg": _jpeg(21), "dog/d7.jpg": _jpeg(22)}
    _plant(tmp_path / "src2", new)
    report = pack(tmp_path / "src2", out, _options(append=True))
    assert report.num_samples == 3 and report.extra["duplicates"] == 0
    after = _digests(out)
    assert {n: after[n] for n in before} == before  # every old shard and index byte-identical
    m = json.loads((out / "manifest.json").read_text())
    assert m["class_to_idx"] == {"cat": 0, "dog": 1, "ant": 2}
    assert m["classes"] == ["cat", "dog", "ant"]
    assert m["shards"][:len(old_names)] == old_names
    assert [s["name"] for s in m["shards"][len(old_names):]] == ["shard-000002.tar"]
    index = {"cat": 0, "dog": 1, "ant": 2}
    want = {rel: (data, index[rel.split("/")[0]]) for rel, data in {**planted, **new}.items()}
    assert _read(out) == want
    keys = [s.key for s in open_dataset(out, decode=False, shuffle=False)]
    assert keys == [str(i).zfill(9) for i in range(8)]  # the key sequence continues, unique
    wids = json.loads((out / "shardindex.json").read_text())
    assert [s["url"] for s in wids["shardlist"]] == [s["name"] for s in m["shards"]]
    assert "\"2\": \"ant\"" in (out / "README.md").read_text()
    r = CliRunner().invoke(main, ["check", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", str(out), "--json", str(tmp_path / "inspect.json")])
    assert r.exit_code == 0, r.output
    shown = json.loads((tmp_path / "inspect.json").read_text())
    assert shown["num_samples"] == 8


def test_append_skips_and_counts_images_already_in_the_dataset(tmp_path, first_pack):
    out, planted = first_pack
    src = tmp_path / "src1"  # the first source again, plus one new image
    _plant(src, {"dog/d9.jpg": _jpeg(30)})
    report = pack(src, out, _options(append=True))
    assert report.num_samples == 1 and report.extra["duplicates"] == 5
    m = json.loads((out / "manifest.json").read_text())
    assert m["num_samples"] == 6 and m["files"]["duplicates"] == 5
    assert _read(out) == {**{r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()},
                          "dog/d9.jpg": (_jpeg(30), 1)}
    again = pack(src, out, _options(append=True))  # nothing new: the dataset stays
    assert again.num_samples == 0 and again.extra["duplicates"] == 6
    assert json.loads((out / "manifest.json").read_text()) == m


def test_append_refuses_a_conflicting_class_map_before_writing(tmp_path, first_pack):
    out, _ = first_pack
    before = sorted(p.name for p in out.iterdir())
    manifest = (out / "manifest.json").read_bytes()
    _plant(tmp_path / "src2", {"dog/d5.jpg": _jpeg(40)})
    with pytest.raises(ValueError, match="puts class 'dog' at index 0"):
        pack(tmp_path / "src2", out, _options(append=True, class_to_idx={"dog": 0, "cat": 1}))
    with pytest.raises(ValueError, match="new class 'emu' at index 1"):
        _plant(tmp_path / "src3", {"emu/e.jpg": _jpeg(41)})
        pack(tmp_path / "src3", out, _options(append=True, class_to_idx={"cat": 0, "dog": 1, "emu": 1}))
    assert sorted(p.name for p in out.iterdir()) == before
    assert (out / "manifest.json").read_bytes() == manifest


def test_append_needs_a_finished_dataset(tmp_path):
    _plant(tmp_path / "src", {"cat/c.jpg": _jpeg(1)})
    with pytest.raises(ValueError, match="holds none"):
        pack(tmp_path / "src", tmp_path / "empty", _options(append=True))
    lm = tmp_path / "lmdb"
    pack(tmp_path / "src", lm, PackOptions(format="lmdb", workers=1))
    with pytest.raises(ValueError, match="WebDataset shards only"):
        pack(tmp_path / "src", lm, _options(append=True))


class _Stop(Exception):
    pass


def test_an_interrupted_append_leaves_the_old_dataset_and_a_rerun_finishes(tmp_path, first_pack):
    out, planted = first_pack
    manifest = (out / "manifest.json").read_bytes()
    new = {f"eel/e{i}.jpg": _jpeg(50 + i) for i in range(7)}  # 3 shards of at most 3
    _plant(tmp_path / "src2", new)
    seen = []

    def stop_after_first_shard(n, b):
        seen.append(n)
        if sum(seen) >= 4:
            raise _Stop()

    with pytest.raises(_Stop):
        pack(tmp_path / "src2", out, _options(append=True), progress=stop_after_first_shard)
    assert (out / "manifest.json").read_bytes() == manifest  # the previous dataset, readable as it was
    assert "still reads as the dataset it was" in describe_interrupted(out)
    assert _read(out) == {r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()}
    assert (out / "shard-000002.tar").is_file()  # a complete new shard, kept for the rerun
    kept = hashlib.sha256((out / "shard-000002.tar").read_bytes()).hexdigest()
    report = pack(tmp_path / "src2", out, _options(append=True))
    assert report.shards_resumed == 1 and report.num_samples == 7
    assert hashlib.sha256((out / "shard-000002.tar").read_bytes()).hexdigest() == kept
    want = {r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()} | {r: (d, 2) for r, d in new.items()}
    assert _read(out) == want
    assert not (out / ".shardfeed-pack").exists()
    r = CliRunner().invoke(main, ["check", str(out)])
    assert r.exit_code == 0, r.output


def test_cli_append(tmp_path, first_pack):
    out, _ = first_pack
    _plant(tmp_path / "src2", {"cat/c9.jpg": _jpeg(60)})
    r = CliRunner().invoke(main, ["pack", str(tmp_path / "src2"), str(out), "--append", "--resume", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert "appended: 0 new classes; the dataset holds 6 samples in 2 classes; 0 images already in it skipped" \
        in r.output
    assert _read(out)["cat/c9.jpg"] == (_jpeg(60), 0)
    r = CliRunner().invoke(main, ["pack", str(tmp_path / "src2"), str(tmp_path / "none"), "--append"])
    assert r.exit_code == 1 and "pack SRC into it without --append first" in r.output


def test_the_path_index_answers_and_a_missing_or_stale_one_falls_back_to_the_shards(tmp_path, first_pack, monkeypatch):
    import shardfeed.convert.write.append as append_mod

    out, planted = first_pack
    index = out / ".shardfeed-paths"
    assert index.is_file()
    _plant(tmp_path / "src1", {"dog/d8.jpg": _jpeg(70)})

    def no_shard_reads(*a, **k):
        raise AssertionError("the path index was not used")

    with monkeypatch.context() as m:  # the index written by pack answers: no shard is read
        m.setattr(append_mod, "_sample_path", no_shard_reads)
        assert pack(tmp_path / "src1", out, _options(append=True)).extra["duplicates"] == 5
    _plant(tmp_path / "src1", {"dog/d9.jpg": _jpeg(71)})
    index.write_bytes(index.read_bytes()[:-8])  # damaged: the shards are read instead
    report = pack(tmp_path / "src1", out, _options(append=True))
    assert report.num_samples == 1 and report.extra["duplicates"] == 6
    index.unlink()
    report = pack(tmp_path / "src1", out, _options(append=True))
    assert report.num_samples == 0 and report.extra["duplicates"] == 7
    want = {r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()}
    assert _read(out) == want | {"dog/d8.jpg": (_jpeg(70), 1), "dog/d9.jpg": (_jpeg(71), 1)}


def test_overwrite_removes_the_path_index_as_the_datasets_own(tmp_path, first_pack):
    out, _ = first_pack
    assert (out / ".shardfeed-paths").is_file()
    pack(tmp_path / "src1", out, _options(overwrite=True))  # not refused as a file shardfeed did not write
    assert (out / ".shardfeed-paths").is_file()


def test_append_refuses_a_file_in_the_way_of_its_first_shard(tmp_path, first_pack):
    out, _ = first_pack
    (out / "shard-000002.tar").write_bytes(b"someone else's")
    _plant(tmp_path / "src2", {"cat/c9.jpg": _jpeg(80)})
    with pytest.raises(ValueError, match="in the way of the first new shard"):
        pack(tmp_path / "src2", out, _options(append=True))
    assert (out / "shard-000002.tar").read_bytes() == b"someone else's"


def test_append_refuses_a_bucket_out_and_overwrite(tmp_path):
    _plant(tmp_path / "src", {"cat/c.jpg": _jpeg(1)})
    with pytest.raises(ValueError, match="append to a local copy of the dataset"):
        pack(tmp_path / "src", "s3://bucket/train", _options(append=True))
    with pytest.raises(ValueError, match="neither overwrite"):
        _options(append=True, overwrite=True)


def test_an_unsorted_path_index_is_not_trusted(tmp_path, first_pack):
    from array import array

    out, _ = first_pack
    index = out / ".shardfeed-paths"
    raw = index.read_bytes()
    head, body = raw[:64], array("Q", raw[64:])
    assert len(body) == 3 * 5  # hashes, sizes, modification times
    hashes = body[:5]
    index.write_bytes(head + array("Q", reversed(hashes)).tobytes() + body[5:].tobytes())  # hashes out of order
    _plant(tmp_path / "src1", {"dog/d8.jpg": _jpeg(90)})
    report = pack(tmp_path / "src1", out, _options(append=True))  # read from the shards instead
    assert report.num_samples == 1 and report.extra["duplicates"] == 5


@pytest.mark.parametrize("damage", ["no records", "one record short", "next key 0", "next key on a skipped key"])
def test_a_path_index_whose_counts_disagree_with_the_manifest_is_not_trusted(tmp_path, first_pack, damage):
    """An index with the dataset's identity but not one record per sample, or a next key that a
    sample holds, would append packed images again or reuse a key: the shards are read instead."""
    import struct
    import tarfile

    out, planted = first_pack
    index = out / ".shardfeed-paths"
    raw = index.read_bytes()
    magic, identity, count, next_key, width = struct.unpack("<8s32sQQQ", raw[:64])
    assert (count, next_key, width) == (5, 5, 9)
    hashes, sizes, mtimes = raw[64:104], raw[104:144], raw[144:184]
    if damage == "no records":
        crafted = struct.pack("<8s32sQQQ", magic, identity, 0, 5, 9)
    elif damage == "one record short":
        crafted = struct.pack("<8s32sQQQ", magic, identity, 4, 5, 9) + hashes[:32] + sizes[:32] + mtimes[:32]
    elif damage == "next key 0":
        crafted = struct.pack("<8s32sQQQ", magic, identity, 5, 0, 9) + raw[64:]
    else:  # the manifest lists a skipped file with key 5: the next key must be past it
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["skipped"] = [{"path": "cat/bad.jpg", "key": "000000005", "reason": "empty file"}]
        (out / "manifest.json").write_text(json.dumps(manifest))
        crafted = raw
    index.write_bytes(crafted)
    _plant(tmp_path / "src1", {"dog/d8.jpg": _jpeg(70)})
    report = pack(tmp_path / "src1", out, _options(append=True))
    assert report.num_samples == 1 and report.extra["duplicates"] == 5
    want = {r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()}
    assert _read(out) == want | {"dog/d8.jpg": (_jpeg(70), 1)}
    keys = []
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            keys += sorted({m.name.split(".")[0] for m in tar.getmembers()})
    new_key = "000000006" if damage == "next key on a skipped key" else "000000005"
    assert keys == [f"{i:09d}" for i in range(5)] + [new_key]


def test_append_refuses_an_out_inside_src(tmp_path, first_pack):
    out, _ = first_pack
    with pytest.raises(ValueError, match="OUT is the source folder itself"):
        pack(out, out, _options(append=True))
    with pytest.raises(ValueError, match="lies inside the source folder"):
        pack(tmp_path, out, _options(append=True))


def test_write_dataset_append_adds_samples_after_the_dataset(tmp_path, first_pack):
    from shardfeed.convert import write_dataset

    out, planted = first_pack
    before = _digests(out)
    new = [{"image": _jpeg(100), "ext": "jpg", "path": "emu/e0.jpg", "label": "emu"},
           {"image": _jpeg(101), "ext": "jpg", "path": "dog/d5.jpg", "label": 1},
           {"image": _jpeg(0), "ext": "jpg", "path": "cat/c0.jpg", "label": "cat"}]  # held already
    m = write_dataset(new, out, append=True, classes=["cat", "dog", "emu"])
    assert m.num_samples == 7 and m.files["duplicates"] == 1
    after = _digests(out)
    assert {n: after[n] for n in before} == before
    want = {r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()}
    assert _read(out) == want | {"emu/e0.jpg": (_jpeg(100), 2), "dog/d5.jpg": (_jpeg(101), 1)}
    assert [s.key for s in open_dataset(out, decode=False, shuffle=False)][-2:] == ["000000005", "000000006"]
    with pytest.raises(ValueError, match="puts class 'dog' at index 0"):
        write_dataset(new, out, append=True, classes=["dog", "cat"])
    r = CliRunner().invoke(main, ["check", str(out)])
    assert r.exit_code == 0, r.output


def test_write_dataset_append_stopped_leaves_the_dataset_and_a_rerun_finishes(tmp_path, first_pack):
    from shardfeed.convert import write_dataset

    out, planted = first_pack
    manifest = (out / "manifest.json").read_bytes()
    new = [{"image": _jpeg(110 + i), "ext": "jpg", "path": f"dog/n{i}.jpg", "label": 1} for i in range(5)]

    def stopping():
        yield from new[:4]  # a complete new shard (3) and one sample of the next
        raise _Stop()

    with pytest.raises(_Stop):
        write_dataset(stopping(), out, append=True)
    assert (out / "manifest.json").read_bytes() == manifest
    want = {r: (d, 0 if r.startswith("cat") else 1) for r, d in planted.items()}
    assert _read(out) == want
    m = write_dataset(new, out, append=True)
    assert m.num_samples == 10
    assert _read(out) == want | {s["path"]: (s["image"], 1) for s in new}
    r = CliRunner().invoke(main, ["check", str(out)])
    assert r.exit_code == 0, r.output
