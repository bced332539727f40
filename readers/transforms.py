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
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .decode import DECODERS, DEFAULT_MAX_PIXELS, decode_crop, decode_image, import_cv2, resolve_decoder

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "RESAMPLE",
    "resize_shorter",
    "shorter_side_shape",
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
        rng = self._pick_rng(rng)
        top, left, crop_h, crop_w = self.sample_crop(img.shape[0], img.shape[1], rng)
        return self.finish(img[top : top + crop_h, left : left + crop_w], rng)

    def finish(self, window: np.ndarray, rng: np.random.Generator | None = None) -> "torch.Tensor":
        """The steps after the box: resize the cut window to the output size, then maybe flip.

        :meth:`__call__` is ``sample_crop`` + cut + ``finish``; the fused path
        (:func:`~shardfeed.readers.decode.decode_crop` with :meth:`sample_crop` as its ``crop``)
        decodes the window itself and calls ``finish`` with the same generator, so the flip is the
        next draw after the box in both.

        Args:
            window: The cut crop, ``(h, w, 3)`` ``uint8`` (any scale: it is resized).
            rng: Generator for the flip; defaults to the one from :meth:`set_rng`.

        Returns:
            ``torch.uint8`` tensor ``[3, image_size, image_size]``.

        Raises:
            TypeError: ``window`` is not a numpy array.
            ValueError: ``window`` is not ``(h, w, 3)`` ``uint8``.
        """
        _check_image(window)
        rng = self._pick_rng(rng)
        size = self.image_size
        if self.resample == "antialias":
            return _resize_antialias_chw(window, size, size, flip=self.flip and rng.random() < 0.5)
        out = _resize(window, size, size)
        if self.flip and rng.random() < 0.5:
            out = np.array(out[:, ::-1], order="C")  # horizontal flip (as cv2.flip(out, 1)); a copy, never a view
        return to_chw_tensor(out)

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


def _current_worker_id() -> int:
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return 0 if info is None else int(info.id)


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

    With ``decoder="pil"`` or ``"cv2"`` (and ``"auto"`` without simplejpeg: today's path), and
    for the eval transform with any decoder: :func:`decode_image` (with ``target_size=image_size``
    when ``image_size`` is set, so a large JPEG may be decoded at a reduced scale that keeps its
    shorter side ``>= image_size`` — in train mode the random crop is then taken from that reduced
    image), then

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
        seed: The run's seed (``>= 0``).

    Raises:
        ValueError: Unknown ``decoder``, bad ``image_size``/``seed``/``max_pixels``.
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
        self._fused = resolve_decoder(decoder) == "simplejpeg"
        if self.image_size is not None:
            builtin = TrainTransform if self.train else EvalTransform
            self._builtin = builtin(self.image_size, resample="antialias" if self._fused else "area")
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
        if self._fused and self.transform is None and isinstance(self._builtin, TrainTransform):
            if rng is None:
                rng = self.rng()
            window = decode_crop(data, ext, crop=functools.partial(self._builtin.sample_crop, rng=rng),
                                 min_side=self._builtin.image_size, decoder=self.decoder,
                                 max_pixels=self.max_pixels, source=source)
            return self._builtin.finish(window, rng), int(label)
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
                "pass image_size=N (e.g. image_size=224) to open_dataset/make_loader (on the command line "
                "--image-size N; 0 keeps decoded sizes) to resize and crop them to N x N"
            )
    out = _empty_batch(images[0], len(images))
    torch.stack(images, dim=0, out=out)
    return out, torch.tensor(labels, dtype=torch.int64)
