"""A damaged LMDB record's error names the database, the key and the sample's original file.
The record to damage is found by the source file's bytes, so the expected
path comes from the source folder, not from shardfeed's decoder."""

from __future__ import annotations

import re
import shutil

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError


def _record_of(db, data: bytes) -> tuple[bytes, bytes]:
    """(key, value) of the one record holding ``data``, found by a byte search."""
    import lmdb

    env = lmdb.open(str(db), subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            hits = [(bytes(k), bytes(v)) for k, v in txn.cursor() if data in bytes(v)]
    finally:
        env.close()
    assert len(hits) == 1
    return hits[0]


def _put(db, key: bytes, value: bytes) -> None:
    import lmdb

    env = lmdb.open(str(db), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(key, value)
    env.close()


def _read_all(db):
    ds = open_dataset(db, decode=False, shuffle=False)
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("damage", ["flipped-byte", "cut-short", "meta-damaged"])
def test_damaged_record_names_its_original_file(damage, packed_lmdb, tiny_folder_expected, tmp_path):
    db = tmp_path / "db"
    shutil.copytree(packed_lmdb, db)
    path = sorted(tiny_folder_expected)[3]
    data = tiny_folder_expected[path][0]
    key, value = _record_of(db, data)
    at = value.index(data)
    if damage == "flipped-byte":  # the image fails its CRC-32
        bad = value[:at + 10] + bytes([value[at + 10] ^ 0xFF]) + value[at + 11:]
    elif damage == "cut-short":  # msgpack cannot decode the record
        bad = value[:at + len(data) // 2]
    else:  # the metadata itself is garbage: the path cannot be known
        m = value.index(b"meta")
        bad = value[:m] + b"\xc1" * 8 + value[m + 8:]
    _put(db, key, bad)
    with pytest.raises(CorruptDataError) as err:
        _read_all(db)
    msg = str(err.value)
    assert f"data.mdb key {key.decode()}" in msg
    if damage == "meta-damaged":
        assert "original file unknown" in msg
    else:
        assert re.search(rf"original file '{re.escape(path)}'", msg), msg
