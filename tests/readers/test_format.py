"""Small rules of the binding format (docs/format.md, readers/format/manifest.py), each against a value written
out here by hand or computed with the standard library (mutants of format.py survived these)."""

from __future__ import annotations

import json
import zlib

import msgpack
import pytest

from shardfeed.readers.errors import CorruptDataError, ManifestError
from shardfeed.readers.format.manifest import (Manifest, decode_record, encode_record, split_member_name,
                                               tar_member_bytes)
from shardfeed.readers.format.sample_members import meta_bytes, sample_from_members
from shardfeed.readers.sizes import parse_size
from shardfeed.readers.file_io import write_bytes_atomic


@pytest.mark.parametrize("text,expected", [
    ("1b", 1), ("3kb", 3000), ("2MB", 2_000_000), ("1gb", 10**9), ("1tb", 10**12),
    ("1kib", 1024), ("2MiB", 2 * 1024**2), ("1gib", 1024**3), ("1TiB", 1024**4), ("1.5kb", 1500), (" 7 ", 7),
    (4096, 4096)])
def test_parse_size_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "1xb", "", 0])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("size,expected", [(0, 512), (1, 1024), (511, 1024), (512, 1024), (513, 1536),
                                           (100_000, 512 + 100_352)])
def test_tar_member_bytes(size, expected):
    assert tar_member_bytes(size) == expected  # a 512-byte header, the data padded to 512


def test_meta_bytes_are_compact_sorted_utf8():
    meta = {"path": "Öl/bild_1_ß.jpg", "class": "Öl", "a": 1}
    assert meta_bytes(meta) == '{"a":1,"class":"Öl","path":"Öl/bild_1_ß.jpg"}'.encode("utf-8")


def test_decode_record_checks_the_crc_by_default():
    value = encode_record("000000007", b"image bytes", "jpg", 3, {"path": "c/x.jpg"})
    rec = msgpack.unpackb(value, raw=False)
    assert rec["crc32"] == zlib.crc32(b"image bytes") and rec["data"] == b"image bytes"
    rec["data"] = b"imagE bytes"
    damaged = msgpack.packb(rec, use_bin_type=True)
    with pytest.raises(CorruptDataError, match="CRC-32"):
        decode_record(damaged)
    assert decode_record(damaged, verify=False)["data"] == b"imagE bytes"


def test_write_bytes_atomic_gives_the_usual_file_mode(tmp_path):
    """Not mkstemp's 0600: the mode a plain open() gives under this process's umask."""
    target = tmp_path / "f.json"
    write_bytes_atomic(target, b"{}")
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    assert target.read_bytes() == b"{}"
    assert (target.stat().st_mode & 0o777) == (probe.stat().st_mode & 0o777)


@pytest.mark.parametrize("drop", ["shards", "format", "classes", "class_to_idx", "num_samples"])
def test_manifest_with_a_missing_field_is_a_manifest_error(drop, packed_wds):
    data = json.loads((packed_wds / "manifest.json").read_text())
    Manifest.from_json(data, "m.json")  # whole: fine
    del data[drop]
    with pytest.raises(ManifestError, match="m.json"):
        Manifest.from_json(data, "m.json")


@pytest.mark.parametrize("name,expected", [
    ("000001.jpg", ("000001", "jpg")), ("a/000001.seg.png", ("a/000001", "seg.png")),
    ("a.b/c.d/000002.json", ("a.b/c.d/000002", "json")), ("noext", ("noext", "")), ("d.x/noext", ("d.x/noext", "")),
    (".hidden", ("", "hidden"))])
def test_split_member_name_like_webdataset(name, expected):
    assert split_member_name(name) == expected


def test_sample_from_members_rules_and_errors():
    assert sample_from_members("k", {"jpg": b"J", "cls": b" 3\n", "json": b"{}"}, None, source="s") == \
        (b"J", "jpg", 3, b"{}")
    assert sample_from_members("k", {"JPEG": b"J", "json": b'{"class": "dog"}'}, {"dog": 5}, source="s") == \
        (b"J", "jpg", 5, b'{"class": "dog"}')
    assert sample_from_members("k", {"weird": b"W", "cls": b"1"}, None, source="s")[:3] == (b"W", "weird", 1)
    with pytest.raises(CorruptDataError, match=r"s key k: sample has no image member \(members: cls\)"):
        sample_from_members("k", {"cls": b"1"}, None, source="s")
    with pytest.raises(CorruptDataError, match=r"s key k: sample has 2 image members that could be its image "
                                               r"\(jpg, png\), not one \(members: cls, jpg, png\)"):
        sample_from_members("k", {"jpg": b"J", "png": b"P", "cls": b"1"}, None, source="s")
    with pytest.raises(CorruptDataError, match=r"s key k: sample has 2 members that could be its image \(a, b\), "
                                               r"not one"):
        sample_from_members("k", {"a": b"A", "b": b"B", "cls": b"1"}, None, source="s")
    with pytest.raises(CorruptDataError, match=r"s key k: k\.cls holds b'xxxxxxxxxxxxxxxxxxxx', not a class index"):
        sample_from_members("k", {"jpg": b"J", "cls": b"x" * 30}, None, source="s")
    with pytest.raises(CorruptDataError, match=r"s key k: no k\.cls member and no known class in k\.json"):
        sample_from_members("k", {"jpg": b"J", "json": b'{"class": "cat"}'}, {"dog": 0}, source="s")


@pytest.mark.parametrize("value", [b"", b"\xc1", b"\x92\x01", msgpack.packb({"v": 99}), b"\x81\xa1v"])
def test_decode_record_refuses_what_is_not_a_record(value):
    with pytest.raises(CorruptDataError, match="data.mdb key 000000001"):
        decode_record(value, source="data.mdb", key=b"000000001")


@pytest.mark.parametrize("offsets", [[0, 0, 1024], [0, 1536, 1024], [0, 512, 700], [2**64 - 1] * 3])
def test_decode_index_refuses_offsets_that_cannot_be_sample_starts(offsets):
    """Offsets must rise strictly and sit on 512-byte tar blocks: anything else is a damaged index."""
    import struct

    from shardfeed.readers.errors import CorruptDataError
    from shardfeed.readers.format.offset_index import decode_index

    with pytest.raises(CorruptDataError, match="x.sfidx: damaged offset index"):
        decode_index(struct.pack(f"<{len(offsets)}Q", *offsets), "x.sfidx")
    assert decode_index(struct.pack("<3Q", 0, 1536, 4096), "x.sfidx") == [0, 1536, 4096]


def test_a_damaged_index_is_a_clear_error_when_reading(tmp_path):
    """An index overwritten with 0xff bytes: open_dataset raises CorruptDataError naming it (was an OverflowError)."""
    import os
    import subprocess
    import sys

    from shardfeed.readers import open_dataset
    from shardfeed.readers.errors import CorruptDataError

    src = tmp_path / "src"
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(4):
            (src / c / f"{i}.png").write_bytes(_png(i))
    subprocess.run([sys.executable, "-m", "shardfeed.convert.cli", "-q", "pack", str(src), str(tmp_path / "wds"),
                    "--max-count", "4"], check=True)
    idx = tmp_path / "wds" / "shard-000000.sfidx"
    idx.write_bytes(b"\xff" * os.path.getsize(idx))
    with pytest.raises(CorruptDataError, match="shard-000000.sfidx: damaged offset index"):
        list(open_dataset(tmp_path / "wds", decode=False, shuffle=False))


def _png(seed: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (seed * 40 % 256, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()
