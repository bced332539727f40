"""Image decoding shared by every source: encoded bytes → ``uint8`` RGB array (HWC).

All readers (folder, WebDataset, LMDB) decode through :func:`decode_image`, so comparing them
measures storage and I/O only. Two backends produce the same result by one rule:

``"pil"``
    Pillow (libjpeg-turbo, libpng, libwebp, ...). Reads every format Pillow reads.
``"simplejpeg"``
    libjpeg-turbo through `simplejpeg <https://gitlab.com/jfolz/simplejpeg>`_ (its own bundled
    libjpeg-turbo; ``pip install simplejpeg``, the ``jpeg`` extra) for colour and greyscale
    JPEGs; every other format and mode (CMYK JPEGs, PNG, ...) goes through Pillow. A JPEG that
    simplejpeg refuses (a recoverable libjpeg warning such as extraneous bytes before a marker,
    which Pillow tolerates) is handed to Pillow too, so the set of readable files is Pillow's.
    Chosen by measurement (``scripts/bench_jpeg_bindings.py``): 1.5-1.8x Pillow's full decode of
    ImageNet-sized JPEGs per CPU-second here, ahead of OpenCV (1.2-1.5x); PyTurboJPEG finds no
    ``libturbojpeg`` it accepts on this system.
``"auto"`` (the default of ``open_dataset``, ``make_loader`` and ``--decoder``; :func:`decode_image`'s is ``"pil"``)
    ``"simplejpeg"`` where it is installed, else ``"pil"`` (logged once at DEBUG).
``"cv2"``
    ``cv2.imdecode`` for JPEG/MPO, PNG and WebP. Other formats (GIF, BMP, TIFF, ...) and the rare
    8/16-bit greyscale image with a colour-key transparency fall back to Pillow (logged once at
    DEBUG). ``cv2.setNumThreads`` is the loader's business, not this module's.

Both backends read the header with Pillow first (lazy: no pixel is decoded), which gives the size
for the pixel limit, the mode that decides how cv2 must load the image, and the EXIF orientation.

Conversion rule (identical in both backends; the arithmetic is done in numpy, not by a library; the
backends and the rule live in :mod:`shardfeed.readers.decode.decode_backends`):

* **Colour**: L, 1, P, CMYK, YCbCr, LAB, HSV → RGB. L is replicated into three channels; P is
  looked up in its palette; CMYK JPEGs use Pillow's ``convert("RGB")`` (naive, no ICC; cv2 converts
  Adobe CMYK JPEGs itself — the two agree within a few levels). ICC profiles are ignored, as in
  torchvision.
* **Alpha** (LA, RGBA, PA, La/RGBa after un-premultiplying, palette transparency ``tRNS``, and
  colour-key transparency of 8-bit L/RGB) is composited over
  :data:`~shardfeed.readers.decode.decode_backends.BACKGROUND` (white, 255)::

      out = (rgb * a + 255 * (255 - a) + 127) // 255      # in uint16, exact rounding

* **Bit depth**: 16-bit samples keep their high byte, ``v >> 8`` (what Pillow and libpng's
  ``strip_16`` already do for 16-bit RGB/RGBA PNGs, so it is the only rule both libraries can agree
  on; it is at most one level below exact rounding). Mode ``I`` (32-bit int, as 16-bit files used
  to open) is clipped to 0..65535, then ``>> 8``. Mode ``F`` (32-bit float) is rounded and clipped
  to 0..255 — Pillow's own ``F → L`` rule; float data in [0, 1] needs its own decoder.
* **EXIF orientation** (tags 1–8, from EXIF or XMP, read from the header only) is applied by the
  same numpy flips/transposes in both backends (cv2 loads with ``IMREAD_IGNORE_ORIENTATION`` /
  ``IMREAD_UNCHANGED``), so both give identical geometry; the result matches
  ``PIL.ImageOps.exif_transpose``.
* **Reduced JPEG decoding**: with ``target_size`` set, a JPEG whose shorter side is at least
  ``2 * target_size`` is decoded at 1/2, 1/4 or 1/8 scale by libjpeg's scaled IDCT (Pillow
  ``draft``, cv2 ``IMREAD_REDUCED_COLOR_*``): the factor is the largest ``f`` in {2, 4, 8} with
  ``f * target_size <= min(w, h)``, and the result is ``ceil(w / f) x ceil(h / f)``, so its shorter
  side stays ``>= target_size``. Both backends pick the same factor. Other formats ignore it.
* **Crop windows** (:func:`decode_crop`, the training path): the caller draws the crop box from
  the header size in the upright (EXIF-oriented) frame, before any pixel is decoded; the JPEG is
  then decoded at the largest factor ``f`` in {1, 2, 4, 8} with ``f * min_side <=`` the box's
  shorter side, and the box (mapped to that scale) is cut from the oriented result. Only the
  power-of-two scales are used: libjpeg-turbo's other M/8 scales (7/8 ... 3/8) decode *slower*
  than the full size here (``scripts/bench_jpeg_bindings.py``). None of the installable bindings
  exposes libjpeg-turbo's region decoding (``jpeg_crop_scanline``/``jpeg_skip_scanlines``), so
  the whole image is decoded at that scale and the window cut afterwards.
* **Damage**: undecodable, truncated or garbage bytes raise
  :class:`~shardfeed.readers.errors.CorruptDataError` naming the ``source``. A JPEG must have an
  end-of-image marker after its scan data; this check runs for both backends, so a truncated JPEG
  raises even where a library would pad it with grey (older OpenCV, or
  ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True`` set by an application). Data that ends early
  behind an intact structure raises too, in every backend: a PNG whose zlib stream ends cleanly
  but holds fewer rows than IHDR declares (Pillow fills black rows; the data is counted exactly
  when the decoded last rows are blank), and a JPEG cut short before a forged end-of-image marker
  (libjpeg's "premature end of data segment" warning, fills grey: simplejpeg's strict mode reports
  it; for the Pillow and OpenCV backends it is asked when the decoded last block is flat).

Memory limit: :data:`DEFAULT_MAX_DECODE_BYTES` (512 MiB) bounds what one decode may allocate,
:func:`decode_bytes_estimate` of the header's size, mode and bit depth (a float TIFF takes twice
an RGB image's memory per pixel, an RGBA one more for compositing), checked before any pixel is
decoded: :class:`~shardfeed.readers.errors.ImageTooLargeError` (``max_decode_bytes=None`` disables it).

Pixel limit: :data:`DEFAULT_MAX_PIXELS` (100 million, e.g. 10000 x 10000) is checked on the header
size before any pixel is decoded, raising :class:`ImageTooLargeError`. Pillow's own
decompression-bomb check cannot be switched off per call: it reads the process-wide
``PIL.Image.MAX_IMAGE_PIXELS`` inside ``Image.open`` and several plugins (TIFF tiles, GIF/MPO
frames). So the first call to :func:`decode_image` or :func:`image_size_of` in a process sets
``PIL.Image.MAX_IMAGE_PIXELS = None`` **if it still holds Pillow's default** (otherwise Pillow
would warn at 89.5 M pixels, below our default, and refuse 179 M pixels even with
``max_pixels=None``). An application that set its own value keeps it: both checks then apply, and
Pillow's refusal is reported as :class:`ImageTooLargeError` too.
"""

