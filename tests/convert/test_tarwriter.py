"""The tar writer's write paths, read back with Python's ``tarfile`` (not our reader).

Samples with members of 64 KB and more go through the background writer's chunking (small
parts joined, big ones passed as they are, one ``writev``), and a flush of more than 1,024 chunks
takes the one-chunk-at-a-time path; the tiny images of the other tests reach neither.
"""

from __future__ import annotations

import hashlib
import random
import tarfile

import pytest

from shardfeed.convert.write.tarwriter import TarShardFile
from shardfeed.readers.format.offset_index import read_index


def _samples(n: int, seed: int, sizes) -> list[tuple[str, bytes, int]]:
    rng = random.Random(seed)
    return [(f"{i:09d}", rng.randbytes(rng.choice(sizes)), i % 7) for i in range(n)]


def _check_against_tarfile(path, idx, samples, entry):
    raw = path.read_bytes()
    assert entry.num_bytes == len(raw) and entry.sha256 == hashlib.sha256(raw).hexdigest()
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        got = {m.name: tf.extractfile(m).read() for m in members}
        firsts = [m.offset for m in members if m.name.endswith(".jpg")]
    expected = {}
    for key, data, label in samples:
        expected[f"{key}.jpg"] = data
        expected[f"{key}.cls"] = str(label).encode()
        expected[f"{key}.json"] = b'{"k": "%s"}' % key.encode()
    assert [m.name for m in members] == [f"{k}.{e}" for k, _, _ in samples for e in ("jpg", "cls", "json")]
    assert got == expected
    assert read_index(idx) == firsts


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("wds_path", [True, False], ids=["add_wds_sample", "add_sample"])
def test_big_and_small_members_across_flushes(background, wds_path, tmp_path):
    # 64 KB exactly (the chunking threshold), just under and over it, and small ones
    samples = _samples(60, 1, [1, 511, 512, 4000, (64 << 10) - 1, 64 << 10, 200_000])
    w = TarShardFile(tmp_path, "s.tar", "s.idx", buffer_bytes=300_000, background=background)
    for key, data, label in samples:
        meta = b'{"k": "%s"}' % key.encode()
        if wds_path:
            w.add_wds_sample(key, "jpg", data, str(label).encode(), meta)
        else:
            w.add_sample(key, [("jpg", data), ("cls", str(label).encode()), ("json", meta)])
    entry = w.close()
    _check_against_tarfile(tmp_path / "s.tar", tmp_path / "s.idx", samples, entry)


@pytest.mark.parametrize("first_size", [64 << 10, 100])
def test_a_flush_that_starts_with_a_big_member(first_size, tmp_path):
    """One header then a big member: the run of small parts before it holds one part."""
    samples = [("000000000", bytes(range(256)) * (first_size // 256 or 1), 1)] + _samples(5, 2, [70_000])[1:]
    w = TarShardFile(tmp_path, "s.tar", "s.idx", buffer_bytes=1, background=True)  # a flush per sample
    for key, data, label in samples:
        w.add_wds_sample(key, "jpg", data, str(label).encode(), b'{"k": "%s"}' % key.encode())
    _check_against_tarfile(tmp_path / "s.tar", tmp_path / "s.idx", samples, w.close())


def test_one_flush_of_more_than_1024_chunks(tmp_path):
    """600 samples of 64 KB images in one flush: about 1,200 chunks, more than one writev takes."""
    samples = _samples(600, 3, [64 << 10])
    w = TarShardFile(tmp_path, "s.tar", "s.idx", buffer_bytes=1 << 40, background=True)
    for key, data, label in samples:
        w.add_wds_sample(key, "jpg", data, str(label).encode(), b'{"k": "%s"}' % key.encode())
    _check_against_tarfile(tmp_path / "s.tar", tmp_path / "s.idx", samples, w.close())


@pytest.mark.parametrize("too_long", ["json", "cls"])
def test_a_sample_refused_for_a_long_member_name_leaves_nothing_in_the_shard(too_long, tmp_path):
    """The member that passes 100 bytes comes after others: none of the sample is added."""
    samples = _samples(2, 4, [300])
    w = TarShardFile(tmp_path, "s.tar", "s.idx")
    key, data, label = samples[0]
    w.add_sample(key, [("jpg", data), ("cls", str(label).encode()), ("json", b'{"k": "%s"}' % key.encode())])
    long_key = "k" * (100 - 1 - len(too_long) + 1)  # "{key}.x" fits, "{key}.{too_long}" is 101 bytes
    with pytest.raises(ValueError, match="longer than 100 bytes"):
        w.add_sample(long_key, [("x", b"x" * 10), (too_long, b"1")])
    key, data, label = samples[1]
    w.add_sample(key, [("jpg", data), ("cls", str(label).encode()), ("json", b'{"k": "%s"}' % key.encode())])
    _check_against_tarfile(tmp_path / "s.tar", tmp_path / "s.idx", samples, w.close())
