"""The epoch split (docs/format.md "Splitting an epoch"), as pure functions.

Expectations are computed here from the rule's definition (shards laid end to end, N // W per
rank, contiguous ranges), not from the code under test.
"""

from __future__ import annotations

import itertools
import random

import pytest

from shardfeed.readers.sources.dataset import epoch_positions, epoch_ranges, num_batches, resolve_rank, samples_per_rank

from .epoch_order_reference import permutation


def _ids(counts, ranges):
    """Global sample ids (shard, index) of a list of ranges."""
    out = []
    for shard, a, b in ranges:
        assert 0 <= a < b <= counts[shard]
        out.extend((shard, i) for i in range(a, b))
    return out


def _epoch_sequence(counts, *, seed, epoch):
    """The epoch's global sequence by the specification's rule: shards in the seeded permutation of
    their indices keyed by ``(seed, epoch)``, laid end to end."""
    order = permutation(len(counts), seed, epoch)
    return [(s, i) for s in order for i in range(counts[s])]


def _batches_of(worker_counts, batch_size, drop_last=False):
    # a DataLoader batches each worker's samples separately
    return sum((n // batch_size) if drop_last else -(-n // batch_size) for n in worker_counts)


CASES = [
    ([100, 100, 50], 2, 1, 7),
    ([100, 100, 50], 2, 3, 7),
    ([250], 2, 2, 7),
    ([1], 2, 4, 3),
    ([7, 0, 5, 3], 3, 2, 2),
    ([5] * 40, 4, 4, 16),
]


@pytest.mark.parametrize("counts,world,workers,bs", CASES)
@pytest.mark.parametrize("pad", [False, True])
def test_disjoint_union_equal(counts, world, workers, bs, pad):
    n = sum(counts)
    per_rank = -(-n // world) if pad else n // world
    all_ids = []
    for epoch in (0, 1):
        seen = []
        for rank in range(world):
            rank_ids = []
            worker_counts = []
            for w in range(workers):
                r = epoch_ranges(counts, seed=3, epoch=epoch, rank=rank, world_size=world, num_workers=workers,
                                 worker=w, pad=pad, shuffle=True, batch_size=bs)
                ids = _ids(counts, r)
                worker_counts.append(len(ids))
                rank_ids.extend(ids)
            assert len(rank_ids) == per_rank
            # exactly the rank's contiguous slice of the epoch's sequence, workers in order
            sequence = _epoch_sequence(counts, seed=3, epoch=epoch)
            assert rank_ids == [sequence[p % n] for p in range(rank * per_rank, (rank + 1) * per_rank)]
            # same batch count whatever the number of workers
            assert _batches_of(worker_counts, bs) == -(-per_rank // bs) == num_batches(n, world, bs, pad=pad)
            seen.extend(rank_ids)
        universe = {(s, i) for s, c in enumerate(counts) for i in range(c)}
        if pad:
            assert set(seen) == universe
            assert len(seen) == per_rank * world
        else:
            assert len(seen) == len(set(seen))  # no sample read twice
            assert len(universe - set(seen)) == n % world  # only the remainder is missing
        all_ids.append(seen)
    if sum(1 for c in counts if c) > 3:
        # the shard order changes between epochs (keyed by (seed, epoch)); with three shards or fewer
        # two epochs share an order by chance one time in six
        orders = [[s for s, _ in itertools.groupby(x, key=lambda t: t[0])] for x in all_ids]
        assert orders[0] != orders[1]


def test_remainder_is_the_tail_of_the_epoch_sequence():
    counts = [4, 3]
    # no shuffle: sequence is shard 0 then shard 1; 7 samples, 2 ranks -> 3 each, last one dropped
    r0 = epoch_ranges(counts, rank=0, world_size=2, shuffle=False)
    r1 = epoch_ranges(counts, rank=1, world_size=2, shuffle=False)
    assert r0 == [(0, 0, 3)]
    assert r1 == [(0, 3, 4), (1, 0, 2)]


def test_pad_wraps():
    counts = [4, 3]
    assert epoch_ranges(counts, rank=0, world_size=2, shuffle=False, pad=True) == [(0, 0, 4)]
    assert epoch_ranges(counts, rank=1, world_size=2, shuffle=False, pad=True) == [(1, 0, 3), (0, 0, 1)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_only_decides_the_last_batch(drop_last):
    counts = [100, 100, 50]
    bs = 7
    for workers in (1, 2, 4):
        for rank in range(2):
            wc = [len(_ids(counts, epoch_ranges(counts, rank=rank, world_size=2, num_workers=workers, worker=w,
                                                batch_size=bs, drop_last=drop_last))) for w in range(workers)]
            expected = 125 // 7 if drop_last else -(-125 // 7)
            assert _batches_of(wc, bs) == expected
            assert sum(wc) == (125 - 125 % 7 if drop_last else 125)
            # only one worker holds a partial batch
            assert sum(1 for c in wc if c % bs) <= 1


def test_one_shard_feeds_two_ranks_times_four_workers():
    counts = [64]
    got = []
    for rank, w in itertools.product(range(2), range(4)):
        ids = _ids(counts, epoch_ranges(counts, rank=rank, world_size=2, num_workers=4, worker=w, batch_size=1))
        assert len(ids) == 8
        got.extend(ids)
    assert sorted(got) == [(0, i) for i in range(64)]


def test_positions_for_random_access():
    n = 23
    for pad in (False, True):
        ranks = [epoch_positions(n, seed=1, epoch=2, shuffle=True, rank=r, world_size=3, pad=pad) for r in range(3)]
        assert all(len(r) == (8 if pad else 7) for r in ranks)
        flat = [i for r in ranks for i in r]
        if pad:
            assert set(flat) == set(range(n))
        else:
            assert len(set(flat)) == 21
    a = epoch_positions(n, seed=1, epoch=0, shuffle=True, rank=0, world_size=1)
    b = epoch_positions(n, seed=1, epoch=1, shuffle=True, rank=0, world_size=1)
    assert sorted(a) == sorted(b) == list(range(n)) and a != b
    assert epoch_positions(n, seed=1, epoch=0, shuffle=False, rank=0, world_size=1) == list(range(n))


def test_resolve_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_rank() == (0, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert resolve_rank() == (1, 3)
    assert resolve_rank(0, 2) == (0, 2)
    with pytest.raises(ValueError, match="outside"):
        resolve_rank(2, 2)


def test_random_configurations():
    rng = random.Random(0)
    for _ in range(200):
        counts = [rng.randint(0, 30) for _ in range(rng.randint(1, 6))]
        world, workers, bs = rng.randint(1, 4), rng.randint(1, 5), rng.randint(1, 9)
        n = sum(counts)
        seed = rng.randint(0, 9)
        seen = []
        for rank in range(world):
            wc = []
            for w in range(workers):
                ids = _ids(counts, epoch_ranges(counts, seed=seed, epoch=0, rank=rank, world_size=world,
                                                num_workers=workers, worker=w, batch_size=bs))
                wc.append(len(ids))
                seen.extend(ids)
            assert sum(wc) == n // world
            assert _batches_of(wc, bs) == -(-(n // world) // bs)
        assert len(seen) == len(set(seen)) == n - n % world


def test_defaults_one_rank_one_worker_seed_0_epoch_0():
    """The defaults (seed 0, epoch 0, rank 0 of 1, worker 0 of 1, shuffled, no pad, batch 1) read
    every sample once, shards in the order of the permutation keyed by seed 0, epoch 0."""
    counts = [3, 5, 2, 4]
    ids = _ids(counts, epoch_ranges(counts))
    assert ids == _epoch_sequence(counts, seed=0, epoch=0)
    assert samples_per_rank(7, 2) == 3 and samples_per_rank(7, 2, pad=True) == 4
    assert samples_per_rank(7, 1, batch_size=3) == 7  # drop_last off by default
    assert num_batches(7, 1, 3) == 3


def test_a_span_deep_in_an_epoch_of_many_shards_maps_to_the_shards_at_its_places():
    """Shards of 7 samples: position ``p`` lies at place ``p // 7`` of the shard order, which holds
    the shard of the reference permutation at that place."""
    from shardfeed.readers.order.epoch import iter_spans, shard_order

    from .epoch_order_reference import sample_at

    shards, seed, epoch = 20_000, 11, 2
    counts = [7] * shards
    order = shard_order(shards, seed=seed, epoch=epoch, shuffle=True)
    start = 7 * 12_345 + 3
    at = [sample_at(place, shards, seed, epoch) for place in range(12_345, 12_349)]
    assert list(iter_spans(counts, order, start, start + 20)) == [(at[0], 3, 7), (at[1], 0, 7), (at[2], 0, 7),
                                                                   (at[3], 0, 2)]
    # past the epoch's end (pad): the positions wrap to the start of the same order
    end = 7 * shards
    assert list(iter_spans(counts, order, end - 2, end + 3)) == [
        (sample_at(shards - 1, shards, seed, epoch), 5, 7), (sample_at(0, shards, seed, epoch), 0, 3)]


def _pieces_by_position(counts, order, start, stop):
    """``(shard, start, end)`` pieces of positions ``[start, stop)`` built one position at a time:
    the shards laid end to end in ``order``, position ``p`` standing for ``p % N``; consecutive
    samples of one shard joined."""
    flat = [(s, i) for s in order for i in range(counts[s])]
    out = []
    for p in range(start, stop) if flat else ():
        s, i = flat[p % len(flat)]
        if out and out[-1][0] == s and out[-1][2] == i:
            out[-1] = (s, out[-1][1], i + 1)
        else:
            out.append((s, i, i + 1))
    return out


def test_spans_match_the_positions_one_by_one():
    """Empty shards anywhere (first, last, all), one shard, ranges that wrap several times (pad),
    empty ranges, counts and positions as lists or numpy: the pieces of the positions themselves,
    as Python ints."""
    import numpy as np

    from shardfeed.readers.order.epoch import iter_spans, shard_order

    rng = random.Random(7)
    cases = [([0, 3, 0], [0, 1, 2]), ([5], [0]), ([0, 0], [1, 0]), ([2, 0, 4, 1, 0], [4, 2, 0, 1, 3]), ([0], [0])]
    cases += [([rng.choice([0, 0, 1, 2, 3, 7]) for _ in range(n)], None) for n in range(1, 9) for _ in range(20)]
    for counts, order in cases:
        order = order if order is not None else shard_order(len(counts), seed=rng.randint(0, 9), epoch=1,
                                                            shuffle=True).tolist()
        n = sum(counts)
        for _ in range(12):
            start = rng.randint(0, 3 * n + 2)
            stop = start + rng.randint(-1, 3 * n + 3)
            want = _pieces_by_position(counts, order, start, stop)
            for c, o, a, b in ((counts, order, start, stop),
                               (np.asarray(counts), np.asarray(order), np.int64(start), np.int64(stop))):
                got = list(iter_spans(c, o, a, b))
                assert got == want, (counts, order, start, stop)
                assert all(type(x) is int for piece in got for x in piece), got
