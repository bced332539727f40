"""Decode batches on the GPU: workers hand over encoded bytes, nvJPEG decodes the batch.

``make_loader(..., decode_device="cuda")`` opens the source with ``decode=False`` (the
``DataLoader`` workers only read: :class:`~shardfeed.readers.format.manifest.Sample` lists), and
:class:`GpuDecodingLoader` turns each list into the usual batch **on the device**:
``images`` ``torch.uint8`` ``[B, 3, S, S]`` and ``labels`` ``torch.int64`` ``[B]``, both on
``decode_device``. Per batch:

1. every JPEG's header is read on the CPU (:func:`~shardfeed.readers.decode.image` 's Pillow-free probe:
   size, EXIF orientation, completeness); in train mode its crop box is drawn there, in the upright
   frame, with :meth:`~shardfeed.readers.decode.transforms.TrainTransform.sample_crop`, and then the flip,
   from one generator ``make_rng(seed, epoch, rank, 0)`` (the same distribution as the CPU path);
2. the JPEGs are decoded together by nvJPEG (``torchvision.io.decode_jpeg(list, device=...)``);
3. on the device: EXIF orientation (flips/transposes), the box, torch's antialiased bilinear
   resize (float, rounded back to ``uint8``), the flip — or, in eval mode, the shorter side to
   ``image_size`` and the centre crop.

Fallbacks (the CPU path, same output contract): a sample nvJPEG cannot take (PNG, CMYK or
greyscale JPEG, unusual EXIF, a JPEG nvJPEG refuses) is decoded on the CPU by the fused path of
:class:`~shardfeed.readers.decode.transforms.SampleDecoder` with the same generator and copied to the
device; without torchvision (or with a build that cannot decode on this device), the whole batch
is decoded on the CPU by simplejpeg (or Pillow) and steps 1 and 3 still run as above; without CUDA,
``make_loader`` returns the ordinary CPU loader and logs a warning.

Status: written against torchvision's documented batched ``decode_jpeg``; its CUDA path has not
run on the machine it was written on (no GPU, and PyPI's torchvision does not import beside the
CPU torch build there). The ``gpu``-marked tests run it where a GPU is present (``make
gpu-check``); everything else here is tested on the CPU with the CPU decode primitive.

``torch`` is imported by this module; torchvision lazily, on first use.
"""

from __future__ import annotations

import io
import logging
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from . import image as _decode
from .image import DEFAULT_MAX_PIXELS
from ..errors import CorruptDataError, check_on_error
from .transforms import TrainTransform, make_rng, shorter_side_shape

__all__ = ["GpuBatchDecoder", "GpuDecodingLoader", "nvjpeg_available", "wrap_gpu_decoding"]

log = logging.getLogger(__name__)

#: CHW versions of :data:`shardfeed.readers.decode.image._ORIENT` (which works on HWC arrays).
_ORIENT_CHW: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    1: lambda t: t,
    2: lambda t: t.flip(2),
    3: lambda t: t.flip(1, 2),
    4: lambda t: t.flip(1),
    5: lambda t: t.transpose(1, 2),
    6: lambda t: t.transpose(1, 2).flip(2),
    7: lambda t: t.flip(1, 2).transpose(1, 2),
    8: lambda t: t.transpose(1, 2).flip(1),
}

_nvjpeg_state: dict[str, Any] = {}


