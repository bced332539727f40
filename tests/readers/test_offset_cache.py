"""A process's cache of shard offsets stays within its byte bound, and reads stay right."""

from __future__ import annotations

from array import array

import pytest

from shardfeed.readers import open_dataset
from shardfeed.readers.sources.offset_cache import ENTRY_OVERHEAD_BYTES, OffsetCache
from shardfeed.readers.sources.webdataset_source import WebDatasetSource


def _loader(calls):
    def load(shard):
        calls.append(shard)
        return None if shard < 0 else [512 * (shard * 100 + i) for i in range(10)]
    return load


def test_the_cache_keeps_the_shards_used_last_within_its_bound():
    per_shard = ENTRY_OVERHEAD_BYTES + 8 * 10
    cache, calls = OffsetCache(2 * per_shard), []
    load = _loader(calls)
    for shard in (0, 1, 0, 2, 3):  # 0 used again before 2 arrives, so 1 leaves first
        got = cache.get(shard, load)
        assert list(got) == [512 * (shard * 100 + i) for i in range(10)] and isinstance(got, array)
        assert cache.num_bytes <= 2 * per_shard and len(cache) <= 2
    assert calls == [0, 1, 2, 3] and 3 in cache and 2 in cache and 0 not in cache
    cache.get(1, load)
    assert calls[-1] == 1 and cache.num_bytes == 2 * per_shard
    assert cache.get(-1, load) is None and cache.num_bytes <= 2 * per_shard


def test_offsets_larger_than_the_bound_are_returned_but_not_kept():
    cache, calls = OffsetCache(ENTRY_OVERHEAD_BYTES + 8 * 9), []
    assert len(cache.get(4, _loader(calls))) == 10
    assert len(cache) == 0 and cache.num_bytes == 0
    with pytest.raises(ValueError, match="max_bytes"):
        OffsetCache(-1)


def test_a_failed_load_keeps_nothing():
    cache = OffsetCache(1 << 20)

    def load(shard):
        raise OSError("gone")
    with pytest.raises(OSError):
        cache.get(0, load)
    assert len(cache) == 0


def _index_lengths(root):
    return [len((root / name).read_bytes()) // 8 for name in sorted(p.name for p in root.glob("*.sfidx"))]


@pytest.mark.parametrize("shards_kept", [0, 1, 2])
def test_a_source_reading_more_shards_than_fit_reads_every_sample(packed_wds, tiny_folder_expected, shards_kept,
                                                                   monkeypatch):
    counts = _index_lengths(packed_wds)
    assert len(counts) == 4 and sum(counts) == 60  # shards of 16, 16, 16, 12
    bound = shards_kept * (ENTRY_OVERHEAD_BYTES + 8 * 16)
    monkeypatch.setattr(WebDatasetSource, "offset_cache_bytes", bound)
    ds = open_dataset(packed_wds, decode=False, shuffle=True, seed=3, shuffle_buffer=0)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = {s.meta["path"]: s.data for s in ds}
        assert got == {p: b for p, (b, _) in tiny_folder_expected.items()}
        assert ds._offsets.num_bytes <= bound and len(ds._offsets) <= shards_kept


def test_the_bound_travels_to_worker_copies(packed_wds, monkeypatch):
    import pickle

    monkeypatch.setattr(WebDatasetSource, "offset_cache_bytes", 12345)
    ds = open_dataset(packed_wds, decode=False)
    list(ds)
    assert len(ds._offsets) == 4
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._offsets.max_bytes == 12345 and len(copy._offsets) == 0
