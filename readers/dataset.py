"""``open_dataset``: one entry point for the three sources, and the rule that splits an epoch.

Sources, chosen by what ``source`` is (the format comes from the manifest, through
:mod:`shardfeed.readers.registry`, the registry keyed by the manifest's ``format``):

* a packed directory, its ``manifest.json``, a manifest URL or a directory URL
  (``http://host/data/``) → the registered source for the manifest's format
  (``"webdataset"``: :class:`~shardfeed.readers.webdataset_source.WebDatasetSource`,
  ``"lmdb"``: :class:`~shardfeed.readers.lmdb_source.LMDBSource`);
* an image folder (class sub-folders, no manifest, no shards) →
  :class:`~shardfeed.readers.folder_source.FolderSource`.

A packed dataset whose manifest is missing (an interrupted pack), of an unknown format or version,
or whose files are missing or of the wrong size is refused (:class:`ManifestError`,
:class:`IncompleteDatasetError`) with a message that says how to rebuild or check it.

Splitting an epoch (DESIGN.md, binding). For every epoch:

1. the shard order is shuffled with ``random.Random(seed + epoch)`` (``shuffle=False`` keeps the
   manifest order); random-access sources (LMDB, folder, ``cache="memory"``) shuffle the samples
   themselves with the same seed instead (a permutation of the N samples);
2. the shards are laid end to end as one global sequence of N samples (counts from the manifest);
3. that sequence is cut into ``world_size`` equal contiguous ranges of ``N // world_size``
   samples: the remainder ``N % world_size`` (the last samples of the epoch's sequence) is
   dropped, or, with ``pad=True``, every rank gets ``ceil(N / world_size)`` samples and the
   missing ones repeat the sequence from its start;
4. ``drop_last=True`` drops each rank's last partial batch (every rank has the same count, so all
   ranks drop alike);
5. each rank's range is cut into ``num_workers`` contiguous sub-ranges on batch boundaries
   (worker ``w`` gets batches ``[w * B // W, (w + 1) * B // W)`` of the rank's ``B`` batches),
   so only one worker ever holds a partial batch and the number of batches does not depend on
   ``num_workers``;
6. within a worker a seeded shuffle buffer mixes the samples (seed, epoch, rank, worker).

``len(loader) = ceil(L / batch_size)`` (``floor`` with ``drop_last``) where ``L`` is
:func:`samples_per_rank`.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import ManifestError, UnsupportedURLError
from .format import LMDB_DATA_NAME, MANIFEST_NAME, Manifest, load_manifest
from .opener import is_remote, local_path, url_scheme
from .registry import FORMATS, register_format, source_factory

__all__ = [
    "SOURCES",
    "register_source",
    "open_dataset",
    "resolve_rank",
    "samples_per_rank",
    "rank_span",
    "worker_span",
    "shard_order",
    "epoch_ranges",
    "spans_to_ranges",
    "is_url",
    "ON_ERROR", "num_batches", "epoch_positions"]

log = logging.getLogger(__name__)

#: Accepted values of ``on_error``.
ON_ERROR = ("raise", "skip")

#: The format registry (:mod:`shardfeed.readers.registry`), by manifest format name; each entry's
#: ``source`` is ``"module:Class"`` (imported on first use) or a callable
#: ``(location, manifest, **options) -> dataset``.
SOURCES = FORMATS


def register_source(format_name: str, factory: str | Callable[..., Any]) -> None:
    """Register the source class for a manifest ``format`` (``"module:Class"`` or a callable);
    :func:`shardfeed.readers.registry.register_format` with ``source=``."""
    register_format(format_name, source=factory)


def is_url(source: Any) -> bool:
    """Whether ``source`` is a remote URL: ``http(s)://`` or an object store (``s3://``); see
    :mod:`~shardfeed.readers.opener`."""
    return is_remote(source)


# ---------------------------------------------------------------------------------------------
# the epoch split (pure functions)

def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """The ``(rank, world_size)`` a reader should use.

    Precedence: explicit arguments, then ``torch.distributed`` when it is initialised, then the
    ``RANK``/``WORLD_SIZE`` environment variables (set by ``torchrun``), then ``(0, 1)``.
    An explicit argument wins so that a caller can always override what the process sees.

    Raises:
        ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.
    """
    r, w = rank, world_size
    if r is None or w is None:
        dr = dw = None
        try:
            import sys

            if "torch.distributed" in sys.modules:  # never import torch just to ask
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    dr, dw = dist.get_rank(), dist.get_world_size()
        except Exception:  # pragma: no cover - a broken torch build: fall back to the environment
            pass
        if dr is None:
            env_r, env_w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
            try:
                dr = int(env_r) if env_r is not None else None
                dw = int(env_w) if env_w is not None else None
            except ValueError:
                raise ValueError(f"RANK={env_r!r} / WORLD_SIZE={env_w!r} are not integers") from None
        if r is None:
            r = dr if dr is not None else 0
        if w is None:
            w = dw if dw is not None else 1
    if int(w) < 1:
        raise ValueError(f"world_size must be at least 1, got {w}")
    if not 0 <= int(r) < int(w):
        raise ValueError(f"rank {r} is outside [0, world_size={w})")
    return int(r), int(w)


def samples_per_rank(num_samples: int, world_size: int, *, pad: bool = False, batch_size: int = 1,
                     drop_last: bool = False) -> int:
    """Samples each rank reads per epoch (L): ``N // world_size`` (``ceil`` with ``pad``),
    cut down to whole batches with ``drop_last``."""
    n = -(-num_samples // world_size) if pad else num_samples // world_size
    if pad and num_samples == 0:
        n = 0
    if drop_last:
        n -= n % batch_size
    return n


def num_batches(num_samples: int, world_size: int, batch_size: int, *, pad: bool = False,
                drop_last: bool = False) -> int:
    """Batches per rank per epoch: ``ceil(L / batch_size)`` (``L // batch_size`` with ``drop_last``)."""
    n = samples_per_rank(num_samples, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    return -(-n // batch_size)




def rank_span(num_samples: int, rank: int, world_size: int, *, pad: bool = False, batch_size: int = 1,
              drop_last: bool = False) -> tuple[int, int]:
    """Half-open range ``[start, stop)`` of the epoch's global sequence that ``rank`` reads.

    With ``pad`` the range may pass ``num_samples``: position ``p`` then stands for ``p % N``.
    """
    per_rank = samples_per_rank(num_samples, world_size, pad=pad)
    start = rank * per_rank
    n = samples_per_rank(num_samples, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    return start, start + n


def worker_span(start: int, stop: int, num_workers: int, worker: int, *, batch_size: int = 1) -> tuple[int, int]:
    """Sub-range of ``[start, stop)`` read by ``worker`` of ``num_workers``, cut on batch boundaries.

    Worker ``w`` gets batches ``[w * nb // W, (w + 1) * nb // W)`` of the ``nb`` batches of the
    range, so only the last non-empty worker can hold a partial batch.
    """
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is outside [0, num_workers={num_workers})")
    n = stop - start
    nb = -(-n // batch_size)
    b0 = worker * nb // num_workers
    b1 = (worker + 1) * nb // num_workers
    return start + min(n, b0 * batch_size), start + min(n, b1 * batch_size)


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard order: ``random.Random(seed + epoch).shuffle`` of ``range(num_shards)``."""
    order = list(range(num_shards))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    return order


def spans_to_ranges(counts: Sequence[int], order: Sequence[int], start: int,
                    stop: int) -> list[tuple[int, int, int]]:
    """Map global positions ``[start, stop)`` (shards laid end to end in ``order``) to
    ``(shard_index, start_sample, end_sample)`` pieces; positions past N wrap to the start."""
    total = sum(counts[i] for i in order)
    out: list[tuple[int, int, int]] = []
    if total == 0 or stop <= start:
        return out
    pos = start
    while pos < stop:
        base = (pos // total) * total
        cum = base
        for i in order:
            c = counts[i]
            if c and cum + c > pos:
                a = pos - cum
                b = min(c, stop - cum)
                if out and out[-1][0] == i and out[-1][2] == a:
                    out[-1] = (i, out[-1][1], b)
                else:
                    out.append((i, a, b))
                pos = cum + b
                if pos >= stop:
                    break
            cum += c
    return out


def epoch_ranges(shard_counts: Sequence[int], *, seed: int = 0, epoch: int = 0, rank: int = 0,
                 world_size: int = 1, num_workers: int = 1, worker: int = 0, pad: bool = False,
                 shuffle: bool = True, batch_size: int = 1,
                 drop_last: bool = False) -> list[tuple[int, int, int]]:
    """The sample ranges one worker of one rank reads in one epoch (see the module docstring).

    Args:
        shard_counts: samples per shard, in manifest order.
        seed, epoch: the shard order is shuffled with ``seed + epoch``.
        rank, world_size: this process's place among the ranks.
        num_workers, worker: DataLoader workers of this rank (1, 0 without workers).
        pad: fill the remainder ``N % world_size`` by repeating samples instead of dropping it.
        shuffle: shuffle the shard order (False: manifest order).
        batch_size: worker sub-ranges are cut on batch boundaries of this size.
        drop_last: drop each rank's last partial batch.

    Returns:
        ``[(shard_index, start_sample, end_sample), ...]``: half-open sample ranges inside shards
        (indices into the manifest's shard list), in reading order.

    Raises:
        ValueError: bad rank/worker or sizes.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    n = sum(shard_counts)
    start, stop = rank_span(n, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    a, b = worker_span(start, stop, num_workers, worker, batch_size=batch_size)
    order = shard_order(len(shard_counts), seed=seed, epoch=epoch, shuffle=shuffle)
    return spans_to_ranges(shard_counts, order, a, b)


def epoch_positions(num_samples: int, *, seed: int, epoch: int, shuffle: bool, rank: int, world_size: int,
                    pad: bool = False, batch_size: int = 1, drop_last: bool = False) -> list[int]:
    """Sample indices one rank reads in an epoch, for random-access sources.

    The epoch's global sequence is a ``random.Random(seed + epoch)`` permutation of
    ``range(num_samples)`` (identity without ``shuffle``); the rank takes its contiguous range
    of it (:func:`rank_span`), wrapping with ``pad``.
    """
    order = list(range(num_samples))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    start, stop = rank_span(num_samples, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    if num_samples == 0:
        return []
    return [order[p % num_samples] for p in range(start, stop)]




# ---------------------------------------------------------------------------------------------
# opening

def _looks_packed(root: Path) -> bool:
    return (root / MANIFEST_NAME).exists() or any(root.glob("*.tar")) or (root / LMDB_DATA_NAME).exists() \
        or any(root.glob(".shardfeed-*"))


def open_dataset(source: str | os.PathLike, *, image_size: int | None = None, train: bool = False,
                 decoder: str = "auto", decode: bool = True, on_error: str = "raise",
                 cache: str | None = None, **options: Any):
    """Open an image folder or a packed dataset (local or over HTTP) as a PyTorch dataset.

    Args:
        source: an image folder; a packed directory or its ``manifest.json``; a manifest URL or a
            directory URL (``http://host/data/``); an object-store prefix or manifest
            (``s3://bucket/prefix/``: a packed WebDataset, or an image folder read one GET per
            image; LMDB is refused: stage it to a local disk).
        image_size: ``N`` resizes the shorter side to N and center-crops N x N (random resized
            crop N and a flip with ``train=True``); None keeps the decoded size.
        train: training transforms (random resized crop + horizontal flip, seeded).
        decoder: ``"auto"`` (simplejpeg for JPEGs where installed, else Pillow), ``"simplejpeg"``,
            ``"pil"`` or ``"cv2"`` (see :mod:`~shardfeed.readers.decode`).
        decode: False yields raw :class:`~shardfeed.readers.format.Sample` tuples
            ``(key, data, ext, label, meta)`` instead of decoded images.
        on_error: ``"raise"`` (the error names the file, or the shard and key and the original
            file) or ``"skip"`` (the sample is dropped, counted in ``ds.skipped``, and the
            epoch's total logged once; see :mod:`~shardfeed.readers.source_base`).
        cache: None, or ``"memory"``: load every sample's raw bytes once into one contiguous
            buffer (refused when it would not fit in the available memory).
        **options: passed to the source: ``transform`` (callable ``uint8 [3, H, W] -> tensor``,
            replaces the built-in resize/crop), ``max_pixels``, ``seed`` (0), ``shuffle`` (True),
            ``shuffle_buffer`` (WebDataset, samples; 1000; map-style sources shuffle by index and
            ignore it), ``pad`` (False), ``rank``,
            ``world_size``, ``timeout_s`` and ``retries`` (HTTP, object stores), ``storage_options``
            (object stores: ``endpoint_url``, ``region_name``, ``profile``, ``anon`` ...; see
            :mod:`~shardfeed.readers.objstore`), ``readahead`` and ``verify`` (LMDB: check
            each record's CRC-32; True),
            ``class_to_idx`` and ``extensions`` (folder), ``check_files`` (True: refuse a dataset
            whose files are missing or of another size than the manifest says; False reads
            anyway, and damage is then found, and named, while reading).

    Returns:
        A ``torch.utils.data`` dataset: iterable (WebDataset) or map-style (LMDB, folder,
        memory cache). Decoded items are ``(image, label)``: ``uint8`` tensor ``[3, H, W]`` and
        ``int``; batches from :func:`~shardfeed.readers.loader.make_loader` are ``uint8
        [B, 3, H, W]`` and ``int64 [B]``.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        IncompleteDatasetError: a packed directory without a finished manifest.
        ManifestError: unknown format or version, missing or wrong-size files.
        DataSourceError: the URL cannot be read (names the URL).
        UnsupportedURLError: a URL scheme shardfeed does not read, LMDB in a bucket, or the
            object-store client is not installed (the message says what to install or use).
        ValueError: bad options (``on_error``, ``cache``, ``decoder`` ...).
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if cache not in (None, "memory"):
        raise ValueError(f"cache must be None or 'memory', got {cache!r}")
    common = dict(image_size=image_size, train=train, decoder=decoder, decode=decode, on_error=on_error)
    storage_options = options.pop("storage_options", None)
    if is_remote(source):
        ds = _open_remote(str(source), storage_options, common, options)
    else:
        p = local_path(source)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if p.is_file() or _looks_packed(p):
            manifest = load_manifest(p, check_files=options.pop("check_files", True))
            root = p.parent if p.is_file() else p
            ds = _open_packed(root, manifest, common, options)
        else:
            from .folder_source import FolderSource

            options.pop("check_files", None)
            options.pop("shuffle_buffer", None)  # map-style: shuffled by index, no stream buffer
            ds = FolderSource(p, **common, **options)
    if cache == "memory":
        from .memory_cache import MemoryCachedSource

        ds = MemoryCachedSource.from_source(ds)
    return ds


def _open_remote(source: str, storage_options: dict | None, common: dict, options: dict):
    """A dataset at an ``http(s)://`` or ``s3://`` URL (through the one opener); a bucket prefix
    without a manifest that holds class folders is read as an image folder (one GET per image)."""
    from .opener import open_location

    loc = open_location(source, storage_options=storage_options, timeout_s=options.get("timeout_s", None),
                        retries=options.get("retries", None))
    check_files = options.pop("check_files", True)
    store = url_scheme(source) == "s3"
    try:
        manifest = loc.load_manifest(check_files=check_files)
    except ManifestError:
        if not store or source.endswith(".json"):
            raise
        from .folder_source import FolderSource
        from .objstore import store_folder_kind

        if store_folder_kind(loc) != "folder":
            raise
        for k in ("check_files", "shuffle_buffer", "timeout_s", "retries"):
            options.pop(k, None)
        return FolderSource(loc, **common, **options)
    if store and manifest.format == "lmdb":
        raise UnsupportedURLError(f"{source}: an LMDB dataset is read from a local disk only (LMDB maps its file "
                                  f"into memory); copy it first: `shardfeed stage {source} /local/dir`, then open "
                                  "/local/dir (or pack the bucket's data as --format wds to read it from the bucket)")
    return _open_packed(loc, manifest, common, options)


def _open_packed(location: Any, manifest: Manifest, common: dict, options: dict):
    spec = FORMATS.get(manifest.format)
    if spec is None or spec.source is None:
        raise ManifestError(f"{location}: manifest format {manifest.format!r} is not one this shardfeed "
                            f"reads ({', '.join(sorted(n for n, s in FORMATS.items() if s.source))}); repack the "
                            "dataset with `shardfeed pack --format wds|lmdb`")
    cls = source_factory(manifest.format)
    if getattr(cls, "map_style", False):
        options = {k: v for k, v in options.items() if k != "shuffle_buffer"}  # shuffled by index instead
    return cls(location, manifest, **common, **options)
