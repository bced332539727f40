"""Appending an image folder to a finished WebDataset dataset (``shardfeed pack SRC OUT --append``).

An append writes SRC's images as new shards after the existing ones and then replaces the
manifest, atomically and last:

* the existing shards, their offset indexes and their class indices stay as they are; class
  folders the dataset lacks get the indices after the existing ones (sorted by name, as
  ImageFolder sorts them); a given class map (``--classes-from``) that disagrees is refused
  before anything is written;
* an image whose path (relative to SRC, as each sample's metadata ``path`` records it) the dataset
  holds already is skipped and counted (``files["duplicates"]`` of the manifest,
  ``extra["duplicates"]`` of the report); the paths are read once from the shards' ``.json``
  members through the offset indexes, and kept as sorted 64-bit hashes with each source file's
  size and modification time (24 bytes a sample, :mod:`shardfeed.convert.write.path_index`);
* a file at a path the dataset holds whose size or modification time differs from the packed
  one is refused, naming it (:class:`ChangedFilesError`): an append never replaces a packed
  image. ``skip_changed`` skips such files too, counted (``extra["changed"]``);
* the new shards continue the numbering (``shard-000012.tar`` after ``shard-000011.tar``) and the
  keys continue the key sequence, with the dataset's key width;
* the shards go through the pack's resume machinery (:mod:`shardfeed.convert.write.pack_state`): an
  append that stops leaves the previous manifest in place, so the dataset stays readable as it
  was, and running the same append again (with or without ``--resume``) keeps the complete new
  shards and writes the rest;
* ``shardindex.json`` and the dataset card are rewritten for the union with the manifest.

A bucket OUT, an LMDB dataset, re-encoding, and datasets with extra fields or without labels
are refused with the alternative.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
from pathlib import Path
from typing import Callable

import numpy as np

from shardfeed.readers.format.manifest import LABELS_CLASS, MANIFEST_NAME, TAR_BLOCK, Manifest, merge_extension_counts
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.format.offset_index import read_index
from shardfeed.readers.file_io import read_small_file

from shardfeed.readers.format.registry import describe

from .consumers import write_consumer_files
from .context import PackContext
from .executors import signals_held
from .outdir import check_out_outside_src
from .outlock import output_lock
from .ownership import local_entries, survey
from .path_index import (UNKNOWN_MTIME, UNKNOWN_SIZE, PathRecords, path_hashes, read_path_index,
                         skipped_keys_end, write_path_index)
from .pack_state import PLAN_NAME, STATE_DIR, remove_state_folder
from .plan import SamplePlan, input_bytes, plan_samples
from .report import PackReport
from .scan import ScannedFiles, ScanResult, scan_image_folder

__all__ = ["DatasetPaths", "ChangedFilesError", "read_dataset_paths", "merge_class_maps", "pack_append",
           "MAX_META_BYTES"]

log = logging.getLogger(__name__)

#: Largest ``.json`` member read for its path (bytes); a larger one is a damaged dataset.
MAX_META_BYTES = 1 << 20
#: Most members of one sample walked to find its ``.json`` (image, label, metadata, fields).
_MAX_MEMBERS = 80
#: Changed files named in a :class:`ChangedFilesError` (the rest are counted).
_MAX_NAMED = 5


@dataclasses.dataclass
class DatasetPaths:
    """What an append needs to know of the samples a dataset holds.

    Attributes:
        records: every sample's metadata ``path`` hash, source size and time (:class:`PathRecords`).
        next_key: the first unused sample index (after every key and every skipped key).
        width: the digits of the dataset's keys.
    """

    records: PathRecords
    next_key: int
    width: int

    def __contains__(self, rel: str) -> bool:
        return rel in self.records


class ChangedFilesError(ValueError):
    """Files of SRC at paths the dataset holds differ from the packed ones (size or modification time).

    Attributes:
        paths: the changed files (full paths).
    """

    def __init__(self, message: str, paths: list[str]):
        super().__init__(message)
        self.paths = paths


def _header(f, offset: int, where: str) -> tuple[str, int]:
    """``(member name, data size)`` of the tar header at ``offset`` of the open file ``f``."""
    f.seek(offset)
    head = f.read(TAR_BLOCK)
    if len(head) != TAR_BLOCK:
        raise ValueError(f"{where}: truncated at byte {offset}; run `shardfeed check` on the dataset")
    name = head[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    prefix = head[345:500].split(b"\0", 1)[0]
    if head[257:262] == b"ustar" and prefix:
        name = prefix.decode("utf-8", "surrogateescape") + "/" + name
    try:
        size = int(head[124:136].strip(b"\0 ") or b"0", 8)
    except ValueError:
        raise ValueError(f"{where}: damaged tar header at byte {offset}; run `shardfeed check` on the "
                         "dataset") from None
    return name, size


def _sample_path(f, offset: int, end: int, where: str) -> tuple[str, str, int]:
    """``(key, metadata path, image size)`` of the sample whose first header is at ``offset``
    (members up to ``end``); the image size is its first member's other than ``.cls`` and
    ``.json`` (:data:`UNKNOWN_SIZE` when it has none)."""
    name, size = _header(f, offset, where)
    key = name.rsplit("/", 1)[-1].split(".", 1)[0]
    image_size = UNKNOWN_SIZE
    for _ in range(_MAX_MEMBERS):
        if image_size == UNKNOWN_SIZE and not name.endswith((".cls", ".json")):
            image_size = size
        if name == key + ".json" or name.endswith("/" + key + ".json"):
            if size > MAX_META_BYTES:
                raise ValueError(f"{where}: sample {key!r} has a {size}-byte metadata member (most "
                                 f"{MAX_META_BYTES}); run `shardfeed check` on the dataset")
            f.seek(offset + TAR_BLOCK)
            try:
                meta = json.loads(f.read(size))
            except (ValueError, RecursionError):
                meta = None
            if not isinstance(meta, dict) or not isinstance(meta.get("path"), str):
                raise ValueError(f"{where}: sample {key!r} has no metadata path; an append cannot tell which "
                                 "images it holds; run `shardfeed check` on the dataset")
            return key, meta["path"], image_size
        offset += TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK
        if offset >= end:
            break
        name, size = _header(f, offset, where)
    raise ValueError(f"{where}: sample {key!r} has no .json member; an append cannot tell which images it holds")


def read_dataset_paths(root: str | Path, manifest: Manifest) -> DatasetPaths:
    """Read every sample's metadata path and key of the local WebDataset dataset at ``root``.

    The dataset's path index (:mod:`shardfeed.convert.write.path_index`) answers when it describes this
    manifest. Otherwise each sample's headers are found through the shard's offset index, so only
    the headers and the ``.json`` members are read (never the images); the records then hold the
    image sizes, and no modification times. Memory: 24 bytes a sample.

    Returns:
        A :class:`DatasetPaths`.

    Raises:
        ValueError: a shard without an offset index, a damaged header or metadata (names the
            shard and the fix).
        shardfeed.readers.errors.CorruptDataError: a damaged offset index.
    """
    root = Path(root)
    cached = read_path_index(root, manifest)
    if cached is not None:
        return DatasetPaths(*cached)
    rels: list[str] = []
    sizes: list[int] = []
    last, width = -1, 0
    for entry in manifest.shards:
        where = str(root / entry.name)
        if not entry.index:
            raise ValueError(f"{where}: has no offset index; rebuild them with `shardfeed index`, then append")
        offsets = read_index(root / entry.index)
        with open(root / entry.name, "rb") as f:
            for i, offset in enumerate(offsets):
                end = offsets[i + 1] if i + 1 < len(offsets) else entry.num_bytes
                key, rel, image_size = _sample_path(f, offset, end, where)
                rels.append(rel)
                sizes.append(image_size)
                width = width or len(key)
                if key.isdigit():
                    last = max(last, int(key))
    return DatasetPaths(PathRecords.build(path_hashes(rels), np.array(sizes, np.uint64)),
                        max(last + 1, skipped_keys_end(manifest)), width or 9)


def merge_class_maps(old: dict[str, int], folder_classes: list[str], given: dict[str, int] | None,
                     where: str) -> dict[str, int]:
    """The class map of the union: the dataset's ``old`` map kept, new class folders after it.

    Args:
        old: the dataset's ``class_to_idx``.
        folder_classes: SRC's class folder names.
        given: a class map asked for (``--classes-from``), or None.
        where: the dataset, for messages.

    Returns:
        ``{name: index}``: ``old``, plus each new name at the given index, else at the next free
        index in sorted name order.

    Raises:
        ValueError: ``given`` maps a class of the dataset to another index, or a new class to an
            index the dataset uses already (nothing is written).
    """
    merged = dict(old)
    used = {i: c for c, i in old.items()}
    for name, idx in sorted((given or {}).items(), key=lambda kv: kv[1]):
        if name in old and old[name] != idx:
            raise ValueError(f"{where}: the given class map puts class {name!r} at index {idx}, but the dataset has "
                             f"it at {old[name]}; an append never changes a class index: drop --classes-from, or "
                             "pass the dataset's own map")
        if name not in old and idx in used:
            raise ValueError(f"{where}: the given class map puts the new class {name!r} at index {idx}, which the "
                             f"dataset's class {used[idx]!r} holds; new classes take indices from {max(used) + 1} on")
        merged[name] = idx
        used[idx] = name
    following = max(merged.values(), default=-1) + 1
    for name in sorted(folder_classes):
        if name not in merged:
            merged[name] = following
            following += 1
    return merged


def _existing_dataset(out: Path) -> tuple[Manifest, dict | None]:
    """The finished dataset in ``out`` an append adds to, and the plan of an unfinished append.

    Raises:
        ValueError: no finished dataset; an unfinished pack that is not an append; a dataset an
            append cannot extend (LMDB, version 1, extra fields, no labels).
    """
    contents = survey(str(out), *local_entries(out))
    if contents.manifest is None:
        raise ValueError(f"{out}: append adds to a finished shardfeed dataset, and {out} holds none (no "
                         f"{MANIFEST_NAME}); pack SRC into it without --append first")
    plan = contents.plan
    if plan is not None and not isinstance(plan.get("append"), dict):
        raise ValueError(f"{out}: holds an unfinished pack ({STATE_DIR}/) that is not an append; finish it with "
                         "--resume first")
    manifest = load_manifest(out)
    if not describe(manifest.format).sharded:
        raise ValueError(f"{out}: an {manifest.format} dataset; append adds WebDataset shards only (an LMDB file is "
                         "not extended in place). Pack SRC into a dataset of its own, or repack the union with "
                         "--overwrite")
    if manifest.version < 2:
        raise ValueError(f"{out}: a version-1 dataset; rewrite its indexes with `shardfeed index`, then append")
    if manifest.labels != LABELS_CLASS or manifest.fields:
        raise ValueError(f"{out}: a dataset with extra fields or without labels; append adds class-folder images "
                         "only: repack the union with --overwrite")
    if (manifest.options or {}).get("reencode") is not None:
        raise ValueError(f"{out}: packed with re-encoding; append stores images as they are: repack the union "
                         "with --overwrite")
    return manifest, plan


def _adopt_dataset_options(options, manifest: Manifest):
    """The append's options: the dataset's shard layout (prefix, limits); the rest as given."""
    recorded = manifest.options or {}
    changes = {name: recorded[name] for name in ("prefix", "max_count", "max_bytes") if name in recorded}
    return dataclasses.replace(options, **changes, append=True, resume=False)


def _next_shard(manifest: Manifest, prefix: str) -> int:
    """The index after the dataset's last shard file."""
    pattern = re.compile(rf"{re.escape(prefix)}-([0-9]{{6,}})\.tar")
    numbers = [int(m.group(1)) for m in (pattern.fullmatch(s.name) for s in manifest.shards) if m]
    return max(numbers, default=len(manifest.shards) - 1) + 1


