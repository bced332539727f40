"""LMDB records of a batch read ahead on slow storage (``LMDBSource.__getitems__``): the same
samples in the same order as one ``ds[i]`` at a time, errors at their sample, bounded ahead."""

from __future__ import annotations

import os
import threading
import time

import pytest

from shardfeed.readers import make_loader, open_dataset
from shardfeed.readers.errors import CorruptDataError

from .watch_helpers import load_emulator


def _expected(batch, tiny_folder_expected):
    return [tiny_folder_expected[s.meta["path"]] for s in batch]


@pytest.mark.parametrize("slow,pread_latency_s", [(False, 0.0), (True, 0.0), (True, 1e9)])
def test_a_batch_equals_its_samples_one_by_one(packed_lmdb, tiny_folder_expected, slow, pread_latency_s,
                                               monkeypatch):
    from shardfeed.readers.sources import lmdb_source

    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", pread_latency_s)  # 0: by pread, 1e9: through the map
    ds = open_dataset(packed_lmdb, decode=False)
    ds._reads_slow = slow  # as after a slow batch: the records go to the read pool
    ds.read_ahead_records = 3
    idx = [5, 0, 59, 17, 17, 33, 2]
    got = ds.__getitems__(idx)
    assert [s.key for s in got] == [f"{i:09d}" for i in idx]
    one_by_one = [ds[i] for i in idx]
    assert [(s.data, s.label) for s in got] == [(s.data, s.label) for s in one_by_one]
    assert [(s.data, s.label) for s in got] == _expected(got, tiny_folder_expected)


def test_slow_reads_go_to_the_pool_bounded_and_fast_ones_turn_it_off(packed_lmdb, tiny_folder_expected,
                                                                     monkeypatch):
    from shardfeed.readers.storage import lmdb_readahead
    from shardfeed.readers.sources import lmdb_source

    ds = open_dataset(packed_lmdb, decode=False)
    ds.read_ahead_records = 4
    lock = threading.Lock()
    state = {"in_flight": 0, "max": 0, "threads": set()}
    real_get = lmdb_source.LMDBSource._get
    real_read = lmdb_readahead.ValueReader.read

    def slow_get(self, i):  # the batch's first read, in this thread
        value, _ = real_get(self, i)
        return value, 0.01  # a read that took 10 ms (a round trip to slow storage)

    def slow_read(self, offset, length):  # the reads ahead, in the pool
        with lock:
            state["in_flight"] += 1
            state["max"] = max(state["max"], state["in_flight"])
            state["threads"].add(threading.get_ident())
        try:
            time.sleep(0.002)
            return real_read(self, offset, length)
        finally:
            with lock:
                state["in_flight"] -= 1

    monkeypatch.setattr(lmdb_source.LMDBSource, "_get", slow_get)
    monkeypatch.setattr(lmdb_readahead.ValueReader, "read", slow_read)
    got = ds.__getitems__(list(range(40)))
    assert [(s.data, s.label) for s in got] == _expected(got, tiny_folder_expected)
    assert [s.key for s in got] == [f"{i:09d}" for i in range(40)]
    assert ds._reads_slow and len(state["threads"] - {threading.get_ident()}) >= 1
    assert state["max"] <= 4  # read_ahead_records in the pool
    monkeypatch.setattr(lmdb_source.LMDBSource, "_get", real_get)  # fast again (page cache)
    monkeypatch.setattr(lmdb_readahead.ValueReader, "read", real_read)
    ds.__getitems__(list(range(40, 50)))
    assert not ds._reads_slow


@pytest.mark.parametrize("pread_latency_s", [0.0, 1e9])  # reads ahead by pread, and through the map
def test_errors_surface_at_their_sample(packed_lmdb, monkeypatch, pread_latency_s):
    from shardfeed.readers.storage import lmdb_readahead
    from shardfeed.readers.sources import lmdb_source

    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", pread_latency_s)

    ds = open_dataset(packed_lmdb, decode=False)
    ds._reads_slow = True
    real_get = lmdb_source.LMDBSource._get

    real_span = lmdb_readahead.ValueReader.span

    def get(self, i):
        value, took = real_get(self, i)
        return (None if i == 7 else value), took  # record 7 is missing

    def span(self, key):  # ... to the reads ahead too
        return None if key == b"000000007" else real_span(self, key)

    monkeypatch.setattr(lmdb_source.LMDBSource, "_get", get)
    monkeypatch.setattr(lmdb_readahead.ValueReader, "span", span)
    with pytest.raises(CorruptDataError, match="000000007: record missing"):
        ds.__getitems__([3, 4, 7, 8])
    with pytest.raises(IndexError, match="outside"):
        ds.__getitems__([3, 60])
    skipping = open_dataset(packed_lmdb, decode=False, on_error="skip")
    skipping._reads_slow = True
    out = skipping.__getitems__([3, 7, 8])
    assert out[1] is None and [s.key for s in (out[0], out[2])] == ["000000003", "000000008"]


@pytest.mark.fuse
def test_lmdb_on_slow_storage_reads_the_same_samples(packed_lmdb, tiny_folder_expected):
    if not os.path.exists("/dev/fuse"):
        msg = "FUSE unavailable: /dev/fuse is absent, the storage emulator cannot mount"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: FUSE is required here)")
        pytest.skip(msg)
    emu = load_emulator().StorageEmulator(packed_lmdb, open_ms=2.0, read_ms=2.0).start()
    try:
        loader = make_loader(emu.mountpoint, 12, num_workers=0, decode=False, shuffle=True, seed=3)
        got = [s for b in loader for s in b]
        assert sorted(s.meta["path"] for s in got) == sorted(tiny_folder_expected)
        assert [(s.data, s.label) for s in got] == _expected(got, tiny_folder_expected)
        assert emu.stats()["max_in_flight"] >= 2  # records were read ahead, several at once
    finally:
        emu.stop()
