"""Dataset tools: check, unpack, convert, stage and index packed datasets.

Each function here does the work of one ``shardfeed`` command and returns a report object
(``to_json()`` for ``--json``, ``summary()`` for the human line); only the CLI prints.

* :func:`check_dataset` — recompute every shard's sha256, size and sample count (and the offset
  index) against the manifest; for LMDB every record's CRC-32 and the record count. Optionally
  decode every image. Problems are collected (by shard and key), not raised.
* :func:`unpack` — write the ImageFolder back from each sample's ``meta["path"]``, byte for byte.
* :func:`convert_dataset` — WebDataset ↔ LMDB and re-sharding, keeping keys, labels, metadata,
  bytes and the class map; an image folder as the source is the same as ``pack``.
* :func:`stage` — copy a dataset (local or HTTP) to fast local storage with free-space checks,
  sha256 verification, atomic renames and resume.
* :func:`index_shards` — write a manifest and ``.idx`` offset files for WebDataset shards made
  by other tools (webdataset's ``ShardWriter``, ``tarp``, ``tar``).

None of these import torch or webdataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import time
import urllib.parse
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable

from shardfeed.readers.errors import CorruptDataError, DataSourceError, ManifestError, ShardfeedError
from shardfeed.readers.format import (
    LMDB_DATA_NAME,
    LMDB_MANIFEST_KEY,
    INDEX_SUFFIX,
    MANIFEST_NAME,
    TAR_BLOCK,
    Manifest,
    ShardEntry,
    created_by,
    decode_index,
    normalize_ext,
    encode_index,
    write_bytes_atomic,
)
from shardfeed.readers.inspect import (
    DatasetLocation,
    is_url,
    iter_lmdb_records,
    iter_raw_samples,
    parts_to_sample,
)

__all__ = [
    "HashingReader",
    "CheckReport",
    "check_dataset",
    "UnpackReport",
    "unpack",
    "ConvertReport",
    "convert_dataset",
    "WRITERS",
    "StageReport",
    "stage",
    "default_min_free_bytes",
    "IndexReport",
    "index_shards",
    "expand_braces",
    "safe_relative_path",
    "looks_like_image_folder",
]

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
_COPY_CHUNK = 4 << 20


def _noop(n: int, b: int) -> None:
    pass


class HashingReader:
    """A read-only stream wrapper that feeds every byte read into sha256 and counts them.

    It reports itself as not seekable, so tar readers consume it strictly forward.
    """

    def __init__(self, stream: BinaryIO, on_bytes: Callable[[int], None] | None = None):
        self._s = stream
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0
        self._on_bytes = on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self._s.read(n)
        if data:
            self.sha256.update(data)
            self.num_bytes += len(data)
            if self._on_bytes:
                self._on_bytes(len(data))
        return data

    def seekable(self) -> bool:
        return False

    def drain(self) -> None:
        """Read (and hash) the rest of the stream."""
        while self.read(_COPY_CHUNK):
            pass

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


def _problem(shard: str | None, key: str | None, problem: str) -> dict:
    return {"shard": shard, "key": key, "problem": problem}


# =============================================================================================
# check

@dataclasses.dataclass
class CheckReport:
    """What :func:`check_dataset` found.

    Attributes:
        source: the dataset (path or URL).
        format: ``"webdataset"`` or ``"lmdb"``.
        num_samples_expected: the manifest's ``num_samples``.
        num_samples_found: samples (records) actually read.
        num_shards: files checked.
        num_bytes: bytes read.
        decoded: whether every image was decoded.
        problems: ``[{"shard", "key", "problem"}]`` (``key`` None for shard-level problems).
        shards: per file ``{"name", "ok", "num_samples", "num_bytes", "sha256"}``.
        seconds: wall time.
    """

    source: str
    format: str
    num_samples_expected: int
    num_samples_found: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    decoded: bool = False
    problems: list = dataclasses.field(default_factory=list)
    shards: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["ok"] = self.ok
        return d

    def summary(self) -> str:
        what = "decoded and checked" if self.decoded else "checked"
        files = "file" if self.format == "lmdb" else ("shard" if self.num_shards == 1 else "shards")
        head = (f"{self.source}: {what} {self.num_samples_found:,} samples in {self.num_shards} {files} "
                f"({self.num_bytes / 1e6:,.1f} MB) in {self.seconds:.1f} s")
        if self.ok:
            return head + ": OK"
        bad = sorted({p["shard"] for p in self.problems if p["shard"]})
        return head + f": {len(self.problems)} problem(s) in {len(bad)} file(s): {', '.join(bad[:10])}"


def check_dataset(path_or_url: str | os.PathLike, *, decode: bool = False, progress: Progress | None = None,
                  max_problems_per_shard: int = 100) -> CheckReport:
    """Check a packed dataset against its manifest, shard by shard and sample by sample.

    WebDataset: each shard's size, sha256 and sample count; its offset index's sha256 and that
    its offsets are the samples' header offsets; each sample's members (an image, a readable
    ``.cls`` in range, readable ``.json``); keys unique across shards. LMDB: every record's
    CRC-32 (:func:`~shardfeed.readers.format.decode_record`), its key, label and the record
    count; the DB's stored manifest against ``manifest.json``. With ``decode`` every image is
    decoded (:func:`shardfeed.readers.decode.decode_image`).

    Args:
        path_or_url: the dataset directory or manifest (WebDataset also over HTTP).
        decode: decode every image.
        progress: ``callback(num_samples, num_bytes)``.
        max_problems_per_shard: per-sample problems recorded per shard before the rest are
            summarised in one line.

    Returns:
        A :class:`CheckReport`; ``report.ok`` is False when anything is wrong.

    Raises:
        ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: there is no
            readable manifest (nothing to check against).
    """
    t0 = time.perf_counter()
    loc = DatasetLocation(path_or_url)
    manifest = loc.load_manifest(check_files=False)
    report = CheckReport(source=str(loc.root), format=manifest.format, num_samples_expected=manifest.num_samples,
                         decoded=decode)
    progress = progress or _noop
    if manifest.format == "lmdb":
        _check_lmdb(loc, manifest, report, decode, progress, max_problems_per_shard)
    else:
        seen: dict[str, str] = {}
        for shard in manifest.shards:
            _check_wds_shard(loc, manifest, shard, report, decode, progress, seen, max_problems_per_shard)
    if report.num_samples_found != manifest.num_samples and not any(p["key"] is None for p in report.problems):
        report.problems.append(_problem(None, None, f"found {report.num_samples_found} samples, the manifest says "
                                                    f"{manifest.num_samples}"))
    report.seconds = time.perf_counter() - t0
    return report


def _decode_problem(data: bytes, ext: str, source: str) -> str | None:
    from shardfeed.readers.decode import decode_image

    try:
        decode_image(data, ext, source=source)
    except (ShardfeedError, ValueError, OSError) as exc:
        return f"does not decode: {exc}"
    return None


class _ProblemList:
    def __init__(self, report: CheckReport, shard: str, limit: int):
        self.report, self.shard, self.limit, self.count = report, shard, limit, 0

    def add(self, key: str | None, problem: str) -> None:
        self.count += 1
        if key is None or self.count <= self.limit:
            self.report.problems.append(_problem(self.shard, key, problem))

    def finish(self) -> None:
        if self.count > self.limit:
            self.report.problems.append(_problem(self.shard, None, f"... and {self.count - self.limit} more "
                                                                   "sample problems in this shard"))


def _check_wds_shard(loc: DatasetLocation, manifest: Manifest, shard: ShardEntry, report: CheckReport,
                     decode: bool, progress: Progress, seen: dict[str, str], limit: int) -> None:
    from shardfeed.readers.tario import iter_members, iter_samples

    where = loc.where(shard.name)
    probs = _ProblemList(report, shard.name, limit)
    report.num_shards += 1
    status = {"name": shard.name, "ok": False, "num_samples": 0, "num_bytes": 0, "sha256": None}
    report.shards.append(status)
    try:
        stream, _ = loc.open(shard.name)
    except FileNotFoundError:
        probs.add(None, f"{where}: missing (listed in {MANIFEST_NAME}); restore it or repack")
        return
    offsets: list[int] = []
    n_classes = len(manifest.classes)
    left_out = {item.get("key") for item in manifest.skipped if item.get("shard") == shard.name}
    with stream:
        reader = HashingReader(stream)
        try:
            for key, parts, offset in iter_samples(iter_members(reader, source=where), source=where):
                if key in left_out:
                    continue  # a group `shardfeed index` reported and left out of the index
                offsets.append(offset)
                status["num_samples"] += 1
                report.num_samples_found += 1
                if key in seen:
                    probs.add(key, f"key {key!r} also in {seen[key]}; keys must be unique")
                seen.setdefault(key, shard.name)
                try:
                    s = parts_to_sample(key, parts, source=where, class_to_idx=manifest.class_to_idx)
                except CorruptDataError as exc:
                    probs.add(key, str(exc))
                    continue
                if not 0 <= s.label < n_classes:
                    probs.add(key, f"label {s.label} is outside the {n_classes} classes of the manifest")
                if decode:
                    msg = _decode_problem(s.data, s.ext, f"{where} key {key}")
                    if msg:
                        path = s.meta.get("path") if isinstance(s.meta, dict) else None
                        probs.add(key, f"{msg} (original file {path})" if path else msg)
                progress(1, len(s.data))
        except CorruptDataError as exc:
            probs.add(None, str(exc))
        try:
            reader.drain()
        except OSError as exc:
            probs.add(None, f"{where}: read failed ({exc})")
    status["num_bytes"] = reader.num_bytes
    status["sha256"] = reader.hexdigest()
    report.num_bytes += reader.num_bytes
    if reader.num_bytes != shard.num_bytes:
        probs.add(None, f"{where}: {reader.num_bytes} bytes, the manifest says {shard.num_bytes} (changed or "
                        "truncated)")
    if shard.sha256 and status["sha256"] != shard.sha256:
        probs.add(None, f"{where}: sha256 {status['sha256'][:16]}... differs from the manifest's "
                        f"{shard.sha256[:16]}...: the shard's bytes changed since it was packed")
    if status["num_samples"] != shard.num_samples:
        probs.add(None, f"{where}: {status['num_samples']} samples, the manifest says {shard.num_samples}")
    if shard.index:
        # when the shard itself changed, the index is not what to rebuild
        _check_index(loc, shard, offsets, probs, shard_intact=status["sha256"] == shard.sha256 or not shard.sha256)
    probs.finish()
    status["ok"] = probs.count == 0


def _check_index(loc: DatasetLocation, shard: ShardEntry, offsets: list[int], probs: _ProblemList,
                 shard_intact: bool = True) -> None:
    where = loc.where(shard.index)
    try:
        data = loc.read_bytes(shard.index)
    except FileNotFoundError:
        probs.add(None, f"{where}: offset index missing; rebuild it with `shardfeed index`")
        return
    if shard.index_sha256 and hashlib.sha256(data).hexdigest() != shard.index_sha256:
        probs.add(None, f"{where}: sha256 differs from the manifest's index_sha256 (the index changed)")
    try:
        idx = decode_index(data, where)
    except CorruptDataError as exc:
        probs.add(None, str(exc))
        return
    if idx != offsets:
        bad = next((i for i, (a, b) in enumerate(zip(idx, offsets)) if a != b), min(len(idx), len(offsets)))
        fix = ("rebuild it with `shardfeed index`" if shard_intact else
               "the shard itself changed (above): repack it, or restore it from a copy")
        probs.add(None, f"{where}: offset index disagrees with the shard from sample {bad} on "
                        f"({len(idx)} offsets, {len(offsets)} samples); {fix}")


def _check_lmdb(loc: DatasetLocation, manifest: Manifest, report: CheckReport, decode: bool, progress: Progress,
                limit: int) -> None:
    if loc.url:
        raise ManifestError(f"{loc.root}: an LMDB dataset cannot be checked over HTTP; stage it locally first")
    name = manifest.shards[0].name if manifest.shards else LMDB_DATA_NAME
    probs = _ProblemList(report, name, limit)
    report.num_shards = 1
    path = loc.root / name
    status = {"name": name, "ok": False, "num_samples": 0, "num_bytes": 0, "sha256": None}
    report.shards.append(status)
    if not path.exists():
        probs.add(None, f"{path}: missing (listed in {MANIFEST_NAME}); restore it or repack")
        probs.finish()
        return
    n_classes = len(manifest.classes)
    try:
        for key, rec in iter_lmdb_records(loc.root, verify=True):
            status["num_samples"] += 1
            report.num_samples_found += 1
            if isinstance(rec, Exception):
                probs.add(key, str(rec))
                continue
            missing = [f for f in ("data", "ext", "label", "meta") if f not in rec]
            if missing or not isinstance(rec["label"], int) or not isinstance(rec["data"], bytes):
                what = f"no field(s) {', '.join(missing)}" if missing else "a field of the wrong type"
                probs.add(key, f"{path} key {key}: damaged record ({what})")
                continue
            status["num_bytes"] += len(rec["data"])
            if rec.get("key") != key:
                probs.add(key, f"record says key {rec.get('key')!r}, stored under {key!r}")
            if not 0 <= rec["label"] < n_classes:
                probs.add(key, f"label {rec['label']} is outside the {n_classes} classes of the manifest")
            if decode:
                msg = _decode_problem(rec["data"], rec["ext"], f"{path} key {key}")
                if msg:
                    orig = rec["meta"].get("path") if isinstance(rec["meta"], dict) else None
                    probs.add(key, f"{msg} (original file {orig})" if orig else msg)
            progress(1, len(rec["data"]))
    except (ShardfeedError, OSError) as exc:
        probs.add(None, f"{path}: cannot read the database ({exc})")
    report.num_bytes += path.stat().st_size
    if status["num_samples"] != manifest.num_samples:
        probs.add(None, f"{path}: {status['num_samples']} records, the manifest says {manifest.num_samples}")
    stored = _lmdb_stored_manifest(loc.root)
    if stored is None:
        probs.add(None, f"{path}: no stored manifest under {LMDB_MANIFEST_KEY.decode()}")
    elif (stored.get("classes") != manifest.classes or stored.get("num_samples") != manifest.num_samples
          or stored.get("class_to_idx") != manifest.class_to_idx):
        probs.add(None, f"{path}: the manifest stored in the database disagrees with {MANIFEST_NAME} "
                        "(classes or sample count): the two belong to different packs")
    probs.finish()
    status["ok"] = probs.count == 0


def _lmdb_stored_manifest(root: Path) -> dict | None:
    from shardfeed.readers.lmdb_io import process_env

    with process_env(root).begin() as txn:  # the process's shared environment (not to be closed)
        raw = txn.get(LMDB_MANIFEST_KEY)
    if raw is None:
        return None
    try:
        return json.loads(bytes(raw))
    except ValueError:
        return {}


# =============================================================================================
# unpack

_DRIVE_RE = re.compile(r"^[A-Za-z]:")


def safe_relative_path(rel: str, *, what: str) -> PurePosixPath:
    """Validate a stored relative path before writing it under an output folder.

    Raises:
        ValueError: empty, absolute (``/x``, ``C:x``, ``\\\\x``), or holding a ``..``, ``.`` or
            empty component, a backslash or a NUL — anything that could escape the output folder
            or mean something else on another system. The message names ``what``.
    """
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"{what}: empty path")
    if "\0" in rel or "\\" in rel:
        raise ValueError(f"{what}: path {rel!r} holds a backslash or NUL; refusing to write it")
    p = PurePosixPath(rel)
    if p.is_absolute() or _DRIVE_RE.match(rel):
        raise ValueError(f"{what}: path {rel!r} is absolute; refusing to write outside the output folder")
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{what}: path {rel!r} has a '..', '.' or empty component; refusing to write it "
                         "(it could escape the output folder)")
    return p


@dataclasses.dataclass
class UnpackReport:
    """What :func:`unpack` wrote.

    Attributes:
        source, output: the dataset and the image folder written.
        num_files: images written.
        num_bytes: their total size.
        num_classes: class folders created (empty classes included, so ImageFolder gives the same
            class indices).
        generated_paths: samples without ``meta["path"]`` written as ``CLASS/KEY.EXT``.
        renamed: samples whose stored format differs from their path's extension (re-encoded by
            ``pack --resize``/``--image-format``), written with the stored extension instead.
        label_mismatches: samples whose path's class folder is not their label's class
            (``[{"key", "path", "class"}]``; re-packing would label them by folder).
        skipped: the manifest's skipped files (not in the dataset, so not written).
        seconds: wall time.
    """

    source: str
    output: str
    num_files: int = 0
    num_bytes: int = 0
    num_classes: int = 0
    generated_paths: int = 0
    renamed: int = 0
    label_mismatches: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        s = (f"unpacked {self.num_files:,} images ({self.num_bytes / 1e6:,.1f} MB) in {self.num_classes} classes "
             f"into {self.output} in {self.seconds:.1f} s")
        if self.generated_paths:
            s += f"; {self.generated_paths} without a stored path named CLASS/KEY.EXT"
        if self.label_mismatches:
            s += f"; {len(self.label_mismatches)} in a folder other than their label's class"
        if self.skipped:
            s += f"; {len(self.skipped)} files were skipped at pack time and are not in the dataset"
        return s


def unpack(path_or_url: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False,
           progress: Progress | None = None) -> UnpackReport:
    """Write a packed dataset back as an ImageFolder, every image byte-identical to its original.

    Each sample goes to ``OUT/meta["path"]`` (its path relative to the packed folder); a sample
    without one goes to ``OUT/CLASS/KEY.EXT``. Every class of the manifest gets its folder, empty
    ones included, so ``ImageFolder(OUT)`` finds the same class indices.

    Args:
        path_or_url: the packed dataset (WebDataset also over HTTP).
        out: the folder to write; must be empty or missing unless ``overwrite``.
        overwrite: allow writing into a non-empty folder, replacing files of the same names.
        progress: ``callback(num_samples, num_bytes)``.

    Returns:
        An :class:`UnpackReport`.

    Raises:
        ValueError: OUT not empty; a stored path that is absolute or holds ``..`` (it would escape
            OUT); two samples with the same path; a class name that is not a plain folder name.
        CorruptDataError: a damaged shard or record.
        OSError: writing failed.
    """
    t0 = time.perf_counter()
    loc = DatasetLocation(path_or_url)
    manifest = loc.load_manifest(check_files=not loc.url)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is a file; choose a folder to unpack into")
    if not loc.url and out.resolve() == Path(loc.root).resolve():
        raise ValueError(f"{out}: is the packed dataset's own folder; choose another output folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out}: output folder is not empty; choose an empty folder or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    out_resolved = out.resolve()
    report = UnpackReport(source=str(loc.root), output=str(out), skipped=list(manifest.skipped))
    for c in manifest.classes:
        safe_relative_path(c, what=f"class name {c!r}")
        if "/" in c:
            raise ValueError(f"class name {c!r} holds a '/'; cannot make it a folder")
        (out / c).mkdir(exist_ok=True)
    report.num_classes = len(manifest.classes)
    progress = progress or _noop
    written: dict[str, str] = {}
    for shard_name, s in iter_raw_samples(loc, manifest):
        where = f"{loc.where(shard_name)} key {s.key}"
        cls_name = manifest.classes[s.label] if 0 <= s.label < len(manifest.classes) else str(s.label)
        rel = s.meta.get("path") if isinstance(s.meta, dict) else None
        if not isinstance(rel, str) or not rel:
            rel = f"{cls_name}/{s.key.replace('/', '_')}.{s.ext}"
            report.generated_paths += 1
        safe_relative_path(rel, what=where)
        stem, dot_ext = os.path.splitext(rel)
        if s.ext and normalize_ext(dot_ext) != s.ext:  # re-encoded (e.g. --resize made a PNG a JPEG)
            rel = f"{stem}.{s.ext}"
            report.renamed += 1
        if rel in written:
            raise ValueError(f"{where}: path {rel!r} was already written for key {written[rel]}; two samples "
                             "cannot be unpacked to the same file")
        written[rel] = s.key
        if rel.split("/", 1)[0] != cls_name:
            report.label_mismatches.append({"key": s.key, "path": rel, "class": cls_name})
        dest = out / rel
        parent = dest.parent.resolve()
        if parent != out_resolved and out_resolved not in parent.parents:
            raise ValueError(f"{where}: path {rel!r} leads outside {out} (through a symlink); refusing to write it")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and not overwrite:
            raise ValueError(f"{dest}: exists already; pass --overwrite to replace it")
        tmp = dest.with_name(f".{dest.name}.unpack.tmp")
        with open(tmp, "wb") as f:
            f.write(s.data)
        os.replace(tmp, dest)
        report.num_files += 1
        report.num_bytes += len(s.data)
        progress(1, len(s.data))
    report.seconds = time.perf_counter() - t0
    return report


# =============================================================================================
# convert

def _lmdb_writer(out, *, classes, class_to_idx, max_count, max_bytes, prefix, skipped, options, files,
                 map_size=None, expected_bytes=None):
    from .lmdb_writer import LmdbWriter

    writer = LmdbWriter(out, classes=classes, class_to_idx=class_to_idx, options=options, map_size=map_size,
                        expected_bytes=expected_bytes)
    for item in skipped or []:
        writer.add_skipped(item.get("path", "?"), item.get("key"), item.get("reason", "?"))
    return writer


def _wds_writer(out, *, classes, class_to_idx, max_count, max_bytes, prefix, skipped, options, files,
                map_size=None, expected_bytes=None):
    from .webdataset_writer import WebDatasetWriter

    return WebDatasetWriter(out, classes=classes, class_to_idx=class_to_idx, max_count=max_count,
                            max_bytes=max_bytes, prefix=prefix, skipped=skipped, options=options, files=files)


#: Writers by canonical format name: ``factory(out, *, classes, class_to_idx, max_count, max_bytes,
#: prefix, skipped, options, files, map_size, expected_bytes) -> Writer`` (``write(sample)``,
#: ``close() -> Manifest``, context manager).
WRITERS: dict[str, Callable] = {"webdataset": _wds_writer, "lmdb": _lmdb_writer}


@dataclasses.dataclass
class ConvertReport:
    """What :func:`convert_dataset` did.

    Attributes:
        source, output: the datasets.
        source_format, format: their formats (``"imagefolder"`` for a folder source, which is packed).
        num_samples, num_shards, num_bytes: the output's samples, files and bytes.
        seconds: wall time.
        pack: the :class:`~shardfeed.convert.pack.PackReport` as JSON for a folder source.
    """

    source: str
    output: str
    source_format: str
    format: str
    num_samples: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    pack: dict | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        mb = self.num_bytes / 1e6
        return (f"converted {self.source} ({self.source_format}) to {self.output} ({self.format}): "
                f"{self.num_samples:,} samples in {self.num_shards} "
                f"{'file' if self.format == 'lmdb' else ('shard' if self.num_shards == 1 else 'shards')}, "
                f"{mb:,.1f} MB in {self.seconds:.1f} s")


def looks_like_image_folder(path: str | os.PathLike) -> bool:
    """True for a local folder without ``manifest.json``, shards or ``data.mdb``, with sub-folders."""
    p = Path(path)
    if not p.is_dir() or (p / MANIFEST_NAME).exists() or (p / LMDB_DATA_NAME).exists():
        return False
    if any(p.glob("*.tar")) or any(p.glob(".shardfeed-*")):
        return False
    return any(e.is_dir() and not e.name.startswith(".") for e in p.iterdir())


def convert_dataset(src: str | os.PathLike, out: str | os.PathLike, *, format: str, max_count: int = 10000,
                    max_bytes: int = 256_000_000, prefix: str = "shard", workers: int | None = None,
                    overwrite: bool = False, map_size: int | None = None,
                    progress: Progress | None = None) -> ConvertReport:
    """Convert a dataset to ``format`` (WebDataset ↔ LMDB, or re-shard), without re-encoding.

    Samples are copied in storage order with their keys, labels, metadata and bytes unchanged;
    the manifest's class map, skipped list and input accounting are carried over. A plain image
    folder as ``src`` is packed exactly as ``shardfeed pack`` would (default seed and shuffle).

    Args:
        src: a packed dataset (directory, manifest, or HTTP URL of a WebDataset) or an image folder.
        out: the output folder (missing or empty, unless ``overwrite``).
        format: ``"wds"``/``"webdataset"`` or ``"lmdb"``.
        max_count, max_bytes, prefix: WebDataset shard limits (samples, bytes on disk) and prefix.
        workers: processes for a folder source (pack); conversion itself is sequential.
        overwrite: replace a dataset in OUT (only files shardfeed writes).
        map_size: LMDB initial map size, bytes (grows as needed).
        progress: ``callback(num_samples, num_bytes)``.

    Returns:
        A :class:`ConvertReport`.

    Raises:
        ValueError: unknown format, OUT not empty or inside SRC, a sample larger than ``max_bytes``.
        ManifestError, CorruptDataError, DataSourceError: the source cannot be read.
    """
    from .pack import FORMAT_ALIASES, PackOptions, pack, prepare_output

    t0 = time.perf_counter()
    fmt = FORMAT_ALIASES.get(str(format).lower())
    if fmt is None:
        raise ValueError(f"unknown format {format!r}: choose one of wds (webdataset), lmdb")
    out = Path(out)
    if not is_url(str(src)) and looks_like_image_folder(src):
        options = PackOptions(format=fmt, max_count=max_count, max_bytes=max_bytes, prefix=prefix,
                              workers=workers, overwrite=overwrite, map_size=map_size)
        pr = pack(src, out, options, progress=progress)
        return ConvertReport(source=str(src), output=str(out), source_format="imagefolder", format=fmt,
                             num_samples=pr.num_samples, num_shards=pr.num_shards, num_bytes=pr.num_bytes,
                             seconds=time.perf_counter() - t0, pack=pr.to_json())
    loc = DatasetLocation(src)
    manifest = loc.load_manifest(check_files=not loc.url)
    # a URL source cannot contain OUT: compare OUT with a path that cannot be its parent
    src_root = Path("/nonexistent-url-source") if loc.url else Path(loc.root)
    prepare_output(src_root, out, resume=False, overwrite=overwrite)
    progress = progress or _noop
    options = {**{k: v for k, v in manifest.options.items() if k not in ("max_count", "max_bytes", "prefix")},
               "converted_from": str(src), "source_format": manifest.format, "source_created_by": manifest.created_by}
    writer = WRITERS[fmt](out, classes=manifest.classes, class_to_idx=manifest.class_to_idx, max_count=max_count,
                          max_bytes=max_bytes, prefix=prefix, skipped=manifest.skipped, options=options,
                          files=manifest.files, map_size=map_size,
                          expected_bytes=sum(s.num_bytes for s in manifest.shards))
    n = 0
    with writer:
        for _, sample in iter_raw_samples(loc, manifest):
            writer.write(sample)
            n += 1
            progress(1, len(sample.data))
        new = writer.close()
    if n != manifest.num_samples:
        log.warning("%s: read %d samples, its manifest says %d", loc.root, n, manifest.num_samples)
    return ConvertReport(source=str(src), output=str(out), source_format=manifest.format, format=fmt,
                         num_samples=new.num_samples, num_shards=len(new.shards),
                         num_bytes=sum(s.num_bytes for s in new.shards), seconds=time.perf_counter() - t0)


# =============================================================================================
# stage

_MEMORY_FS = ("tmpfs", "ramfs")
_GB = 1_000_000_000


def _fs_type(path: Path) -> str:
    """The file-system type of the mount holding ``path`` (from /proc/mounts; ``""`` if unknown)."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    target = str(path.resolve())
    best, best_len = "", -1
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best_len:
            best, best_len = parts[2], len(mnt)
    return best


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_min_free_bytes(dest: str | os.PathLike) -> int:
    """Bytes ``stage`` leaves free on DEST's file system by default.

    Disk: 1 GB + 2 % of the file system. Memory file systems (``tmpfs``/``ramfs``, e.g.
    ``/dev/shm``), whose pages are RAM the training job needs: 1 GB + 10 % of their size.
    """
    dest = Path(dest)
    probe = dest if dest.exists() else next((p for p in dest.parents if p.exists()), Path("/"))
    st = os.statvfs(probe)
    total = st.f_blocks * st.f_frsize
    share = 0.10 if _fs_type(probe) in _MEMORY_FS else 0.02
    return _GB + int(share * total)


