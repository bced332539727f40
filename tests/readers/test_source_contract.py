"""One contract for the three sources iterated directly (``for s in open_dataset(...)``).

docs/format.md "Splitting an epoch": shuffled each epoch, split by rank into
equal shares (remainder dropped, or repeated with ``pad=True``), disjoint across ranks. The
expectations come from the image folder itself (``tiny_folder_expected``: bytes and labels by
path), never from the readers.
"""

from __future__ import annotations

import pytest

from shardfeed.readers import open_dataset


@pytest.fixture(scope="module")
def three_sources(tiny_image_folder, packed_wds, packed_lmdb):
    return {"folder": tiny_image_folder, "wds": packed_wds, "lmdb": packed_lmdb}


def _read(src, **kw):
    ds = open_dataset(src, decode=False, **kw)
    items = list(ds)
    return ds, items


def _check_items(items, expected):
    for s in items:
        data, label = expected[s.meta["path"]]
        assert s.label == label, s.meta["path"]
        assert bytes(s.data) == data, s.meta["path"]


@pytest.mark.parametrize("name", ["folder", "wds", "lmdb"])
@pytest.mark.parametrize("world_size,pad", [(2, False), (7, False), (7, True)])
def test_rank_shares_are_equal_disjoint_and_complete(three_sources, tiny_folder_expected, name, world_size, pad):
    n = len(tiny_folder_expected)  # 60
    per_rank = -(-n // world_size) if pad else n // world_size
    shares = []
    for rank in range(world_size):
        ds, items = _read(three_sources[name], rank=rank, world_size=world_size, seed=3, pad=pad)
        assert len(items) == per_rank == ds.num_samples_per_rank, (name, rank)
        _check_items(items, tiny_folder_expected)
        shares.append([s.meta["path"] for s in items])
    flat = [p for share in shares for p in share]
    if pad:
        assert set(flat) == set(tiny_folder_expected)  # complete; the padding repeats a few
        assert len(flat) == per_rank * world_size
    else:
        assert len(flat) == len(set(flat))  # disjoint
        assert set(flat) <= set(tiny_folder_expected)
        assert len(set(tiny_folder_expected) - set(flat)) == n % world_size  # only the remainder is left out


@pytest.mark.parametrize("name", ["folder", "wds", "lmdb"])
def test_shuffled_unless_shuffle_false(three_sources, tiny_folder_expected, name):
    packing_order = None
    ds, plain = _read(three_sources[name], shuffle=False)
    keys = [s.key for s in plain]
    packing_order = sorted(keys)  # keys are zero-padded indices in packing (or ImageFolder) order
    assert keys == packing_order and len(keys) == len(tiny_folder_expected)
    _check_items(plain, tiny_folder_expected)
    ds, first = _read(three_sources[name], seed=3)
    second = list(ds)  # the next iteration is the next epoch
    k1, k2 = [s.key for s in first], [s.key for s in second]
    assert sorted(k1) == sorted(k2) == packing_order
    assert k1 != packing_order and k2 != k1
    ds.set_epoch(0)
    assert [s.key for s in ds] == k1  # an epoch is a function of (seed, epoch)