def _new_files(scan: ScanResult, merged: dict[str, int], existing: DatasetPaths,
               skip_changed: bool) -> tuple[ScannedFiles, int, int]:
    """SRC's files the dataset lacks, labelled by the union's class map; how many it holds already;
    and how many of those differ from the packed ones (skipped only with ``skip_changed``).

    Raises:
        ChangedFilesError: without ``skip_changed``, a file at a packed path whose size or
            modification time differs from the recorded one (nothing is written).
    """
    files = scan.files
    if not isinstance(files, ScannedFiles):
        files = ScannedFiles.from_files(scan.root, files)
    pos = existing.records.positions(path_hashes(files.rels))
    held = np.flatnonzero(pos >= 0)
    changed = held[_differs(existing.records, pos[held], files, held)]
    if len(changed) and not skip_changed:
        raise _changed_error(files, existing.records, pos, changed)
    if len(changed):
        log.warning("%s: %d files at paths the dataset holds changed since they were packed; skipped "
                    "(--skip-changed), the first: %s", scan.root, len(changed), files.path_of(int(changed[0])))
    keep = np.flatnonzero(pos < 0).tolist()
    kept = files.take(keep) if len(keep) != len(files) else files
    labels = tuple(merged[name] for name in kept.class_names)
    kept = ScannedFiles(kept.root, kept.rels, kept.sizes, kept.mtimes_ns, kept.class_codes, kept.class_names,
                        labels, kept.ext_codes, kept.exts)
    return kept, len(held), len(changed)


