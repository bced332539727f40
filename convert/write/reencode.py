"""Re-encode images while packing: ``--resize``, ``--resize-mode``, ``--upscale``, ``--quality``,
``--image-format``.

Most training pipelines resize every image to about 224 px, so storing full-size photos costs
disk, network and a full-size decode on every epoch. With a :class:`ReencodeOptions` on
:class:`~shardfeed.convert.write.pack.PackOptions` (``reencode=``), :func:`reencode_payload` turns each
source file into the bytes that are stored, in the pack's worker processes. Without one, packing
stores the original bytes unchanged (and nothing here runs).

The rule, per image (everything here is deterministic: the same Pillow build gives the same bytes):

1. **Decode** with Pillow. JPEGs whose resized size is at most half the source in both sides are
   decoded at 1/2, 1/4 or 1/8 scale by libjpeg's scaled IDCT (Pillow ``draft``; the largest
   factor that keeps the decoded image at least as large as the target), which is what makes
   re-encoding large JPEGs fast (``scripts/bench_reencode.py``). ``draft=False`` always decodes
   at full size.
2. **Modes** follow the readers' decode rule (:mod:`shardfeed.readers.decode.image`), so re-encoded
   data decodes to what a reader of the original gets, resized: 16-bit samples keep their high
   byte (``v >> 8``; mode ``I`` is clipped to 0..65535 first, ``F`` rounded and clipped to
   0..255); 1 and 16-bit greyscale become ``L``; P, CMYK, YCbCr, LAB and HSV become ``RGB``
   (Pillow's ``convert``, naive CMYK, no ICC); palette or colour-key transparency becomes an alpha
   channel. Greyscale stays one channel (``L``/``LA``) where the output format allows it, and an
   alpha channel that is fully opaque is dropped.
3. **Resize** (``resize=N``) with Pillow's Lanczos filter (a = 3, antialiased: every source pixel
   contributes) from the full or draft-reduced image; alpha is premultiplied while resizing (by
   Pillow). Sizes, with ``(w, h)`` the size as displayed (EXIF orientation applied) and
   ``round`` rounding halves up:

   - ``shorter`` (default): the shorter side becomes N, the other ``round(other * N / shorter)``;
   - ``longer``: the longer side becomes N, the other ``round(other * N / longer)``;
   - ``fit``: exactly N x N: scaled as ``shorter``, then the longer side is center-cropped to N
     (``left = (w' - N) // 2``), like ``PIL.ImageOps.fit``.

   An image whose reference side is already ``<= N`` is not scaled up unless ``upscale``; with
   ``fit`` it is then only cropped to at most N x N (a 300 x 150 image gives 200 x 150 at N=200).
4. **EXIF orientation** (tags 1-8, read as the readers read it) is applied: the resize runs in
   the file's own orientation to the transposed target size and the small result is then
   transposed (the same geometry as transposing first, for less work), so the stored image is
   upright and readers need no EXIF logic.
5. **Metadata is dropped**: no EXIF, XMP or comments are written. **ICC profiles are dropped
   and the pixel values kept** (not converted to sRGB): the readers, torchvision and OpenCV all
   ignore ICC profiles, so a model trained on re-encoded data sees the same colours as one trained
   on the originals. (Wide-gamut photos, e.g. Display P3, therefore look slightly flat in a
   colour-managed viewer, exactly as they do to the training pipeline.)
6. **Encode** to ``image_format``: ``keep`` (the source's own format when it is JPEG, PNG or WebP;
   other formats - BMP, TIFF, PPM/PGM, GIF - become PNG, losslessly), ``jpg``, ``png`` or ``webp``.
   The default (``None``) is ``keep`` without ``resize`` and, with ``resize``, ``jpg`` for images
   without alpha and ``png`` for images with an alpha channel. JPEG: ``quality`` (default 90),
   4:2:0 chroma subsampling, baseline (fast to decode), optimized Huffman tables; an alpha channel
   asked into JPEG is composited over white (the readers' rule). WebP: lossy at ``quality``,
   method 4; greyscale becomes RGB (WebP has no greyscale). PNG: zlib level 6, lossless.

Each sample's metadata gains ``orig_width`` and ``orig_height`` (the source size as displayed,
i.e. after EXIF orientation, in pixels) and ``orig_format`` (the detected format, lower case,
``jpeg`` -> ``jpg``, ``tiff`` -> ``tif``). The manifest's ``options`` gains ``reencode`` (the
options and the Pillow version).

WebDataset shards with re-encoding are cut from the encoded sizes as they come:
:func:`shardfeed.convert.writers.webdataset.pack_webdataset_reencoded` describes how (shards stay
byte-identical whatever ``workers`` is, and ``resume`` is exact).
"""

