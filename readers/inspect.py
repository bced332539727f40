"""Look inside a packed dataset (local folder or HTTP URL): what ``shardfeed inspect`` reports.

Also home of the small pieces the dataset tools share for reading a dataset sequentially, in
storage order, without torch: :class:`DatasetLocation` (a local directory or an ``http(s)://``
base URL, and the files in it), :func:`parts_to_sample` (WebDataset members → a
:class:`~shardfeed.readers.format.Sample`), and :func:`iter_raw_samples`.

Class counts come **from the data** (every ``.cls`` member or LMDB record is read), not from
the manifest, which records the class map but not per-class counts. For a local WebDataset only
the tar headers and the tiny ``.cls`` members are read (the walk skips over the images); an
LMDB is read record by record; over HTTP, counting means downloading every shard, so it is off
unless asked for (``count_classes=True``). The report says which it did (``class_counts_from``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .errors import CorruptDataError, ManifestError
from .format import (
    DEFAULT_EXTENSIONS,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    Manifest,
    Sample,
    find_manifest_path,
    load_manifest,
    normalize_ext,
)

__all__ = [
    "DatasetLocation",
    "is_url",
    "parts_to_sample",
    "iter_raw_samples",
    "iter_shard_samples",
    "count_classes",
    "inspect_dataset",
    "format_inspect_report",
    "IMAGE_EXTENSIONS", "iter_lmdb_records"]

log = logging.getLogger(__name__)

#: Extensions a tar member may carry to count as a sample's image (canonical and aliases).
IMAGE_EXTENSIONS = frozenset(DEFAULT_EXTENSIONS) | {"gif", "jfif"}


def is_url(text: str | os.PathLike) -> bool:
    """True for ``http://`` and ``https://`` strings."""
    return isinstance(text, str) and text.lower().startswith(("http://", "https://"))


class DatasetLocation:
    """Where a dataset lives: a local directory or an HTTP base URL, and how to open its files.

    ``path_or_url`` may name the directory (``out/train``, ``http://host/train/``) or its
    ``manifest.json`` directly. URLs are read through
    :class:`shardfeed.readers.http_io.HttpLocation` (timeouts, retries that resume mid-file,
    servers that ignore ``Range``).

    Args:
        path_or_url: the dataset directory or manifest, local or ``http(s)://``.
        timeout_s, retries: HTTP socket timeout (seconds) and retries (None: http_io's defaults).

    Attributes:
        url: True for an HTTP(S) location.
        http: the ``HttpLocation`` for a URL, else None.
        root: the local directory (``Path``) or the base URL ending in ``/`` (``str``).
        manifest_source: the manifest's path or URL (``str``).
    """

    def __init__(self, path_or_url: str | os.PathLike, *, timeout_s: float | None = None,
                 retries: int | None = None):
        self.url = is_url(str(path_or_url))
        self.http = None
        if self.url:
            from .http_io import HttpLocation

            self.http = HttpLocation(str(path_or_url), timeout_s=timeout_s, retries=retries)
            self.root = self.http.base
            self.manifest_source = self.http.url(self.http.manifest_name)
        else:
            p = Path(path_or_url)
            self.manifest_source = str(find_manifest_path(p))
            self.root = Path(self.manifest_source).parent

    def __str__(self) -> str:
        return str(self.root)

    def where(self, name: str) -> str:
        """The path or URL of the file ``name`` of the dataset (for messages)."""
        if self.url:
            return self.http.where(name)
        return str(self.root / name)

    def load_manifest(self, *, check_files: bool = False) -> Manifest:
        """Load the manifest (over HTTP for a URL; ``check_files`` applies to local datasets).

        Raises:
            ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: as
                :func:`~shardfeed.readers.format.load_manifest`, or the download failed.
        """
        if not self.url:
            return load_manifest(self.manifest_source, check_files=check_files)
        return Manifest.from_json(self.read_manifest_bytes(), self.manifest_source)

    def read_manifest_bytes(self) -> bytes:
        """The manifest file's bytes, unparsed (``stage`` copies them verbatim).

        Raises:
            ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: no manifest
                there (the message says whether a pack was interrupted), or the download failed.
        """
        if not self.url:
            path = Path(self.manifest_source)
            if not path.is_file():
                load_manifest(path.parent if path.name == MANIFEST_NAME else path, check_files=False)  # precise error
                raise ManifestError(f"{path}: cannot read the manifest")
            return path.read_bytes()
        from .http_io import http_get

        try:
            return http_get(self.manifest_source, timeout_s=self.http.timeout_s, retries=self.http.retries)
        except FileNotFoundError:
            raise ManifestError(f"{self.manifest_source}: not found (HTTP 404); give the URL of a packed dataset's "
                                "folder or of its manifest.json (a pack writes it last)") from None

    def open(self, name: str, start: int = 0) -> tuple[BinaryIO, int]:
        """Open the dataset file ``name`` for reading from byte ``start``.

        Returns:
            ``(stream, offset)``: the stream and the file offset of its next byte (0 when an
            HTTP server ignored the range; skip ``start - offset`` bytes then).

        Raises:
            FileNotFoundError: no such file; DataSourceError: HTTP failure.
        """
        if self.url:
            return self.http.open(name, start)
        f = open(self.root / name, "rb")
        if start:
            f.seek(start)
        return f, start

    def read_bytes(self, name: str) -> bytes:
        """The whole content of the dataset file ``name``."""
        if self.url:
            return self.http.read_bytes(name)
        return (self.root / name).read_bytes()


