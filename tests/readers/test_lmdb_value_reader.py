"""LMDB records read ahead by ``os.pread`` of their ranges in ``data.mdb``
(:mod:`shardfeed.readers.storage.lmdb_readahead`): each read is the planted record's own range, inside
the file; the samples are the planted bytes and labels, shuffled, in workers; the window stays
within its bounds in records and bytes."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from shardfeed.readers import make_loader, open_dataset

# planted images: some far larger than an LMDB page (values in overflow pages), some small
# enough to sit inside a leaf page
_SIZES = [(260, 200), (24, 20), (300, 300), (16, 16), (180, 260), (40, 30), (320, 240), (20, 28), (200, 200)]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """``(lmdb folder, {relative path: (file bytes, label)})`` of noise JPEGs in two classes."""
    from PIL import Image

    from shardfeed.convert.write.pack import PackOptions, pack

    root = tmp_path_factory.mktemp("planted")
    src = root / "images"
    rng = np.random.default_rng(7)
    expected = {}
    for label, cls in enumerate(["a_first", "b_second"]):
        (src / cls).mkdir(parents=True)
        for i, (w, h) in enumerate(_SIZES):
            path = src / cls / f"p{i:02d}.jpg"
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path, quality=95)
            expected[f"{cls}/{path.name}"] = (path.read_bytes(), label)
    assert max(len(b) for b, _ in expected.values()) > 100_000 and min(len(b) for b, _ in expected.values()) < 1500
    pack(src, root / "lmdb", PackOptions(format="lmdb", workers=1, seed=0))
    return root / "lmdb", expected


def _record_reads(monkeypatch, log_path: Path | None = None):
    """Wrap ``ValueReader.read``: every call's ``(offset, length)`` in the returned list (and, for
    forked workers, appended to ``log_path``)."""
    from shardfeed.readers.storage import lmdb_readahead

    real = lmdb_readahead.ValueReader.read
    calls: list = []
    lock = threading.Lock()

    def read(self, offset, length):
        with lock:
            calls.append((offset, length))
        if log_path is not None:
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, f"{offset} {length}\n".encode())
            finally:
                os.close(fd)
        return real(self, offset, length)

    monkeypatch.setattr(lmdb_readahead.ValueReader, "read", read)
    return calls


def _check_ranges(calls, raw: bytes, expected) -> None:
    """Each read range lies inside the file and holds exactly one planted image's bytes."""
    images = [b for b, _ in expected.values()]
    for offset, length in calls:
        assert 0 <= offset and offset + length <= len(raw)
        window = raw[offset:offset + length]
        holding = [b for b in images if b in window]
        assert len(holding) == 1, (offset, length)
        assert length < len(holding[0]) + 400  # the record (image + its small header), not more


def test_reads_are_the_records_own_ranges_and_values_the_planted_bytes(planted, monkeypatch):
    from shardfeed.readers.sources import lmdb_source

    db, expected = planted
    raw = (db / "data.mdb").read_bytes()
    calls = _record_reads(monkeypatch)
    monkeypatch.setattr(lmdb_source, "SLOW_READ_S", -1.0)  # every read counts as slow: all read ahead,
    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", 0.0)  # by pread
    ds = open_dataset(db, decode=False)
    ds._reads_slow = True  # as after a slow batch: from its first record on
    order = list(np.random.default_rng(3).permutation(len(ds)))
    got = ds.__getitems__(order[:7]) + ds.__getitems__(order[7:])
    assert sorted(s.meta["path"] for s in got) == sorted(expected)
    assert [(s.data, s.label) for s in got] == [expected[s.meta["path"]] for s in got]
    assert len(calls) == len(expected)  # each record read ahead, once
    assert len({o for o, _ in calls}) == len(calls)
    _check_ranges(calls, raw, expected)


@pytest.mark.multiprocess
def test_shuffled_epoch_in_workers_reads_the_planted_samples(planted, monkeypatch, tmp_path):
    from shardfeed.readers.sources import lmdb_source

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("needs the fork start method (the read log is patched in before the workers start)")
    db, expected = planted
    raw = (db / "data.mdb").read_bytes()
    log = tmp_path / "reads.log"
    _record_reads(monkeypatch, log)
    monkeypatch.setattr(lmdb_source, "SLOW_READ_S", -1.0)
    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", 0.0)
    loader = make_loader(db, 4, num_workers=2, decode=False, shuffle=True, seed=5, multiprocessing_context="fork",
                         persistent_workers=False)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = [s for b in loader for s in b]
        assert sorted(s.meta["path"] for s in got) == sorted(expected)
        assert [(s.data, s.label) for s in got] == [expected[s.meta["path"]] for s in got]
    calls = [tuple(int(x) for x in line.split()) for line in log.read_text().splitlines()]
    assert len(calls) >= len(expected)  # the workers read records ahead
    _check_ranges(calls, raw, expected)