@dataclasses.dataclass
class StageReport:
    """What :func:`stage` did.

    Attributes:
        source: the dataset staged (path or URL).
        path: the staged dataset's directory (absolute): hand it to the reader.
        ok: every file verified and the manifest written.
        copied: files copied in full; resumed: files whose partial copy was continued;
        skipped: files already staged and intact.
        bytes_copied: bytes transferred this run.
        free_bytes_before, min_free_bytes: free space on DEST before, and what is kept free.
        problems: ``[{"shard", "key", "problem"}]`` (mismatches, missing sources).
        seconds: wall time.
    """

    source: str
    path: str
    ok: bool = False
    copied: list = dataclasses.field(default_factory=list)
    resumed: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    bytes_copied: int = 0
    free_bytes_before: int = 0
    min_free_bytes: int = 0
    problems: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_copied / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["mb_per_s"] = round(self.mb_per_s, 1)
        return d

    def summary(self) -> str:
        s = (f"staged {self.source} -> {self.path}: {len(self.copied)} copied, {len(self.resumed)} resumed, "
             f"{len(self.skipped)} already intact; {self.bytes_copied / 1e6:,.1f} MB in {self.seconds:.1f} s "
             f"({self.mb_per_s:,.0f} MB/s)")
        if not self.ok:
            s += f"; {len(self.problems)} problem(s): NOT staged"
        return s


