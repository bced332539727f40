"""CPU transforms after :func:`~shardfeed.readers.decode.decode_image`, and batching.

Everything here works on the decoder's output — ``numpy.ndarray`` ``(H, W, 3)`` ``uint8`` RGB —
and hands the training loop ``torch.uint8`` tensors ``[3, H, W]`` (batches ``[B, 3, H, W]``).
Conversion to float and normalisation happen on the device, after a ``non_blocking`` copy.

Resizing (``resample="area"``, the rule of every path but the fast one): OpenCV ``INTER_AREA``
when neither side grows (a proper box filter, no aliasing when shrinking), ``INTER_LINEAR``
otherwise (bilinear, torchvision's default). ``resample="antialias"`` (the simplejpeg path of
:class:`SampleDecoder`): ``torch.nn.functional.interpolate(mode="bilinear",
antialias=True)`` on the ``uint8`` image, torchvision's own antialiased resize — about 3x faster
than OpenCV's ``INTER_AREA`` at non-integer factors here, and within 0.4 grey levels of it (mean
absolute difference on the bench's 375-500 px JPEGs shrunk to 224).

Randomness: :class:`TrainTransform` draws from a ``numpy.random.Generator``. In a ``DataLoader``
use :class:`SampleDecoder`, which seeds one generator per (seed, epoch, rank, worker) through
:func:`make_rng`, so a run reproduces and no two workers or ranks draw the same stream.

``torch`` is imported lazily, inside the functions that build tensors.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .batch_ring import row_planes
from .decode import (DECODERS, DEFAULT_MAX_DECODE_BYTES, DEFAULT_MAX_PIXELS, decode_crop_unchecked, decode_image,
                     resolve_decoder)
from .decode_backends import import_cv2

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .batch_ring import BatchRing

__all__ = [
    "RESAMPLE",
    "resize_shorter",
    "shorter_side_shape",
    "center_crop",
    "to_chw_tensor",
    "make_rng",
    "sample_generator",
    "resize_size_for",
    "EvalTransform",
    "TrainTransform",
    "SampleDecoder",
    "collate_uint8",
]

logger = logging.getLogger(__name__)

_CROP_ATTEMPTS = 10
#: image sizes whose evaluation box :meth:`EvalTransform.source_box` keeps (about 4 us each to compute)
_BOX_CACHE_SIZE = 4096


# ---------------------------------------------------------------------------------------------
# Functions on HWC uint8 arrays


def _check_image(img: np.ndarray) -> None:
    if not isinstance(img, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray (H, W, 3) uint8, got {type(img).__name__}")
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got shape {img.shape} {img.dtype}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"image is empty: shape {img.shape}")


def _check_size(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int (pixels), got {value!r}")


def _resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    if (height, width) == img.shape[:2]:
        return img
    # OpenCV is imported on first use, not with this module: a process that only opens a dataset
    # (make_loader's parent) then never holds OpenCV when it forks the DataLoader workers, so each
    # worker can be given one OpenCV thread (loader.worker_init; see _cv2_threads_if_forking).
    cv2 = import_cv2('resample="area" (the resize of decoder="pil"/"cv2")')

    shrinking = width <= img.shape[1] and height <= img.shape[0]
    interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(img, (width, height), interpolation=interpolation)


#: Names accepted by the transforms' ``resample`` option (see the module docstring).
RESAMPLE: tuple[str, ...] = ("area", "antialias")


def _check_resample(resample: str) -> str:
    if resample not in RESAMPLE:
        raise ValueError(f"resample must be one of {', '.join(RESAMPLE)}, got {resample!r}")
    return resample


def _resize_antialias_chw(img: np.ndarray, width: int, height: int, flip: bool = False) -> "torch.Tensor":
    """HWC ``uint8`` (any positive strides) -> contiguous CHW ``uint8`` tensor of ``height x width``.

    torch's antialiased bilinear resize (its ``uint8`` channels-last kernel), then an optional
    left-right flip. The antialias filter only widens along an axis that shrinks.
    """
    import torch
    import torch.nn.functional as F

    if not img.flags.writeable or any(stride < 0 for stride in img.strides):
        img = np.array(img)
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0)
    if x.shape[2:] != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    x = x[0]
    if flip:
        x = x.flip(2)
    return x.contiguous()


def _window_to_chw(window: np.ndarray, size: int, *, resample: str, flip: bool = False,
                   out: "torch.Tensor | None" = None, out_planes: "Sequence[np.ndarray] | None" = None
                   ) -> "torch.Tensor":
    """Resize an HWC ``uint8`` window to ``size`` x ``size``, maybe flip it, as CHW ``uint8``.

    The output side of both built-in transforms. When neither side shrinks, a plain bilinear
    resize (OpenCV ``INTER_LINEAR``, torchvision's bilinear, through OpenCV's 16-bit kernel from
    32 rows: :func:`_bilinear_uint8`; an antialias filter only acts along a shrinking axis, so
    torch's antialiased kernel gives the same pixels within one grey level, at about 3x the
    cost), then the flip and the HWC -> CHW split by OpenCV (``cv2.split`` into the planes of
    ``out``; torch's ``permute().contiguous()`` of ``uint8`` costs more than the resize). When a
    side shrinks: ``resample`` (``"antialias"``: torch's antialiased bilinear; ``"area"``: OpenCV
    ``INTER_AREA`` when both sides shrink, the bilinear resize when the other one grows). Without
    OpenCV installed, torch's antialiased bilinear does all of it.

    Args:
        window: ``(h, w, 3)`` ``uint8`` (positive strides, pixels contiguous).
        size: Output side, pixels.
        resample: One of :data:`RESAMPLE`, for a shrinking side.
        flip: Flip left-right after resizing.
        out: Optional contiguous ``torch.uint8`` ``[3, size, size]`` to write into.
        out_planes: ``out``'s three planes as numpy ``(size, size)`` views, where the caller has
            them (:func:`~shardfeed.readers.batch_ring.row_planes`); default ``out.numpy()``.

    Returns:
        ``out`` (or a new tensor): contiguous ``torch.uint8`` ``[3, size, size]``.
    """
    cv2 = _optional_cv2()
    height, width = window.shape[:2]
    if out is None:
        import torch

        out = torch.empty((3, size, size), dtype=torch.uint8)
    if cv2 is None or (resample == "antialias" and (height > size or width > size)):
        resized = _resize_antialias_chw(window, size, size, flip=flip)
        out.copy_(resized)
        return out
    strides = window.strides
    if strides[1] != 3 or strides[2] != 1 or strides[0] < 0:
        window = np.array(window, order="C")
    if flip and height * width < size * size:
        # the mirror of a resize is the resize of the mirror (the sampling grid is symmetric):
        # flip whichever of window and output has fewer pixels
        window, flip = cv2.flip(window, 1), False
    if height >= size and width >= size:
        if height != size or width != size:  # _resize's rule: INTER_AREA when neither side grows
            window = cv2.resize(window, (size, size), interpolation=cv2.INTER_AREA)
    elif height >= _WIDE_BILINEAR_MIN_ROWS:
        window = _bilinear_uint8(cv2, window, size)
    else:
        window = cv2.resize(window, (size, size), interpolation=cv2.INTER_LINEAR)
    if flip:
        window = cv2.flip(window, 1)
    if out_planes is None:
        planes = out.numpy()
        out_planes = [planes[0], planes[1], planes[2]]
    cv2.split(window, out_planes)
    return out


#: Rows from which an enlarging resize goes through OpenCV's 16-bit kernel (:func:`_bilinear_uint8`):
#: its per-row work is cheaper, its per-output-pixel work dearer, and they cross near 30 rows
#: (``scripts/bench_enlarge.py``, to 224 x 224: 0.059 against 0.049 ms at 8-19 rows, 0.053 against
#: 0.056 at 32-47)
_WIDE_BILINEAR_MIN_ROWS = 32


def _bilinear_uint8(cv2: Any, img: np.ndarray, size: int) -> np.ndarray:
    """OpenCV's bilinear resize of an HWC ``uint8`` image to ``size`` x ``size``, through ``uint16``.

    OpenCV's 16-bit bilinear kernel computes in floating point and rounds to nearest; its 8-bit
    one uses 11-bit fixed-point weights, which leave about one pixel in eight a grey level off the
    exact bilinear value, and from about 30 source rows up it costs more (resize and CHW split of
    64-95 px windows enlarged to 224: 0.068 ms against 0.060, ``scripts/bench_enlarge.py``). The values of a
    bilinear interpolation of ``uint8`` pixels stay within 0..255, so the narrowing copy is exact.
    """
    wide = cv2.resize(img.astype(np.uint16), (size, size), interpolation=cv2.INTER_LINEAR)
    return wide.astype(np.uint8)


_cv2_module: Any = None


def _optional_cv2() -> Any:
    """``cv2``, or None when OpenCV is not installed (looked up once, on first use)."""
    global _cv2_module
    if _cv2_module is None:
        try:
            import cv2
        except ImportError:  # OpenCV is optional: torch's bilinear gives the same pixels (see above)
            cv2 = False
        _cv2_module = cv2
    return _cv2_module or None


def shorter_side_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """The shape :func:`resize_shorter` gives: the shorter side ``size``, the other scaled.

    Args:
        height: Image height, pixels.
        width: Image width, pixels.
        size: Target shorter side, pixels.

    Returns:
        ``(new_h, new_w)``: the other side is ``round(other * size / shorter)`` (half rounds
        up), at least 1.
    """
    if height <= width:
        return size, max(1, (2 * width * size + height) // (2 * height))
    return max(1, (2 * height * size + width) // (2 * width)), size


def resize_shorter(img: np.ndarray, size: int) -> np.ndarray:
    """Resize so that the shorter side is ``size``, keeping the aspect ratio.

    The other side becomes ``round(other * size / shorter)`` (half rounds up), at least 1.
    Shrinking uses ``cv2.INTER_AREA``, enlarging ``cv2.INTER_LINEAR``.

    Args:
        img: ``(H, W, 3)`` ``uint8`` array.
        size: Target length of the shorter side, in pixels.

    Returns:
        ``(H', W', 3)`` ``uint8`` array with ``min(H', W') == size``; ``img`` itself when its
        shorter side already is ``size``.

    Raises:
        TypeError: ``img`` is not a numpy array.
        ValueError: ``img`` is not ``(H, W, 3)`` ``uint8``, or ``size`` is not a positive int.
    """
    _check_image(img)
    _check_size("size", size)
    new_h, new_w = shorter_side_shape(img.shape[0], img.shape[1], int(size))
    return _resize(img, new_w, new_h)


def center_crop(img: np.ndarray, size: int) -> np.ndarray:
    """Cut the central ``size`` x ``size`` square.

    The top-left corner is ``((H - size) // 2, (W - size) // 2)``.

    Args:
        img: ``(H, W, 3)`` ``uint8`` array with ``H >= size`` and ``W >= size``.
        size: Side of the square, in pixels.

    Returns:
        ``(size, size, 3)`` ``uint8`` view into ``img`` (no copy; not C-contiguous unless the
        crop spans whole rows).

    Raises:
        TypeError: ``img`` is not a numpy array.
        ValueError: ``img`` is not ``(H, W, 3)`` ``uint8``, ``size`` is not a positive int, or
            the image is smaller than ``size`` (call :func:`resize_shorter` first).
    """
    _check_image(img)
    _check_size("size", size)
    height, width = img.shape[:2]
    if height < size or width < size:
        raise ValueError(
            f"cannot center-crop {size}x{size} from a {height}x{width} image; "
            "resize its shorter side first (resize_shorter)"
        )
    top, left = (height - size) // 2, (width - size) // 2
    return img[top : top + size, left : left + size]


def to_chw_tensor(img: np.ndarray) -> "torch.Tensor":
    """Turn an ``(H, W, 3)`` ``uint8`` array into a contiguous ``torch.uint8`` tensor ``[3, H, W]``.

    One copy (the HWC → CHW transpose). A read-only or negatively strided array is copied first.

    Args:
        img: ``(H, W, 3)`` ``uint8`` array (any positive strides, e.g. a crop view).

    Returns:
        ``torch.Tensor`` of dtype ``torch.uint8`` and shape ``[3, H, W]``, contiguous, not
        sharing memory with ``img``.

    Raises:
        TypeError: ``img`` is not a numpy array.
        ValueError: ``img`` is not ``(H, W, 3)`` ``uint8``.
    """
    import torch

    _check_image(img)
    if not img.flags.writeable or any(stride < 0 for stride in img.strides):
        img = np.array(img, order="C")  # a copy: ascontiguousarray keeps a negative stride of a length-1 axis
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def make_rng(seed: int, epoch: int, rank: int, worker: int) -> np.random.Generator:
    """A generator seeded from ``numpy.random.SeedSequence([seed, epoch, rank, worker])``.

    Distinct tuples give statistically independent streams; equal tuples give equal streams.

    Args:
        seed: The run's seed (``>= 0``).
        epoch: Epoch number (``>= 0``).
        rank: Distributed rank (``>= 0``).
        worker: DataLoader worker id (``>= 0``; use 0 in the main process).

    Returns:
        A fresh ``numpy.random.Generator`` (PCG64).

    Raises:
        ValueError: Any argument is negative or not an int.
    """
    parts = (seed, epoch, rank, worker)
    for name, value in zip(("seed", "epoch", "rank", "worker"), parts):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return np.random.default_rng(np.random.SeedSequence([int(v) for v in parts]))


_MASK64 = (1 << 64) - 1
_sample_generators = threading.local()


def _mix64(x: int) -> int:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014): a bijection of 64-bit words that mixes well."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _fold(h: int, value: int) -> int:
    """Mix a non-negative int of any size into the 64-bit hash ``h``, 64 bits at a time."""
    while True:
        h = _mix64(h ^ (value & _MASK64))
        value >>= 64
        if not value:
            return h


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's random crop and flip: its draws depend only on the three ints.

    One ``numpy.random.Generator`` (PCG64) per thread, re-seeded in place for each sample: its
    128-bit state and 128-bit increment are SplitMix64 hashes of ``(seed, epoch, index)``. That
    costs about 2 us, against about 13 us for a new ``default_rng(SeedSequence)`` per sample,
    which is what a small image's whole decode costs. Equal triples give equal streams in every
    process and run (a resumed run crops as an uninterrupted one); distinct triples give
    distinct, well-mixed PCG64 streams.

    The returned object is re-seeded by the next call in the same thread: draw this sample's
    numbers before asking for the next sample's generator.

    Args:
        seed: The run's seed (``>= 0``).
        epoch: Epoch number (``>= 0``).
        index: The sample's index in packing order (``>= 0``).

    Returns:
        This thread's ``numpy.random.Generator``, seeded for the sample.
    """
    local = _sample_generators
    bits = getattr(local, "bits", None)
    if bits is None:
        bits = local.bits = np.random.PCG64(0)
        local.generator = np.random.Generator(bits)
        local.prefix_key = None
    key = (seed, epoch)
    if local.prefix_key != key:  # the hash of (seed, epoch), kept while they stay the same
        local.prefix = _fold(_fold(0x5A3D1E, int(seed)), int(epoch))
        local.prefix_key = key
    h = _fold(local.prefix, int(index))
    state = (_mix64(h ^ 1) << 64) | _mix64(h ^ 2)
    inc = (_mix64(h ^ 3) << 64) | _mix64(h ^ 4) | 1
    bits.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}
    return local.generator


def resize_size_for(image_size: int, resize_size: int | None = None,
                    crop_pct: float | None = None) -> int:
    """The shorter side the evaluation transform resizes to before its central crop.

    ``resize_size`` is torchvision's name (its ImageNet presets: ``resize_size=256``,
    ``crop_size=224``); ``crop_pct`` is timm's (``resize = floor(image_size / crop_pct)``, so
    ``crop_pct=0.875`` with 224 gives 256). Neither: ``image_size`` (resize the shorter side to
    the output side and crop the centre square).

    Args:
        image_size: Output side, pixels.
        resize_size: Shorter side before cropping, pixels (``>= image_size``).
        crop_pct: Fraction of the shorter side the crop keeps, ``0 < crop_pct <= 1``.

    Returns:
        The shorter side, pixels.

    Raises:
        ValueError: Both given, ``resize_size < image_size``, or ``crop_pct`` out of range.
    """
    _check_size("image_size", image_size)
    if resize_size is not None and crop_pct is not None:
        raise ValueError(f"pass resize_size={resize_size} or crop_pct={crop_pct}, not both "
                         f"(crop_pct={crop_pct} means resize_size={math.floor(image_size / crop_pct)})")
    if crop_pct is not None:
        if isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float)) or not 0.0 < crop_pct <= 1.0:
            raise ValueError(f"crop_pct must be a number in (0, 1] (e.g. 0.875), got {crop_pct!r}")
        return max(int(image_size), math.floor(image_size / crop_pct))
    if resize_size is None:
        return int(image_size)
    _check_size("resize_size", resize_size)
    if resize_size < image_size:
        raise ValueError(f"resize_size={resize_size} is smaller than image_size={image_size}: the shorter side "
                         f"is resized to resize_size, then the central image_size square is cut (e.g. "
                         f"image_size=224, resize_size=256)")
    return int(resize_size)


