"""Look inside a packed dataset (local folder or HTTP URL): what ``shardfeed inspect`` reports.

An image folder (ImageFolder layout) is described too (:func:`inspect_image_folder`).

Class counts come **from the data** (every ``.cls`` member or LMDB record is read), not from
the manifest, which records the class map but not per-class counts. For a local WebDataset only
the tar headers and the tiny ``.cls`` members are read (the walk skips over the images); an
LMDB is read record by record; over HTTP, counting means downloading every shard, so it is off
unless asked for (``count_classes=True``). The report says which it did (``class_counts_from``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable, Iterator

from shardfeed.readers.errors import CorruptDataError, ManifestError
from shardfeed.readers.format.manifest import TAR_BLOCK, Manifest, Sample
from shardfeed.readers.format.offset_index import decode_index
from shardfeed.readers.format.registry import describe, resolve

from .common import (
    DatasetLocation,
    iter_raw_samples,
    iter_shard_samples,
)

log = logging.getLogger(__name__)

__all__ = [
    "count_classes",
    "inspect_dataset",
    "format_inspect_report",
    "inspect_image_folder",
    "format_folder_report",
]


# ---------------------------------------------------------------------------------------------
# class counts and the report

def count_classes(location: DatasetLocation, manifest: Manifest,
                  progress: Callable[[int, int], None] | None = None) -> dict[int, int]:
    """Count samples per class index by reading the labels stored in the data.

    Local WebDataset: the tar headers are walked with ``pread`` (image data is never read) and
    only the ``.cls`` members are read (those of groups ``shardfeed index`` left out, listed in the manifest's
    ``skipped`` with their shard and key, are not counted); over HTTP the shards are
    downloaded; LMDB: every record is decoded.

    Returns:
        ``{class_index: count}``.

    Raises:
        CorruptDataError: a shard or record cannot be read.
    """
    counts: collections.Counter = collections.Counter()
    progress = progress or (lambda n, b: None)
    records = describe(manifest.format).records
    if records is not None:
        for _key, rec in resolve(records)(location.root, verify=False):
            if isinstance(rec, Exception):
                raise rec
            counts[rec["label"]] += 1
            progress(1, len(rec["data"]))
        return dict(counts)
    for shard in manifest.shards:
        if location.remote:
            for sample in iter_shard_samples(location, shard.name, class_to_idx=manifest.class_to_idx,
                                             labelled=manifest.labelled, index=shard.index):
                counts[sample.label] += 1
                progress(1, len(sample.data))
            continue
        path = location.root / shard.name
        left_out = {item.get("key") for item in manifest.skipped if item.get("shard") == shard.name}
        labels = _shard_labels_by_headers(path)
        if labels is None:  # PAX / GNU long-name headers: read the shard with the full tar reader
            labels = [(s.key, s.label) for s in iter_shard_samples(location, shard.name,
                                                                   class_to_idx=manifest.class_to_idx,
                                                                   index=shard.index)]
        n = 0
        for key, label in labels:
            if key not in left_out:
                counts[label] += 1
                n += 1
        progress(n, shard.num_bytes)
    return dict(counts)


#: The largest ``.cls`` member read as a class index (a decimal integer and white space).
_MAX_CLS_BYTES = 64


def _shard_labels_by_headers(path: Path) -> list[tuple[str, int]] | None:
    """``(key, label)`` of every ``.cls`` member of a plain-ustar shard, reading only headers.

    Walks the tar headers with ``os.pread`` (one 512-byte read per member, plus the tiny
    ``.cls`` data), never reading image bytes. Returns None when the shard uses PAX or GNU
    long-name records (the caller then reads it with the full reader).

    Raises:
        CorruptDataError: a header's size field is unreadable or runs past the end of the shard,
            or a ``.cls`` member is unreadable (or longer than 64 bytes).
    """
    out: list[tuple[str, int]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size
        pos = 0
        while pos + 512 <= end:
            h = os.pread(fd, 512, pos)
            if h == bytes(512):
                break
            typeflag = h[156:157]
            if typeflag in (b"x", b"g", b"L", b"K"):
                return None
            try:
                size = int(h[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
            except ValueError:
                raise CorruptDataError(f"{path}: unreadable tar header at byte offset {pos}; run `shardfeed "
                                       "check`") from None
            name = h[:100].split(b"\0", 1)[0]
            if h[257:262] == b"ustar" and h[345:346] != b"\0":
                name = h[345:500].split(b"\0", 1)[0] + b"/" + name
            has_data = typeflag not in (b"1", b"2", b"3", b"4", b"5", b"6")
            if has_data and pos + 512 + size > end:
                raise CorruptDataError(f"{path}: tar header at byte offset {pos} claims a member of {size:,} "
                                       f"bytes, but only {max(end - pos - 512, 0):,} bytes of the shard follow it: the "
                                       "header is damaged or the shard truncated (run `shardfeed check` and repack "
                                       "the shard)")
            if typeflag in (b"0", b"\0", b"7") and name.endswith(b".cls"):
                if size > _MAX_CLS_BYTES:
                    raise CorruptDataError(f"{path}: {name.decode('utf-8', 'replace')} at byte offset {pos} holds "
                                           f"{size:,} bytes, not a class index")
                data = os.pread(fd, size, pos + 512)
                try:
                    out.append((name[:-4].decode("utf-8", "surrogateescape"), int(data.strip())))
                except ValueError:
                    raise CorruptDataError(f"{path}: {name.decode('utf-8', 'replace')} holds {data[:20]!r}, not a "
                                           "class index") from None
            pos += 512 + ((size + 511) // 512 * 512 if has_data else 0)
    finally:
        os.close(fd)
    return out


def inspect_dataset(path_or_url: str | os.PathLike, *, count_classes_from_data: bool | None = None,
                    num_examples: int = 3, max_shards_listed: int = 10,
                    progress: Callable[[int, int], None] | None = None,
                    storage_options: dict | None = None) -> dict:
    """Describe a packed dataset (``shardfeed inspect``).

    Args:
        path_or_url: the dataset directory, its ``manifest.json``, or their HTTP URL.
        count_classes_from_data: read the labels to count samples per class; None: yes for a
            local dataset, no for a URL (that would download every shard).
        num_examples: sample keys with metadata to show (read from the first shard).
        max_shards_listed: shards listed one by one in the human summary beyond which they are
            summarised (the JSON report lists them all).
        progress: ``callback(num_samples, num_bytes)`` while counting classes.
        storage_options: storage client options for a remote location (``s3://``: see
            :mod:`shardfeed.readers.storage.objstore`); None: the storage's defaults.

    Returns:
        A JSON-able dict: ``source``, ``format``, ``version``, ``created_by``, ``num_samples``,
        ``num_classes``, ``extensions`` (``{image extension: samples}``, None for a version-1
        manifest), ``classes`` (``[{"index", "name", "count"}]``; ``count`` None when not
        counted), ``class_counts_from`` (``"data"`` or None), ``shards`` (every entry),
        ``shard_summary`` (count, total/min/max bytes and samples), ``skipped``, ``files``,
        ``options``, ``examples`` (``[{"key", "ext", "label", "class", "num_bytes", "meta"}]``).

    Raises:
        ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: no readable
            dataset there.
    """
    loc = DatasetLocation(path_or_url, storage_options=storage_options)
    manifest = loc.load_manifest(check_files=False)
    problems = []
    if not loc.remote:
        try:
            from shardfeed.readers.storage.local_manifest import check_files_present

            check_files_present(manifest, loc.root)
        except ManifestError as exc:
            problems.append(str(exc))
        else:
            problems += _damaged_indexes(Path(loc.root), manifest)
    if count_classes_from_data is None:
        count_classes_from_data = not loc.remote
    counts = None
    if count_classes_from_data and not problems:
        counts = count_classes(loc, manifest, progress)
    classes = [{"index": i, "name": name, "count": (counts or {}).get(i, 0) if counts is not None else None}
               for name, i in sorted(manifest.class_to_idx.items(), key=lambda kv: kv[1])]
    if counts is not None:
        known = set(manifest.class_to_idx.values())
        for i in sorted(set(counts) - known):
            classes.append({"index": i, "name": None, "count": counts[i]})
            problems.append(f"{counts[i]} samples have class index {i}, not one of the manifest's "
                            f"{len(known)} classes; the shards do not match the manifest (`shardfeed check` "
                            "names them)")
    examples = _examples(loc, manifest, num_examples, problems) if not problems else []
    sizes = [s.num_bytes for s in manifest.shards]
    counts_per_shard = [s.num_samples for s in manifest.shards]
    return {
        "source": str(loc.root),
        "manifest": loc.manifest_source,
        "format": manifest.format,
        "version": manifest.version,
        "created_by": manifest.created_by,
        "num_samples": manifest.num_samples,
        "num_classes": len(manifest.classes),
        "extensions": manifest.extensions,
        "labels": manifest.labels,
        "fields": dict(manifest.fields),
        "classes": classes,
        "class_counts_from": "data" if counts is not None else None,
        "num_shards": len(manifest.shards),
        "shard_summary": {
            "num_shards": len(sizes), "total_bytes": sum(sizes),
            "min_bytes": min(sizes, default=0), "max_bytes": max(sizes, default=0),
            "min_samples": min(counts_per_shard, default=0), "max_samples": max(counts_per_shard, default=0),
            "with_index": sum(1 for s in manifest.shards if s.index),
            "with_sha256": sum(1 for s in manifest.shards if s.sha256),
        },
        "shards": [s.to_json() for s in manifest.shards],
        "max_shards_listed": max_shards_listed,
        "skipped": manifest.skipped,
        "files": manifest.files,
        "options": manifest.options,
        "examples": examples,
        "problems": problems,
    }


def _damaged_indexes(root: Path, manifest: Manifest) -> list[str]:
    """A problem line for each offset index whose size (8 bytes a sample) or sha256 differs from the manifest.

    Cheap next to counting classes: an index holds 8 bytes per sample.
    """
    problems = []
    for shard in manifest.shards:
        if not shard.index:
            continue
        path = root / shard.index
        data = path.read_bytes()
        fix = (f"rebuild it with `shardfeed index {root} --overwrite --classes CLASSES.txt` (the manifest's "
               "class list)")
        if len(data) != 8 * shard.num_samples or (
                shard.index_sha256 and hashlib.sha256(data).hexdigest() != shard.index_sha256):
            problems.append(f"{path}: offset index damaged (its size or sha256 differs from the manifest; "
                            f"`shardfeed check {root}` says where); {fix}")
            continue
        try:
            offsets = decode_index(data, str(path))
        except CorruptDataError as exc:
            problems.append(f"{exc} ({fix})")
            continue
        if offsets and offsets[-1] + TAR_BLOCK > shard.num_bytes:
            problems.append(f"{path}: offset {offsets[-1]} (sample {len(offsets) - 1}) lies past the end of "
                            f"{shard.name} ({shard.num_bytes} bytes); the index is damaged: {fix}")
    return problems


def _examples(loc: DatasetLocation, manifest: Manifest, num_examples: int, problems: list[str]) -> list[dict]:
    """The first ``num_examples`` samples described; a read error goes to ``problems``."""
    examples: list[dict] = []
    if num_examples <= 0 or not manifest.shards:
        return examples
    try:
        for _, s in _first_samples(loc, manifest, num_examples):
            examples.append({"key": s.key, "ext": s.ext, "label": s.label,
                             "class": manifest.classes[s.label] if 0 <= s.label < len(manifest.classes) else None,
                             "num_bytes": len(s.data), "meta": s.meta})
    except (CorruptDataError, OSError) as exc:
        problems.append(f"cannot read example samples: {exc}")
    return examples


def _first_samples(loc: DatasetLocation, manifest: Manifest, n: int) -> Iterator[tuple[str, Sample]]:
    it = iter_raw_samples(loc, manifest)
    try:
        for i, item in enumerate(it):
            if i >= n:
                break
            yield item
    finally:
        it.close()


def _class_lines(report: dict, lines: list[str]) -> None:
    """The classes of a labelled dataset's report, with their counts when read from the data."""
    counted = report["class_counts_from"] == "data"
    lines.append("classes" + (" (counts read from the data):" if counted else
                              " (not counted: pass --class-counts to read every label):"))
    classes = report["classes"]
    shown = classes if len(classes) <= 20 else classes[:10] + [None] + classes[-5:]
    for c in shown:
        if c is None:
            lines.append(f"  ... {len(classes) - 15} more")
            continue
        cnt = f"{c['count']:>8,}" if c["count"] is not None else "       ?"
        lines.append(f"  {c['index']:>5}  {cnt}  {c['name']}")
    if counted:
        total = sum(c["count"] for c in classes)
        if total != report["num_samples"]:
            lines.append(f"  warning: labels add up to {total}, the manifest says {report['num_samples']}")