def _differs(records: PathRecords, at: np.ndarray, files: ScannedFiles, rows: np.ndarray) -> np.ndarray:
    """``bool`` (len(rows),): whether file ``rows[i]`` differs from record ``at[i]`` in size or
    modification time (a value the record does not know is not compared)."""
    size = np.asarray(files.sizes, np.int64)[rows].astype(np.uint64)
    mtime = np.asarray(files.mtimes_ns, np.int64)[rows]
    known_size, known_mtime = records.sizes[at], records.mtimes_ns[at]
    return (((known_size != UNKNOWN_SIZE) & (known_size != size))
            | ((known_mtime != UNKNOWN_MTIME) & (known_mtime != mtime)))


def _changed_error(files: ScannedFiles, records: PathRecords, pos: np.ndarray,
                   changed: np.ndarray) -> ChangedFilesError:
    """The error naming the changed files (the first :data:`_MAX_NAMED`) and the ways on."""
    first = int(changed[0])
    was = int(records.sizes[pos[first]])
    if was != UNKNOWN_SIZE and was != files.sizes[first]:
        how = f"its size is {files.sizes[first]:,} bytes, the packed image's {was:,}"
    else:
        how = ("its modification time differs from the packed file's (the size is the same; if the bytes are "
               "too, as after a copy that did not keep times, --skip-changed loses nothing)")
    named = [files.path_of(int(j)) for j in changed[:_MAX_NAMED]]
    more = (f"; {len(changed) - 1:,} more changed files, among them {', '.join(named[1:])}"
            if len(changed) > 1 else "")
    return ChangedFilesError(
        f"{named[0]}: the dataset holds an image packed from this path, and the file changed since: {how}{more}. "
        "An append never replaces a packed image. Repack the union with --overwrite to take the new bytes, move "
        "the changed files to new paths to add them as new images, or pass --skip-changed to leave them out",
        named)


