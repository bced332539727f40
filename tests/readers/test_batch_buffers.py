"""Per-sample overhead: the sample generator, the enlarging resize, batch buffers instead of stacking."""

from __future__ import annotations

import io
import math
import mmap
import os
import resource
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from shardfeed.readers import make_loader, open_dataset
from shardfeed.readers.decode.resize import window_to_chw
from shardfeed.readers.decode.transforms import TrainTransform, collate_uint8, sample_generator


def _draws(g: np.random.Generator) -> list[float]:
    return [g.uniform(0.08, 1.0), g.uniform(-0.3, 0.3), float(g.integers(0, 1000)), g.random()]


def test_sample_generator_depends_only_on_seed_epoch_index():
    first = {t: _draws(sample_generator(*t)) for t in [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (3, 2, 10**6)]}
    # asked again in another order, after other samples: the same draws
    for t in reversed(list(first)):
        _draws(sample_generator(5, 5, 5))
        assert _draws(sample_generator(*t)) == first[t]
    assert len({tuple(v) for v in first.values()}) == len(first)  # distinct triples, distinct streams
    big = _draws(sample_generator(2**70 + 1, 0, 0))
    assert big != _draws(sample_generator(1, 0, 0))  # seeds above 64 bits are not folded away
    # uniform enough: the flip draw of 4000 samples
    flips = np.array([sample_generator(0, 0, i).random() < 0.5 for i in range(4000)])
    assert 0.45 < flips.mean() < 0.55


