"""Pack an image folder into a WebDataset or LMDB dataset: plan, write in parallel, resume.

The flow (docs/architecture.md): scan the folder (:mod:`shardfeed.convert.write.scan`), fix the packing order (a
seeded shuffle of the whole dataset, or sorted order), give every sample its key (the zero-padded
position in that order), then hand the plan to the format's packer, found in the format
registry (:func:`shardfeed.readers.format.registry.packer`; the packers live in
:mod:`shardfeed.convert.writers`), which runs its tasks on the pack's executor
(:mod:`shardfeed.convert.write.executors`: local processes or Ray). The executor, the progress sinks,
the shard-end hook and the storage options travel as one
:class:`~shardfeed.convert.write.context.PackContext`, built once where the pack starts and passed
down; the packer returns a :class:`~shardfeed.convert.write.context.PackResult`.

For WebDataset the shard boundaries are computed up front from the sample order and the file
sizes (every member's size on disk is known before reading a byte), so each shard is an
independent task: shards are byte-identical whatever ``workers`` is, and a killed pack resumes by
rewriting only the shards that were not complete. Pack state lives in ``OUT/.shardfeed-pack/``
(:mod:`shardfeed.convert.write.pack_state`: the plan's fingerprint and one record per finished shard)
until the manifest, written last and atomically, marks the dataset finished.

Reading a sample (checked reads, re-encoding, decode checks) is :mod:`shardfeed.convert.write.samples`;
its functions stay importable from here.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from shardfeed.readers.format.manifest import (
    DEFAULT_PREFIX,
    LMDB_DATA_NAME,
    MANIFEST_NAME,
    Manifest,
    member_clash,
    merge_extension_counts,
    normalize_ext,
)
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.file_io import read_small_file
from shardfeed.readers.errors import UnsupportedURLError, check_on_error
from shardfeed.readers.keywords import check_keywords
from shardfeed.readers.format.registry import FORMATS, canonical_format, describe
from shardfeed.readers.format.registry import packer as format_packer

from .. import writers  # noqa: F401  (registers the packers and writers of every format)
from .consumers import write_consumer_files
from .context import PackContext, PackResult
from .executors import ProgressSink, check_executor, run_tasks, signals_held
from .faults import FaultHooks
from .outdir import prepare_output
from .outlock import output_lock
from .pack_state import PLAN_NAME, STATE_DIR, remove_state_folder
from .path_index import PathRecords, write_path_index
from .plan import PlannedSample, SamplePlan, input_bytes, plan_samples, plan_shards
from .plan_record import check_or_write_plan, drop_partial_shards, plan_fingerprint
from .shard_cut import ShardLimits
from .readahead import DEFAULT_READ_AHEAD
from .report import PackReport, finished_report, manifest_report, plural
from .reencode import ReencodeOptions
from .samples import load_sample_payload, read_file_checked, read_source_bytes, refuse_unpackable
from .scan import ScanResult, ScannedFiles, parse_extensions, scan_image_folder

if TYPE_CHECKING:
    from .layouts import LayoutOptions

__all__ = [
    "MAX_READ_AHEAD",
    "PackOptions",
    "PlannedSample",
    "PackReport",
    "pack",
    "plan_samples",
    "plan_shards",
    "read_source_bytes",
    "FORMAT_ALIASES",
    "STATE_DIR",
    "prepare_output",
    "finished_report",
    "ProgressSink",
    "load_class_map",
    "run_tasks",
    "load_sample_payload",
    "SamplePlan",
    "read_file_checked",
    "describe_interrupted",
    "pack_local",
]

#: Most source reads in flight per shard being written (``--read-ahead``): each is a thread, and
#: far more than storage keeps in flight only adds threads.
MAX_READ_AHEAD = 1024

log = logging.getLogger(__name__)

#: Accepted ``format`` spellings -> canonical names (from the format registry).
FORMAT_ALIASES = {a: s.name for s in FORMATS.values() for a in (s.name, *s.aliases)}


@dataclasses.dataclass
class PackOptions:
    """Options of :func:`pack` (CLI flags are their kebab-case: ``max_bytes`` ↔ ``--max-bytes``).

    Attributes:
        format: ``"webdataset"`` (alias ``"wds"``) or ``"lmdb"``.
        max_count: samples per shard at most (WebDataset).
        max_bytes: bytes per shard file at most, headers and padding included (WebDataset).
        prefix: shard file prefix (``shard`` → ``shard-000000.tar``).
        workers: processes that read and write (default: CPU count).
        read_ahead: source reads in flight per shard being written (threads; bounded memory:
            :data:`~shardfeed.convert.write.readahead.DEFAULT_READ_AHEAD_BYTES` read ahead at most), so
            storage where each open waits (NFS, bucket mounts) is read concurrently; independent of
            ``workers`` and of the shard count. 0 or 1 reads one file after another; at most
            :data:`MAX_READ_AHEAD` (each read in flight is a thread). Never changes the output
            bytes (results are appended in order).
        seed: seed of the packing-order shuffle.
        shuffle: False keeps sorted ImageFolder order.
        extensions: extensions to pack (None: the defaults).
        on_error: ``"raise"`` (stop, naming the file) or ``"skip"`` (list it in the manifest), the
            readers' spelling; ``"fail"`` (the old spelling) is accepted with a DeprecationWarning and
            recorded in the manifest as ``"raise"``.
        decode_check: fully decode every image while packing (readers' decode rules).
        max_decode_bytes: with ``decode_check``, refuse an image whose decode would take more
            memory than this (bytes, read from its header; 512 MiB; None: unchecked).
        class_to_idx: fixed class map (``--classes-from``); None: from the folder.
        resume: continue an interrupted pack in OUT (an OUT that is missing or empty, or whose
            pack stopped before writing its plan, is packed from the start; an OUT holding the
            finished dataset of the same options and source is reported complete: scripts may
            always pass it).
        append: add SRC's images to the finished WebDataset dataset in OUT as new shards
            (:mod:`shardfeed.convert.write.append`): its shards stay as they are, its class indices
            keep their values, images whose path it holds already are skipped and counted.
        skip_changed: with ``append``, skip (and count) a file at a path the dataset holds whose
            size or modification time changed since it was packed; False: refuse the append,
            naming it (:class:`~shardfeed.convert.write.append.ChangedFilesError`).
        overwrite: replace the shardfeed dataset in OUT: only what its records name (manifest,
            plan, the files they list) is deleted; anything else is refused by name
            (:mod:`shardfeed.convert.write.ownership`).
        reencode: re-encode every image (resize / quality / format,
            :class:`~shardfeed.convert.write.reencode.ReencodeOptions` or a dict of its fields); None
            stores the original bytes unchanged.
        executor: where the tasks run: ``"local"`` (``workers`` processes) or ``"ray"`` (a Ray
            cluster, :mod:`shardfeed.convert.write.executors`); the output bytes are the same.
        ray_address: the Ray cluster (``auto``, ``HOST:PORT``); None: ``RAY_ADDRESS`` when set,
            else a local Ray instance.
        follow_external_links: follow symbolic links whose target lies outside SRC (a git-annex or
            DVC store); False (default): such a link stops the pack naming it (``on_error="skip"``:
            it is skipped and listed under ``link out of SRC``). Links inside SRC are always followed.
        faults: test-only fault injection (:class:`~shardfeed.convert.write.faults.FaultHooks`); None
            (production): none. Given explicitly, never taken from elsewhere; never changes the
            output bytes.
    """

    format: str = "webdataset"
    max_count: int = 10000
    max_bytes: int = 256_000_000
    prefix: str = DEFAULT_PREFIX
    workers: int | None = None
    #: not part of fingerprint_fields(): read-ahead does not change the output bytes
    read_ahead: int = DEFAULT_READ_AHEAD
    seed: int = 0
    shuffle: bool = True
    extensions: tuple[str, ...] | None = None
    on_error: str = "raise"
    decode_check: bool = False
    #: with ``decode_check``: the memory one decode may take (bytes; the readers'
    #: ``DEFAULT_MAX_DECODE_BYTES``), checked on the header; None: unchecked
    max_decode_bytes: int | None = 512 << 20
    class_to_idx: dict | None = None
    resume: bool = False
    #: not part of fingerprint_fields(): an append keeps the dataset's recorded options
    append: bool = False
    skip_changed: bool = False
    overwrite: bool = False
    #: LMDB: initial map size in bytes (None: payload + headroom). Tests use a tiny one.
    map_size: int | None = None
    reencode: ReencodeOptions | None = None
    #: not part of fingerprint_fields(): the executor does not change the output bytes
    executor: str = "local"
    ray_address: str | None = None
    #: not part of fingerprint_fields(): test faults do not change the output bytes
    faults: FaultHooks | None = None
    #: not part of fingerprint_fields(): which files are packed is in the plan's paths
    follow_external_links: bool = False

    def __post_init__(self) -> None:
        self.executor = str(self.executor).lower()
        check_executor(self.executor)
        if self.ray_address and self.executor != "ray":
            raise ValueError(f"ray_address {self.ray_address!r} applies to the ray executor only; add --executor ray")
        if isinstance(self.reencode, dict):
            self.reencode = ReencodeOptions(**self.reencode)
        if self.reencode is not None and not isinstance(self.reencode, ReencodeOptions):
            raise TypeError(f"reencode must be a ReencodeOptions, a dict or None, got {type(self.reencode).__name__}")
        self.format = canonical_format(self.format)
        ShardLimits(self.max_count, self.max_bytes)  # validates both (the shard cut's own rule)
        if self.on_error == "fail":
            warnings.warn("PackOptions(on_error='fail') is deprecated: use on_error='raise'", DeprecationWarning,
                          stacklevel=3)
            self.on_error = "raise"
        check_on_error(self.on_error)
        if self.append and (self.overwrite or not describe(self.format).sharded):
            raise ValueError("append adds WebDataset shards to a dataset: it takes neither overwrite nor "
                             "format='lmdb' (pack the new images into a dataset of their own instead)")
        if self.skip_changed and not self.append:
            raise ValueError("skip_changed (--skip-changed) applies to an append only; add --append")
        if self.workers is None:
            self.workers = os.cpu_count() or 1
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if not 0 <= self.read_ahead <= MAX_READ_AHEAD:
            raise ValueError(f"--read-ahead (read_ahead) must be 0 to {MAX_READ_AHEAD} reads in flight (threads per "
                             f"shard being written), got {self.read_ahead}")
        if "/" in self.prefix or not self.prefix or "." in self.prefix:
            raise ValueError(f"prefix {self.prefix!r} must be a plain name without '/' or '.'")

    def fingerprint_fields(self) -> dict:
        """The options that decide the output bytes (recorded in the manifest; checked on resume)."""
        d = {"format": self.format, "seed": self.seed, "shuffle": self.shuffle,
             "extensions": list(self.extensions) if self.extensions else None,
             "on_error": self.on_error, "decode_check": self.decode_check}
        d.update((name, getattr(self, name)) for name in describe(self.format).options)
        if self.reencode is not None:  # only then: manifests of packs that keep the bytes are unchanged
            d["reencode"] = self.reencode.fingerprint_fields()
        return d


def _check_option_names(cls: type) -> None:
    """Make ``cls(...)`` (a dataclass) refuse a misspelt keyword naming the closest field
    (``PackOptions(max_byte=...)``: "did you mean 'max_bytes'?"), as the CLI does for its flags."""
    generated: Callable[..., None] = cls.__init__  # type: ignore[misc]
    fields = [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(generated)
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        check_keywords(cls.__name__, kwargs, fields)
        generated(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]


_check_option_names(PackOptions)
_check_option_names(ReencodeOptions)


# ---------------------------------------------------------------------------------------------
# planning (PlannedSample, plan_samples, plan_shards: shardfeed.convert.write.plan)

# ---------------------------------------------------------------------------------------------
# output folder

# ---------------------------------------------------------------------------------------------
# entry point

def pack(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions | None = None, *,
         progress: Callable[[int, int], None] | None = None,
         output_progress: Callable[[int], None] | None = None,
         scan: ScanResult | None = None, layout=None, storage_options: dict | None = None,
         scan_progress: Callable[[str, int], None] | None = None,
         download_progress: Callable[[int, int], Callable[[int, int], None]] | None = None,
         notice: Callable[[str], None] | None = None,
         start_progress: Callable[[int, int], None] | None = None) -> PackReport:
    """Pack the image folder ``src`` into ``out`` (WebDataset shards or LMDB) with a manifest.

    ``src`` and ``out`` are local paths, ``file://`` URLs or object-store prefixes
    (``s3://bucket/prefix/``), in any combination; this is what ``shardfeed pack`` runs, and a
    pack to or from a bucket gives the same objects as the command:

    * OUT in a bucket: packed in a local staging folder and uploaded shard by shard, the manifest
      last (:func:`shardfeed.convert.write.store_pack.pack_to_store`; WebDataset only);
    * SRC in a bucket: its images are mirrored to a local folder first (one listing, one GET per
      image; :func:`shardfeed.convert.write.store_pack.mirror_store_folder`), the mirror is removed
      once the pack is finished (kept after a failure, so a resumed pack downloads only what is
      missing), the report's ``source`` and the manifest's ``options.source`` are the URL (no
      credentials), and ``extra["download_seconds"]`` is the listing and download time (the
      report's ``seconds`` and images/s are the pack's, after it);
    * a local OUT is checked (:func:`prepare_output`) before the scan (a refused OUT costs no scan);
    * labels from a file, sidecar files, no labels (``layout``:
      :class:`~shardfeed.convert.write.layouts.LayoutOptions`), and a SRC without class folders (packed
      unlabelled, with a ``notice``) go to :func:`shardfeed.convert.write.layouts.pack_layout` (OUT local
      or in a bucket). A bucket SRC is mirrored for them by
      :func:`shardfeed.convert.write.store_pack.mirror_layout_folder` (only the images and files ending in
      a sidecar suffix are downloaded); ``layout.labels_file`` is a local file either way.

    Args:
        src: an ImageFolder root (``SRC/CLASS/IMAGE``): a local path or an ``s3://`` prefix.
        out: output folder (created; must be empty unless ``resume``/``overwrite``), or an
            ``s3://`` prefix.
        options: :class:`PackOptions`.
        progress: ``callback(num_samples, num_input_bytes)`` called as samples are written.
        output_progress: ``callback(num_output_bytes)`` called with the stored image bytes where
            the packer knows them apart from the input (WebDataset with ``reencode``), each time
            just before the matching ``progress`` call; not called otherwise.
        scan: a scan of ``src`` done already (to avoid scanning twice; a local SRC only).
        layout: a :class:`~shardfeed.convert.write.layouts.LayoutOptions` (labels file, sidecars, no
            labels); None: class folders, or unlabelled when SRC has no sub-folder.
        storage_options: object-store client options (:mod:`shardfeed.readers.storage.objstore`).
        scan_progress: ``callback(phase, n)`` of the local scan
            (:func:`~shardfeed.readers.format.imagefolder.scan_image_folder`).
        download_progress: SRC in a bucket: ``callback(num_files, num_bytes)`` called once the
            listing is scanned, returning ``update(files, bytes)`` called per image downloaded.
        notice: ``callback(text)`` for what a user should know before the pack runs (a SRC
            without class folders packs unlabelled); None: logged as a warning.
        start_progress: ``callback(num_files, num_input_bytes)`` called once the scan is done,
            before the first ``progress`` call (a progress bar's totals); class-folder SRC only.

    Returns:
        A :class:`PackReport` (``output`` is the URL for a bucket OUT; ``extra["uploaded"]``,
        ``extra["upload_skipped"]`` count the files uploaded / found there already).

    Raises:
        FileNotFoundError, NotADirectoryError: SRC missing or a file; OUT a file.
        ValueError: empty SRC, OUT not empty, bad options, a sample larger than ``max_bytes``;
            with a ``layout``, a bucket object whose name cannot be a local file (named).
        shardfeed.readers.errors.UnsupportedURLError: a scheme other than ``file``/``s3`` (named,
            nothing written: never a local folder called ``gs:``), LMDB to a bucket, or the
            object-store client not installed.
        shardfeed.convert.write.outlock.OutputBusyError: another command is writing OUT (names it).
        SourceChangedError: a file changed during the pack (``on_error="raise"``).
        shardfeed.readers.errors.CorruptDataError: an image failed ``decode_check``.
        DataSourceError: a listing, download or upload failed after the retries (names the URL).
        OSError: reading a source or writing OUT failed (disk full: ``ENOSPC``/``EFBIG``); complete
            shards stay and ``resume`` continues.
    """
    options = options or PackOptions()
    problem = member_clash(parse_extensions(options.extensions), getattr(layout, "sidecars", ()))
    if problem is not None:  # before anything is read or written
        raise ValueError(f"--extensions{'/--sidecars' if getattr(layout, 'sidecars', ()) else ''}: {problem}")
    out, to_store = _checked_out(out, options, layout)
    with PackContext.for_options(options, progress=progress, output_progress=output_progress,
                                 storage_options=storage_options) as context:
        t_source = time.perf_counter()
        src, scan, src_url = _local_source(src, options, context, layout=layout, scan=scan, notice=notice,
                                           download_progress=download_progress)
        download_s = time.perf_counter() - t_source
        if options.append:  # class folders into a local dataset
            return _append(src, out, options, context, layout, scan, src_url, download_s, scan_progress, start_progress)
        if not to_store:
            prepare_output(src, out, resume=options.resume, overwrite=options.overwrite, check_only=True)
        layout = _layout_of(src, layout, src_url=src_url, notice=notice)
        if layout is not None:
            report = _pack_layout_locally(src, out, options, layout, context, to_store=to_store, source=src_url)
        else:
            report = _pack_class_folders(src, out, options, context, scan, to_store, scan_progress, start_progress)
    if src_url is not None:
        _finish_bucket_source(report, src, src_url, download_s)
    return report


def _pack_class_folders(src: Path, out, options: PackOptions, context: PackContext, scan: ScanResult | None,
                        to_store: bool, scan_progress: Callable[[str, int], None] | None,
                        start_progress: Callable[[int, int], None] | None) -> PackReport:
    """:func:`pack` of class folders (SRC local or a bucket's mirror) into a local OUT or a bucket."""
    if scan is None:
        scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=options.class_to_idx,
                                 progress=scan_progress, follow_external_links=options.follow_external_links)
    if start_progress is not None:
        start_progress(len(scan.files), scan.num_bytes)
    if to_store:
        from .store_pack import pack_to_store

        return pack_to_store(src, out, options, pack_local, context=context, scan=scan)
    return pack_local(src, out, options, scan=scan, context=context)


def _append(src: Path, out: str | Path, options: PackOptions, context: PackContext, layout: LayoutOptions | None,
            scan: ScanResult | None, src_url: str | None, download_s: float,
            scan_progress: Callable[[str, int], None] | None,
            start_progress: Callable[[int, int], None] | None) -> PackReport:
    """:func:`pack` with ``append`` (:func:`shardfeed.convert.write.append.pack_append`; class folders only)."""
    from .append import pack_append
    from .outdir import check_out_outside_src

    out = Path(out)
    check_out_outside_src(src, out)
    if _layout_of(src, layout, src_url=src_url, notice=lambda text: None) is not None:
        raise ValueError(f"{src}: no class folders; append adds class-folder images (SRC/CLASS/IMAGE)")
    report: PackReport = pack_append(src, out, options, context, scan=scan, scan_progress=scan_progress,
                                     start_progress=start_progress)
    if src_url is not None:
        _finish_bucket_source(report, src, src_url, download_s)
    return report


def _pack_layout_locally(src: Path, out, options: PackOptions, layout, context: PackContext, *,
                         to_store: bool, source: str | None) -> PackReport:
    """:func:`pack` of a layout beyond the class folder (:func:`shardfeed.convert.write.layouts.pack_layout`),
    into a local OUT or a bucket (:func:`shardfeed.convert.write.layouts.pack_layout_to_store`); ``source``:
    the bucket URL ``src`` mirrors (recorded instead of the mirror's path), or None."""
    from .layouts import pack_layout, pack_layout_to_store

    if to_store:
        return pack_layout_to_store(src, out, options, layout, context=context, source=source)
    report: PackReport = pack_layout(src, out, options, layout, context=context, source=source)
    return report


def _finish_bucket_source(report: PackReport, mirror: Path, src_url: str, download_s: float) -> None:
    """After a pack from a bucket: the local mirror removed, the report naming the URL; its
    seconds (and images/s) stay the pack's, the listing and download before it given apart."""
    shutil.rmtree(mirror, ignore_errors=True)
    report.source = src_url
    report.extra["download_seconds"] = round(download_s, 3)


def _checked_out(out: str | os.PathLike[str], options: PackOptions, layout=None) -> tuple[str | Path, bool]:
    """:func:`pack`'s OUT: ``(the URL of a bucket OUT or the local path, whether it is a bucket)``.

    Raises:
        shardfeed.readers.errors.UnsupportedURLError: an unsupported scheme, or a format that is
            written to a local disk only (LMDB) with a bucket OUT.
        ValueError: ``append`` to a bucket OUT, or with a ``layout``.
    """
    from shardfeed.readers.storage.opener import check_supported, is_remote, local_path

    check_supported(out, what="`shardfeed pack`", hint="OUT may be a local folder or s3://BUCKET/PREFIX")
    to_store = is_remote(out)  # any writable remote location (store_pack refuses a read-only one)
    if options.append and (to_store or layout is not None):
        raise ValueError(f"{out}: append adds class-folder images to a local dataset; " + (
            "append to a local copy of the dataset (`shardfeed stage`), then upload it" if to_store else
            "--labels, --sidecars and --no-labels are not appended: repack the union with --overwrite"))
    if to_store and not _writes_to_store(options.format):
        raise UnsupportedURLError(f"{out}: an LMDB dataset is written to a local disk only (LMDB maps its file into "
                                  "memory); use --format wds to pack to a bucket, or pack to a local folder")
    return (str(out) if to_store else local_path(out)), to_store


def _local_source(src: str | os.PathLike[str], options: PackOptions, context: PackContext, *,
                  layout: LayoutOptions | None, scan: ScanResult | None, notice: Callable[[str], None] | None,
                  download_progress: Callable[[int, int], Callable[[int, int], None]] | None
                  ) -> tuple[Path, ScanResult | None, str | None]:
    """:func:`pack`'s SRC as a local folder: ``(folder, scan, bucket URL or None)``.

    A bucket SRC is mirrored to a local folder first (with ``context.storage_options``); for class
    folders its scan is the listing's, rooted at the mirror; for a ``layout`` the scan is None (the
    layout scan runs on the mirror). A local SRC keeps the ``scan`` given.

    Raises:
        shardfeed.readers.errors.UnsupportedURLError: an unsupported scheme.
        ValueError: with a ``layout``, a bucket object whose name cannot be a local file.
        FileNotFoundError: the local folder does not exist.
        DataSourceError: the listing or a download failed.
    """
    from shardfeed.readers.storage.opener import check_supported, is_remote, local_path

    check_supported(src, what="`shardfeed pack`", hint="SRC may be a local folder or s3://BUCKET/PREFIX")
    src_url = str(src) if is_remote(src) else None
    if src_url is not None:
        from .store_pack import mirror_layout_folder, mirror_store_folder

        (notice or log.info)(f"listing and downloading the image folder {src_url} ...")
        if layout is not None:  # the layout scan runs on the mirror (the one naming rule)
            folder, _ = mirror_layout_folder(src_url, extensions=options.extensions, sidecars=tuple(layout.sidecars),
                                             max_files=layout.max_files, storage_options=context.storage_options,
                                             progress=download_progress)
            return folder, None, src_url
        # the listing's scan, rooted at the mirror: the pack accounts for the bucket's objects
        # (found, ignored, skipped) as for the files of a local folder, not for the mirror's
        folder, scan = mirror_store_folder(src_url, extensions=options.extensions,
                                           class_to_idx=options.class_to_idx, storage_options=context.storage_options,
                                           on_error=options.on_error, progress=download_progress)
    else:
        folder = local_path(src)
    if not folder.exists():
        raise FileNotFoundError(f"{folder}: source folder does not exist")
    return folder, scan, src_url


def _layout_of(src: Path, layout: LayoutOptions | None, *, src_url: str | None,
               notice: Callable[[str], None] | None) -> LayoutOptions | None:
    """The :class:`~shardfeed.convert.write.layouts.LayoutOptions` :func:`pack` packs ``src`` with: the
    one given, else an unlabelled layout (with a ``notice``) for a local SRC without class
    folders, else None (class folders)."""
    if layout is None and src_url is None and not _has_class_folders(src):
        from .layouts import LayoutOptions

        (notice or log.warning)(f"{src}: no class folders: packing an unlabelled dataset (readers give label -1); "
                                "for labels, pass --labels FILE or sort the images into SRC/CLASS/ folders")
        layout = LayoutOptions()
    return layout

def _writes_to_store(fmt: str) -> bool:
    """Whether the format ``fmt`` can be packed to a bucket (sharded: shards go up one by one)."""
    return describe(canonical_format(fmt)).remote_writable


def _has_class_folders(src: Path) -> bool:
    """Whether SRC holds a non-hidden sub-folder (the class-folder layout; the readers' rule)."""
    from shardfeed.readers.format.imagefolder import has_class_folders

    return has_class_folders(src)


def pack_local(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions | None = None, *,
               progress: Callable[[int, int], None] | None = None,
               output_progress: Callable[[int], None] | None = None,
               scan: ScanResult | None = None,
               on_shard_end: Callable[..., None] | None = None,
               context: PackContext | None = None) -> PackReport:
    """Pack the local image folder ``src`` (class folders) into the local folder ``out``: the
    build :func:`pack` runs for every OUT (a bucket OUT is built in a staging folder).

    ``on_shard_end(entry, index)`` is called in this process as each shard this run writes is
    complete (:class:`~shardfeed.readers.format.manifest.ShardEntry`; sharded formats). ``context``: the
    pack's :class:`~shardfeed.convert.write.context.PackContext` (its executor, progress sinks and
    shard-end hook; :func:`pack` passes its own); None: one is made for ``options`` from
    ``progress``, ``output_progress`` and ``on_shard_end``, and its executor closed at the end.
    Other Args and Raises: as :func:`pack` (local paths only).

    Raises:
        TypeError: ``context`` together with ``progress``, ``output_progress`` or ``on_shard_end``
            (those belong in the context).
    """
    options = options or PackOptions()
    if context is None:
        with PackContext.for_options(options, progress=progress, output_progress=output_progress,
                                     on_shard_end=on_shard_end) as context:
            return pack_local(src, out, options, scan=scan, context=context)
    if progress is not None or output_progress is not None or on_shard_end is not None:
        raise TypeError("pack_local(context=...): pass progress, output_progress and on_shard_end in the context")
    src, out = Path(src), Path(out)
    t0 = time.perf_counter()
    if scan is None:
        scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=options.class_to_idx,
                                 follow_external_links=options.follow_external_links)
    refuse_unpackable(scan.root, scan.unpackable, options.on_error)
    with output_lock(out, "pack"):  # one writer per OUT: a second pack fails at once, naming this one
        return _pack_locked(src, out, options, scan, context, t0)


def _pack_locked(src: Path, out: Path, options: PackOptions, scan: ScanResult, context: PackContext,
                 t0: float) -> PackReport:
    """:func:`pack` once OUT's lock is held."""
    action = prepare_output(src, out, resume=options.resume, overwrite=options.overwrite)
    if action == "finished":
        return finished_report(load_manifest(out, check_files=False), str(out), scan, options, t0)
    if options.resume and action == "start":
        # scripts that always pass --resume work on their first run (and after a kill before the
        # plan was written): nothing to resume, so start
        log.info("%s: nothing to resume yet; starting the pack", out)
        options = dataclasses.replace(options, resume=False)
    samples = plan_samples(scan, seed=options.seed, shuffle=options.shuffle)
    check_or_write_plan(out, options, scan, plan_fingerprint(scan, samples, options))
    try:
        result: PackResult = format_packer(options.format)(scan, samples, out, options, context)
    except BaseException:
        drop_partial_shards(out, options.prefix)  # Ctrl-C, disk full, a bad file: complete shards stay
        raise
    shards, extra = result.shards, result.extra
    skipped = [{"path": u["path"], "key": None, "reason": u["reason"]} for u in scan.unpackable] + result.skipped
    num_samples = sum(s.num_samples for s in shards)
    if num_samples == 0:
        raise ValueError(f"{src}: every image was skipped ({len(skipped)}); nothing to pack")
    extensions = merge_extension_counts([s.extensions for s in shards])
    if extensions is None and options.reencode is None:  # LMDB: the plan's (original bytes), less the skipped
        extensions = _plan_extension_counts(scan.files, skipped)
    manifest = Manifest(
        format=options.format, num_samples=num_samples, classes=scan.classes, class_to_idx=scan.class_to_idx,
        shards=shards, skipped=skipped, extensions=extensions,
        options={**options.fingerprint_fields(), "source": scan.recorded_source},
        files={"found": scan.num_found, "packed": num_samples, "skipped": len(skipped),
               "ignored": len(scan.ignored)},
    )
    extra.update(context.executor.describe())  # executor, num_tasks, nodes, task_retries
    if result.finalize is not None:
        result.finalize(manifest)  # e.g. LMDB stores its copy of the manifest in its final transaction
    with signals_held():  # a finished manifest means a finished dataset: its consumer files, no pack state
        manifest.write(out)
        write_consumer_files(out, manifest)  # wids' shardindex.json, the Hugging Face dataset card
        if describe(options.format).sharded and isinstance(samples, SamplePlan):  # for a later append
            gone = {item["path"] for item in result.skipped}
            write_path_index(out, manifest, PathRecords.of_files(samples.files_unordered(), gone), len(samples),
                             samples.width)
        remove_state_folder(out)
    return manifest_report(manifest, source=scan.root, output=str(out), input_bytes=input_bytes(samples),
                           seconds=time.perf_counter() - t0, workers=options.workers or 1, ignored=scan.ignored,
                           empty_classes=scan.empty_classes, shards_resumed=result.resumed, extra=extra)


def describe_interrupted(out: str | os.PathLike) -> str:
    """What a pack into ``out`` that was stopped (Ctrl-C, SIGTERM, an error) leaves there, and
    what ``--resume`` then does: the clause of the line the CLI prints.

    Counts what is really kept: complete WebDataset shards (their completion records) or the
    samples committed to ``data.mdb``; a finished dataset (its manifest was written before the
    stop) needs nothing.
    """
    from shardfeed.readers.storage.opener import is_remote

    if is_remote(out):
        return f"the shards uploaded to {out} are kept: the same command plus --resume uploads the rest"
    out = Path(out)
    if (out / MANIFEST_NAME).is_file() and (out / STATE_DIR / PLAN_NAME).is_file():
        return (f"{out} still reads as the dataset it was ({MANIFEST_NAME} unchanged); the complete new shards "
                "are kept: the same command writes the rest")
    if (out / MANIFEST_NAME).is_file():
        return f"{out} holds a finished dataset ({MANIFEST_NAME}); nothing to resume"
    if (out / LMDB_DATA_NAME).is_file():
        from ..writers.lmdb import committed_progress

        records, done = committed_progress(out) or (0, 0)
        if done:
            return (f"{plural(records, 'sample')} committed to {out / LMDB_DATA_NAME} are kept: the same command "
                    "plus --resume continues after them")
        return f"nothing was committed to {out / LMDB_DATA_NAME} yet: the same command plus --resume starts again"
    state = out / STATE_DIR
    shards = samples = 0
    if state.is_dir() and not state.is_symlink():
        for rec in sorted(state.glob("[0-9]*.json")):
            try:
                entry = json.loads(read_small_file(rec, what="a shard record")).get("entry")
            except (OSError, ValueError, AttributeError):
                continue
            shards += 1
            samples += int(entry.get("num_samples", 0)) if isinstance(entry, dict) else 0
    if shards:
        return (f"{plural(shards, 'complete shard')} ({plural(samples, 'sample')}) in {out} are kept: the same "
                "command plus --resume writes the rest")
    if state.is_dir():
        return f"no shard of {out} was complete yet: the same command plus --resume starts again"
    return f"nothing was written to {out}"


def _plan_extension_counts(files: ScannedFiles, skipped: list[dict]) -> dict[str, int]:
    """``{ext: samples}`` of the scanned images, less the skipped ones (by their path's extension)."""
    counts = collections.Counter(files.exts[c] for c in files.ext_codes)
    for item in skipped:
        if item.get("key") is not None and "." in item["path"]:
            counts[normalize_ext(item["path"].rsplit(".", 1)[1])] -= 1
    return {e: n for e, n in sorted(counts.items()) if n > 0}


def load_class_map(manifest_path: str | os.PathLike) -> dict[str, int]:
    """The ``class_to_idx`` of a packed dataset's manifest (for ``--classes-from``)."""
    return load_manifest(manifest_path, check_files=False).class_to_idx
