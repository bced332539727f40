"""LMDB on slow storage reads a worker's next batch ahead (``LMDBSource._guess_next_batch``): the
samples delivered are always the ones asked for, whether the guess was right or wrong, within the
read-ahead bounds, and nothing is left reading afterwards."""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time
import types

import pytest

from shardfeed.readers import make_loader, open_dataset

from .epoch_order_reference import permutation
from .watch_helpers import load_emulator, require_fuse


@pytest.fixture
def slow(monkeypatch):
    """Every read counts as slow and goes by pread (as on a network mount); counts the streams made
    and closed, and the most bytes and records any stream held ahead."""
    from shardfeed.readers.storage import lmdb_readahead
    from shardfeed.readers.sources import lmdb_source

    monkeypatch.setattr(lmdb_source, "SLOW_READ_S", -1.0)
    monkeypatch.setattr(lmdb_source, "PREAD_LATENCY_S", 0.0)
    seen = {"made": 0, "closed": 0, "streams": [], "max_bytes": 0, "limit": None}
    real_init, real_close = lmdb_readahead.ValueStream.__init__, lmdb_readahead.ValueStream.close
    real_reserve = lmdb_readahead._Budget.reserve

    def init(self, *a, **k):
        real_init(self, *a, **k)
        seen["made"] += 1
        seen["streams"].append(self)

    def close(self):
        seen["closed"] += 1
        real_close(self)

    def reserve(self, n):
        ok = real_reserve(self, n)
        seen["max_bytes"] = max(seen["max_bytes"], self.held)
        seen["limit"] = self.limit
        return ok

    monkeypatch.setattr(lmdb_readahead.ValueStream, "__init__", init)
    monkeypatch.setattr(lmdb_readahead.ValueStream, "close", close)
    monkeypatch.setattr(lmdb_readahead._Budget, "reserve", reserve)
    return seen


def _planted(tiny_folder_expected, ds, indices):
    """The planted (bytes, label) of each sample index, by the original path the pack stored."""
    return [tiny_folder_expected[ds[i].meta["path"]] for i in indices]


def _fake_worker(monkeypatch, num_workers, worker):
    import torch.utils.data

    info = types.SimpleNamespace(num_workers=num_workers, id=worker)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)


def _permutation(n, seed, epoch):
    return permutation(n, seed, epoch)


@pytest.mark.parametrize("rank,world_size,pad,drop_last,epoch", [(0, 1, False, False, 0), (1, 2, False, True, 3),
                                                                  (2, 7, True, False, 1)])
def test_the_guessed_order_is_the_samplers(packed_lmdb, rank, world_size, pad, drop_last, epoch):
    loader = make_loader(packed_lmdb, 8, num_workers=0, decode=False, seed=5, rank=rank, world_size=world_size,
                         pad=pad, drop_last=drop_last)
    ds = loader.dataset
    loader.set_epoch(epoch)
    ds.set_epoch(epoch)
    loader.sampler.set_epoch(epoch)
    n = len(ds)
    base = -(-n // world_size) if pad else n // world_size  # each rank's contiguous range of the permutation
    share = base - base % 8 if drop_last else base
    perm = _permutation(n, 5, epoch)
    expected = [perm[p % n] for p in range(rank * base, rank * base + share)]
    order = ds._epoch_order(epoch)
    assert order.slice(0, len(order)).tolist() == list(loader.sampler) == expected


def _epoch_batches(packed_lmdb, *, seed: int, epoch: int):
    """A raw source in batches of 8 at ``epoch``, its order (computed here) and that order's batches."""
    ds = open_dataset(packed_lmdb, decode=False, seed=seed)
    ds.configure_batching(8)
    ds.set_epoch(epoch)
    order = _permutation(len(ds), seed, epoch)
    return ds, order, [order[p:p + 8] for p in range(0, len(order), 8)]


def test_right_guesses_serve_the_next_batch_with_its_own_samples(packed_lmdb, tiny_folder_expected, slow,
                                                                 monkeypatch):
    ds, order, batches = _epoch_batches(packed_lmdb, seed=2, epoch=1)
    _fake_worker(monkeypatch, 2, 1)  # worker 1 of 2 gets batches 1, 3, 5, ...
    mine = batches[1::2]
    for batch in mine:
        got = ds.__getitems__(batch)
        assert [s.key for s in got] == [f"{i:09d}" for i in batch]
        assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batch)
        assert slow["made"] == 1  # one stream all along: each next batch was the one read ahead
    assert "_ahead" not in ds.__dict__  # nothing follows the epoch's last batch (next epoch not asked)
    assert slow["closed"] >= 1


def test_wrong_guesses_are_dropped_and_the_asked_samples_delivered(packed_lmdb, tiny_folder_expected, slow,
                                                                   monkeypatch):
    ds, order, batches = _epoch_batches(packed_lmdb, seed=2, epoch=0)
    _fake_worker(monkeypatch, 2, 0)  # the guess after batch 0 is batch 2; it is asked for 1, 4, ...
    asked = [batches[0], batches[1], batches[4], batches[3], sorted(order[:8]), batches[6]]
    for batch in asked:
        got = ds.__getitems__(batch)
        assert [s.key for s in got] == [f"{i:09d}" for i in batch]
        assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batch)
    assert slow["made"] == len(asked)  # no guess was right: each batch read afresh
    held = ds.__dict__.get("_ahead")
    stale = [s for s in slow["streams"] if held is None or s is not held[1]]
    assert slow["closed"] >= len(stale)
    for s in stale:  # dropped streams keep no reads queued or pending
        assert len(s) == 0


