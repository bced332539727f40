"""Batching has one owner: the decoder writes into the row it is handed; ``BatchRows`` hands out the
rows and never writes again into memory a caller still holds; torch's private storage calls live in
``readers/batching/buffers.py`` only."""

from __future__ import annotations

import gc
import io
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardfeed.readers.batching import buffers as batching
from shardfeed.readers.batching.buffers import BatchRing, BatchRows, collate_uint8, row_planes
from shardfeed.readers.decode.transforms import SampleDecoder

ROOT = Path(__file__).resolve().parents[2]
COLOUR = (200, 30, 90)


def _solid_jpeg(height: int, width: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), COLOUR, dtype=np.uint8)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


@pytest.mark.parametrize("decoder", ["auto", "pil"])
@pytest.mark.parametrize("train", [False, True])
def test_decoder_writes_into_the_row_it_is_handed(decoder, train):
    size = 24
    sd = SampleDecoder(image_size=size, train=train, decoder=decoder)
    assert sd.writes_rows
    buf = torch.full((2, 3, size, size), 7, dtype=torch.uint8)
    planes = row_planes(buf)
    image, label = sd(_solid_jpeg(60, 80), "jpg", 3, "planted.jpg", out=(buf[1], planes[1]))
    assert label == 3 and image.data_ptr() == buf[1].data_ptr()
    want = torch.tensor(COLOUR, dtype=torch.int16)[:, None, None]
    assert int((buf[1].to(torch.int16) - want).abs().max()) <= 3  # the planted colour, through JPEG
    assert int(buf[0].min()) == 7 and int(buf[0].max()) == 7  # the other row is untouched


def test_decoder_without_a_row_or_with_its_own_transform_makes_its_own_tensor():
    sd = SampleDecoder(image_size=16)
    image, _ = sd(_solid_jpeg(20, 20), "jpg", 0, "planted.jpg")
    assert tuple(image.shape) == (3, 16, 16)
    custom = SampleDecoder(transform=lambda t: t[:, :4, :4].clone())
    assert not custom.writes_rows and not SampleDecoder().writes_rows
    assert not any(isinstance(v, torch.Tensor) for v in vars(sd).values())  # the decoder holds no buffer


def _fill(rows: BatchRows, values: list[int]) -> torch.Tensor:
    items = []
    for label, value in enumerate(values):
        row, planes = rows.next_row()
        for plane in planes:
            plane[:] = value
        items.append((row, label))
    images, _ = collate_uint8(items)
    return images


def test_a_buffer_still_referenced_is_never_written_again():
    rows = BatchRows(batch_size=2, image_size=4)
    held = _fill(rows, [11, 12])
    array = _fill(rows, [21, 22]).numpy()  # a numpy array of a batch holds its buffer too
    row = _fill(rows, [31, 32])[1]  # and so does one row
    seen = set()
    for k in range(8):  # more batches than the pool keeps, each dropped at once
        seen.add(_fill(rows, [100 + k, 110 + k]).data_ptr())
        gc.collect()
    assert [int(held[0].max()), int(held[0].min()), int(held[1].max()), int(held[1].min())] == [11, 11, 12, 12]
    assert int(array.min()) == 21 and int(array[1].max()) == 22
    assert int(row.min()) == 32 and int(row.max()) == 32
    assert held.data_ptr() not in seen and row.data_ptr() - row.storage_offset() not in seen
    assert len(seen) < 8  # buffers nobody holds are written again


def test_a_released_buffer_is_written_again():
    rows = BatchRows(batch_size=2, image_size=4)
    first = _fill(rows, [1, 2])
    ptr = first.data_ptr()
    del first
    gc.collect()
    assert _fill(rows, [3, 4]).data_ptr() == ptr


def test_a_row_put_back_comes_again():
    rows = BatchRows(batch_size=3, image_size=2)
    a = rows.next_row()[0]
    b = rows.next_row()[0]
    rows.put_back()
    assert rows.next_row()[0].data_ptr() == b.data_ptr() != a.data_ptr()


