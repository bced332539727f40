"""Layouts beyond the class folder: labels files, sidecar files, unlabelled folders.

:func:`pack_layout` packs the folder layouts that are not one folder per class:

* **labels from a file** (``--labels FILE``): a flat (or nested) folder of images plus a CSV/TSV
  (``path,label``, a header optional) or JSON Lines (``{"path": ..., "label": ...}``) file; labels
  are class names or integer class indices, aligned with another split by ``--classes-from``
  (a packed dataset's manifest, or a classes file: one name per line, index = line number);
* **sidecar files** (``--sidecars txt,json,mask.png``): each image's same-stem files
  (``x.jpg`` + ``x.txt``, ``x.json``, ``x.mask.png``, the img2dataset layout) stored as extra
  fields of its sample; an image's sidecar file is never scanned as an image itself, and an
  image is an image whatever its stem (``x.v2.jpg`` beside ``x.jpg``, ``f.0001.png``);
* **no labels** (``--no-labels``, or a folder with no class sub-folders): an unlabelled dataset
  (no ``.cls`` members, ``classes`` empty; readers give label -1).

Rules (binding for these layouts): images and sidecar files are found by
:mod:`shardfeed.convert.write.layout_scan` (the one naming rule: an image is an image whatever its
stem; a sidecar file is an image's stem plus a requested suffix; symbolic links followed inside
SRC and refused out of it, as a class-folder pack does), recursively below SRC, in sorted order;
the packing order is the seeded shuffle of that sorted order and keys are the zero-padded
positions: the plan is a :class:`~shardfeed.convert.write.plan.SamplePlan` over the images' compact
columns (:func:`~shardfeed.convert.write.plan.plan_files`, the rule of ``pack``'s ``plan_samples``).
An image missing from the labels file and a row naming a
missing image are counted and named: an error, or (``on_error="skip"``) listed in the manifest's
``skipped``; never guessed. Sidecar files are stored as they are, once checked to read back (a
``.txt`` is UTF-8, a ``.json`` parses); re-encoding and ``--decode-check`` apply to the image.

Writing: WebDataset shards are planned tasks on the pack's executor
(:mod:`shardfeed.convert.write.layout_shards`: ``--workers``, ``--executor ray``, a bucket OUT; the same
bytes for any executor); re-encoded WebDataset and LMDB stream through the format's writer
(:func:`shardfeed.convert.write.dataset_writer.write_samples`) in this process. An interrupted pack
resumes (``resume=True``, the plan's fingerprint checked): WebDataset keeps each finished shard
(a record per shard in ``OUT/.shardfeed-pack/``), LMDB continues after the writer's last commit.
:func:`write_dataset` (any iterable of sample dicts) lives in
:mod:`shardfeed.convert.write.dataset_writer` and stays importable from here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import unicodedata
from array import array
from pathlib import Path
from typing import Any, Callable, Iterator

from shardfeed.readers.format.manifest import (
    Manifest,
    key_width,
    member_clash,
)
from shardfeed.readers.format.path_column import PathColumn
from shardfeed.readers.format.registry import describe

from shardfeed.readers.file_io import read_small_file, write_bytes_atomic

from .. import writers  # noqa: F401  (registers every format's writer)
from .context import PackContext
from .readahead import read_ahead
from .pack_state import (PLAN_NAME, STATE_DIR, remove_shard_temp_files,
                         remove_state_folder)
from .samples import refuse_unpackable, skip_reason
from .dataset_writer import write_dataset, write_samples
from .label_rules import resolve_labels
from .plan_record import layout_fingerprint
from . import layout_shards
from .layout_shards import uses_tasks, write_layout_shards
from .layout_scan import Found as _Found
from .layout_scan import scan_layout_folder
from .label_files import (MAX_CLASSES, MAX_LABEL_FIELD_CHARS, MAX_LABEL_ROWS, MAX_LABELS_FILE_BYTES,
                          parse_sidecars, read_classes_file, read_label_rows,
                          read_labels_file)
from .plan import SamplePlan, input_bytes, plan_files
from .scan import ScannedFiles, parse_extensions

__all__ = ["write_dataset", "pack_layout", "pack_layout_to_store", "read_labels_file", "read_label_rows",
           "read_classes_file", "LayoutOptions", "MAX_LABELS_FILE_BYTES", "MAX_LABEL_ROWS", "MAX_LABEL_FIELD_CHARS",
           "parse_sidecars"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# scanning a folder of images (+ sidecars)

# the scan: :mod:`shardfeed.convert.write.layout_scan` (called through this name, which tests replace)
_scan_images = scan_layout_folder


# ---------------------------------------------------------------------------------------------
# pack_layout

@dataclasses.dataclass
class LayoutOptions:
    """What :func:`pack_layout` packs beside the images (the CLI's ``--labels``, ``--sidecars``,
    ``--require-sidecars``, ``--no-labels``).

    Attributes:
        labels_file: a labels file (:func:`read_labels_file`); None: class folders, or no labels.
        no_labels: pack unlabelled (no ``.cls``; readers give -1).
        sidecars: the sidecar suffixes to store (:func:`parse_sidecars`).
        require_sidecars: a missing sidecar is an error naming the image (``on_error="skip"``:
            the image is skipped and listed) instead of a count in the manifest.
        max_files: most entries scanned below SRC.
        num_classes: with ``labels_file``, the number of classes integer labels index (classes
            ``"0" .. "K-1"``; ``--num-classes``); None: from ``--classes-from`` or the labels.
        label_kind: with ``labels_file``, what a label written as digits is: ``"name"``,
            ``"index"``, or None (a label that could be both is refused;
            :mod:`shardfeed.convert.write.label_rules`).
    """

    labels_file: str | os.PathLike | None = None
    no_labels: bool = False
    sidecars: tuple[str, ...] = ()
    require_sidecars: bool = False
    max_files: int = 100_000_000
    num_classes: int | None = None
    label_kind: str | None = None


def pack_layout(src: str | os.PathLike, out: str | os.PathLike, options, layout: LayoutOptions, *,
                progress: Callable[[int, int], None] | None = None, context: PackContext | None = None,
                source: str | None = None):
    """Pack SRC in a layout other than plain class folders (see the module docstring).

    Labels come from ``layout.labels_file``, else from class folders (``SRC/CLASS/...``, sorted as
    torchvision's ImageFolder, or ``options.class_to_idx``), else none (``no_labels``, or a SRC
    without sub-folders). Packing order, keys, formats and limits are ``pack``'s
    (``options``: :class:`~shardfeed.convert.write.pack.PackOptions`).

    Args:
        progress: ``callback(num_samples, num_input_bytes)`` as samples are written (without a
            ``context``).
        context: the pack's :class:`~shardfeed.convert.write.context.PackContext` (:func:`pack` passes
            its own; its ``progress`` is called); None: one made for ``options`` with
            ``progress``.
        source: what the manifest records as ``options.source`` and messages name: the bucket
            URL when ``src`` is its local mirror (:func:`~shardfeed.convert.write.pack.pack`); None:
            ``src``'s absolute path.

    Returns:
        A :class:`~shardfeed.convert.write.pack.PackReport`.

    Raises:
        FileNotFoundError, NotADirectoryError: SRC missing or a file.
        TypeError: both ``context`` and ``progress``.
        ValueError: no images; an image without a label row or a row without an image
            (``on_error="raise"``; names them and how many); a label not in ``--classes-from``;
            a missing sidecar with ``require_sidecars``; OUT not empty; ``resume`` of another plan
            (options, labels or files changed) or of an LMDB pack.
    """
    if context is None:
        with PackContext.for_options(options, progress=progress) as context:
            return pack_layout(src, out, options, layout, context=context, source=source)
    if progress is not None:
        raise TypeError("pack_layout(context=...): pass progress in the context")
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    plan = _checked_plan(src, options, layout, source)
    return _pack_planned(src, out, options, layout, plan, context, t0)


def pack_layout_to_store(src: str | os.PathLike, out_url: str, options, layout: LayoutOptions, *,
                         context: PackContext, source: str | None = None):
    """:func:`pack_layout` into an object-store prefix (``s3://bucket/prefix/``): built in a local
    staging folder and uploaded shard by shard, the manifest last
    (:func:`~shardfeed.convert.write.store_pack.pack_to_store`); the same objects as the local pack's files.

    Returns:
        A :class:`~shardfeed.convert.write.pack.PackReport` (``output`` is ``out_url``).

    Raises:
        As :func:`pack_layout` and :func:`~shardfeed.convert.write.store_pack.pack_to_store`.
    """
    from .store_pack import pack_to_store

    src = Path(src)
    plan = _checked_plan(src, options, layout, source)

    def build(src, stage, local_options, *, scan, context):
        return _pack_planned(Path(src), Path(stage), local_options, layout, plan, context, time.perf_counter())

    def finished(manifest: Manifest, where: str, t0: float):
        return _finished_layout_report(manifest, where, plan, t0)

    return pack_to_store(src, out_url, options, build, context=context, finished=finished)


def _checked_plan(src: Path, options, layout: LayoutOptions, source: str | None) -> "_LayoutPlan":
    """The options checked, then SRC scanned and planned (:func:`_plan_layout`); OUT untouched.

    Raises:
        FileNotFoundError, NotADirectoryError: SRC missing or a file.
        ValueError: an extension that is a
            sidecar suffix; label options without a labels file; ``require_sidecars`` without
            sidecars; what :func:`_plan_layout` raises.
    """
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such directory")
    if not src.is_dir():
        raise NotADirectoryError(f"{src}: is a file, not an image folder")
    problem = member_clash(parse_extensions(options.extensions), layout.sidecars)
    if problem is not None:  # before the scan, before OUT is touched
        raise ValueError(f"--extensions/--sidecars: {problem}")
    if (layout.num_classes is not None or layout.label_kind is not None) and layout.labels_file is None:
        raise ValueError("--num-classes and --label-kind say what the labels of a labels file mean; pass --labels FILE")
    if layout.require_sidecars and not layout.sidecars:
        raise ValueError("--require-sidecars needs --sidecars naming the sidecar files to require (e.g. "
                         "--sidecars txt,json)")
    return _plan_layout(src, options, layout, source or str(src.absolute()))


def _pack_planned(src: Path, out: Path, options, layout: LayoutOptions, plan: "_LayoutPlan", context: PackContext,
                  t0: float):
    """:func:`pack_layout` once planned: OUT locked and prepared, the plan written or checked, the
    samples written (planned shard tasks, or the format's streaming writer), the report."""
    from shardfeed.readers.storage.local_manifest import load_manifest

    from .outdir import prepare_output
    from .outlock import output_lock

    with output_lock(out, "pack"):
        action = prepare_output(src, out, resume=options.resume, overwrite=options.overwrite)
        if action == "finished":  # --resume on a finished dataset: done when it is this command's
            return _finished_layout_report(load_manifest(out, check_files=False), str(out), plan, t0)
        resume = action == "resume"
        done = _layout_resume_records(out, options, plan, resume=resume)
        if uses_tasks(options):
            manifest = _write_layout_tasks(out, options, layout, plan, context, resume=resume)
        else:
            manifest = _write_layout(out, options, layout, plan, done, context)
    report = _layout_report(out, options, plan, manifest, time.perf_counter() - t0)
    report.extra.update(context.executor.describe())  # executor, num_tasks, nodes, task_retries
    return report


def _write_layout_tasks(out: Path, options, layout: LayoutOptions, plan: _LayoutPlan, context: PackContext, *,
                        resume: bool) -> Manifest:
    """:func:`~shardfeed.convert.write.layout_shards.write_layout_shards`; the state folder goes once the
    manifest is written, a partial shard when the write stops."""
    try:
        manifest = write_layout_shards(out, options, layout, plan, context, resume=resume)
    except BaseException:
        remove_shard_temp_files(out, options.prefix)  # a partial shard; complete ones stay for --resume
        raise
    remove_state_folder(out)
    return manifest


@dataclasses.dataclass
class _Labels:
    """The labels of a layout pack: the images left to pack and each one's class index (both
    emptied once planned: the plan's columns hold them)."""

    images: list
    class_to_idx: dict[str, int]
    labels_of: dict[str, int]
    labelled: bool
    kind: str


@dataclasses.dataclass
class _LayoutPlan:
    """A layout pack's plan: what :func:`pack_layout` writes, in which order, and its identity."""

    src: Path
    found: _Found
    n_found: int
    labels: _Labels
    skipped: list[dict]
    #: the packing order and keys: the images as rows of compact columns, class code = label
    planned: SamplePlan
    width: int
    classes: list[str]
    fp: dict
    recorded: dict
    files: dict
    fingerprint: str


def _plan_layout(src: Path, options, layout: LayoutOptions, source: str) -> _LayoutPlan:
    """Scan SRC, label its images, drop those without their required sidecars and fix the
    packing order (:func:`pack_layout` before OUT is touched); ``source``: SRC as recorded and named."""
    exts = parse_extensions(options.extensions)
    found = _scan_images(src.absolute(), exts, tuple(layout.sidecars), layout.max_files,
                         follow_external_links=options.follow_external_links)
    refuse_unpackable(src, found.unpackable, options.on_error)
    # every file seen: images, their sidecar files, the ignored and the unpackable ones (the labels file's rows
    # that name no image are skipped entries too, but not files found)
    n_found = (len(found.images) + sum(len(v) for v in found.sidecars.values()) + len(found.ignored)
               + len(found.unpackable))
    skipped: list[dict] = [{"path": u["path"], "key": None, "reason": u["reason"]} for u in found.unpackable]
    labels = _resolve_labels(src, options, layout, found, skipped, source)
    if not labels.images:
        raise ValueError(f"{source}: no images with extensions {','.join(exts)} to pack")
    labels.images = _drop_missing_sidecars(src, options, layout, found, labels.images, skipped)
    images = labels.images
    classes = [c for c, _ in sorted(labels.class_to_idx.items(), key=lambda kv: kv[1])]
    fp = options.fingerprint_fields()
    recorded = {**fp, "source": source, "layout": labels.kind}
    if layout.labels_file is not None:
        recorded["labels_file"] = str(layout.labels_file)
        for name in ("num_classes", "label_kind"):
            if getattr(layout, name) is not None:
                recorded[name] = getattr(layout, name)
    if layout.sidecars:
        recorded["sidecars"] = list(layout.sidecars)
        recorded["require_sidecars"] = layout.require_sidecars
    files = {"found": n_found, "packed": 0, "skipped": 0, "ignored": len(found.ignored)}
    if layout.sidecars:
        files["sidecars"] = sum(len(v) for v in found.sidecars.values())
    # the one order and key rule (plan_files), on the images' compact columns
    planned = plan_files(_image_columns(src, images, labels, classes), seed=options.seed, shuffle=options.shuffle)
    found.images, labels.images, labels.labels_of = [], [], {}  # the columns hold them now (memory)
    plan = _LayoutPlan(src=src, found=found, n_found=n_found, labels=labels, skipped=skipped, planned=planned,
                       width=key_width(len(images)), classes=classes, fp=fp, recorded=recorded, files=files,
                       fingerprint="")
    plan.fingerprint = layout_fingerprint(recorded, labels.class_to_idx, layout_shards.layout_rows(plan, layout))
    return plan


def _image_columns(src: Path, images: list, labels: _Labels, classes: list[str]) -> ScannedFiles:
    """The images to pack (``(rel, ext, size, mtime)``, sorted) as compact columns; each image's
    class code names its label (``classes[code]``, index ``class_labels[code]``), or the one code
    of label -1 when unlabelled."""
    rels = PathColumn.from_paths(rel for rel, *_ in images)
    exts = sorted({t[1] for t in images})
    ext_code = {e: i for i, e in enumerate(exts)}
    if labels.labelled:
        names, indices = classes, [labels.class_to_idx[c] for c in classes]
        code_of = {index: code for code, index in enumerate(indices)}
        codes = array("i", (code_of[labels.labels_of[rel]] for rel, *_ in images))
    else:
        names, indices, codes = [""], [-1], array("i", bytes(4 * len(images)))
    return ScannedFiles(str(src.absolute()), rels, array("q", (t[2] for t in images)),
                        array("q", (t[3] for t in images)), codes, names, indices,
                        array("H", (ext_code[t[1]] for t in images)), exts)


def _resolve_labels(src: Path, options, layout: LayoutOptions, found: _Found, skipped: list[dict],
                    source: str) -> _Labels:
    """The labels from the labels file, else none (``no_labels``, or no class folders), else the
    class folders; the images without a label are added to ``skipped`` (or raise)."""
    if layout.labels_file is not None:
        return _labels_from_file(src, options, layout, found, skipped, source)
    if layout.no_labels or not any("/" in rel for rel, *_ in found.images):
        if options.class_to_idx is not None:  # a class map asks for labels: never dropped silently
            why = "--no-labels" if layout.no_labels else f"{source} has no class folders"
            raise ValueError(f"--classes-from gives classes, but this pack is unlabelled ({why}); pass --labels FILE "
                             "to label the images, or drop --classes-from")
        return _Labels(found.images, {}, {}, False, "unlabelled")
    from shardfeed.readers.format.imagefolder import resolve_class_map

    from .scan import find_classes

    folders = find_classes(src)
    _, class_to_idx = resolve_class_map(folders, options.class_to_idx, src)
    loose = [rel for rel, *_ in found.images if "/" not in rel]
    found.ignored += [{"path": rel, "reason": "image not in a class folder"} for rel in loose]
    images = [t for t in found.images if "/" in t[0]]
    labels_of = {rel: class_to_idx[rel.split("/", 1)[0]] for rel, *_ in images}
    return _Labels(images, class_to_idx, labels_of, True, "class-folders")


def _labels_from_file(src: Path, options, layout: LayoutOptions, found: _Found, skipped: list[dict],
                      source: str) -> _Labels:
    """The labels of ``layout.labels_file``: images without a row and rows without an image are
    an error (``on_error="raise"``) or skipped; the class map is ``options.class_to_idx``, else
    ``"0" .. "K-1"`` for integer labels, else the sorted label names."""
    images = found.images
    rows_read = _match_unicode_spelling(read_label_rows(layout.labels_file), [rel for rel, *_ in images])
    rows = {rel: v[0] for rel, v in rows_read.items()}
    on_disk = {rel for rel, *_ in images}
    unlisted = [rel for rel, *_ in images if rel not in rows]
    absent = [rel for rel in rows if rel not in on_disk]
    if (unlisted or absent) and options.on_error != "skip":
        parts = []
        if unlisted:
            parts.append(f"{len(unlisted)} image(s) under {source} have no row in {layout.labels_file} "
                         f"(e.g. {', '.join(unlisted[:3])})")
        if absent:
            parts.append(f"{len(absent)} row(s) of {layout.labels_file} name no image under {source} "
                         f"(e.g. {', '.join(_why_not_an_image(src, rel, found) for rel in absent[:3])})")
        raise ValueError("; ".join(parts) + "; fix the labels file, or pass --on-error skip to pack the "
                         "images that have a label (the others are listed in the manifest's skipped)")
    skipped += [{"path": rel, "key": None, "reason": "no row in the labels file"} for rel in unlisted]
    skipped += [{"path": rel, "key": None, "reason": "listed in the labels file, no such image"}
                for rel in absent]
    images = [t for t in images if t[0] in rows]
    class_to_idx, labels_of = resolve_labels(layout.labels_file, {rel: rows_read[rel] for rel, *_ in images},
                                             options.class_to_idx, num_classes=layout.num_classes,
                                             label_kind=layout.label_kind, max_classes=MAX_CLASSES)
    return _Labels(images, class_to_idx, labels_of, True, "labels-file")


def _drop_missing_sidecars(src: Path, options, layout: LayoutOptions, found: _Found, images: list,
                           skipped: list[dict]) -> list:
    """``images`` less those that lack a sidecar ``--require-sidecars`` asks for (skipped, or an
    error naming the first with ``on_error="raise"``); all of them without ``require_sidecars``."""
    if not (layout.sidecars and layout.require_sidecars):
        return images
    missing_side = []
    for rel, *_ in images:
        have = found.sidecars.get(rel, {})
        lack = [f for f in layout.sidecars if f not in have]
        if lack:
            missing_side.append((rel, lack))
    if missing_side and options.on_error != "skip":
        rel, lack = missing_side[0]
        raise ValueError(f"{src / rel}: no sidecar file {', '.join(rel.rsplit('.', 1)[0] + '.' + f for f in lack)}"
                         f" (--require-sidecars; {len(missing_side)} image(s) lack one); add them, drop "
                         "--require-sidecars to count them instead, or pass --on-error skip")
    drop = {rel for rel, _ in missing_side}
    skipped += [{"path": rel, "key": None, "reason": f"no sidecar {', '.join(lack)} (--require-sidecars)"}
                for rel, lack in missing_side]
    return [t for t in images if t[0] not in drop]


def _finished_layout_report(manifest: Manifest, where: str, plan: _LayoutPlan, t0: float):
    """The report of ``--resume`` on OUT's finished dataset, when it is this very pack's.

    Raises:
        ValueError: the finished dataset was packed with other options, labels or files.
    """
    from .ownership import flag
    from .report import finished_manifest_report

    if (json.loads(json.dumps(manifest.options)) != json.loads(json.dumps(plan.recorded))
            or (manifest.files or {}).get("found") != plan.n_found):
        raise ValueError(f"{where}: already holds a finished dataset packed with other options, labels or "
                         f"files; nothing to resume: rebuild it with {flag('overwrite')}, or choose another "
                         "output folder")
    return finished_manifest_report(manifest, source=plan.recorded["source"], output=where, t0=t0, workers=1,
                                    ignored=plan.found.ignored, empty_classes=[],
                                    extra={"layout": plan.labels.kind, "fields": manifest.fields})


def _layout_resume_records(out: Path, options, plan: _LayoutPlan, *, resume: bool) -> list[dict]:
    """A new pack: none, once the plan is written to OUT's state folder; a resumed pack (after
    checking OUT's plan is this one): none for WebDataset (each shard's record is read by
    :mod:`shardfeed.convert.write.layout_shards`).

    An LMDB pack's one record is ``{"end": samples done, "skipped": [...], "lmdb": True}``, from the
    state its writer committed last.

    Raises:
        ValueError: ``resume`` of a pack with other options, labels or files, or of an LMDB
            database whose state is not a layout pack's.
    """
    state = out / STATE_DIR
    if not resume:  # "start": missing, empty, or stopped before its plan
        state.mkdir(exist_ok=True)
        # the options name the shards this pack writes (what --overwrite may delete)
        write_bytes_atomic(state / PLAN_NAME, json.dumps({"fingerprint": plan.fingerprint,
                                                          "options": plan.fp}).encode())
        return []
    try:
        old = json.loads(read_small_file(state / PLAN_NAME, what="the pack plan"))
    except (OSError, ValueError, RecursionError):
        old = {}
    if not isinstance(old, dict) or old.get("fingerprint") != plan.fingerprint:
        raise ValueError(f"{out}: the interrupted pack used other options, labels or files; rerun with the "
                         "same ones, or start again with --overwrite")
    if not describe(options.format).sharded:
        return [_lmdb_resume_record(out, len(plan.planned))]
    return []  # WebDataset: layout_shards reads each shard's record


def _lmdb_resume_record(out: Path, num_samples: int) -> dict:
    """Where an interrupted LMDB layout pack stopped (its writer's last committed state; checked)."""
    from ..writers.lmdb import committed_state

    state = committed_state(out) or {"next_index": 0, "skipped": []}
    end, skipped = state.get("next_index"), state.get("skipped")
    flat = (str, int, float, type(None))
    if (type(end) is not int or not 0 <= end <= num_samples or not isinstance(skipped, list)
            or not all(isinstance(s, dict) and all(isinstance(v, flat) for v in s.values()) for s in skipped)):
        raise ValueError(f"{out}: the interrupted LMDB pack's state is not a layout pack's; start again with "
                         "--overwrite")
    return {"end": end, "skipped": skipped, "lmdb": True}


class _Cursor:
    """Where a streamed LMDB layout pack is: the plan position of the sample being written, and
    the files skipped so far with theirs (restored ones: -1)."""

    def __init__(self, at: int, restored: list[dict]):
        self.at = at
        self.skips: list[tuple[int, dict]] = [(-1, item) for item in restored]

    def state(self) -> dict:
        """The writer's state at a commit: the position after the last sample written, the skips before it."""
        return {"next_index": self.at + 1, "skipped": [item for j, item in self.skips if j <= self.at]}


def _write_layout(out: Path, options, layout: LayoutOptions, plan: _LayoutPlan, done: list[dict],
                  context: PackContext) -> Manifest:
    """Stream the planned samples into the format's (LMDB's) writer after ``done`` (an interrupted
    pack's last commit, :func:`_lmdb_resume_record`); each commit stores where the pack is, so
    ``--resume`` continues after the last one. The state folder goes once the manifest is written."""
    start = done[-1]["end"] if done else 0
    cursor = _Cursor(start, done[-1]["skipped"] if done else [])
    plan.skipped += [item for _, item in cursor.skips]
    samples = _layout_samples(options, layout, plan, start, cursor, context)
    labelled = plan.labels.labelled
    manifest = write_samples(
        samples, out, format=options.format, max_count=options.max_count, max_bytes=options.max_bytes,
        prefix=options.prefix, classes=plan.classes if labelled else None,
        class_to_idx=plan.labels.class_to_idx if labelled else None, labels=labelled,
        fields=tuple(layout.sidecars), options=plan.recorded, skipped=plan.skipped, files=plan.files,
        map_size=options.map_size, progress=context.progress, resuming=bool(done),
        writer_extra={"state": cursor.state, "resume": bool(done)})
    remove_state_folder(out)
    return manifest


def _layout_samples(options, layout: LayoutOptions, plan: _LayoutPlan, start: int, cursor: _Cursor,
                    context: PackContext) -> Iterator[dict]:
    """The sample dicts of the planned images from ``start`` on, in plan order, loaded by
    :func:`~shardfeed.convert.write.layout_shards.load_row`: by tasks on the executor
    (:func:`~shardfeed.convert.write.layout_shards.loaded_rows`), or in this process with reads ahead
    (``--read-ahead``; adaptive) for one local worker; the same bytes either way.
    ``cursor.at`` follows the plan position; a file that fails with ``on_error="skip"`` goes to
    ``plan.skipped`` and ``cursor.skips``."""
    src, rows = plan.src.absolute(), layout_shards.layout_rows(plan, layout)
    loaded = (_read_here(src, rows, start, options) if options.executor == "local" and options.workers == 1
              else layout_shards.loaded_rows(src, rows, start, options, context))
    for j, payload, skip in loaded:
        cursor.at = j
        if payload is None:
            plan.skipped.append(skip)
            cursor.skips.append((j, skip))
            continue
        data, ext, meta, extra = payload
        key, rel, label = rows[j][0], rows[j][1], rows[j][5]
        sample = {"image": data, "ext": ext, "path": rel, "key": key, **dict(extra)}
        if meta:
            sample["meta"] = meta  # orig_* of a re-encoded image
        if label is not None:
            sample["label"] = label
        yield sample
    cursor.at = len(rows)


def _read_here(src: Path, rows: layout_shards.LayoutRows, start: int, options) -> Iterator[tuple]:
    """:func:`~shardfeed.convert.write.layout_shards.loaded_rows` in this process, reads ahead in threads."""
    for r in read_ahead(range(start, len(rows)), lambda j: layout_shards.read_row(src, rows[j]),
                        max_in_flight=options.read_ahead, size_of=rows.size, adaptive=True):
        j = r.item
        try:
            if r.error is not None:
                raise r.error
            yield j, layout_shards.load_row(src, rows[j], options, r.value), None
        except (OSError, ValueError) as exc:
            if options.on_error != "skip":
                raise
            yield j, None, {"path": rows[j][1], "key": rows[j][0], "reason": skip_reason(exc)}


def _layout_report(out: Path, options, plan: _LayoutPlan, manifest: Manifest, seconds: float):
    """The :class:`~shardfeed.convert.write.report.PackReport` of a finished layout pack."""
    from .report import manifest_report

    return manifest_report(manifest, source=plan.recorded["source"], output=str(out),
                           input_bytes=input_bytes(plan.planned), seconds=seconds, workers=options.workers,
                           ignored=plan.found.ignored, empty_classes=[],
                           extra={"layout": plan.labels.kind, "fields": manifest.fields})


def _why_not_an_image(src: Path, rel: str, found: "_Found") -> str:
    """``rel`` of a labels-file row that names no image, with what it names instead (a folder, a
    sidecar file, an ignored file and why), for the error message."""
    reason = next((d["reason"] for d in found.ignored if d["path"] == rel), None)
    if reason is None and any(rel in v.values() for v in found.sidecars.values()):
        reason = "a sidecar file"
    if reason is None and (src / rel).is_dir() and not (src / rel).is_symlink():
        reason = "a folder"
    return f"{rel} ({reason})" if reason else rel


def _match_unicode_spelling(rows: dict[str, Any], on_disk: list[str]) -> dict[str, Any]:
    """``rows`` keyed by the names on disk: a row whose path names an image only in another Unicode
    normalisation (a labels file in NFC, the file written NFD by macOS, or the reverse) is that
    image's row, when exactly one image has that spelling and no row of its own; other rows are
    kept as they are (and reported as naming no image)."""
    exact = set(on_disk)
    if all(rel in exact for rel in rows):
        return rows
    by_nfc: dict[str, list[str]] = {}
    for rel in on_disk:
        by_nfc.setdefault(unicodedata.normalize("NFC", rel), []).append(rel)
    out: dict[str, Any] = {}
    for rel, label in rows.items():
        if rel not in exact:
            found = by_nfc.get(unicodedata.normalize("NFC", rel), [])
            if len(found) == 1 and found[0] not in rows and found[0] not in out:
                rel = found[0]
        out[rel] = label
    return out