def test_reads_ahead_stay_in_their_bounds(packed_lmdb, tiny_folder_expected, slow, monkeypatch):
    from shardfeed.readers.storage import lmdb_readahead

    ds = open_dataset(packed_lmdb, decode=False, seed=0)
    ds.configure_batching(12)
    ds.read_ahead_records = 5
    record = max(len(ds[i].data) for i in range(len(ds)))
    ds.read_ahead_bytes = 3 * record + 1000
    in_flight = {"now": 0, "max": 0}
    lock = threading.Lock()
    real_fetch = lmdb_readahead._fetch

    def fetch(*a):
        with lock:
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
        try:
            time.sleep(0.003)
            return real_fetch(*a)
        finally:
            with lock:
                in_flight["now"] -= 1

    monkeypatch.setattr(lmdb_readahead, "_fetch", fetch)
    _fake_worker(monkeypatch, 1, 0)
    order = _permutation(len(ds), 0, 0)
    for p in range(0, len(order), 12):
        batch = order[p:p + 12]
        got = ds.__getitems__(batch)
        assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batch)
        held = ds.__dict__.get("_ahead")
        if held is not None:  # between batches: the next batch's first reads, no more
            assert len(held[1]._pending) <= 5
    assert slow["made"] == 1
    assert in_flight["max"] <= 5
    assert slow["max_bytes"] <= slow["limit"] == 3 * record + 1000


def _thread_count_settles(before: int, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return threading.active_count()


@pytest.mark.parametrize("num_workers,persistent", [(0, True), (2, True), (2, False)])
def test_a_loader_delivers_the_samplers_order_across_epochs_and_resume(packed_lmdb, tiny_folder_expected, slow,
                                                                       num_workers, persistent):
    from shardfeed.readers.storage.shard_readahead import MAX_DEPTH

    before = threading.active_count()
    opts = dict(num_workers=num_workers, decode=False, seed=4)
    if num_workers:  # forked workers see the slow-storage settings of the fixture
        opts.update(multiprocessing_context="fork", persistent_workers=persistent)
    loader = make_loader(packed_lmdb, 7, **opts)
    ds = loader.dataset
    for epoch in range(2):
        got = [s for b in loader for s in b]
        order = _permutation(len(ds), 4, epoch)
        assert [s.key for s in got] == [f"{i:09d}" for i in order]
        assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, order)
    it = iter(loader)  # epoch 2: three batches, then resume in a new loader
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    resumed = make_loader(packed_lmdb, 7, **opts)
    resumed.load_state_dict(state)
    got = [s for b in resumed for s in b]
    order = _permutation(len(ds), 4, 2)[21:]
    assert [s.key for s in got] == [f"{i:09d}" for i in order]
    if num_workers == 0:
        assert slow["made"] == 2  # right guesses: one stream per loader, across epochs and the resume
        held = resumed.dataset.__dict__.get("_ahead")  # the next epoch's first batch, read ahead
        assert held is not None and len(held[1]._pending) <= resumed.dataset.read_ahead_records
        done, not_done = concurrent.futures.wait([f for _, f in held[1]._pending], timeout=10)
        assert not not_done  # its reads end by themselves; nothing keeps reading
    t0 = time.monotonic()
    del loader, resumed
    gc.collect()
    assert time.monotonic() - t0 < 10  # workers exit promptly
    # no thread of the loaders is left; without workers the process's read pool (shared, reused) stays
    assert _thread_count_settles(before + (MAX_DEPTH if num_workers == 0 else 0)) <= \
        before + (MAX_DEPTH if num_workers == 0 else 0)


@pytest.mark.fuse
def test_on_emulated_slow_storage_workers_deliver_the_planted_samples(packed_lmdb, tiny_folder_expected):
    require_fuse()
    emu = load_emulator().StorageEmulator(packed_lmdb, open_ms=3.0, read_ms=3.0).start()
    try:
        loader = make_loader(emu.mountpoint, 6, num_workers=2, decode=False, seed=9, persistent_workers=True)
        ds = loader.dataset
        for epoch in range(2):
            got = [s for b in loader for s in b]
            order = _permutation(len(ds), 9, epoch)
            assert [s.key for s in got] == [f"{i:09d}" for i in order]
            assert [(s.data, s.label) for s in got] == [tiny_folder_expected[s.meta["path"]] for s in got]
            assert sorted(s.meta["path"] for s in got) == sorted(tiny_folder_expected)
        assert emu.stats()["max_in_flight"] >= 2
        del loader
    finally:
        emu.stop()


def test_the_next_batch_is_read_ahead_while_any_read_is_slow(packed_lmdb, tiny_folder_expected, slow, monkeypatch):
    from shardfeed.readers.sources import lmdb_source

    ds = open_dataset(packed_lmdb, decode=False, seed=1)
    ds.configure_batching(10)
    _fake_worker(monkeypatch, 1, 0)
    order = _permutation(len(ds), 1, 0)
    batches = [order[p:p + 10] for p in range(0, len(order), 10)]
    ds.__getitems__(batches[0])
    assert ds._ahead[1].tags() == batches[1]  # every read slow: the next batch queued
    monkeypatch.setattr(lmdb_source, "SLOW_READ_S", 1e9)  # from here every read comes back fast (page cache)
    got = ds.__getitems__(batches[1])  # served by the reads held ahead ...
    assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batches[1])
    assert slow["made"] == 1 and "_ahead" not in ds.__dict__  # ... and none slow: nothing more read ahead
    assert not ds._reads_slow
    got = ds.__getitems__(batches[2])  # read in this thread again
    assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batches[2])
    assert slow["made"] == 1 and "_ahead" not in ds.__dict__