@dataclasses.dataclass
class _StageFile:
    name: str
    num_bytes: int | None
    sha256: str | None


def _stage_files(manifest: Manifest) -> list[_StageFile]:
    files = []
    for s in manifest.shards:
        files.append(_StageFile(s.name, s.num_bytes, s.sha256))
        if s.index:
            files.append(_StageFile(s.index, 8 * s.num_samples, s.index_sha256))
    return files


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_COPY_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def stage(src: str | os.PathLike, dest: str | os.PathLike, *, min_free_bytes: int | None = None,
          progress: Progress | None = None, retries: int | None = None) -> StageReport:
    """Copy a packed dataset to fast local storage, verified, resumable.

    Steps: read the source manifest; plan the files (shards, offset indexes, or ``data.mdb``);
    keep those already in DEST with the right size and sha256 (a file without a hash in the
    manifest, i.e. LMDB's ``data.mdb``, is kept only when DEST already holds this very manifest
    and every record passes its CRC-32); check free space for the rest, leaving
    ``min_free_bytes`` free (and, on a memory file system, also that much RAM available); copy
    each file to ``.NAME.stage.tmp``, hashing as it goes, continuing a partial temporary file
    from where it stopped (an HTTP ``Range`` request; from the start when the server ignores
    it), verify sha256 and size, rename into place; write ``manifest.json`` last (removed first
    while files are missing, so DEST is never a half-staged dataset that looks finished).

    Args:
        src: the dataset (directory, manifest path, or HTTP URL).
        dest: the local directory to stage into (created).
        min_free_bytes: bytes to keep free on DEST's file system; None:
            :func:`default_min_free_bytes`.
        progress: ``callback(num_files_done, num_bytes)``.
        retries: HTTP retries per request after the first attempt (a transfer that breaks resumes at
            the byte where it stopped); None: the readers' default.

    Returns:
        A :class:`StageReport`; ``ok`` False on any mismatch (the manifest is then not written).

    Raises:
        ValueError: not enough free space (nothing is copied), DEST is the source, or a manifest
            file name that would escape DEST.
        ManifestError, FileNotFoundError, DataSourceError: the source manifest cannot be read.
        OSError: writing to DEST failed (disk full, permissions).
    """
    t0 = time.perf_counter()
    progress = progress or _noop
    loc = DatasetLocation(src, retries=retries)
    manifest_bytes = loc.read_manifest_bytes()
    manifest = Manifest.from_json(manifest_bytes, loc.manifest_source)
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"{dest}: exists and is a file; choose a folder to stage into")
    if not loc.url and dest.exists() and dest.resolve() == Path(loc.root).resolve():
        raise ValueError(f"{dest}: is the source dataset itself; choose another folder")
    files = _stage_files(manifest)
    for f in files:
        safe_relative_path(f.name, what=f"{loc.manifest_source}: file {f.name!r}")
    dest.mkdir(parents=True, exist_ok=True)
    report = StageReport(source=str(loc.root), path=str(dest.resolve()))
    dest_manifest = dest / MANIFEST_NAME
    same_manifest = dest_manifest.exists() and dest_manifest.read_bytes() == manifest_bytes

    todo: list[_StageFile] = []
    for f in files:
        final = dest / f.name
        if final.exists() and _intact(final, f, manifest, dest, same_manifest):
            report.skipped.append(f.name)
            progress(1 if f.name.endswith(".tar") or f.name == LMDB_DATA_NAME else 0, 0)
        else:
            todo.append(f)
    if todo and dest_manifest.exists():
        dest_manifest.unlink()  # DEST is incomplete until the manifest comes back, last

    st = os.statvfs(dest)
    free = st.f_bavail * st.f_frsize
    fs_type = _fs_type(dest)
    if fs_type in _MEMORY_FS:
        mem = _mem_available_bytes()
        if mem is not None:
            free = min(free, mem)
    keep = default_min_free_bytes(dest) if min_free_bytes is None else int(min_free_bytes)
    report.free_bytes_before, report.min_free_bytes = free, keep
    need = 0
    for f in todo:
        tmp = dest / f".{f.name}.stage.tmp"
        partial = tmp.stat().st_size if tmp.exists() else 0
        need += max((f.num_bytes or 0) - partial, 0)
    if todo and free - need < keep:
        where = f"{dest} ({fs_type or 'unknown fs'})"
        raise ValueError(f"{where}: staging needs {need / 1e9:,.2f} GB more, {free / 1e9:,.2f} GB are free"
                         f"{' (RAM available included: this is a memory file system)' if fs_type in _MEMORY_FS else ''}"
                         f" and {keep / 1e9:,.2f} GB must stay free; free some space, choose another DEST, or "
                         "lower --min-free")

    for f in todo:
        try:
            status = _stage_one(loc, dest, f, progress)
        except (DataSourceError, FileNotFoundError) as exc:
            report.problems.append(_problem(f.name, None, str(exc)))
            continue
        status, nbytes = status
        report.bytes_copied += nbytes
        if status == "mismatch":
            report.problems.append(_problem(f.name, None, f"{loc.where(f.name)}: the copied bytes do not match the "
                                                          "manifest (sha256 or size); the source is damaged: run "
                                                          "`shardfeed check` on it"))
            continue
        (report.resumed if status == "resumed" else report.copied).append(f.name)
    if not report.problems:
        write_bytes_atomic(dest_manifest, manifest_bytes)
        from .consumers import write_consumer_files

        write_consumer_files(dest, manifest)  # wids' shardindex.json, the Hugging Face card: made from the copy
        report.ok = True
    report.seconds = time.perf_counter() - t0
    return report