def nvjpeg_available(device: str | torch.device = "cuda") -> bool:
    """Whether ``torchvision.io.decode_jpeg`` can decode on ``device`` (CUDA + torchvision).

    Args:
        device: A CUDA device.

    Returns:
        True when CUDA is available and torchvision imports with ``decode_jpeg``; the import is
        tried once per process.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if "decode_jpeg" not in _nvjpeg_state:
        try:
            from torchvision.io import ImageReadMode, decode_jpeg

            _nvjpeg_state["decode_jpeg"] = (decode_jpeg, ImageReadMode.RGB)
        except Exception as exc:  # ImportError, or a torchvision built for another torch
            log.warning("GPU decoding: torchvision.io.decode_jpeg is unavailable (%s: %s); JPEGs are decoded "
                        "on the CPU and copied (pip install torchvision matching torch %s)",
                        type(exc).__name__, exc, torch.__version__)
            _nvjpeg_state["decode_jpeg"] = None
    return _nvjpeg_state["decode_jpeg"] is not None


def _resize_float(t: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """CHW uint8 -> CHW uint8 ``height x width``: antialiased bilinear in float32, rounded."""
    if tuple(t.shape[1:]) == (height, width):
        return t
    x = F.interpolate(t.unsqueeze(0).float(), size=(height, width), mode="bilinear", antialias=True,
                      align_corners=False)
    return x.round_().clamp_(0, 255).to(torch.uint8)[0]


class GpuBatchDecoder:
    """Turn a list of raw samples into ``(images [B, 3, S, S] uint8, labels [B] int64)`` on a device.

    See the module docstring for the steps and fallbacks. Picklable state is not needed: it
    lives in the main process.

    Args:
        image_size: Output side ``S``, pixels.
        train: Random resized crop + flip (else shorter side to ``S`` + centre crop).
        device: Where the batch is decoded and returned (``"cuda"``, ``"cuda:1"``; ``"cpu``
            runs the same steps with the CPU decode primitive).
        seed: The run's seed; the generator is ``make_rng(seed, epoch, rank, 0)``.
        rank: Distributed rank (for the generator).
        max_pixels: Pixel limit, checked on each header before decoding.
        on_error: ``"raise"`` or ``"skip"`` (a sample that cannot be decoded is left out).

    Raises:
        ValueError: Bad sizes or ``on_error``.
    """

    def __init__(self, image_size: int, *, train: bool = False, device: str | torch.device = "cuda",
                 seed: int = 0, rank: int = 0, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                 on_error: str = "raise") -> None:
        from .transforms import SampleDecoder

        check_on_error(on_error)
        self.image_size = int(image_size)
        self.train = bool(train)
        self.device = torch.device(device)
        self.seed, self.rank = int(seed), int(rank)
        self.max_pixels = max_pixels
        self.on_error = on_error
        self._crop = TrainTransform(self.image_size, resample="antialias")
        self._cpu = SampleDecoder(self.image_size, train=self.train, decoder="auto", max_pixels=max_pixels,
                                  seed=self.seed)  # for validation and the per-sample CPU fallback
        self._rng = make_rng(self.seed, 0, self.rank, 0)

    def set_epoch(self, epoch: int) -> None:
        """Re-seed the generator for ``epoch`` (``make_rng(seed, epoch, rank, 0)``)."""
        self._rng = make_rng(self.seed, int(epoch), self.rank, 0)

    def __call__(self, samples: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode and transform one batch.

        Args:
            samples: :class:`~shardfeed.readers.format.manifest.Sample` tuples ``(key, data, ext, label,
                meta)`` (what the loader yields with ``decode=False``).

        Returns:
            ``(images, labels)``: ``torch.uint8`` ``[B, 3, S, S]`` and ``torch.int64`` ``[B]`` on
            :attr:`device` (``B`` smaller than ``len(samples)`` only with ``on_error="skip"``).

        Raises:
            CorruptDataError: A sample cannot be decoded (``on_error="raise"``); names its key.
            ImageTooLargeError: A header declares more than ``max_pixels`` pixels.
        """
        size = self.image_size
        plans: list[tuple | None] = []  # per sample: (index in gpu list, orientation, box, flip) or None
        gpu_data: list[bytes] = []
        cpu_out: dict[int, torch.Tensor] = {}
        labels: list[int] = []
        rng = self._rng
        for i, s in enumerate(samples):
            source = f"sample {s.key} ({s.meta.get('path', '?') if isinstance(s.meta, dict) else '?'})"
            labels.append(int(s.label))
            header = _decode.probe_jpeg(s.data, s.ext, max_pixels=self.max_pixels, source=source)
            if header is None:  # not a plain colour JPEG: the CPU path, same generator
                cpu_out[i] = self._cpu_sample(s, rng, source)
                plans.append(None)
                continue
            width, height, orientation = header
            up_h, up_w = (height, width) if orientation < 5 else (width, height)
            if self.train:
                box = self._crop.sample_crop(up_h, up_w, rng)
                flip = bool(rng.random() < 0.5)
            else:
                box, flip = (0, 0, up_h, up_w), False
            plans.append((len(gpu_data), orientation, box, flip))
            gpu_data.append(s.data)
        decoded = self._decode_stored(gpu_data)
        out = torch.empty((len(samples), 3, size, size), dtype=torch.uint8, device=self.device)
        keep: list[int] = []
        for i, plan in enumerate(plans):
            if plan is None:
                if cpu_out[i] is None:
                    continue
                out[i].copy_(cpu_out[i], non_blocking=True)
            else:
                j, orientation, (top, left, bh, bw), flip = plan
                img = decoded[j]
                if img is None:  # nvJPEG refused it: the CPU path, with the box already drawn
                    img = self._cpu_window(samples[i], (top, left, bh, bw), orientation)
                    if img is None:
                        continue
                    out[i].copy_(self._finish(img, flip), non_blocking=True)
                else:
                    img = _ORIENT_CHW[orientation](img)[:, top:top + bh, left:left + bw]
                    out[i].copy_(self._finish(img, flip))
            keep.append(i)
        labels_t = torch.tensor(labels, dtype=torch.int64)
        if len(keep) < len(samples):
            index = torch.tensor(keep, dtype=torch.int64)
            out, labels_t = out[index.to(self.device)], labels_t[index]
        return out, labels_t.to(self.device, non_blocking=True)

    # ---- steps

    def _finish(self, img: torch.Tensor, flip: bool) -> torch.Tensor:
        """CHW uint8 window (train) or upright image (eval) -> [3, S, S] uint8 on the device."""
        size = self.image_size
        img = img.to(self.device, non_blocking=True)
        if self.train:
            out = _resize_float(img, size, size)
            return out.flip(2) if flip else out
        new_h, new_w = shorter_side_shape(img.shape[1], img.shape[2], size)
        out = _resize_float(img, new_h, new_w)
        top, left = (new_h - size) // 2, (new_w - size) // 2
        return out[:, top:top + size, left:left + size]

    def _decode_stored(self, blobs: list[bytes]) -> list[torch.Tensor | None]:
        """Decode JPEGs as stored (no orientation) into CHW uint8 tensors; None where refused."""
        if not blobs:
            return []
        if nvjpeg_available(self.device):
            decode_jpeg, rgb = _nvjpeg_state["decode_jpeg"]
            tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
            try:
                return list(decode_jpeg(tensors, mode=rgb, device=self.device))
            except Exception as exc:  # one bad file fails the batch call: find it one by one
                log.debug("batched nvJPEG decode failed (%s: %s); decoding one by one", type(exc).__name__, exc)
                out: list[torch.Tensor | None] = []
                for t in tensors:
                    try:
                        out.append(decode_jpeg(t, mode=rgb, device=self.device))
                    except Exception:  # RuntimeError for most; the CPU path decides and names the file
                        out.append(None)
                return out
        out = []
        for b in blobs:  # the CPU primitive, as stored (no orientation): simplejpeg, else Pillow
            try:
                arr = _decode.decode_jpeg_as_stored(b)
            except CorruptDataError:  # a truncated scan: the per-sample CPU path names the file
                out.append(None)
                continue
            if arr is None:
                try:
                    arr = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
                except Exception:  # Pillow's failures vary; the per-sample CPU path names the file
                    out.append(None)
                    continue
            out.append(torch.from_numpy(arr).permute(2, 0, 1))
        return out

    def _cpu_sample(self, sample, rng: np.random.Generator, source: str) -> torch.Tensor | None:
        """The CPU path for one sample (fused decode-and-crop), drawing from ``rng``."""
        try:
            if self.train:
                import functools

                window = _decode.decode_crop(sample.data, sample.ext, crop=functools.partial(
                    self._crop.sample_crop, rng=rng), min_side=self.image_size, decoder="auto",
                    max_pixels=self.max_pixels, source=source)
                return self._crop.finish(window, rng)
            img = _decode.decode_image(sample.data, sample.ext, decoder="auto", target_size=self.image_size,
                                       max_pixels=self.max_pixels, source=source)
            return self._cpu._builtin(img)
        except CorruptDataError:
            if self.on_error == "skip":
                log.warning("skipping %s: cannot be decoded", source)
                return None
            raise

    def _cpu_window(self, sample, box: tuple[int, int, int, int], orientation: int) -> torch.Tensor | None:
        """A JPEG nvJPEG refused: decode on the CPU, cut the already drawn box (train) or not."""
        source = f"sample {sample.key}"
        try:
            if self.train:
                window = _decode.decode_crop(sample.data, sample.ext, crop=lambda h, w: box, min_side=self.image_size,
                                             decoder="auto", max_pixels=self.max_pixels, source=source)
            else:
                window = _decode.decode_image(sample.data, sample.ext, decoder="auto", target_size=self.image_size,
                                              max_pixels=self.max_pixels, source=source)
        except CorruptDataError:
            if self.on_error == "skip":
                log.warning("skipping %s: cannot be decoded", source)
                return None
            raise
        return torch.from_numpy(np.ascontiguousarray(window)).permute(2, 0, 1)


