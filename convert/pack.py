"""Pack an image folder into a WebDataset or LMDB dataset: plan, write in parallel, resume.

The flow (docs/architecture.md): scan the folder (:mod:`shardfeed.convert.scan`), fix the packing order (a
seeded shuffle of the whole dataset, or sorted order), give every sample its key (the zero-padded
position in that order), then hand the plan to the format's packer, found in the format
registry (:func:`shardfeed.readers.registry.packer`; the packers live in
:mod:`shardfeed.convert.writers`), which runs its tasks on the pack's executor
(:mod:`shardfeed.convert.executors`: local processes or Ray).

For WebDataset the shard boundaries are computed up front from the sample order and the file
sizes (every member's size on disk is known before reading a byte), so each shard is an
independent task: shards are byte-identical whatever ``workers`` is, and a killed pack resumes by
rewriting only the shards that were not complete. Pack state lives in ``OUT/.shardfeed-pack/``
(:mod:`shardfeed.convert.pack_state`: the plan's fingerprint and one record per finished shard)
until the manifest, written last and atomically, marks the dataset finished.

Reading a sample (checked reads, re-encoding, decode checks) is :mod:`shardfeed.convert.samples`;
its functions stay importable from here.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import time
import warnings
from array import array
from pathlib import Path
from typing import Callable, Sequence

from shardfeed.readers.format import (
    DEFAULT_PREFIX,
    LMDB_DATA_NAME,
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    merge_extension_counts,
    normalize_ext,
    write_bytes_atomic,
)
from shardfeed.readers.errors import check_on_error
from shardfeed.readers.keywords import check_keywords
from shardfeed.readers.registry import FORMATS, canonical_format, describe
from shardfeed.readers.registry import packer as format_packer

from . import writers  # noqa: F401  (registers the packers and writers of every format)
from .consumers import write_consumer_files
from .executors import ProgressSink, check_executor, make_executor, run_tasks, signals_held, use_executor
from .faults import FaultHooks, current_default_faults
from .outlock import check_not_busy, output_lock
from .ownership import decide, local_entries, survey
from .pack_state import PLAN_NAME, STATE_DIR, describe_plan_change, write_plan_files
from .plan import PlannedSample, SamplePlan, input_bytes, plan_samples, plan_shards
from .shard_cut import ShardLimits
from .readahead import DEFAULT_READ_AHEAD
from .reencode import ReencodeOptions
from .samples import load_sample_payload, read_file_checked, read_source_bytes
from .scan import ScanResult, ScannedFiles, scan_image_folder

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
            :data:`~shardfeed.convert.readahead.DEFAULT_READ_AHEAD_BYTES` read ahead at most), so
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
        overwrite: replace the shardfeed dataset in OUT: only what its records name (manifest,
            plan, the files they list) is deleted; anything else is refused by name
            (:mod:`shardfeed.convert.ownership`).
        reencode: re-encode every image (resize / quality / format,
            :class:`~shardfeed.convert.reencode.ReencodeOptions` or a dict of its fields); None
            stores the original bytes unchanged.
        executor: where the tasks run: ``"local"`` (``workers`` processes) or ``"ray"`` (a Ray
            cluster, :mod:`shardfeed.convert.executors`); the output bytes are the same.
        ray_address: the Ray cluster (``auto``, ``HOST:PORT``); None: ``RAY_ADDRESS`` when set,
            else a local Ray instance.
        faults: test-only fault injection (:class:`~shardfeed.convert.faults.FaultHooks`); None
            (production): none, unless a :func:`~shardfeed.convert.faults.default_faults` block
            of a test sets one. Never changes the output bytes.
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
    overwrite: bool = False
    #: LMDB: initial map size in bytes (None: payload + headroom). Tests use a tiny one.
    map_size: int | None = None
    reencode: ReencodeOptions | None = None
    #: not part of fingerprint_fields(): the executor does not change the output bytes
    executor: str = "local"
    ray_address: str | None = None
    #: not part of fingerprint_fields(): test faults do not change the output bytes
    faults: FaultHooks | None = None

    def __post_init__(self):
        if self.faults is None:
            self.faults = current_default_faults()
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


@dataclasses.dataclass
class PackReport:
    """Summary of a pack (printed by the CLI; ``--json`` writes :meth:`to_json`)."""

    source: str
    output: str
    format: str
    num_samples: int
    num_shards: int
    num_bytes: int
    input_bytes: int
    seconds: float
    workers: int
    files: dict
    skipped: list
    ignored: list
    empty_classes: list
    num_classes: int
    shards_resumed: int = 0
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.num_samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["images_per_s"] = round(self.images_per_s, 1)
        d["mb_per_s"] = round(self.mb_per_s, 2)
        return d

    def summary(self) -> str:
        """The one-line human summary."""
        shards = describe(self.format).noun(self.num_shards)
        classes = ("(no labels)" if self.extra.get("layout") == "unlabelled"
                   else "in " + _plural(self.num_classes, 'class', 'classes'))
        if self.extra.get("already_complete"):
            return (f"{self.output} already holds this finished dataset ({_plural(self.num_samples, 'sample')} "
                    f"{classes}, {shards}, {_size(self.num_bytes)}); nothing to resume")
        s = (f"packed {_plural(self.num_samples, 'sample')} {classes} "
             f"into {shards} ({self.format}, {_size(self.num_bytes)}) "
             f"at {self.output} in {self.seconds:.2f} s: {self.images_per_s:,.0f} images/s, "
             f"{self.mb_per_s:.1f} MB/s")
        if self.skipped:
            s += f"; {_plural(len(self.skipped), 'file')} skipped (listed in the manifest)"
        if self.ignored:
            s += f"; {_plural(len(self.ignored), 'file')} ignored (hidden, other extensions, outside class folders)"
        if self.shards_resumed:
            spec = describe(self.format)
            done = spec.summary_noun if not spec.sharded else spec.noun(self.shards_resumed)
            s += f"; {done} kept from the interrupted run"
        if self.extra.get("executor", "local") != "local":
            n_nodes = len(self.extra.get("nodes") or [])
            s += (f"; {self.extra['executor']}: {self.extra.get('num_tasks', 0)} tasks on {n_nodes} "
                  f"{'node' if n_nodes == 1 else 'nodes'}")
            if self.extra.get("task_retries"):
                s += f", {self.extra['task_retries']} retried"
        return s


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB" if num_bytes >= 100_000 else f"{num_bytes / 1e3:.1f} KB"


# ---------------------------------------------------------------------------------------------
# planning (PlannedSample, plan_samples, plan_shards: shardfeed.convert.plan)

def _fingerprint(scan: ScanResult, samples: Sequence[PlannedSample], options: PackOptions) -> str:
    """The plan's identity (options, classes, and every sample's key, path, size and mtime).

    Hashed column by column (keys, paths, sizes and mtimes as little-endian int64) rather than
    line by line: the same information, a few milliseconds for 20,000 files instead of ~20.
    """
    h = hashlib.sha256()
    h.update(json.dumps(options.fingerprint_fields(), sort_keys=True).encode())
    h.update(json.dumps(scan.class_to_idx, sort_keys=True).encode())
    if isinstance(samples, SamplePlan):
        files, start, width = samples.files, samples.start, samples.width
        keys = (str(i).zfill(width) for i in range(start, start + len(files)))
    else:
        files = ScannedFiles.from_files(scan.root, [s.file for s in samples])
        keys = (s.key for s in samples)
    # in chunks: a bounded temporary string whatever the number of files
    h.update(b"keys\0")
    for chunk in iter(lambda: list(itertools.islice(keys, 4096)), []):
        h.update("".join([k + "\n" for k in chunk]).encode())
    h.update(b"\0paths\0")
    rels = files.rels
    for a in range(0, len(rels), 4096):
        h.update("".join([r + "\0" for r in rels[a:a + 4096]]).encode("utf-8", "surrogateescape"))
    for column in (files.sizes, files.mtimes_ns):
        col = array("q", column)
        if sys.byteorder != "little":
            col.byteswap()
        h.update(b"\0" + col.tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# output folder

def prepare_output(src: Path, out: Path, *, resume: bool, overwrite: bool, check_only: bool = False,
                   api: bool | None = None) -> str:
    """Check OUT before anything is written, then create it, or clear it for ``overwrite``.

    What is shardfeed's in OUT is what the previous dataset's own records name
    (:mod:`shardfeed.convert.ownership`): ``overwrite`` deletes those only, and refuses, naming
    them, anything else. With ``check_only`` nothing is created or removed (the CLI checks before
    scanning, and then first that no other command holds OUT's lock).

    Args:
        src, out: the source and output folders.
        resume, overwrite: the pack's flags.
        check_only: check only.
        api: messages spell the flags as ``PackOptions`` fields; False: as CLI flags; None: as
            :func:`shardfeed.convert.ownership.cli_flags` says.

    Returns:
        ``"start"``, ``"resume"``, ``"overwrite"`` or ``"finished"`` (``resume`` on a finished
        dataset; :func:`pack` compares it with this run), as
        :func:`shardfeed.convert.ownership.decide`.

    Raises:
        ValueError: OUT equals SRC or lies inside it; OUT is not empty (without ``resume`` or
            ``overwrite``); OUT holds files shardfeed did not write (with ``overwrite``, or
            ``resume`` without a pack to resume).
        NotADirectoryError: OUT is a file.
        shardfeed.convert.outlock.OutputBusyError: (``check_only``) another command is writing OUT.
    """
    src_r, out_r = src.resolve(), out.resolve()
    if out_r == src_r:
        raise ValueError(f"{out}: OUT is the source folder itself; choose another output folder")
    if src_r in out_r.parents:
        raise ValueError(f"{out}: OUT lies inside the source folder {src} (it would be scanned as a class); "
                         "choose an output folder outside it")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is a file; choose a folder for the output")
    if check_only:
        check_not_busy(out)  # a running pack's files are not "an unfinished pack" to the second one
    entries, read = local_entries(out)
    contents = survey(str(out), entries, read)
    action = decide(contents, resume=resume, overwrite=overwrite, api=api)
    if check_only:
        return action
    if action in ("start", "overwrite"):
        _remove_ours(out, contents)
    out.mkdir(parents=True, exist_ok=True)
    return action


def _remove_ours(out: Path, contents) -> None:
    """Delete what the previous dataset's records name: the manifest first (the dataset stops
    being finished before its shards go), the state folder last; links are removed, not followed."""
    order = sorted(contents.ours, key=lambda n: (n != MANIFEST_NAME, n == STATE_DIR, n))
    for name in order:
        p = out / name
        if contents.entries.get(name) == "dir" and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# entry point

def pack(src: str | os.PathLike, out: str | os.PathLike, options: PackOptions | None = None, *,
         progress: Callable[[int, int], None] | None = None,
         output_progress: Callable[[int], None] | None = None,
         scan: ScanResult | None = None) -> PackReport:
    """Pack the image folder ``src`` into ``out`` (WebDataset shards or LMDB) with a manifest.

    Args:
        src: an ImageFolder root (``SRC/CLASS/IMAGE``).
        out: output folder (created; must be empty unless ``resume``/``overwrite``).
        options: :class:`PackOptions`.
        progress: ``callback(num_samples, num_input_bytes)`` called as samples are written.
        output_progress: ``callback(num_output_bytes)`` called with the stored image bytes where
            the packer knows them apart from the input (WebDataset with ``reencode``), each time
            just before the matching ``progress`` call; not called otherwise.
        scan: a scan of ``src`` done already (to avoid scanning twice).

    Returns:
        A :class:`PackReport`.

    Raises:
        FileNotFoundError, NotADirectoryError: SRC missing or a file; OUT a file.
        ValueError: empty SRC, OUT not empty, bad options, a sample larger than ``max_bytes``.
        shardfeed.convert.outlock.OutputBusyError: another command is writing OUT (names it).
        SourceChangedError: a file changed during the pack (``on_error="raise"``).
        shardfeed.readers.errors.CorruptDataError: an image failed ``decode_check``.
        OSError: reading a source or writing OUT failed (disk full: ``ENOSPC``/``EFBIG``); complete
            shards stay and ``resume`` continues.
    """
    options = options or PackOptions()
    src, out = Path(src), Path(out)
    t0 = time.perf_counter()
    if scan is None:
        scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=options.class_to_idx)
    if scan.unpackable and options.on_error != "skip":
        first = scan.unpackable[0]
        more = f" (and {len(scan.unpackable) - 1} more such file(s))" if len(scan.unpackable) > 1 else ""
        raise ValueError(f"{Path(scan.root) / first['path']}: {first['reason']}{more}; or pass --on-error skip to "
                         "pack the rest and list these in the manifest's skipped")
    with output_lock(out, "pack"):  # one writer per OUT: a second pack fails at once, naming this one
        return _pack_locked(src, out, options, scan, progress, output_progress, t0)


def _pack_locked(src: Path, out: Path, options: PackOptions, scan: ScanResult,
                 progress: Callable[[int, int], None] | None, output_progress: Callable[[int], None] | None,
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
    fingerprint = _fingerprint(scan, samples, options)
    state = out / STATE_DIR
    plan_path = state / PLAN_NAME
    if options.resume:
        try:
            old = json.loads(plan_path.read_text())
        except (FileNotFoundError, ValueError):
            old = {}
        if old.get("fingerprint") != fingerprint:
            what = describe_plan_change(state, old, options.fingerprint_fields(), scan.files)
            raise ValueError(f"{out}: the interrupted pack used other options or another version of the source "
                             f"folder ({what}); rerun with the same options and files, or start again with "
                             "--overwrite")
    else:
        with signals_held():  # Ctrl-C or SIGTERM cannot leave a state folder without its plan
            state.mkdir(exist_ok=True)
            write_plan_files(state, scan.files)  # what --resume names when the source changed
            write_bytes_atomic(plan_path, json.dumps({"fingerprint": fingerprint,
                                                      "options": options.fingerprint_fields()}).encode())
    progress = progress or (lambda n, b: None)
    try:
        with use_executor(make_executor(options)) as executor:  # the packers run their tasks on it
            format_pack = format_packer(options.format)
            shards, skipped, resumed, extra = format_pack(scan, samples, out, options, progress, output_progress)
    except BaseException:
        # Ctrl-C, disk full, a bad file: keep complete shards for --resume, drop partial ones
        for tmp in out.glob(f".{options.prefix}-*.tmp"):  # this pack's own temporary shards only
            if tmp.is_file() or tmp.is_symlink():
                tmp.unlink(missing_ok=True)
        raise
    skipped = [{"path": u["path"], "key": None, "reason": u["reason"]} for u in scan.unpackable] + skipped
    num_samples = sum(s.num_samples for s in shards)
    if num_samples == 0:
        raise ValueError(f"{src}: every image was skipped ({len(skipped)}); nothing to pack")
    extensions = merge_extension_counts([s.extensions for s in shards])
    if extensions is None and options.reencode is None:  # LMDB: the plan's (original bytes), less the skipped
        extensions = _plan_extension_counts(scan.files, skipped)
    manifest = Manifest(
        format=options.format, num_samples=num_samples, classes=scan.classes, class_to_idx=scan.class_to_idx,
        shards=shards, skipped=skipped, extensions=extensions,
        options={**options.fingerprint_fields(), "source": scan.root},
        files={"found": scan.num_found, "packed": num_samples, "skipped": len(skipped),
               "ignored": len(scan.ignored)},
    )
    extra.update(executor.describe())  # executor, num_tasks, nodes, task_retries
    finalize = extra.pop("finalize", None)
    if finalize is not None:
        finalize(manifest)  # e.g. LMDB stores its copy of the manifest in its final transaction
    with signals_held():  # a finished manifest means a finished dataset: its consumer files, no pack state
        manifest.write(out)
        write_consumer_files(out, manifest)  # wids' shardindex.json, the Hugging Face dataset card
        shutil.rmtree(state, ignore_errors=True)
    seconds = time.perf_counter() - t0
    return PackReport(
        source=scan.root, output=str(out), format=options.format, num_samples=num_samples,
        num_shards=len(shards), num_bytes=sum(s.num_bytes for s in shards),
        input_bytes=input_bytes(samples), seconds=seconds, workers=options.workers,
        files=manifest.files, skipped=skipped, ignored=scan.ignored, empty_classes=scan.empty_classes,
        num_classes=len(scan.classes), shards_resumed=resumed, extra=extra,
    )


def finished_report(manifest: Manifest, where: str, scan: ScanResult, options: PackOptions,
                    t0: float) -> PackReport:
    """``resume`` on a finished dataset: its report when it is this run's dataset, else the refusal.

    "This run's" means the manifest records the same options (those of
    :meth:`PackOptions.fingerprint_fields`), the same source folder and class map, and as many
    files found as this scan (a script that always passes ``--resume`` reruns a finished pack
    without error; a changed command is told to rebuild with ``overwrite``).

    Raises:
        ValueError: the dataset in ``where`` was packed with other options or from another source.
    """
    expected = json.loads(json.dumps({**options.fingerprint_fields(), "source": scan.root}))
    recorded = json.loads(json.dumps(manifest.options or {}))
    same = (recorded == expected and dict(manifest.class_to_idx) == dict(scan.class_to_idx)
            and (manifest.files or {}).get("found") == scan.num_found)
    if not same:
        from .ownership import flag

        changed = [k for k in sorted(set(recorded) | set(expected)) if recorded.get(k) != expected.get(k)]
        why = (f"options differ: {', '.join(changed)}" if changed else "the class map or the number of files differs")
        raise ValueError(f"{where}: already holds a finished dataset ({MANIFEST_NAME}) packed with other options or "
                         f"from another source ({why}); nothing to resume: rebuild it with {flag('overwrite')}, or "
                         "choose another output location")
    log.info("%s: already holds this finished dataset; nothing to resume", where)
    return PackReport(
        source=scan.root, output=where, format=manifest.format, num_samples=manifest.num_samples,
        num_shards=len(manifest.shards), num_bytes=sum(s.num_bytes for s in manifest.shards), input_bytes=0,
        seconds=time.perf_counter() - t0, workers=options.workers, files=dict(manifest.files or {}),
        skipped=list(manifest.skipped), ignored=scan.ignored, empty_classes=scan.empty_classes,
        num_classes=len(manifest.classes), shards_resumed=len(manifest.shards), extra={"already_complete": True})


def describe_interrupted(out: str | os.PathLike) -> str:
    """What a pack into ``out`` that was stopped (Ctrl-C, SIGTERM, an error) leaves there, and
    what ``--resume`` then does: the clause of the line the CLI prints.

    Counts what is really kept: complete WebDataset shards (their completion records) or the
    samples committed to ``data.mdb``; a finished dataset (its manifest was written before the
    stop) needs nothing.
    """
    out = Path(out)
    if (out / MANIFEST_NAME).is_file():
        return f"{out} holds a finished dataset ({MANIFEST_NAME}); nothing to resume"
    if (out / LMDB_DATA_NAME).is_file():
        from .writers.lmdb import committed_progress

        records, done = committed_progress(out) or (0, 0)
        if done:
            return (f"{_plural(records, 'sample')} committed to {out / LMDB_DATA_NAME} are kept: the same command "
                    "plus --resume continues after them")
        return f"nothing was committed to {out / LMDB_DATA_NAME} yet: the same command plus --resume starts again"
    state = out / STATE_DIR
    shards = samples = 0
    if state.is_dir() and not state.is_symlink():
        for rec in sorted(state.glob("[0-9]*.json")):
            try:
                entry = json.loads(rec.read_text()).get("entry")
            except (OSError, ValueError, AttributeError):
                continue
            shards += 1
            samples += int(entry.get("num_samples", 0)) if isinstance(entry, dict) else 0
    if shards:
        return (f"{_plural(shards, 'complete shard')} ({_plural(samples, 'sample')}) in {out} are kept: the same "
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