def _intact(final: Path, f: _StageFile, manifest: Manifest, dest: Path, same_manifest: bool) -> bool:
    if f.num_bytes is not None and final.stat().st_size != f.num_bytes:
        return False
    if f.sha256:
        return _sha256_file(final) == f.sha256
    if not same_manifest:
        return False
    if manifest.format == "lmdb":
        # no file hash for an LMDB: trust it only if every record passes its CRC-32
        loc = DatasetLocation(dest)
        return all(not isinstance(rec, Exception) for _, rec in iter_lmdb_records(loc.root, verify=True))
    return True


def _stage_one(loc: DatasetLocation, dest: Path, f: _StageFile, progress: Progress) -> tuple[str, int]:
    """Copy one file; returns ("copied" | "resumed" | "mismatch", bytes transferred)."""
    final = dest / f.name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.stage.tmp")
    resumed = False
    transferred = 0
    for attempt in range(2):  # a resumed copy that fails verification is redone from scratch once
        start = tmp.stat().st_size if tmp.exists() else 0
        if f.num_bytes is not None and start > f.num_bytes:
            start = 0
        h = hashlib.sha256()
        if start:
            with open(tmp, "rb") as r:
                remaining = start
                while remaining:
                    chunk = r.read(min(_COPY_CHUNK, remaining))
                    if not chunk:
                        break
                    h.update(chunk)
                    remaining -= len(chunk)
            resumed = True
        transferred += _copy_stream(loc, f, tmp, start, h, progress)
        size = tmp.stat().st_size
        digest = h.hexdigest()
        ok = (f.num_bytes is None or size == f.num_bytes) and \
            (f.sha256 is None or digest == f.sha256)
        if ok and f.sha256 is None:
            ok = _sha256_file(tmp) == digest  # no reference hash: at least check what landed on disk
        if ok:
            os.replace(tmp, final)
            progress(1 if f.name.endswith(".tar") or f.name == LMDB_DATA_NAME else 0, 0)
            return ("resumed" if resumed and attempt == 0 else "copied"), transferred
        tmp.unlink(missing_ok=True)
        if not resumed:
            break
        resumed = False
        log.info("%s: resumed copy failed verification; copying it again from the start", f.name)
    return "mismatch", transferred


