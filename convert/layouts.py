"""Layouts beyond the class folder, and the writer API for any iterable of samples.

:func:`write_dataset` writes any iterable of sample dicts (image bytes and extension, an optional
label, optional extra fields) through the format's streaming writer (the registry's, the same
as ``shardfeed convert``): the same shards, rollover rule, ``.sfidx`` indexes, manifest, wids
index and Hugging Face card as ``pack``.

:func:`pack_layout` packs the folder layouts that are not one folder per class, with that writer:

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
:mod:`shardfeed.convert.layout_scan` (the one naming rule: an image is an image whatever its
stem; a sidecar file is an image's stem plus a requested suffix; symbolic links followed inside
SRC and refused out of it, as a class-folder pack does), recursively below SRC, in sorted order; the packing
order is the seeded shuffle of that sorted order (as ``pack``'s ``plan_samples``), keys are the
zero-padded positions. An image missing from the labels file and a row naming a missing image
are counted and named: an error, or (``on_error="skip"``) listed in the manifest's ``skipped``;
never guessed. These layouts pack in one process (re-encoding and ``--decode-check`` apply to
the image; sidecar files are stored as they are, once checked to read back: a ``.txt`` is UTF-8,
a ``.json`` parses); an interrupted WebDataset
pack resumes (``resume=True``: a record per finished shard in ``OUT/.shardfeed-pack/``, the plan's
fingerprint checked) to the same bytes as an uninterrupted one; an LMDB one is rerun with
``--overwrite``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import numbers
import os
import random
import stat
import time
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from shardfeed.readers.format import (
    DEFAULT_PREFIX,
    IMAGE_EXTENSIONS,
    LABELS_CLASS,
    LABELS_NONE,
    MAX_FIELDS,
    SIDE_EXTENSIONS,
    Manifest,
    Sample,
    field_name_problem,
    key_width,
    member_clash,
    normalize_ext,
    stored_path_problem,
)
from shardfeed.readers.sample_members import decode_field, encode_field
from shardfeed.readers.registry import canonical_format, describe, writer_class

from shardfeed.readers.file_io import read_small_file, write_bytes_atomic

from . import writers  # noqa: F401  (registers every format's writer)
from .context import PackContext
from .readahead import read_ahead
from .pack_state import (PLAN_NAME, STATE_DIR, WRITING_NAME, finished_shard_record, remove_shard_temp_files,
                         remove_state_folder, write_shard_record)
from .recorded import check_meta_class, check_recorded, check_skipped
from .reencode import reencode_payload
from .samples import refuse_unpackable, skip_reason
from .label_rules import resolve_labels
from .layout_scan import Found as _Found
from .layout_scan import scan_layout_folder
from .label_files import (MAX_CLASSES, MAX_LABEL_FIELD_CHARS, MAX_LABEL_ROWS, MAX_LABELS_FILE_BYTES,
                          MEMBER_EXT_RE, checked_class_map, parse_sidecars, read_classes_file, read_label_rows,
                          read_labels_file)
from .scan import parse_extensions

__all__ = ["write_dataset", "pack_layout", "read_labels_file", "read_label_rows", "read_classes_file", "LayoutOptions",
           "MAX_LABELS_FILE_BYTES", "MAX_LABEL_ROWS", "MAX_LABEL_FIELD_CHARS", "parse_sidecars"]

log = logging.getLogger(__name__)

#: Largest sidecar file stored, bytes.
MAX_SIDECAR_BYTES = 1 << 30
#: Sample dict keys that are not extra fields.
_SAMPLE_KEYS = frozenset({"image", "ext", "label", "key", "meta", "path", "class"})


# ---------------------------------------------------------------------------------------------
# write_dataset: any iterable of samples

def write_dataset(samples: Iterable[Mapping[str, Any]], out: str | os.PathLike, *, format: str = "webdataset",
                  max_count: int = 10000, max_bytes: int = 256_000_000, prefix: str = DEFAULT_PREFIX,
                  classes: list[str] | None = None, class_to_idx: dict[str, int] | None = None,
                  labels: bool | None = None, fields: Iterable[str] = (), options: dict | None = None,
                  skipped: list[dict] | None = None, files: dict | None = None, map_size: int | None = None,
                  progress: Callable[[int, int], None] | None = None, num_classes: int | None = None,
                  append: bool = False) -> Manifest:
    """Write an iterable of sample dicts as a shardfeed dataset (WebDataset shards or LMDB).

    Each sample is a dict:

    * ``"image"``: the encoded image bytes (stored unchanged), and ``"ext"``: its extension
      (``"jpg"``, ``".PNG"``; normalised as :func:`~shardfeed.readers.format.normalize_ext`);
    * ``"label"`` (optional): a class index (``int``) or a class name (``str``, looked up in
      ``classes``/``class_to_idx``); leave it out (or None) in every sample for an unlabelled
      dataset (``labels: "none"``, readers give -1);
    * ``"path"`` (optional): the original path, stored as ``meta["path"]`` (``unpack`` writes the
      image back there); ``"meta"`` (optional): more JSON metadata; ``"key"`` (optional): the sample
      key (default: the zero-padded position, 9 digits at least);
    * any other key is an **extra field** (``"txt"``, ``"json"``, ``"mask.png"``; names as
      :func:`~shardfeed.readers.format.field_name_problem`): ``bytes`` stored as they are, ``str``
      as UTF-8, anything else as JSON. It becomes the member ``{key}.{name}`` (``{key}.sidecar.json``
      for ``json``) or a field of the LMDB record; the manifest lists each field and how many
      samples lack it.

    Shards close before they would hold more than ``max_count`` samples or pass ``max_bytes``
    (:class:`~shardfeed.convert.writers.shard.ShardLimits`).

    Example (a CSV of image paths and captions)::

        import csv, pathlib
        from shardfeed.convert import write_dataset

        def samples(csv_path):
            with open(csv_path, newline="") as f:
                for row in csv.DictReader(f):  # columns: path,caption
                    p = pathlib.Path(row["path"])
                    yield {"image": p.read_bytes(), "ext": p.suffix,
                           "path": p.name, "txt": row["caption"]}

        manifest = write_dataset(samples("captions.csv"), "out/captions",
                                 max_count=1000)
        # open_dataset("out/captions", fields=("txt",)) yields (image, -1, caption)

    Args:
        samples: the samples, in packing order.
        out: the output folder, local (a path or ``file://`` URL; created; must not hold a
            dataset). For a bucket, write it locally, then ``shardfeed convert OUT
            s3://BUCKET/PREFIX --format wds`` (or :func:`~shardfeed.convert.convert_dataset`).
        format: ``"webdataset"`` (``"wds"``) or ``"lmdb"``.
        max_count, max_bytes, prefix: WebDataset shard limits and file prefix.
        classes: class names in index order (needed for ``str`` labels; default for ``int``
            labels: ``"0" .. "K-1"`` for the largest label K-1, which must then be below the number
            of samples: one mistyped label never makes millions of empty classes).
        class_to_idx: name -> index (default: from ``classes``).
        labels: True (every sample has a label), False (none has one), None (decided by the
            first sample; a later sample that disagrees is an error).
        fields: extra fields expected (others found in samples are added as they come); listed
            in the manifest even when no sample has them.
        options, skipped, files: recorded in the manifest (provenance, skipped inputs, input counts;
            ``skipped`` is read after the last sample, so the generator may append to it, and
            ``files`` gets ``packed`` and ``skipped`` filled in).
        map_size: LMDB initial map size (grows as needed).
        progress: ``callback(num_samples, num_bytes)`` after each sample.
        num_classes: integer labels index the classes ``"0" .. "K-1"`` (instead of ``classes``);
            a label of K or more is an error naming the sample.
        append: add the samples to the finished WebDataset dataset in ``out`` as new shards
            (:func:`shardfeed.convert.append.append_samples`: labelled samples without a
            ``key`` or extra fields; a ``path`` the dataset holds is skipped; the dataset's shard
            limits and prefix; ``classes``/``class_to_idx`` keep the dataset's indices).

    Returns:
        The dataset's :class:`~shardfeed.readers.format.Manifest` (written last, atomically). Until
        then OUT holds ``.shardfeed-pack/``: a write that stops (an error, Ctrl-C) leaves a folder
        that readers refuse as unfinished; write it again into an empty folder.

    Raises:
        ValueError: a sample without image bytes or extension, a bad field name, a label not in
            the classes (or, without classes, a largest label not below the number of samples) or
            not the class its ``meta["class"]`` names, labelled and unlabelled samples mixed, no
            sample at all; ``options``, ``files`` or ``skipped`` not strict JSON or a ``skipped``
            entry not ``{"path": str, "reason": str}`` (:mod:`.recorded`); the message names the
            sample (its position and path). The shard in progress is dropped; no manifest is written.
        TypeError: a field value that is neither bytes, str nor JSON.
        shardfeed.readers.errors.UnsupportedURLError: ``out`` is a remote URL (``s3://``,
            ``http://`` ...): nothing is written.
        shardfeed.convert.outlock.OutputBusyError: another command is writing ``out``.
        OSError: writing failed.
    """
    from .outlock import output_lock

    out = _local_out(out)
    if append:
        return _append_samples(samples, out, format, classes, class_to_idx, num_classes, progress)
    if num_classes is not None:
        classes = _numbered_classes(num_classes, classes, class_to_idx)
    with output_lock(out, "write_dataset"):  # one writer per OUT: a second one fails at once, naming this one
        return _write(samples, out, format=format, max_count=max_count, max_bytes=max_bytes, prefix=prefix,
                      classes=classes, class_to_idx=class_to_idx, labels=labels, fields=fields, options=options,
                      skipped=skipped, files=files, map_size=map_size, progress=progress, mark_unfinished=True)


def _local_out(out) -> Path:
    """:func:`write_dataset`'s OUT as a local path.

    Raises:
        shardfeed.readers.errors.UnsupportedURLError: a remote URL (nothing is written).
    """
    from shardfeed.readers.errors import UnsupportedURLError
    from shardfeed.readers.opener import is_remote, local_path

    if is_remote(out):  # never a local folder called "s3:"
        raise UnsupportedURLError(f"{out}: write_dataset writes a local folder; write it to a local folder, then "
                                  f"`shardfeed convert DIR {out} --format wds` uploads it")
    return local_path(out)


def _append_samples(samples, out: Path, format, classes, class_to_idx, num_classes, progress) -> Manifest:
    """``write_dataset(..., append=True)`` (:func:`shardfeed.convert.append.append_samples`).

    Raises:
        ValueError: a format other than WebDataset, or ``num_classes``.
    """
    from .append import append_samples

    if not describe(canonical_format(format)).sharded or num_classes is not None:
        raise ValueError(f"{out}: append adds WebDataset shards with the dataset's class map; pass "
                         "format='webdataset' and classes/class_to_idx (not num_classes)")
    return append_samples(samples, out, to_sample=_sample_from_dict, classes=classes, class_to_idx=class_to_idx,
                          progress=progress)


def _numbered_classes(num_classes, classes, class_to_idx) -> list[str]:
    """The classes ``"0" .. "K-1"`` of ``write_dataset(num_classes=K)``.

    Raises:
        ValueError: ``classes`` or ``class_to_idx`` given too; K not an integer 1 .. MAX_CLASSES.
    """
    if classes is not None or class_to_idx is not None:
        raise ValueError("num_classes and classes/class_to_idx both give the classes; pass one")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or not 1 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes={num_classes!r}: give the number of classes, 1 .. {MAX_CLASSES:,}")
    return [str(k) for k in range(num_classes)]


def _write(samples, out, *, format, max_count, max_bytes, prefix, classes, class_to_idx, labels, fields, options,
           skipped, files, map_size, progress, writer_extra: dict | None = None, resuming: bool = False,
           writer_box: dict | None = None, mark_unfinished: bool = False) -> Manifest:
    """:func:`write_dataset`, plus what a resumed layout pack needs: ``writer_extra`` (the
    WebDataset writer's ``resume_shards``, ``field_counts``, ``on_shard_end``) and ``resuming``
    (the samples left may be none); ``writer_box["w"]`` gets the writer. ``mark_unfinished``:
    OUT holds ``.shardfeed-pack/write_dataset.json`` from the writer's creation until the manifest
    is written, so the finished shards of a write that stopped (an exception, Ctrl-C) read as an
    unfinished dataset, never as shards to index into a dataset of their own."""
    fmt = canonical_format(format)
    check_recorded(options=options, skipped=skipped, files=files)  # before anything is written
    if classes is not None and class_to_idx is None:
        classes = list(classes)
        bad = next((c for c in classes if not isinstance(c, str)), None)
        if bad is not None or len(set(classes)) != len(classes):
            what = f"class name {bad!r} is not a string" if bad is not None else "a class name is listed twice"
            raise ValueError(f"classes: {what}; classes=[...] lists each class name once, in index order")
        class_to_idx = {c: i for i, c in enumerate(classes)}
    if class_to_idx is not None:
        class_to_idx = checked_class_map(dict(class_to_idx), "class_to_idx")
        ordered = [c for c, _ in sorted(class_to_idx.items(), key=lambda kv: kv[1])]
        if classes is not None and list(classes) != ordered:
            raise ValueError("classes and class_to_idx disagree (classes[i] must be the class of index i); pass one")
        classes = ordered
    declared = list(dict.fromkeys(fields))
    if len(declared) > MAX_FIELDS:
        raise ValueError(f"{len(declared)} extra fields, more than the {MAX_FIELDS} a dataset may have")
    for name in declared:
        problem = field_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
    problem = member_clash((), declared)
    if problem is not None:  # before anything is written
        raise ValueError(f"fields: {problem}")
    width = None
    try:
        width = key_width(len(samples))  # type: ignore[arg-type]
    except TypeError:
        pass
    it = iter(samples)
    first = next(it, None)
    if first is None and not resuming:
        raise ValueError(f"{out}: no sample to write; a dataset holds at least one")
    if first is not None and not isinstance(first, Mapping):
        raise ValueError(f"sample 0: a sample is a dict ({{'image': bytes, 'ext': 'jpg', ...}}), got "
                         f"{type(first).__name__}")
    if labels is None:
        labels = first.get("label") is not None
    writer = writer_class(fmt).create(
        out, classes=list(classes or []) if labels else [], class_to_idx=dict(class_to_idx or {}) if labels else {},
        max_count=max_count, max_bytes=max_bytes, prefix=prefix, skipped=skipped,
        options={**(options or {}), "layout": (options or {}).get("layout", "samples")}, files=files,
        map_size=map_size, labels=LABELS_CLASS if labels else LABELS_NONE, fields=declared, **(writer_extra or {}))
    if writer_box is not None:
        writer_box["w"] = writer
    marker = Path(out) / STATE_DIR / WRITING_NAME
    if mark_unfinished:
        marker.parent.mkdir(exist_ok=True)
        write_bytes_atomic(marker, json.dumps({"writer": "write_dataset", "unfinished": True}).encode())
    idx_to_class = {i: c for c, i in (class_to_idx or {}).items()}
    max_label, top = -1, ""
    n = 0
    exts_seen: set[str] = set()  # image extensions checked against the fields' members
    with writer:
        for i, item in enumerate(_chain(first, it) if first is not None else ()):
            sample, extra = _sample_from_dict(item, i, width, bool(labels), class_to_idx, idx_to_class)
            _add_new_fields(writer, sample, extra, i, exts_seen)
            if labels:
                if sample.label > max_label:
                    max_label, top = sample.label, f"sample {i} ({sample.meta.get('path', sample.key)})"
            writer.write(sample, extra)
            n += 1
            if progress is not None:
                progress(1, len(sample.data))
        if labels and classes is None:  # integer labels without names: classes "0" .. "K-1"
            if max_label >= n:  # more classes than samples: a mistyped label, refused before the manifest
                raise ValueError(f"{top}: label {max_label} would make {max_label + 1:,} classes (\"0\" .. "
                                 f"\"{max_label}\") for {n:,} samples; a mistyped label? Fix it, or pass "
                                 "num_classes=K (labels 0 .. K-1) or classes=[...] naming the classes")
            writer.classes = [str(k) for k in range(max_label + 1)]
            writer.class_to_idx = {str(k): k for k in range(max_label + 1)}
        writer.skipped = check_skipped(skipped)  # read now: a generator may have added to it
        if files is not None:
            writer.files = {**files, "packed": writer.num_samples, "skipped": len(writer.skipped)}
        manifest = writer.close()
    if mark_unfinished:
        marker.unlink(missing_ok=True)
        try:
            marker.parent.rmdir()
        except OSError:
            pass
    return manifest


def _add_new_fields(writer, sample: Sample, extra: dict[str, bytes], i: int, exts_seen: set[str]) -> None:
    """Add the fields of sample ``i`` that ``writer`` does not have yet to its fields, once
    checked (a field name, at most :data:`MAX_FIELDS`, no member name taken twice with the image
    extensions seen so far, :func:`~shardfeed.readers.format.member_clash`).

    Raises:
        ValueError: naming the sample and the problem.
    """
    where = f"sample {i} ({sample.meta.get('path', sample.key)})"
    new = [name for name in extra if name not in writer.field_counts]
    if sample.ext not in exts_seen or new:
        exts_seen.add(sample.ext)
        problem = member_clash(exts_seen, [*writer.field_counts, *new])
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
    for name in new:
        problem = field_name_problem(name)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        if len(writer.field_counts) >= MAX_FIELDS:  # a manifest lists at most MAX_FIELDS
            raise ValueError(f"{where}: field {name!r} would be extra field number {len(writer.field_counts) + 1}, "
                             f"more than the {MAX_FIELDS} a dataset may have; store the others in one JSON field")
        writer.field_counts[name] = 0


def _chain(first, rest):
    yield first
    yield from rest


def _sample_from_dict(item: Mapping[str, Any], i: int, width: int | None, labelled: bool,
                      class_to_idx: dict[str, int] | None, idx_to_class: dict[int, str]
                      ) -> tuple[Sample, dict[str, bytes]]:
    """One sample dict as ``(Sample, {field: bytes})`` (see :func:`write_dataset`)."""
    if not isinstance(item, Mapping):
        raise ValueError(f"sample {i}: a sample is a dict ({{'image': bytes, 'ext': 'jpg', ...}}), got "
                         f"{type(item).__name__}")
    path = item.get("path")
    where = f"sample {i}" + (f" ({path})" if path else "")
    data = item.get("image")
    if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
        raise ValueError(f"{where}: 'image' must be the encoded image bytes (non-empty), got "
                         f"{type(data).__name__}")
    ext = item.get("ext")
    if not isinstance(ext, str) or not ext.strip("."):
        raise ValueError(f"{where}: 'ext' must be the image's extension ('jpg', 'png', ...), got {ext!r}")
    ext = normalize_ext(ext)
    if not MEMBER_EXT_RE.match(ext) or ext in SIDE_EXTENSIONS:
        raise ValueError(f"{where}: extension {ext!r} cannot name an image member (ASCII letters, digits, '_' "
                         f"and '-'; no dots, spaces or control characters; not {', '.join(sorted(SIDE_EXTENSIONS))})")
    if ext not in IMAGE_EXTENSIONS:
        log.debug("%s: extension %s is not one of the known image extensions", where, ext)
    raw_meta = item.get("meta")
    if raw_meta is not None and not isinstance(raw_meta, Mapping):
        raise ValueError(f"{where}: 'meta' is a dict of JSON metadata, got {type(raw_meta).__name__}")
    meta = dict(raw_meta or {})
    if raw_meta:  # stored as strict JSON (no NaN/Infinity, which JSON readers refuse)
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: 'meta' is not strict JSON ({exc})") from None
        if "path" in meta and path is None:
            path = meta["path"]  # checked as a "path" is: unpack writes the image there
    if path is not None:
        if not isinstance(path, str) or stored_path_problem(path) is not None:
            raise ValueError(f"{where}: path {path!r}: {stored_path_problem(str(path)) or 'not a string'}")
        meta["path"] = path
    raw_label = item.get("label")
    if labelled != (raw_label is not None):
        raise ValueError(f"{where}: {'has no label' if labelled else 'has a label'}, unlike the first sample; "
                         "every sample of a dataset has a label, or none has (labels=False: unlabelled)")
    label = -1
    if labelled:
        if isinstance(raw_label, numbers.Integral) and not isinstance(raw_label, (bool, int)):
            raw_label = int(raw_label)  # numpy.int64, torch's item(): an integer all the same
        if isinstance(raw_label, bool) or not isinstance(raw_label, (int, str)):
            raise ValueError(f"{where}: label {raw_label!r} is neither a class index (int) nor a class name (str)")
        if isinstance(raw_label, str):
            if class_to_idx is None or raw_label not in class_to_idx:
                raise ValueError(f"{where}: class {raw_label!r} is not in the given classes; pass classes=[...] "
                                 "naming every class (or integer labels)")
            label = class_to_idx[raw_label]
        else:
            label = int(raw_label)
            if label < 0 or (class_to_idx is not None and label not in idx_to_class):
                raise ValueError(f"{where}: label {label} is not a class index of the "
                                 f"{len(class_to_idx or {})} classes")
            if class_to_idx is None and label >= MAX_CLASSES:  # the classes "0" .. str(label) would be made
                raise ValueError(f"{where}: label {label} would make {label + 1:,} classes (\"0\" .. \"{label}\"), "
                                 f"more than {MAX_CLASSES:,}; pass classes=[...] or class_to_idx naming the classes")
        name = idx_to_class.get(label)
        check_meta_class(meta, name, label, where)
        if name is not None:
            meta.setdefault("class", name)
    key = item.get("key")
    if key is None:
        key = str(i).zfill(width or 9)
    elif not isinstance(key, str):
        raise ValueError(f"{where}: key must be a string, got {type(key).__name__}")
    else:
        problem = _key_problem(key)
        if problem is not None:
            raise ValueError(f"{where}: key {key!r}: {problem}")
    extra = {}
    for name, value in item.items():
        if name in _SAMPLE_KEYS or value is None:
            continue
        extra[name] = encode_field(name, value)
        if isinstance(value, (bytes, bytearray, memoryview)):  # as readers will decode it: checked now
            try:
                decode_field(name, extra[name], where)
            except ValueError as exc:
                raise ValueError(str(exc)) from None
    return Sample(key, bytes(data), ext, label, meta), extra


def _key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a sample key of :func:`write_dataset`, or None.

    A key becomes the member names ``{key}.{ext}`` of a tar shard (which ``tar -x`` writes as
    files) and an LMDB key: the stored-path policy applies to it (no ``..``, ``.`` or empty
    components, not absolute, no backslash or NUL), it has no control character and no ``.`` in
    its last component (WebDataset splits key from extension at the first dot of the name).
    """
    if not key:
        return "keys are non-empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return "a key holds no control character (newline, tab, NUL)"
    problem = stored_path_problem(key)
    if problem is not None:
        return f"a key is a relative name: {problem}"
    if "." in key.rsplit("/", 1)[-1]:
        return "a key holds no '.' (WebDataset splits the key from the extension at the first dot)"
    return None


# ---------------------------------------------------------------------------------------------
# scanning a folder of images (+ sidecars)

# the scan: :mod:`shardfeed.convert.layout_scan` (called through this name, which tests replace)
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
            :mod:`shardfeed.convert.label_rules`).
    """

    labels_file: str | os.PathLike | None = None
    no_labels: bool = False
    sidecars: tuple[str, ...] = ()
    require_sidecars: bool = False
    max_files: int = 100_000_000
    num_classes: int | None = None
    label_kind: str | None = None


def pack_layout(src: str | os.PathLike, out: str | os.PathLike, options, layout: LayoutOptions, *,
                progress: Callable[[int, int], None] | None = None, context: PackContext | None = None):
    """Pack SRC in a layout other than plain class folders (see the module docstring).

    Labels come from ``layout.labels_file``, else from class folders (``SRC/CLASS/...``, sorted as
    torchvision's ImageFolder, or ``options.class_to_idx``), else none (``no_labels``, or a SRC
    without sub-folders). Packing order, keys, formats and limits are ``pack``'s
    (``options``: :class:`~shardfeed.convert.pack.PackOptions`).

    Args:
        progress: ``callback(num_samples, num_input_bytes)`` as samples are written (without a
            ``context``).
        context: the pack's :class:`~shardfeed.convert.context.PackContext` (:func:`pack` passes
            its own; its ``progress`` is called); None: one made for ``options`` with
            ``progress``. These layouts pack in this process: the executor runs no task.

    Returns:
        A :class:`~shardfeed.convert.pack.PackReport`.

    Raises:
        FileNotFoundError, NotADirectoryError: SRC missing or a file.
        TypeError: both ``context`` and ``progress``.
        ValueError: no images; an image without a label row or a row without an image
            (``on_error="raise"``; names them and how many); a label not in ``--classes-from``;
            a missing sidecar with ``require_sidecars``; OUT not empty; ``resume`` of another plan
            (options, labels or files changed) or of an LMDB pack.
    """
    from .outlock import output_lock
    from .outdir import prepare_output

    if context is None:
        with PackContext.for_options(options, progress=progress) as context:
            return pack_layout(src, out, options, layout, context=context)
    if progress is not None:
        raise TypeError("pack_layout(context=...): pass progress in the context")
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such directory")
    if not src.is_dir():
        raise NotADirectoryError(f"{src}: is a file, not an image folder")
    if options.executor != "local":
        raise ValueError(f"--executor {options.executor}: --labels, --sidecars and --no-labels pack in this process; "
                         "drop --executor")
    problem = member_clash(parse_extensions(options.extensions), layout.sidecars)
    if problem is not None:  # before the scan, before OUT is touched
        raise ValueError(f"--extensions/--sidecars: {problem}")
    if (layout.num_classes is not None or layout.label_kind is not None) and layout.labels_file is None:
        raise ValueError("--num-classes and --label-kind say what the labels of a labels file mean; pass --labels FILE")
    if layout.require_sidecars and not layout.sidecars:
        raise ValueError("--require-sidecars needs --sidecars naming the sidecar files to require (e.g. "
                         "--sidecars txt,json)")
    plan = _plan_layout(src, options, layout)
    with output_lock(out, "pack"):
        action = prepare_output(src, out, resume=options.resume, overwrite=options.overwrite)
        if action == "finished":  # --resume on a finished dataset: done when it is this command's
            return _finished_layout_report(out, plan, t0)
        done = _layout_resume_records(out, options, plan, resume=action == "resume")
        manifest = _write_layout(out, options, layout, plan, done, context)
    return _layout_report(out, options, plan, manifest, time.perf_counter() - t0)


@dataclasses.dataclass
class _Labels:
    """The labels of a layout pack: the images left to pack and each one's class index."""

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
    planned: list
    width: int
    classes: list[str]
    fp: dict
    recorded: dict
    files: dict
    fingerprint: str


def _plan_layout(src: Path, options, layout: LayoutOptions) -> _LayoutPlan:
    """Scan SRC, label its images, drop those without their required sidecars and fix the
    packing order (:func:`pack_layout` before OUT is touched)."""
    exts = parse_extensions(options.extensions)
    found = _scan_images(src.absolute(), exts, tuple(layout.sidecars), layout.max_files,
                         follow_external_links=options.follow_external_links)
    refuse_unpackable(src, found.unpackable, options.on_error)
    # every file seen: images, their sidecar files, the ignored and the unpackable ones (the labels file's rows
    # that name no image are skipped entries too, but not files found)
    n_found = (len(found.images) + sum(len(v) for v in found.sidecars.values()) + len(found.ignored)
               + len(found.unpackable))
    skipped: list[dict] = [{"path": u["path"], "key": None, "reason": u["reason"]} for u in found.unpackable]
    labels = _resolve_labels(src, options, layout, found, skipped)
    if not labels.images:
        raise ValueError(f"{src}: no images with extensions {','.join(exts)} to pack")
    labels.images = _drop_missing_sidecars(src, options, layout, found, labels.images, skipped)
    images = labels.images
    order = list(range(len(images)))
    if options.shuffle:
        random.Random(options.seed).shuffle(order)  # the permutation plan_samples applies
    classes = [c for c, _ in sorted(labels.class_to_idx.items(), key=lambda kv: kv[1])]
    fp = options.fingerprint_fields()
    recorded = {**fp, "source": str(src.absolute()), "layout": labels.kind}
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
    planned = [images[i] for i in order]
    fingerprint = _layout_fingerprint(src, recorded, layout, labels.class_to_idx, labels.labels_of, planned,
                                      found.sidecars)
    return _LayoutPlan(src=src, found=found, n_found=n_found, labels=labels, skipped=skipped, planned=planned,
                       width=key_width(len(images)), classes=classes, fp=fp, recorded=recorded, files=files,
                       fingerprint=fingerprint)


def _resolve_labels(src: Path, options, layout: LayoutOptions, found: _Found, skipped: list[dict]) -> _Labels:
    """The labels from the labels file, else none (``no_labels``, or no class folders), else the
    class folders; the images without a label are added to ``skipped`` (or raise)."""
    if layout.labels_file is not None:
        return _labels_from_file(src, options, layout, found, skipped)
    if layout.no_labels or not any("/" in rel for rel, *_ in found.images):
        if options.class_to_idx is not None:  # a class map asks for labels: never dropped silently
            why = "--no-labels" if layout.no_labels else f"{src} has no class folders"
            raise ValueError(f"--classes-from gives classes, but this pack is unlabelled ({why}); pass --labels FILE "
                             "to label the images, or drop --classes-from")
        return _Labels(found.images, {}, {}, False, "unlabelled")
    from shardfeed.readers.imagefolder import resolve_class_map

    from .scan import find_classes

    folders = find_classes(src)
    _, class_to_idx = resolve_class_map(folders, options.class_to_idx, src)
    loose = [rel for rel, *_ in found.images if "/" not in rel]
    found.ignored += [{"path": rel, "reason": "image not in a class folder"} for rel in loose]
    images = [t for t in found.images if "/" in t[0]]
    labels_of = {rel: class_to_idx[rel.split("/", 1)[0]] for rel, *_ in images}
    return _Labels(images, class_to_idx, labels_of, True, "class-folders")


def _labels_from_file(src: Path, options, layout: LayoutOptions, found: _Found, skipped: list[dict]) -> _Labels:
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
            parts.append(f"{len(unlisted)} image(s) under {src} have no row in {layout.labels_file} "
                         f"(e.g. {', '.join(unlisted[:3])})")
        if absent:
            parts.append(f"{len(absent)} row(s) of {layout.labels_file} name no image under {src} "
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


def _finished_layout_report(out: Path, plan: _LayoutPlan, t0: float):
    """The report of ``--resume`` on OUT's finished dataset, when it is this very pack's.

    Raises:
        ValueError: the finished dataset was packed with other options, labels or files.
    """
    from shardfeed.readers.local_manifest import load_manifest

    from .ownership import flag
    from .report import PackReport

    manifest = load_manifest(out, check_files=False)
    if (json.loads(json.dumps(manifest.options)) != json.loads(json.dumps(plan.recorded))
            or (manifest.files or {}).get("found") != plan.n_found):
        raise ValueError(f"{out}: already holds a finished dataset packed with other options, labels or "
                         f"files; nothing to resume: rebuild it with {flag('overwrite')}, or choose another "
                         "output folder")
    return PackReport(
        source=str(plan.src.absolute()), output=str(out), format=manifest.format,
        num_samples=manifest.num_samples, num_shards=len(manifest.shards),
        num_bytes=sum(sh.num_bytes for sh in manifest.shards), input_bytes=0,
        seconds=time.perf_counter() - t0, workers=1, files=dict(manifest.files or {}),
        skipped=list(manifest.skipped), ignored=plan.found.ignored, empty_classes=[],
        num_classes=len(manifest.classes), shards_resumed=len(manifest.shards),
        extra={"layout": plan.labels.kind, "fields": manifest.fields, "already_complete": True})


def _layout_resume_records(out: Path, options, plan: _LayoutPlan, *, resume: bool) -> list[dict]:
    """A resumed pack: the records of the shards it finished (after checking OUT's plan is this
    one); a new pack: none, once the plan is written to OUT's state folder.

    Raises:
        ValueError: ``resume`` of an LMDB pack, or of a pack with other options, labels or files.
    """
    state = out / STATE_DIR
    if not resume:  # "start": missing, empty, or stopped before its plan
        state.mkdir(exist_ok=True)
        # the options name the shards this pack writes (what --overwrite may delete)
        write_bytes_atomic(state / PLAN_NAME, json.dumps({"fingerprint": plan.fingerprint,
                                                          "options": plan.fp}).encode())
        return []
    if not describe(options.format).sharded:
        raise ValueError(f"{out}: --resume of a --labels/--sidecars/--no-labels pack is available for "
                         "--format wds; rerun the LMDB pack with --overwrite")
    try:
        old = json.loads(read_small_file(state / PLAN_NAME, what="the pack plan"))
    except (OSError, ValueError, RecursionError):
        old = {}
    if not isinstance(old, dict) or old.get("fingerprint") != plan.fingerprint:
        raise ValueError(f"{out}: the interrupted pack used other options, labels or files; rerun with the "
                         "same ones, or start again with --overwrite")
    return _finished_records(out, len(plan.planned))


def _write_layout(out: Path, options, layout: LayoutOptions, plan: _LayoutPlan, done: list[dict],
                  context: PackContext) -> Manifest:
    """Write the planned samples after the ``done`` shards through the format's writer, with a
    resume record per finished shard (sharded formats); the state folder goes once the manifest
    is written. A partial shard is removed when the write stops."""
    start = done[-1]["end"] if done else 0
    read_skips: list[dict] = [sk for rec in done for sk in rec["skipped"]]
    plan.skipped += read_skips
    pos = {"at": start, "shard_start": start, "counts": {}}
    samples = _layout_samples(options, layout, plan, start, pos, read_skips)
    writer_extra = None
    writer_box: dict = {}
    if describe(options.format).sharded:
        writer_extra = _resume_writer_extra(out, done, pos, read_skips, writer_box)
    labelled = plan.labels.labelled
    try:
        manifest = _write(
            samples, out, format=options.format, max_count=options.max_count, max_bytes=options.max_bytes,
            prefix=options.prefix, classes=plan.classes if labelled else None,
            class_to_idx=plan.labels.class_to_idx if labelled else None, labels=labelled,
            fields=tuple(layout.sidecars), options=plan.recorded, skipped=plan.skipped, files=plan.files,
            map_size=options.map_size, progress=context.progress, writer_extra=writer_extra, resuming=bool(done),
            writer_box=writer_box)
    except BaseException:
        remove_shard_temp_files(out, options.prefix)  # a partial shard; complete ones stay for --resume
        raise
    remove_state_folder(out)
    return manifest


def _layout_samples(options, layout: LayoutOptions, plan: _LayoutPlan, start: int, pos: dict,
                    read_skips: list[dict]) -> Iterator[dict]:
    """The sample dicts of the planned images from ``start`` on, read ahead (``--read-ahead``;
    adaptive: threads only once reads wait on storage) and yielded in plan order: the same bytes
    whatever the read-ahead. ``pos["at"]`` follows the plan position; a file that fails with
    ``on_error="skip"`` goes to ``plan.skipped`` and ``read_skips`` (with its position)."""
    src, planned, found, labels = plan.src, plan.planned, plan.found, plan.labels

    def read_files(j: int) -> tuple[bytes, dict[str, bytes]]:  # in a read-ahead thread
        rel, _, size, mtime = planned[j]
        return _read(src / rel, (size, mtime)), {
            f: _read(src / srel, found.side_stats[srel], MAX_SIDECAR_BYTES)
            for f, srel in sorted(found.sidecars.get(rel, {}).items()) if f in layout.sidecars}

    for r in read_ahead(range(start, len(planned)), read_files, max_in_flight=options.read_ahead,
                        size_of=lambda j: planned[j][2], adaptive=True):
        j = r.item
        pos["at"] = j
        rel, ext, _, _ = planned[j]
        key = str(j).zfill(plan.width)
        meta: dict = {}
        try:
            if r.error is not None:
                raise r.error
            data, extra = r.value
            for f, value in extra.items():  # a .txt that is not UTF-8, a .json that does not parse:
                decode_field(f, value, str(src / found.sidecars[rel][f]))  # named now, not in training
            if options.reencode is not None:  # the image only; sidecars (masks too) stay as they are
                data, ext, meta = reencode_payload(data, ext, {}, options.reencode, source=str(src / rel))
            if options.decode_check:
                from shardfeed.readers.decode import decode_image

                decode_image(data, ext, source=str(src / rel))
        except (OSError, ValueError) as exc:
            if options.on_error != "skip":
                raise
            item = {"path": rel, "key": key, "reason": skip_reason(exc)}
            plan.skipped.append(item)
            read_skips.append({**item, "_pos": j})
            continue
        item = {"image": data, "ext": ext, "path": rel, "key": key, **extra}
        if meta:
            item["meta"] = meta  # orig_* of a re-encoded image
        if labels.labelled:
            item["label"] = labels.labels_of[rel]
        yield item
    pos["at"] = len(planned)


def _resume_writer_extra(out: Path, done: list[dict], pos: dict, read_skips: list[dict], writer_box: dict) -> dict:
    """The WebDataset writer's ``resume_shards``, ``field_counts`` and ``on_shard_end``, which
    writes each finished shard's resume record (its sample range, its samples per field, the
    files skipped in it)."""
    from shardfeed.readers.format import ShardEntry

    counts: dict[str, int] = {}
    for rec in done:
        for f, n in rec["fields"].items():
            counts[f] = counts.get(f, 0) + n
    pos["counts"] = dict(counts)

    def on_shard_end(entry, index: int) -> None:
        now = dict(writer_box["w"].field_counts) if "w" in writer_box else {}
        a, b = pos["shard_start"], pos["at"]
        write_shard_record(out, index, {
            "shard": index, "entry": entry.to_json(), "start": a, "end": b,
            "fields": {f: now.get(f, 0) - pos["counts"].get(f, 0) for f in now},
            "skipped": [{k: v for k, v in sk.items() if k != "_pos"} for sk in read_skips
                        if a <= sk.get("_pos", -1) < b]})
        pos["shard_start"], pos["counts"] = b, now

    return {"resume_shards": [ShardEntry(**rec["entry"]) for rec in done], "field_counts": counts,
            "on_shard_end": on_shard_end}


def _layout_report(out: Path, options, plan: _LayoutPlan, manifest: Manifest, seconds: float):
    """The :class:`~shardfeed.convert.report.PackReport` of a finished layout pack."""
    from .report import PackReport

    return PackReport(
        source=str(plan.src.absolute()), output=str(out), format=options.format, num_samples=manifest.num_samples,
        num_shards=len(manifest.shards), num_bytes=sum(s.num_bytes for s in manifest.shards),
        input_bytes=sum(t[2] for t in plan.planned), seconds=seconds, workers=1,
        files=manifest.files, skipped=list(manifest.skipped), ignored=plan.found.ignored, empty_classes=[],
        num_classes=len(manifest.classes), extra={"layout": plan.labels.kind, "fields": manifest.fields})


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


def _layout_fingerprint(src: Path, recorded: dict, layout: LayoutOptions, class_to_idx: dict, labels_of: dict,
                        planned: list, sidecars: dict) -> str:
    """The identity of a layout pack's plan (options, class map, and per planned image: path,
    size, mtime, label and its sidecars' paths, sizes and mtimes), checked by ``--resume``."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in recorded.items() if k != "source"}, sort_keys=True).encode())
    h.update(json.dumps(class_to_idx, sort_keys=True).encode())
    for rel, _, size, mtime in planned:
        h.update(f"{rel}\0{size}\0{mtime}\0{labels_of.get(rel, -1)}\0".encode("utf-8", "surrogateescape"))
        for f, srel in sorted(sidecars.get(rel, {}).items()):
            if f in layout.sidecars:
                try:
                    st = (src / srel).stat()
                    h.update(f"{f}\0{srel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode("utf-8", "surrogateescape"))
                except OSError:
                    h.update(f"{f}\0{srel}\0?\0".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _finished_records(out: Path, num_samples: int) -> list[dict]:
    """The resume records of the shards an interrupted layout pack finished, in order (a prefix)."""
    done, end = [], 0
    while end < num_samples:
        rec = finished_shard_record(out, len(done))
        if (rec is None or rec.get("start") != end or not isinstance(rec.get("end"), int) or rec["end"] <= end
                or not isinstance(rec.get("entry"), dict)):
            break
        done.append(rec)
        end = rec["end"]
    return done


def _read(path: Path, scanned: tuple[int, int], limit: int | None = None) -> bytes:
    """A source file's bytes (an empty image is an error; a sidecar over ``limit`` bytes too).

    The file is checked again as it is opened: a file replaced after the scan by a FIFO or a
    device is an error, never read (a FIFO would block the pack); so is a file whose size or
    modification time is no longer ``scanned`` (``(bytes, ns)``: replaced, by a link or another
    file, or changed); at most ``limit`` bytes are read whatever the size said at the scan.

    Raises:
        ValueError: not a regular file any more; a sidecar over ``limit``; an empty image.
        shardfeed.readers.errors.SourceChangedError: size or modification time changed (an OSError).
        OSError: cannot be opened or read.
    """
    from shardfeed.readers.errors import SourceChangedError

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file (a FIFO, device or socket) any more; not read")
        if (st.st_size, st.st_mtime_ns) != tuple(scanned):
            raise SourceChangedError(f"{path}: changed since the scan (size {scanned[0]} -> {st.st_size} bytes, or "
                                     "its modification time; replaced by another file or a link?); not read: rerun "
                                     "the pack once the folder is stable")
        if limit is not None and st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size} bytes, over the {limit} bytes a sidecar file may have")
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise ValueError(f"{path}: over the {limit} bytes a sidecar file may have (it grew while read)")
    if limit is None and not data:
        raise ValueError(f"{path}: empty file (0 bytes), not an image; delete it, or pass --on-error skip")
    return data