from __future__ import annotations

import io
import logging
import re
import threading
from typing import Callable

import numpy as np
from PIL import Image

from .decode_backends import BACKENDS, CV2_FORMATS, JPEG_FORMATS, ORIENT, PIL_LOAD_ERRORS, decode_pil, log_once
from ..errors import CorruptDataError, ImageTooLargeError
from .jpeg import (ORIENTATION_TAG, jpeg_is_complete, read_jpeg_header, simplejpeg_available,
                   simplejpeg_decode)

__all__ = [
    "backend_for_format",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_DECODE_BYTES",
    "decode_bytes_estimate",
    "DECODERS",
    "decode_crop",
    "decode_image",
    "decode_jpeg_as_stored",
    "probe_jpeg",
    "image_size_of",
    "resolve_decoder",
    "simplejpeg_available",
]

logger = logging.getLogger(__name__)

#: Default pixel limit (width * height) checked on the header before decoding: 100 million
#: pixels, 300 MB as RGB uint8. Pillow's own default warns at 89.5 M and refuses 179 M.
DEFAULT_MAX_PIXELS: int = 100_000_000

#: Default bound on the memory one decode may allocate (bytes), checked on the header before any
#: pixel is decoded (:func:`decode_bytes_estimate`): 512 MiB, e.g. a 7,000 x 7,000 RGB photo.
DEFAULT_MAX_DECODE_BYTES: int = 512 << 20

