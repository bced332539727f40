"""``open_dataset``: one entry point for the three sources, and the rule that splits an epoch.

Sources, chosen by what ``source`` is (the format comes from the manifest, through
:mod:`shardfeed.readers.format.registry`, the registry keyed by the manifest's ``format``):

* a packed directory, its ``manifest.json``, a manifest URL or a directory URL
  (``http://host/data/``) → the registered source for the manifest's format
  (``"webdataset"``: :class:`~shardfeed.readers.sources.webdataset_source.WebDatasetSource`,
  ``"lmdb"``: :class:`~shardfeed.readers.sources.lmdb_source.LMDBSource`);
* an image folder (class sub-folders, no manifest, no shards) →
  :class:`~shardfeed.readers.sources.folder_source.FolderSource`.

A packed dataset whose manifest is missing (an interrupted pack), of an unknown format or version,
or whose files are missing or of the wrong size is refused (:class:`ManifestError`,
:class:`IncompleteDatasetError`) with a message that says how to rebuild or check it.

Splitting an epoch (binding: docs/format.md, "Splitting an epoch") lives in
:mod:`shardfeed.readers.order.epoch` (the functions are re-exported here): shuffle, split by rank and
worker, pad/drop rules, and where a resumed epoch continues. A source iterated directly follows the same rule as under
:func:`~shardfeed.readers.loader.make_loader`, whichever of the three it is.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..order.epoch import (ON_ERROR, epoch_positions, epoch_ranges, num_batches, rank_span, resolve_rank,
                           samples_per_rank, shard_order, spans_to_ranges, worker_span)
from ..errors import ManifestError, UnsupportedURLError
from ..keywords import check_keywords, signature_keywords
from ..format.manifest import LMDB_DATA_NAME, MANIFEST_NAME, Manifest
from ..storage.local_manifest import check_files_present, load_manifest
from ..storage.opener import is_remote, local_path
from ..format.registry import FORMATS, describe, register_format, source_factory

if TYPE_CHECKING:
    from .options import OpenOptions, ReadOptions

__all__ = [
    "SOURCES",
    "register_source",
    "open_dataset",
    "open_dataset_keywords",
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

#: The format registry (:mod:`shardfeed.readers.format.registry`), by manifest format name; each entry's
#: ``source`` is ``"module:Class"`` (imported on first use) or a callable: a
#: :class:`~shardfeed.readers.sources.source_base.SourceBase` subclass is called
#: ``(location, manifest, read, **own)`` (``read``: the
#: :class:`~shardfeed.readers.sources.options.ReadOptions`, ``own``: the options its constructor names),
#: any other callable ``(location, manifest, **options) -> dataset``.
SOURCES = FORMATS


def register_source(format_name: str, factory: str | Callable[..., Any]) -> None:
    """Register the source class for a manifest ``format`` (``"module:Class"`` or a callable);
    :func:`shardfeed.readers.format.registry.register_format` with ``source=``."""
    register_format(format_name, source=factory)


def is_url(source: Any) -> bool:
    """Whether ``source`` is a remote URL: ``http(s)://`` or an object store (``s3://``); see
    :mod:`~shardfeed.readers.storage.opener`."""
    return is_remote(source)


# ---------------------------------------------------------------------------------------------
# opening

def _looks_packed(root: Path) -> bool:
    return (root / MANIFEST_NAME).exists() or any(root.glob("*.tar")) or (root / LMDB_DATA_NAME).exists() \
        or any(root.glob(".shardfeed-*"))


def open_dataset(source: str | os.PathLike[str], *, image_size: int | None = None, train: bool = False,
                 decoder: str = "auto", decode: bool = True, on_error: str = "raise",
                 cache: str | None = None, **options: Any) -> Any:
    """Open an image folder or a packed dataset (local or over HTTP) as a PyTorch dataset.

    Args:
        source: an image folder; a packed directory or its ``manifest.json``; a manifest URL or a
            directory URL (``http://host/data/``); an object-store prefix or manifest
            (``s3://bucket/prefix/``: a packed WebDataset, or an image folder read one GET per
            image; LMDB is refused: stage it to a local disk).
        image_size: ``N`` resizes the shorter side to N and center-crops N x N (random resized
            crop N and a flip with ``train=True``); None keeps the decoded size. With
            ``resize_size=R`` (option below) evaluation resizes the shorter side to R before the
            central N crop (torchvision's ImageNet preset: ``image_size=224, resize_size=256``).
        train: training transforms (random resized crop + horizontal flip, seeded).
        decoder: ``"auto"`` (simplejpeg for JPEGs where installed, else Pillow), ``"simplejpeg"``,
            ``"pil"`` or ``"cv2"`` (see :mod:`~shardfeed.readers.decode.image`).
        decode: False yields raw :class:`~shardfeed.readers.format.manifest.Sample` tuples
            ``(key, data, ext, label, meta)`` instead of decoded images.
        on_error: ``"raise"`` (the error names the file, or the shard and key and the original
            file) or ``"skip"`` (the sample is dropped, counted in ``ds.skipped``, and the
            epoch's total logged once; see :mod:`~shardfeed.readers.sources.source_base`).
        cache: None, or ``"memory"``: load every sample's raw bytes once into one contiguous
            buffer (refused when it would not fit in the available memory).
        **options: sorted once, before anything is read, into the options every source shares
            (:class:`~shardfeed.readers.sources.options.ReadOptions`), how the dataset is opened
            (:class:`~shardfeed.readers.sources.options.OpenOptions`: ``storage_options``, ``timeout_s``,
            ``retries``, ``check_files``) and the chosen source's own keywords; a keyword of
            another source is a ``TypeError`` naming it (``verify`` with an image folder), one the
            source has no use for is ignored (``shuffle_buffer`` with a map-style source). They
            are: ``transform`` (callable ``uint8 [3, H, W] -> tensor``,
            replaces the built-in resize/crop), ``resize_size`` (evaluation: shorter side before
            the central ``image_size`` crop, default ``image_size``) or ``crop_pct`` (timm's
            spelling: ``resize_size = floor(image_size / crop_pct)``, e.g. 0.875), ``max_pixels``,
            ``max_decode_bytes`` (the memory one decode may allocate, checked on the header;
            512 MiB; None: unchecked), ``seed`` (0), ``shuffle`` (True),
            ``shuffle_buffer`` (WebDataset, samples; 1000; map-style sources shuffle by index and
            ignore it), ``pad`` (False), ``rank``,
            ``world_size``, ``timeout_s`` and ``retries`` (HTTP, object stores), ``storage_options``
            (object stores: ``endpoint_url``, ``region_name``, ``profile``, ``anon`` ...; see
            :mod:`~shardfeed.readers.storage.objstore`), ``readahead`` (LMDB: kernel read-around; local
            WebDataset shards: reads ahead once reads prove slow, True) and ``verify`` (LMDB:
            check each record's CRC-32; True),
            ``cache_dir`` and ``cache_limit`` (a shard cache on a local disk:
            :mod:`~shardfeed.readers.storage.shard_cache`),
            ``class_to_idx``, ``extensions``, ``follow_external_links`` (folder), ``fields`` (extra fields of a
            version-3 dataset, e.g. ``("txt", "json")``: items become ``(image, label, *values)``, raw ones
            ``(Sample, {name: value})``; see :class:`~shardfeed.readers.sources.source_base.SourceBase`),
            ``check_files`` (True: refuse a dataset
            whose files are missing or of another size than the manifest says; a local WebDataset's
            shards when each is opened for reading, one ``fstat``, so opening stats none; False reads
            anyway, and damage is then found, and named, while reading).

    Returns:
        A ``torch.utils.data`` dataset: iterable (WebDataset) or map-style (LMDB, folder,
        memory cache). Decoded items are ``(image, label)``: ``uint8`` tensor ``[3, H, W]`` and
        ``int`` (-1 in an unlabelled dataset, manifest ``labels: "none"``); batches from
        :func:`~shardfeed.readers.loader.make_loader` are ``uint8
        [B, 3, H, W]`` and ``int64 [B]``.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        IncompleteDatasetError: a packed directory without a finished manifest.
        ManifestError: unknown format or version, missing or wrong-size files.
        DataSourceError: the URL cannot be read (names the URL).
        UnsupportedURLError: a URL scheme shardfeed does not read, LMDB in a bucket, or the
            object-store client is not installed (the message says what to install or use).
        ValueError: bad options (``on_error``, ``cache``, ``decoder`` ...).
        TypeError: an unknown keyword (the message names the closest known one), or an option of
            another source than the one ``source`` is.
    """
    from .options import split_options  # (the decode modules load with the first dataset)

    check_keywords("open_dataset", options, open_dataset_keywords())
    read, opened, own = split_options(dict(options, image_size=image_size, train=train, decoder=decoder,
                                           decode=decode, on_error=on_error, cache=cache))  # before any I/O
    if opened.cache == "memory" and read.fields:
        raise ValueError("cache='memory' holds images, labels and metadata only; read extra fields (fields=...) "
                         "without the memory cache")
    common = dict(image_size=image_size, train=train, decoder=decoder, decode=decode, on_error=on_error)
    chosen = _SortedOptions(read, opened, own, common, options)
    if is_remote(source):
        ds = _open_remote(str(source), chosen)
    else:
        p = local_path(source)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if p.is_file() or _looks_packed(p):
            ds = _open_local_packed(p, chosen)
        else:
            from .folder_source import FolderSource

            # map-style: shuffled by index, no stream buffer; no manifest whose files to check
            ds = FolderSource(p, read, **chosen.own_keywords(FolderSource, ignored=("shuffle_buffer",),
                                                             refused=("timeout_s", "retries")))
    if opened.cache == "memory":
        from .memory_cache import MemoryCachedSource

        ds = MemoryCachedSource.from_source(ds)
    return ds


class _SortedOptions:
    """:func:`open_dataset`'s options, sorted once (:func:`~shardfeed.readers.sources.options.split_options`),
    and the keywords the chosen source takes."""

    def __init__(self, read: ReadOptions, opened: OpenOptions, own: dict[str, Any], common: dict[str, Any],
                 given: dict[str, Any]) -> None:
        self.read, self.opened, self.own = read, opened, own
        #: open_dataset's own arguments and the keywords the caller gave (for a source that takes keywords)
        self.common, self.given = common, given

    def own_keywords(self, cls: Any, ignored: tuple[str, ...] = (),
                     refused: tuple[str, ...] = ()) -> dict[str, Any]:
        """The source-specific keywords given, for ``cls`` (a :class:`SourceBase` subclass, whose
        constructor names its own); ``ignored`` ones are dropped (they do not apply to it), and
        ``refused`` opening options are refused when given (a local image folder has no remote
        reads to time out or retry).

        Raises:
            TypeError: a keyword (an option of another source, or a ``refused`` one) that ``cls``
                does not take.
        """
        takes = signature_keywords(cls.__init__) - _NOT_OPTIONS
        given = {k: v for k, v in self.own.items() if k not in ignored}
        bad = sorted((set(given) - takes) | (set(refused) & set(self.given)))
        if bad:
            verb = "does" if len(bad) == 1 else "do"
            raise TypeError(f"open_dataset(): {', '.join(map(repr, bad))} {verb} not apply to {cls.__name__} "
                            f"(its own options: {', '.join(sorted(takes)) or 'none'})")
        return given

    def keywords(self, ignored: tuple[str, ...]) -> dict[str, Any]:
        """Every keyword as the caller gave it (a registered source that is no :class:`SourceBase`
        is called ``factory(location, manifest, **options)``), less the opening options."""
        return {**self.common, **{k: v for k, v in self.given.items()
                                  if k not in ignored and k not in ("storage_options", "check_files", "cache_dir",
                                                                "cache_limit")}}


#: Parameters of a source's constructor that are no options.
_NOT_OPTIONS = frozenset({"self", "location", "manifest", "root", "source", "read"})


@functools.lru_cache(maxsize=1)
def open_dataset_keywords() -> frozenset[str]:
    """Every keyword :func:`open_dataset` accepts: its own, the options all sources share
    (:class:`~shardfeed.readers.sources.options.ReadOptions`), how a dataset is opened
    (:class:`~shardfeed.readers.sources.options.OpenOptions`), and each registered source's own (read from
    their signatures)."""
    factories = [source_factory(name) for name, spec in FORMATS.items() if spec.source is not None]
    from .folder_source import FolderSource
    from .options import OPEN_OPTION_NAMES, READ_OPTION_NAMES

    names = signature_keywords(open_dataset, FolderSource.__init__, *(getattr(f, "__init__", f) for f in factories))
    return frozenset((names | READ_OPTION_NAMES | OPEN_OPTION_NAMES) - _NOT_OPTIONS)


def _open_remote(source: str, chosen: _SortedOptions) -> Any:
    """A dataset at a remote location (through the one opener, whatever its storage); a listable
    location without a manifest that holds class folders (:func:`~shardfeed.readers.storage.location.folder_kind`)
    is read as an image folder (one read per image)."""
    from ..storage.location import folder_kind
    from ..storage.opener import open_location

    opened = chosen.opened
    loc = open_location(source, storage_options=opened.storage_options, timeout_s=opened.timeout_s,
                        retries=opened.retries)
    check_files = opened.check_files
    try:
        manifest = loc.load_manifest(check_files=check_files)
    except ManifestError:
        if not loc.listable or source.endswith(".json") or folder_kind(loc) != "folder":
            raise
        from .folder_source import FolderSource

        if opened.cache_dir is not None:
            log.info("%s: an image folder (one read per image): cache_dir keeps the shards of a packed dataset "
                     "and is not used", source)
        return FolderSource(loc, chosen.read, **chosen.own_keywords(FolderSource, ignored=("shuffle_buffer",)))
    if loc.listable and not describe(manifest.format).remote_readable:
        raise UnsupportedURLError(f"{source}: an LMDB dataset is read from a local disk only (LMDB maps its file "
                                  f"into memory); copy it first: `shardfeed stage {source} /local/dir`, then open "
                                  "/local/dir (or pack the bucket's data as --format wds to read it from the bucket)")
    if opened.cache_dir is not None:
        loc = _cached(source, loc, manifest, opened)
    return _open_packed(loc, manifest, chosen)


def _cached(source: str, loc: Any, manifest: Manifest, opened: OpenOptions) -> Any:
    """``loc`` read through the shard cache in ``opened.cache_dir`` (:mod:`~shardfeed.readers.storage.shard_cache`);
    ``loc`` itself for a format whose files are not read through the location (LMDB: logged)."""
    from ..storage.cached_location import CachedLocation
    from ..storage.shard_cache import ShardCache

    assert opened.cache_dir is not None  # the caller's condition
    if not describe(manifest.format).remote_readable:
        log.info("%s: cache_dir keeps the shards of a WebDataset, not a %s dataset, and is not used", source,
                 manifest.format)
        return loc
    return CachedLocation(loc, manifest, ShardCache(opened.cache_dir, opened.cache_limit))


def _open_local_packed(p: Path, chosen: _SortedOptions) -> Any:
    """A local packed dataset (``p``: its folder or manifest file). Its files are checked at open,
    or, for a source that checks each file as it opens it for reading (:func:`_checks_files_on_read`),
    then; ``check_files=False``: not at all."""
    manifest = load_manifest(p, check_files=False)
    root = p.parent if p.is_file() else p
    on_read = _checks_files_on_read(manifest)
    if chosen.opened.check_files and not on_read:
        check_files_present(manifest, root)
    ds = _open_packed(root, manifest, chosen)
    if on_read:
        ds.check_files = chosen.opened.check_files
    return ds


def _checks_files_on_read(manifest: Manifest) -> bool:
    """Whether the format's source checks each file as it opens it for reading (WebDataset: one
    ``fstat`` per shard read), so that opening a local dataset stats none of its shards."""
    spec = FORMATS.get(manifest.format)
    if spec is None or spec.source is None:
        return False
    return bool(getattr(source_factory(manifest.format), "checks_files_on_read", False))


def _open_packed(location: Any, manifest: Manifest, chosen: _SortedOptions) -> Any:
    spec = FORMATS.get(manifest.format)
    if spec is None or spec.source is None:
        raise ManifestError(f"{location}: manifest format {manifest.format!r} is not one this shardfeed "
                            f"reads ({', '.join(sorted(n for n, s in FORMATS.items() if s.source))}); repack the "
                            "dataset with `shardfeed pack --format wds|lmdb`")
    from .source_base import SourceBase

    cls = source_factory(manifest.format)
    # shuffled by index instead; a packed dataset has no links to follow
    ignored = ("follow_external_links",) + (("shuffle_buffer",) if getattr(cls, "map_style", False) else ())
    takes_read_options = isinstance(cls, type) and issubclass(cls, SourceBase)
    if takes_read_options:  # a source class: (location, manifest, read, **its own keywords)
        return cls(location, manifest, chosen.read, **chosen.own_keywords(cls, ignored=ignored))
    return cls(location, manifest, **chosen.keywords(ignored))