def test_a_ring_row_put_back_comes_again_and_the_batch_still_goes_as_a_handle(monkeypatch):
    ring = BatchRing(num_workers=1, slots=2, batch_size=2, image_size=2)
    rows = BatchRows(batch_size=2, image_size=2, ring=ring)
    monkeypatch.setattr(batching, "_worker_id", lambda: 0)  # as in worker 0
    rows.start_epoch()
    first = rows.next_row()[0]
    rows.put_back()  # its sample failed to decode
    again = rows.next_row()[0]
    second = rows.next_row()[0]
    assert again.data_ptr() == first.data_ptr() == ring.buffers[0, 0, 0].data_ptr()
    again.fill_(5)
    second.fill_(6)
    handle = ring.publish([again, second], [1, 2])
    assert handle is not None
    images, labels = ring.take_batch(handle)
    assert images[:, 0, 0, 0].tolist() == [5, 6] and labels.tolist() == [1, 2]


def test_the_ring_travels_to_workers_only_through_use_batch_ring():
    ring = BatchRing(num_workers=1, slots=2, batch_size=2, image_size=2)
    rows = BatchRows(batch_size=2, image_size=2)
    rows.use_ring(ring)
    copy = pickle.loads(pickle.dumps(rows))  # what a worker gets when it starts
    assert copy.ring is not None and copy.ring.ring_id == ring.ring_id
    rows.use_ring(None)
    assert pickle.loads(pickle.dumps(rows)).ring is None
    assert copy.ring is not None  # a worker already started keeps its copy


def test_torch_private_storage_calls_live_in_the_batching_module_only():
    private = re.compile(r"_new_shared|_storage_Use_Count|_use_count\b")
    users = sorted(p.relative_to(ROOT).as_posix() for top in ("readers", "convert")
                   for p in (ROOT / top).rglob("*.py") if private.search(p.read_text()))
    assert users == ["readers/batching/buffers.py"]


def _pack(tmp_path: Path, damaged_key: str) -> Path:
    from shardfeed.convert.write.pack import PackOptions, pack

    folder = tmp_path / "folder"
    rng = np.random.default_rng(4)
    for i in range(12):
        d = folder / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        (d / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    out = tmp_path / "wds"
    pack(folder, out, PackOptions(format="wds", overwrite=True))
    shard = next(out.glob("*.tar"))
    raw = bytearray(shard.read_bytes())
    at = raw.find(b"\xff\xd8\xff", raw.find(damaged_key.encode()))  # that sample's JPEG bytes
    raw[at : at + 300] = b"\x00" * 300
    shard.write_bytes(bytes(raw))
    return out


@pytest.mark.multiprocess
def test_a_sample_that_fails_to_decode_leaves_the_ring_batches_whole(tmp_path):
    from shardfeed.readers import make_loader, open_dataset

    wds = _pack(tmp_path, "005")
    loader = make_loader(wds, 4, num_workers=2, shuffle=False, image_size=32, on_error="skip", pin_memory=False,
                         prefetch_factor=1)
    batches = [(images.clone(), labels.clone(), loader._batch_ring.buffers.data_ptr() <= images.data_ptr()
                < loader._batch_ring.buffers.data_ptr() + loader._batch_ring.buffers.numel())
               for images, labels in loader]
    direct = open_dataset(wds, shuffle=False, image_size=32, on_error="skip")
    direct.set_epoch(0)
    want = sorted((int(lbl), img.sum().item()) for img, lbl in direct)
    got = sorted((int(lbl), img.sum().item()) for images, labels, _ in batches for img, lbl in zip(images, labels))
    assert len(want) == 11 and got == want
    assert all(in_ring for _, _, in_ring in batches)  # the failed sample took no row: every batch went as a handle
