"""Images that hold less data than their header promises, and decompression bombs.

Every input is planted here: PNGs built chunk by chunk (IHDR, IDAT from ``zlib``), a JPEG cut
short with an end-of-image marker appended, TIFF and JPEG headers declaring 10000 x 10000 pixels
in a few hundred bytes. Expectations come from the planted headers (rows promised, sizes), never
from the decoder under test.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfeed.convert.cli import main as cli
from shardfeed.readers import open_dataset
from shardfeed.readers.decode.image import DECODERS, DEFAULT_MAX_DECODE_BYTES, decode_crop, decode_image
from shardfeed.readers.errors import ImageTooLargeError
from shardfeed.readers.errors import CorruptDataError

ROWS, COLS = 40, 30


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png(width: int, height: int, raw: bytes, *, colour: int = 2, depth: int = 8) -> bytes:
    """A PNG whose IHDR says ``width x height`` and whose one IDAT holds ``raw`` (filtered rows), deflated whole."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw))
            + _chunk(b"IEND", b""))


def _rows(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(b"\0" + rng.integers(0, 256, COLS * 3, dtype=np.uint8).tobytes() for _ in range(n))


def _short_png() -> bytes:
    """40 rows promised, 25 in a zlib stream that ends cleanly."""
    return _png(COLS, ROWS, _rows(25))


def _jpeg(size=(240, 320), seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size[0], 0:size[1]]
    arr = np.stack([xx % 256, yy % 256, (xx ^ yy) % 256], -1).astype(np.uint8)
    arr = np.clip(arr.astype(int) + rng.integers(-20, 21, arr.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _forged_eoi_jpeg() -> bytes:
    """A JPEG cut in the middle of its scan data, with an end-of-image marker appended."""
    data = _jpeg()
    sos = data.find(b"\xff\xda")
    cut = sos + (len(data) - sos) // 2
    return data[:cut] + b"\xff\xd9"


TRUNCATED = {"png-too-few-rows": _short_png, "jpeg-forged-eoi": _forged_eoi_jpeg}


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("kind", sorted(TRUNCATED))
def test_an_image_with_less_data_than_its_header_is_refused_by_every_backend(kind, decoder):
    data = TRUNCATED[kind]()
    with pytest.raises(CorruptDataError, match=r"planted\.img.*truncated"):
        decode_image(data, decoder=decoder, source="planted.img")
    with pytest.raises(CorruptDataError, match="truncated"):
        decode_crop(data, crop=lambda h, w: (0, 0, h, w), min_side=8, decoder=decoder, source="planted.img")


@pytest.mark.parametrize("decoder", DECODERS)
def test_the_whole_images_still_decode(decoder):
    full = _png(COLS, ROWS, _rows(ROWS))
    expected = np.frombuffer(_rows(ROWS), np.uint8).reshape(ROWS, 1 + COLS * 3)[:, 1:].reshape(ROWS, COLS, 3)
    assert np.array_equal(decode_image(full, decoder=decoder), expected)  # filter 0: the raw rows themselves
    jpg = _jpeg()
    out = decode_image(jpg, decoder=decoder)
    with Image.open(io.BytesIO(jpg)) as im:
        ref = np.asarray(im.convert("RGB")).astype(int)
    assert out.shape == ref.shape and np.abs(out.astype(int) - ref).mean() < 2


def _image_folder(root: Path, planted: dict[str, bytes]) -> Path:
    src = root / "src"
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
    for i in range(4):
        (src / "a" / f"good{i}.png").write_bytes(_png(COLS, ROWS, _rows(ROWS, seed=i)))
        (src / "b" / f"good{i}.jpg").write_bytes(_jpeg(seed=i))
    for name, data in planted.items():
        (src / name).write_bytes(data)
    return src


def test_pack_decode_check_and_check_decode_refuse_truncated_images(tmp_path):
    planted = {"a/short.png": _short_png(), "b/cut.jpg": _forged_eoi_jpeg()}
    src = _image_folder(tmp_path, planted)
    out = tmp_path / "packed"
    r = CliRunner().invoke(cli, ["-q", "pack", str(src), str(out), "--decode-check", "--on-error", "skip"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(s["path"] for s in manifest["skipped"]) == sorted(planted)
    assert manifest["num_samples"] == 8
    assert all("truncated" in s["reason"] for s in manifest["skipped"])

    unchecked = tmp_path / "unchecked"
    r = CliRunner().invoke(cli, ["-q", "pack", str(src), str(unchecked)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["check", str(unchecked), "--decode"])
    assert r.exit_code == 1
    for path in planted:
        assert path in r.output and "truncated" in r.output, r.output


# ---------------------------------------------------------------------------------------------
# decompression bombs: refused on the header, before any pixel buffer exists

def _png_bomb() -> bytes:
    """89 bytes declaring 10000 x 10000 RGB (300 MB of pixels)."""
    return _png(10_000, 10_000, b"\0")


def _tiff_bomb(sample_format: int) -> bytes:
    """A TIFF header declaring 10000 x 10000 32-bit samples (float: 3, signed int: 2), one tiny strip."""
    strip = bytes(64)
    entries = [(256, 4, 10_000), (257, 4, 10_000), (258, 3, 32), (259, 3, 1), (262, 3, 1), (273, 4, 0),
               (277, 3, 1), (278, 4, 10_000), (279, 4, len(strip)), (339, 3, sample_format)]
    ifd_size = 2 + 12 * len(entries) + 4
    data_offset = 8 + ifd_size
    ifd = struct.pack("<H", len(entries))
    for tag, typ, value in entries:
        if tag == 273:
            value = data_offset
        field = struct.pack("<HH", value, 0) if typ == 3 else struct.pack("<I", value)
        ifd += struct.pack("<HHI", tag, typ, 1) + field
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + strip


def _cmyk_jpeg_bomb() -> bytes:
    """A 16 x 16 CMYK JPEG whose frame header is patched to say 10000 x 10000."""
    buf = io.BytesIO()
    Image.new("CMYK", (16, 16), (10, 20, 30, 40)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 10_000, 10_000)
    return bytes(data)


BOMBS = {"png-89-bytes": _png_bomb, "tiff-float32": lambda: _tiff_bomb(3), "tiff-int32": lambda: _tiff_bomb(2),
         "jpeg-cmyk": _cmyk_jpeg_bomb}


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_a_bomb_is_refused_before_decoding(kind, decoder):
    data = BOMBS[kind]()
    assert len(data) < 2000
    with Image.open(io.BytesIO(data)) as im:  # what the planted header declares
        assert im.size == (10_000, 10_000)
    with pytest.raises(ImageTooLargeError, match=r"bomb\.img.*10000x10000.*max_decode_bytes"):
        decode_image(data, decoder=decoder, source="bomb.img")
    assert issubclass(ImageTooLargeError, ValueError)


_RSS_PROBE = """
import resource, sys
from shardfeed.readers.decode.image import decode_image
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    decode_image(data, decoder=sys.argv[2], source="bomb")
    outcome = "decoded"
except Exception as exc:
    outcome = type(exc).__name__
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(outcome, (after - before) * 1024)
"""


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_a_bomb_allocates_nothing_big(kind, tmp_path):
    """In a fresh process: the peak resident size grows by less than 32 MiB (the bombs would take 0.3-2 GB)."""
    path = tmp_path / "bomb"
    path.write_bytes(BOMBS[kind]())
    res = subprocess.run([sys.executable, "-P", "-c", _RSS_PROBE, str(path), "pil"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    outcome, grew = res.stdout.split()
    assert outcome == "ImageTooLargeError" and int(grew) < 32 << 20, res.stdout


def test_the_limit_is_configurable_and_skipped_under_skip(tmp_path):
    planted = {"a/bomb.png": _png_bomb()}
    src = _image_folder(tmp_path, planted)
    out = tmp_path / "packed"
    r = CliRunner().invoke(cli, ["-q", "pack", str(src), str(out), "--decode-check", "--on-error", "skip"])
    assert r.exit_code == 0, r.output
    assert [s["path"] for s in json.loads((out / "manifest.json").read_text())["skipped"]] == ["a/bomb.png"]

    # a small limit refuses the ordinary 320x240 JPEGs too (3 x 320 x 240 bytes and more), the PNGs pass
    r = CliRunner().invoke(cli, ["check", str(out), "--decode", "--max-decode-bytes", "100KB"])
    assert r.exit_code == 1 and r.output.count("over the limit max_decode_bytes") == 4, r.output
    assert CliRunner().invoke(cli, ["check", str(out), "--decode"]).exit_code == 0

    ds = open_dataset(out, shuffle=False, on_error="skip", max_decode_bytes=100_000)
    got = [s for s in ds]
    assert len(got) == 4 and ds.skipped == 4  # the four JPEGs
    assert all(img.shape == (3, ROWS, COLS) for img, _ in got)
    assert len(list(open_dataset(out, shuffle=False))) == 8

    r = CliRunner().invoke(cli, ["-q", "pack", str(src), str(tmp_path / "p2"), "--decode-check", "--on-error",
                                 "skip", "--max-decode-bytes", "100KB"])
    assert r.exit_code == 0, r.output
    skipped = json.loads((tmp_path / "p2" / "manifest.json").read_text())["skipped"]
    assert sorted(s["path"] for s in skipped) == sorted(["a/bomb.png"] + [f"b/good{i}.jpg" for i in range(4)])


def test_default_limit():
    assert DEFAULT_MAX_DECODE_BYTES == 512 << 20
