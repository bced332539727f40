"""JPEG bytes without Pillow: the header walk, the EXIF orientation, and the simplejpeg binding.

The fast path of :mod:`shardfeed.readers.decode.image` (and of GPU batch decoding) reads a JPEG's size
and EXIF orientation straight from its marker segments, because Pillow's pure-Python JPEG parser
costs about a tenth of a 375-500 px decode; anything this module does not handle exactly as Pillow
would makes :func:`read_jpeg_header` return ``None``, and the caller takes Pillow's header path.
:func:`jpeg_is_complete` is the end-of-image check both backends apply to every JPEG.
``simplejpeg`` (its own bundled libjpeg-turbo; the ``jpeg`` extra) is imported lazily, once.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["ORIENTATION_TAG", "SOF_MARKERS", "exif_orientation", "jpeg_is_complete", "read_jpeg_header",
           "simplejpeg_available", "simplejpeg_decode", "simplejpeg_module", "is_truncation_warning"]

#: EXIF's orientation tag (IFD0).
ORIENTATION_TAG = 0x0112

logger = logging.getLogger(__name__)

_simplejpeg_module: Any = None
_simplejpeg_checked = False
_refusal_logged = False


def simplejpeg_available() -> bool:
    """Whether ``import simplejpeg`` works (imported once, lazily, on first call).

    Returns:
        True when the ``"simplejpeg"`` backend can run.
    """
    return simplejpeg_module() is not None


def simplejpeg_module() -> Any:
    """The ``simplejpeg`` module, or None when it is not installed (imported once, on first call)."""
    global _simplejpeg_module, _simplejpeg_checked
    if not _simplejpeg_checked:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = None
        _simplejpeg_module, _simplejpeg_checked = simplejpeg, True
    return _simplejpeg_module


def jpeg_is_complete(data: bytes) -> bool:
    """True when an end-of-image marker follows the first start-of-scan segment.

    Walks the marker segments from SOI to the first SOS (skipping junk bytes between markers, as
    libjpeg and Pillow do), then looks for ``FF D9`` after it. Entropy-coded data cannot contain
    ``FF D9`` (``FF`` is byte-stuffed), so a file cut anywhere in its scans has none.
    """
    n = len(data)
    pos = 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:
            pos += 2
        elif marker == 0xD9:
            return False
        else:
            segment_end = pos + 2 + ((data[pos + 2] << 8) | data[pos + 3])
            if marker == 0xDA:
                return data.rfind(b"\xff\xd9", segment_end) != -1
            pos = segment_end
    return False


SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def read_jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """``(width, height, orientation)`` of a plain 8-bit colour/grey JPEG, read without Pillow.

    The simplejpeg path's header probe (Pillow's pure-Python JPEG parser costs about a tenth of a
    375-500 px decode). One walk over the marker segments, SOI to SOS: the SOF size and component
    count, the first ``Exif`` APP1 segment's IFD0 orientation (what Pillow's ``getexif`` reads)
    and the presence of an XMP packet; then the end-of-image check of :func:`jpeg_is_complete`.
    Anything it does not handle exactly as Pillow would (not 8-bit, not 1 or 3 components, an
    XMP packet without an EXIF orientation, a malformed or unusual EXIF orientation entry, a
    truncated file) returns ``None``, and the caller takes the Pillow header path, which decides.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos = 2
    size = None
    exif = None
    xmp = False
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD9:
            if marker == 0xD9:
                return None
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker in SOF_MARKERS:
            segment = data[pos + 4 : pos + 2 + length]  # sliced only where read: tables are skipped
            if size is not None or len(segment) < 6 or segment[0] != 8 or segment[5] not in (1, 3):
                return None
            height, width = (segment[1] << 8) | segment[2], (segment[3] << 8) | segment[4]
            if not width or not height:
                return None
            size = (width, height)
        elif marker == 0xE1:
            segment = data[pos + 4 : pos + 2 + length]
            if segment[:6] == b"Exif\x00\x00":
                if exif is not None:
                    return None  # Pillow joins several EXIF segments: let it
                exif = segment[6:]
            elif segment.startswith(b"http://ns.adobe.com/xap/1.0/"):
                xmp = True
        elif marker == 0xDA:
            if size is None or data.rfind(b"\xff\xd9", pos + 2 + length) == -1:
                return None
            orientation = exif_orientation(exif) if exif is not None else 0
            if orientation is None or (orientation == 0 and xmp):
                return None  # unusual EXIF, or XMP may hold the orientation: Pillow decides
            return size[0], size[1], orientation if 1 <= orientation <= 8 else 1
        pos += 2 + length
    return None


