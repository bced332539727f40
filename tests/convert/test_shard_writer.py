"""The one WebDataset shard writer and its one rollover rule (writers/shard.py), against sizes on disk."""

from __future__ import annotations

import random
import tarfile

import pytest

from shardfeed.convert.write.shard_cut import cut_shards, sample_bytes, wds_sample_bytes
from shardfeed.convert.writers.shard import PlanMismatchError, ShardLimits, ShardWriter

BLOCK = 512


def _on_disk(n: int) -> int:
    """Bytes a tar member of n data bytes takes: a header block plus the data padded to blocks."""
    return BLOCK + (n + BLOCK - 1) // BLOCK * BLOCK


def _samples(seed: int, num: int) -> list[tuple[str, bytes, bytes, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(num):
        data = rng.randbytes(rng.choice([1, 511, 512, 513, 3000, 9000, rng.randrange(1, 20000)]))
        out.append((f"{i:05d}", data, str(i % 7).encode(), b'{"i": %d}' % i))
    return out


@pytest.mark.parametrize("max_count,max_bytes", [(5, 10**9), (1000, 40_000), (3, 25_000), (1, 4096 * 8)])
def test_shards_are_cut_before_a_limit_would_pass(tmp_path, max_count, max_bytes):
    samples = _samples(max_count + max_bytes, 60)
    with ShardWriter(tmp_path, prefix="s", limits=ShardLimits(max_count, max_bytes)) as w:
        for key, data, cls, meta in samples:
            w.add(key, "bin", data, cls, meta)
    assert [e.name for e in w.shards] == [f"s-{i:06d}.tar" for i in range(len(w.shards))]
    got_keys, pos = [], 0
    for entry in w.shards:
        path = tmp_path / entry.name
        size = path.stat().st_size
        with tarfile.open(path) as tf:
            names = tf.getnames()
        keys = sorted({n.split(".")[0] for n in names})
        assert names == [f"{k}.{e}" for k in keys for e in ("bin", "cls", "json")]
        # the size on disk is what the members take plus the two end blocks, within the limits
        expected = sum(_on_disk(len(d)) + _on_disk(len(c)) + _on_disk(len(m))
                       for _, d, c, m in samples[pos:pos + len(keys)]) + 2 * BLOCK
        assert size == expected == entry.num_bytes
        assert size <= max_bytes and len(keys) <= max_count
        # the cut was forced: the next sample would have passed a limit
        if pos + len(keys) < len(samples):
            _, d, c, m = samples[pos + len(keys)]
            nxt = _on_disk(len(d)) + _on_disk(len(c)) + _on_disk(len(m))
            assert len(keys) == max_count or size + nxt > max_bytes
        got_keys += keys
        pos += len(keys)
    assert got_keys == [s[0] for s in samples]


def test_a_sample_too_large_for_any_shard_is_an_error_naming_it(tmp_path):
    w = ShardWriter(tmp_path, prefix="s", limits=ShardLimits(10, 4096))
    with pytest.raises(ValueError, match="big.jpg.*--max-bytes 4096"):
        w.add("00000", "jpg", bytes(4000), b"0", b"{}", describe="big.jpg")
    assert not list(tmp_path.iterdir())


def test_a_planned_shard_that_the_rule_would_cut_is_a_plan_mismatch(tmp_path):
    w = ShardWriter(tmp_path, prefix="s", limits=ShardLimits(2, 10**9), first_index=7, max_shards=1)
    w.add("00000", "jpg", b"a", b"0", b"{}")
    w.add("00001", "jpg", b"b", b"0", b"{}")
    with pytest.raises(PlanMismatchError):
        w.add("00002", "jpg", b"c", b"0", b"{}")


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_count"):
        ShardLimits(0, 10**6)
    with pytest.raises(ValueError, match="4096"):
        ShardLimits(1, 4095)


@pytest.mark.parametrize("max_count,max_bytes", [(5, 10**9), (1000, 40_000), (3, 25_000), (1, 4096 * 8)])
def test_the_planned_cut_is_the_cut_the_writer_makes(tmp_path, max_count, max_bytes):
    samples = _samples(7 * max_count + max_bytes, 80)
    with ShardWriter(tmp_path, prefix="s", limits=ShardLimits(max_count, max_bytes)) as w:
        for key, data, cls, meta in samples:
            w.add(key, "bin", data, cls, meta)
    written, pos = [], 0
    for entry in w.shards:
        written.append((pos, pos + entry.num_samples))
        pos += entry.num_samples
    sizes = [_on_disk(len(d)) + _on_disk(len(c)) + _on_disk(len(m)) for _, d, c, m in samples]
    assert cut_shards(sizes, ShardLimits(max_count, max_bytes)) == written
    assert [wds_sample_bytes(len(d), len(c), len(m)) for _, d, c, m in samples] == sizes
    assert [sample_bytes([len(d), len(c), len(m)]) for _, d, c, m in samples] == sizes


def test_cut_shards_by_hand():
    limits = ShardLimits(3, 4096)
    # an empty shard is its two end blocks (1024 bytes): 1024 + 1536 + 1536 = 4096 fits, one more does not
    assert cut_shards([1536, 1536, 1536, 512], limits) == [(0, 2), (2, 4)]
    assert cut_shards([512] * 7, limits) == [(0, 3), (3, 6), (6, 7)]
    assert cut_shards([], limits) == []
    assert cut_shards([3000, 2000, 1000], ShardLimits(10, 4096), empty_bytes=0) == [(0, 1), (1, 3)]
    with pytest.raises(ValueError, match="sample 1 needs 4608 bytes.*--max-bytes 4096"):
        cut_shards([512, 3584], limits, describe=lambda i: f"sample {i}")


def test_pack_options_reject_the_limits_the_shard_cut_rejects():
    from shardfeed.convert.write.pack import PackOptions

    with pytest.raises(ValueError, match=r"--max-bytes \(max_bytes\) must be at least 4096"):
        PackOptions(max_bytes=4095)
    with pytest.raises(ValueError, match=r"--max-count \(max_count\) must be at least 1"):
        PackOptions(max_count=0)
