"""``bench``: build ``make_loader`` on one dataset and measure it with the training-loop harness."""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any, Sequence

from ..storage.redact import shown_source
from ..format.registry import FORMATS
from .cache import close_lmdb_envs, dataset_files, detect_source_format, evict_page_cache
from .harness import DEFAULT_MEAN, DEFAULT_STD, run_training_loop, select_device, shutdown_loader
from .report import RunReport, fmt_bytes

__all__ = ["LOADER_KNOBS", "MAKE_LOADER_DEFAULTS", "bench_source", "dataset_len"]

logger = logging.getLogger(__name__)

#: The ``DataLoader`` knobs ``tune`` sweeps (and every report records as the loader used them).
LOADER_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
#: make_loader / open_dataset defaults, left out of the printed make_loader(...) call.
MAKE_LOADER_DEFAULTS = {"shuffle": True, "seed": 0, "drop_last": False, "pad": False, "train": False,
                        "decoder": "auto", "decode": True, "on_error": "raise", "cache": None}


def _evict(source: str | os.PathLike, evict_files: Sequence[str | os.PathLike] | None, follow: bool) -> dict:
    """Evict ``source``'s files and the rest of ``evict_files``; the figures of ``source``'s own files."""
    own = dataset_files(source, follow_external_links=follow)
    files = list(evict_files) if evict_files is not None else own
    close_lmdb_envs(files)
    if not files:
        cache = {"files": 0, "bytes": 0, "ignored": None,
                 "message": f"{shown_source(source)}: no local files to evict (a URL?): --cold has no effect"}
    else:
        mine = {os.path.abspath(f) for f in own}
        ours = [f for f in files if os.path.abspath(f) in mine]
        rest = [f for f in files if os.path.abspath(f) not in mine] if ours else []
        cache = evict_page_cache(ours or files)
        if rest:  # the other side's files leave the page cache too; its own run reports them
            other = evict_page_cache(rest)
            if other.get("message"):
                logger.warning("%s", other["message"])
        cache["also_evicted_files"] = len(rest)
    if cache.get("message"):
        logger.warning("%s", cache["message"])
    return cache


def bench_source(source: str | os.PathLike, *, batch_size: int = 64, image_size: int | None = 224,
                 model: str = "tiny", device: str = "auto", compute_ms: float | None = None, warmup: int = 10,
                 batches: int = 100, cold: bool = False, evict_files: Sequence[str | os.PathLike] | None = None,
                 channels_last: bool = False, mean: Sequence[float] | None = DEFAULT_MEAN,
                 std: Sequence[float] | None = DEFAULT_STD, label: str | None = None, num_threads: int | None = None,
                 **loader_options: Any) -> RunReport:
    """Build ``make_loader(source, batch_size, image_size=..., **loader_options)`` and measure it.

    On a CPU device ``pin_memory`` defaults to False (pinning only helps copies to a GPU).

    Args:
        source: an image folder, a packed dataset (directory, manifest or URL).
        batch_size: images per batch.
        image_size: the loader's ``image_size`` (resize + centre crop; None keeps decoded sizes).
        model, device, compute_ms, warmup, batches, channels_last, mean, std, label, num_threads:
            see :func:`run_training_loop`.
        cold: evict the dataset's files (or ``evict_files``) from the page cache first.
        evict_files: the files to evict with ``cold`` (default: :func:`dataset_files` of ``source``).
            The report's page-cache figures (``RunReport.cache``) cover those of ``source``'s own
            files; the others (another dataset's) are evicted too and counted in its
            ``also_evicted_files``.
        **loader_options: any other ``make_loader`` / ``open_dataset`` option.

    Returns:
        The :class:`RunReport`; ``config`` holds ``source``, ``source_format`` and every setting.
    """
    import torch

    from ..loader import make_loader

    dev = select_device(device)
    opts = {k: v for k, v in loader_options.items()}
    follow = bool(opts.get("follow_external_links", False))
    if dev.type != "cuda" and opts.get("pin_memory") is None:
        opts["pin_memory"] = False
    cache = _evict(source, evict_files, follow) if cold else None
    loader = make_loader(source, batch_size, image_size=image_size, **opts)
    shown = {k: v for k, v in opts.items() if k != "storage_options"}  # credentials stay out of the report
    try:
        fmt = _source_format_of(loader, source)
        effective = {k: getattr(loader, k, opts.get(k)) for k in LOADER_KNOBS}
        config = {"source": shown_source(source), "source_format": fmt, "reencode": _reencode_of(loader),
                  "batch_size": batch_size, "image_size": image_size,
                  "device": str(dev), "cold": cold, "loader": {**shown, **effective},
                  "num_dataset_samples": dataset_len(getattr(loader, "dataset", None)),
                  "cpu_count": os.cpu_count(), "torch": torch.__version__, "python": sys.version.split()[0]}
        report = run_training_loop(loader, model=model, device=dev, compute_ms=compute_ms, warmup=warmup,
                                   batches=batches, channels_last=channels_last, mean=mean, std=std,
                                   config=config, label=label, num_threads=num_threads)
    finally:
        shutdown_loader(loader, None)
        del loader
        gc.collect()
    report.cache = cache
    if cache and cache.get("message"):
        report.warnings.insert(0, cache["message"])
    if cold:
        report.warnings += _cold_window_warnings(report)
    n = report.config.get("num_dataset_samples")
    if cold and n and (warmup + batches) * batch_size > n:
        report.warnings.append(f"warm-up + measured batches ({(warmup + batches) * batch_size} images) exceed the "
                               f"dataset ({n}): later epochs read from the page cache, not the disk")
    return report