# ---------------------------------------------------------------------------------------------
# Transforms


class EvalTransform:
    """Resize the shorter side to ``resize_size``, then center-crop ``image_size`` x ``image_size``.

    Args:
        image_size: Output side, in pixels.
        resize_size: Shorter side before cropping, in pixels (``>= image_size``); defaults to
            ``image_size`` (docs/reading.md). Pass e.g. ``round(image_size / 0.875)`` for the classic
            ImageNet evaluation crop.
        resample: ``"area"`` (OpenCV, the default) or ``"antialias"`` (torch's antialiased
            bilinear; see the module docstring).

    Raises:
        ValueError: A size is not a positive int, ``resize_size < image_size``, or an unknown
            ``resample``.
    """

    def __init__(self, image_size: int, resize_size: int | None = None, resample: str = "area") -> None:
        _check_size("image_size", image_size)
        resize_size = image_size if resize_size is None else resize_size
        _check_size("resize_size", resize_size)
        if resize_size < image_size:
            raise ValueError(f"resize_size={resize_size} is smaller than image_size={image_size}")
        self.image_size = int(image_size)
        self.resize_size = int(resize_size)
        self.resample = _check_resample(resample)
        #: (height, width, image_size, resize_size) -> source_box: a dataset's images come in few sizes
        self._boxes: dict[tuple[int, int, int, int], tuple[int, int, int, int]] = {}

    def __call__(self, img: np.ndarray) -> "torch.Tensor":
        """Apply the transform.

        Args:
            img: ``(H, W, 3)`` ``uint8`` array.

        Returns:
            ``torch.uint8`` tensor ``[3, image_size, image_size]``.

        Raises:
            TypeError: ``img`` is not a numpy array.
            ValueError: ``img`` is not ``(H, W, 3)`` ``uint8``.
        """
        if self.resample == "area":
            return to_chw_tensor(center_crop(resize_shorter(img, self.resize_size), self.image_size))
        _check_image(img)
        new_h, new_w = shorter_side_shape(img.shape[0], img.shape[1], self.resize_size)
        out = _resize_antialias_chw(img, new_w, new_h)
        size = self.image_size
        top, left = (new_h - size) // 2, (new_w - size) // 2  # center_crop's corner
        return out[:, top : top + size, left : left + size].contiguous()

    def source_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """The part of a ``height x width`` image that :meth:`__call__`'s crop shows, in its pixels.

        Resizing the shorter side to ``resize_size`` and cutting the central ``image_size``
        square keeps the box ``[top, top + image_size) x [left, left + image_size)`` of the
        resized image (the corner of :func:`center_crop`); mapped back by the resize's scale
        (``height / new_h`` down, ``width / new_w`` across), each edge rounded to a whole pixel
        (so within half a source pixel of the exact edge). Cutting this box and resizing only it
        to ``image_size`` x ``image_size`` (:meth:`finish`) is the crop-first evaluation path:
        the discarded border is neither resized nor, with
        :func:`~shardfeed.readers.decode.decode_crop`, decoded at more than the scale it needs.

        Args:
            height: Image height, pixels (upright frame).
            width: Image width, pixels.

        Returns:
            ``(top, left, box_h, box_w)``, pixels, inside the image, each side at least 1.
        """
        key = (height, width, self.image_size, self.resize_size)
        boxes = self._boxes
        box = boxes.get(key)
        if box is None:
            box = self._source_box(height, width)
            if len(boxes) < _BOX_CACHE_SIZE:
                boxes[key] = box
        return box

    def _source_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """:meth:`source_box`, computed."""
        size = self.image_size
        new_h, new_w = shorter_side_shape(height, width, self.resize_size)
        top, left = (new_h - size) // 2, (new_w - size) // 2
        y0 = min(height - 1, int(round(top * height / new_h)))
        x0 = min(width - 1, int(round(left * width / new_w)))
        y1 = min(height, max(y0 + 1, int(round((top + size) * height / new_h))))
        x1 = min(width, max(x0 + 1, int(round((left + size) * width / new_w))))
        return y0, x0, y1 - y0, x1 - x0

    def finish(self, window: np.ndarray, out: "torch.Tensor | None" = None) -> "torch.Tensor":
        """Resize the cut :meth:`source_box` window to ``image_size`` x ``image_size``.

        Args:
            window: ``(h, w, 3)`` ``uint8`` (any scale: it is resized).
            out: Optional contiguous ``torch.uint8`` ``[3, image_size, image_size]`` to write into.

        Returns:
            ``out`` or a new contiguous ``torch.uint8`` tensor ``[3, image_size, image_size]``.

        Raises:
            TypeError, ValueError: ``window`` is not an ``(h, w, 3)`` ``uint8`` array.
        """
        _check_image(window)
        return _window_to_chw(window, self.image_size, resample=self.resample, out=out)

    def __repr__(self) -> str:
        return (f"EvalTransform(image_size={self.image_size}, resize_size={self.resize_size}, "
                f"resample={self.resample!r})")


