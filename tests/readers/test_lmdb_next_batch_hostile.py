"""LMDB reads on slow storage with batches no loader's sampler gives (repeated indices, varying
sizes, indices outside the dataset) deliver exactly the samples asked for, or the error of
``self[i]`` at the first bad one."""

from __future__ import annotations

import pytest

from shardfeed.readers import open_dataset

from .test_lmdb_next_batch import _fake_worker, _permutation, _planted, slow  # noqa: F401


def test_hostile_batches_deliver_the_asked_samples(packed_lmdb, tiny_folder_expected, slow, monkeypatch):  # noqa: F811
    ds = open_dataset(packed_lmdb, decode=False, seed=2)
    ds.configure_batching(4)
    ds.set_epoch(0)
    n = len(ds)
    order = _permutation(n, 2, 0)
    _fake_worker(monkeypatch, 1, 0)
    asked = [order[0:4], order[4:8], order[4:8], [order[8]] * 4, order[8:10], order[12:16] + order[12:16],
             order[16:20], order[20:24][::-1], order[24:28], [order[28]], order[29:33], list(range(n))]
    for batch in asked:
        batch = [i for i in batch if i < n] or [0, 0]
        got = ds.__getitems__(batch)
        assert [s.key for s in got] == [f"{i:09d}" for i in batch]
        assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batch)


@pytest.mark.parametrize("bad", [-1, "n", "n+5"])
def test_indices_outside_fail_like_a_single_read(packed_lmdb, slow, monkeypatch, bad):  # noqa: F811
    ds = open_dataset(packed_lmdb, decode=False, seed=2)
    ds.configure_batching(4)
    _fake_worker(monkeypatch, 1, 0)
    n = len(ds)
    i = {"n": n, "n+5": n + 5}.get(bad, bad)
    with pytest.raises(IndexError):
        ds[i]
    with pytest.raises(IndexError):
        ds.__getitems__([0, 1, i, 2])
    order = _permutation(n, 2, 0)
    got = ds.__getitems__(order[:4])  # the source still reads what is asked after the failure
    assert [s.key for s in got] == [f"{j:09d}" for j in order[:4]]


def test_a_guessed_batch_of_one_sample_is_served_and_its_stream_closed(packed_lmdb, tiny_folder_expected, slow,  # noqa: F811
                                                                       monkeypatch):
    ds = open_dataset(packed_lmdb, decode=False, seed=2)
    n = len(ds)
    size = n - 1  # the epoch: one full batch, then a batch of one sample
    ds.configure_batching(size)
    ds.set_epoch(0)
    order = _permutation(n, 2, 0)
    _fake_worker(monkeypatch, 1, 0)
    for batch in (order[:size], order[size:]):
        got = ds.__getitems__(batch)
        assert [(s.data, s.label) for s in got] == _planted(tiny_folder_expected, ds, batch)
    assert "_ahead" not in ds.__dict__
    assert slow["closed"] >= slow["made"]  # no stream left holding reads
