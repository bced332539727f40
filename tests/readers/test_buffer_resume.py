"""A WebDataset worker's shuffle buffer (windows of ``shuffle_buffer`` samples, each emitted in a
seeded permuted order): the samples a loader yields, fresh and resumed at every batch, against the
order built here from the specification (shard order by the seeded permutation of the shard indices, the keys
read from the tar files themselves, the windows' order from :mod:`epoch_order_reference`)."""

from __future__ import annotations

import json
import tarfile

import pytest

from .epoch_order_reference import buffer_order, permutation

BATCH = 4


def _global_keys(wds, seed: int, epoch: int) -> list[str]:
    """The epoch's sequence of sample keys: the shards in their seeded order, each shard's keys in file order."""
    from shardfeed.readers.storage.local_manifest import load_manifest

    shards = load_manifest(wds).shards
    order = permutation(len(shards), seed, epoch)
    out = []
    for i in order:
        with tarfile.open(wds / shards[i].name) as tar:
            stems = [m.name.split(".", 1)[0] for m in tar.getmembers()]
        out += list(dict.fromkeys(stems))
    return out


def _expected(wds, *, seed: int, epoch: int, rank: int, world_size: int, workers: int, buffer: int) -> list[str]:
    keys = _global_keys(wds, seed, epoch)
    per_rank = len(keys) // world_size
    start = rank * per_rank
    nb = -(-per_rank // BATCH)
    q, r = divmod(nb, workers)
    batches_of = []
    for w in range(workers):
        b0 = w * q + min(w, r)
        b1 = b0 + q + (w < r)
        a, b = start + min(per_rank, b0 * BATCH), start + min(per_rank, b1 * BATCH)
        emitted = [keys[a + p] for p in buffer_order(b - a, buffer, seed, epoch, rank, w)]
        batches_of.append([emitted[i:i + BATCH] for i in range(0, len(emitted), BATCH)])
    out = []
    for j in range(nb):  # the DataLoader's round robin: batch j from worker j % W
        out += batches_of[j % workers][j // workers]
    return out


def _loader(wds, *, rank=0, world_size=1, workers=0, buffer=8, seed=5):
    from shardfeed.readers import make_loader

    return make_loader(wds, BATCH, num_workers=workers, decode=False, seed=seed, shuffle_buffer=buffer, rank=rank,
                       world_size=world_size)


def _keys(batches) -> list[str]:
    return [s.key for batch in batches for s in batch]


@pytest.mark.parametrize("world_size", [1, 2])
def test_every_resume_point_gives_the_rest_of_the_uninterrupted_order(packed_wds, world_size):
    everything = []
    for rank in range(world_size):
        expected = _expected(packed_wds, seed=5, epoch=0, rank=rank, world_size=world_size, workers=1, buffer=8)
        loader = _loader(packed_wds, rank=rank, world_size=world_size)
        assert _keys(loader) == expected
        everything += expected
        for k in range(len(loader)):
            first = _loader(packed_wds, rank=rank, world_size=world_size)
            it = iter(first)
            for _ in range(k):
                next(it)
            state = json.loads(json.dumps(first.state_dict()))
            resumed = _loader(packed_wds, rank=rank, world_size=world_size)
            resumed.load_state_dict(state)
            assert _keys(resumed) == expected[k * BATCH:], k
    assert sorted(everything) == sorted(_global_keys(packed_wds, 5, 0))  # each sample once across ranks


def test_workers_and_ranks_read_each_sample_once_and_resume_exactly(packed_wds):
    everything = []
    for rank in range(2):
        expected = _expected(packed_wds, seed=5, epoch=0, rank=rank, world_size=2, workers=2, buffer=8)
        assert _keys(_loader(packed_wds, rank=rank, world_size=2, workers=2)) == expected
        everything += expected
        for k in (1, 4):
            first = _loader(packed_wds, rank=rank, world_size=2, workers=2)
            it = iter(first)
            for _ in range(k):
                next(it)
            state = json.loads(json.dumps(first.state_dict()))
            del it
            resumed = _loader(packed_wds, rank=rank, world_size=2, workers=2)
            resumed.load_state_dict(state)
            assert _keys(resumed) == expected[k * BATCH:], k
    assert sorted(everything) == sorted(_global_keys(packed_wds, 5, 0))


def test_the_order_differs_across_epochs(packed_wds):
    loader = _loader(packed_wds, buffer=16)
    epochs = [_keys(loader) for _ in range(3)]
    for epoch, got in enumerate(epochs):
        assert got == _expected(packed_wds, seed=5, epoch=epoch, rank=0, world_size=1, workers=1, buffer=16)
        assert sorted(got) == sorted(_global_keys(packed_wds, 5, 0))
    assert len({tuple(e) for e in epochs}) == 3


def test_a_resumed_worker_reads_at_most_one_window_again(packed_wds, monkeypatch):
    from shardfeed.readers.sources.webdataset_source import WebDatasetSource

    read = []
    original = WebDatasetSource._iter_ranges

    def counting(self, ranges, *args, **kwargs):
        for item in original(self, ranges, *args, **kwargs):
            read.append(item[0])
            yield item

    monkeypatch.setattr(WebDatasetSource, "_iter_ranges", counting)
    expected = _expected(packed_wds, seed=5, epoch=0, rank=0, world_size=1, workers=1, buffer=16)
    for k in (3, 4, 9):  # 12, 16 and 36 samples consumed: inside a window, at a window's start, inside one
        first = _loader(packed_wds, buffer=16)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        resumed = _loader(packed_wds, buffer=16)
        resumed.load_state_dict(state)
        read.clear()
        assert _keys(resumed) == expected[k * BATCH:]
        window_start = (k * BATCH) // 16 * 16
        assert len(read) == 60 - window_start  # from the window's first sample on, each once