def _copy_stream(loc: DatasetLocation, f: _StageFile, tmp: Path, start: int, h, progress: Progress) -> int:
    """Write the source file from byte ``start`` into ``tmp`` (kept up to ``start``), hashing.

    Over HTTP the stream itself retries and resumes mid-file (``HttpLocation``); a server that
    ignores ``Range`` sends the file from byte 0 and the bytes before ``start`` are skipped.

    Returns:
        Bytes written.
    """
    from shardfeed.readers.tario import skip_stream

    written = 0
    with open(tmp, "r+b" if tmp.exists() else "wb") as out:
        out.seek(start)
        out.truncate()
        stream, offset = loc.open(f.name, start)
        with stream:
            if offset < start:
                skip_stream(stream, start - offset, source=loc.where(f.name))
            while True:
                chunk = stream.read(_COPY_CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                h.update(chunk)
                written += len(chunk)
                progress(0, len(chunk))
        out.flush()
        os.fsync(out.fileno())
    return written


# =============================================================================================
# index

#: gzip, bzip2, xz, zstd magic bytes.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")


class _Prepended:
    """A forward-only stream: ``head`` (bytes already read) followed by the rest of ``stream``."""

    def __init__(self, head: bytes, stream):
        self._head = head
        self._s = stream

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._s.read(n)
        if n is None or n < 0:
            data, self._head = self._head + self._s.read(), b""
            return data
        data, self._head = self._head[:n], self._head[n:]
        if len(data) < n:
            data += self._s.read(n - len(data))
        return data

    def seekable(self) -> bool:
        return False


def expand_braces(pattern: str) -> list[str]:
    """Expand WebDataset-style brace patterns: ``shard-{000000..000009}.tar``, ``{a,b}``.

    Numeric ranges keep the zero padding of their bounds; several groups expand as a product, in
    order.

    Raises:
        ValueError: an unbalanced brace or a range whose end is below its start.
    """
    start = pattern.find("{")
    if start < 0:
        if "}" in pattern:
            raise ValueError(f"pattern {pattern!r}: '}}' without '{{'")
        return [pattern]
    end = pattern.find("}", start)
    if end < 0:
        raise ValueError(f"pattern {pattern!r}: '{{' without '}}'")
    body = pattern[start + 1:end]
    head, tail = pattern[:start], pattern[end + 1:]
    m = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if m:
        a, b = m.groups()
        lo, hi = int(a), int(b)
        if hi < lo:
            raise ValueError(f"pattern {pattern!r}: range {{{a}..{b}}} runs backwards")
        width = len(a) if a.startswith("0") or b.startswith("0") else 0
        width = max(width, len(a)) if width else 0
        items = [str(i).zfill(width) for i in range(lo, hi + 1)]
    else:
        items = body.split(",")
    return [head + item + rest for item in items for rest in expand_braces(tail)]


@dataclasses.dataclass
class IndexReport:
    """What :func:`index_shards` wrote.

    Attributes:
        source: the pattern given.
        output: where the manifest and ``.idx`` files were written.
        num_samples: samples indexed; num_shards: shards; num_bytes: their total size.
        classes: the class names in the manifest.
        problems: ``[{"shard", "key", "problem"}]``: members that do not group into a sample
            (no image, no class, ...); those samples are left out of the counts and index.
        seconds: wall time.
    """

    source: str
    output: str
    num_samples: int = 0
    num_shards: int = 0
    num_bytes: int = 0
    classes: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        shards = "shard" if self.num_shards == 1 else "shards"
        s = (f"indexed {self.num_samples:,} samples in {self.num_shards} {shards} ({self.num_bytes / 1e6:,.1f} MB, "
             f"{len(self.classes)} classes); manifest and offset indexes in {self.output} ({self.seconds:.1f} s)")
        if self.problems:
            s += f"; {len(self.problems)} sample(s) left out (members that do not form a sample)"
        return s


def _list_shards(pattern: str) -> list[str]:
    if is_url(pattern):
        return expand_braces(pattern)
    p = Path(pattern)
    if p.is_dir():
        shards = sorted(str(x) for x in p.glob("*.tar"))
        if not shards:
            raise FileNotFoundError(f"{p}: no .tar files in this folder")
        return shards
    out = []
    for item in expand_braces(pattern):
        if any(c in item for c in "*?["):
            import glob

            out.extend(sorted(glob.glob(item)))
        else:
            out.append(item)
    if not out:
        raise FileNotFoundError(f"{pattern}: matches no file")
    missing = [x for x in out if not Path(x).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"{missing[0]}: no such shard{more}")
    return out


def _read_classes_file(path: str | os.PathLike) -> list[str]:
    names = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"{path}: no class names (one per line expected)")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{path}: class name {dup!r} appears twice")
    return names


