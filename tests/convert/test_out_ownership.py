"""What ``pack --overwrite`` may delete in OUT: only what the previous dataset's own records name
(its manifest, of any version, its pack state and plan, the files they list), never a file or
folder by the look of its name; an interrupted start (a state folder without its plan) is started
again. Right values: the bytes of the files the tests plant and of a fresh pack of the same folder."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own") / "src"
    for i in range(12):
        p = root / f"c{i % 3}" / f"{i:02d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_png(i))
    return root


def _tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path -> bytes), links as their target's name."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if p.is_symlink():
            out[rel] = b"-> " + str(p.readlink()).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def fresh(src, tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """A fresh pack of ``src`` per format: what an overwrite must leave."""
    refs = {}
    for fmt in ("wds", "lmdb"):
        d = tmp_path_factory.mktemp("fresh") / fmt
        pack(src, d, PackOptions(format=fmt, workers=1, max_count=4))
        refs[fmt] = {k: v for k, v in _tree(d).items() if not k.endswith(".mdb")}
    return refs


def _as_version_1(d: Path) -> None:
    """Turn the WebDataset in ``d`` into what a version-1 shardfeed wrote (``.idx``, no extensions,
    no consumer files)."""
    m = json.loads((d / "manifest.json").read_text())
    m["version"] = 1
    m.pop("extensions", None)
    for s in m["shards"]:
        s.pop("extensions", None)
        (d / s["index"]).rename(d / s["index"].replace(".sfidx", ".idx"))
        s["index"] = s["index"].replace(".sfidx", ".idx")
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "README.md").unlink()
    (d / "shardindex.json").unlink()


def _plant(out: Path) -> dict[str, bytes]:
    """A user's files with names a pack might have written; returns them (relative path -> bytes)."""
    (out / "family-photos.tar").write_bytes(b"holiday 2019")
    (out / "thesis.tmp").mkdir()
    (out / "thesis.tmp" / "chapter1.tex").write_bytes(b"\\chapter{Intro}")
    (out / "backup.tar").mkdir()
    (out / "backup.tar" / "db.sql").write_bytes(b"INSERT 1;")
    (out / "shard-000099.sfidx").write_bytes(b"\0" * 8)  # a shard name no record lists
    return {"family-photos.tar": b"holiday 2019", "thesis.tmp/chapter1.tex": b"\\chapter{Intro}",
            "backup.tar/db.sql": b"INSERT 1;", "shard-000099.sfidx": b"\0" * 8}


