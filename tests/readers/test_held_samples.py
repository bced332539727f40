"""Images a caller holds never change: held rows of reused batch buffers, and live iterations side by side."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from shardfeed.readers import make_loader

NUM = 29  # samples planted: 7 batches of 4 and a short one


def _colour(i: int) -> tuple[int, int, int]:
    """Sample ``i``'s solid colour: the first channel names the sample."""
    return 3 * i, 250 - 3 * i, 40 + (11 * i) % 200


def _planted() -> set[tuple[int, int]]:
    """Every planted sample's ``(index, label)``: sample ``i`` lies in class folder ``c{i % 3}``."""
    return {(i, i % 3) for i in range(NUM)}


def _pack(tmp_path, fmt: str):
    """A folder of solid-colour PNGs of assorted sizes packed as ``fmt``."""
    from shardfeed.convert.write.pack import PackOptions, pack

    folder = tmp_path / "folder"
    for i in range(NUM):
        d = folder / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = 20 + (i * 7) % 30, 24 + (i * 11) % 40
        buf = io.BytesIO()
        Image.fromarray(np.full((h, w, 3), _colour(i), dtype=np.uint8)).save(buf, "PNG")
        (d / f"{i:03d}.png").write_bytes(buf.getvalue())
    out = tmp_path / fmt
    pack(folder, out, PackOptions(format=fmt, max_count=8, overwrite=True))
    return out


def _which(image: torch.Tensor) -> int:
    """The planted sample an image shows (every pixel within 1 of its colour), else fail."""
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 16, 16)
    i = round(float(image[0].float().mean()) / 3)
    want = torch.tensor(_colour(i), dtype=torch.int32).view(3, 1, 1)
    assert 0 <= i < NUM and int((image.int() - want).abs().max()) <= 1, f"not a planted image (nearest {i})"
    return i


def _check_held(held: list[torch.Tensor], clones: list[torch.Tensor], labels: list[int]) -> None:
    assert len(held) == NUM
    changed = sum(not torch.equal(h, c) for h, c in zip(held, clones))
    assert changed == 0, f"{changed}/{len(held)} held images changed"
    assert {(_which(h), int(lbl)) for h, lbl in zip(held, labels)} == _planted()


def test_rows_held_through_a_custom_collate_stay_as_they_were(tmp_path):
    wds = _pack(tmp_path, "wds")
    loader = make_loader(wds, 4, num_workers=0, shuffle=False, image_size=16, pin_memory=False,
                         collate_fn=lambda batch: tuple(zip(*batch)))  # per-sample tuples, as detection loaders do
    for _ in range(2):  # the second epoch writes into the buffers the first one filled
        held, clones, labels = [], [], []
        for images, lbls in loader:
            held += images
            clones += [im.clone() for im in images]
            labels += lbls
        _check_held(held, clones, labels)


def test_samples_held_while_iterating_the_dataset_stay_as_they_were(tmp_path):
    wds = _pack(tmp_path, "wds")
    loader = make_loader(wds, 4, num_workers=0, shuffle=False, image_size=16, pin_memory=False)
    ds = loader.dataset
    ds.set_epoch(0)
    held, clones, labels = [], [], []
    for image, label in ds:
        held.append(image)
        clones.append(image.clone())
        labels.append(label)
    _check_held(held, clones, labels)


def test_lmdb_items_held_across_later_lookups_stay_as_they_were(tmp_path):
    db = _pack(tmp_path, "lmdb")
    loader = make_loader(db, 4, num_workers=0, shuffle=False, image_size=16, pin_memory=False)
    ds = loader.dataset
    held, clones, labels = [], [], []
    for i in range(NUM):
        image, label = ds[i]
        held.append(image)
        clones.append(image.clone())
        labels.append(label)
    for i in range(NUM):  # more lookups after all are held
        ds[i]
    _check_held(held, clones, labels)


def test_buffers_still_come_round_when_rows_are_dropped(tmp_path):
    wds = _pack(tmp_path, "wds")
    loader = make_loader(wds, 4, num_workers=0, shuffle=False, image_size=16, pin_memory=False,
                         collate_fn=lambda batch: tuple(zip(*batch)))
    ptrs, seen = [], set()
    for images, labels in loader:  # each batch's rows dropped before the next but one
        ptrs.append(images[0].untyped_storage().data_ptr())
        seen |= {(_which(im), int(lbl)) for im, lbl in zip(images, labels)}
    assert len(set(ptrs)) < len(ptrs)
    assert seen == _planted()


@pytest.mark.multiprocess
def test_two_live_iterations_of_one_loader_each_get_the_whole_epoch(tmp_path):
    wds = _pack(tmp_path, "wds")
    loader = make_loader(wds, 2, num_workers=2, shuffle=True, seed=4, image_size=16, pin_memory=False,
                         persistent_workers=False, prefetch_factor=1)
    assert loader._batch_ring is not None
    got: list[list[tuple[int, int]]] = [[], []]
    for pair in zip(loader, loader):
        for k, (images, labels) in enumerate(pair):
            got[k] += [(_which(im), int(lbl)) for im, lbl in zip(images, labels)]
    for k in range(2):  # both iterations have 15 batches: zip reads them all
        assert len(got[k]) == NUM and set(got[k]) == _planted()
    # the ring is free again once both have ended: the next epoch moves batches through it
    ring = loader._batch_ring.buffers
    batches = list(loader)
    assert any(ring.data_ptr() <= images.data_ptr() < ring.data_ptr() + ring.numel() for images, _ in batches)
    got_next = [(_which(im), int(lbl)) for images, labels in batches for im, lbl in zip(images, labels)]
    assert len(got_next) == NUM and set(got_next) == _planted()


@pytest.mark.multiprocess
def test_an_iteration_started_beside_a_held_one_leaves_its_batches_whole(tmp_path):
    wds = _pack(tmp_path, "wds")
    loader = make_loader(wds, 2, num_workers=2, shuffle=False, image_size=16, pin_memory=False,
                         persistent_workers=False, prefetch_factor=1)
    first = iter(loader)
    head = [next(first) for _ in range(3)]
    head_clones = [images.clone() for images, _ in head]
    second = [(images, labels) for images, labels in loader]  # a whole epoch while the first is alive
    rest = list(first)
    assert all(torch.equal(images, c) for (images, _), c in zip(head, head_clones))
    for batches in (head + rest, second):
        pairs = [(_which(im), int(lbl)) for images, labels in batches for im, lbl in zip(images, labels)]
        assert len(pairs) == NUM and set(pairs) == _planted()