def exif_orientation(tiff: bytes) -> int | None:
    """IFD0's orientation (tag 0x0112) from EXIF's TIFF block: 0 when absent, None when unusual."""
    if len(tiff) < 8 or tiff[:4] not in (b"II*\x00", b"MM\x00*"):
        return None
    endian = "<" if tiff[0] == 0x49 else ">"
    (ifd,) = struct.unpack_from(endian + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(endian + "H", tiff, ifd)
    if ifd + 2 + 12 * count > len(tiff):
        return None
    for i in range(count):
        tag, kind, num = struct.unpack_from(endian + "HHI", tiff, ifd + 2 + 12 * i)
        if tag == ORIENTATION_TAG:
            if num != 1 or kind not in (3, 4):  # one SHORT or LONG; anything else: ask Pillow
                return None
            fmt = "H" if kind == 3 else "I"
            return struct.unpack_from(endian + fmt, tiff, ifd + 2 + 12 * i + 8)[0]
    return 0


#: libjpeg's warnings that mean the scan data ended before the image did (JWRN_HIT_MARKER,
#: JWRN_JPEG_EOF): libjpeg fills the rest with grey and goes on; shardfeed refuses the image.
_TRUNCATION_WARNINGS = ("premature end of data segment", "premature end of jpeg file")


def is_truncation_warning(message: str) -> bool:
    """Whether a libjpeg warning says the image data ended before the image (see :data:`_TRUNCATION_WARNINGS`)."""
    text = message.lower()
    return any(w in text for w in _TRUNCATION_WARNINGS)


def simplejpeg_decode(data: bytes, width: int, height: int, factor: int, *,
                      source: str | None = None) -> "np.ndarray | None":
    """simplejpeg's RGB decode at scale ``1 / factor``; None when it refuses the file.

    strict mode refuses what libjpeg only warns about (extraneous bytes before a marker, ...),
    which Pillow tolerates: the caller then hands the file to Pillow, which decodes or raises
    (the first refusal in a process is logged at DEBUG). A warning that the scan data ended
    early (a JPEG cut short, even one with a forged end-of-image marker) is not handed on: it
    raises, since every library would fill the missing rows with grey.

    Raises:
        CorruptDataError: libjpeg reports the scan data ended before the image (names ``source``).

    Args:
        data: A JPEG (bytes).
        width, height: Its stored size in pixels (used when ``factor > 1``).
        factor: 1, 2, 4 or 8.

    Returns:
        ``(ceil(height / factor), ceil(width / factor), 3)`` ``uint8`` RGB array, or None.
    """
    global _refusal_logged
    try:
        if factor > 1:
            # the smallest libjpeg-turbo scale giving at least ceil(size / f) is exactly 1/f
            return simplejpeg_module().decode_jpeg(data, "RGB", False, False, -(-height // factor),
                                                   -(-width // factor))
        return simplejpeg_module().decode_jpeg(data, "RGB")
    except ValueError as exc:
        if is_truncation_warning(str(exc)):
            from ..errors import CorruptDataError

            raise CorruptDataError(f"cannot decode image from {source or '<bytes>'}: truncated JPEG (libjpeg: "
                                   f"{exc}); the image data ends before the image does") from None
        if not _refusal_logged:
            _refusal_logged = True
            logger.debug("simplejpeg refused a JPEG (%s); decoding it with Pillow", exc)
        return None
