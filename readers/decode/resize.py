"""Resizing and cropping ``(H, W, 3)`` ``uint8`` RGB arrays, and their CHW ``uint8`` tensors.

Resizing (``resample="area"``, the rule of every path but the fast one): OpenCV ``INTER_AREA``
when neither side grows (a proper box filter, no aliasing when shrinking), ``INTER_LINEAR``
otherwise (bilinear, torchvision's default). ``resample="antialias"`` (the simplejpeg path of
:class:`~shardfeed.readers.decode.transforms.SampleDecoder`): ``torch.nn.functional.interpolate(mode="bilinear",
antialias=True)`` on the ``uint8`` image, torchvision's own antialiased resize — about 3x faster
than OpenCV's ``INTER_AREA`` at non-integer factors here, and within 0.4 grey levels of it (mean
absolute difference on the bench's 375-500 px JPEGs shrunk to 224).

``torch`` is imported lazily, inside the functions that build tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .decode_backends import import_cv2

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["RESAMPLE", "resize_shorter", "shorter_side_shape", "center_crop", "to_chw_tensor"]


def check_image(img: np.ndarray) -> None:
    if not isinstance(img, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray (H, W, 3) uint8, got {type(img).__name__}")
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got shape {img.shape} {img.dtype}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"image is empty: shape {img.shape}")


def check_size(name: str, value: int) -> None:
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


def check_resample(resample: str) -> str:
    if resample not in RESAMPLE:
        raise ValueError(f"resample must be one of {', '.join(RESAMPLE)}, got {resample!r}")
    return resample


def resize_antialias_chw(img: np.ndarray, width: int, height: int, flip: bool = False) -> "torch.Tensor":
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


def window_to_chw(window: np.ndarray, size: int, *, resample: str, flip: bool = False,
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
            them (:func:`~shardfeed.readers.batching.buffers.row_planes`); default ``out.numpy()``.

    Returns:
        ``out`` (or a new tensor): contiguous ``torch.uint8`` ``[3, size, size]``.
    """
    cv2 = _optional_cv2()
    height, width = window.shape[:2]
    if out is None:
        import torch

        out = torch.empty((3, size, size), dtype=torch.uint8)
    if cv2 is None or (resample == "antialias" and (height > size or width > size)):
        resized = resize_antialias_chw(window, size, size, flip=flip)
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
    check_image(img)
    check_size("size", size)
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
    check_image(img)
    check_size("size", size)
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

    check_image(img)
    if not img.flags.writeable or any(stride < 0 for stride in img.strides):
        img = np.array(img, order="C")  # a copy: ascontiguousarray keeps a negative stride of a length-1 axis
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()
