"""The decoding backends and the conversion rule they share: a lazily opened image → ``uint8`` RGB.

Each backend (:data:`BACKENDS`: ``"pil"``, ``"cv2"``, ``"simplejpeg"``) takes the encoded bytes,
the image opened by Pillow on its header, the JPEG reduction factor and the name for messages, and
returns an ``(H, W, 3)`` ``uint8`` array, before EXIF orientation (:data:`ORIENT` applies it).
The rule they follow (colour, alpha over :data:`BACKGROUND`, bit depth, truncation checks) is
:mod:`shardfeed.readers.decode.image`'s; that module checks the limits and calls them.
"""

from __future__ import annotations

import logging
import struct
import zlib
from typing import Callable

import numpy as np
from PIL import Image

from ..errors import CorruptDataError, ImageTooLargeError
from .jpeg import is_truncation_warning, simplejpeg_available, simplejpeg_decode, simplejpeg_module

__all__ = ["BACKGROUND", "BACKENDS", "ORIENT", "JPEG_FORMATS", "CV2_FORMATS", "PIL_LOAD_ERRORS", "decode_pil",
           "import_cv2", "log_once"]

#: Logged under the decoding module's name, as every decoding message is.
logger = logging.getLogger("shardfeed.readers.decode.image")

#: Background grey level (0..255) that transparent pixels are composited over: white.
BACKGROUND: int = 255

#: Pillow formats of a JPEG (an MPO is a JPEG with more frames).
JPEG_FORMATS = frozenset({"JPEG", "MPO"})
#: Formats the cv2 backend decodes itself; anything else goes through Pillow.
CV2_FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP"})
#: Pillow modes whose alpha/transparency or bit depth needs ``IMREAD_UNCHANGED`` in cv2.
_CV2_UNCHANGED_MODES = frozenset(
    {"LA", "La", "RGBA", "RGBa", "PA", "I;16", "I;16B", "I;16L", "I;16N", "I"}
)
#: Pillow modes of a JPEG that simplejpeg decodes (colour and greyscale); CMYK goes to Pillow.
_SIMPLEJPEG_MODES = frozenset({"RGB", "L"})
#: What Pillow raises for damaged image data.
PIL_LOAD_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error)
_logged_once: set[str] = set()


def log_once(key: str, msg: str, *args: object) -> None:
    """Log ``msg`` at DEBUG the first time ``key`` is seen in this process."""
    if key not in _logged_once:
        _logged_once.add(key)
        logger.debug(msg, *args)


# ---------------------------------------------------------------------------------------------
# The shared conversion rule (numpy)


def _to_8bit(arr: np.ndarray) -> np.ndarray:
    """Bit-depth rule: uint16 → high byte; int → clip 0..65535, high byte; float → round, clip."""
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 2:
        return (arr >> 8).astype(np.uint8)
    if arr.dtype.kind in "iu":
        return (np.clip(arr, 0, 65535) >> 8).astype(np.uint8)
    if arr.dtype.kind == "f":
        return np.clip(np.rint(np.nan_to_num(arr)), 0, 255).astype(np.uint8)
    raise TypeError(f"unsupported sample type {arr.dtype}")