class TrainTransform:
    """Random resized crop to ``image_size`` x ``image_size``, then a random horizontal flip.

    Same semantics as ``torchvision.transforms.RandomResizedCrop``: up to 10 attempts to draw an
    area fraction uniformly from ``scale`` and a log-uniform aspect ratio (width / height) from
    ``ratio`` that fits in the image; failing that, a central crop with the aspect ratio clamped
    into ``ratio``. The crop is resized with the module's rule (``INTER_AREA`` when shrinking,
    ``INTER_LINEAR`` otherwise), then flipped left-right with probability 0.5 when ``flip``.

    Random numbers come from the ``rng`` passed to :meth:`__call__`, else from the generator
    given to :meth:`set_rng`, else from ``make_rng(0, 0, 0, 0)`` (reproducible, but the same in
    every DataLoader worker: use :class:`SampleDecoder`, or call :meth:`set_rng` per worker).

    Args:
        image_size: Output side, in pixels.
        scale: ``(min, max)`` fraction of the image area to crop, ``0 < min <= max <= 1``.
        ratio: ``(min, max)`` aspect ratio (width / height) of the crop, ``0 < min <= max``.
        flip: Whether to flip horizontally with probability 0.5.
        resample: ``"area"`` (OpenCV, the default) or ``"antialias"`` (torch's antialiased
            bilinear; see the module docstring).

    Raises:
        ValueError: ``image_size`` is not a positive int, ``scale``/``ratio`` is out of range, or
            an unknown ``resample``.
    """

    def __init__(
        self,
        image_size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        resample: str = "area",
    ) -> None:
        _check_size("image_size", image_size)
        scale_lo, scale_hi = (float(v) for v in scale)
        ratio_lo, ratio_hi = (float(v) for v in ratio)
        if not 0.0 < scale_lo <= scale_hi <= 1.0:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {tuple(scale)}")
        if not 0.0 < ratio_lo <= ratio_hi:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {tuple(ratio)}")
        self.image_size = int(image_size)
        self.scale = (scale_lo, scale_hi)
        self.ratio = (ratio_lo, ratio_hi)
        self.flip = bool(flip)
        self.resample = _check_resample(resample)
        self._rng: np.random.Generator | None = None
        self._bounds: tuple = ()

    def set_rng(self, rng: np.random.Generator) -> None:
        """Use ``rng`` for every later call that passes no generator.

        Args:
            rng: A ``numpy.random.Generator`` (see :func:`make_rng`).

        Raises:
            TypeError: ``rng`` is not a ``numpy.random.Generator``.
        """
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self._rng = rng

    def sample_crop(
        self, height: int, width: int, rng: np.random.Generator
    ) -> tuple[int, int, int, int]:
        """Draw a crop box the way ``RandomResizedCrop.get_params`` does.

        Args:
            height: Image height, in pixels.
            width: Image width, in pixels.
            rng: Generator to draw from.

        Returns:
            ``(top, left, crop_height, crop_width)`` in pixels, inside the image.
        """
        area = height * width
        bounds = self._bounds
        if not bounds or bounds[0] is not self.scale or bounds[1] is not self.ratio:
            log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
            bounds = self._bounds = (self.scale, self.ratio, self.scale[0], self.scale[1] - self.scale[0],
                                     log_lo, log_hi - log_lo)
        _, _, scale_lo, scale_span, log_lo, log_span = bounds
        random = rng.random
        for _ in range(_CROP_ATTEMPTS):
            # rng.uniform(lo, hi) is lo + (hi - lo) * rng.random(), bit for bit, at a quarter of the cost
            target_area = area * (scale_lo + scale_span * random())
            aspect = math.exp(log_lo + log_span * random())
            crop_w = int(round(math.sqrt(target_area * aspect)))
            crop_h = int(round(math.sqrt(target_area / aspect)))
            if 0 < crop_w <= width and 0 < crop_h <= height:
                top = int(rng.integers(0, height - crop_h + 1))
                left = int(rng.integers(0, width - crop_w + 1))
                return top, left, crop_h, crop_w
        # Fallback: central crop, aspect ratio clamped into `ratio`.
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            crop_w, crop_h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            crop_h, crop_w = height, int(round(height * self.ratio[1]))
        else:
            crop_w, crop_h = width, height
        crop_h, crop_w = max(1, min(crop_h, height)), max(1, min(crop_w, width))
        return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> "torch.Tensor":
        """Apply the transform.

        Args:
            img: ``(H, W, 3)`` ``uint8`` array.
            rng: Generator for this call; defaults to the one from :meth:`set_rng`.

        Returns:
            ``torch.uint8`` tensor ``[3, image_size, image_size]``.

        Raises:
            TypeError: ``img`` is not a numpy array.
            ValueError: ``img`` is not ``(H, W, 3)`` ``uint8``.
        """
        _check_image(img)
        rng = self._pick_rng(rng)
        top, left, crop_h, crop_w = self.sample_crop(img.shape[0], img.shape[1], rng)
        return self.finish(img[top : top + crop_h, left : left + crop_w], rng)

    def finish(self, window: np.ndarray, rng: np.random.Generator | None = None,
               out: "torch.Tensor | None" = None) -> "torch.Tensor":
        """The steps after the box: resize the cut window to the output size, then maybe flip.

        :meth:`__call__` is ``sample_crop`` + cut + ``finish``; the fused path
        (:func:`~shardfeed.readers.decode.decode_crop` with :meth:`sample_crop` as its ``crop``)
        decodes the window itself and calls ``finish`` with the same generator, so the flip is the
        next draw after the box in both.

        Args:
            window: The cut crop, ``(h, w, 3)`` ``uint8`` (any scale: it is resized).
            rng: Generator for the flip; defaults to the one from :meth:`set_rng`.
            out: Optional contiguous ``torch.uint8`` ``[3, image_size, image_size]`` to write
                the result into (e.g. a row of a batch buffer).

        Returns:
            ``out`` or a new contiguous ``torch.uint8`` tensor ``[3, image_size, image_size]``.

        Raises:
            TypeError: ``window`` is not a numpy array.
            ValueError: ``window`` is not ``(h, w, 3)`` ``uint8``.
        """
        _check_image(window)
        return self._finish_into(window, self._pick_rng(rng), out)

    def _finish_into(self, window: np.ndarray, rng: np.random.Generator, out: "torch.Tensor | None",
                     out_planes: "Sequence[np.ndarray] | None" = None) -> "torch.Tensor":
        """:meth:`finish` on a window known to be ``(h, w, 3)`` ``uint8``, with an explicit generator
        (and ``out``'s planes, as :func:`_window_to_chw` takes them)."""
        flip = self.flip and rng.random() < 0.5
        return _window_to_chw(window, self.image_size, resample=self.resample, flip=flip, out=out,
                              out_planes=out_planes)

    def _pick_rng(self, rng: np.random.Generator | None) -> np.random.Generator:
        if rng is not None:
            return rng
        if self._rng is None:
            self._rng = make_rng(0, 0, 0, 0)
        return self._rng

    def __repr__(self) -> str:
        return (
            f"TrainTransform(image_size={self.image_size}, scale={self.scale}, "
            f"ratio={self.ratio}, flip={self.flip}, resample={self.resample!r})"
        )