def _reference_box(height, width, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params with numpy draws (None: its fallback)."""
    area = height * width
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return None


def test_sample_crop_draws_the_boxes_of_uniform_draws():
    transforms = [TrainTransform(224), TrainTransform(32, scale=(0.5, 0.9), ratio=(0.5, 2.0))]
    compared = 0
    for i in range(600):
        t = transforms[i % 2]
        height, width = 20 + (i * 37) % 480, 20 + (i * 53) % 480
        ref_rng, rng = sample_generator(1, 2, i), None
        ref = _reference_box(height, width, ref_rng, t.scale, t.ratio)
        after_ref = ref_rng.random()
        rng = sample_generator(1, 2, i)
        box = t.sample_crop(height, width, rng)
        if ref is not None:
            assert box == ref
            assert rng.random() == after_ref  # the stream is left where the reference leaves it
            compared += 1
    assert compared > 400


@pytest.mark.parametrize("shape", [(80, 90), (64, 64), (150, 224), (224, 224)])
@pytest.mark.parametrize("flip", [False, True])
def test_enlarging_resize_is_plain_bilinear(shape, flip):
    rng = np.random.default_rng(shape[0])
    window = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    ref = F.interpolate(torch.from_numpy(window).permute(2, 0, 1)[None].float(), size=(224, 224),
                        mode="bilinear", align_corners=False)[0].round().clamp(0, 255).to(torch.uint8)
    if flip:
        ref = ref.flip(2)
    for resample in ("antialias", "area"):
        out = window_to_chw(window, 224, resample=resample, flip=flip)
        assert out.dtype == torch.uint8 and tuple(out.shape) == (3, 224, 224) and out.is_contiguous()
        assert int((out.int() - ref.int()).abs().max()) <= 1


def test_shrinking_resize_stays_antialiased():
    window = np.random.default_rng(1).integers(0, 256, (300, 330, 3), dtype=np.uint8)
    ref = F.interpolate(torch.from_numpy(window).permute(2, 0, 1)[None], size=(224, 224), mode="bilinear",
                        antialias=True, align_corners=False)[0]
    out = torch.empty((3, 224, 224), dtype=torch.uint8)
    assert window_to_chw(window, 224, resample="antialias", out=out) is out
    assert torch.equal(out, ref)


def test_collate_rows_of_one_buffer_is_a_view_and_other_batches_are_stacked():
    from shardfeed.readers.batching.buffers import _new_batch_buffer

    buf = _new_batch_buffer((5, 3, 4, 4))
    buf.copy_(torch.arange(5 * 3 * 4 * 4, dtype=torch.int64).remainder(251).to(torch.uint8).view(5, 3, 4, 4))
    images, labels = collate_uint8([(buf[i], i) for i in range(1, 4)])
    assert images.data_ptr() == buf[1].data_ptr() and torch.equal(images, buf[1:4].clone())
    assert images.is_contiguous() and labels.tolist() == [1, 2, 3]
    images, _ = collate_uint8([(buf[i], i) for i in (3, 1, 2)])  # rows out of order: a copy
    assert images.data_ptr() != buf.data_ptr() and torch.equal(images, buf[[3, 1, 2]])
    images, _ = collate_uint8([(buf[0], 0), (buf[0].clone(), 0)])
    assert torch.equal(images, torch.stack([buf[0], buf[0]]))
    mine = torch.zeros((4, 3, 4, 4), dtype=torch.uint8)  # a caller's own tensor: always copied
    images, _ = collate_uint8([(mine[i], i) for i in range(4)])
    assert images.data_ptr() != mine.data_ptr()
    images[0, 0, 0, 0] = 9
    assert int(mine[0, 0, 0, 0]) == 0


def test_batch_ring_is_switched_off_when_rows_leave_without_a_handle():
    from shardfeed.readers.batching.buffers import BatchRing

    ring = BatchRing(num_workers=1, slots=2, batch_size=2, image_size=2)
    ring.reset_worker(0)
    held = [ring.next_row(0), ring.next_row(0)]  # rows taken as tensors, never published
    assert ring.next_row(0) is None  # no slot is written again: the held rows stay as they are
    held[0].fill_(7)
    assert all(ring.next_row(0) is None for _ in range(6)) and int(held[0].max()) == 7


def _pack_jpegs(tmp_path, damaged: int | None = None):
    from shardfeed.convert.write.pack import PackOptions, pack

    folder = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for i in range(23):
        d = folder / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(40, 200)), int(rng.integers(40, 200))
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        (d / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    pack(folder, tmp_path / "wds", PackOptions(format="wds", max_count=8, overwrite=True))
    if damaged is not None:
        # overwrite one image's bytes inside a shard with garbage of the same length
        shard = sorted((tmp_path / "wds").glob("*.tar"))[0]
        raw = bytearray(shard.read_bytes())
        at = raw.find(b"\xff\xd8\xff", 512 * damaged)
        raw[at : at + 400] = b"\x00" * 400
        shard.write_bytes(bytes(raw))
    return tmp_path / "wds"


@pytest.mark.parametrize("train", [True, False])
def test_loader_batches_equal_the_samples_decoded_one_by_one(tmp_path, train):
    wds = _pack_jpegs(tmp_path)
    loader = make_loader(wds, 4, num_workers=0, shuffle=False, image_size=56, train=train, seed=3)
    batches = list(loader)  # kept: a later batch must never overwrite an earlier one's pixels
    direct = open_dataset(wds, shuffle=False, image_size=56, train=train, seed=3)
    direct.set_epoch(0)
    samples = list(direct)
    assert sum(len(labels) for _, labels in batches) == len(samples) == 23
    images = torch.cat([b for b, _ in batches])
    assert torch.equal(images, torch.stack([s for s, _ in samples]))
    assert torch.cat([lbl for _, lbl in batches]).tolist() == [lbl for _, lbl in samples]
    assert batches[0][0].data_ptr() != batches[1][0].data_ptr()


def test_loader_with_a_skipped_sample_still_gives_each_image_its_pixels(tmp_path):
    wds = _pack_jpegs(tmp_path, damaged=3)
    loader = make_loader(wds, 4, num_workers=0, shuffle=False, image_size=48, train=True, on_error="skip")
    batches = list(loader)
    direct = open_dataset(wds, shuffle=False, image_size=48, train=True, on_error="skip")
    direct.set_epoch(0)
    samples = list(direct)
    assert len(samples) == 22
    assert torch.equal(torch.cat([b for b, _ in batches]), torch.stack([s for s, _ in samples]))


@pytest.mark.multiprocess
def test_train_crops_are_the_same_with_and_without_workers(tmp_path):
    wds = _pack_jpegs(tmp_path)

    def run(workers, seed):
        loader = make_loader(wds, 4, num_workers=workers, shuffle=False, image_size=40, train=True, seed=seed)
        out = {}
        for images, labels in loader:
            for img, lbl in zip(images, labels):
                out.setdefault(int(lbl), []).append(img.clone())
        return {k: torch.stack(sorted(v, key=lambda t: t.sum().item())) for k, v in out.items()}

    a, b, c = run(0, 1), run(2, 1), run(2, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_train_transform_finish_writes_into_the_given_row():
    t = TrainTransform(32, flip=True)
    window = np.random.default_rng(2).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    out = torch.zeros((3, 32, 32), dtype=torch.uint8)
    got = t.finish(window, np.random.default_rng(0), out=out)
    assert got is out and torch.equal(out, t.finish(window, np.random.default_rng(0)))


def test_batch_ring_slot_is_written_again_only_after_its_batch_is_freed():
    import gc

    from shardfeed.readers.batching.buffers import BatchRing

    ring = BatchRing(num_workers=1, slots=2, batch_size=3, image_size=4)
    ring.reset_worker(0)

    def fill(value):
        rows = [ring.next_row(0) for _ in range(3)]
        if rows[0] is None:
            return None
        for i, row in enumerate(rows):
            row.fill_(value + i)
        return ring.publish(rows)

    a = ring.take(fill(10))
    b = ring.take(fill(20))
    half = b[1:]  # a slice keeps the slot held too
    assert fill(30) is None  # both slots held by the loop: the worker makes that batch its own way
    assert [int(t[0, 0, 0, 0]) for t in (a, b)] == [10, 20]
    del a
    gc.collect()
    c = ring.take(fill(40))  # the slot of the freed batch is used again
    assert int(c[0, 0, 0, 0]) == 40 and int(half[0, 0, 0, 0]) == 21  # the held batch is unchanged
    del b
    gc.collect()
    assert fill(50) is None  # the slice still holds the slot
    del half
    gc.collect()
    assert fill(60) is not None
    with pytest.raises(RuntimeError, match="no longer names its batch"):
        ring.take(RingBatch_like(ring, 0, 0, 9))


def RingBatch_like(ring, worker, slot, seq):
    from shardfeed.readers.batching.buffers import RingBatch

    return RingBatch(ring.ring_id, worker, slot, 1, seq)


def test_batch_ring_reclaims_batches_never_taken():
    from shardfeed.readers.batching.buffers import BatchRing

    ring = BatchRing(num_workers=1, slots=2, batch_size=1, image_size=2)
    ring.reset_worker(0)
    held = ring.take(ring.publish([ring.next_row(0)]))
    ring.publish([ring.next_row(0)])  # published, never taken (its iteration ended early)
    assert ring.next_row(0) is None
    ring.reclaim()
    row = ring.next_row(0)
    assert row is not None and row.data_ptr() != held.data_ptr()  # the taken one stays held


def test_batch_ring_never_waits_when_every_slot_is_held():
    from shardfeed.readers.batching.buffers import BatchRing

    ring = BatchRing(num_workers=2, slots=2, batch_size=2, image_size=2)
    ring.reset_worker(1)
    handles = []
    for _ in range(2):
        rows = [ring.next_row(1), ring.next_row(1)]
        handles.append(ring.publish(rows))
    assert [ring.next_row(1) for _ in range(2)] == [None, None]  # the third batch: the caller's own tensors
    ring.take(handles[0])  # taken and dropped at once: freed
    import gc

    gc.collect()
    assert ring.next_row(1) is not None  # a freed slot is used again
    assert ring.next_row(5) is None and ring.publish([torch.zeros(3, 2, 2, dtype=torch.uint8)]) is None


def test_batch_ring_labels_travel_beside_the_slot():
    import gc

    from shardfeed.readers.batching.buffers import BatchRing

    ring = BatchRing(num_workers=1, slots=2, batch_size=3, image_size=2)
    ring.reset_worker(0)
    rows = [ring.next_row(0) for _ in range(2)]  # a short last batch: 2 of 3 rows
    for i, row in enumerate(rows):
        row.fill_(7 + i)
    handle = ring.publish(rows, [4, 2**40])
    images, labels = ring.take_batch(handle)
    assert labels.dtype == torch.int64 and labels.tolist() == [4, 2**40]
    assert [int(img[0, 0, 0]) for img in images] == [7, 8]
    rows = [ring.next_row(0) for _ in range(3)]
    with pytest.raises(ValueError, match="2 labels for 3 images"):
        ring.publish(rows, [1, 2])
    second = ring.take_batch(ring.publish(rows, [5, 6, 9]))[1]
    assert second.tolist() == [5, 6, 9] and labels.tolist() == [4, 2**40]  # each batch keeps its own
    del images
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer names its batch"):
        ring.take_batch(handle)  # its slot was freed
    with pytest.raises(RuntimeError, match="no longer names its batch"):
        ring.take_batch(RingBatch_like(ring, 3, 0, 1))  # not a slot of this ring


def _sorted_images(images: torch.Tensor, labels: torch.Tensor):
    pairs = sorted(zip(labels.tolist(), images), key=lambda p: (p[0], p[1].sum().item()))
    return [lbl for lbl, _ in pairs], torch.stack([img for _, img in pairs])


@pytest.mark.multiprocess
@pytest.mark.parametrize("train", [True, False])
def test_worker_batches_through_reused_slots_equal_the_samples(tmp_path, train):
    wds = _pack_jpegs(tmp_path)
    loader = make_loader(wds, 2, num_workers=2, shuffle=True, image_size=56, train=train, seed=5,
                         prefetch_factor=1, pin_memory=False)
    assert loader._batch_ring is not None
    direct = open_dataset(wds, shuffle=False, image_size=56, train=train, seed=5)
    for epoch in range(2):
        batches = list(loader)  # all held: slots must not be written again while they are
        ring = loader._batch_ring.buffers
        in_ring = sum(ring.data_ptr() <= images.data_ptr() < ring.data_ptr() + ring.numel() for images, _ in batches)
        assert in_ring >= 2  # some batches are views of slots, the rest made the ordinary way
        direct.set_epoch(epoch)
        want = list(direct)
        got = _sorted_images(torch.cat([b for b, _ in batches]), torch.cat([lbl for _, lbl in batches]))
        ref = _sorted_images(torch.stack([s for s, _ in want]), torch.tensor([lbl for _, lbl in want]))
        assert got[0] == ref[0] and torch.equal(got[1], ref[1])
        del batches  # (held into the next epoch, its slots would stay held, and that epoch made the ordinary way)


@pytest.mark.multiprocess
def test_batches_freed_as_they_go_reuse_the_slots_and_stay_right(tmp_path):
    wds = _pack_jpegs(tmp_path)
    loader = make_loader(wds, 2, num_workers=2, shuffle=False, image_size=48, train=True, seed=2,
                         prefetch_factor=1, pin_memory=False)
    direct = open_dataset(wds, shuffle=False, image_size=48, train=True, seed=2)
    direct.set_epoch(0)
    want = {(int(lbl), img.sum().item()) for img, lbl in direct}
    got = set()
    for images, labels in loader:  # each batch dropped before the next: slots come round again
        got |= {(int(lbl), img.sum().item()) for img, lbl in zip(images, labels)}
    assert got == want


@pytest.mark.multiprocess
def test_an_abandoned_iteration_leaves_the_next_one_whole(tmp_path):
    wds = _pack_jpegs(tmp_path)
    loader = make_loader(wds, 4, num_workers=2, shuffle=False, image_size=40, train=False)
    it = iter(loader)
    next(it)  # the rest of this epoch's batches stay in their slots, never taken
    del it
    loader.set_epoch(0)
    images = torch.cat([b for b, _ in loader])
    direct = open_dataset(wds, shuffle=False, image_size=40)
    direct.set_epoch(0)
    ref = torch.stack([s for s, _ in direct])
    assert images.shape == ref.shape
    assert sorted(x.sum().item() for x in images) == sorted(x.sum().item() for x in ref)


def test_main_process_buffers_are_written_again_only_once_nothing_holds_them(tmp_path):
    wds = _pack_jpegs(tmp_path)
    loader = make_loader(wds, 2, num_workers=0, shuffle=False, image_size=40, train=True, seed=3, pin_memory=False)
    direct = open_dataset(wds, shuffle=False, image_size=40, train=True, seed=3)
    direct.set_epoch(0)
    want = [img for img, _ in direct]
    held = list(loader)  # every batch held: each needs memory of its own
    assert len({images.data_ptr() for images, _ in held}) == len(held)
    assert torch.equal(torch.cat([b for b, _ in held]), torch.stack(want))
    keep_row, keep_array = held[0][0][1], held[1][0].numpy()  # a row and an array keep their buffers
    first_row, second = keep_row.clone(), held[1][0].clone()
    del held
    loader.set_epoch(0)
    ptrs = []
    for images, _ in loader:  # each batch dropped before the next but one: buffers come round again
        ptrs.append(images.data_ptr())
    assert len(set(ptrs)) < len(ptrs)
    assert torch.equal(keep_row, first_row) and torch.equal(torch.from_numpy(keep_array), second)
    loader.set_epoch(0)
    assert torch.equal(torch.cat([b.clone() for b, _ in loader]), torch.stack(want))


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_a_worker_maps_its_slots_once_and_writes_them_without_page_faults():
    from shardfeed.readers.batching.buffers import BatchRing
    from shardfeed.readers.batching.pages import populate_pages

    ring = BatchRing(num_workers=2, slots=3, batch_size=4, image_size=256)  # 3 x 786,432 bytes per worker
    part = ring.buffers[1].numpy()
    pages = part.size // mmap.PAGESIZE
    want = (np.arange(part.size, dtype=np.int64) % 251).astype(np.uint8).reshape(part.shape)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked worker: the shared pages are not in its page tables yet
        status = 1
        try:
            ring.reset_worker(1)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            np.copyto(part, want)  # every byte of the worker's slots
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            os.write(write_end, str(faults).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    faults = int(os.read(read_end, 64) or b"-1")
    os.close(read_end)
    assert os.waitpid(pid, 0)[1] == 0
    assert 0 <= faults < pages // 4  # mapped by one call at reset_worker, not one fault per page
    assert np.array_equal(part, want)  # the worker's writes are in the shared memory
    assert populate_pages(ring.buffers.data_ptr(), 0) is False


def test_row_planes_are_the_rows_of_the_buffer_and_the_ring_hands_out_a_row_with_its_own_planes():
    from shardfeed.readers.batching.buffers import BatchRing, row_planes

    buf = torch.zeros((2, 3, 4, 4), dtype=torch.uint8)
    planes = row_planes(buf)
    for r in range(2):
        for c in range(3):
            planes[r][c][:] = 10 * r + c + 1  # written through the numpy view
    expected = torch.tensor([[1, 2, 3], [11, 12, 13]], dtype=torch.uint8)[:, :, None, None].expand(2, 3, 4, 4)
    assert torch.equal(buf, expected)

    ring = BatchRing(num_workers=1, slots=2, batch_size=2, image_size=4)
    ring.reset_worker(0)
    for k in range(2):
        row, row_planes_k = ring.next_row_planes(0)
        for c in range(3):
            row_planes_k[c][:] = 100 + 10 * k + c
        assert torch.equal(row, torch.tensor([100 + 10 * k + c for c in range(3)],
                                             dtype=torch.uint8)[:, None, None].expand(3, 4, 4))
        assert row.data_ptr() == ring.buffers[0, 0, k].data_ptr()