# ---------------------------------------------------------------------------------------------
# samples

def parts_to_sample(key: str, parts: dict[str, bytes], *, source: str,
                    class_to_idx: dict[str, int] | None = None) -> Sample:
    """Build a :class:`Sample` from one WebDataset sample's members.

    The image is the one member whose extension is an image type (:data:`IMAGE_EXTENSIONS`,
    case-insensitive); the label is the ``.cls`` member (ASCII integer) or, failing that, the
    ``"class"`` name in the ``.json`` metadata looked up in ``class_to_idx``; the metadata is the
    ``.json`` member (``{}`` without one). Other members are ignored.

    Raises:
        CorruptDataError: no image member or several, an unreadable ``.cls`` or ``.json``, no
            label (the message names ``source`` and the key).
    """
    images = [e for e in parts if normalize_ext(e) in IMAGE_EXTENSIONS]
    if len(images) != 1:
        what = "no image member" if not images else f"{len(images)} image members ({', '.join(images)})"
        raise CorruptDataError(f"{source}: sample {key!r} has {what}; members: "
                               f"{', '.join(key + '.' + e for e in parts)}")
    ext = images[0]
    meta: dict = {}
    if "json" in parts:
        try:
            meta = json.loads(parts["json"])
        except ValueError as exc:
            raise CorruptDataError(f"{source}: sample {key!r}: unreadable {key}.json ({exc})") from None
        if not isinstance(meta, dict):
            meta = {"value": meta}
    if "cls" in parts:
        try:
            label = int(parts["cls"].strip())
        except ValueError:
            raise CorruptDataError(f"{source}: sample {key!r}: {key}.cls holds {parts['cls'][:20]!r}, not a class "
                                   "index") from None
    elif class_to_idx and isinstance(meta.get("class"), str) and meta["class"] in class_to_idx:
        label = class_to_idx[meta["class"]]
    else:
        raise CorruptDataError(f"{source}: sample {key!r} has no .cls member (class index); members: "
                               f"{', '.join(key + '.' + e for e in parts)}")
    return Sample(key, parts[ext], normalize_ext(ext), label, meta)


def iter_shard_samples(location: DatasetLocation, name: str, *, class_to_idx: dict[str, int] | None = None,
                       index: str | None = None) -> Iterator[Sample]:
    """Yield the samples of one WebDataset shard of ``location`` in storage order.

    With ``index`` (the shard's ``.idx`` file name), only the member groups that start at one
    of its offsets are samples: ``shardfeed index`` leaves groups that do not form a sample (an
    image without a class, a stray member) out of the index, and they are skipped here too.

    Args:
        location: the dataset's location.
        name: the shard's file name (as in the manifest).
        class_to_idx: for :func:`parts_to_sample`.
        index: the shard's offset-index file name, if it has one.

    Raises:
        CorruptDataError: a damaged tar or sample (names the shard and the key/offset).
        FileNotFoundError, DataSourceError: the shard cannot be opened.
    """
    from .format import decode_index
    from .tario import iter_members, iter_samples

    source = location.where(name)
    starts = set(decode_index(location.read_bytes(index), location.where(index))) if index else None
    stream, _ = location.open(name)
    with stream:
        for key, parts, offset in iter_samples(iter_members(stream, source=source), source=source):
            if starts is not None and offset not in starts:
                continue
            yield parts_to_sample(key, parts, source=source, class_to_idx=class_to_idx)