#: Peak bytes per pixel of decoding an image of a Pillow mode and converting it to RGB ``uint8``
#: (the decoder's buffer, Pillow's 4-byte RGB/CMYK layout included, plus the numpy copies and
#: working arrays of the conversion rule). An estimate from the code path of each mode, on the
#: high side; unknown modes take the largest.
_DECODE_BYTES_PER_PIXEL = {
    "1": 9, "L": 5, "P": 9, "RGB": 10, "YCbCr": 11, "LAB": 11, "HSV": 11, "RGBX": 11, "CMYK": 11,
    "LA": 25, "La": 25, "PA": 25, "RGBA": 25, "RGBa": 25,
    "I;16": 10, "I;16B": 10, "I;16L": 10, "I;16N": 10, "I": 20, "F": 20,
}
_DECODE_BYTES_MAX = 25
#: simplejpeg's decode: its RGB output and one copy (orientation, contiguity).
_SIMPLEJPEG_BYTES_PER_PIXEL = 6

#: Names accepted by ``decode_image(decoder=...)``.
DECODERS: tuple[str, ...] = ("pil", "cv2", "simplejpeg", "auto")

_REDUCTION_FACTORS = (8, 4, 2)
#: For each EXIF orientation: whether the upright frame's (y, x) axes run backwards in the
#: stored image (after the transpose of 5-8). See :data:`~shardfeed.readers.decode.decode_backends.ORIENT`.
_REVERSED_AXES = {1: (False, False), 2: (False, True), 3: (True, True), 4: (True, False),
                  5: (False, False), 6: (False, True), 7: (True, True), 8: (True, False)}
_PILLOW_DEFAULT_MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)

_pillow_limit_lock = threading.Lock()
_pillow_limit_done = False


# ---------------------------------------------------------------------------------------------
# Public API


