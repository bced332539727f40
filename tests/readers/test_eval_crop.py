"""The built-in evaluation transform (``resize_size``/``crop_pct``): crop first, against resize-then-crop.

The references are computed here, independently of shardfeed: the JPEG decoded whole by Pillow,
the shorter side resized to ``resize_size`` by Pillow's bilinear filter (antialiased) or by
``torch.nn.functional.interpolate(antialias=True)``, then the central crop cut.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from shardfeed.readers import make_loader, open_dataset
from shardfeed.readers.decode.transforms import EvalTransform, SampleDecoder, resize_size_for

DECODERS = ("simplejpeg", "pil", "cv2")
#: Grey levels (0..255) the crop-first output may differ from resize-then-crop: its box edges are
#: within half a source pixel of the exact ones, and a reduced-scale decode filters differently
MEAN_BOUND, MAX_BOUND = 1.5, 16


def natural_image(height: int, width: int, seed: int) -> np.ndarray:
    """A photo-like RGB image: a few smooth waves per channel and a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.full((height, width, 3), 128.0, np.float32)
    for c in range(3):
        for _ in range(6):
            fx, fy = rng.uniform(0.002, 0.06, 2)
            img[..., c] += rng.uniform(10, 40) * np.sin(fx * xx + fy * yy + rng.uniform(0, 6.3))
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode_jpeg(rgb: np.ndarray, orientation: int | None = None) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(rgb)
    if orientation is None:
        im.save(buf, "JPEG", quality=95)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        im.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def reference_torch(data: bytes, size: int, resize: int) -> torch.Tensor:
    """Pillow decode (EXIF applied), torch antialiased bilinear to shorter side ``resize``, central crop."""
    from PIL import ImageOps

    rgb = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    h, w = rgb.shape[:2]
    nh, nw = (resize, int(w * resize / h + 0.5)) if h <= w else (int(h * resize / w + 0.5), resize)
    x = torch.from_numpy(rgb.copy()).permute(2, 0, 1)[None]
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)[0]
    top, left = (nh - size) // 2, (nw - size) // 2
    return x[:, top : top + size, left : left + size]


def reference_pil(data: bytes, size: int, resize: int) -> torch.Tensor:
    """torchvision's PIL path: Resize(resize) with Pillow's bilinear, CenterCrop(size) (rounded corner)."""
    im = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = im.size
    nh, nw = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
    im = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return torch.from_numpy(np.asarray(im)[top : top + size, left : left + size].copy()).permute(2, 0, 1)


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    d = (a.int() - b.int()).abs()
    return float(d.float().mean()), int(d.max())


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("shape", [(375, 500), (500, 375), (333, 500), (900, 1200), (1600, 2000), (240, 250)])
def test_eval_crop_first_matches_resize_then_crop(decoder, shape):
    # (900, 1200) and (1600, 2000) keep 787 and 1400 source pixels across the crop: decoded at 1/2 and 1/4
    data = encode_jpeg(natural_image(*shape, seed=shape[0]))
    out, label = SampleDecoder(224, resize_size=256, decoder=decoder)(data, "jpg", 7, "planted.jpg")
    assert label == 7 and out.dtype == torch.uint8 and tuple(out.shape) == (3, 224, 224) and out.is_contiguous()
    mean, worst = _diff(out, reference_torch(data, 224, 256))
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (mean, worst)
    mean, worst = _diff(out, reference_pil(data, 224, 256))
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (mean, worst)


def test_eval_crop_first_follows_exif_orientation():
    rgb = natural_image(300, 480, seed=3)
    data = encode_jpeg(rgb, orientation=6)  # stored 480 wide, shown 300 wide (rotated 90 degrees)
    for decoder in DECODERS:
        out, _ = SampleDecoder(160, resize_size=192, decoder=decoder)(data, "jpg", 0, "rotated.jpg")
        mean, worst = _diff(out, reference_torch(data, 160, 192))
        assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (decoder, mean, worst)


def test_eval_default_resize_is_image_size():
    data = encode_jpeg(natural_image(375, 500, seed=1))
    out, _ = SampleDecoder(224, decoder="simplejpeg")(data, "jpg", 0, "x")
    mean, worst = _diff(out, reference_torch(data, 224, 224))
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND


def test_eval_png_goes_through_the_same_crop():
    rgb = natural_image(260, 300, seed=5)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    data = buf.getvalue()
    out, _ = SampleDecoder(200, resize_size=228, decoder="auto")(data, "png", 0, "x.png")
    mean, worst = _diff(out, reference_torch(data, 200, 228))
    assert mean <= MEAN_BOUND and worst <= MAX_BOUND


