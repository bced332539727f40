"""The host-to-device step: :func:`to_device` copies a ``uint8`` batch and converts it on the device."""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["to_device"]

_NORM_CACHE: dict[tuple[Any, ...], torch.Tensor] = {}


def _norm_tensor(values: Sequence[float], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (tuple(float(v) for v in values), str(device), dtype)
    t = _NORM_CACHE.get(key)
    if t is None:
        t = torch.tensor(key[0], dtype=dtype, device=device).view(1, -1, 1, 1)
        if len(_NORM_CACHE) < 64:
            _NORM_CACHE[key] = t
    return t


def to_device(batch: tuple[torch.Tensor, torch.Tensor], device: str | torch.device, *,
              mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
              dtype: torch.dtype = torch.float32, channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Move a batch to ``device`` and convert it there: uint8 → ``dtype`` in [0, 1], normalised.

    The copy is ``non_blocking`` (asynchronous from pinned memory, see ``pin_memory``); the
    conversion ``x / 255`` and ``(x - mean) / std`` run on the device.

    Args:
        batch: ``(images, labels)``: ``torch.uint8`` ``[B, 3, H, W]`` and ``torch.int64`` ``[B]``.
        device: target device (``"cuda"``, ``torch.device("cuda:0")``, ``"cpu"``).
        mean, std: per-channel values on the [0, 1] scale (e.g. ImageNet's
            ``(0.485, 0.456, 0.406)``, ``(0.229, 0.224, 0.225)``); None skips that step.
        dtype: floating dtype of the result (``torch.float32``, ``torch.float16``,
            ``torch.bfloat16``).
        channels_last: return images in ``torch.channels_last`` memory format.

    Returns:
        ``(images, labels)`` on ``device``: ``dtype`` ``[B, 3, H, W]`` and ``torch.int64`` ``[B]``.

    Raises:
        TypeError: images are not a uint8 tensor, or ``dtype`` is not floating.
        ValueError: images are not ``[B, C, H, W]``, or mean/std do not have C values.
    """
    images, labels = batch
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise TypeError(f"expected a torch.uint8 image batch, got "
                        f"{images.dtype if isinstance(images, torch.Tensor) else type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(f"expected images [B, C, H, W], got shape {tuple(images.shape)}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    device = torch.device(device)
    x = images.to(device, non_blocking=True)
    y = labels.to(device, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x = x.to(dtype).div_(255.0)
    channels = x.shape[1]
    for name, values in (("mean", mean), ("std", std)):
        if values is not None and len(values) != channels:
            raise ValueError(f"{name} has {len(values)} values but the images have {channels} channels")
    if mean is not None:
        x.sub_(_norm_tensor(mean, device, dtype))
    if std is not None:
        x.div_(_norm_tensor(std, device, dtype))
    return x, y