def _composite(color: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Composite ``color`` (H, W, C) uint8 over :data:`BACKGROUND` with ``alpha`` (H, W) uint8."""
    if alpha.min() == 255:
        return color
    a = alpha[..., None].astype(np.uint16)
    # color * a + 255 * (255 - a) <= 255 * 255, so uint16 cannot overflow.
    out = (color.astype(np.uint16) * a + BACKGROUND * (255 - a) + 127) // 255
    return out.astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=2)


ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],  # mirror left-right
    3: lambda a: a[::-1, ::-1],  # rotate 180
    4: lambda a: a[::-1],  # mirror top-bottom
    5: lambda a: a.swapaxes(0, 1),  # transpose
    6: lambda a: a.swapaxes(0, 1)[:, ::-1],  # rotate 90 clockwise
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),  # transverse
    8: lambda a: a.swapaxes(0, 1)[::-1],  # rotate 90 counter-clockwise
}


# ---------------------------------------------------------------------------------------------
# Backends: (data, lazily opened image, reduction factor, where) -> (H, W, 3) uint8 RGB array


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_missing_data(data: bytes) -> tuple[int, int] | None:
    """``(bytes the IDAT stream inflates to, bytes IHDR promises)`` when a PNG's image data holds
    fewer rows than its header declares (libpng: "Not enough image data"; Pillow pads with black),
    else None (complete, not a PNG, or damaged in a way Pillow reports itself).

    Inflates the IDAT chunks once, counting the output in 1 MiB pieces without keeping it.
    """
    if not data.startswith(_PNG_SIGNATURE):
        return None
    view = memoryview(data)
    pos, n = 8, len(data)
    expected = None
    inflate = zlib.decompressobj()
    got = 0
    try:
        while pos + 8 <= n:
            length = int.from_bytes(data[pos:pos + 4], "big")
            kind = data[pos + 4:pos + 8]
            body = pos + 8
            if kind == b"IHDR" and length >= 13:
                w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[body:body + 13])
                bpp = _PNG_CHANNELS.get(colour, 4) * depth
                passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
                expected = 0
                for x0, y0, dx, dy in passes:
                    pw, ph = -(-(w - x0) // dx) if w > x0 else 0, -(-(h - y0) // dy) if h > y0 else 0
                    if pw and ph:
                        expected += ph * (1 + -(-pw * bpp // 8))
            elif kind == b"IDAT" and expected is not None:
                chunk = view[body:body + length]
                while chunk:
                    got += len(inflate.decompress(chunk, 1 << 20))
                    chunk = inflate.unconsumed_tail
                    if got >= expected or inflate.eof:
                        return None if got >= expected else (got, expected)
            elif kind == b"IEND":
                break
            pos = body + length + 4
    except zlib.error:
        return None  # damaged deflate data: Pillow's decode reports it
    if expected is None or got >= expected:
        return None
    return got, expected


def _check_png_rows(data: bytes, img: Image.Image, where: str) -> None:
    if img.format != "PNG":
        return
    short = _png_missing_data(data)
    if short is not None:
        got, expected = short
        raise CorruptDataError(f"cannot decode image from {where}: truncated PNG (its image data holds {got:,} of "
                               f"the {expected:,} bytes its {img.size[0]}x{img.size[1]} header promises; the rows "
                               "after them are missing)")


def _png_tail_blank(img: Image.Image) -> bool:
    """Whether the last two rows of a loaded PNG are all zero bytes: where a PNG whose data ends
    early leaves Pillow's zeroed buffer untouched (the last row for a plain PNG, the last odd row,
    of Adam7's final pass, for an interlaced one). Only then is the data counted exactly."""
    w, h = img.size
    if not w or not h:
        return False
    return not np.asarray(img.crop((0, max(h - 2, 0), w, h))).any()


def _jpeg_tail_flat(rgb: np.ndarray, factor: int) -> bool:
    """Whether the bottom-right block of a decoded JPEG is flat (every channel within 2 levels):
    what libjpeg leaves where the scan data ran out (its last MCU is always among the missing
    ones: zero coefficients, grey, or flat at the last DC value). Only then is the scan checked."""
    if rgb.ndim != 3 or not rgb.size:
        return False
    b = max(1, 8 // factor)
    corner = rgb[-b:, -b:].reshape(-1, rgb.shape[2])
    return int((corner.max(axis=0).astype(np.int16) - corner.min(axis=0)).max()) <= 2


def _check_jpeg_scan(data: bytes, img: Image.Image, where: str) -> None:
    """Refuse a JPEG whose scan data ends before the image (libjpeg's "premature end of data
    segment", which Pillow and OpenCV pass over, filling grey). libjpeg reports it only while
    decoding, so simplejpeg (strict) decodes the scans at the smallest scale to hear it; the
    Pillow and OpenCV backends call it only when the decoded image's last block is flat
    (:func:`_jpeg_tail_flat`). Without simplejpeg installed, only a missing end-of-image marker is
    caught (the header check of :mod:`shardfeed.readers.decode.image`)."""
    if img.format not in JPEG_FORMATS or not simplejpeg_available():
        return
    try:
        simplejpeg_module().decode_jpeg(data, "GRAY", True, True, 1, 1)
    except ValueError as exc:
        if is_truncation_warning(str(exc)):
            raise CorruptDataError(f"cannot decode image from {where}: truncated JPEG (libjpeg: {exc}); the image "
                                   "data ends before the image does") from None
        # other warnings (extraneous bytes, an unsupported colour space): the backend decides


def decode_pil(data: bytes, img: Image.Image, factor: int, where: str) -> np.ndarray:
    try:
        if factor > 1:
            target = (img.size[0] // factor, img.size[1] // factor)  # draft picks this factor
            img.draft("RGB", target)
        img.load()
        if img.format == "PNG" and _png_tail_blank(img):
            _check_png_rows(data, img, where)
        rgb = _pil_to_rgb(img)
        if img.format in JPEG_FORMATS and _jpeg_tail_flat(rgb, factor):
            _check_jpeg_scan(data, img, where)
        return rgb
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"image from {where} is too large for Pillow: {exc}") from exc
    except PIL_LOAD_ERRORS as exc:
        raise CorruptDataError(
            f"cannot decode image from {where}: {type(exc).__name__}: {exc}"
        ) from exc


def _pil_to_rgb(img: Image.Image) -> np.ndarray:
    mode = img.mode
    keyed = "transparency" in img.info and mode in ("L", "RGB", "P")
    if mode == "RGB" and not keyed:
        return np.asarray(img)
    if mode == "L" and not keyed:
        return _gray_to_rgb(np.asarray(img))
    if mode.startswith("I") or mode == "F":  # I, I;16, I;16B, I;16L, I;16N, F
        return _gray_to_rgb(_to_8bit(np.asarray(img)))
    if mode == "LA":
        arr = np.asarray(img)
        return _gray_to_rgb(_composite(arr[..., :1], arr[..., 1])[..., 0])
    if mode == "La":
        return _pil_to_rgb(img.convert("LA"))
    if mode == "RGBA":
        arr = np.asarray(img)
        return _composite(arr[..., :3], arr[..., 3])
    if keyed or mode in ("PA", "RGBa"):
        return _pil_to_rgb(img.convert("RGBA"))
    # P without transparency, 1, CMYK, YCbCr, LAB, HSV, RGBX: Pillow's own conversion.
    return np.asarray(img.convert("RGB"))


def import_cv2(purpose: str):
    """``cv2``, or an ImportError saying what needs it and how to install it.

    OpenCV is not a dependency of ``pip install shardfeed`` (it comes in two distributions,
    ``opencv-python`` and ``opencv-python-headless``, that replace each other's ``cv2``): any one
    of them works.

    Args:
        purpose: what needs OpenCV, for the message (``'decoder="cv2"'``).
    """
    try:
        import cv2
    except ImportError as exc:
        raise ImportError(f"{purpose} needs OpenCV, which is not installed: pip install 'shardfeed[opencv]' "
                          "(opencv-python-headless) or any OpenCV distribution (opencv-python ...); or use "
                          "decoder='auto' (simplejpeg + torch resizing, no OpenCV)") from exc
    return cv2


def _decode_cv2(data: bytes, img: Image.Image, factor: int, where: str) -> np.ndarray:
    cv2 = import_cv2('decoder="cv2"')

    mode = img.mode
    if img.format not in CV2_FORMATS or ("transparency" in img.info and mode not in ("RGB", "P")):
        log_once(
            f"cv2-fallback-{img.format}-{mode}",
            "cv2 decoder: %s images in mode %s (transparency=%s) are decoded with Pillow",
            img.format,
            mode,
            "transparency" in img.info,
        )
        return decode_pil(data, img, factor, where)

    if mode in _CV2_UNCHANGED_MODES or "transparency" in img.info:
        flags = cv2.IMREAD_UNCHANGED  # keeps alpha and 16 bits, ignores EXIF orientation
    elif factor > 1:
        flags = _cv2_reduced_flag(cv2, factor) | cv2.IMREAD_IGNORE_ORIENTATION
    else:
        flags = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
    try:
        arr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    except cv2.error as exc:
        raise CorruptDataError(f"cannot decode image from {where}: OpenCV: {exc}") from exc
    if arr is None:
        _check_png_rows(data, img, where)  # libpng's "Not enough image data": name it precisely
        raise CorruptDataError(f"cannot decode image from {where}: OpenCV could not decode it")

    arr = _to_8bit(arr)
    if img.format in JPEG_FORMATS and _jpeg_tail_flat(arr if arr.ndim == 3 else arr[..., None], factor):
        _check_jpeg_scan(data, img, where)
    if arr.ndim == 2:
        return _gray_to_rgb(arr)
    channels = arr.shape[2]
    if channels == 3:
        return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    if channels == 4:
        return _composite(arr[..., 2::-1], arr[..., 3])
    if channels == 1:
        return _gray_to_rgb(arr[..., 0])
    raise CorruptDataError(f"cannot decode image from {where}: OpenCV gave {channels} channels")


def _cv2_reduced_flag(cv2: object, factor: int) -> int:
    return {
        2: cv2.IMREAD_REDUCED_COLOR_2,  # type: ignore[attr-defined]
        4: cv2.IMREAD_REDUCED_COLOR_4,  # type: ignore[attr-defined]
        8: cv2.IMREAD_REDUCED_COLOR_8,  # type: ignore[attr-defined]
    }[factor]


def _decode_simplejpeg(data: bytes, img: Image.Image, factor: int, where: str) -> np.ndarray:
    if img.format in JPEG_FORMATS and img.mode in _SIMPLEJPEG_MODES:
        rgb = simplejpeg_decode(data, *img.size, factor, source=where)
        if rgb is not None:
            return rgb
    return decode_pil(data, img, factor, where)


BACKENDS: dict[str, Callable[[bytes, Image.Image, int, str], np.ndarray]] = {
    "pil": decode_pil,
    "cv2": _decode_cv2,
    "simplejpeg": _decode_simplejpeg,
}