def _open_lmdb(root: Path):
    """This process's shared read-only environment (:func:`~shardfeed.readers.lmdb_io.process_env`):
    a dataset object may have it open already, and LMDB allows one per process. Not to be closed."""
    from .lmdb_io import process_env

    return process_env(root)


def iter_lmdb_records(root: str | os.PathLike, *, verify: bool = True) -> Iterator[tuple[str, dict | Exception]]:
    """Yield ``(key, record)`` for every sample record of a local LMDB dataset, in key order.

    A record that fails to decode (or its CRC-32, with ``verify``) is yielded as
    ``(key, CorruptDataError)`` instead of stopping the iteration, so checks can report every bad
    key. The reserved manifest record is skipped.
    """
    from .format import decode_record

    root = Path(root)
    env = _open_lmdb(root)
    with env.begin(buffers=False) as txn:
        for k, v in txn.cursor():
            if k == LMDB_MANIFEST_KEY:
                continue
            key = k.decode("utf-8", "replace")
            try:
                yield key, decode_record(v, verify=verify, source=f"{root} key {key}")
            except CorruptDataError as exc:
                yield key, exc




def iter_raw_samples(path_or_url: str | os.PathLike | DatasetLocation, manifest: Manifest | None = None
                     ) -> Iterator[tuple[str, Sample]]:
    """Yield ``(shard_name, sample)`` for every sample of a packed dataset, in storage order.

    No decoding, no shuffling, no torch: the exact stored bytes, labels and metadata.
    WebDataset works locally and over HTTP; LMDB locally only.

    Raises:
        CorruptDataError: a damaged shard or record (names it and the key).
        ManifestError: no manifest, or an LMDB dataset given as a URL.
    """
    loc = path_or_url if isinstance(path_or_url, DatasetLocation) else DatasetLocation(path_or_url)
    manifest = manifest or loc.load_manifest(check_files=not loc.url)
    if manifest.format == "lmdb":
        if loc.url:
            raise ManifestError(f"{loc.root}: an LMDB dataset cannot be read over HTTP; stage it locally first")
        name = manifest.shards[0].name if manifest.shards else "data.mdb"
        for _key, rec in iter_lmdb_records(loc.root):
            if isinstance(rec, Exception):
                raise rec
            yield name, Sample(rec["key"], rec["data"], rec["ext"], rec["label"], rec["meta"])
        return
    for shard in manifest.shards:
        for sample in iter_shard_samples(loc, shard.name, class_to_idx=manifest.class_to_idx, index=shard.index):
            yield shard.name, sample


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
    if manifest.format == "lmdb":
        for _key, rec in iter_lmdb_records(location.root, verify=False):
            if isinstance(rec, Exception):
                raise rec
            counts[rec["label"]] += 1
            progress(1, len(rec["data"]))
        return dict(counts)
    for shard in manifest.shards:
        if location.url:
            for sample in iter_shard_samples(location, shard.name, class_to_idx=manifest.class_to_idx,
                                             index=shard.index):
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


