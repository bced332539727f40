"""Re-encoding while packing: ``--resize``, ``--resize-mode``, ``--upscale``, ``--quality``,
``--image-format``.

Expected sizes are computed by hand in the tests (the arithmetic is written next to each case);
expected pixels come from an independent Pillow resize of the source file; packed shards are read
back with the standard library's ``tarfile``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.write.reencode import ReencodeOptions, make_reencode_options, reencode_image, resize_size
from shardfeed.readers.errors import CorruptDataError

ORIENTATION = 0x0112


# ---------------------------------------------------------------------------------------------
# source images


def _texture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth photo-like RGB texture, uint8 [height, width, 3] (gradients, stripes, mild noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 0.5 + 0.5 * np.sin(xx / (7 + seed % 5) + yy / 23)
    g = 0.5 + 0.5 * np.cos(yy / (11 + seed % 3) - xx / 31)
    b = (xx + yy) / (width + height)
    img = np.stack([r, g, b], axis=-1) * 0.9 + rng.normal(0, 0.02, size=(height, width, 3))
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def _encode(img: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def _jpeg(width: int, height: int, seed: int = 0, **params) -> bytes:
    return _encode(Image.fromarray(_texture(width, height, seed)), "JPEG", quality=92, **params)


def _exif_rotated_jpeg(orientation: int = 6, width: int = 400, height: int = 300) -> bytes:
    """Stored ``width`` x ``height``, left half red and right half blue, with an EXIF orientation.

    Orientation 6 shows it rotated 90° clockwise: ``height`` wide, ``width`` tall, the stored left
    edge (red) on top. Orientation 8 rotates it 90° counter-clockwise: the stored left edge (red)
    at the bottom.
    """
    arr = np.zeros((height, width, 3), np.uint8)
    arr[:, : width // 2] = (255, 0, 0)
    arr[:, width // 2:] = (0, 0, 255)
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return _encode(Image.fromarray(arr), "JPEG", quality=95, exif=exif.tobytes())


SOURCES = {
    "landscape": lambda: _jpeg(640, 480, 1),
    "portrait": lambda: _jpeg(300, 500, 2),
    "tiny": lambda: _jpeg(40, 30, 3),
    "wide": lambda: _jpeg(300, 150, 4),
    "exif6": _exif_rotated_jpeg,
    "exif8_large": lambda: _exif_rotated_jpeg(8, 1200, 800),  # large enough for the reduced-size decode
}

# N = 200. Hand arithmetic (round half up):
#   landscape 640x480: shorter 480 -> 200, 640*200/480 = 266.67 -> 267; longer 640 -> 200, 480*200/640 = 150
#   portrait 300x500: shorter 300 -> 200, 500*200/300 = 333.33 -> 333; longer 500 -> 200, 300*200/500 = 120
#   tiny 40x30: every side below 200, kept; upscaled: 40*200/30 = 266.67 -> 267; 30*200/40 = 150
#   wide 300x150: shorter 150 < 200, kept (fit: cropped to 200x150); longer 300 -> 200, 150*200/300 = 100;
#                 upscaled shorter: 300*200/150 = 400
#   exif6: shown 300x400 (stored 400x300, rotated): like portrait, 400*200/300 = 266.67 -> 267; 300*200/400 = 150
#   exif8_large: shown 800x1200 (stored 1200x800): shorter 800 -> 200, 1200*200/800 = 300; longer: 800*200/1200
#                = 133.33 -> 133
EXPECTED = {
    ("shorter", False): {"landscape": (267, 200), "portrait": (200, 333), "tiny": (40, 30), "wide": (300, 150),
                         "exif6": (200, 267), "exif8_large": (200, 300)},
    ("shorter", True): {"landscape": (267, 200), "portrait": (200, 333), "tiny": (267, 200), "wide": (400, 200),
                        "exif6": (200, 267), "exif8_large": (200, 300)},
    ("longer", False): {"landscape": (200, 150), "portrait": (120, 200), "tiny": (40, 30), "wide": (200, 100),
                        "exif6": (150, 200), "exif8_large": (133, 200)},
    ("longer", True): {"landscape": (200, 150), "portrait": (120, 200), "tiny": (200, 150), "wide": (200, 100),
                       "exif6": (150, 200), "exif8_large": (133, 200)},
    ("fit", False): {"landscape": (200, 200), "portrait": (200, 200), "tiny": (40, 30), "wide": (200, 150),
                     "exif6": (200, 200), "exif8_large": (200, 200)},
    ("fit", True): {"landscape": (200, 200), "portrait": (200, 200), "tiny": (200, 200), "wide": (200, 200),
                    "exif6": (200, 200), "exif8_large": (200, 200)},
}


@pytest.fixture(scope="module")
def sources() -> dict[str, bytes]:
    return {name: make() for name, make in SOURCES.items()}


def _decode(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


# ---------------------------------------------------------------------------------------------
# sizes and orientation


@pytest.mark.parametrize("mode,upscale", sorted(EXPECTED))
def test_output_sizes_for_each_resize_mode(sources, mode, upscale):
    options = ReencodeOptions(resize=200, resize_mode=mode, upscale=upscale)
    for name, data in sources.items():
        r = reencode_image(data, options, source=name)
        img = _decode(r.data)
        assert img.size == EXPECTED[(mode, upscale)][name], (name, mode, upscale)
        assert (r.width, r.height) == img.size
        assert img.format == "JPEG" and r.ext == "jpg" and img.mode == "RGB"


def test_fit_crops_the_center():
    # 600x200: thirds red | green | blue. fit 100: scaled to 300x100 (shorter side 200 -> 100), then
    # cropped from left = (300 - 100) // 2 = 100 to 200: exactly the green third.
    arr = np.zeros((200, 600, 3), np.uint8)
    arr[:, :200], arr[:, 200:400], arr[:, 400:] = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    data = _encode(Image.fromarray(arr), "PNG")
    img = _decode(reencode_image(data, ReencodeOptions(resize=100, resize_mode="fit", image_format="png")).data)
    assert img.size == (100, 100)
    out = np.asarray(img.convert("RGB")).astype(int)
    inner = out[:, 3:-3].reshape(-1, 3)  # away from the Lanczos ringing at the band edges
    assert inner[:, 1].min() >= 250 and inner[:, [0, 2]].max() <= 5


def test_resize_size_rounds_half_up():
    # 300x200, shorter side 200 -> 75: 300 * 75 / 200 = 112.5 -> 113 (Python's round() would give 112)
    assert resize_size(300, 200, 75) == (113, 75)
    assert resize_size(200, 300, 75) == (75, 113)
    # square: both sides N in every mode
    for mode in ("shorter", "longer", "fit"):
        assert resize_size(512, 512, 128, mode) == (128, 128)


@pytest.mark.parametrize("name,shown,top_is_red", [("exif6", (300, 400), True), ("exif8_large", (800, 1200), False)])
def test_exif_orientation_applied_and_tag_dropped(sources, name, shown, top_is_red):
    for options in (ReencodeOptions(resize=200), ReencodeOptions(resize=200, draft=False), ReencodeOptions(quality=90)):
        r = reencode_image(sources[name], options)
        img = _decode(r.data)
        assert img.getexif().get(ORIENTATION) is None
        assert (r.orig_width, r.orig_height) == shown
        w, h = img.size
        assert h > w
        arr = np.asarray(img.convert("RGB")).astype(int)
        top, bottom = arr[: h // 4].reshape(-1, 3).mean(0), arr[-h // 4:].reshape(-1, 3).mean(0)
        red, blue = (top, bottom) if top_is_red else (bottom, top)
        assert red[0] > 200 and red[2] < 60, (name, red)
        assert blue[2] > 200 and blue[0] < 60, (name, blue)


def test_icc_profile_and_exif_metadata_are_dropped():
    from PIL import ImageCms

    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    exif = Image.Exif()
    exif[0x010F] = "CameraMaker"
    data = _encode(Image.fromarray(_texture(320, 240)), "JPEG", quality=90, icc_profile=icc, exif=exif.tobytes())
    assert "icc_profile" in _decode(data).info
    for fmt in ("jpg", "png", "webp"):
        img = _decode(reencode_image(data, ReencodeOptions(resize=100, image_format=fmt)).data)
        assert "icc_profile" not in img.info and "exif" not in img.info and not img.getexif(), fmt


# ---------------------------------------------------------------------------------------------
# modes and formats


def test_16bit_png_becomes_8bit_by_the_high_byte():
    yy, xx = np.mgrid[0:48, 0:64]
    v = ((xx * 1000 + yy * 37) % 65536).astype(np.uint16)
    data = _encode(Image.fromarray(v), "PNG")
    assert _decode(data).mode.startswith("I;16")
    # no resize, lossless output: the documented rule exactly, v >> 8, one grey channel
    r = reencode_image(data, ReencodeOptions(image_format="png"))
    img = _decode(r.data)
    assert (r.ext, img.format, img.mode, img.size) == ("png", "PNG", "L", (64, 48))
    np.testing.assert_array_equal(np.asarray(img), (v >> 8).astype(np.uint8))
    assert (r.orig_width, r.orig_height, r.orig_format) == (64, 48, "png")
    # resized with the default format: greyscale JPEG
    r = reencode_image(data, ReencodeOptions(resize=24))
    img = _decode(r.data)
    assert (r.ext, img.format, img.mode, img.size) == ("jpg", "JPEG", "L", (32, 24))  # 64*24/48 = 32


def test_cmyk_jpeg_becomes_rgb_jpeg():
    cmyk = Image.new("CMYK", (120, 80), (0, 0, 0, 0))              # right half: no ink, white
    cmyk.paste((255, 0, 0, 0), (0, 0, 60, 80))                       # left half: full cyan
    data = _encode(cmyk, "JPEG", quality=95)
    assert _decode(data).mode == "CMYK"
    r = reencode_image(data, ReencodeOptions(resize=40))
    img = _decode(r.data)
    assert (r.ext, img.format, img.mode, img.size) == ("jpg", "JPEG", "RGB", (60, 40))  # 120*40/80 = 60
    assert r.orig_format == "jpg"
    arr = np.asarray(img).astype(int)
    np.testing.assert_allclose(arr[:, 5:25].reshape(-1, 3).mean(0), (0, 255, 255), atol=10)     # cyan
    np.testing.assert_allclose(arr[:, 35:55].reshape(-1, 3).mean(0), (255, 255, 255), atol=10)  # white


def _rgba_png() -> bytes:
    arr = np.zeros((80, 120, 4), np.uint8)
    arr[:, :60] = (200, 30, 30, 255)   # opaque red
    arr[:, 60:] = (0, 0, 0, 0)         # fully transparent
    return _encode(Image.fromarray(arr, "RGBA"), "PNG")


def test_rgba_png_stays_png_with_alpha():
    r = reencode_image(_rgba_png(), ReencodeOptions(resize=40))
    img = _decode(r.data)
    assert (r.ext, img.format, img.mode, img.size) == ("png", "PNG", "RGBA", (60, 40))
    alpha = np.asarray(img)[..., 3]
    assert alpha[:, :25].min() == 255 and alpha[:, 35:].max() == 0


def test_rgba_asked_as_jpeg_is_composited_over_white():
    r = reencode_image(_rgba_png(), ReencodeOptions(resize=40, image_format="jpg"))
    img = _decode(r.data)
    assert (img.format, img.mode) == ("JPEG", "RGB")
    arr = np.asarray(img).astype(int)
    np.testing.assert_allclose(arr[:, 5:25].reshape(-1, 3).mean(0), (200, 30, 30), atol=10)
    np.testing.assert_allclose(arr[:, 38:58].reshape(-1, 3).mean(0), (255, 255, 255), atol=6)


def test_opaque_alpha_counts_as_rgb_and_webp_output():
    arr = np.dstack([_texture(90, 60), np.full((60, 90), 255, np.uint8)])
    data = _encode(Image.fromarray(arr, "RGBA"), "PNG")
    r = reencode_image(data, ReencodeOptions(resize=30))
    assert (r.ext, _decode(r.data).mode) == ("jpg", "RGB")
    r = reencode_image(data, ReencodeOptions(resize=30, image_format="webp", quality=80))
    img = _decode(r.data)
    assert (r.ext, img.format, img.size) == ("webp", "WEBP", (45, 30))


def test_keep_format_and_quality_only(sources):
    png = _encode(Image.fromarray(_texture(64, 48)), "PNG")
    r = reencode_image(png, ReencodeOptions(quality=50))  # no resize: keep the format, lossless PNG
    img = _decode(r.data)
    assert (r.ext, img.format, img.size) == ("png", "PNG", (64, 48))
    np.testing.assert_array_equal(np.asarray(img), np.asarray(_decode(png).convert("RGB")))
    r50 = reencode_image(sources["landscape"], ReencodeOptions(quality=50))
    r95 = reencode_image(sources["landscape"], ReencodeOptions(quality=95))
    assert r50.ext == r95.ext == "jpg" and len(r50.data) < len(r95.data)
    bmp = _encode(Image.fromarray(_texture(32, 24)), "BMP")
    r = reencode_image(bmp, ReencodeOptions(resize=12, image_format="keep"))  # BMP is not kept: PNG
    assert (r.ext, r.orig_format, _decode(r.data).size) == ("png", "bmp", (16, 12))


def test_options_validation():
    assert make_reencode_options() is None
    assert make_reencode_options(image_format="keep") is None
    assert make_reencode_options(quality=80) == ReencodeOptions(quality=80)
    with pytest.raises(ValueError, match="--upscale needs --resize"):
        make_reencode_options(upscale=True)
    with pytest.raises(ValueError, match="resize_mode"):
        ReencodeOptions(resize=10, resize_mode="cover")
    with pytest.raises(ValueError, match="quality"):
        ReencodeOptions(quality=0)
    with pytest.raises(ValueError, match="image_format"):
        ReencodeOptions(image_format="gif")
    assert ReencodeOptions(image_format="JPEG").image_format == "jpg"
    with pytest.raises(CorruptDataError, match="broken.jpg"):
        reencode_image(b"\xff\xd8\xff garbage", ReencodeOptions(resize=10), source="broken.jpg")


# ---------------------------------------------------------------------------------------------
# pixels


@pytest.mark.parametrize("draft,fmt,bound", [(False, "png", 0.5), (True, "png", 1.0), (True, "jpg", 5.0)])
def test_resized_pixels_close_to_an_independent_pillow_resize(draft, fmt, bound):
    """Mean absolute error, in 0..255 levels per channel, against Pillow's full-size Lanczos resize.

    The source is a 1024x768 JPEG; the target 341x256 (1024*256/768 = 341.33) is a third of it,
    so the draft path decodes at 1/2 scale. Bounds: stored losslessly (PNG) without draft, the
    resize is the reference's own operation (measured 0.0); with draft the reduced-size decode
    adds about 0.6 level (bound 1.0); stored as JPEG q90 (4:2:0) this noisy striped texture loses
    about 3.8 levels more (bound 5.0).
    """
    data = _jpeg(1024, 768, 5)
    r = reencode_image(data, ReencodeOptions(resize=256, draft=draft, image_format=fmt))
    got = np.asarray(_decode(r.data).convert("RGB"), dtype=np.float64)
    ref = _decode(data).convert("RGB").resize((341, 256), Image.Resampling.LANCZOS)
    mae = np.abs(got - np.asarray(ref, dtype=np.float64)).mean()
    assert got.shape == (256, 341, 3)
    assert mae < bound, mae


# ---------------------------------------------------------------------------------------------
# packing


def _exif_jpeg_file(orientation: int, size: tuple[int, int], seed: int) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return _jpeg(*size, seed, exif=exif.tobytes())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes, 42 images: JPEGs and PNGs of assorted sizes, an RGBA PNG, EXIF-rotated JPEGs."""
    root = tmp_path_factory.mktemp("reencode") / "src"
    rng = np.random.default_rng(7)
    for i in range(42):
        cls = root / ("ant", "bee", "cat")[i % 3]
        cls.mkdir(parents=True, exist_ok=True)
        w, h = (int(v) for v in rng.integers(20, 180, size=2))
        if i == 5:
            (cls / f"img{i:02d}.png").write_bytes(_rgba_png())
        elif i in (7, 8):
            (cls / f"img{i:02d}.jpg").write_bytes(_exif_jpeg_file(6 if i == 7 else 8, (w, h), i))
        elif i % 4 == 1:
            (cls / f"img{i:02d}.png").write_bytes(_encode(Image.fromarray(_texture(w, h, i)), "PNG"))
        else:
            (cls / f"img{i:02d}.jpg").write_bytes(_jpeg(w, h, i))
    return root