def _union_files(old: dict, scan: ScanResult, packed: int, skipped: int, duplicates: int) -> dict:
    """The manifest's ``files`` of the union: each count summed (``found`` includes the duplicates)."""
    return _union_counts(old, {"found": scan.num_found, "packed": packed, "skipped": skipped,
                               "ignored": len(scan.ignored), "duplicates": duplicates})


def _union_counts(old: dict, add: dict[str, int]) -> dict:
    """``old`` with each count of ``add`` added (a count ``old`` lacks starts at 0)."""
    return {**old, **{k: int(old.get(k, 0) or 0) + v for k, v in add.items()}}


def _plan_of_append(out: Path, scan: ScanResult, options, manifest: Manifest, existing: DatasetPaths,
                    first: int) -> SamplePlan:
    """The new samples in packing order, their keys after the dataset's; the plan written or checked."""
    from .plan_record import check_or_write_plan, plan_fingerprint

    samples = plan_samples(scan, seed=options.seed, shuffle=options.shuffle)
    samples = samples.rekeyed(existing.next_key, existing.width)
    if len(str(existing.next_key + len(samples) - 1)) > existing.width:
        raise ValueError(f"{out}: {len(samples)} more samples would need keys longer than the dataset's "
                         f"{existing.width} digits (keys must sort in packing order); repack the union with "
                         "--overwrite")
    identity = hashlib.sha256(read_small_file(out / MANIFEST_NAME, what="the manifest")).hexdigest()
    fingerprint = hashlib.sha256(f"{plan_fingerprint(scan, samples, options)}:{first}:{identity}".encode()).hexdigest()
    resume = (out / STATE_DIR / PLAN_NAME).is_file()
    if not resume:
        remove_state_folder(out, warn=False)  # records of a stop before the plan was written
        taken = out / f"{options.prefix}-{first:06d}.tar"
        if taken.exists() or taken.is_symlink():
            raise ValueError(f"{taken}: is in the way of the first new shard, and the manifest does not name it; "
                             "move it away, then append")
    check_or_write_plan(out, dataclasses.replace(options, resume=resume), scan, fingerprint,
                         extra={"append": {"first_shard": first, "manifest_sha256": identity}})
    return samples


