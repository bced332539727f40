"""The random-access epoch order: a seeded permutation computed per position (docs/format.md,
"Splitting an epoch"). Expectations come from the plain-Python reference written from the
specification (:mod:`epoch_order_reference`) or from sorting against ``range(N)``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardfeed.readers.order.epoch import RankOrder, epoch_positions, positions_to_indices, resumed_rank_sequence
from shardfeed.readers.loader import EpochSampler
from shardfeed.readers.order.permutation import CHUNK, permute, unpermute

from .epoch_order_reference import permutation, sample_at


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 2 ** 20 + 3])
def test_every_sample_once(n):
    got = permute(np.arange(n), n, seed=4, epoch=1)
    assert got.dtype == np.int64
    assert np.array_equal(np.sort(got), np.arange(n))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 16, 17, 63, 1000])
def test_the_order_is_the_specifications(n):
    for seed, epoch in ((0, 0), (7, 3), (-2, 11)):
        assert permute(np.arange(n), n, seed=seed, epoch=epoch).tolist() == permutation(n, seed, epoch)


def test_positions_far_apart_in_a_large_epoch_match_the_specification():
    n = 2 ** 20 + 3
    positions = np.array([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, n // 2, n - 2, n - 1])
    got = permute(positions, n, seed=9, epoch=2)
    assert got.tolist() == [sample_at(int(p), n, 9, 2) for p in positions]


def test_epochs_and_seeds_give_other_orders():
    n = 1000
    base = permute(np.arange(n), n, seed=1, epoch=0)
    assert not np.array_equal(base, np.arange(n))
    assert not np.array_equal(base, permute(np.arange(n), n, seed=1, epoch=1))
    assert not np.array_equal(base, permute(np.arange(n), n, seed=2, epoch=0))
    assert not np.array_equal(permute(np.arange(n), n, seed=0, epoch=1), base)  # (seed, epoch), not seed + epoch


@pytest.mark.parametrize("start,stop", [(0, 1), (5, 17), (CHUNK - 3, 2 * CHUNK + 5), (200_000, 200_003)])
def test_a_span_equals_the_slice_of_the_whole_order(start, stop):
    n = 200_003
    whole = permute(np.arange(n), n, seed=3, epoch=5)
    span = positions_to_indices(n, np.arange(start, stop), seed=3, epoch=5, shuffle=True)
    assert np.array_equal(span, whole[start:stop])


def test_padded_positions_wrap_and_no_shuffle_is_the_identity():
    n = 10
    perm = permutation(n, 1, 0)
    assert positions_to_indices(n, np.arange(8, 13), seed=1, epoch=0, shuffle=True).tolist() == perm[8:] + perm[:3]
    assert positions_to_indices(n, np.arange(3, 12), seed=1, epoch=0, shuffle=False).tolist() == [
        3, 4, 5, 6, 7, 8, 9, 0, 1]


def test_positions_outside_the_range_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        permute(np.array([3, 10]), 10, seed=0, epoch=0)


@pytest.mark.parametrize("world_size,pad", [(1, False), (3, False), (3, True)])
def test_the_samplers_of_all_ranks_deal_the_permutation(world_size, pad):
    n = 1000
    perm = permutation(n, 6, 2)
    per_rank = -(-n // world_size) if pad else n // world_size
    got = []
    for rank in range(world_size):
        sampler = EpochSampler(n, seed=6, rank=rank, world_size=world_size, pad=pad, batch_size=4)
        sampler.set_epoch(2)
        mine = list(sampler)
        assert mine == [perm[p % n] for p in range(rank * per_rank, (rank + 1) * per_rank)]
        assert mine == epoch_positions(n, seed=6, epoch=2, shuffle=True, rank=rank, world_size=world_size, pad=pad)
        got += mine
    assert sorted(got[:n]) == list(range(n)) if pad else len(set(got)) == len(got) == world_size * per_rank


def test_a_sampler_over_a_huge_epoch_computes_only_what_it_hands_out():
    n = 10 ** 12  # a whole order would not fit in memory
    sampler = EpochSampler(n, seed=2, rank=1, world_size=4)
    it = iter(sampler)
    first = [next(it) for _ in range(3)]
    assert first == [sample_at(n // 4 + i, n, 2, 0) for i in range(3)]


def test_a_resumed_epoch_gives_exactly_the_samples_left():
    n, batch = 100, 8
    perm = permutation(n, 5, 1)
    seg = {"world_size": 1, "num_workers": 2, "batch_size": batch, "shuffle_buffer": 0, "samples_consumed": 40}
    parts = []
    for rank in range(2):  # resumed on two ranks: 60 left, 30 each
        sampler = EpochSampler(n, seed=5, rank=rank, world_size=2, batch_size=batch)
        sampler.set_epoch(1)
        sampler.set_resume({"epoch": 1, "segments": [seg]})
        parts.append(list(sampler))
        seq = resumed_rank_sequence(n, [seg], rank=rank, world_size=2, batch_size=batch, num_workers=1, buffer=0,
                                    seed=5, epoch=1, shuffle=True)
        assert positions_to_indices(n, seq, seed=5, epoch=1, shuffle=True).tolist() == parts[-1]
    assert parts[0] + parts[1] == perm[40:]


def _saved_state(loader):
    it = iter(loader)
    next(it)
    next(it)
    return json.loads(json.dumps(loader.state_dict()))


def test_a_state_saved_mid_epoch_under_the_list_order_is_refused_for_a_shuffled_random_access_source(packed_lmdb):
    from shardfeed.readers import make_loader
    from shardfeed.readers.errors import ResumeStateError

    state = _saved_state(make_loader(packed_lmdb, 4, num_workers=0, decode=False, seed=3))
    old = {k: v for k, v in state.items() if k != "epoch_order"} | {"version": 1}
    fresh = make_loader(packed_lmdb, 4, num_workers=0, decode=False, seed=3)
    with pytest.raises(ResumeStateError, match=r"epoch order 1.*set_epoch\(0\)"):
        fresh.load_state_dict(old)
    with pytest.raises(ResumeStateError, match="epoch_order"):
        fresh.load_state_dict(dict(state, epoch_order="2"))
    fresh.load_state_dict(state)  # this shardfeed's own state resumes
    assert len(list(fresh)) * 4 == 60 - 8


def test_a_state_of_the_list_order_is_kept_where_its_positions_still_hold(packed_lmdb, packed_wds):
    from shardfeed.readers import make_loader

    for path, kw in ((packed_wds, {"shuffle": False}), (packed_lmdb, {"shuffle": False})):
        state = _saved_state(make_loader(path, 4, num_workers=0, decode=False, seed=3, **kw))
        old = {k: v for k, v in state.items() if k != "epoch_order"} | {"version": 1}
        loader = make_loader(path, 4, num_workers=0, decode=False, seed=3, **kw)
        loader.load_state_dict(old)
        assert loader.state_dict()["segments"][0]["samples_consumed"] == 8
        assert len(list(loader)) == (60 - 8) // 4
    at_start = dict(_saved_state(make_loader(packed_lmdb, 4, num_workers=0, decode=False, seed=3)),
                    version=1, samples_consumed=0, batches_consumed=0)
    del at_start["epoch_order"]
    make_loader(packed_lmdb, 4, num_workers=0, decode=False, seed=3).load_state_dict(at_start)


def test_a_webdataset_state_saved_mid_epoch_under_an_older_shard_order_is_refused(packed_wds):
    from shardfeed.readers import make_loader
    from shardfeed.readers.errors import ResumeStateError

    state = _saved_state(make_loader(packed_wds, 4, num_workers=0, decode=False, seed=3, shuffle_buffer=16))
    assert state["epoch_order"] == 4
    unbuffered = _saved_state(make_loader(packed_wds, 4, num_workers=0, decode=False, seed=3, shuffle_buffer=0))
    for old in ({k: v for k, v in state.items() if k != "epoch_order"} | {"version": 1}, dict(state, epoch_order=2),
                dict(state, epoch_order=3), dict(unbuffered, epoch_order=3),
                dict(state, samples_consumed=0, batches_consumed=0, epoch_order=2,
                     segments=[{"world_size": 1, "num_workers": 0, "batch_size": 4, "shuffle_buffer": 16,
                                "samples_consumed": 8}])):
        fresh = make_loader(packed_wds, 4, num_workers=0, decode=False, seed=3,
                            shuffle_buffer=old["shuffle_buffer"])
        with pytest.raises(ResumeStateError, match=r"epoch order [123].*WebDataset shards.*set_epoch\(0\)"):
            fresh.load_state_dict(old)
    newer = make_loader(packed_wds, 4, num_workers=0, decode=False, seed=3, shuffle_buffer=16)
    with pytest.raises(ResumeStateError, match="newer"):
        newer.load_state_dict(dict(state, epoch_order=5))
    at_start = make_loader(packed_wds, 4, num_workers=0, decode=False, seed=3, shuffle_buffer=16)
    at_start.load_state_dict(dict(state, epoch_order=3, samples_consumed=0, batches_consumed=0))
    assert len(list(at_start)) == 60 // 4


def test_unpermute_gives_back_the_positions():
    n = 2 ** 20 + 3
    positions = np.arange(0, n, 997)
    indices = np.array([sample_at(int(p), n, 8, 4) for p in positions])
    assert np.array_equal(unpermute(indices, n, seed=8, epoch=4), positions)


@pytest.mark.parametrize("segments", [[], [{"world_size": 2, "num_workers": 1, "batch_size": 4, "shuffle_buffer": 0,
                                            "samples_consumed": 8}]])
def test_a_rank_order_finds_every_sample_where_the_sampler_puts_it(segments):
    n, world_size = 23, 3  # padded: 8 per rank, position 23 is sample perm[0]
    for rank in range(world_size):
        sampler = EpochSampler(n, seed=1, rank=rank, world_size=world_size, pad=True, batch_size=4)
        sampler.set_resume({"epoch": 0, "segments": segments} if segments else None)
        listed = list(sampler)
        order = RankOrder(n, segments, rank=rank, world_size=world_size, batch_size=4, seed=1, epoch=0,
                          shuffle=True, pad=True)
        assert len(order) == len(listed) and order.slice(-3, 100).tolist() == listed
        assert [c.tolist() for c in order.chunks(3)] == [listed[a:a + 3] for a in range(0, len(listed), 3)]
        for index in range(-1, n + 1):
            assert order.places_of(index).tolist() == [p for p, i in enumerate(listed) if i == index]


def test_a_rank_order_of_a_huge_epoch_finds_a_sample_without_building_the_order():
    n = 10 ** 12
    order = RankOrder(n, rank=3, world_size=4, batch_size=8, seed=2, epoch=1, shuffle=True)
    place = 123_456_789
    index = sample_at(3 * (n // 4) + place, n, 2, 1)
    assert order.places_of(index).tolist() == [place]
    assert order.slice(place, place + 1).tolist() == [index]


def _random_segments(rng, n):
    """A few earlier runs of an epoch of ``n`` samples, each consuming part of what its ranks had."""
    from shardfeed.readers.order.epoch import resumed_samples_per_rank

    segments, pad, drop_last = [], rng.random() < 0.5, rng.random() < 0.3
    for _ in range(rng.randrange(1, 4)):
        ws, bs = rng.randrange(1, 6), rng.randrange(1, 9)
        have = resumed_samples_per_rank(n, segments, world_size=ws, batch_size=bs, pad=pad, drop_last=drop_last)
        segments.append({"world_size": ws, "num_workers": rng.randrange(0, 3), "batch_size": bs,
                         "shuffle_buffer": 0, "samples_consumed": rng.randrange(0, have + 1)})
    return segments, pad, drop_last


def test_a_resumed_rank_order_is_the_resumed_sequence_without_building_it():
    import random

    rng = random.Random(12)
    for _ in range(60):
        n = rng.randrange(1, 300)
        segments, pad, drop_last = _random_segments(rng, n)
        ws, bs = rng.randrange(1, 6), rng.randrange(1, 9)
        for rank in range(ws):
            seq = resumed_rank_sequence(n, segments, rank=rank, world_size=ws, batch_size=bs, num_workers=1, buffer=0,
                                        seed=3, epoch=2, shuffle=True, pad=pad, drop_last=drop_last)
            want = [sample_at(int(p) % n, n, 3, 2) for p in seq]
            order = RankOrder(n, segments, rank=rank, world_size=ws, batch_size=bs, seed=3, epoch=2, shuffle=True,
                              pad=pad, drop_last=drop_last)
            assert order._held is None and len(order) == len(want)
            assert [i for c in order.chunks(7) for i in c.tolist()] == want
            for index in {*want[:3], *want[-2:]}:
                assert order.places_of(index).tolist() == [p for p, i in enumerate(want) if i == index]


def test_a_resumed_order_of_a_huge_epoch_is_computed_a_slice_at_a_time():
    n = 10 ** 12
    seg = {"world_size": 4, "num_workers": 2, "batch_size": 8, "shuffle_buffer": 0, "samples_consumed": 16}
    order = RankOrder(n, [seg], rank=0, world_size=2, batch_size=8, seed=1, epoch=0, shuffle=True)
    assert len(order) == (n - 4 * 16) // 2
    # the rest of the epoch is rank 0's share after its first 16 positions, then rank 1's, ...
    assert order.slice(0, 2).tolist() == [sample_at(16, n, 1, 0), sample_at(17, n, 1, 0)]
    second_rank_first = n // 4 - 16
    assert order.slice(second_rank_first, second_rank_first + 1).tolist() == [sample_at(n // 4 + 16, n, 1, 0)]


def test_segments_with_a_shuffle_buffer_are_followed_as_one_array():
    n = 50
    seg = {"world_size": 1, "num_workers": 2, "batch_size": 4, "shuffle_buffer": 6, "samples_consumed": 8}
    order = RankOrder(n, [seg], rank=0, world_size=1, batch_size=4, seed=1, epoch=0, shuffle=True)
    seq = resumed_rank_sequence(n, [seg], rank=0, world_size=1, batch_size=4, num_workers=1, buffer=0, seed=1,
                                epoch=0, shuffle=True)
    assert order._held is not None
    assert order.slice(0, len(order)).tolist() == [sample_at(int(p) % n, n, 1, 0) for p in seq]


@pytest.mark.parametrize("num_workers", [1, 3])
def test_iterating_a_source_directly_each_worker_reads_its_own_batches(packed_lmdb, tiny_folder_expected,
                                                                        num_workers, monkeypatch):
    import types

    import torch.utils.data

    from shardfeed.readers import open_dataset

    n, batch = 60, 4
    perm = permutation(n, 4, 2)
    got = []
    for worker in range(num_workers):
        info = None if num_workers == 1 else types.SimpleNamespace(num_workers=num_workers, id=worker)
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda info=info: info)
        ds = open_dataset(packed_lmdb, decode=False, seed=4)
        ds.configure_batching(batch)
        ds.set_epoch(2)
        samples = list(ds)
        mine = [perm[p] for p in range(n) if (p // batch) % num_workers == worker]
        assert [s.data for s in samples] == [tiny_folder_expected[ds[i].meta["path"]][0] for i in mine]
        got += mine
    assert sorted(got) == list(range(n))


def test_a_state_of_an_older_order_saved_after_the_epochs_last_batch_resumes_at_the_next_epoch(packed_wds, packed_lmdb):
    """A state saved once the loop received the epoch's last batch (before the loop saw its end)
    names no position: it resumes at the start of the next epoch, whatever order it was saved under."""
    from shardfeed.readers import make_loader

    for path, kw, order in ((packed_wds, {"shuffle_buffer": 16}, 3), (packed_wds, {"shuffle_buffer": 0}, 1),
                            (packed_lmdb, {}, 1), (packed_wds, {"shuffle_buffer": 16}, 5)):
        loader = make_loader(path, 4, num_workers=0, decode=False, seed=3, **kw)
        it = iter(loader)
        for _ in range(60 // 4):  # the epoch's 15 batches, and not the StopIteration after them
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        assert (state["epoch"], state["samples_consumed"]) == (0, 60)
        old = dict(state, epoch_order=order) if order > 1 else {
            k: v for k, v in state.items() if k != "epoch_order"} | {"version": 1}
        fresh = make_loader(path, 4, num_workers=0, decode=False, seed=3, **kw)
        fresh.load_state_dict(old)
        assert (fresh.state_dict()["epoch"], fresh.state_dict()["samples_consumed"]) == (1, 0)
        keys = [s.key for batch in fresh for s in batch]
        assert len(keys) == 60 and len(set(keys)) == 60  # all of epoch 1, each sample once