def _expected_size(path: Path, n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(shown size, output size for --resize n, mode shorter): computed here from the file itself."""
    with Image.open(path) as img:
        w, h = img.size
        if img.getexif().get(ORIENTATION, 1) in (5, 6, 7, 8):
            w, h = h, w
    short = min(w, h)
    if short <= n:
        return (w, h), (w, h)
    if w == short:
        return (w, h), (n, int(h * n / short + 0.5))
    return (w, h), (int(w * n / short + 0.5), n)


def _read_tar_samples(out: Path) -> list[tuple[str, str, dict]]:
    """(shard name, key, {ext: bytes}) for every sample, in order, with the stdlib tarfile."""
    samples = []
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                if not samples or samples[-1][1] != key:
                    samples.append((tar_path.name, key, {}))
                samples[-1][2][ext] = tf.extractfile(m).read()
    return samples


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()}


MAX_COUNT, MAX_BYTES = 9, 24_000


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "wds"
    pack(folder, out, PackOptions(workers=1, max_count=MAX_COUNT, max_bytes=MAX_BYTES,
                                  reencode=ReencodeOptions(resize=64)))
    return out


def test_pack_resize_images_decode_to_the_right_sizes(folder, packed):
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    samples = _read_tar_samples(packed)
    assert len(samples) == 42
    for _, _key, members in samples:
        meta = json.loads(members["json"])
        src = folder / meta["path"]
        shown, expected = _expected_size(src, 64)
        image_ext = next(e for e in members if e not in ("cls", "json"))
        img = _decode(members[image_ext])
        assert img.size == expected, meta["path"]
        assert img.getexif().get(ORIENTATION) is None
        assert (meta["orig_width"], meta["orig_height"]) == shown
        assert meta["orig_format"] == {".jpg": "jpg", ".png": "png"}[src.suffix]
        assert int(members["cls"]) == classes.index(src.parent.name) and meta["class"] == src.parent.name
        if meta["path"].endswith("img05.png"):
            assert (image_ext, img.mode) == ("png", "RGBA")
        else:
            assert (image_ext, img.format) == ("jpg", "JPEG")
    manifest = json.loads((packed / "manifest.json").read_text())
    re_opts = manifest["options"]["reencode"]
    assert (re_opts["resize"], re_opts["resize_mode"], re_opts["quality"]) == (64, "shorter", 90)
    assert manifest["num_samples"] == 42


def test_pack_resize_respects_max_bytes_and_max_count(packed):
    """Every shard <= max_bytes; each shard closed only because the next sample would not fit."""
    shards = sorted(packed.glob("*.tar"))
    assert len(shards) > 42 // MAX_COUNT  # max_bytes cut some shards short
    sample_bytes: dict[str, list[int]] = {}
    for p in shards:
        assert p.stat().st_size <= MAX_BYTES, p.name
        with tarfile.open(p) as tf:
            members = tf.getmembers()
        per_sample: dict[str, int] = {}
        for m in members:
            per_sample[m.name.split(".")[0]] = per_sample.get(m.name.split(".")[0], 0) + 512 + -(-m.size // 512) * 512
        sample_bytes[p.name] = list(per_sample.values())
        assert p.stat().st_size == 1024 + sum(per_sample.values())
    names = [p.name for p in shards]
    for a, b in zip(names, names[1:]):
        full = len(sample_bytes[a]) == MAX_COUNT
        overflow = 1024 + sum(sample_bytes[a]) + sample_bytes[b][0] > MAX_BYTES
        assert full or overflow, a


@pytest.mark.multiprocess
def test_pack_resize_byte_identical_for_1_and_2_workers(folder, packed, tmp_path):
    out2 = tmp_path / "w2"
    pack(folder, out2, PackOptions(workers=2, max_count=MAX_COUNT, max_bytes=MAX_BYTES,
                                   reencode=ReencodeOptions(resize=64)))
    assert _digests(out2) == _digests(packed)


def test_pack_resize_resume_after_interrupt_is_byte_identical(folder, packed, tmp_path):
    out = tmp_path / "resumed"
    options = dict(workers=1, max_count=MAX_COUNT, max_bytes=MAX_BYTES, reencode=ReencodeOptions(resize=64))
    calls = []

    def interrupt(n, b):
        calls.append(n)
        if len(calls) == 1:  # after the first chunk of 32 samples (of 42), inside a shard
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(folder, out, PackOptions(**options), progress=interrupt)
    assert not (out / "manifest.json").exists()
    assert not list(out.glob(".*.tmp"))
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    assert kept
    report = pack(folder, out, PackOptions(**options, resume=True))
    assert report.shards_resumed == len(kept)
    assert all(out.joinpath(n).stat().st_mtime_ns == t for n, t in kept.items())  # not rewritten
    assert _digests(out) == _digests(packed)


def test_pack_without_reencode_records_no_reencode_options(folder, tmp_path):
    pack(folder, tmp_path / "plain", PackOptions(workers=1))
    assert "reencode" not in json.loads((tmp_path / "plain" / "manifest.json").read_text())["options"]


def test_pack_resize_skips_or_names_a_broken_image(folder, tmp_path):
    src = tmp_path / "src"
    for p in folder.rglob("*.jpg"):
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        (src / p.parent.name / p.name).write_bytes(p.read_bytes())
    (src / "ant" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    seen, stored = [], []  # input progress counts every file; output progress the re-encoded bytes
    report = pack(src, tmp_path / "skip", PackOptions(workers=1, on_error="skip", reencode={"resize": 32}),
                  progress=lambda n, b: seen.append((n, b)), output_progress=stored.append)
    assert [s["path"] for s in report.skipped] == ["ant/broken.jpg"]
    files = list(src.rglob("*.jpg"))
    assert sum(n for n, _ in seen) == len(files) and sum(b for _, b in seen) == sum(f.stat().st_size for f in files)
    image_bytes = 0
    for shard in (tmp_path / "skip").glob("*.tar"):
        with tarfile.open(shard) as tar:
            image_bytes += sum(m.size for m in tar.getmembers() if not m.name.endswith((".cls", ".json")))
    assert sum(stored) == image_bytes
    manifest = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    assert [s["path"] for s in manifest["skipped"]] == ["ant/broken.jpg"]
    with pytest.raises(CorruptDataError, match="broken.jpg"):
        pack(src, tmp_path / "fail", PackOptions(workers=1, reencode={"resize": 32}))


def test_cli_pack_resize(folder, tmp_path):
    from shardfeed.convert.cli import main

    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(main, ["-q", "pack", str(folder), str(out), "--resize", "48", "--resize-mode", "fit",
                               "--upscale", "--quality", "80", "-j", "1", "--json", "-"])
    assert res.exit_code == 0, res.output
    opts = json.loads((out / "manifest.json").read_text())["options"]["reencode"]
    assert (opts["resize"], opts["resize_mode"], opts["upscale"], opts["quality"]) == (48, "fit", True, 80)
    for _, _, members in _read_tar_samples(out):
        ext = next(e for e in members if e not in ("cls", "json"))
        assert _decode(members[ext]).size == (48, 48)  # fit + upscale: always NxN
    res = runner.invoke(main, ["pack", str(folder), str(tmp_path / "bad"), "--upscale"])
    assert res.exit_code == 2 and "--upscale needs --resize" in res.output