# ---------------------------------------------------------------------------------------------
# Per-sample decoding for every source, and batching


_get_worker_info: Any = None


def _current_worker_id(default: int = 0) -> int:
    global _get_worker_info
    if _get_worker_info is None:
        from torch.utils.data import get_worker_info

        _get_worker_info = get_worker_info
    info = _get_worker_info()
    return default if info is None else info.id


class SampleDecoder:
    """Decode one sample and transform it: the single path shared by folder, WebDataset and LMDB.

    Picklable, so it travels to ``DataLoader`` workers.

    With ``decoder="simplejpeg"`` (or ``"auto"`` with simplejpeg installed, the default) and the
    built-in train transform, decoding and cropping are fused: the crop box is drawn
    from the JPEG's header size in the upright frame (:meth:`TrainTransform.sample_crop`, same
    distribution and the same draws from the generator), the JPEG is decoded at the smallest
    power-of-two DCT scale whose window still has ``image_size`` pixels a side
    (:func:`~shardfeed.readers.decode.decode_crop`), the window is cut, resized and maybe flipped
    (:meth:`TrainTransform.finish`). Other formats and CMYK JPEGs are decoded whole by Pillow and
    cut the same way. On that path both built-in transforms resize with ``resample="antialias"``
    (torch's antialiased bilinear, within 0.4 grey levels of OpenCV's ``INTER_AREA``).

    The built-in eval transform crops first, with every decoder: the box that resizing the
    shorter side to ``resize_size`` and cutting the central ``image_size`` square would show is
    computed from the header size (:meth:`EvalTransform.source_box`), the JPEG is decoded at the
    largest power-of-two scale that keeps ``image_size`` pixels across the box
    (:func:`~shardfeed.readers.decode.decode_crop`), and only the box is resized to ``image_size``
    (within half a source pixel of resize-then-crop; the pixel bound is held by
    ``tests/readers/test_eval_crop.py``).

    With ``decoder="pil"`` or ``"cv2"`` (and ``"auto"`` without simplejpeg) in train mode, and
    with a ``transform``: :func:`decode_image` (with ``target_size=image_size`` when
    ``image_size`` is set, so a large JPEG may be decoded at a reduced scale that keeps its
    shorter side ``>= image_size`` — in train mode the random crop is then taken from that
    reduced image), then

    * ``transform`` given: it receives the full decoded image as a ``torch.uint8`` tensor
      ``[3, H, W]`` and must return a tensor; it replaces the built-in resize/crop;
    * else ``image_size`` given: :class:`TrainTransform` (``train=True``) or
      :class:`EvalTransform`, both to ``[3, image_size, image_size]``;
    * else: the decoded size is kept (batching differently sized images then fails in
      :func:`collate_uint8`).

    Random numbers (train mode) come from ``make_rng(seed, epoch, rank, worker)``. Call
    :meth:`set_context` at the start of every epoch, in the process that decodes. When
    ``worker`` is left ``None`` the id of the current ``DataLoader`` worker is looked up at each
    call, so workers never share a stream even if the context was set before they started.

    Args:
        image_size: Output side in pixels, or ``None`` to keep decoded sizes.
        train: Random resized crop + flip instead of resize + center crop.
        decoder: One of :data:`~shardfeed.readers.decode.DECODERS` (``"auto"``: simplejpeg where
            installed, else Pillow).
        transform: Optional callable ``tensor [3, H, W] uint8 -> tensor``.
        max_pixels: Pixel limit passed to :func:`decode_image`.
        max_decode_bytes: Memory limit of one decode, bytes, passed to :func:`decode_image`
            (checked on the header: size, mode, bit depth).
        seed: The run's seed (``>= 0``).
        resize_size: Evaluation: the shorter side before the central ``image_size`` crop
            (torchvision's name; ``256`` with ``image_size=224`` is the ImageNet preset).
            Default ``image_size``. Training ignores it (as timm ignores ``crop_pct``).
        crop_pct: timm's spelling of the same: ``resize_size = floor(image_size / crop_pct)``.

    Raises:
        ValueError: Unknown ``decoder``, bad ``image_size``/``seed``/``max_pixels``, both
            ``resize_size`` and ``crop_pct``, ``resize_size < image_size``, or either without
            ``image_size``.
        TypeError: ``transform`` is not callable.
        ModuleNotFoundError: ``decoder="simplejpeg"`` without simplejpeg installed.
    """

    def __init__(
        self,
        image_size: int | None = None,
        train: bool = False,
        decoder: str = "auto",
        transform: Callable[["torch.Tensor"], "torch.Tensor"] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        seed: int = 0,
        max_decode_bytes: int | None = DEFAULT_MAX_DECODE_BYTES,
        resize_size: int | None = None,
        crop_pct: float | None = None,
    ) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
        if image_size is not None:
            _check_size("image_size", image_size)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        if max_pixels is not None:
            _check_size("max_pixels", max_pixels)
        if max_decode_bytes is not None:
            _check_size("max_decode_bytes", max_decode_bytes)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.image_size = None if image_size is None else int(image_size)
        self.train = bool(train)
        self.decoder = decoder
        self.transform = transform
        self.max_pixels = max_pixels
        self.max_decode_bytes = max_decode_bytes
        self.seed = int(seed)
        self._builtin: EvalTransform | TrainTransform | None = None
        #: the decoder backend "auto" stands for here (resolved once, not per sample)
        self._backend = resolve_decoder(decoder)
        self._fused = self._backend == "simplejpeg"
        resample = "antialias" if self._fused else "area"
        if (resize_size is not None or crop_pct is not None) and self.image_size is None:
            raise ValueError("resize_size/crop_pct set the evaluation resize before the central image_size crop: "
                             "pass image_size=N too (e.g. image_size=224, resize_size=256)")
        self.resize_size: int | None = None
        if self.image_size is not None:
            self.resize_size = resize_size_for(self.image_size, resize_size, crop_pct)
            if self.train:
                self._builtin = TrainTransform(self.image_size, resample=resample)
            else:
                self._builtin = EvalTransform(self.image_size, self.resize_size, resample=resample)
        #: rows of the batch buffer the decoded images are written into (0: one tensor each);
        #: set by the source when a loader batches it (see :meth:`set_batch_rows`)
        self.batch_rows = 0
        #: a :class:`~shardfeed.readers.batch_ring.BatchRing` whose slots DataLoader workers write
        #: into (set by :func:`~shardfeed.readers.loader.make_loader`), or None
        self.ring: BatchRing | None = None
        self._arena: "torch.Tensor | None" = None
        self._arena_rows: "Sequence[torch.Tensor]" = ()
        self._arena_planes: "Sequence[Sequence[np.ndarray]]" = ()
        #: (buffer, its storage's reference count with no row view alive, its rows' planes)
        self._arena_pool: list = []
        self._arena_next = 0
        self._epoch = 0
        self._rank = 0
        self._worker: int | None = None
        self._rng: np.random.Generator | None = None
        self._rng_key: tuple[int, int, int, int] | None = None

    def set_context(self, epoch: int, rank: int = 0, worker: int | None = None) -> None:
        """Re-seed the random stream for ``(seed, epoch, rank, worker)``.

        Args:
            epoch: Epoch number (``>= 0``).
            rank: Distributed rank (``>= 0``).
            worker: DataLoader worker id (``>= 0``); ``None`` looks it up at each call
                (0 in the main process).

        Raises:
            ValueError: A value is negative or not an int.
        """
        make_rng(self.seed, epoch, rank, 0 if worker is None else worker)  # validates
        self._epoch, self._rank, self._worker = int(epoch), int(rank), worker
        self._rng = None
        self._arena, self._arena_next = None, 0
        if self.ring is not None:
            in_worker = _current_worker_id(default=-1)
            if in_worker >= 0:
                self.ring.reset_worker(in_worker)  # an epoch starts: this worker's slots are free

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_arena"], state["_arena_next"] = None, 0  # each process fills its own buffers
        state["_arena_rows"], state["_arena_planes"], state["_arena_pool"] = (), (), []
        return state

    def set_batch_rows(self, rows: int) -> None:
        """Write decoded images into rows of ``[rows, 3, S, S]`` batch buffers (0: one tensor each).

        With the built-in transforms (``image_size`` set, no ``transform``) each image is
        written straight into the next row of a buffer (allocated in shared memory inside a
        ``DataLoader`` worker); when the loader's batch is those rows in order,
        :func:`collate_uint8` returns the buffer itself instead of stacking copies. A buffer is
        written again only once no tensor refers to its memory (torch's reference count of the
        storage: the batch, a slice of it, a row, a ``.numpy()`` array all count), and only
        outside a ``DataLoader`` worker; else a full one is left to the batches that hold it and
        a new one is started. :meth:`set_context` (each epoch) starts a new one.

        Args:
            rows: The loader's batch size (``>= 0``).
        """
        rows = int(rows)
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows}")
        self.batch_rows = rows
        self._arena, self._arena_next = None, 0

    def _out_row(self) -> "tuple[torch.Tensor, Sequence[np.ndarray]] | tuple[None, None]":
        """The next row of the batch buffer and its three ``(S, S)`` planes as numpy views (made
        once per buffer: ``Tensor.numpy()`` per image costs several microseconds), or
        ``(None, None)`` when images get their own tensors."""
        if self.batch_rows <= 0 or self.transform is not None or self._builtin is None:
            return None, None
        if self.ring is not None:
            got = self.ring.next_row_planes(_current_worker_id(default=-1))  # only inside a DataLoader worker
            if got is not None:
                return got
        if self._arena is None or self._arena_next >= len(self._arena_rows):
            size = self._builtin.image_size
            self._arena, self._arena_rows, self._arena_planes = self._next_arena((self.batch_rows, 3, size, size))
            self._arena_next = 0
        k = self._arena_next
        self._arena_next = k + 1
        return self._arena_rows[k], self._arena_planes[k]

    def _next_arena(self, shape: tuple[int, int, int, int]
                    ) -> "tuple[torch.Tensor, Sequence[torch.Tensor], Sequence[Sequence[np.ndarray]]]":
        """A batch buffer, fresh row views of it and each row's planes as numpy views: outside a
        worker, one of the last few this process filled whose memory no tensor refers to anymore
        (its pages are mapped already: the first write into a fresh 9.6 MB buffer costs more page
        faults than the resize), else a new one.

        The pool keeps the buffers, their planes (numpy views, made once per buffer) and each
        buffer's storage reference count with only those alive; every use makes new row views (one
        ``unbind`` call), so each row handed out, and anything made from it, counts as a reference
        until it is freed.

        Inside a ``DataLoader`` worker a buffer is always new: the main process's references to
        its shared memory are not counted here (the batch ring reuses worker memory instead).
        """
        in_worker = _current_worker_id(default=-1) >= 0
        pool = self._arena_pool
        self._arena, self._arena_rows, self._arena_planes = None, (), ()  # the finished buffer's: ours no longer
        if not in_worker:
            for i, (buf, base, planes) in enumerate(pool):
                if tuple(buf.shape) == shape and _storage_refs(buf) == base:
                    pool.append(pool.pop(i))
                    return buf, buf.unbind(0), planes
        buf = _new_batch_buffer(shape)
        planes = row_planes(buf)
        if not in_worker:
            base = _storage_refs(buf)  # only this buffer (and its planes) refer to its memory now
            if base > 0:
                pool.append((buf, base, planes))
                del pool[:-_ARENA_POOL]
        return buf, buf.unbind(0), planes  # one call for every row's view

    def rng(self) -> np.random.Generator:
        """The generator for the current context (created on first use).

        Returns:
            ``numpy.random.Generator`` seeded with ``(seed, epoch, rank, worker)``.
        """
        worker = self._worker if self._worker is not None else _current_worker_id()
        key = (self.seed, self._epoch, self._rank, worker)
        if self._rng is None or key != self._rng_key:
            self._rng = make_rng(*key)
            self._rng_key = key
        return self._rng

    def __call__(
        self, data: bytes, ext: str, label: int, source: str, rng: np.random.Generator | None = None
    ) -> tuple["torch.Tensor", int]:
        """Decode and transform one sample.

        Args:
            data: Encoded image bytes.
            ext: The sample's extension (a hint for messages; the format is sniffed).
            label: Class index.
            source: Where the bytes came from (file path or ``"shard X key Y"``), for errors.
            rng: Generator for this sample's random crop and flip (train mode); default: the
                stream of :meth:`set_context`. The sources pass one seeded by
                ``(seed, epoch, sample index)`` so that a resumed run crops as an
                uninterrupted one.

        Returns:
            ``(image, label)``: ``torch.uint8`` tensor ``[3, H, W]`` (``H == W == image_size``
            with the built-in transforms) and the label as ``int``.

        Raises:
            CorruptDataError: The bytes cannot be decoded (names ``source``).
            ImageTooLargeError: The image has more than ``max_pixels`` pixels, or its decode would
                take more than ``max_decode_bytes``.
        """
        builtin = self._builtin
        if self.transform is None and builtin is not None:
            if isinstance(builtin, EvalTransform):
                # crop first: only the box the central crop shows is resized (and, where the box
                # allows, the JPEG is decoded at a reduced scale)
                window = decode_crop_unchecked(data, ext, builtin.source_box, builtin.image_size, self._backend,
                                               self.max_pixels, source, self.max_decode_bytes)
                # EvalTransform.finish without its checks: the window is decode_crop's (h, w, 3) uint8
                row, planes = self._out_row()
                return _window_to_chw(window, builtin.image_size, resample=builtin.resample, out=row,
                                      out_planes=planes), int(label)
            if self._fused:
                if rng is None:
                    rng = self.rng()
                window = decode_crop_unchecked(data, ext, functools.partial(builtin.sample_crop, rng=rng),
                                               builtin.image_size, self._backend, self.max_pixels, source,
                                               self.max_decode_bytes)
                row, planes = self._out_row()
                return builtin._finish_into(window, rng, row, planes), int(label)
        img = decode_image(
            data,
            ext,
            decoder=self.decoder,
            target_size=self.image_size,
            max_pixels=self.max_pixels,
            source=source,
            max_decode_bytes=self.max_decode_bytes,
        )
        if self.transform is not None:
            out = self.transform(to_chw_tensor(img))
        elif isinstance(self._builtin, TrainTransform):
            rng = rng if rng is not None else self.rng()
            _check_image(img)
            top, left, crop_h, crop_w = self._builtin.sample_crop(img.shape[0], img.shape[1], rng)
            row, planes = self._out_row()
            out = self._builtin._finish_into(img[top : top + crop_h, left : left + crop_w], rng, row, planes)
        else:
            out = to_chw_tensor(img)
        return out, int(label)

    def __repr__(self) -> str:
        return (
            f"SampleDecoder(image_size={self.image_size}, train={self.train}, "
            f"decoder={self.decoder!r}, transform={self.transform!r}, "
            f"max_pixels={self.max_pixels}, seed={self.seed}, resize_size={self.resize_size})"
        )


