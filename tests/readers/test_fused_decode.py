"""Tests for the fused decode-and-crop path: simplejpeg, decode_crop, resample="antialias".

References come from Pillow (full decode, ``ImageOps.exif_transpose``), OpenCV and numpy directly;
the crop distribution is checked against an independent vectorised draw of the
``RandomResizedCrop`` rule and against ``TrainTransform.sample_crop`` on the full-size frame.
"""

from __future__ import annotations

import io
import math

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from shardfeed.readers.decode.image import decode_crop, decode_image, resolve_decoder, simplejpeg_available
from shardfeed.readers.errors import CorruptDataError
from shardfeed.readers.decode.transforms import EvalTransform, SampleDecoder, TrainTransform, make_rng

pytestmark = pytest.mark.skipif(not simplejpeg_available(), reason="needs simplejpeg (pip install simplejpeg)")

#: Largest mean absolute difference (grey levels, 0..255) allowed between the fused path's output
#: and today's full-decode path for the same box. Measured: ~0.4 at scale 1, ~0.9 at 1/2-1/8.
MAX_MAD = 1.5


def textured(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Photo-like RGB: smooth gradients, an asymmetric marker, mild noise (uint8 HWC)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([
        128 + 100 * np.sin(xx / 23.0 + yy / 41.0),
        255 * xx / max(width - 1, 1),
        255 * yy / max(height - 1, 1),
    ], axis=2)
    img[: height // 5, : width // 4] = (250, 240, 20)  # top-left marker
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(arr: np.ndarray, quality: int = 92, orientation: int | None = None, mode: str = "RGB") -> bytes:
    img = Image.fromarray(arr, "RGB")
    if mode != "RGB":
        img = img.convert(mode)
    kwargs = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, **kwargs)
    return buf.getvalue()


def pillow_upright(data: bytes) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


def area_resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Today's resize rule, from OpenCV directly: INTER_AREA shrinking, INTER_LINEAR otherwise."""
    shrink = width <= img.shape[1] and height <= img.shape[0]
    return cv2.resize(np.ascontiguousarray(img), (width, height),
                      interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def mad(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.int32) - np.asarray(b, dtype=np.int32)).mean())


# ---------------------------------------------------------------------------------------------
# The binding


def test_auto_resolves_to_simplejpeg_and_matches_pillow_full_decode():
    assert resolve_decoder("auto") == "simplejpeg"
    data = jpeg(textured(300, 200))
    out = decode_image(data, "jpg", decoder="simplejpeg")
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert out.shape == ref.shape == (200, 300, 3)
    assert mad(out, ref) < 0.5  # both libjpeg-turbo, accurate IDCT and fancy upsampling


def test_grayscale_and_cmyk_follow_the_rule():
    gray = jpeg(textured(64, 48), mode="L")
    out = decode_image(gray, decoder="simplejpeg")
    ref = np.asarray(Image.open(io.BytesIO(gray)))
    assert out.shape == (48, 64, 3) and np.abs(out[..., 1].astype(int) - ref).max() <= 1
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])
    cmyk = jpeg(textured(64, 48), mode="CMYK")  # CMYK: Pillow's conversion, exactly as decoder="pil"
    assert np.array_equal(decode_image(cmyk, decoder="simplejpeg"), decode_image(cmyk, decoder="pil"))


def test_png_takes_pillows_path_in_decode_crop():
    arr = textured(80, 60)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    out = decode_crop(buf.getvalue(), crop=lambda h, w: (10, 20, 30, 40), min_side=8)
    assert np.array_equal(out, arr[10:40, 20:60])


def test_extraneous_bytes_are_tolerated_like_pillow():
    data = bytearray(jpeg(textured(64, 48)))
    sos = data.index(b"\xff\xda")
    data[sos:sos] = b"\x00\x00\x00"  # junk before a marker: libjpeg warns, simplejpeg strict refuses
    ref = np.asarray(Image.open(io.BytesIO(bytes(data))).convert("RGB"))
    out = decode_image(bytes(data), decoder="simplejpeg")
    assert out.shape == ref.shape and mad(out, ref) < 0.5