def _shard_labels_by_headers(path: Path) -> list[tuple[str, int]] | None:
    """``(key, label)`` of every ``.cls`` member of a plain-ustar shard, reading only headers.

    Walks the tar headers with ``os.pread`` (one 512-byte read per member, plus the tiny
    ``.cls`` data), never reading image bytes. Returns None when the shard uses PAX or GNU
    long-name records (the caller then reads it with the full reader).

    Raises:
        CorruptDataError: a header's size field or a ``.cls`` member is unreadable.
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
            if typeflag in (b"0", b"\0", b"7") and name.endswith(b".cls"):
                data = os.pread(fd, size, pos + 512)
                try:
                    out.append((name[:-4].decode("utf-8", "surrogateescape"), int(data.strip())))
                except ValueError:
                    raise CorruptDataError(f"{path}: {name.decode('utf-8', 'replace')} holds {data[:20]!r}, not a "
                                           "class index") from None
            has_data = typeflag not in (b"1", b"2", b"3", b"4", b"5", b"6")
            pos += 512 + ((size + 511) // 512 * 512 if has_data else 0)
    finally:
        os.close(fd)
    return out


def inspect_dataset(path_or_url: str | os.PathLike, *, count_classes_from_data: bool | None = None,
                    num_examples: int = 3, max_shards_listed: int = 10,
                    progress: Callable[[int, int], None] | None = None) -> dict:
    """Describe a packed dataset (``shardfeed inspect``).

    Args:
        path_or_url: the dataset directory, its ``manifest.json``, or their HTTP URL.
        count_classes_from_data: read the labels to count samples per class; None: yes for a
            local dataset, no for a URL (that would download every shard).
        num_examples: sample keys with metadata to show (read from the first shard).
        max_shards_listed: shards listed one by one in the human summary beyond which they are
            summarised (the JSON report lists them all).
        progress: ``callback(num_samples, num_bytes)`` while counting classes.

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
    loc = DatasetLocation(path_or_url)
    manifest = loc.load_manifest(check_files=False)
    problems = []
    if not loc.url:
        try:
            from .format import check_files_present

            check_files_present(manifest, loc.root)
        except ManifestError as exc:
            problems.append(str(exc))
    if count_classes_from_data is None:
        count_classes_from_data = not loc.url
    counts = None
    if count_classes_from_data and not problems:
        counts = count_classes(loc, manifest, progress)
    classes = [{"index": i, "name": name, "count": (counts or {}).get(i, 0) if counts is not None else None}
               for name, i in sorted(manifest.class_to_idx.items(), key=lambda kv: kv[1])]
    if counts is not None:
        known = set(manifest.class_to_idx.values())
        for i in sorted(set(counts) - known):
            classes.append({"index": i, "name": None, "count": counts[i]})
    examples = []
    if num_examples > 0 and manifest.shards and not problems:
        try:
            for _, s in _first_samples(loc, manifest, num_examples):
                examples.append({"key": s.key, "ext": s.ext, "label": s.label,
                                 "class": manifest.classes[s.label] if 0 <= s.label < len(manifest.classes) else None,
                                 "num_bytes": len(s.data), "meta": s.meta})
        except (CorruptDataError, OSError) as exc:
            problems.append(f"cannot read example samples: {exc}")
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


def _first_samples(loc: DatasetLocation, manifest: Manifest, n: int) -> Iterator[tuple[str, Sample]]:
    it = iter_raw_samples(loc, manifest)
    try:
        for i, item in enumerate(it):
            if i >= n:
                break
            yield item
    finally:
        it.close()


def format_inspect_report(report: dict) -> str:
    """The human-readable summary of an :func:`inspect_dataset` report (several lines)."""
    lines = [
        f"{report['source']}: {report['format']} dataset, manifest version {report['version']}, "
        f"created by {report['created_by']}",
        f"samples: {report['num_samples']:,} in {report['num_classes']} classes, "
        f"{report['num_shards']} "
        f"{'file' if report['format'] == 'lmdb' else ('shard' if report['num_shards'] == 1 else 'shards')}, "
        f"{report['shard_summary']['total_bytes'] / 1e6:,.1f} MB",
    ]
    exts = report.get("extensions")
    lines.append("image extensions: " + (", ".join(f"{e} ({n:,})" for e, n in exts.items()) if exts else
                                         "not recorded (manifest version 1: `shardfeed index` rewrites it)"))
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
    shards = report["shards"]
    limit = report.get("max_shards_listed", 10)
    lines.append("files:" if report["format"] == "lmdb" else "shards:")
    listed = shards if len(shards) <= limit else shards[: limit // 2] + [None] + shards[-(limit - limit // 2):]
    for s in listed:
        if s is None:
            ss = report["shard_summary"]
            lines.append(f"  ... {len(shards) - limit} more (all shards: {ss['min_samples']}-{ss['max_samples']} "
                         f"samples, {ss['min_bytes'] / 1e6:.1f}-{ss['max_bytes'] / 1e6:.1f} MB)")
            continue
        lines.append(f"  {s['name']:<28} {s['num_samples']:>8,} samples {s['num_bytes'] / 1e6:>10.1f} MB"
                     + ("" if s.get("index") or report["format"] == "lmdb" else "  (no offset index)"))
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
