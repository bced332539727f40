"""The per-sample decode-and-transform step of every source (:class:`SampleDecoder`), and the
transform names users import.

Everything here works on the decoder's output — ``numpy.ndarray`` ``(H, W, 3)`` ``uint8`` RGB —
and hands the training loop ``torch.uint8`` tensors ``[3, H, W]`` (batches ``[B, 3, H, W]``).
Conversion to float and normalisation happen on the device, after a ``non_blocking`` copy.
Resizing is :mod:`~shardfeed.readers.decode.resize`'s, the built-in transforms and their randomness are
:mod:`~shardfeed.readers.decode.crops`', and batches are :mod:`~shardfeed.readers.batching.buffers`'s:
:class:`SampleDecoder` writes each image into the row it is handed and knows no buffer.

``torch`` is imported lazily, inside the functions that build tensors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..batching.buffers import collate_uint8
from .crops import EvalTransform, TrainTransform, make_rng, resize_size_for, sample_generator
from .image import (DECODERS, DEFAULT_MAX_DECODE_BYTES, DEFAULT_MAX_PIXELS, decode_crop_unchecked, decode_image,
                    resolve_decoder)
from .resize import (RESAMPLE, check_image, check_size, window_to_chw, center_crop, resize_shorter,
                     shorter_side_shape, to_chw_tensor)

if TYPE_CHECKING:  # pragma: no cover
    import torch

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
    (:func:`~shardfeed.readers.decode.image.decode_crop`), the window is cut, resized and maybe flipped
    (:meth:`TrainTransform.finish`). Other formats and CMYK JPEGs are decoded whole by Pillow and
    cut the same way. On that path both built-in transforms resize with ``resample="antialias"``
    (torch's antialiased bilinear, within 0.4 grey levels of OpenCV's ``INTER_AREA``).

    The built-in eval transform crops first, with every decoder: the box that resizing the
    shorter side to ``resize_size`` and cutting the central ``image_size`` square would show is
    computed from the header size (:meth:`EvalTransform.source_box`), the JPEG is decoded at the
    largest power-of-two scale that keeps ``image_size`` pixels across the box
    (:func:`~shardfeed.readers.decode.image.decode_crop`), and only the box is resized to ``image_size``
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

    With the built-in transforms the image is written into the row the caller hands over
    (``out``, a row of a batch buffer: :class:`~shardfeed.readers.batching.buffers.BatchRows`); the
    decoder holds no buffer.

    Random numbers (train mode) come from ``make_rng(seed, epoch, rank, worker)``. Call
    :meth:`set_context` at the start of every epoch, in the process that decodes. When
    ``worker`` is left ``None`` the id of the current ``DataLoader`` worker is looked up at each
    call, so workers never share a stream even if the context was set before they started.

    Args:
        image_size: Output side in pixels, or ``None`` to keep decoded sizes.
        train: Random resized crop + flip instead of resize + center crop.
        decoder: One of :data:`~shardfeed.readers.decode.image.DECODERS` (``"auto"``: simplejpeg where
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
            check_size("image_size", image_size)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        if max_pixels is not None:
            check_size("max_pixels", max_pixels)
        if max_decode_bytes is not None:
            check_size("max_decode_bytes", max_decode_bytes)
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

    @property
    def writes_rows(self) -> bool:
        """Whether :meth:`__call__` writes into a row it is handed (``out``): the built-in transforms
        with a fixed ``image_size``; never with a ``transform`` or without ``image_size``."""
        return self.transform is None and self._builtin is not None

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
        self, data: bytes, ext: str, label: int, source: str, rng: np.random.Generator | None = None,
        out: "tuple[torch.Tensor, Sequence[np.ndarray]] | None" = None,
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
            out: Where :attr:`writes_rows` holds: ``(row, planes)`` to write the image into, a
                contiguous ``torch.uint8`` ``[3, image_size, image_size]`` and its three
                ``(image_size, image_size)`` ``uint8`` planes as numpy views (a row of a batch buffer,
                :meth:`~shardfeed.readers.batching.buffers.BatchRows.next_row`); None: a new tensor.
                Ignored where :attr:`writes_rows` does not hold.

        Returns:
            ``(image, label)``: ``torch.uint8`` tensor ``[3, H, W]`` (``H == W == image_size``
            with the built-in transforms; ``out``'s row when given) and the label as ``int``.

        Raises:
            CorruptDataError: The bytes cannot be decoded (names ``source``).
            ImageTooLargeError: The image has more than ``max_pixels`` pixels, or its decode would
                take more than ``max_decode_bytes``.
        """
        builtin = self._builtin
        row, planes = out if out is not None else (None, None)
        if self.transform is None and builtin is not None:
            if isinstance(builtin, EvalTransform):
                # crop first: only the box the central crop shows is resized (and, where the box
                # allows, the JPEG is decoded at a reduced scale)
                window = decode_crop_unchecked(data, ext, builtin.source_box, builtin.image_size, self._backend,
                                               self.max_pixels, source, self.max_decode_bytes)
                # EvalTransform.finish without its checks: the window is decode_crop's (h, w, 3) uint8
                return window_to_chw(window, builtin.image_size, resample=builtin.resample, out=row,
                                      out_planes=planes), int(label)
            if self._fused:
                if rng is None:
                    rng = self.rng()
                window = decode_crop_unchecked(data, ext, functools.partial(builtin.sample_crop, rng=rng),
                                               builtin.image_size, self._backend, self.max_pixels, source,
                                               self.max_decode_bytes)
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
            image = self.transform(to_chw_tensor(img))
        elif isinstance(self._builtin, TrainTransform):
            rng = rng if rng is not None else self.rng()
            check_image(img)
            top, left, crop_h, crop_w = self._builtin.sample_crop(img.shape[0], img.shape[1], rng)
            image = self._builtin._finish_into(img[top : top + crop_h, left : left + crop_w], rng, row, planes)
        else:
            image = to_chw_tensor(img)
        return image, int(label)

    def __repr__(self) -> str:
        return (
            f"SampleDecoder(image_size={self.image_size}, train={self.train}, "
            f"decoder={self.decoder!r}, transform={self.transform!r}, "
            f"max_pixels={self.max_pixels}, seed={self.seed}, resize_size={self.resize_size})"
        )
