"""LMDB source: lazy per-process environment under fork (after the parent read), spawn and
forkserver; DistributedSampler; the sample-range split for map-style sources."""

from __future__ import annotations

import pytest
import torch

from shardfeed.readers import make_loader, open_dataset
from shardfeed.readers.loader import collate_raw


def _check(batches, expected):
    samples = [s for b in batches for s in b]
    assert sorted(s.meta["path"] for s in samples) == sorted(expected)
    for s in samples:
        assert (s.data, s.label) == expected[s.meta["path"]]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("ctx,workers", [("fork", 2), ("spawn", 2), ("forkserver", 1)])
def test_lmdb_workers(ctx, workers, packed_lmdb, tiny_folder_expected):
    import multiprocessing as mp

    if ctx not in mp.get_all_start_methods():
        pytest.skip(f"start method {ctx} not available here")
    ds = open_dataset(packed_lmdb, decode=False)
    assert ds[0].key == "000000000"  # the parent has read from the database (env open here)
    loader = make_loader(ds, 10, num_workers=workers, multiprocessing_context=ctx, shuffle=False,
                         persistent_workers=False)
    batches = list(loader)
    assert len(batches) == len(loader) == 6
    _check(batches, tiny_folder_expected)
    assert ds[59].key == "000000059"  # and the parent still reads


def test_lmdb_distributed_sampler_and_ranges(packed_lmdb, tiny_folder_expected):
    ds = open_dataset(packed_lmdb, decode=False)
    got = []
    for r in range(2):
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=1)
        got.append([s.meta["path"] for b in torch.utils.data.DataLoader(ds, 8, sampler=sampler,
                                                                          collate_fn=collate_raw) for s in b])
    assert sorted(got[0] + got[1]) == sorted(tiny_folder_expected)
    # our own rule: 60 samples, world 7 -> 8 per rank, remainder 4 dropped; pad -> 9 per rank
    for pad, per_rank in ((False, 8), (True, 9)):
        seen = []
        for r in range(7):
            loader = make_loader(packed_lmdb, 3, num_workers=0, decode=False, rank=r, world_size=7, pad=pad)
            keys = [s.key for b in loader for s in b]
            assert len(keys) == per_rank and len(loader) == 3
            seen += keys
        assert len(set(seen)) == (60 if pad else 56)


def test_lmdb_over_http_is_refused(simple_http_server):
    with pytest.raises(ValueError, match="LMDB datasets are read from a local path"):
        open_dataset(f"{simple_http_server}/lmdb/")