def test_resize_size_names():
    assert resize_size_for(224, crop_pct=0.875) == 256  # timm: floor(224 / 0.875)
    assert resize_size_for(288, crop_pct=0.95) == 303
    assert resize_size_for(224, resize_size=256) == 256
    assert resize_size_for(224) == 224
    assert SampleDecoder(224, crop_pct=0.875).resize_size == 256
    assert SampleDecoder(224, resize_size=256, train=True).resize_size == 256  # training ignores it
    with pytest.raises(ValueError, match="not both"):
        resize_size_for(224, resize_size=256, crop_pct=0.875)
    with pytest.raises(ValueError, match="smaller than image_size"):
        resize_size_for(224, resize_size=200)
    for bad in (0, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match="crop_pct"):
            resize_size_for(224, crop_pct=bad)
    with pytest.raises(ValueError, match="image_size"):
        SampleDecoder(None, resize_size=256)


@pytest.mark.parametrize("shape", [(375, 500), (500, 375), (97, 1000), (224, 224), (256, 300)])
def test_source_box_is_the_resized_crop_mapped_back(shape):
    h, w = shape
    t = EvalTransform(224, 256)
    top, left, bh, bw = t.source_box(h, w)
    assert 0 <= top and 0 <= left and top + bh <= h and left + bw <= w and bh >= 1 and bw >= 1
    scale = min(h, w) / 256  # source pixels per resized pixel
    assert abs(bh - 224 * scale) <= 1 and abs(bw - 224 * scale) <= 1
    # centred like center_crop's corner ((new - 224) // 2), within that floor and one rounding
    assert abs(top + bh / 2 - h / 2) <= 0.5 + scale and abs(left + bw / 2 - w / 2) <= 0.5 + scale



def test_source_box_asked_again_or_after_a_size_change_is_still_the_mapped_crop():
    t = EvalTransform(224, 256)
    for _ in range(2):  # the second time from the transform's kept boxes
        for h, w in [(375, 500), (64, 96), (96, 64)]:
            top, left, bh, bw = t.source_box(h, w)
            scale = min(h, w) / 256
            assert abs(bh - 224 * scale) <= 1 and abs(bw - 224 * scale) <= 1
    t.resize_size = 320  # a later size is not answered with the box kept for the earlier one
    top, left, bh, bw = t.source_box(375, 500)
    assert abs(bh - 224 * 375 / 320) <= 1 and abs(bw - 224 * 375 / 320) <= 1

@pytest.mark.multiprocess
def test_loader_eval_resize_size_through_the_sources(tmp_path):
    from shardfeed.convert.write.pack import PackOptions, pack

    folder = tmp_path / "folder"
    planted = {}
    for c in range(2):
        (folder / f"class_{c}").mkdir(parents=True)
        for i in range(5):
            data = encode_jpeg(natural_image(300 + 20 * i, 420 - 10 * i, seed=10 * c + i))
            name = f"img_{c}_{i}.jpg"
            (folder / f"class_{c}" / name).write_bytes(data)
            planted[f"class_{c}/{name}"] = (c, reference_torch(data, 96, 110))
    pack(folder, tmp_path / "wds", PackOptions(format="wds", max_count=4, overwrite=True))
    pack(folder, tmp_path / "lmdb", PackOptions(format="lmdb", overwrite=True))
    refs = sorted(((lbl, ref) for lbl, ref in planted.values()), key=lambda p: (p[0], p[1].sum().item()))
    for source in (folder, tmp_path / "wds", tmp_path / "lmdb"):
        for workers in (0, 2):
            loader = make_loader(source, 4, num_workers=workers, shuffle=False, image_size=96, resize_size=110,
                                 train=False)
            got = [(int(lbl), img) for images, labels in loader for img, lbl in zip(images, labels)]
            got.sort(key=lambda p: (p[0], p[1].sum().item()))
            assert [lbl for lbl, _ in got] == [lbl for lbl, _ in refs], (source, workers)
            for (_, img), (_, ref) in zip(got, refs):
                mean, worst = _diff(img, ref)
                assert mean <= MEAN_BOUND and worst <= MAX_BOUND, (source, workers, mean, worst)
    ds = open_dataset(tmp_path / "wds", image_size=224, crop_pct=0.875)
    assert ds.sample_decoder.resize_size == 256


@pytest.mark.parametrize("shape", [(70, 90), (61, 61), (200, 300), (20, 30)])
def test_an_enlarged_window_is_the_exact_bilinear_rounded(shape):
    # (200, 300): one side grows, one shrinks: bilinear, not the area filter (resample="antialias"
    # filters the shrinking side instead); (20, 30): a window of under 32 rows takes OpenCV's 8-bit
    # kernel, whose fixed-point weights leave some pixels one grey level off
    window = natural_image(*shape, seed=shape[1])
    x = torch.from_numpy(window.copy()).permute(2, 0, 1)[None].double()
    exact = F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False)[0].round().to(torch.uint8)
    for resample in ("area", "antialias") if max(shape) <= 224 else ("area",):
        out = EvalTransform(224, resample=resample).finish(window)
        d = (out.int() - exact.int()).abs()
        off = float((d > 0).float().mean())
        assert int(d.max()) <= 1 and (off < 0.01 or shape[0] < 32), (resample, int(d.max()), off)