@pytest.mark.parametrize("version", [1, "current"])
def test_overwrite_deletes_only_what_the_previous_dataset_names(version, src, fresh, tmp_path):
    out = tmp_path / "out"
    pack(src, out, PackOptions(workers=1, max_count=6, seed=3))  # other shards than the fresh pack
    if version == 1:
        _as_version_1(out)
    before = _tree(out)
    planted = _plant(out)
    r = subprocess.run([*SHARDFEED, "pack", str(src), str(out), "--max-count", "4", "-j", "1", "--overwrite"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    for name in ("family-photos.tar", "thesis.tmp/", "backup.tar/", "shard-000099.sfidx"):
        assert name in r.stderr, r.stderr
    assert "move them away or choose another output location" in r.stderr
    assert _tree(out) == {**before, **planted}  # nothing deleted, the old dataset whole
    for rel in planted:  # the user moves them away: the overwrite works and removes every old file
        (out / rel).unlink()
    (out / "thesis.tmp").rmdir()
    (out / "backup.tar").rmdir()
    r = subprocess.run([*SHARDFEED, "pack", str(src), str(out), "--max-count", "4", "-j", "1", "--overwrite"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _tree(out) == fresh["wds"]


def test_overwrite_replaces_an_lmdb_and_an_interrupted_pack(src, fresh, tmp_path):
    out = tmp_path / "out"
    pack(src, out, PackOptions(format="lmdb", workers=1))
    pack(src, out, PackOptions(workers=1, max_count=4, overwrite=True))  # data.mdb, lock.mdb: named
    assert _tree(out) == fresh["wds"]
    # an interrupted pack: a bad file stops it after some shards, with their state and plan
    bad = tmp_path / "bad"
    for rel, data in _tree(src).items():
        (bad / rel).parent.mkdir(parents=True, exist_ok=True)
        (bad / rel).write_bytes(data)
    (bad / "c2" / "zz.png").write_bytes(b"")
    out2 = tmp_path / "out2"
    with pytest.raises(ValueError, match="zz.png"):
        pack(bad, out2, PackOptions(workers=1, max_count=2, shuffle=False))
    assert (out2 / ".shardfeed-pack" / "plan.json").exists() and list(out2.glob("*.tar"))
    (out2 / "notes.txt").write_bytes(b"mine")
    with pytest.raises(ValueError, match=r"notes\.txt"):
        pack(src, out2, PackOptions(workers=1, max_count=4, overwrite=True))
    (out2 / "notes.txt").unlink()
    pack(src, out2, PackOptions(workers=1, max_count=4, overwrite=True))
    assert _tree(out2) == fresh["wds"]


def test_a_dali_index_beside_the_dataset_is_the_users(src, tmp_path):
    """DALI's wds2idx writes ``shard-000000.idx`` beside a version-2 dataset: no record names it."""
    out = tmp_path / "out"
    pack(src, out, PackOptions(workers=1, max_count=4))
    (out / "shard-000000.idx").write_bytes(b"v1.2 4\n")
    with pytest.raises(ValueError, match=r"shard-000000\.idx"):
        pack(src, out, PackOptions(workers=1, max_count=4, overwrite=True))
    assert (out / "shard-000000.idx").read_bytes() == b"v1.2 4\n"


def test_links_in_out_are_never_followed_nor_deleted_as_ours(src, tmp_path):
    out = tmp_path / "out"
    pack(src, out, PackOptions(workers=1, max_count=4))
    victim = tmp_path / "victim.tar"
    victim.write_bytes(b"the victim's bytes")
    m = json.loads((out / "manifest.json").read_text())
    first = m["shards"][0]["name"]
    (out / first).unlink()
    (out / first).symlink_to(victim)  # a name the manifest lists, now a link
    with pytest.raises(ValueError, match=first):
        pack(src, out, PackOptions(workers=1, max_count=4, overwrite=True))
    assert victim.read_bytes() == b"the victim's bytes" and (out / first).is_symlink()
    # a link as the state folder: never resumed into, never deleted
    out2 = tmp_path / "out2"
    out2.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "plan.json").write_bytes(b"{}")
    (out2 / ".shardfeed-pack").symlink_to(elsewhere)
    for opts in ({"resume": True}, {"overwrite": True}, {}):
        with pytest.raises(ValueError, match=r"\.shardfeed-pack"):
            pack(src, out2, PackOptions(workers=1, **opts))
    assert _tree(elsewhere) == {"plan.json": b"{}"}


@pytest.mark.parametrize("state", ["empty", "partial"])
@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_a_pack_killed_before_its_plan_is_started_again(state, flags, src, fresh, tmp_path):
    """``kill -9`` after ``.shardfeed-pack/`` was made and before ``plan.json``: nothing was written;
    the pack (with or without --resume) starts it."""
    out = tmp_path / "out"
    (out / ".shardfeed-pack").mkdir(parents=True)
    if state == "partial":
        (out / ".shardfeed-pack" / ".files.jsonl.z.k2j3h4.tmp").write_bytes(b"\x78\x01")  # cut mid-write
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--max-count", "4", "-j", "1", *flags],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _tree(out) == fresh["wds"]


def test_a_resumed_pack_never_writes_through_a_link_at_a_shard_temp_name(src, tmp_path):
    bad = tmp_path / "bad"
    for rel, data in _tree(src).items():
        (bad / rel).parent.mkdir(parents=True, exist_ok=True)
        (bad / rel).write_bytes(data)
    (bad / "c1" / "zz.png").write_bytes(b"")  # stops the pack in the middle
    out = tmp_path / "out"
    opts = dict(workers=1, max_count=2, shuffle=False)
    with pytest.raises(ValueError, match="zz.png"):
        pack(bad, out, PackOptions(**opts))
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the victim's bytes")
    (out / ".thesis.tmp").write_bytes(b"a user's file")  # a hidden .tmp no record names
    for i in range(10):
        if not (out / f"shard-{i:06d}.tar").exists():
            (out / f".shard-{i:06d}.tar.tmp").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.shard-0000\d\d\.tar\.tmp.* never writes through"):
        pack(bad, out, PackOptions(**opts, resume=True))
    for link in out.glob(".shard-*.tar.tmp"):
        link.unlink()
    with pytest.raises(ValueError, match="zz.png"):  # the same bad file stops the resumed pack
        pack(bad, out, PackOptions(**opts, resume=True))
    assert victim.read_bytes() == b"the victim's bytes"
    assert (out / ".thesis.tmp").read_bytes() == b"a user's file"  # not deleted with the pack's temp files


def test_the_shard_writer_replaces_a_link_at_its_temp_name(tmp_path):
    from shardfeed.convert.write.tarwriter import TarShardFile

    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the victim's bytes")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".shard-000000.tar.tmp").symlink_to(victim)
    shard = TarShardFile(out, "shard-000000.tar", "shard-000000.sfidx", background=False)
    shard.add_sample("000000000", [("png", b"x" * 10), ("cls", b"1"), ("json", b"{}")])
    entry = shard.close()
    assert victim.read_bytes() == b"the victim's bytes"
    assert (out / "shard-000000.tar").stat().st_size == entry.num_bytes and not (out / "shard-000000.tar").is_symlink()


def test_unpack_never_writes_through_a_link_at_its_temp_name(src, tmp_path):
    from shardfeed.convert.tools.unpack import unpack

    packed = tmp_path / "packed"
    pack(src, packed, PackOptions(workers=1, max_count=4))
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the victim's bytes")
    out = tmp_path / "out"
    (out / "c0").mkdir(parents=True)
    (out / "c0" / ".00.png.unpack.tmp").symlink_to(victim)
    unpack(packed, out, overwrite=True)
    assert victim.read_bytes() == b"the victim's bytes"
    assert (out / "c0" / "00.png").read_bytes() == (src / "c0" / "00.png").read_bytes()


def test_an_interrupted_convert_is_replaced_by_convert_overwrite(src, tmp_path):
    import shutil

    from shardfeed.convert.tools.convert import convert_dataset
    from shardfeed.readers.errors import CorruptDataError

    packed = tmp_path / "packed"
    pack(src, packed, PackOptions(workers=1, max_count=4, shuffle=False))
    last = sorted(packed.glob("*.tar"))[-1]
    good = last.read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0xFF  # the first header's checksum fails: the convert stops after its first shards
    last.write_bytes(bytes(bad))
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    with pytest.raises(CorruptDataError, match=last.name):
        convert_dataset(packed, out, format="wds", max_count=2)
    assert list(out.glob("*.tar")) and not (out / "manifest.json").exists()
    last.write_bytes(good)
    with pytest.raises(ValueError, match="unfinished `shardfeed convert`.*overwrite"):
        convert_dataset(packed, out, format="wds", max_count=2)
    (out / "notes.txt").write_bytes(b"mine")
    with pytest.raises(ValueError, match=r"notes\.txt"):
        convert_dataset(packed, out, format="wds", max_count=2, overwrite=True)
    (out / "notes.txt").unlink()
    convert_dataset(packed, out, format="wds", max_count=2, overwrite=True)
    convert_dataset(packed, fresh, format="wds", max_count=2)
    assert _tree(out) == _tree(fresh)
    shutil.rmtree(fresh)


def test_a_layout_pack_follows_the_same_rules(tmp_path):
    """``--no-labels``/``--sidecars`` packs: --resume on the same finished pack is done, another
    command is refused; --overwrite of an interrupted one with another prefix deletes only its own."""
    from shardfeed.convert.write.layouts import LayoutOptions, pack_layout

    src = tmp_path / "src"
    for i in range(6):
        (src / "a").mkdir(parents=True, exist_ok=True)
        (src / "a" / f"{i}.png").write_bytes(_png(100 + i))
        (src / "a" / f"{i}.txt").write_text(f"caption {i}")
    layout = LayoutOptions(no_labels=True, sidecars=("txt",))
    out = tmp_path / "out"
    opts = dict(workers=1, max_count=2, prefix="part")
    first = pack_layout(src, out, PackOptions(**opts), layout)
    before = _tree(out)
    again = pack_layout(src, out, PackOptions(**opts, resume=True), layout)
    assert again.extra.get("already_complete") and again.num_samples == first.num_samples == 6
    assert "nothing to resume" in again.summary() and _tree(out) == before
    with pytest.raises(ValueError, match=r"other options.*PackOptions\(overwrite=True\)"):
        pack_layout(src, out, PackOptions(**{**opts, "max_count": 3}, resume=True), layout)
    # an interrupted layout pack: its plan names its 'part-' shards, so --overwrite may delete them
    for name in ("manifest.json", "README.md", "shardindex.json"):  # written last, after the shards
        (out / name).unlink(missing_ok=True)
    (out / ".shardfeed-pack").mkdir()
    (out / ".shardfeed-pack" / "plan.json").write_text(json.dumps({"fingerprint": "x", "options": {
        "format": "webdataset", "prefix": "part"}}))
    pack_layout(src, out, PackOptions(**opts, overwrite=True), layout)
    assert _tree(out) == before


_NOT_THE_PACKS = {".shardfeed-pack/notes.txt": b"my notes", ".shardfeed-pack/plan.json.bak": b"{}",
                  ".shardfeed-pack/keep/000001.json": b"a record of mine", ".shardfeed-pack/12.json": b"[]"}


def _plant_in_state_folder(out: Path) -> None:
    for rel, data in _NOT_THE_PACKS.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)


@pytest.mark.parametrize("how", ["finish", "overwrite", "layout"])
def test_files_in_the_state_folder_that_no_pack_writes_stay(how, src, fresh, tmp_path, caplog):
    """The state folder's files that a pack writes go when the pack finishes or is overwritten;
    a file or folder someone else put there stays, with the folder, and a warning names it."""
    out = tmp_path / "out"
    if how == "overwrite":  # an interrupted pack: its plan and a finished shard's record
        bad = tmp_path / "bad"
        for rel, data in _tree(src).items():
            (bad / rel).parent.mkdir(parents=True, exist_ok=True)
            (bad / rel).write_bytes(data)
        (bad / "c2" / "zz.png").write_bytes(b"")
        with pytest.raises(ValueError, match="zz.png"):
            pack(bad, out, PackOptions(workers=1, max_count=2, shuffle=False))
        assert {p.name for p in (out / ".shardfeed-pack").iterdir()} >= {"plan.json", "000000.json"}
    _plant_in_state_folder(out)
    with caplog.at_level("WARNING", logger="shardfeed.convert.write.pack_state"):
        if how == "layout":
            from shardfeed.convert.write.layouts import LayoutOptions, pack_layout

            pack_layout(src, out, PackOptions(workers=1, max_count=4), LayoutOptions(no_labels=True))
        else:
            pack(src, out, PackOptions(workers=1, max_count=4, overwrite=how == "overwrite"))
    left = {rel: data for rel, data in _tree(out).items() if rel.startswith(".shardfeed-pack/")}
    assert left == _NOT_THE_PACKS
    assert "notes.txt" in caplog.text and "keep" in caplog.text
    if how != "layout":
        assert {k: v for k, v in _tree(out).items() if not k.startswith(".shardfeed-pack/")} == fresh["wds"]


def test_the_state_folder_goes_once_it_holds_only_the_packs_files(src, tmp_path):
    out = tmp_path / "out"
    (out / ".shardfeed-pack").mkdir(parents=True)
    for name in (".plan.json.tmp", ".000002.json.x7Qk_2ab.tmp", "write_dataset.json"):  # left by kill -9
        (out / ".shardfeed-pack" / name).write_bytes(b"{")
    pack(src, out, PackOptions(workers=1, max_count=4))
    assert not (out / ".shardfeed-pack").exists()


def test_the_state_file_names_are_the_ones_a_pack_writes():
    from shardfeed.convert.write.pack_state import is_state_file

    for name in ("plan.json", "files.jsonl.z", "000000.json", "1234567.json", "write_dataset.json",
                 ".plan.json.tmp", ".plan.json.abc123_z.tmp", ".000004.json.tmp", ".files.jsonl.z.q1w2e3r4.tmp"):
        assert is_state_file(name), name
    for name in ("notes.txt", "plan.json.bak", "12.json", "0000001.json.gz", ".notes.tmp", ".plan.json.a.b.tmp",
                 "..tmp", ".tmp", "plan.json/", "PLAN.JSON"):
        assert not is_state_file(name), name