def pack_append(src: Path, out: Path, options, context: PackContext, *, scan: ScanResult | None = None,
                scan_progress: Callable[[str, int], None] | None = None,
                start_progress: Callable[[int, int], None] | None = None) -> PackReport:
    """Append the class folders of ``src`` to the finished WebDataset dataset in ``out``.

    Args:
        src: the local image folder (``SRC/CLASS/IMAGE``).
        out: the local folder of a finished WebDataset dataset.
        options: the :class:`~shardfeed.convert.write.pack.PackOptions`; the dataset's ``prefix``,
            ``max_count`` and ``max_bytes`` replace the given ones.
        context: the pack's :class:`~shardfeed.convert.write.context.PackContext`.
        scan, scan_progress, start_progress: as :func:`shardfeed.convert.write.pack.pack`.

    Returns:
        A :class:`~shardfeed.convert.write.report.PackReport` of the samples added (``num_samples``,
        ``num_shards``); ``extra["duplicates"]`` counts SRC's images the dataset held already,
        ``extra["dataset_samples"]`` the union's samples.

    Raises:
        ValueError: no finished dataset in ``out``; one an append cannot extend; a conflicting
            class map; an unfinished append of another source or options (names the fix).
        OSError, SourceChangedError, CorruptDataError: as a pack; the complete new shards stay and
            running the same append again finishes it.
    """
    from shardfeed.readers.format.registry import packer as format_packer

    from .plan_record import drop_partial_shards
    from .samples import refuse_unpackable

    t0 = time.perf_counter()
    check_out_outside_src(src, out)
    if not (out / MANIFEST_NAME).is_file():
        raise ValueError(f"{out}: append adds to a finished shardfeed dataset, and {out} holds none (no "
                         f"{MANIFEST_NAME}); pack SRC into it without --append first")
    if scan is None:
        scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=options.class_to_idx,
                                 progress=scan_progress)
    with output_lock(out, "pack"):
        manifest, plan = _existing_dataset(out)
        options = _adopt_dataset_options(options, manifest)
        merged = merge_class_maps(manifest.class_to_idx, scan.classes, options.class_to_idx, str(out))
        first = _next_shard(manifest, options.prefix)
        if plan is not None and plan["append"].get("first_shard") != first:
            remove_state_folder(out)  # the manifest names that append's shards: it finished before this
        refuse_unpackable(scan.root, scan.unpackable, options.on_error)
        existing = read_dataset_paths(out, manifest)
        files, duplicates, changed = _new_files(scan, merged, existing, options.skip_changed)
        scan = dataclasses.replace(scan, files=files, classes=sorted(merged, key=merged.__getitem__),
                                   class_to_idx=merged)
        if start_progress is not None:
            start_progress(len(files), sum(files.sizes))
        report = dict(source=scan.root, output=str(out), format=manifest.format, workers=options.workers,
                      ignored=scan.ignored, empty_classes=scan.empty_classes)
        counts = {"duplicates": duplicates, "changed": changed, "dataset_classes": len(merged),
                  "new_classes": len(merged) - len(manifest.class_to_idx)}
        if not len(files):
            log.info("%s: every image of %s is in the dataset already; nothing to append", out, src)
            return PackReport(num_samples=0, num_shards=0, num_bytes=0, input_bytes=0, num_classes=0,
                              seconds=time.perf_counter() - t0, files=manifest.files, skipped=[],
                              extra={**counts, "dataset_samples": manifest.num_samples}, **report)
        samples = _plan_of_append(out, scan, options, manifest, existing, first)
        try:
            result = format_packer(manifest.format)(scan, samples, out, dataclasses.replace(options, resume=True),
                                                 context.replace(first_shard=first))
        except BaseException:
            drop_partial_shards(out, options.prefix)  # complete shards stay for the next run
            raise
        skipped = [{"path": u["path"], "key": None, "reason": u["reason"]} for u in scan.unpackable] + result.skipped
        added = sum(s.num_samples for s in result.shards)
        union = dataclasses.replace(
            manifest, num_samples=manifest.num_samples + added, classes=scan.classes, class_to_idx=merged,
            shards=[*manifest.shards, *result.shards], skipped=[*manifest.skipped, *skipped],
            extensions=merge_extension_counts([manifest.extensions, *(s.extensions for s in result.shards)]),
            files=_union_files(manifest.files or {}, scan, added, len(skipped), duplicates))
        with signals_held():  # the new manifest last: until then the previous dataset is the one read
            union.write(out)
            write_consumer_files(out, union)
            gone = {item["path"] for item in result.skipped}
            write_path_index(out, union, existing.records + PathRecords.of_files(files, gone),
                             samples.start + len(samples), samples.width)
            remove_state_folder(out)
    in_classes = len({files.class_codes[j] for j, rel in enumerate(files.rels) if rel not in gone})
    return PackReport(num_samples=added, num_shards=len(result.shards),
                      num_bytes=sum(s.num_bytes for s in result.shards), input_bytes=input_bytes(samples),
                      seconds=time.perf_counter() - t0, files=union.files, skipped=skipped,
                      shards_resumed=result.resumed, num_classes=in_classes,
                      extra={**result.extra, **counts, "dataset_samples": union.num_samples, "first_shard": first},
                      **report)


