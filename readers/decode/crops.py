"""The built-in transforms (:class:`EvalTransform`, :class:`TrainTransform`) and their randomness.

Both work on the decoder's output — ``numpy.ndarray`` ``(H, W, 3)`` ``uint8`` RGB — and give
``torch.uint8`` tensors ``[3, H, W]``; resizing follows :mod:`~shardfeed.readers.decode.resize`.

Randomness: :class:`TrainTransform` draws from a ``numpy.random.Generator``. In a ``DataLoader``
use :class:`~shardfeed.readers.decode.transforms.SampleDecoder`, which seeds one generator per
(seed, epoch, rank, worker) through :func:`make_rng`, so a run reproduces and no two workers or
ranks draw the same stream.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .resize import (check_image, check_resample, check_size, resize_antialias_chw, window_to_chw,
                     center_crop, resize_shorter, shorter_side_shape, to_chw_tensor)

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["make_rng", "sample_generator", "resize_size_for", "EvalTransform", "TrainTransform"]

_CROP_ATTEMPTS = 10
#: image sizes whose evaluation box :meth:`EvalTransform.source_box` keeps (about 4 us each to compute)
_BOX_CACHE_SIZE = 4096


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
    check_size("image_size", image_size)
    if resize_size is not None and crop_pct is not None:
        raise ValueError(f"pass resize_size={resize_size} or crop_pct={crop_pct}, not both "
                         f"(crop_pct={crop_pct} means resize_size={math.floor(image_size / crop_pct)})")
    if crop_pct is not None:
        if isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float)) or not 0.0 < crop_pct <= 1.0:
            raise ValueError(f"crop_pct must be a number in (0, 1] (e.g. 0.875), got {crop_pct!r}")
        return max(int(image_size), math.floor(image_size / crop_pct))
    if resize_size is None:
        return int(image_size)
    check_size("resize_size", resize_size)
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
        check_size("image_size", image_size)
        resize_size = image_size if resize_size is None else resize_size
        check_size("resize_size", resize_size)
        if resize_size < image_size:
            raise ValueError(f"resize_size={resize_size} is smaller than image_size={image_size}")
        self.image_size = int(image_size)
        self.resize_size = int(resize_size)
        self.resample = check_resample(resample)
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
        check_image(img)
        new_h, new_w = shorter_side_shape(img.shape[0], img.shape[1], self.resize_size)
        out = resize_antialias_chw(img, new_w, new_h)
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
        :func:`~shardfeed.readers.decode.image.decode_crop`, decoded at more than the scale it needs.

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
        check_image(window)
        return window_to_chw(window, self.image_size, resample=self.resample, out=out)

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
        check_size("image_size", image_size)
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
        self.resample = check_resample(resample)
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
        check_image(img)
        rng = self._pick_rng(rng)
        top, left, crop_h, crop_w = self.sample_crop(img.shape[0], img.shape[1], rng)
        return self.finish(img[top : top + crop_h, left : left + crop_w], rng)

    def finish(self, window: np.ndarray, rng: np.random.Generator | None = None,
               out: "torch.Tensor | None" = None) -> "torch.Tensor":
        """The steps after the box: resize the cut window to the output size, then maybe flip.

        :meth:`__call__` is ``sample_crop`` + cut + ``finish``; the fused path
        (:func:`~shardfeed.readers.decode.image.decode_crop` with :meth:`sample_crop` as its ``crop``)
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
        check_image(window)
        return self._finish_into(window, self._pick_rng(rng), out)

    def _finish_into(self, window: np.ndarray, rng: np.random.Generator, out: "torch.Tensor | None",
                     out_planes: "Sequence[np.ndarray] | None" = None) -> "torch.Tensor":
        """:meth:`finish` on a window known to be ``(h, w, 3)`` ``uint8``, with an explicit generator
        (and ``out``'s planes, as :func:`window_to_chw` takes them)."""
        flip = self.flip and rng.random() < 0.5
        return window_to_chw(window, self.image_size, resample=self.resample, flip=flip, out=out,
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
