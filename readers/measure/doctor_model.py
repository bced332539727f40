"""``doctor``'s model of the loader ceiling, and the batch costs it counts besides decoding.

Per image, with ``W`` workers (``W=0``: the main process loads, counted as one) and ``C`` cores:

* a worker's wall time: the file's open and reads (a folder), or its bytes at the sequential rate
  (packed), plus its CPU work;
* a worker's CPU work ``t_worker``: the decode (with the resize and crop of ``image_size``), the
  file's system calls (a folder), and the collate of its batch (the rows stacked into one
  ``[B, 3, H, W]`` tensor);
* the main process's CPU work ``t_main``: the hand-off of the batch from the worker (its bytes
  mapped and touched, counted at the measured copy rate of this machine) and the conversion to
  float (``to_device`` on the CPU: ``/ 255``, the ImageNet mean and std).

The rate is the least of ``W / wall``, ``min(W, C) / t_worker``, ``C / (t_worker + t_main)`` (every
process shares the cores) and ``1 / t_main`` (one main process). With ``W=0`` the main process does
all of it in turn: ``1 / (wall + t_main)``, with no hand-off.

:func:`batch_costs` measures the collate, the copy rate and the conversion on a batch made of the
sample's own decoded images, with one thread (as ``bench --threads 1``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .watch_rules import storage_workers

__all__ = ["FIRST_READ_BYTES", "BATCH_SIZE", "BATCH_REPEATS", "predict_images_per_s", "cpu_ceiling", "batch_costs",
           "predict_with_more_workers", "add_busy_machine", "batch_cost_terms"]

#: The first read of each file, bytes (most images fit in it; the model counts the rest at the sequential rate).
FIRST_READ_BYTES = 64 * 1024
#: The batch the collate, hand-off and conversion are measured on (rows of the sample's decoded images).
BATCH_SIZE = 32
#: Times each batch cost is measured; the median is kept.
BATCH_REPEATS = 5


def cpu_ceiling(*, num_workers: int, cpus: float, t_worker_s: float, t_main_s: float = 0.0) -> float:
    """Images/s the cores allow: ``min(min(W, C) / t_worker, C / (t_worker + t_main), 1 / t_main)``
    (``W=0``: ``min(1, C) / (t_worker + t_main)``, one process does both).

    Args:
        num_workers: ``W``; cpus: ``C``, the cores free (may be fractional).
        t_worker_s: CPU seconds per image in a worker (> 0); t_main_s: in the main process (≥ 0).
    """
    if num_workers < 1:
        return min(1.0, cpus) / (t_worker_s + t_main_s)
    rate = min(min(num_workers, cpus) / t_worker_s, cpus / (t_worker_s + t_main_s))
    return min(rate, 1.0 / t_main_s) if t_main_s > 0 else rate


def predict_images_per_s(*, num_workers: int, cpus: float, t_decode_s: float | None, t_open_s: float,
                         t_first_read_s: float, median_bytes: float, read_bytes_per_s: float | None,
                         t_file_cpu_s: float = 0.0, folder_io_s: float | None = None, t_collate_s: float = 0.0,
                         t_handoff_s: float = 0.0, t_to_float_s: float = 0.0) -> dict:
    """The model of the module docstring: ``{"folder_images_per_s", "packed_images_per_s",
    "local_images_per_s"}`` (None where a figure is missing).

    Args:
        num_workers, cpus: ``W`` and ``C``.
        t_decode_s: CPU seconds to decode one image (None or 0: no prediction).
        t_open_s, t_first_read_s: seconds of an open and of the first 64 KiB read.
        median_bytes: the bytes of one image (the packed stream reads them in sequence).
        read_bytes_per_s: the sequential read rate (None or 0: no prediction).
        t_file_cpu_s: the CPU seconds of one file's open, reads and close (the folder pays them per image).
        folder_io_s: the mean seconds of one file's open and reads, measured per file (an image
            folder's stratified sample), used for the folder in place of ``t_open_s + t_first_read_s +
            max(0, median_bytes - 64 KiB) / read_bytes_per_s``.
        t_collate_s, t_handoff_s, t_to_float_s: CPU seconds per image of the collate (in the
            worker), the hand-off and the conversion to float (in the main process); see
            :func:`batch_costs`.
    """
    if not t_decode_s or t_decode_s <= 0 or not read_bytes_per_s:
        return {"folder_images_per_s": None, "packed_images_per_s": None, "local_images_per_s": None}
    w = max(1, num_workers)
    t_main = t_to_float_s + (t_handoff_s if num_workers >= 1 else 0.0)
    tail = t_main if num_workers < 1 else 0.0  # the main process loads: it converts before the next image
    if folder_io_s is None:
        folder_io_s = t_open_s + t_first_read_s + max(0.0, median_bytes - FIRST_READ_BYTES) / read_bytes_per_s
    work = t_decode_s + t_collate_s

    def ceiling(t_worker: float) -> float:
        return cpu_ceiling(num_workers=num_workers, cpus=cpus, t_worker_s=t_worker, t_main_s=t_main)

    local = ceiling(work)
    folder = min(w / (folder_io_s + work + tail), ceiling(work + t_file_cpu_s))
    packed = min(w / (median_bytes / read_bytes_per_s + work + tail), local)
    return {"folder_images_per_s": folder, "packed_images_per_s": packed, "local_images_per_s": local}


def _cpu_s(fn) -> float:
    """The median process CPU seconds of ``BATCH_REPEATS`` calls of ``fn()``."""
    times = []
    for _ in range(BATCH_REPEATS):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return statistics.median(times)


def _common_shape(images: list) -> list:
    """The images of the most frequent shape (a batch stacks images of one size)."""
    shapes: dict[tuple, int] = {}
    for a in images:
        shapes[tuple(a.shape)] = shapes.get(tuple(a.shape), 0) + 1
    if not shapes:
        return []
    best = max(shapes, key=lambda s: (shapes[s], s))
    return [a for a in images if tuple(a.shape) == best]


def batch_costs(images: list[Any]) -> dict:
    """Measure what the loader does per image besides decoding, on a batch of the sample's decoded images.

    Args:
        images: decoded images, ``uint8`` ``[H, W, 3]`` numpy arrays (after the resize and crop of
            ``image_size``); those of the most frequent shape make the batch, at most
            :data:`BATCH_SIZE`, repeated to fill it.

    Returns:
        ``{"batch_size", "collate_ms_per_image", "copy_mb_per_s", "handoff_ms_per_image",
        "to_float_ms_per_image"}``: the collate (:func:`~shardfeed.readers.decode.transforms.collate_uint8`
        of ``[3, H, W]`` views), the copy rate of the batch into fresh memory (MB = 10^6 bytes per
        second), the hand-off (the batch's bytes at that rate), the conversion
        (:func:`~shardfeed.readers.loader.to_device` to the CPU with the ImageNet mean and std), CPU
        milliseconds per image of one thread (median of :data:`BATCH_REPEATS`); every figure None
        when no image was given or torch is missing.
    """
    none = {"batch_size": 0, "collate_ms_per_image": None, "copy_mb_per_s": None, "handoff_ms_per_image": None,
            "to_float_ms_per_image": None}
    rows = _common_shape(images)[:BATCH_SIZE]
    if not rows:
        return none
    try:
        import torch

        from ..loader import to_device
        from ..decode.transforms import collate_uint8
        from .harness import DEFAULT_MEAN, DEFAULT_STD
    except ImportError:
        return none
    rows = (rows * (-(-BATCH_SIZE // len(rows))))[:BATCH_SIZE]
    samples = [(torch.from_numpy(a).permute(2, 0, 1), 0) for a in rows]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batch = collate_uint8(samples)
        collate = _cpu_s(lambda: collate_uint8(samples))
        copy = _cpu_s(lambda: torch.empty_like(batch[0]).copy_(batch[0]))
        to_float = _cpu_s(lambda: to_device(batch, "cpu", mean=DEFAULT_MEAN, std=DEFAULT_STD))
    finally:
        torch.set_num_threads(threads)
    n = len(samples)
    nbytes = batch[0].numel() * batch[0].element_size()
    rate = nbytes / copy if copy > 0 else None
    return {"batch_size": n, "collate_ms_per_image": collate / n * 1e3,
            "copy_mb_per_s": rate / 1e6 if rate else None,
            "handoff_ms_per_image": (nbytes / n / rate * 1e3) if rate else 0.0,
            "to_float_ms_per_image": to_float / n * 1e3}


def batch_cost_terms(batch: dict) -> dict:
    """The keyword arguments of :func:`predict_images_per_s` from :func:`batch_costs`' figures
    (seconds per image; 0 for a figure not measured)."""
    return {"t_collate_s": (batch.get("collate_ms_per_image") or 0.0) / 1e3,
            "t_handoff_s": (batch.get("handoff_ms_per_image") or 0.0) / 1e3,
            "t_to_float_s": (batch.get("to_float_ms_per_image") or 0.0) / 1e3}


def predict_with_more_workers(nw: int, cpus: float, costs: dict) -> dict:
    """:func:`predict_images_per_s` with ``nw`` workers, plus ``more_workers``: the same with
    :func:`~shardfeed.readers.measure.watch_rules.storage_workers` (``costs``: the other keyword arguments)."""
    pred = predict_images_per_s(num_workers=nw, cpus=cpus, **costs)
    more = storage_workers(nw, int(cpus))
    pred_more = predict_images_per_s(num_workers=more, cpus=cpus, **costs)
    pred["more_workers"] = {"num_workers": more, "folder_images_per_s": pred_more["folder_images_per_s"],
                            "packed_images_per_s": pred_more["packed_images_per_s"]}
    return pred


def add_busy_machine(pred: dict, others: float, nw: int, cpus: float, costs: dict, warnings: list[str]) -> None:
    """``pred["busy_machine"]``: the prediction with only the cores other processes left free
    (``others``: their share of the CPU during the probe), and a warning when it was above 30 %."""
    free = max(0.1, cpus * (1 - others))
    now = predict_images_per_s(num_workers=nw, cpus=free, **costs)
    pred["busy_machine"] = {"cores_free": free, "folder_images_per_s": now["folder_images_per_s"],
                            "packed_images_per_s": now["packed_images_per_s"]}
    if others > 0.3:
        warnings.append(f"other processes used {others:.0%} of the CPU during the probe: the decode-bound figures "
                        f"are for this machine when it is quiet (with the {free:.1f} "
                        "cores left free: predicted.busy_machine)")
