"""Tests for GPU batch decoding (readers/decode/gpu_decode.py).

On a CPU-only machine the batch decoder runs every step but nvJPEG (the CPU decode primitive
stands in) and ``make_loader(decode_device="cuda")`` falls back to the CPU loader; the
``gpu``-marked tests run nvJPEG through torchvision where a GPU is present (``make gpu-check``).
The reference for each sample is the CPU path (:class:`SampleDecoder`, itself tested against
Pillow in test_fused_decode.py) with the same seed, epoch and rank.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from shardfeed.readers.decode.image import simplejpeg_available
from shardfeed.readers.format.manifest import Sample
from shardfeed.readers.decode.gpu_decode import GpuBatchDecoder, GpuDecodingLoader, nvjpeg_available
from shardfeed.readers.loader import ShardfeedLoader, make_loader
from shardfeed.readers.decode.transforms import SampleDecoder

pytestmark = pytest.mark.skipif(not simplejpeg_available(), reason="needs simplejpeg (pip install simplejpeg)")


def _image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    arr = np.stack([xx * 255 // width, yy * 255 // height, np.full_like(xx, 90)], axis=2)
    arr[: height // 4, : width // 3] = (240, 230, 10)
    arr = np.clip(arr + rng.normal(0, 5, arr.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


def _samples() -> list[Sample]:
    """JPEGs in all 8 orientations, a greyscale JPEG, a CMYK JPEG and a PNG (the CPU fallbacks)."""
    out = []
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        buf = io.BytesIO()
        _image(90 + 7 * o, 70 + 3 * o, o).save(buf, "JPEG", quality=92, exif=exif)
        out.append(Sample(f"{o:09d}", buf.getvalue(), "jpg", o % 3, {"path": f"o{o}.jpg"}))
    for i, (fmt, mode) in enumerate((("JPEG", "L"), ("JPEG", "CMYK"), ("PNG", "RGB"))):
        buf = io.BytesIO()
        _image(80, 60, 20 + i).convert(mode).save(buf, fmt)
        out.append(Sample(f"1{i:08d}", buf.getvalue(), fmt.lower(), i, {"path": f"x{i}"}))
    return out


def _reference(samples, train: bool, seed: int, epoch: int) -> torch.Tensor:
    dec = SampleDecoder(image_size=48, train=train, decoder="auto", seed=seed)
    dec.set_context(epoch, 0, 0)
    return torch.stack([dec(s.data, s.ext, s.label, s.key)[0] for s in samples])


def _mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu().int() - b.cpu().int()).abs().float().mean())


@pytest.mark.parametrize("train", [False, True])
def test_batch_decoder_matches_the_cpu_path_sample_by_sample(train):
    samples = _samples()
    dec = GpuBatchDecoder(48, train=train, device="cpu", seed=7)
    dec.set_epoch(3)
    images, labels = dec(samples)
    assert images.dtype == torch.uint8 and images.shape == (len(samples), 3, 48, 48)
    assert labels.tolist() == [s.label for s in samples]
    ref = _reference(samples, train, seed=7, epoch=3)
    for i in range(len(samples)):  # same boxes, flips and orientation; float vs uint8 resize arithmetic
        assert _mad(images[i], ref[i]) < 1.0, (i, samples[i].meta)


def test_batch_decoder_epochs_differ_and_repeat():
    samples = _samples()[:8]
    dec = GpuBatchDecoder(48, train=True, device="cpu", seed=1)
    dec.set_epoch(0)
    a, _ = dec(samples)
    dec.set_epoch(1)
    b, _ = dec(samples)
    dec.set_epoch(0)
    c, _ = dec(samples)
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_batch_decoder_skips_or_raises_on_a_damaged_jpeg():
    from shardfeed.readers.errors import CorruptDataError

    good = _samples()[:2]
    bad = Sample("000000099", good[0].data[: len(good[0].data) // 2], "jpg", 1, {"path": "bad.jpg"})
    with pytest.raises(CorruptDataError, match="000000099"):
        GpuBatchDecoder(48, device="cpu")([*good, bad])
    images, labels = GpuBatchDecoder(48, device="cpu", on_error="skip")([good[0], bad, good[1]])
    assert images.shape[0] == 2 and labels.tolist() == [good[0].label, good[1].label]


def test_make_loader_decode_device_falls_back_to_the_cpu_loader(tiny_image_folder):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the gpu-marked test covers it")
    loader = make_loader(str(tiny_image_folder), 8, num_workers=0, image_size=32, decode_device="cuda",
                         shuffle=False)
    assert isinstance(loader, ShardfeedLoader)
    x, y = next(iter(loader))
    assert x.device.type == "cpu" and x.dtype == torch.uint8 and x.shape == (8, 3, 32, 32)
    with pytest.raises(ValueError, match="image_size"):
        make_loader(str(tiny_image_folder), 8, num_workers=0, decode_device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True])
def test_nvjpeg_batch_matches_the_cpu_primitive(train):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not nvjpeg_available("cuda"):
        pytest.skip("torchvision with decode_jpeg on CUDA is not installed (pip install torchvision)")
    samples = _samples()
    gpu = GpuBatchDecoder(48, train=train, device="cuda", seed=7)
    cpu = GpuBatchDecoder(48, train=train, device="cpu", seed=7)
    gpu.set_epoch(2)
    cpu.set_epoch(2)
    a, la = gpu(samples)
    b, lb = cpu(samples)
    assert a.device.type == "cuda" and la.device.type == "cuda" and a.dtype == torch.uint8
    assert a.shape == b.shape == (len(samples), 3, 48, 48) and la.cpu().tolist() == lb.tolist()
    for i in range(len(samples)):  # nvJPEG's IDCT/upsampling differ slightly from libjpeg-turbo's
        assert _mad(a[i], b[i]) < 3.0, (i, samples[i].meta)


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_make_loader_decodes_on_the_gpu(packed_wds):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    loader = make_loader(str(packed_wds), 8, num_workers=2, image_size=32, train=True, decode_device="cuda")
    assert isinstance(loader, GpuDecodingLoader)
    n = 0
    for x, y in loader:
        assert x.device.type == "cuda" and x.dtype == torch.uint8 and x.shape[1:] == (3, 32, 32)
        assert y.device.type == "cuda" and y.shape[0] == x.shape[0]
        n += x.shape[0]
    assert n == 60 and len(loader) == 8
