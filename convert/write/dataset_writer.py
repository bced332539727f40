"""Writing any iterable of sample dicts as a shardfeed dataset: :func:`write_dataset`.

The samples go through the format's streaming writer (the registry's, the same as ``shardfeed
convert``): the same shards, rollover rule, ``.sfidx`` indexes, manifest (one builder with the
layout packs, :func:`~shardfeed.convert.writers.webdataset.write_sample_manifest`), wids index and
Hugging Face card as ``pack``. :func:`write_samples` is the same write with what a streamed layout
pack needs (a resume, a writer's state).
"""

from __future__ import annotations

import json
import logging
import numbers
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from shardfeed.readers.format.manifest import (
    DEFAULT_PREFIX,
    IMAGE_EXTENSIONS,
    LABELS_CLASS,
    LABELS_NONE,
    MAX_FIELDS,
    SIDE_EXTENSIONS,
    Manifest,
    Sample,
    field_name_problem,
    fields_problem,
    key_width,
    member_clash,
    normalize_ext,
    stored_path_problem,
)
from shardfeed.readers.format.sample_members import decode_field, encode_field
from shardfeed.readers.file_io import write_bytes_atomic
from shardfeed.readers.format.registry import canonical_format, describe, writer_class

from .. import writers  # noqa: F401  (registers every format's writer)
from .label_files import MAX_CLASSES, MEMBER_EXT_RE, checked_class_map
from .pack_state import STATE_DIR, WRITING_NAME
from .recorded import check_meta_class, check_recorded, check_skipped

__all__ = ["write_dataset", "write_samples"]

log = logging.getLogger(__name__)

#: Sample dict keys that are not extra fields.
_SAMPLE_KEYS = frozenset({"image", "ext", "label", "key", "meta", "path", "class"})


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
      (``"jpg"``, ``".PNG"``; normalised as :func:`~shardfeed.readers.format.manifest.normalize_ext`);
    * ``"label"`` (optional): a class index (``int``) or a class name (``str``, looked up in
      ``classes``/``class_to_idx``); leave it out (or None) in every sample for an unlabelled
      dataset (``labels: "none"``, readers give -1);
    * ``"path"`` (optional): the original path, stored as ``meta["path"]`` (``unpack`` writes the
      image back there); ``"meta"`` (optional): more JSON metadata; ``"key"`` (optional): the sample
      key (default: the zero-padded position, 9 digits at least);
    * any other key is an **extra field** (``"txt"``, ``"json"``, ``"mask.png"``; names as
      :func:`~shardfeed.readers.format.manifest.field_name_problem`): ``bytes`` stored as they are, ``str``
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
            (:func:`shardfeed.convert.write.append.append_samples`: labelled samples without a
            ``key`` or extra fields; a ``path`` the dataset holds is skipped; the dataset's shard
            limits and prefix; ``classes``/``class_to_idx`` keep the dataset's indices).

    Returns:
        The dataset's :class:`~shardfeed.readers.format.manifest.Manifest` (written last, atomically). Until
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
        shardfeed.convert.write.outlock.OutputBusyError: another command is writing ``out``.
        OSError: writing failed.
    """
    from .outlock import output_lock

    out = _local_out(out)
    if append:
        return _append_samples(samples, out, format, classes, class_to_idx, num_classes, progress)
    if num_classes is not None:
        classes = _numbered_classes(num_classes, classes, class_to_idx)
    with output_lock(out, "write_dataset"):  # one writer per OUT: a second one fails at once, naming this one
        return write_samples(samples, out, format=format, max_count=max_count, max_bytes=max_bytes, prefix=prefix,
                      classes=classes, class_to_idx=class_to_idx, labels=labels, fields=fields, options=options,
                      skipped=skipped, files=files, map_size=map_size, progress=progress, mark_unfinished=True)


def _local_out(out) -> Path:
    """:func:`write_dataset`'s OUT as a local path.

    Raises:
        shardfeed.readers.errors.UnsupportedURLError: a remote URL (nothing is written).
    """
    from shardfeed.readers.errors import UnsupportedURLError
    from shardfeed.readers.storage.opener import is_remote, local_path

    if is_remote(out):  # never a local folder called "s3:"
        raise UnsupportedURLError(f"{out}: write_dataset writes a local folder; write it to a local folder, then "
                                  f"`shardfeed convert DIR {out} --format wds` uploads it")
    return local_path(out)


def _append_samples(samples, out: Path, format, classes, class_to_idx, num_classes, progress) -> Manifest:
    """``write_dataset(..., append=True)`` (:func:`shardfeed.convert.write.append.append_samples`).

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


def write_samples(samples, out, *, format, max_count, max_bytes, prefix, classes, class_to_idx, labels, fields,
                  options, skipped, files, map_size, progress, writer_extra: dict | None = None,
                  resuming: bool = False, mark_unfinished: bool = False) -> Manifest:
    """:func:`write_dataset`, plus what a resumed layout pack needs: ``writer_extra`` (the writer's
    resume keywords: the LMDB writer's ``state`` and ``resume``) and ``resuming`` (the samples
    left may be none). ``mark_unfinished``:
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
    problem = fields_problem(declared)
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
    extensions seen so far, :func:`~shardfeed.readers.format.manifest.member_clash`).

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