from __future__ import annotations

import dataclasses
import io
import logging

from shardfeed.readers.errors import CorruptDataError

__all__ = [
    "RESIZE_MODES",
    "IMAGE_FORMATS",
    "DEFAULT_QUALITY",
    "ReencodeOptions",
    "ReencodedImage",
    "make_reencode_options",
    "resize_size",
    "reencode_image",
    "reencode_payload",
]

log = logging.getLogger(__name__)

#: ``resize_mode`` values (see the module docstring for their sizes).
RESIZE_MODES: tuple[str, ...] = ("shorter", "longer", "fit")
#: ``image_format`` values; ``None`` means: ``keep`` without ``resize``, ``jpg``/``png`` (alpha) with it.
IMAGE_FORMATS: tuple[str, ...] = ("keep", "jpg", "png", "webp")
#: JPEG/WebP quality when none is given.
DEFAULT_QUALITY = 90

_FORMAT_ALIASES = {"jpeg": "jpg", "tiff": "tif"}
_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
_KEEPABLE = {"jpg": "jpg", "mpo": "jpg", "png": "png", "webp": "webp"}
_ORIENTATION_TAG = 0x0112
_SWAPS_AXES = frozenset({5, 6, 7, 8})
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError)


@dataclasses.dataclass(frozen=True)
class ReencodeOptions:
    """How :func:`reencode_image` re-encodes each image (CLI: ``--resize`` ... ``--image-format``).

    Attributes:
        resize: target size N in pixels (its meaning depends on ``resize_mode``); None keeps the size.
        resize_mode: ``"shorter"`` (shorter side -> N), ``"longer"`` (longer side -> N) or
            ``"fit"`` (N x N, center-cropped).
        upscale: also enlarge images whose reference side is smaller than N.
        quality: JPEG/WebP quality, 1..100.
        image_format: ``"keep"``, ``"jpg"``, ``"png"``, ``"webp"``; None: ``keep`` without
            ``resize``, else ``jpg`` (``png`` for images with alpha).
        draft: decode JPEGs at reduced size (1/2, 1/4, 1/8) when the target is at most half the
            source; False always decodes at full size (slower, within about 1 grey level).

    Raises:
        ValueError: an option is out of range or unknown; ``resize_mode``/``upscale`` without
            ``resize``; WebP asked and Pillow was built without it.
    """

    resize: int | None = None
    resize_mode: str = "shorter"
    upscale: bool = False
    quality: int = DEFAULT_QUALITY
    image_format: str | None = None
    draft: bool = True

    def __post_init__(self):
        if self.resize is not None and (isinstance(self.resize, bool) or not isinstance(self.resize, int)
                                        or self.resize < 1):
            raise ValueError(f"resize must be a positive number of pixels, got {self.resize!r}")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode {self.resize_mode!r} is unknown; choose one of {', '.join(RESIZE_MODES)}")
        if self.resize is None and (self.upscale or self.resize_mode != "shorter"):
            raise ValueError("resize_mode and upscale need resize (e.g. --resize 256)")
        if isinstance(self.quality, bool) or not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be an integer from 1 to 100, got {self.quality!r}")
        fmt = self.image_format
        if fmt is not None:
            fmt = _FORMAT_ALIASES.get(str(fmt).lower(), str(fmt).lower())
            if fmt not in IMAGE_FORMATS:
                raise ValueError(f"image_format {self.image_format!r} is unknown; choose one of "
                                 f"{', '.join(IMAGE_FORMATS)}")
            object.__setattr__(self, "image_format", fmt)
        if fmt == "webp":
            from PIL import features

            if not features.check("webp"):
                raise ValueError("image_format webp: this Pillow was built without WebP support; "
                                 "choose jpg or png, or install a Pillow wheel with WebP")

    def fingerprint_fields(self) -> dict:
        """The options as recorded in the manifest's ``options["reencode"]`` (and checked on resume)."""
        import PIL

        return {"resize": self.resize, "resize_mode": self.resize_mode, "upscale": self.upscale,
                "quality": self.quality, "image_format": self.image_format or "auto", "draft": self.draft,
                "encoder": f"Pillow {PIL.__version__}"}


