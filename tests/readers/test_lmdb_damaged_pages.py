"""An LMDB database with a damaged page: the record on it fails at its own sample (a
``CorruptDataError`` naming its key, or skipped), and every other sample still reads back as its
planted bytes and label, one at a time, in batches through the map and by ``pread``."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError

PS = 4096


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """``(lmdb folder, damaged key, {key: (bytes, label)} of the others)``: one record's overflow
    page number set past the end of ``data.mdb``."""
    from PIL import Image

    from shardfeed.convert.write.pack import PackOptions, pack

    root = tmp_path_factory.mktemp("damaged_lmdb")
    rng = np.random.default_rng(2)
    for cls in ["a", "b"]:
        (root / "images" / cls).mkdir(parents=True)
        for i in range(6):
            side = 200 if i % 2 else 20  # overflow pages, and values inside a leaf page
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(
                root / "images" / cls / f"p{i}.jpg", quality=95)
    pack(root / "images", root / "clean", PackOptions(format="lmdb", workers=1, seed=0))
    clean = open_dataset(root / "clean", decode=False)
    planted = {}
    for i in range(len(clean)):
        s = clean[i]
        path = root / "images" / s.meta["path"]
        assert s.data == path.read_bytes()
        planted[s.key] = (path.read_bytes(), ["a", "b"].index(s.meta["path"].split("/")[0]))
    shutil.copytree(root / "clean", root / "lmdb")
    raw = bytearray((root / "lmdb" / "data.mdb").read_bytes())
    for pgno in range(2, len(raw) // PS):  # the first leaf node whose value is in overflow pages
        base = pgno * PS
        flags, lower = struct.unpack_from("<HH", raw, base + 10)
        if flags & 2 and not flags & 4:
            for n in range((lower - 16) // 2):
                at = struct.unpack_from("<H", raw, base + 16 + 2 * n)[0]
                nflags, ksize = struct.unpack_from("<HH", raw, base + at + 4)
                key = bytes(raw[base + at + 8:base + at + 8 + ksize]).decode("latin-1")
                if nflags & 1 and key in planted:
                    struct.pack_into("<Q", raw, base + at + 8 + ksize, 10 ** 6)
                    (root / "lmdb" / "data.mdb").write_bytes(bytes(raw))
                    return root / "lmdb", key, {k: v for k, v in planted.items() if k != key}
    raise AssertionError("no record in overflow pages")


def test_one_at_a_time_the_damaged_record_fails_alone(damaged):
    folder, bad, planted = damaged
    ds = open_dataset(folder, decode=False)
    keys = [ds.key(i).decode() for i in range(len(ds))]
    for i, key in enumerate(keys):
        if key == bad:
            with pytest.raises(CorruptDataError, match=key):
                ds[i]
        else:  # the next reads are not refused by a transaction LMDB gave up on
            s = ds[i]
            assert (s.data, s.label) == planted[key]


@pytest.mark.parametrize("pread_latency_s", [0.0, 1e9])  # by pread, through the map
def test_in_batches_the_damaged_record_is_skipped_alone(damaged, monkeypatch, pread_latency_s):
    from shardfeed.readers.sources import lmdb_source

    folder, bad, planted = damaged
    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", pread_latency_s)
    monkeypatch.setattr(lmdb_source, "SLOW_READ_S", -1.0)  # every read slow: the batch read ahead
    ds = open_dataset(folder, decode=False, on_error="skip")
    ds._reads_slow = True
    keys = [ds.key(i).decode() for i in range(len(ds))]
    order = list(range(len(ds)))[::-1] * 2
    got = ds.__getitems__(order)
    for i, s in zip(order, got):
        if keys[i] == bad:
            assert s is None
        else:
            assert (s.data, s.label) == planted[keys[i]]


def test_a_key_the_pread_reader_does_not_find_is_looked_up_by_lmdb(damaged, monkeypatch):
    """Where the pages parsed by ``pread`` disagree with LMDB (here: every lookup finds
    nothing), the batch is LMDB's own records, not "record missing" errors."""
    from shardfeed.readers.storage import lmdb_readahead
    from shardfeed.readers.sources import lmdb_source

    folder, bad, planted = damaged
    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", 0.0)
    monkeypatch.setattr(lmdb_source, "SLOW_READ_S", -1.0)
    looked_up = []

    def span(reader, key):
        looked_up.append(bytes(key))
        return None

    monkeypatch.setattr(lmdb_readahead.ValueReader, "span", span)
    ds = open_dataset(folder.parent / "clean", decode=False)
    ds._reads_slow = True
    keys = [ds.key(i).decode() for i in range(len(ds))]
    order = [i for i in range(len(ds)) if keys[i] != bad]
    got = ds.__getitems__(order)
    assert looked_up  # the pread reader was asked first
    assert [(s.data, s.label) for s in got] == [planted[keys[i]] for i in order]
