"""Where a resumed epoch continues, as pure functions (readers/epoch.py); fast, no I/O.

Expectations are built here from the rule's definition: each rank's sequence, the first ``k``
positions of every rank consumed, the rest cut again among the new ranks.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from shardfeed.readers.epoch import (fresh_rank_sequence, remaining_sequence, resumed_rank_sequence,
                                     resumed_samples_per_rank, shuffle_buffer_order, worker_batches)


def _reference_buffer(items, size, rng):
    """The reservoir buffer the WebDataset source used before resuming existed (kept as is)."""
    buf, out = [], []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = int(rng.random() * size)
        out.append(buf[j])
        buf[j] = item
    rng.shuffle(buf)
    return out + buf


@pytest.mark.parametrize("n,size", [(0, 4), (3, 10), (50, 10), (257, 16), (1000, 1)])
def test_shuffle_buffer_order_is_the_buffer_replayed(n, size):
    rng = random.Random("shuffle-buffer:3:2:1:0")
    expected = _reference_buffer(list(range(n)), size, rng) if size > 1 else list(range(n))
    got = shuffle_buffer_order(n, buffer=size, seed=3, epoch=2, rank=1, worker=0).tolist()
    assert got == expected


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