#: batch buffers a process keeps for reuse (``SampleDecoder._next_arena``): the batch the training loop
#: holds, the one being filled, and one more
_ARENA_POOL = 3


def _storage_refs(buf: "torch.Tensor") -> int:
    """How many references ``buf``'s memory has (torch's count of its storage); 0 when unknown."""
    import torch

    try:
        return int(torch._C._storage_Use_Count(buf.untyped_storage()._cdata))
    except (AttributeError, RuntimeError, TypeError):  # private API moved: never reuse a buffer
        return 0


#: live batch buffers of this process by address: only their rows are collated without a copy
_batch_buffers: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def _new_batch_buffer(shape: tuple[int, ...]) -> "torch.Tensor":
    """:func:`_new_buffer`, registered so that :func:`collate_uint8` may return its rows as a view."""
    buf = _new_buffer(shape)
    _batch_buffers[buf.data_ptr()] = buf
    return buf


def _new_buffer(shape: tuple[int, ...]) -> "torch.Tensor":
    """An uninitialised ``uint8`` tensor of ``shape``, in shared memory inside a worker.

    Inside a DataLoader worker a batch goes to the main process through shared memory;
    allocating it there directly saves a copy (what ``default_collate`` does).
    """
    import torch
    import torch.utils.data

    if torch.utils.data.get_worker_info() is not None:
        try:
            numel = math.prod(shape)
            storage = torch.UntypedStorage._new_shared(numel)
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)
        except (AttributeError, RuntimeError, TypeError) as exc:  # private API moved
            logger.debug("shared-memory batch allocation unavailable (%s); using torch.empty", exc)
    return torch.empty(shape, dtype=torch.uint8)


