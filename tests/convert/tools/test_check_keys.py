"""`check` finds every repeated key across a dataset, holding one shard's keys while keys increase.

Shards are written here with ``tarfile``; the duplicates expected are the keys planted twice."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from shardfeed.convert.tools.check import check_dataset
from shardfeed.convert.tools.check_keys import KeyLedger
from shardfeed.convert.tools.index import index_shards


def _ledger(shards):
    calls = []

    def reread(i):
        calls.append(i)
        return iter(shards[i][1])
    return KeyLedger(reread), calls


def _feed(ledger, shards):
    found = []
    for name, keys in shards:
        ledger.start_shard(name)
        found += [(name, k, other) for k in keys if (other := ledger.add(k)) is not None]
    return found


def test_increasing_keys_keep_no_digests_and_read_nothing_again():
    shards = [(f"s{i}", [f"{i * 100 + j:09d}" for j in range(50)]) for i in range(20)]
    ledger, calls = _ledger(shards)
    assert _feed(ledger, shards) == []
    assert ledger.num_digests == 0 and calls == []


def test_repeats_are_named_with_the_shard_that_held_the_key_first():
    shards = [("s0", ["m", "n"]), ("s1", ["a", "b"]), ("s2", ["z", "n", "a"]), ("s3", ["q", "q"])]
    ledger, calls = _ledger(shards)
    assert _feed(ledger, shards) == [("s2", "n", "s0"), ("s2", "a", "s1"), ("s3", "q", "s3")]
    assert calls == [0]  # the order broke in s1: s0 read again, once
    assert ledger.num_digests == 8  # m n, a b, z n a, q: one per key read


def test_random_shards_agree_with_a_dictionary():
    rng = random.Random(4)
    shards = [(f"s{i}", [f"k{rng.randrange(3000)}" for _ in range(rng.randrange(0, 60))]) for i in range(80)]
    first: dict[str, str] = {}
    want = []
    for name, keys in shards:
        for k in keys:
            if k in first:
                want.append((name, k, first[k]))
            first.setdefault(k, name)
    ledger, calls = _ledger(shards)
    assert _feed(ledger, shards) == want and want
    assert len(set(calls)) == len(calls)


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 90, 200)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture
def foreign(tmp_path) -> Path:
    """Three shards whose keys do not increase from shard to shard, ``b`` planted twice."""
    jpg = _jpeg()
    root = tmp_path / "shards"
    root.mkdir()
    for name, keys in (("x-0.tar", ["c", "d"]), ("x-1.tar", ["a", "b"]), ("x-2.tar", ["e", "b"])):
        with tarfile.open(root / name, "w", format=tarfile.USTAR_FORMAT) as tf:
            for key in keys:
                for ext, data in (("jpg", jpg), ("cls", b"0")):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    index_shards(str(root))
    return root


def test_check_finds_a_key_repeated_in_another_shard(foreign):
    report = check_dataset(str(foreign))
    assert not report.ok
    dup = [p for p in report.problems if "keys must be unique" in p["problem"]]
    assert [(p["shard"], p["key"]) for p in dup] == [("x-2.tar", "b")]
    assert "also in x-1.tar" in dup[0]["problem"]


def test_check_of_a_packed_dataset_is_clean(packed_wds):
    report = check_dataset(str(packed_wds))
    assert report.ok and report.num_samples_found == 60