def decode_bytes_estimate(width: int, height: int, mode: str, factor: int = 1) -> int:
    """The memory, bytes, decoding an image and converting it to RGB ``uint8`` takes at its peak.

    ``width x height`` pixels (after a JPEG reduction by ``factor``: ``ceil(w / f) x ceil(h / f)``)
    times the bytes per pixel of ``mode`` (Pillow's mode, which carries the channels and the
    bit depth: ``"L"`` 8-bit grey, ``"I;16"`` 16-bit, ``"F"`` 32-bit float, ``"CMYK"``, ...),
    including the decoder's buffer and the conversion's working arrays (see
    ``_DECODE_BYTES_PER_PIXEL``). Read from the header only.

    Returns:
        Bytes (int).
    """
    f = max(int(factor), 1)
    pixels = (-(-int(width) // f)) * (-(-int(height) // f))
    if mode == "simplejpeg":
        return pixels * _SIMPLEJPEG_BYTES_PER_PIXEL
    return pixels * _DECODE_BYTES_PER_PIXEL.get(mode, _DECODE_BYTES_MAX)


def image_size_of(data: bytes, *, source: str = "<bytes>") -> tuple[int, int]:
    """Read an image's stored size from its header, without decoding pixels.

    Cheap (microseconds): Pillow parses the header lazily. Used by the packer's decode-check and
    by the pixel limit. The size is the stored one, *before* EXIF orientation: for orientations
    5–8 :func:`decode_image` returns an array of shape ``(w, h, 3)``.

    Args:
        data: The encoded image (bytes-like).
        source: Where the bytes came from (a file path or ``"shard X key Y"``), for messages.

    Returns:
        ``(width, height)`` in pixels.

    Raises:
        TypeError: ``data`` is not bytes-like.
        CorruptDataError: Pillow cannot identify an image in ``data``.
        ImageTooLargeError: Only when an application set its own ``PIL.Image.MAX_IMAGE_PIXELS``
            and the image exceeds twice that.
    """
    with _open_header(_as_bytes(data), source, ext=None) as img:
        return img.size


def decode_image(
    data: bytes,
    ext: str | None = None,
    *,
    decoder: str = "pil",
    target_size: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    source: str = "<bytes>",
    max_decode_bytes: int | None = DEFAULT_MAX_DECODE_BYTES,
) -> np.ndarray:
    """Decode an encoded image into an RGB ``uint8`` array, by the module's conversion rule.

    The format is sniffed from the content; ``ext`` is only a hint for messages (ImageNet, for
    one, holds PNG and CMYK files named ``.JPEG``).

    Args:
        data: The encoded image (bytes-like: ``bytes``, ``bytearray``, ``memoryview``).
        ext: The sample's extension (``"jpg"``, ``"png"``, ...), used in error messages only.
        decoder: One of :data:`DECODERS`: ``"pil"``, ``"cv2"``, ``"simplejpeg"`` or ``"auto"``
            (see the module docstring).
        target_size: Shorter side, in pixels, that the caller will resize to. When given, a JPEG
            may be decoded at 1/2, 1/4 or 1/8 scale while keeping its shorter side
            ``>= target_size``. ``None`` decodes at full size. Ignored for other formats.
        max_pixels: Largest ``width * height`` accepted, checked on the header before decoding.
            ``None`` disables the check.
        source: Where the bytes came from (a file path or ``"shard X key Y"``); every error
            message names it.
        max_decode_bytes: Largest memory, bytes, the decode may allocate
            (:func:`decode_bytes_estimate`: size, mode and bit depth from the header), checked
            before decoding; ``None`` disables the check.

    Returns:
        ``numpy.ndarray`` of shape ``(H, W, 3)``, dtype ``uint8``, RGB, C-contiguous, writable,
        EXIF orientation applied.

    Raises:
        TypeError: ``data`` is not bytes-like, or ``target_size``/``max_pixels`` is not an int.
        ValueError: Unknown ``decoder``, or ``target_size``/``max_pixels`` is not positive.
        ModuleNotFoundError: ``decoder="simplejpeg"`` without simplejpeg installed.
        ImageTooLargeError: The header declares more than ``max_pixels`` pixels, or a decode of
            more than ``max_decode_bytes``.
        CorruptDataError: The bytes are not an image, are truncated (a PNG whose data holds
            fewer rows than its header, a JPEG whose scan data ends early, even before a
            forged end-of-image marker), or fail to decode.
    """
    name = resolve_decoder(decoder)
    backend = BACKENDS[name]
    _check_positive_int("target_size", target_size)
    _check_positive_int("max_pixels", max_pixels)
    _check_positive_int("max_decode_bytes", max_decode_bytes)
    data = _as_bytes(data)

    if name == "simplejpeg":
        header = read_jpeg_header(data)
        if header is not None:
            width, height, orientation = header
            _check_pixels(width, height, max_pixels, source, ext)
            factor = _reduction_factor(width, height, target_size)
            _check_decode_bytes(width, height, "simplejpeg", factor, max_decode_bytes, source, ext)
            rgb = simplejpeg_decode(data, width, height, factor, source=_where(source, ext))
            if rgb is not None:
                return _finish(ORIENT[orientation](rgb))
            backend = decode_pil  # simplejpeg refused it: Pillow decides

    with _open_header(data, source, ext) as img:
        orientation = _check_header(data, img, max_pixels, source, ext)
        factor = 1
        if img.format in JPEG_FORMATS:
            factor = _reduction_factor(*img.size, target_size)
        _check_decode_bytes(*img.size, img.mode, factor, max_decode_bytes, source, ext)
        rgb = backend(data, img, factor, _where(source, ext))
    return _finish(ORIENT[orientation](rgb))


def decode_crop(
    data: bytes,
    ext: str | None = None,
    *,
    crop: Callable[[int, int], tuple[int, int, int, int]],
    min_side: int,
    decoder: str = "auto",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    source: str = "<bytes>",
    max_decode_bytes: int | None = DEFAULT_MAX_DECODE_BYTES,
) -> np.ndarray:
    """Decode only what a crop window needs: the box is drawn from the header, then decoded.

    The fused decode-and-crop of the training path (the box first, as DALI's
    ``decoders.image_random_crop`` and TensorFlow's ``decode_and_crop_jpeg`` do). ``crop`` is
    called once with the image's size **in the upright frame** (EXIF orientation applied, so
    ``(w, h)`` swapped for orientations 5-8) and returns the box in that frame. A JPEG is then
    decoded at the largest factor ``f`` in {1, 2, 4, 8} with ``f * min_side <= min(box_h,
    box_w)`` (so the window still has at least ``min_side`` pixels a side), oriented, and the box,
    mapped to that scale (rounded to whole pixels), is cut out. Other formats are decoded whole
    and cut. Colour, alpha and bit-depth follow the module's rule (same backends as
    :func:`decode_image`).

    Args:
        data: The encoded image (bytes-like).
        ext: The sample's extension, for messages only.
        crop: ``crop(height, width) -> (top, left, box_h, box_w)``, pixels, full-resolution
            upright frame; the box must lie inside the image. E.g.
            ``functools.partial(TrainTransform.sample_crop, rng=rng)``.
        min_side: The side, in pixels, the window will be resized to (it limits the reduction).
        decoder: One of :data:`DECODERS`.
        max_pixels: Pixel limit, checked on the header before ``crop`` is called.
        source: Where the bytes came from, for messages.
        max_decode_bytes: Memory limit of the decode, as :func:`decode_image`'s.

    Returns:
        ``numpy.ndarray`` ``(h, w, 3)`` ``uint8`` RGB, upright: the box at scale ``1 / f``
        (``h ~= box_h / f``, ``w ~= box_w / f``, each at least 1). It may be a view with
        row padding (positive strides, pixels contiguous), ready for ``cv2.resize``.

    Raises:
        TypeError, ValueError: Bad arguments, or ``crop`` returned a box outside the image.
        ImageTooLargeError: The header declares more than ``max_pixels`` pixels, or a decode of
            more than ``max_decode_bytes``.
        CorruptDataError: The bytes are not an image, are truncated, or fail to decode.
    """
    name = resolve_decoder(decoder)
    _check_positive_int("min_side", min_side)
    _check_positive_int("max_pixels", max_pixels)
    _check_positive_int("max_decode_bytes", max_decode_bytes)
    return decode_crop_unchecked(data, ext, crop, min_side, name, max_pixels, source, max_decode_bytes)


def decode_crop_unchecked(data: bytes, ext: str | None, crop: Callable[[int, int], tuple[int, int, int, int]],
                          min_side: int | None, name: str, max_pixels: int | None, source: str,
                          max_decode_bytes: int | None) -> np.ndarray:
    """:func:`decode_crop` for a caller that validated its arguments once (the per-sample path).

    ``name`` is a resolved backend (:func:`resolve_decoder`); ``min_side``, ``max_pixels`` and
    ``max_decode_bytes`` are positive ints or None. The checks on the image itself (its size, the
    crop box, the decode's memory) are all made here, each at the cost of a comparison when it
    passes. Returns and raises as :func:`decode_crop`.
    """
    if type(data) is not bytes:
        data = _as_bytes(data)
    rgb = None
    header = read_jpeg_header(data) if name == "simplejpeg" else None
    if header is not None:
        width, height, orientation = header
        if max_pixels is not None and width * height > max_pixels:
            _check_pixels(width, height, max_pixels, source, ext)
        up_h, up_w = (height, width) if orientation < 5 else (width, height)
        top, left, box_h, box_w = box = crop(up_h, up_w)
        if not (type(top) is int and type(left) is int and type(box_h) is int and type(box_w) is int
                and 0 <= top and 0 <= left and 1 <= box_h and 1 <= box_w
                and top + box_h <= up_h and left + box_w <= up_w):
            top, left, box_h, box_w = _check_box(box, up_h, up_w, source, ext)
        factor = 1
        if min_side is not None and box_w >= 2 * min_side and box_h >= 2 * min_side:
            factor = _reduction_factor(box_w, box_h, min_side)
        if max_decode_bytes is not None and width * height * _SIMPLEJPEG_BYTES_PER_PIXEL > max_decode_bytes:
            _check_decode_bytes(width, height, "simplejpeg", factor, max_decode_bytes, source, ext)
        rgb = simplejpeg_decode(data, width, height, factor, source=_where(source, ext))
        # None: simplejpeg refused the file; Pillow decodes it with the box already drawn
    if rgb is not None:
        if orientation > 1:
            rgb = ORIENT[orientation](rgb)
    else:
        backend = BACKENDS[name]
        with _open_header(data, source, ext) as img:
            orientation = _check_header(data, img, max_pixels, source, ext)
            width, height = img.size
            up_h, up_w = (height, width) if orientation < 5 else (width, height)
            if header is None:
                top, left, box_h, box_w = _check_box(crop(up_h, up_w), up_h, up_w, source, ext)
            else:
                backend = decode_pil  # simplejpeg refused it: Pillow decides
            factor = 1
            if img.format in JPEG_FORMATS:
                factor = _reduction_factor(box_w, box_h, min_side)
            _check_decode_bytes(width, height, img.mode, factor, max_decode_bytes, source, ext)
            rgb = ORIENT[orientation](backend(data, img, factor, _where(source, ext)))
    if factor > 1:
        rev_y, rev_x = _REVERSED_AXES[orientation]
        top, box_h = _scale_span(top, box_h, up_h, rgb.shape[0], factor, rev_y)
        left, box_w = _scale_span(left, box_w, up_w, rgb.shape[1], factor, rev_x)
    window = rgb[top : top + box_h, left : left + box_w]
    strides = window.strides
    if strides[0] < 0 or strides[1] != 3 or strides[2] != 1:
        window = np.array(window, order="C")  # flipped/transposed view: copy the window only
    return window


def probe_jpeg(
    data: bytes, ext: str | None = None, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, source: str = "<bytes>"
) -> tuple[int, int, int] | None:
    """Size and EXIF orientation of a plain 8-bit colour or greyscale JPEG, read without Pillow.

    The header probe of the simplejpeg path (and of GPU batch decoding): one walk over the marker
    segments; the orientation is what Pillow's ``getexif`` gives. ``None`` for anything else (other
    formats, CMYK, 12-bit, an XMP-only orientation, unusual EXIF, a truncated JPEG): such data
    takes the Pillow path of :func:`decode_image`, which decides.

    Args:
        data: The encoded image (bytes-like).
        ext: The sample's extension, for messages only.
        max_pixels: Pixel limit checked on the header (``None``: no check).
        source: Where the bytes came from, for messages.

    Returns:
        ``(width, height, orientation)``: the stored size in pixels (before orientation) and the
        EXIF orientation 1..8; or ``None``.

    Raises:
        TypeError: ``data`` is not bytes-like.
        ImageTooLargeError: The header declares more than ``max_pixels`` pixels.
    """
    header = read_jpeg_header(_as_bytes(data))
    if header is not None:
        _check_pixels(header[0], header[1], max_pixels, source, ext)
    return header


def decode_jpeg_as_stored(data: bytes) -> np.ndarray | None:
    """simplejpeg's full-size RGB decode, as stored (no EXIF orientation applied).

    Args:
        data: A JPEG that :func:`probe_jpeg` accepted.

    Returns:
        ``(H, W, 3)`` ``uint8`` RGB array, or ``None`` when simplejpeg is not installed or
        refuses the file (then :func:`decode_image` / :func:`decode_crop` decide).

    Raises:
        CorruptDataError: libjpeg reports the scan data ends before the image.
    """
    if not simplejpeg_available():
        return None
    return simplejpeg_decode(_as_bytes(data), 0, 0, 1)


def resolve_decoder(decoder: str) -> str:
    """The backend a ``decoder`` name stands for: ``"auto"`` becomes ``"simplejpeg"`` or ``"pil"``.

    Args:
        decoder: One of :data:`DECODERS`.

    Returns:
        ``"pil"``, ``"cv2"`` or ``"simplejpeg"``.

    Raises:
        ValueError: Unknown name.
        ModuleNotFoundError: ``"simplejpeg"`` asked for and not installed (the message says
            ``pip install simplejpeg``).
    """
    if decoder == "auto":
        if simplejpeg_available():
            return "simplejpeg"
        log_once("auto-pil", "decoder='auto': simplejpeg is not installed (pip install simplejpeg); "
                  "decoding with Pillow")
        return "pil"
    if decoder == "simplejpeg":
        if not simplejpeg_available():
            raise ModuleNotFoundError(
                "decoder='simplejpeg' needs the simplejpeg package, a dependency of shardfeed that is missing "
                "here: pip install simplejpeg; decoder='auto' falls back to Pillow without it"
            )
        return decoder
    if decoder not in BACKENDS:
        raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
    return decoder


def backend_for_format(decoder: str, image_format: str) -> str:
    """The library that decodes images of ``image_format`` under ``decoder`` (after
    :func:`resolve_decoder`): ``"simplejpeg"``, ``"OpenCV"`` or ``"Pillow"``.

    Args:
        decoder: ``"pil"``, ``"cv2"`` or ``"simplejpeg"`` (a resolved name).
        image_format: Pillow's format name (``"JPEG"``, ``"PNG"``, ``"WEBP"``, ...), upper case.

    Returns:
        The library named for people; images that library refuses at run time (a CMYK JPEG, a PNG
        with transparency under cv2) still fall back to Pillow.
    """
    fmt = image_format.upper()
    if decoder == "simplejpeg" and fmt in JPEG_FORMATS:
        return "simplejpeg"
    if decoder == "cv2" and fmt in CV2_FORMATS:
        return "OpenCV"
    return "Pillow"


def _scale_span(start: int, length: int, full: int, scaled: int, factor: int, reverse: bool) -> tuple[int, int]:
    """Map ``[start, start + length)`` of a ``full``-pixel axis to the ``1/factor`` decode.

    libjpeg's scaled output pixel ``i`` covers input pixels ``[i * f, (i + 1) * f)`` of the
    stored image (the last one partial when ``f`` does not divide the size). On an axis that runs
    backwards after orientation, the partial pixel comes first: shift by ``scaled * f - full``.
    """
    shift = scaled * factor - full if reverse else 0
    lo = int(round((start + shift) / factor))
    hi = int(round((start + length + shift) / factor))
    lo = min(max(lo, 0), scaled - 1)
    hi = min(max(hi, lo + 1), scaled)
    return lo, hi - lo


def _check_box(box: tuple[int, int, int, int], up_h: int, up_w: int, source: str,
               ext: str | None) -> tuple[int, int, int, int]:
    top, left, box_h, box_w = box
    top, left, box_h, box_w = int(top), int(left), int(box_h), int(box_w)
    if not (0 <= top and 0 <= left and 1 <= box_h and 1 <= box_w
            and top + box_h <= up_h and left + box_w <= up_w):
        raise ValueError(f"crop box (top={top}, left={left}, h={box_h}, w={box_w}) is not inside the "
                         f"{up_h}x{up_w} image from {_where(source, ext)}")
    return top, left, box_h, box_w


def _check_pixels(width: int, height: int, max_pixels: int | None, source: str, ext: str | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise ImageTooLargeError(
            f"image from {_where(source, ext)} is {width}x{height} = "
            f"{width * height:,} pixels, "
            f"over the limit max_pixels={max_pixels:,}; if it is legitimate, pass a larger "
            "max_pixels (or max_pixels=None to disable the check)"
        )


def _check_decode_bytes(width: int, height: int, mode: str, factor: int, max_decode_bytes: int | None, source: str,
                        ext: str | None) -> None:
    if max_decode_bytes is None:
        return
    need = decode_bytes_estimate(width, height, mode, factor)
    if need > max_decode_bytes:
        shown = "8-bit colour JPEG" if mode == "simplejpeg" else f"mode {mode}"
        raise ImageTooLargeError(
            f"image from {_where(source, ext)} is {width}x{height} ({shown}): decoding it would take about "
            f"{need / 2**20:,.1f} MiB, over the limit max_decode_bytes={max_decode_bytes:,} "
            f"({max_decode_bytes / 2**20:,.1f} MiB); a decompression bomb, or if it is legitimate pass a larger "
            "max_decode_bytes (--max-decode-bytes), or None to disable the check"
        )


def _check_header(data: bytes, img: Image.Image, max_pixels: int | None, source: str, ext: str | None) -> int:
    """Pixel limit and JPEG completeness on the lazily opened header; returns the orientation."""
    _check_pixels(*img.size, max_pixels, source, ext)
    orientation = _read_orientation(img, source)
    if img.format in JPEG_FORMATS and not jpeg_is_complete(data):
        raise CorruptDataError(
            f"cannot decode image from {_where(source, ext)}: truncated JPEG "
            "(no end-of-image marker after the scan data)"
        )
    return orientation


def _finish(rgb: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray keeps a negative stride on an axis of length 1 (a 1-pixel-wide image
    # flipped by its EXIF orientation), which numpy calls contiguous and torch refuses: copy then
    if not rgb.flags.c_contiguous or not rgb.flags.writeable or min(rgb.strides) < 0:
        rgb = np.array(rgb, order="C")
    return rgb


# ---------------------------------------------------------------------------------------------
# Header probe (shared by both backends)


def _as_bytes(data: bytes) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"data must be bytes-like, got {type(data).__name__}")


def _check_positive_int(name: str, value: int | None) -> None:
    if value is None or (type(value) is int and value >= 1):
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int or None, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def _where(source: str, ext: str | None) -> str:
    return f"{source} (ext {ext!r})" if ext else source


def _replace_pillow_pixel_limit() -> None:
    """Hand the pixel limit to ``max_pixels``: see the module docstring for why it is global."""
    global _pillow_limit_done
    if _pillow_limit_done:
        return
    with _pillow_limit_lock:
        if _pillow_limit_done:
            return
        if Image.MAX_IMAGE_PIXELS == _PILLOW_DEFAULT_MAX_IMAGE_PIXELS:
            Image.MAX_IMAGE_PIXELS = None
            logger.debug(
                "set PIL.Image.MAX_IMAGE_PIXELS = None: shardfeed checks max_pixels itself"
            )
        else:
            logger.debug(
                "PIL.Image.MAX_IMAGE_PIXELS = %r was set by the application; Pillow's check "
                "stays active besides max_pixels",
                Image.MAX_IMAGE_PIXELS,
            )
        _pillow_limit_done = True


def _open_header(data: bytes, source: str, ext: str | None) -> Image.Image:
    """Open lazily with Pillow (header only), mapping its failures to our errors."""
    _replace_pillow_pixel_limit()
    if not data:
        raise CorruptDataError(f"cannot decode image from {_where(source, ext)}: no bytes")
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(
            f"image from {_where(source, ext)} is too large for PIL.Image.MAX_IMAGE_PIXELS="
            f"{Image.MAX_IMAGE_PIXELS} set by the application: {exc}"
        ) from exc
    except PIL_LOAD_ERRORS as exc:
        # no memory addresses or in-memory file objects (stable, readable messages)
        detail = re.sub(r" ?<_io\.\w+ object(?: at 0x[0-9a-fA-F]+)?>", "", str(exc))
        detail = re.sub(r" at 0x[0-9a-fA-F]+", "", detail)
        raise CorruptDataError(
            f"cannot decode image from {_where(source, ext)}: not a readable image "
            f"({type(exc).__name__}: {detail})"
        ) from exc


def _read_orientation(img: Image.Image, source: str) -> int:
    """EXIF/XMP orientation 1..8 from the header; 1 when absent, malformed or out of range."""
    try:
        # The base-class method only parses what the header already holds. PNG's override
        # would decode every pixel to look for an eXIf chunk after the image data.
        value = Image.Image.getexif(img).get(ORIENTATION_TAG, 1)
    except Exception as exc:  # malformed EXIF must not make a good image unreadable
        logger.debug("ignoring unreadable EXIF in %s: %s: %s", source, type(exc).__name__, exc)
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _reduction_factor(width: int, height: int, target_size: int | None) -> int:
    """Largest f in {8, 4, 2} with f * target_size <= min(width, height); 1 if none."""
    if target_size is None:
        return 1
    shorter = min(width, height)
    for factor in _REDUCTION_FACTORS:
        if factor * target_size <= shorter:
            return factor
    return 1