@pytest.mark.parametrize("max_records,max_bytes", [(3, 250_000), (8, 120_000), (2, 1)])
def test_the_window_stays_within_its_bounds(planted, monkeypatch, max_records, max_bytes):
    from shardfeed.readers.storage.lmdb_io import process_env
    from shardfeed.readers.storage.lmdb_readahead import ValueReader, read_values_ahead
    from shardfeed.readers.storage.shard_readahead import read_pool

    db, expected = planted
    calls = _record_reads(monkeypatch)
    env = process_env(db)
    keys = [b"%09d" % i for i in np.random.default_rng(1).permutation(len(expected))] * 3
    # the values as LMDB itself copies them out of its map
    with env.begin(buffers=False) as txn:
        want = [bytes(txn.get(k)) for k in keys]
    largest = max(len(v) for v in want)
    reader = ValueReader(env, db / "data.mdb")
    try:
        got = []
        for value, _took in read_values_ahead(reader, keys, read_pool(), fallback=lambda k: None,
                                              max_records=max_records, max_bytes=max_bytes):
            got.append(value)
            time.sleep(0.002)  # the decoder's time: the pool runs ahead meanwhile
            seen = list(calls)  # reads begun so far, less the values taken: read ahead, not yet taken
            assert len(seen) - len(got) <= max_records
            assert sum(n for _, n in seen) - sum(len(v) for v in got) <= max(max_bytes, largest)
    finally:
        reader.close()
    assert got == want
    assert len(calls) == len(keys)


def test_a_key_that_is_not_there_is_none_and_a_failed_read_falls_back(planted, monkeypatch):
    from shardfeed.readers.storage import lmdb_readahead
    from shardfeed.readers.storage.lmdb_io import process_env
    from shardfeed.readers.storage.lmdb_readahead import ValueReader, read_values_ahead
    from shardfeed.readers.storage.shard_readahead import read_pool

    db, expected = planted
    env = process_env(db)
    reader = ValueReader(env, db / "data.mdb")
    real = lmdb_readahead.ValueReader.read

    def read(self, offset, length):
        if length > 100_000:
            raise OSError("emulated I/O error")
        return real(self, offset, length)

    monkeypatch.setattr(lmdb_readahead.ValueReader, "read", read)
    keys = [b"%09d" % i for i in range(len(expected))] + [b"999999999"]
    with env.begin(buffers=False) as txn:
        want = [None if txn.get(k) is None else bytes(txn.get(k)) for k in keys]
    fell_back = []

    def fallback(k):
        fell_back.append(k)
        with env.begin(buffers=False) as txn:
            return bytes(txn.get(keys[k]))

    try:
        got = [v for v, _ in read_values_ahead(reader, keys, read_pool(), fallback=fallback, max_records=4)]
    finally:
        reader.close()
    assert got == want and want[-1] is None
    assert fell_back == [k for k, v in enumerate(want) if v is not None and len(v) > 100_000] and fell_back


@pytest.mark.parametrize("first_read_s,by_pread", [(0.001, False), (0.01, True)])
def test_reads_a_little_slow_stay_on_the_map_and_slower_ones_go_by_pread(planted, monkeypatch, first_read_s,
                                                                         by_pread):
    from shardfeed.readers.sources import lmdb_source

    db, expected = planted
    calls = _record_reads(monkeypatch)
    real_get = lmdb_source.LMDBSource._get
    monkeypatch.setattr(lmdb_source.LMDBSource, "_get", lambda self, i: (real_get(self, i)[0], first_read_s))
    ds = open_dataset(db, decode=False)
    got = ds.__getitems__(list(range(len(ds))))
    assert [(s.data, s.label) for s in got] == [expected[s.meta["path"]] for s in got]
    assert len(calls) == (len(expected) - 1 if by_pread else 0)  # all but the first, read in this thread


def test_a_data_file_replaced_after_the_environment_opened_is_refused(planted, tmp_path):
    """A ``data.mdb`` swapped in after the open, with the same page and entry counts (one more
    commit re-writing a record as it was), describes another transaction: the reader refuses it
    rather than read its pages as the open database's."""
    import shutil

    import lmdb

    from shardfeed.readers.storage.lmdb_io import open_lmdb_readonly
    from shardfeed.readers.storage.lmdb_readahead import ValueReader

    db, _ = planted
    opened, other = tmp_path / "opened", tmp_path / "other"
    shutil.copytree(db, opened)
    shutil.copytree(db, other)
    env = open_lmdb_readonly(opened)
    ValueReader(env, opened / "data.mdb").close()  # the file it opened: accepted
    with lmdb.open(str(other), subdir=True, lock=False) as w:  # the same record re-written: one more commit
        with w.begin(write=True) as txn:
            key, value = next(iter(txn.cursor()))
            txn.put(key, value)
        assert {k: v for k, v in w.stat().items()} == {k: v for k, v in env.stat().items()}
    os.replace(other / "data.mdb", opened / "data.mdb")
    with pytest.raises(OSError, match="does not describe the open database"):
        ValueReader(env, opened / "data.mdb")
    env.close()
