"""CPU transforms after :func:`~shardfeed.readers.decode.decode_image`, and batching.

Everything here works on the decoder's output — ``numpy.ndarray`` ``(H, W, 3)`` ``uint8`` RGB —
and hands the training loop ``torch.uint8`` tensors ``[3, H, W]`` (batches ``[B, 3, H, W]``).
Conversion to float and normalisation happen on the device, after a ``non_blocking`` copy.

Resizing (one rule everywhere): OpenCV ``INTER_AREA`` when neither side grows (a proper box
filter, no aliasing when shrinking), ``INTER_LINEAR`` otherwise (bilinear, torchvision's default).

Randomness: :class:`TrainTransform` draws from a ``numpy.random.Generator``. In a ``DataLoader``
use :class:`SampleDecoder`, which seeds one generator per (seed, epoch, rank, worker) through
:func:`make_rng`, so a run reproduces and no two workers or ranks draw the same stream.

``torch`` is imported lazily, inside the functions that build tensors.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import cv2
import numpy as np

from .decode import DECODERS, DEFAULT_MAX_PIXELS, decode_image

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "resize_shorter",
    "center_crop",
    "to_chw_tensor",
    "make_rng",
    "EvalTransform",
    "TrainTransform",
    "SampleDecoder",
    "collate_uint8",
]

logger = logging.getLogger(__name__)

_CROP_ATTEMPTS = 10


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
    shrinking = width <= img.shape[1] and height <= img.shape[0]
    interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(img, (width, height), interpolation=interpolation)


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
    height, width = img.shape[:2]
    size = int(size)
    if height <= width:
        new_h, new_w = size, max(1, (2 * width * size + height) // (2 * height))
    else:
        new_w, new_h = size, max(1, (2 * height * size + width) // (2 * width))
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
        img = np.ascontiguousarray(img) if img.flags.writeable else img.copy()
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


# ---------------------------------------------------------------------------------------------
# Transforms


class EvalTransform:
    """Resize the shorter side to ``resize_size``, then center-crop ``image_size`` x ``image_size``.

    Args:
        image_size: Output side, in pixels.
        resize_size: Shorter side before cropping, in pixels (``>= image_size``); defaults to
            ``image_size`` (DESIGN.md). Pass e.g. ``round(image_size / 0.875)`` for the classic
            ImageNet evaluation crop.

    Raises:
        ValueError: A size is not a positive int, or ``resize_size < image_size``.
    """

    def __init__(self, image_size: int, resize_size: int | None = None) -> None:
        _check_size("image_size", image_size)
        resize_size = image_size if resize_size is None else resize_size
        _check_size("resize_size", resize_size)
        if resize_size < image_size:
            raise ValueError(f"resize_size={resize_size} is smaller than image_size={image_size}")
        self.image_size = int(image_size)
        self.resize_size = int(resize_size)

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
        return to_chw_tensor(center_crop(resize_shorter(img, self.resize_size), self.image_size))

    def __repr__(self) -> str:
        return f"EvalTransform(image_size={self.image_size}, resize_size={self.resize_size})"


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

    Raises:
        ValueError: ``image_size`` is not a positive int, or ``scale``/``ratio`` is out of range.
    """

    def __init__(
        self,
        image_size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
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
        self._rng: np.random.Generator | None = None

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
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(_CROP_ATTEMPTS):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
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
        if rng is None:
            if self._rng is None:
                self._rng = make_rng(0, 0, 0, 0)
            rng = self._rng
        top, left, crop_h, crop_w = self.sample_crop(img.shape[0], img.shape[1], rng)
        crop = img[top : top + crop_h, left : left + crop_w]
        out = _resize(crop, self.image_size, self.image_size)
        if self.flip and rng.random() < 0.5:
            out = cv2.flip(out, 1)
        return to_chw_tensor(out)

    def __repr__(self) -> str:
        return (
            f"TrainTransform(image_size={self.image_size}, scale={self.scale}, "
            f"ratio={self.ratio}, flip={self.flip})"
        )


# ---------------------------------------------------------------------------------------------
# Per-sample decoding for every source, and batching


def _current_worker_id() -> int:
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return 0 if info is None else int(info.id)


class SampleDecoder:
    """Decode one sample and transform it: the single path shared by folder, WebDataset and LMDB.

    Picklable, so it travels to ``DataLoader`` workers. Steps: :func:`decode_image` (with
    ``target_size=image_size`` when ``image_size`` is set, so a large JPEG may be decoded at a
    reduced scale that keeps its shorter side ``>= image_size`` — in train mode the random crop is
    then taken from that reduced image), then

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
        decoder: ``"pil"`` or ``"cv2"``.
        transform: Optional callable ``tensor [3, H, W] uint8 -> tensor``.
        max_pixels: Pixel limit passed to :func:`decode_image`.
        seed: The run's seed (``>= 0``).

    Raises:
        ValueError: Unknown ``decoder``, bad ``image_size``/``seed``/``max_pixels``.
        TypeError: ``transform`` is not callable.
    """

    def __init__(
        self,
        image_size: int | None = None,
        train: bool = False,
        decoder: str = "pil",
        transform: Callable[["torch.Tensor"], "torch.Tensor"] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        seed: int = 0,
    ) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
        if image_size is not None:
            _check_size("image_size", image_size)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        if max_pixels is not None:
            _check_size("max_pixels", max_pixels)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.image_size = None if image_size is None else int(image_size)
        self.train = bool(train)
        self.decoder = decoder
        self.transform = transform
        self.max_pixels = max_pixels
        self.seed = int(seed)
        self._builtin: EvalTransform | TrainTransform | None = None
        if self.image_size is not None:
            builtin = TrainTransform if self.train else EvalTransform
            self._builtin = builtin(self.image_size)
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
            ImageTooLargeError: The image has more than ``max_pixels`` pixels.
        """
        img = decode_image(
            data,
            ext,
            decoder=self.decoder,
            target_size=self.image_size,
            max_pixels=self.max_pixels,
            source=source,
        )
        if self.transform is not None:
            out = self.transform(to_chw_tensor(img))
        elif isinstance(self._builtin, TrainTransform):
            out = self._builtin(img, rng=rng if rng is not None else self.rng())
        elif self._builtin is not None:
            out = self._builtin(img)
        else:
            out = to_chw_tensor(img)
        return out, int(label)

    def __repr__(self) -> str:
        return (
            f"SampleDecoder(image_size={self.image_size}, train={self.train}, "
            f"decoder={self.decoder!r}, transform={self.transform!r}, "
            f"max_pixels={self.max_pixels}, seed={self.seed})"
        )


def _empty_batch(first: "torch.Tensor", batch_size: int) -> "torch.Tensor":
    """An uninitialised ``[B, *first.shape]`` tensor, in shared memory inside a worker.

    Inside a DataLoader worker the batch goes to the main process through shared memory;
    allocating it there directly saves a copy (what ``default_collate`` does).
    """
    import torch
    import torch.utils.data

    shape = (batch_size, *first.shape)
    if torch.utils.data.get_worker_info() is not None:
        try:
            numel = first.numel() * batch_size
            storage = first._typed_storage()._new_shared(numel, device=first.device)
            return first.new(storage).resize_(shape)
        except (AttributeError, RuntimeError, TypeError) as exc:  # private API moved
            logger.debug("shared-memory batch allocation unavailable (%s); using torch.empty", exc)
    return torch.empty(shape, dtype=first.dtype, device=first.device)


def collate_uint8(
    batch: Sequence[tuple["torch.Tensor", Any]],
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Stack ``(image, label)`` samples into a batch (``DataLoader(collate_fn=collate_uint8)``).

    Args:
        batch: Non-empty sequence of ``(image, label)``: ``image`` a ``torch.uint8`` tensor
            ``[3, H, W]`` (all the same size), ``label`` an int (or 0-d tensor).

    Returns:
        ``(images, labels)``: ``torch.uint8`` ``[B, 3, H, W]`` and ``torch.int64`` ``[B]``.

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
                "pass image_size=N (e.g. image_size=224) to open_dataset/make_loader to resize "
                "and crop them to N x N"
            )
    out = _empty_batch(images[0], len(images))
    torch.stack(images, dim=0, out=out)
    return out, torch.tensor(labels, dtype=torch.int64)
