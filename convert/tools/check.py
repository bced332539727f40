"""``shardfeed check``: prove a packed dataset is intact against its manifest.

Recompute every shard's sha256, size and sample count (and the offset index) against the
manifest; for LMDB every record's CRC-32 and the record count. Optionally decode every image.
Problems are collected (by shard and key), not raised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path

from shardfeed.readers.errors import CorruptDataError, ManifestError, ShardfeedError
from shardfeed.readers.format.manifest import LMDB_DATA_NAME, LMDB_MANIFEST_KEY, MANIFEST_NAME, Manifest, ShardEntry
from shardfeed.readers.format.offset_index import decode_index
from shardfeed.readers.format.registry import describe, resolve

from .common import (
    DatasetLocation,
    HashingReader,
    Progress,
    ProblemList,
    iter_lmdb_records,
    noop_progress,
    parts_to_sample,
    make_problem,
)
from .check_keys import KeyLedger

log = logging.getLogger(__name__)

__all__ = ["CheckReport", "check_dataset", "check_tar_shards", "check_lmdb_records"]

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
        files = "file" if not describe(self.format).sharded else ("shard" if self.num_shards == 1 else "shards")
        head = (f"{self.source}: {what} {self.num_samples_found:,} samples in {self.num_shards} {files} "
                f"({self.num_bytes / 1e6:,.1f} MB) in {self.seconds:.1f} s")
        if self.ok:
            return head + ": OK"
        bad = sorted({p["shard"] for p in self.problems if p["shard"]})
        return head + f": {len(self.problems)} problem(s) in {len(bad)} file(s): {', '.join(bad[:10])}"


def check_dataset(path_or_url: str | os.PathLike, *, decode: bool = False, progress: Progress | None = None,
                  max_problems_per_shard: int = 100, max_decode_bytes: int | None = 512 << 20,
                  storage_options: dict | None = None) -> CheckReport:
    """Check a packed dataset against its manifest, shard by shard and sample by sample.

    WebDataset: each shard's size, sha256 and sample count; its offset index's sha256 and that
    its offsets are the samples' header offsets; each sample's members (an image, a readable
    ``.cls`` in range, readable ``.json``); keys unique across shards. LMDB: every record's
    CRC-32 (:func:`~shardfeed.readers.format.manifest.decode_record`), its key, label and the record
    count; the DB's stored manifest against ``manifest.json``. With ``decode`` every image is
    decoded (:func:`shardfeed.readers.decode.image.decode_image`).

    Args:
        path_or_url: the dataset directory or manifest (WebDataset also over HTTP).
        decode: decode every image.
        max_decode_bytes: with ``decode``, an image whose decode would take more memory than this
            (bytes, read from its header; the readers' default, 512 MiB; None: unchecked) is a
            problem, reported without decoding it.
        progress: ``callback(num_samples, num_bytes)``.
        max_problems_per_shard: per-sample problems recorded per shard before the rest are
            summarised in one line.
        storage_options: storage client options for a remote location (``s3://``: see
            :mod:`shardfeed.readers.storage.objstore`); None: the storage's defaults.

    Returns:
        A :class:`CheckReport`; ``report.ok`` is False when anything is wrong.

    Raises:
        ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: there is no
            readable manifest (nothing to check against).
    """
    t0 = time.perf_counter()
    loc = DatasetLocation(path_or_url, storage_options=storage_options)
    manifest = loc.load_manifest(check_files=False)
    report = CheckReport(source=str(loc.root), format=manifest.format, num_samples_expected=manifest.num_samples,
                         decoded=decode)
    progress = progress or noop_progress
    checker = describe(manifest.format).checker
    checker = resolve(checker) if checker is not None else check_tar_shards
    checker(loc, manifest, report, decode, progress, max_problems_per_shard, max_decode_bytes)
    if report.num_samples_found != manifest.num_samples and not any(p["key"] is None for p in report.problems):
        report.problems.append(make_problem(None, None, f"found {report.num_samples_found} samples, the manifest says "
                                                    f"{manifest.num_samples}"))
    report.seconds = time.perf_counter() - t0
    return report


def _decode_problem(data: bytes, ext: str, source: str, max_decode_bytes: int | None = 512 << 20) -> str | None:
    from shardfeed.readers.decode.image import decode_image

    try:
        decode_image(data, ext, source=source, max_decode_bytes=max_decode_bytes)
    except (ShardfeedError, ValueError, OSError) as exc:
        return f"does not decode: {exc}"
    return None



def check_tar_shards(loc: DatasetLocation, manifest: Manifest, report: CheckReport, decode: bool,
                     progress: Progress, limit: int, max_decode_bytes: int | None = 512 << 20) -> None:
    """The checker of a tar-sharded format (the registry's ``checker`` of WebDataset): every shard of
    ``manifest`` read, its members grouped, labels, keys and offset index checked, each shard's sha256
    recorded, problems added to ``report`` (at most ``limit`` per shard)."""
    seen = KeyLedger(lambda i: _shard_keys(loc, manifest, manifest.shards[i]))
    for shard in manifest.shards:
        _check_wds_shard(loc, manifest, shard, report, decode, progress, seen, limit, max_decode_bytes)


def _left_out(manifest: Manifest, shard: ShardEntry) -> set:
    """Keys of groups `shardfeed index` reported and left out of the shard's index."""
    return {item.get("key") for item in manifest.skipped if item.get("shard") == shard.name}


def _shard_keys(loc: DatasetLocation, manifest: Manifest, shard: ShardEntry):
    """The keys of ``shard`` as its check counted them (read again; a damaged shard's up to the damage)."""
    from shardfeed.readers.format.tario import iter_members, iter_samples

    where, left_out = loc.where(shard.name), _left_out(manifest, shard)
    try:
        stream, _ = loc.open(shard.name)
    except FileNotFoundError:
        return
    with stream:
        try:
            for key, _, _ in iter_samples(iter_members(stream, source=where), source=where):
                if key not in left_out:
                    yield key
        except (CorruptDataError, OSError):
            return


def _check_wds_shard(loc: DatasetLocation, manifest: Manifest, shard: ShardEntry, report: CheckReport,
                     decode: bool, progress: Progress, seen: KeyLedger, limit: int,
                     max_decode_bytes: int | None = 512 << 20) -> None:
    from shardfeed.readers.format.tario import iter_members, iter_samples

    seen.start_shard(shard.name)
    where = loc.where(shard.name)
    probs = ProblemList(report, shard.name, limit)
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
    left_out = _left_out(manifest, shard)
    with stream:
        reader = HashingReader(stream)
        try:
            for key, parts, offset in iter_samples(iter_members(reader, source=where), source=where):
                if key in left_out:
                    continue  # a group `shardfeed index` reported and left out of the index
                offsets.append(offset)
                status["num_samples"] += 1
                report.num_samples_found += 1
                other = seen.add(key)
                if other is not None:
                    probs.add(key, f"key {key!r} also in {other}; keys must be unique")
                try:
                    s = parts_to_sample(key, parts, source=where, class_to_idx=manifest.class_to_idx,
                                        labelled=manifest.labelled)
                except CorruptDataError as exc:
                    probs.add(key, str(exc))
                    continue
                if not 0 <= s.label < n_classes and manifest.labelled:
                    probs.add(key, f"label {s.label} is outside the {n_classes} classes of the manifest")
                if not manifest.labelled and "cls" in parts:
                    probs.add(key, "a label (.cls member) in an unlabelled dataset")
                if decode:
                    msg = _decode_problem(s.data, s.ext, f"{where} key {key}", max_decode_bytes)
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


def _check_index(loc: DatasetLocation, shard: ShardEntry, offsets: list[int], probs: ProblemList,
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


def check_lmdb_records(loc: DatasetLocation, manifest: Manifest, report: CheckReport, decode: bool,
                       progress: Progress, limit: int, max_decode_bytes: int | None = 512 << 20) -> None:
    """The checker of LMDB (the registry's ``checker``): every record's CRC-32, fields, key and label,
    the record count and the manifest stored in the database, against ``manifest``.

    Raises:
        ManifestError: ``loc`` is a URL (LMDB is checked on a local disk).
    """
    if loc.remote:
        raise ManifestError(f"{loc.root}: an LMDB dataset cannot be checked over HTTP; stage it locally first")
    name = manifest.shards[0].name if manifest.shards else LMDB_DATA_NAME
    probs = ProblemList(report, name, limit)
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
            if manifest.labelled and not 0 <= rec["label"] < n_classes:
                probs.add(key, f"label {rec['label']} is outside the {n_classes} classes of the manifest")
            elif not manifest.labelled and rec["label"] != -1:
                probs.add(key, f"label {rec['label']} in an unlabelled dataset (labels are -1)")
            if decode:
                msg = _decode_problem(rec["data"], rec["ext"], f"{path} key {key}", max_decode_bytes)
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
    from shardfeed.readers.storage.lmdb_io import process_env

    with process_env(root).begin() as txn:  # the process's shared environment (not to be closed)
        raw = txn.get(LMDB_MANIFEST_KEY)
    if raw is None:
        return None
    try:
        return json.loads(bytes(raw))
    except ValueError:
        return {}