def make_reencode_options(resize: int | None = None, resize_mode: str | None = None, upscale: bool = False,
                          quality: int | None = None, image_format: str | None = None) -> ReencodeOptions | None:
    """The :class:`ReencodeOptions` for CLI-style arguments, or None when no re-encoding is asked.

    Re-encoding is asked by ``resize``, ``quality`` or an ``image_format`` other than ``keep``
    (``keep`` alone is the default: the original bytes stay).

    Raises:
        ValueError: as :class:`ReencodeOptions` (e.g. ``upscale`` without ``resize``).
    """
    if resize is None and (upscale or resize_mode is not None):
        flag = "--upscale" if upscale else "--resize-mode"
        raise ValueError(f"{flag} needs --resize N (e.g. --resize 256)")
    fmt = image_format.lower() if image_format else None
    if resize is None and quality is None and fmt in (None, "keep"):
        return None
    return ReencodeOptions(resize=resize, resize_mode=resize_mode or "shorter", upscale=upscale,
                           quality=DEFAULT_QUALITY if quality is None else quality, image_format=fmt)


# ---------------------------------------------------------------------------------------------
# sizes


def _round_div(num: int, den: int) -> int:
    """``num / den`` rounded half up, in integers (no float error), at least 1."""
    return max(1, (2 * num + den) // (2 * den))


def _scaled_size(width: int, height: int, resize: int, mode: str, upscale: bool) -> tuple[int, int]:
    ref = max(width, height) if mode == "longer" else min(width, height)
    if ref == resize or (ref < resize and not upscale):
        return width, height
    if width == ref:
        return resize, _round_div(height * resize, ref)
    return _round_div(width * resize, ref), resize


def resize_size(width: int, height: int, resize: int, resize_mode: str = "shorter",
                upscale: bool = False) -> tuple[int, int]:
    """The output size for an image of ``width`` x ``height`` (as displayed), in pixels.

    Args:
        width, height: the source size after EXIF orientation, pixels.
        resize: the target N, pixels.
        resize_mode: ``"shorter"``, ``"longer"`` or ``"fit"`` (see the module docstring).
        upscale: enlarge images whose reference side is below N.

    Returns:
        ``(out_width, out_height)`` in pixels.

    Raises:
        ValueError: unknown ``resize_mode`` or non-positive sizes.
    """
    if resize_mode not in RESIZE_MODES:
        raise ValueError(f"resize_mode {resize_mode!r} is unknown; choose one of {', '.join(RESIZE_MODES)}")
    if width < 1 or height < 1 or resize < 1:
        raise ValueError(f"sizes must be positive, got {width}x{height} and resize={resize}")
    sw, sh = _scaled_size(width, height, resize, resize_mode, upscale)
    if resize_mode == "fit":
        return min(sw, resize), min(sh, resize)
    return sw, sh


# ---------------------------------------------------------------------------------------------
# one image


@dataclasses.dataclass(frozen=True)
class ReencodedImage:
    """The result of :func:`reencode_image`.

    Attributes:
        data: the encoded bytes to store.
        ext: their extension (``"jpg"``, ``"png"`` or ``"webp"``).
        width, height: the stored image's size, pixels.
        mode: its Pillow mode (``"RGB"``, ``"RGBA"``, ``"L"`` or ``"LA"``).
        orig_width, orig_height: the source's size as displayed (EXIF orientation applied), pixels.
        orig_format: the source's detected format (``"jpg"``, ``"png"``, ``"tif"``...).
    """

    data: bytes
    ext: str
    width: int
    height: int
    mode: str
    orig_width: int
    orig_height: int
    orig_format: str


def _orientation(img) -> int:
    """EXIF/XMP orientation 1..8 read from the header only (the readers' rule); 1 if absent or bad."""
    from PIL import Image

    try:
        value = Image.Image.getexif(img).get(_ORIENTATION_TAG, 1)
    except Exception:  # malformed EXIF must not make a good image unreadable
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _to_8bit_gray(img):
    """I;16*, I and F images -> L by the readers' bit-depth rule."""
    import numpy as np
    from PIL import Image

    arr = np.asarray(img)
    if arr.dtype.kind == "f":
        out = np.clip(np.rint(np.nan_to_num(arr)), 0, 255)
    elif arr.dtype.kind == "u" and arr.dtype.itemsize == 2:
        out = arr >> 8
    else:
        out = np.clip(arr, 0, 65535) >> 8
    return Image.fromarray(np.ascontiguousarray(out.astype(np.uint8)), "L")


def _normalize_mode(img):
    """Any Pillow mode -> L, LA, RGB or RGBA (see the module docstring, step 2)."""
    mode = img.mode
    if "transparency" in img.info and mode in ("L", "RGB", "P"):
        img = img.convert("RGBA")
    elif mode.startswith("I") or mode == "F":
        img = _to_8bit_gray(img)
    elif mode == "1":
        img = img.convert("L")
    elif mode == "La":
        img = img.convert("LA")
    elif mode in ("PA", "RGBa"):
        img = img.convert("RGBA")
    elif mode not in ("L", "LA", "RGB", "RGBA"):
        img = img.convert("RGB")
    if img.mode in ("LA", "RGBA") and img.getchannel("A").getextrema() == (255, 255):
        img = img.convert("L" if img.mode == "LA" else "RGB")  # an opaque alpha channel carries nothing
    return img


def _composite_white(img):
    """RGBA/LA -> RGB/L over a white background, the readers' exact rounding."""
    import numpy as np
    from PIL import Image

    arr = np.asarray(img)
    color, alpha = arr[..., :-1].astype(np.uint16), arr[..., -1:].astype(np.uint16)
    out = ((color * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)
    if out.shape[2] == 1:
        return Image.fromarray(np.ascontiguousarray(out[..., 0]), "L")
    return Image.fromarray(np.ascontiguousarray(out), "RGB")


def _output_format(options: ReencodeOptions, orig_format: str, has_alpha: bool) -> str:
    fmt = options.image_format
    if fmt is None:
        fmt = "keep" if options.resize is None else ("png" if has_alpha else "jpg")
    if fmt == "keep":
        fmt = _KEEPABLE.get(orig_format, "png")
    return fmt


def _encode(img, fmt: str, quality: int) -> bytes:
    if fmt == "jpg":
        if img.mode in ("LA", "RGBA"):
            img = _composite_white(img)
        params = {"quality": quality, "optimize": True}
    elif fmt == "webp":
        if img.mode in ("L", "LA"):
            img = img.convert("RGB" if img.mode == "L" else "RGBA")
        params = {"quality": quality, "method": 4}
    else:
        params = {"compress_level": 6}
    img.info = {}  # no EXIF, XMP, ICC profile or comment is carried into the output
    buf = io.BytesIO()
    img.save(buf, format=_PIL_FORMAT[fmt], **params)
    return buf.getvalue()


_TRANSPOSE = None


def _transpose_method(orientation: int):
    global _TRANSPOSE
    if _TRANSPOSE is None:
        from PIL import Image

        T = Image.Transpose
        _TRANSPOSE = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE,
                      6: T.ROTATE_270, 7: T.TRANSVERSE, 8: T.ROTATE_90}
    return _TRANSPOSE.get(orientation)


def reencode_image(data: bytes, options: ReencodeOptions, *, source: str = "<bytes>") -> ReencodedImage:
    """Decode, normalise, orient, resize and encode one image (the rule of the module docstring).

    Args:
        data: the encoded source image (any format Pillow reads).
        options: :class:`ReencodeOptions`.
        source: where the bytes came from (a path), named in error messages.

    Returns:
        A :class:`ReencodedImage` (bytes, extension, sizes, mode, original size and format).

    Raises:
        shardfeed.readers.errors.CorruptDataError: the bytes are not a readable image, or are
            truncated; the message names ``source``.
        shardfeed.readers.errors.ImageTooLargeError: more than
            :data:`~shardfeed.readers.decode.image.DEFAULT_MAX_PIXELS` pixels (decompression bomb).
    """
    from PIL import Image

    from shardfeed.readers.decode.image import DEFAULT_MAX_PIXELS, image_size_of
    from shardfeed.readers.errors import ImageTooLargeError

    # Header only: maps unreadable bytes to CorruptDataError and hands Pillow's pixel limit to ours.
    stored_w, stored_h = image_size_of(data, source=source)
    if stored_w * stored_h > DEFAULT_MAX_PIXELS:
        raise ImageTooLargeError(f"{source}: image is {stored_w}x{stored_h} = {stored_w * stored_h:,} pixels, over "
                                 f"the limit of {DEFAULT_MAX_PIXELS:,}; remove it or pack with --on-error skip")
    try:
        img = Image.open(io.BytesIO(data))
        orig_format = (img.format or "unknown").lower()
        orig_format = _FORMAT_ALIASES.get(orig_format, orig_format)
        orientation = _orientation(img)
        swap = orientation in _SWAPS_AXES
        shown_w, shown_h = (stored_h, stored_w) if swap else (stored_w, stored_h)
        scaled = final = None
        if options.resize is not None:
            scaled = _scaled_size(shown_w, shown_h, options.resize, options.resize_mode, options.upscale)
            final = resize_size(shown_w, shown_h, options.resize, options.resize_mode, options.upscale)
            if scaled == (shown_w, shown_h):
                scaled = None  # nothing to scale (maybe still a crop)
        box = None
        if scaled is not None:
            raw_target = (scaled[1], scaled[0]) if swap else scaled
            if (options.draft and img.format in ("JPEG", "MPO")
                    and 2 * raw_target[0] <= stored_w and 2 * raw_target[1] <= stored_h):
                drafted = img.draft(None, raw_target)  # decodes at >= raw_target, 1/2..1/8 scale
                if drafted is not None:
                    box = drafted[1]
        img.load()
        img = _normalize_mode(img)
        if scaled is not None:
            img = img.resize(raw_target, Image.Resampling.LANCZOS, box=box)
        method = _transpose_method(orientation)
        if method is not None:
            img = img.transpose(method)
        if final is not None and final != img.size:
            left, top = (img.size[0] - final[0]) // 2, (img.size[1] - final[1]) // 2
            img = img.crop((left, top, left + final[0], top + final[1]))
        fmt = _output_format(options, orig_format, img.mode in ("LA", "RGBA"))
        encoded = _encode(img, fmt, options.quality)
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"{source}: too large for Pillow: {exc}") from exc
    except _PIL_ERRORS as exc:
        raise CorruptDataError(f"{source}: cannot re-encode image: {type(exc).__name__}: {exc}") from exc
    out_mode = img.mode
    if fmt == "jpg" and out_mode in ("LA", "RGBA"):
        out_mode = out_mode[:-1] if out_mode == "RGBA" else "L"
    elif fmt == "webp" and out_mode in ("L", "LA"):
        out_mode = "RGB" if out_mode == "L" else "RGBA"
    return ReencodedImage(encoded, fmt, img.size[0], img.size[1], out_mode, shown_w, shown_h, orig_format)


def reencode_payload(data: bytes, ext: str, meta: dict, options: ReencodeOptions, *,
                     source: str = "<bytes>") -> tuple[bytes, str, dict]:
    """Re-encode one sample's image: the hook :func:`~shardfeed.convert.write.samples.load_sample_payload` calls.

    Args:
        data: the source image bytes.
        ext: the source extension (unused for decoding: the format is sniffed; kept for symmetry).
        meta: the sample's metadata; not modified.
        options: :class:`ReencodeOptions`.
        source: the source path, for error messages.

    Returns:
        ``(bytes, ext, meta)`` to store: the new bytes, their extension, and a new metadata dict
        with ``orig_width``, ``orig_height`` and ``orig_format`` added.

    Raises:
        As :func:`reencode_image`.
    """
    r = reencode_image(data, options, source=source)
    return r.data, r.ext, {**meta, "orig_width": r.orig_width, "orig_height": r.orig_height,
                           "orig_format": r.orig_format}