def _drop_unfinished_write(out: Path, prefix: str, first: int) -> None:
    """Before ``write_dataset(append=True)``: delete the new shards of an earlier one that stopped,
    as its marker (``.shardfeed-pack/write_dataset.json``) names them (from ``first_shard`` on)."""
    from .pack_state import WRITING_NAME

    try:
        marker = json.loads(read_small_file(out / STATE_DIR / WRITING_NAME, what="the write_dataset marker"))
    except (FileNotFoundError, ValueError, RecursionError):
        return
    start = marker.get("append", {}).get("first_shard") if isinstance(marker, dict) else None
    if not isinstance(start, int) or start != first:
        return
    pattern = re.compile(rf"{re.escape(prefix)}-([0-9]{{6,}})\.(tar|sfidx)")
    for p in out.iterdir():
        m = pattern.fullmatch(p.name)
        if m and int(m.group(1)) >= first and p.is_file() and not p.is_symlink():
            p.unlink()


def append_samples(samples, out: Path, *, to_sample: Callable, classes: list[str] | None = None,
                   class_to_idx: dict[str, int] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Manifest:
    """``write_dataset(samples, out, append=True)``: add sample dicts to the finished WebDataset
    dataset in ``out`` as new shards, the manifest replaced last.

    Samples are dicts as :func:`~shardfeed.convert.write.layouts.write_dataset` takes them, with a label
    and without extra fields; their keys continue the dataset's (a ``"key"`` is refused). A sample
    whose ``path`` the dataset holds is skipped and counted (``files["duplicates"]``). A write that
    stops leaves the previous manifest; writing the same samples again replaces its new shards.

    Args:
        samples: the sample dicts, in order.
        to_sample: ``write_dataset``'s reading of one sample dict,
            ``to_sample(item, i, width, labelled, class_to_idx, idx_to_class) -> (Sample, fields)``.
        out: the local folder of a finished WebDataset dataset.
        classes, class_to_idx: the class map: the dataset's classes, new ones after them (None:
            the dataset's own).
        progress: ``callback(num_samples, num_bytes)`` after each sample written.

    Returns:
        The union's :class:`~shardfeed.readers.format.manifest.Manifest`.

    Raises:
        ValueError: no finished dataset in ``out``; one an append cannot extend; a conflicting
            class map; a sample with a ``key``, extra fields, no label or a label outside the map.
    """
    from shardfeed.readers.format.manifest import DEFAULT_PREFIX
    from shardfeed.readers.format.sample_members import class_bytes, meta_bytes
    from shardfeed.readers.file_io import write_bytes_atomic

    from .pack_state import WRITING_NAME
    from ..writers.shard import ShardLimits, ShardWriter

    if class_to_idx is None and classes is not None:
        class_to_idx = {c: i for i, c in enumerate(classes)}
    with output_lock(out, "write_dataset"):
        manifest, plan = _existing_dataset(out)
        if plan is not None:
            raise ValueError(f"{out}: holds an unfinished `pack --append`; finish it first (the same command again)")
        merged = merge_class_maps(manifest.class_to_idx, [], class_to_idx, str(out))
        recorded = manifest.options or {}
        prefix = recorded.get("prefix", DEFAULT_PREFIX)
        first = _next_shard(manifest, prefix)
        _drop_unfinished_write(out, prefix, first)
        existing = read_dataset_paths(out, manifest)
        (out / STATE_DIR).mkdir(exist_ok=True)
        write_bytes_atomic(out / STATE_DIR / WRITING_NAME,
                           json.dumps({"writer": "write_dataset", "append": {"first_shard": first}}).encode())
        idx_to_class = {i: c for c, i in merged.items()}
        limits = ShardLimits(recorded.get("max_count", 10000), recorded.get("max_bytes", 256_000_000))
        writer = ShardWriter(out, prefix=prefix, first_index=first, limits=limits)
        next_key, added, sizes, duplicates = existing.next_key, [], [], 0
        with writer:
            for i, item in enumerate(samples):
                if isinstance(item, dict) and item.get("key") is not None:
                    raise ValueError(f"sample {i}: an append continues the dataset's keys; leave 'key' out")
                sample, extra = to_sample(item, i, existing.width, True, merged, idx_to_class)
                if extra:
                    raise ValueError(f"sample {i}: extra fields ({', '.join(extra)}); the dataset has none")
                path = sample.meta.get("path")
                if isinstance(path, str) and path in existing:
                    duplicates += 1
                    continue
                key = str(next_key).zfill(existing.width)
                writer.add(key, sample.ext, sample.data, class_bytes(sample.label), meta_bytes(sample.meta),
                           describe=f"sample {i} ({path or key})")
                next_key += 1
                added.append(path)
                sizes.append(len(sample.data))
                if progress is not None:
                    progress(1, len(sample.data))
        return _finish_sample_append(out, manifest, writer.shards, merged, (added, sizes), duplicates,
                                     existing.records, next_key, existing.width)


def _finish_sample_append(out: Path, manifest: Manifest, new_shards, merged: dict[str, int],
                          added_sizes: tuple[list, list], duplicates: int, records: PathRecords, next_key: int,
                          width: int) -> Manifest:
    """Write the union's manifest (last-but-one: then its consumer files and path index) and drop
    the ``write_dataset`` marker."""
    from .pack_state import WRITING_NAME
    from .path_index import PATHS_NAME

    added, sizes = added_sizes
    if not added:
        (out / STATE_DIR / WRITING_NAME).unlink(missing_ok=True)
        remove_state_folder(out)
        return manifest
    old_files = manifest.files or {}
    union = dataclasses.replace(
        manifest, num_samples=manifest.num_samples + len(added), classes=sorted(merged, key=merged.__getitem__),
        class_to_idx=merged, shards=[*manifest.shards, *new_shards],
        extensions=merge_extension_counts([manifest.extensions, *(s.extensions for s in new_shards)]),
        files=_union_counts(old_files, {"found": len(added) + duplicates, "packed": len(added),
                                        "duplicates": duplicates}))
    with signals_held():
        union.write(out)
        write_consumer_files(out, union)
        if all(isinstance(p, str) for p in added):
            write_path_index(out, union, records + PathRecords.build(path_hashes(added), np.array(sizes, np.uint64)),
                             next_key, width)
        else:  # a sample without a path: no index (an append reads the shards, and refuses them)
            (out / PATHS_NAME).unlink(missing_ok=True)
        (out / STATE_DIR / WRITING_NAME).unlink(missing_ok=True)
        remove_state_folder(out)
    return union