def format_inspect_report(report: dict) -> str:
    """The human-readable summary of an :func:`inspect_dataset` report (several lines)."""
    files = "file" if not describe(report["format"]).sharded else ("shard" if report["num_shards"] == 1 else "shards")
    unlabelled = report.get("labels") == "none"
    lines = [
        f"{report['source']}: {report['format']} dataset, manifest version {report['version']}, "
        f"created by {report['created_by']}",
        f"samples: {report['num_samples']:,} "
        f"{'(no labels)' if unlabelled else 'in ' + str(report['num_classes']) + ' classes'}, "
        f"{report['num_shards']} "
        f"{files}, "
        f"{report['shard_summary']['total_bytes'] / 1e6:,.1f} MB",
    ]
    exts = report.get("extensions")
    lines.append("image extensions: " + (", ".join(f"{e} ({n:,})" for e, n in exts.items()) if exts else
                                         "not recorded (manifest version 1: `shardfeed index DIR --overwrite` "
                                         "upgrades it)"))
    if report.get("labels") == "none":
        lines.append("labels: none (an unlabelled dataset: readers give label -1)")
    if report.get("fields"):
        lines.append("extra fields: " + ", ".join(
            f"{f} (member .{d['member']}, {d['count']:,} samples, {d['missing']:,} without)"
            for f, d in report["fields"].items()))
    if not unlabelled:  # an unlabelled dataset has no classes to list or count
        _class_lines(report, lines)
    shards = report["shards"]
    limit = report.get("max_shards_listed", 10)
    sharded = describe(report["format"]).sharded
    lines.append("files:" if not sharded else "shards:")
    listed = shards if len(shards) <= limit else shards[: limit // 2] + [None] + shards[-(limit - limit // 2):]
    for s in listed:
        if s is None:
            ss = report["shard_summary"]
            lines.append(f"  ... {len(shards) - limit} more (all shards: {ss['min_samples']}-{ss['max_samples']} "
                         f"samples, {ss['min_bytes'] / 1e6:.1f}-{ss['max_bytes'] / 1e6:.1f} MB)")
            continue
        lines.append(f"  {s['name']:<28} {s['num_samples']:>8,} samples {s['num_bytes'] / 1e6:>10.1f} MB"
                     + ("" if s.get("index") or not sharded else "  (no offset index)"))
    skipped = report["skipped"]
    lines.append(f"skipped files: {len(skipped)}")
    for item in skipped[:10]:
        lines.append(f"  {item.get('path')}: {item.get('reason')}")
    if len(skipped) > 10:
        lines.append(f"  ... and {len(skipped) - 10} more (see --json)")
    if report["examples"]:
        lines.append("examples:")
        for e in report["examples"]:
            lines.append(f"  {e['key']}.{e['ext']}  label {e['label']} ({e['class']}), {e['num_bytes']:,} bytes, "
                         f"meta {json.dumps(e['meta'], ensure_ascii=False)}")
    for p in report["problems"]:
        lines.append(f"problem: {p}")
    return "\n".join(lines)



def inspect_image_folder(source: str | os.PathLike, num_examples: int = 3, *,
                         storage_options: dict | None = None) -> dict:
    """Describe an image folder (ImageFolder layout) as ``shardfeed inspect`` reports it.

    Args:
        source: the folder (``SOURCE/CLASS/IMAGE``), or a bucket prefix holding one
            (``s3://bucket/prefix/``, or any listable location: one paginated listing, the same scan
            rules).
        num_examples: files listed as examples (first in sorted order).
        storage_options: storage client options for a remote location (``s3://``: see
            :mod:`shardfeed.readers.storage.objstore`).

    Returns:
        The report: ``format`` ``"imagefolder"``, ``num_samples``, ``num_classes``, ``num_bytes``,
        ``classes`` (index, name, count, counted from the files), ``ignored``, ``empty_classes``
        and ``examples``.

    Raises:
        FileNotFoundError, ValueError: as :func:`~shardfeed.convert.write.scan.scan_image_folder`.
    """
    from shardfeed.readers.storage.opener import is_remote

    from ..write.scan import scan_image_folder

    if is_remote(source):
        from shardfeed.readers.format.imagefolder import scan_listing
        from shardfeed.readers.storage.opener import open_location

        loc = open_location(str(source), storage_options=storage_options)
        listing = getattr(loc, "listing_cache", None) or loc.list_objects()
        scan = scan_listing(str(loc), listing)
    else:
        scan = scan_image_folder(source)
    counts = {c: 0 for c in scan.classes}
    for f in scan.files:
        counts[f.class_name] += 1
    return {
        "source": scan.root, "format": "imagefolder", "num_samples": len(scan.files),
        "num_classes": len(scan.classes), "num_bytes": scan.num_bytes,
        "classes": [{"index": scan.class_to_idx[c], "name": c, "count": counts[c]} for c in scan.classes],
        "class_counts_from": "files", "ignored": scan.ignored, "empty_classes": scan.empty_classes,
        "examples": [{"path": f.rel, "class": f.class_name, "label": f.label, "ext": f.ext, "num_bytes": f.size}
                     for f in scan.files[:num_examples]],
    }


def format_folder_report(r: dict) -> str:
    """The human form of :func:`inspect_image_folder`'s report (several lines)."""
    lines = [f"{r['source']}: image folder (ImageFolder layout), {r['num_samples']:,} images in "
             f"{r['num_classes']} classes, {r['num_bytes'] / 1e6:,.1f} MB (not packed: `shardfeed pack` it)",
             "classes (counts from the files):"]
    for c in r["classes"][:20]:
        lines.append(f"  {c['index']:>5}  {c['count']:>8,}  {c['name']}")
    if len(r["classes"]) > 20:
        lines.append(f"  ... {len(r['classes']) - 20} more")
    lines.append(f"ignored files: {len(r['ignored'])}")
    for item in r["ignored"][:10]:
        lines.append(f"  {item['path']}: {item['reason']}")
    for e in r["examples"]:
        lines.append(f"  example: {e['path']} (label {e['label']}, {e['num_bytes']:,} bytes)")
    return "\n".join(lines)