#: On a cold run, a measured window that read less than this share of the run's disk bytes ran
#: mostly from memory: the report says so.
COLD_WINDOW_MIN_SHARE = 0.25


def _cold_window_warnings(report: RunReport) -> list[str]:
    """A cold run whose disk reads came mostly before the measured window: the window ran warm."""
    io = report.io or {}
    whole, window = io.get("read_bytes_with_warmup"), io.get("read_bytes")
    if not whole or window is None or window >= COLD_WINDOW_MIN_SHARE * whole:
        return []
    rate = report.images_per_s_with_warmup
    incl = f" ({rate:.1f} images/s)" if rate is not None else ""
    cfg = report.config
    n, bs, warmup = cfg.get("num_dataset_samples"), cfg.get("batch_size"), cfg.get("warmup")
    head = (f"cold run: {fmt_bytes(whole - window)} of the {fmt_bytes(whole)} read from disk came in the warm-up "
            f"(worker start-up, read-ahead, a shuffle buffer that fills before the first batch) and "
            f"{fmt_bytes(window)} in the measured window, which ran mostly from memory; "
            f"'images/s incl. warm-up' counts the cold reads{incl}")
    known = isinstance(n, int) and isinstance(bs, int) and bs > 0 and isinstance(warmup, int)
    if known and (warmup + report.num_batches + 1) * bs < n:
        return [f"{head}, also those of samples the window did not reach: compare cold runs over a whole epoch "
                f"(--batches {max(1, n // bs - warmup)} with --warmup {warmup} here)"]
    return [f"{head}: compare that figure for cold runs"]


def dataset_len(obj: Any) -> int | None:
    """The whole dataset's sample count (``num_samples``, all ranks), else ``len``."""
    n = getattr(obj, "num_samples", None)
    if isinstance(n, int):
        return n
    try:
        return len(obj)
    except Exception:
        return None


def _reencode_of(loader: Any) -> dict | None:
    """The re-encoding a packed dataset was made with (its manifest's ``options["reencode"]``), or None."""
    manifest = getattr(getattr(loader, "dataset", None), "manifest", None)
    options = getattr(manifest, "options", None)
    value = options.get("reencode") if isinstance(options, dict) else None
    return value if isinstance(value, dict) else None


def _source_format_of(loader: Any, source: Any) -> str:
    ds = getattr(loader, "dataset", None)
    for obj in (ds, getattr(ds, "manifest", None)):
        for attr in ("source_format", "format"):
            value = getattr(obj, attr, None)
            if isinstance(value, str) and (value == "folder" or value in FORMATS):
                return value
    return detect_source_format(source)
