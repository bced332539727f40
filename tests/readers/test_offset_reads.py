"""Reading a local WebDataset by sample position (a mix's reads): shard descriptors reused,
nearby samples read at once, and the general reader's checks and errors kept.

The dataset is planted: sample ``i`` holds the bytes ``b"\\xff\\xd8b-<i>"``, so what each index
must read back is known without the reader.
"""

from __future__ import annotations

import os
import pickle

import pytest

from shardfeed.convert import write_dataset
from shardfeed.readers import open_dataset
from shardfeed.readers.errors import CorruptDataError, DatasetChangedError
from shardfeed.readers.sources.mixing_access import by_index
from shardfeed.readers.storage.offset_reads import ShardFiles


def _data(i: int) -> bytes:
    return b"\xff\xd8" + f"b-{i}".encode()


@pytest.fixture()
def planted(tmp_path):
    out = tmp_path / "b"
    write_dataset(({"image": _data(i), "ext": "jpg", "label": i % 3, "path": f"b/{i}.jpg"} for i in range(37)),
                  out, format="webdataset", classes=["x", "y", "z"], max_count=4)
    return out


def _indexed(path, **kw):
    return by_index(open_dataset(str(path), decode=False, shuffle=False, **kw))


def test_samples_by_position_are_the_planted_ones_and_shards_stay_open(planted, monkeypatch):
    ds = _indexed(planted)
    opened = []
    real = ds.location._open_fd
    monkeypatch.setattr(ds.location, "_open_fd", lambda name: opened.append(name) or real(name))
    want = [5, 4, 36, 0, 17, 18, 19, 6, 5, 33]  # out of order, adjacent, repeated, first and last
    got = ds.__getitems__(want)
    assert [s.data for s in got] == [_data(i) for i in want]
    assert [s.meta["path"] for s in got] == [f"b/{i}.jpg" for i in want]
    assert sorted(opened) == sorted({f"shard-{i // 4:06d}.tar" for i in want})
    opened.clear()
    assert [s.data for s in ds.__getitems__([7, 16, 35])] == [_data(7), _data(16), _data(35)]
    assert opened == []  # shards 1, 4 and 8 were open already


def test_nearby_samples_of_a_shard_are_read_with_one_pread(planted, monkeypatch):
    ds = _indexed(planted)
    ds.__getitems__([0])  # the shard opens and its offset index is read
    calls = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: calls.append((n, off)) or real(fd, n, off))
    assert [s.data for s in ds.__getitems__([0, 2, 3])] == [_data(0), _data(2), _data(3)]
    assert len(calls) == 1  # samples 0 and 2..3 of shard 0: one span


def test_open_descriptors_are_bounded_and_not_pickled(planted):
    ds = _indexed(planted)
    files = ds._files
    files.max_open = 3
    ds.__getitems__(list(range(37)))
    assert len(files) == 3
    copy = pickle.loads(pickle.dumps(files))
    assert len(copy) == 0 and copy.max_open == 3
    files.close()
    assert len(files) == 0


def test_a_damaged_sample_raises_as_the_general_reader_does(planted):
    shard = planted / "shard-000001.tar"  # samples 4..7
    raw = bytearray(shard.read_bytes())
    hdr = raw.index(b"000000005.jpg")  # the header of sample 5's image member
    raw[hdr + 148:hdr + 156] = b"0000000\0"  # a bad header checksum
    shard.write_bytes(bytes(raw))
    ds = _indexed(planted, check_files=False)
    with pytest.raises(CorruptDataError, match="shard-000001.tar"):
        ds.__getitems__([4, 5])
    skipping = _indexed(planted, check_files=False, on_error="skip")
    got = skipping.__getitems__([4, 5, 9])
    assert got[0].data == _data(4) and got[1] is None and got[2].data == _data(9)


def test_a_dataset_replaced_while_its_shards_are_open_is_refused(planted):
    ds = _indexed(planted)
    ds.__getitems__([1, 9])
    manifest = planted / "manifest.json"
    manifest.write_bytes(manifest.read_bytes() + b"\n")  # a rebuild replaces the manifest
    with pytest.raises(DatasetChangedError, match="changed since the dataset was opened"):
        ds.__getitems__([1, 9])


def test_shard_files_of_another_process_are_not_used(planted):
    ds = _indexed(planted)
    ds.__getitems__([1])
    files = ds._files
    assert isinstance(files, ShardFiles) and len(files) == 1
    files._pid = -1  # as after fork: the inherited descriptors are closed, new ones opened
    assert ds.__getitems__([2])[0].data == _data(2)
    assert len(files) == 1
