"""Where a resumed epoch continues, as pure functions (readers/order/epoch.py); fast, no I/O.

Expectations are built here from the rule's definition: each rank's sequence, the first ``k``
positions of every rank consumed, the rest cut again among the new ranks.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from .epoch_order_reference import buffer_order, buffer_place

from shardfeed.readers.order.epoch import (fresh_rank_sequence, remaining_sequence, resumed_rank_sequence,
                                     resumed_samples_per_rank, shuffle_buffer_order, worker_batches)


@pytest.mark.parametrize("n,size", [(0, 4), (1, 4), (3, 10), (50, 10), (257, 16), (1000, 1), (1000, 1000)])
def test_shuffle_buffer_order_is_the_windows_of_the_specification(n, size):
    expected = buffer_order(n, size, 3, 2, 1, 0)
    got = shuffle_buffer_order(n, buffer=size, seed=3, epoch=2, rank=1, worker=0).tolist()
    assert got == expected
    assert sorted(got) == list(range(n))  # each place once
    for w in range(0, n, max(size, 1)):  # a window emits its own places only
        assert sorted(got[w:w + size]) == list(range(w, min(n, w + size)))


def test_shuffle_buffer_order_at_any_place_is_that_of_the_whole():
    n, size = 1003, 64
    whole = buffer_order(n, size, 7, 1, 0, 2)
    for a, b in ((0, 1), (5, 70), (64, 128), (990, 1003), (1000, 2000), (500, 400)):
        got = shuffle_buffer_order(n, buffer=size, seed=7, epoch=1, rank=0, worker=2, start=a, stop=b).tolist()
        assert got == whole[a:b]


def test_shuffle_buffer_order_of_a_long_stream_in_constant_time_per_place():
    n, size = 10_000_003, 1000  # places across the computation's chunks of 65,536, and the short last window
    for a, b in ((65_000, 66_500), (131_000, 131_100), (9_999_990, 10_000_003)):
        got = shuffle_buffer_order(n, buffer=size, seed=1, epoch=4, rank=2, worker=3, start=a, stop=b).tolist()
        assert got == [buffer_place(k, n, size, 1, 4, 2, 3) for k in range(a, b)]
    whole = shuffle_buffer_order(200_000, buffer=size, seed=1, epoch=4, rank=2, worker=3)
    assert sorted(whole.tolist()) == list(range(200_000))
    assert whole[:3000].tolist() == [buffer_place(k, 200_000, size, 1, 4, 2, 3) for k in range(3000)]


def test_shuffle_buffer_order_differs_across_epochs_workers_and_windows():
    n, size = 256, 64
    orders = {(e, w): buffer_order(n, size, 0, e, 0, w) for e in range(3) for w in range(2)}
    assert len({tuple(o) for o in orders.values()}) == 6
    first = orders[(0, 0)]
    rel = [[p - w for p in first[w:w + size]] for w in range(0, n, size)]
    assert len({tuple(r) for r in rel}) == n // size  # each window its own permutation
    assert first != list(range(n))


def test_fresh_sequence_is_the_rank_range_and_batches_go_round_robin():
    n, ws, bs, nw = 250, 2, 7, 3
    for rank in range(ws):
        seq = fresh_rank_sequence(n, rank=rank, world_size=ws, batch_size=bs, num_workers=nw, buffer=20,
                                  seed=1, epoch=0, shuffle=True)
        assert sorted(seq.tolist()) == list(range(rank * 125, rank * 125 + 125))
        parts = [worker_batches(seq, batch_size=bs, num_workers=nw, worker=w) for w in range(nw)]
        assert sorted(sum((p.tolist() for p in parts), [])) == sorted(seq.tolist())


def test_resume_arithmetic_random_configurations():
    rng = random.Random(0)
    for _ in range(150):
        n = rng.randint(0, 120)
        pad, drop_last = rng.random() < 0.3, rng.random() < 0.3
        kw = dict(seed=rng.randint(0, 5), epoch=rng.randint(0, 3), shuffle=rng.random() < 0.8, pad=pad,
                  drop_last=drop_last)
        ws0, nw0, bs0, buf0 = rng.randint(1, 4), rng.randint(0, 3), rng.randint(1, 9), rng.choice([0, 5, 16])
        seqs = [fresh_rank_sequence(n, rank=r, world_size=ws0, batch_size=bs0, num_workers=nw0, buffer=buf0, **kw)
                for r in range(ws0)]
        length = len(seqs[0])
        assert all(len(s) == length for s in seqs)
        k = min(length, bs0 * rng.randint(0, length // bs0 + 1))
        seg = {"world_size": ws0, "num_workers": nw0, "batch_size": bs0, "shuffle_buffer": buf0,
               "samples_consumed": k}
        consumed = [p for s in seqs for p in s[:k].tolist()]
        rest = remaining_sequence(n, [seg], **kw).tolist()
        assert Counter(consumed + rest) == Counter(p for s in seqs for p in s.tolist())
        ws1, bs1 = rng.randint(1, 4), rng.randint(1, 9)
        parts = [resumed_rank_sequence(n, [seg], rank=r, world_size=ws1, batch_size=bs1, num_workers=2, buffer=7,
                                       **kw).tolist() for r in range(ws1)]
        per_rank = resumed_samples_per_rank(n, [seg], world_size=ws1, batch_size=bs1, pad=pad, drop_last=drop_last)
        assert all(len(p) == per_rank for p in parts)
        flat = [p for part in parts for p in part]
        m = len(rest)
        if pad:
            assert set(flat) <= set(rest)
            if not drop_last:
                assert set(flat) == set(rest)  # padding repeats, nothing is lost
        else:
            assert Counter(flat) <= Counter(rest)
            lost = m - len(flat)
            assert lost == m % ws1 + (ws1 * ((m // ws1) % bs1) if drop_last else 0)
        if ws1 == ws0 and bs1 == bs0 and not pad:
            assert parts == [s[k:].tolist() for s in seqs]  # exact