def _rows_of_one_buffer(images: Sequence["torch.Tensor"]) -> "torch.Tensor | None":
    """``images`` as one ``[B, 3, H, W]`` view when they are consecutive rows of one buffer."""
    import torch

    first = images[0]
    if not first.is_contiguous():
        return None
    numel = first.numel()
    storage = first.untyped_storage()
    base_ptr, offset = storage.data_ptr(), first.storage_offset()
    owner = _batch_buffers.get(base_ptr)
    if owner is None or owner.untyped_storage().data_ptr() != base_ptr:
        return None  # not one of this process's batch buffers: a caller's tensors are copied
    if (offset + len(images) * numel) > storage.nbytes():
        return None
    for i, image in enumerate(images):
        if (image.untyped_storage().data_ptr() != base_ptr or image.storage_offset() != offset + i * numel
                or not image.is_contiguous()):
            return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, offset, (len(images), *first.shape))


def collate_uint8(
    batch: Sequence[tuple["torch.Tensor", Any]],
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Stack ``(image, label)`` samples into a batch (``DataLoader(collate_fn=collate_uint8)``).

    Args:
        batch: Non-empty sequence of ``(image, label)``: ``image`` a ``torch.uint8`` tensor
            ``[3, H, W]`` (all the same size), ``label`` an int (or 0-d tensor).

    Returns:
        ``(images, labels)``: ``torch.uint8`` ``[B, 3, H, W]`` (contiguous) and ``torch.int64``
        ``[B]``. When the images are consecutive rows of one of this process's batch buffers
        (:meth:`SampleDecoder.set_batch_rows`), ``images`` is a view of those rows, no copy;
        otherwise (any other tensors) a new tensor (in shared memory inside a ``DataLoader`` worker).

    Raises:
        ValueError: The batch is empty, an item is not a pair, or the images differ in size
            (the message shows two shapes and suggests ``image_size=N``).
        TypeError: An image is not a ``torch.uint8`` tensor with 3 dimensions.
    """
    import torch

    if len(batch) == 0:
        raise ValueError("cannot collate an empty batch")
    images: list[torch.Tensor] = []
    labels: list[int] = []
    for item in batch:
        if len(item) != 2:
            raise ValueError(f"expected (image, label) pairs, got an item of length {len(item)}")
        image, label = item
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.dim() != 3:
            got = (
                f"{image.dtype} {tuple(image.shape)}"
                if isinstance(image, torch.Tensor)
                else type(image).__name__
            )
            raise TypeError(f"expected uint8 image tensors [3, H, W], got {got}")
        images.append(image)
        labels.append(int(label))
    first_shape = tuple(images[0].shape)
    for image in images[1:]:
        if tuple(image.shape) != first_shape:
            raise ValueError(
                f"images in a batch have different sizes {first_shape} vs {tuple(image.shape)}: "
                "pass image_size=N (e.g. image_size=224) to open_dataset/make_loader (on the command line "
                "--image-size N; 0 keeps decoded sizes) to resize and crop them to N x N"
            )
    out = _rows_of_one_buffer(images)
    if out is None:
        out = _new_buffer((len(images), *first_shape))
        torch.stack(images, dim=0, out=out)
    return out, torch.tensor(labels, dtype=torch.int64)