class GpuDecodingLoader:
    """A :class:`~shardfeed.readers.loader.ShardfeedLoader` of raw samples + :class:`GpuBatchDecoder`.

    Iterating it yields ``(images, labels)`` on the decoder's device; ``len``, :meth:`set_epoch`,
    ``epoch`` and the other attributes are the wrapped loader's.

    Args:
        loader: A loader built with ``decode=False``.
        decoder: The batch decoder.
    """

    def __init__(self, loader, decoder: GpuBatchDecoder) -> None:
        self.loader = loader
        self.decoder = decoder

    def __iter__(self):
        self.decoder.set_epoch(self.loader.epoch)
        for batch in self.loader:
            yield self.decoder(batch)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (shuffle and crops)."""
        self.loader.set_epoch(epoch)

    def __getattr__(self, name: str):
        if name in ("loader", "decoder"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def wrap_gpu_decoding(build: Callable[..., Any], decode_device: str | torch.device, *, seed: int = 0,
                      rank: int | None = None, **options: Any):
    """``make_loader``'s ``decode_device`` hook: a GPU-decoding loader, or the CPU one as fallback.

    Args:
        build: ``build(**open_dataset_options) -> ShardfeedLoader`` (``make_loader`` with the
            other arguments bound).
        decode_device: The CUDA device to decode on.
        seed: The run's seed.
        rank: Distributed rank, if given explicitly.
        **options: ``open_dataset`` options; ``image_size`` is required, ``transform`` is not
            supported (the built-in transforms run on the device).

    Returns:
        A :class:`GpuDecodingLoader`, or, without CUDA, the ordinary CPU loader (warning logged).

    Raises:
        ValueError: No ``image_size``, a ``transform``, ``decode=False``, or an evaluation
            ``resize_size``/``crop_pct`` with ``decode_device``.
    """
    if options.get("image_size") is None:
        raise ValueError("decode_device needs image_size=N: the batch is resized on the device to N x N")
    if options.get("transform") is not None:
        raise ValueError("decode_device runs the built-in transforms on the device; drop transform= or "
                         "decode_device=")
    if options.get("decode", True) is False:
        raise ValueError("decode_device decodes on the device; it cannot be combined with decode=False")
    if not options.get("train", False) and (options.get("resize_size") is not None
                                             or options.get("crop_pct") is not None):
        raise ValueError("decode_device evaluates with resize_size=image_size only; drop resize_size/crop_pct, "
                         "or decode on the CPU (no decode_device) for the resize-then-crop evaluation transform")
    device = torch.device(decode_device)
    if device.type != "cuda" or not torch.cuda.is_available():
        log.warning("decode_device=%r: no CUDA device here; decoding on the CPU (the batches stay on the CPU)",
                    str(decode_device))
        return build(**options)
    options["decode"] = False
    loader = build(**options)
    ds = loader.dataset
    decoder = GpuBatchDecoder(options["image_size"], train=bool(options.get("train", False)), device=device,
                              seed=seed, rank=getattr(ds, "rank", rank or 0),
                              max_pixels=options.get("max_pixels", DEFAULT_MAX_PIXELS),
                              on_error=options.get("on_error", "raise"))
    return GpuDecodingLoader(loader, decoder)
