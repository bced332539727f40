"""A reader reads one version of a dataset: a WebDataset folder rebuilt under a reader (``pack
--overwrite`` of another source into it, a shard rewritten in place at the same size) stops the
reader at the first shard it opens afterwards, with an error naming that shard and what changed,
also under ``on_error="skip"`` and in DataLoader workers; never an epoch of old and new samples.

Expectations: the keys and bytes of the two packs (the planted sources), read back unchanged."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.readers import open_dataset
from shardfeed.readers.errors import DatasetChangedError

OPTS = dict(format="wds", max_count=16, workers=1, seed=0)


@pytest.fixture
def ds(tiny_image_folder, tmp_path):
    out = tmp_path / "ds"
    pack(tiny_image_folder, out, PackOptions(**OPTS))
    return out


def _old_samples(ds) -> dict[str, bytes]:
    return {s.key: s.data for s in open_dataset(str(ds), decode=False, shuffle=False)}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_pack_overwrite_under_a_reader_stops_it_naming_the_shard(ds, mixed_case_folder, on_error):
    old = _old_samples(ds)
    it = iter(open_dataset(str(ds), decode=False, shuffle=False, on_error=on_error))
    first = next(it)
    assert old[first.key] == first.data
    pack(mixed_case_folder, ds, PackOptions(**OPTS, overwrite=True))  # 21 images: 2 new shards, 2 old ones gone
    got = [first]
    with pytest.raises(DatasetChangedError, match=r"shard-000001\.(tar|sfidx): changed since the dataset was opened"
                       ):
        for s in it:
            got.append(s)
    assert len(got) == 16  # shard 0, opened before the rebuild, read whole from its old file
    assert all(old[s.key] == s.data for s in got)


def test_a_shard_rewritten_at_the_same_size_is_refused(ds):
    it = iter(open_dataset(str(ds), decode=False, shuffle=False))
    next(it)
    shard = ds / "shard-000002.tar"
    data = bytearray(shard.read_bytes())
    data[-2000] ^= 0xFF  # other bytes, same size, written beside and renamed in place as a pack does
    (ds / ".new").write_bytes(bytes(data))
    st = shard.stat()
    # written 3 s after the open (past the clock slack of a file system whose clock runs ahead)
    os.utime(ds / ".new", ns=(st.st_atime_ns, time.time_ns() + 3_000_000_000))
    os.replace(ds / ".new", shard)
    with pytest.raises(DatasetChangedError, match=r"shard-000002\.tar: changed .*modified \d+\.\d+ s after the dataset "
                                                  r"was opened"):
        for _ in it:
            pass


def test_an_unchanged_dataset_reads_every_sample_in_every_epoch(ds, tiny_folder_expected):
    dataset = open_dataset(str(ds), decode=False, shuffle=False)
    for _ in range(2):
        got = {s.meta["path"]: s.data for s in dataset}
        assert got == {p: b for p, (b, _) in tiny_folder_expected.items()}


def test_workers_check_against_the_version_opened_in_the_main_process(ds, mixed_case_folder, tmp_path):
    import torch.utils.data

    dataset = open_dataset(str(ds), decode=False, shuffle=False)  # versions recorded here, before the workers
    copy = shutil.copytree(ds, tmp_path / "copy")
    pack(mixed_case_folder, ds, PackOptions(**OPTS, overwrite=True))
    shutil.copy(copy / "shard-000000.tar", ds / "shard-000000.tar")  # same bytes and size, a new file time
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, collate_fn=lambda x: x)
    with pytest.raises(DatasetChangedError, match=r"shard-000000\.(tar|sfidx): changed since the dataset was opened"
                       ):
        list(loader)