def test_truncated_jpeg_raises_naming_the_source():
    data = jpeg(textured(64, 48))
    with pytest.raises(CorruptDataError, match="shard-7 key k"):
        decode_crop(data[: len(data) // 2], crop=lambda h, w: (0, 0, h, w), min_side=8,
                    source="shard-7 key k")


def test_box_outside_the_image_is_refused():
    with pytest.raises(ValueError, match="not inside"):
        decode_crop(jpeg(textured(64, 48)), crop=lambda h, w: (0, 0, h + 1, w), min_side=8)


# ---------------------------------------------------------------------------------------------
# Orientation: the box is drawn in the upright frame


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("size,min_side", [((150, 100), 40), ((960, 640), 64)])
def test_box_in_upright_frame_for_every_orientation(orientation, size, min_side):
    data = jpeg(textured(*size, seed=orientation), orientation=orientation)
    upright = pillow_upright(data)
    up_h, up_w = upright.shape[:2]
    seen = []
    box = (up_h // 10, up_w // 7, up_h // 2, up_w // 2)  # a box off-centre, touching the marker

    def crop(h, w):
        seen.append((h, w))
        return box

    window = decode_crop(data, crop=crop, min_side=min_side)
    assert seen == [(up_h, up_w)]  # drawn once, on the upright full-size frame
    top, left, bh, bw = box
    ref = upright[top : top + bh, left : left + bw]
    factor = 1 if min_side == 40 else 4  # box 50x75 -> 1; box 480x320 (or 320x480) -> largest f with f*64 <= 320
    assert abs(window.shape[0] - bh / factor) <= 1 and abs(window.shape[1] - bw / factor) <= 1
    assert mad(area_resize(window, bw // factor, bh // factor), area_resize(ref, bw // factor, bh // factor)) < 2.0


# ---------------------------------------------------------------------------------------------
# The crop distribution


def reference_boxes(height: int, width: int, n: int, seed: int) -> np.ndarray:
    """RandomResizedCrop's rule, vectorised independently: (area fraction, aspect) of n boxes."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        scale = rng.uniform(0.08, 1.0, 10 * n)
        aspect = np.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3), 10 * n))
        w = np.round(np.sqrt(scale * height * width * aspect))
        h = np.round(np.sqrt(scale * height * width / aspect))
        ok = (w <= width) & (h <= height)
        out.extend(zip((w * h / (height * width))[ok], (w / h)[ok]))
    return np.array(out[:n])


def test_fused_boxes_are_sample_crop_on_the_full_frame_and_match_the_rule():
    data = jpeg(textured(500, 375))
    transform = TrainTransform(224)
    rng = make_rng(3, 1, 0, 0)
    boxes = []

    def crop(h, w):
        boxes.append(transform.sample_crop(h, w, rng))
        return boxes[-1]

    for _ in range(1500):
        decode_crop(data, crop=crop, min_side=224)
    replay = make_rng(3, 1, 0, 0)
    assert boxes == [transform.sample_crop(375, 500, replay) for _ in boxes]  # same seed, same boxes
    got = np.array([(bh * bw / (375 * 500), bw / bh) for _, _, bh, bw in boxes])
    ref = reference_boxes(375, 500, 20000, seed=11)
    assert got[:, 0].min() >= 0.075 and got[:, 0].max() <= 1.0
    assert got[:, 1].min() >= 0.74 and got[:, 1].max() <= 4 / 3 + 0.02
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):  # quantiles agree within sampling noise
        assert abs(np.quantile(got[:, 0], q) - np.quantile(ref[:, 0], q)) < 0.05
        assert abs(np.quantile(np.log(got[:, 1]), q) - np.quantile(np.log(ref[:, 1]), q)) < 0.05


def test_sample_decoder_auto_draws_the_same_boxes_and_flips_as_pil():
    """Below the reduction threshold today's path crops the full image: the same seed then gives
    the same box and flip on both paths, so their outputs differ only by decoder and resize."""
    blobs = [jpeg(textured(420 - 9 * i, 380 + 7 * i, seed=i)) for i in range(12)]
    old = SampleDecoder(image_size=224, train=True, decoder="pil", seed=5)
    new = SampleDecoder(image_size=224, train=True, decoder="auto", seed=5)
    for dec in (old, new):
        dec.set_context(2, 0, 0)
    for i, data in enumerate(blobs):
        a, _ = old(data, "jpg", 0, f"img{i}")
        b, _ = new(data, "jpg", 0, f"img{i}")
        assert a.shape == b.shape == (3, 224, 224)
        assert mad(a, b) < MAX_MAD, i
        assert mad(a, b.flip(2)) > 3 * mad(a, b)  # the flip agrees too


# ---------------------------------------------------------------------------------------------
# Pixel difference against today's full-decode path, same box


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (1600, 1200)])
def test_fused_output_is_within_a_small_mad_of_full_decode(size):
    data = jpeg(textured(*size, seed=size[0]), quality=90)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    transform = TrainTransform(224, flip=False, resample="antialias")
    rng = make_rng(0, 0, 0, 0)
    diffs = []
    for _ in range(20):
        box = transform.sample_crop(full.shape[0], full.shape[1], rng)
        top, left, bh, bw = box
        window = decode_crop(data, crop=lambda h, w, box=box: box, min_side=224)
        out = transform.finish(window).permute(1, 2, 0).numpy()
        ref = area_resize(full[top : top + bh, left : left + bw], 224, 224)
        diffs.append(mad(out, ref))
    assert np.mean(diffs) < MAX_MAD and max(diffs) < 2 * MAX_MAD


def test_eval_path_within_a_small_mad_of_todays():
    for i, size in enumerate([(500, 375), (375, 500), (1024, 768)]):
        data = jpeg(textured(*size, seed=i))
        full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        h, w = full.shape[:2]
        nh, nw = (224, round(w * 224 / h)) if h <= w else (round(h * 224 / w), 224)
        resized = area_resize(full, nw, nh)
        top, left = (nh - 224) // 2, (nw - 224) // 2
        ref = resized[top : top + 224, left : left + 224]
        out, _ = SampleDecoder(image_size=224, decoder="auto")(data, "jpg", 0, "x")
        assert mad(out.permute(1, 2, 0), ref) < MAX_MAD


def test_eval_transform_antialias_matches_area_shape_and_values():
    img = textured(333, 250)
    a = EvalTransform(100, 120)(img)
    b = EvalTransform(100, 120, resample="antialias")(img)
    assert a.shape == b.shape == (3, 100, 100) and b.is_contiguous()
    assert mad(a, b) < MAX_MAD
    with pytest.raises(ValueError, match="resample"):
        EvalTransform(100, resample="cubic")


@pytest.mark.parametrize("case", ["xmp-only", "exif-and-xmp", "exif-long", "two-exif-tags"])
def test_fast_header_reads_orientation_as_pillow_does(case):
    """The Pillow-free header probe agrees with Pillow's getexif, or hands the file to Pillow."""
    arr = textured(60, 40)
    img = Image.fromarray(arr)
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
    exif = Image.Exif()
    kwargs: dict = {}
    if case == "xmp-only":
        kwargs["xmp"] = xmp
    elif case == "exif-and-xmp":
        exif[0x0112] = 3
        kwargs.update(exif=exif, xmp=xmp)
    elif case == "exif-long":
        exif[0x010F] = "maker"
        exif[0x0112] = 8
        kwargs["exif"] = exif
    else:
        exif[0x0110] = "model"
        exif[0x0112] = 5
        exif[0x0131] = "software"
        kwargs["exif"] = exif
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95, **kwargs)
    data = buf.getvalue()
    ref = pillow_upright(data)
    out = decode_image(data, decoder="simplejpeg")
    assert out.shape == ref.shape and mad(out, ref) < 1.0
    seen = []
    decode_crop(data, crop=lambda h, w: seen.append((h, w)) or (0, 0, h, w), min_side=8)
    assert seen == [ref.shape[:2]]