def index_shards(pattern: str | os.PathLike, *, out: str | os.PathLike | None = None,
                 classes_file: str | os.PathLike | None = None, overwrite: bool = False,
                 progress: Progress | None = None) -> IndexReport:
    """Make existing WebDataset shards readable by shardfeed: write ``manifest.json`` and ``.idx`` files.

    Each shard is read once: its sha256 and size, and every sample (members grouped by key,
    WebDataset's rule) with the byte offset of its first header. A sample needs exactly one
    image member and a class: its ``.cls`` member (an integer), or the ``"class"`` name in its
    ``.json`` when ``classes_file`` names the classes. Groups that do not form such a sample are
    reported (by shard and key), listed in the manifest's ``skipped`` and left out of the counts
    and offset indexes. Class names come from ``classes_file`` (one per line, line ``i`` is class
    ``i``); without it, from the samples' ``.json`` ``"class"`` where present, else ``"0"``,
    ``"1"``, ...

    Args:
        pattern: a folder (its ``*.tar``), a path with globs or braces
            (``shards/train-{000000..000099}.tar``), or an ``http(s)://`` URL with braces.
        out: where to write the manifest and the ``.idx`` files; default the shards' folder.
            Required for URLs (then upload them beside the shards: the manifest names the shards
            by their file names, relative to its own folder).
        classes_file: a text file with one class name per line.
        overwrite: replace an existing ``manifest.json`` in ``out``.
        progress: ``callback(num_samples, num_bytes)``.

    Returns:
        An :class:`IndexReport`.

    Raises:
        ValueError: no samples at all, shards in different folders without ``out``, a URL without
            ``out``, a manifest already there, compressed shards, duplicate shard names.
        CorruptDataError: a shard is not a readable tar (bad header, truncated), or a key's
            members are not contiguous.
        FileNotFoundError, DataSourceError: a shard cannot be read.
    """
    from shardfeed.readers.tario import iter_members, iter_samples

    t0 = time.perf_counter()
    progress = progress or _noop
    sources = _list_shards(str(pattern))
    url = is_url(str(pattern))
    if url:
        if out is None:
            raise ValueError(f"{pattern}: shards on a web server need --out (a local folder for the manifest and "
                             "offset indexes, to upload beside the shards)")
        root = Path(out)
        names = [PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(s).path)).name for s in sources]
    else:
        parents = {str(Path(s).resolve().parent) for s in sources}
        if out is None:
            if len(parents) > 1:
                raise ValueError(f"{pattern}: shards lie in {len(parents)} folders; pass --out to choose where the "
                                 "manifest goes")
            root = Path(parents.pop())
        else:
            root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        names = [os.path.relpath(Path(s).resolve(), root.resolve()).replace(os.sep, "/") for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"{pattern}: two shards share a file name; index them separately")
    root.mkdir(parents=True, exist_ok=True)
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise ValueError(f"{root / MANIFEST_NAME}: exists already; pass --overwrite to replace it")
    classes = _read_classes_file(classes_file) if classes_file else None
    class_to_idx = {c: i for i, c in enumerate(classes)} if classes else None
    report = IndexReport(source=str(pattern), output=str(root))
    shards: list[ShardEntry] = []
    label_names: dict[int, str] = {}
    stems: set[str] = set()
    for source, name in zip(sources, names):
        stem = PurePosixPath(name).name
        stem = stem[:-4] if stem.endswith(".tar") else stem
        if stem in stems:
            raise ValueError(f"{source}: another shard has the same name {stem!r}; index them separately")
        stems.add(stem)
        idx_name = f"{stem}{INDEX_SUFFIX}"  # not .idx: DALI's wds2idx index of this shard keeps that name
        if url:
            from shardfeed.readers.http_io import HttpRangeStream

            stream = HttpRangeStream(source)
        else:
            stream = open(source, "rb")
        offsets: list[int] = []
        exts: dict[str, int] = {}
        with stream:
            reader = HashingReader(stream)
            head = reader.read(TAR_BLOCK)
            if head.startswith(_COMPRESSED_MAGIC):
                raise ValueError(f"{source}: a compressed tar; offset indexes need an uncompressed shard "
                                 "(decompress it first, e.g. `gunzip`)")
            members = iter_members(_Prepended(head, reader), source=source)
            for key, parts, offset in iter_samples(members, source=source):
                try:
                    s = parts_to_sample(key, parts, source=source, class_to_idx=class_to_idx)
                except CorruptDataError as exc:
                    msg = str(exc).split(": ", 1)[-1]
                    report.problems.append(_problem(name, key, msg))
                    continue
                if classes is not None and not 0 <= s.label < len(classes):
                    report.problems.append(_problem(name, key, f"class index {s.label} is outside the "
                                                               f"{len(classes)} classes of {classes_file}"))
                    continue
                if s.label < 0:
                    report.problems.append(_problem(name, key, f"negative class index {s.label}"))
                    continue
                if isinstance(s.meta.get("class"), str):
                    label_names.setdefault(s.label, s.meta["class"])
                label_names.setdefault(s.label, None)
                offsets.append(offset)
                exts[s.ext] = exts.get(s.ext, 0) + 1
                progress(1, len(s.data))
            reader.drain()
        index_bytes = encode_index(offsets)
        write_bytes_atomic(root / idx_name, index_bytes)
        shards.append(ShardEntry(name, len(offsets), reader.num_bytes, reader.hexdigest(), idx_name,
                                 hashlib.sha256(index_bytes).hexdigest(), dict(sorted(exts.items()))))
        report.num_bytes += reader.num_bytes
        log.info("%s: %d samples", source, len(offsets))
    n = sum(s.num_samples for s in shards)
    if n == 0:
        raise ValueError(f"{pattern}: no sample with an image and a class found in {len(shards)} shard(s)"
                         + (f"; first problem: {report.problems[0]['problem']}" if report.problems else ""))
    if classes is None:
        num = max(label_names) + 1
        classes = [label_names.get(i) or str(i) for i in range(num)]
        if len(set(classes)) != len(classes):
            classes = [str(i) for i in range(num)]
        class_to_idx = {c: i for i, c in enumerate(classes)}
    skipped = [{"path": f"{p['shard']}:{p['key']}", "shard": p["shard"], "key": p["key"], "reason": p["problem"]}
               for p in report.problems]
    manifest = Manifest(format="webdataset", num_samples=n, classes=classes, class_to_idx=class_to_idx,
                        shards=shards, skipped=skipped,
                        options={"indexed_from": str(pattern), "indexed_by": created_by()},
                        files={"indexed": n, "left_out": len(skipped)})
    manifest.write(root)
    if not url:  # beside local shards: wids' shardindex.json, the Hugging Face dataset card
        from .consumers import write_consumer_files

        write_consumer_files(root, manifest)
    report.num_samples, report.num_shards, report.classes = n, len(shards), classes
    report.seconds = time.perf_counter() - t0
    return report
