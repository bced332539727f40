"""The pieces every dataset tool shares: where a dataset is, and reading it in storage order.

:class:`DatasetLocation` (a dataset's :class:`~shardfeed.readers.storage.location.Location`, any storage, and its
manifest),
:func:`parts_to_sample` (WebDataset members -> a :class:`~shardfeed.readers.format.manifest.Sample`, by the
readers' one grouping rule), :func:`iter_raw_samples`, :class:`HashingReader`, the problem lists of
the reports and :func:`safe_relative_path`. None of this imports torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterator

from shardfeed.readers.errors import CorruptDataError, ManifestError
from shardfeed.readers.format.manifest import (
    LMDB_DATA_NAME,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    Manifest,
    Sample,
    decode_record,
    stored_path_problem,
)
from shardfeed.readers.format.offset_index import decode_index
from shardfeed.readers.format.sample_members import sample_from_members
from shardfeed.readers.storage import shard_cache
from shardfeed.readers.storage.http_io import MAX_MANIFEST_BYTES
from shardfeed.readers.format.registry import describe, resolve

from .. import writers  # noqa: F401  (registers each format's checker and record reader)

log = logging.getLogger(__name__)

__all__ = [
    "DatasetLocation",
    "is_url",
    "parts_to_sample",
    "iter_raw_samples",
    "iter_shard_samples",
    "iter_lmdb_records",
    "HashingReader",
    "Progress",
    "COPY_CHUNK_BYTES",
    "noop_progress",
    "make_problem",
    "ProblemList",
    "safe_relative_path",
    "looks_like_image_folder",
]

Progress = Callable[[int, int], None]
COPY_CHUNK_BYTES = shard_cache.COPY_CHUNK_BYTES  # one size for every verified copy


def noop_progress(n: int, b: int) -> None:
    """The progress callback used when none is given: ``(num_samples, num_bytes)``, ignored."""


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

    def fileno(self) -> int:
        """The wrapped stream's file descriptor (tar readers take the shard's size from it)."""
        return self._s.fileno()

    def drain(self) -> None:
        """Read (and hash) the rest of the stream."""
        while self.read(COPY_CHUNK_BYTES):
            pass

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


def make_problem(shard: str | None, key: str | None, problem: str) -> dict:
    """One entry of a report's ``problems``: ``{"shard", "key", "problem"}`` (None: dataset / shard level)."""
    return {"shard": shard, "key": key, "problem": problem}


# =============================================================================================

class ProblemList:
    """The problems of one shard, added to a report's ``problems``; past ``limit`` sample problems only
    counted (one closing line says how many more)."""

    def __init__(self, report, shard: str, limit: int):
        self.report, self.shard, self.limit, self.count = report, shard, limit, 0

    def add(self, key: str | None, problem: str) -> None:
        self.count += 1
        if key is None or self.count <= self.limit:
            self.report.problems.append(make_problem(self.shard, key, problem))

    def finish(self) -> None:
        if self.count > self.limit:
            self.report.problems.append(make_problem(self.shard, None, f"... and {self.count - self.limit} more "
                                                                   "sample problems in this shard"))




def safe_relative_path(rel: str, *, what: str) -> PurePosixPath:
    """Validate a stored relative path before writing it under an output folder.

    The rule is the one name policy, :func:`~shardfeed.readers.format.manifest.stored_path_problem`, that
    ``pack`` applies to every file it packs: what ``pack`` accepted is written back here, on every
    system; only a dataset written by another tool (or edited) can be refused.

    Raises:
        ValueError: empty, absolute (``/x``, ``C:x``), holding a ``..``, ``.`` or empty component, a
            backslash or a NUL, or not valid UTF-8 — anything that could escape the output folder
            or mean something else on another system. The message names ``what``.
    """
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"{what}: empty path; refusing to write it")
    problem = stored_path_problem(rel)
    if problem is not None:
        raise ValueError(f"{what}: path {rel!r}: {problem}; refusing to write it (it could escape the output "
                         "folder or mean another file on another system; `shardfeed pack` never stores such a path)")
    return PurePosixPath(rel)


def looks_like_image_folder(path: str | os.PathLike) -> bool:
    """True for a local folder without ``manifest.json``, shards or ``data.mdb``, with sub-folders."""
    p = Path(path)
    if not p.is_dir() or (p / MANIFEST_NAME).exists() or (p / LMDB_DATA_NAME).exists():
        return False
    if any(p.glob("*.tar")) or any(p.glob(".shardfeed-*")):
        return False
    return any(e.is_dir() and not e.name.startswith(".") for e in p.iterdir())


def is_url(text: str | os.PathLike) -> bool:
    """True for remote locations: ``http(s)://`` and object-store (``s3://``) strings
    (:func:`shardfeed.readers.storage.opener.is_remote`)."""
    from shardfeed.readers.storage.opener import is_remote

    return is_remote(text)


class DatasetLocation:
    """Where a dataset lives, and how to open its files: a
    :class:`~shardfeed.readers.storage.location.Location` (from the one opener,
    :func:`shardfeed.readers.storage.opener.open_location`, whatever the storage) and its manifest.

    ``path_or_url`` may name the directory (``out/train``, ``http://host/train/``,
    ``s3://bucket/train/``, a registered ``scheme://`` URL) or its ``manifest.json`` directly.

    Args:
        path_or_url: the dataset directory or manifest.
        timeout_s, retries: remote socket timeout (seconds) and retries (None: http_io's defaults).
        storage_options: storage client options (``--storage-option``), passed to the location.

    Raises:
        UnsupportedURLError: a scheme shardfeed does not read, or the client is not installed.

    Attributes:
        location: the :class:`~shardfeed.readers.storage.location.Location`.
        remote: the location is not a local file system (``location.remote``).
        root: the local directory (``Path``) or the base URL ending in ``/`` (``str``, no credentials).
        manifest_source: the manifest's path or URL (``str``).
    """

    def __init__(self, path_or_url: str | os.PathLike, *, timeout_s: float | None = None,
                 retries: int | None = None, storage_options: dict | None = None):
        from shardfeed.readers.storage.opener import open_location

        self.location = open_location(path_or_url if isinstance(path_or_url, str) else str(path_or_url),
                                      storage_options=storage_options, timeout_s=timeout_s, retries=retries)
        self.remote = bool(self.location.remote)
        # for messages and reports (no user:password@ of a URL); a local folder's is its Path
        self.root = getattr(self.location, "root", None) or str(self.location)
        self.manifest_source = self.location.where(self.location.manifest_name)

    def __str__(self) -> str:
        return str(self.root)

    def where(self, name: str) -> str:
        """The path or URL of the file ``name`` of the dataset (for messages)."""
        return self.location.where(name)

    def load_manifest(self, *, check_files: bool = False) -> Manifest:
        """Load and validate the manifest (``check_files``: compare the listed files' sizes).

        Raises:
            ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: as
                :func:`~shardfeed.readers.storage.local_manifest.load_manifest`, or the download failed.
        """
        return self.location.load_manifest(check_files=check_files)

    def read_manifest_bytes(self) -> bytes:
        """The manifest file's bytes, unparsed (``stage`` copies them verbatim).

        Raises:
            ManifestError, IncompleteDatasetError, FileNotFoundError, DataSourceError: no manifest
                there (the message says whether a pack was interrupted), or the download failed.
        """
        try:
            return self.location.read_bytes(self.location.manifest_name, max_bytes=MAX_MANIFEST_BYTES,
                                            what="the manifest")
        except FileNotFoundError:
            self.location.load_manifest(check_files=False)  # the location's precise error (an unfinished pack ...)
            raise ManifestError(f"{self.manifest_source}: not found; give the path or URL of a packed dataset's "
                                "folder or of its manifest.json (a pack writes it last)") from None

    def open(self, name: str, start: int = 0) -> tuple[BinaryIO, int]:
        """Open the dataset file ``name`` for reading from byte ``start``.

        Returns:
            ``(stream, offset)``: the stream and the file offset of its next byte (0 when an
            HTTP server ignored the range; skip ``start - offset`` bytes then).

        Raises:
            FileNotFoundError: no such file; DataSourceError: a remote read failed.
        """
        return self.location.open(name, start)

    def read_bytes(self, name: str) -> bytes:
        """The whole content of the dataset file ``name``."""
        return self.location.read_bytes(name)


# ---------------------------------------------------------------------------------------------
# samples

def parts_to_sample(key: str, parts: dict[str, bytes], *, source: str,
                    class_to_idx: dict[str, int] | None = None, labels: frozenset[int] | None = None,
                    labelled: bool = True) -> Sample:
    """Build a :class:`Sample` from one WebDataset sample's members.

    Image, label and metadata are chosen by the readers' one rule,
    :func:`shardfeed.readers.format.sample_members.sample_from_members`, so a tool and the training reader
    never disagree about a shard; the metadata is then parsed (``{}`` without a ``.json``
    member; a JSON value that is not an object becomes ``{"value": ...}``).

    Raises:
        CorruptDataError: no image member or several, an unreadable ``.cls`` or ``.json``, no
            label, a label not in ``labels`` (the dataset's class indexes; None: not checked);
            the message names ``source`` and the key.
    """
    data, ext, label, meta_json = sample_from_members(key, parts, class_to_idx, source, labels, labelled=labelled)
    meta: dict = {}
    if meta_json is not None:
        try:
            meta = json.loads(meta_json)
        except ValueError as exc:
            raise CorruptDataError(f"{source} key {key}: unreadable {key}.json ({exc})") from None
        if not isinstance(meta, dict):
            meta = {"value": meta}
    return Sample(key, data, ext, label, meta)


def iter_shard_samples(location: DatasetLocation, name: str, *, class_to_idx: dict[str, int] | None = None,
                       index: str | None = None, sha256: str | None = None, labelled: bool = True,
                       fields: dict[str, dict] | None = None) -> Iterator:
    """Yield the samples of one WebDataset shard of ``location`` in storage order.

    With ``index`` (the shard's ``.sfidx`` file name), only the member groups that start at one
    of its offsets are samples: ``shardfeed index`` leaves groups that do not form a sample (an
    image without a class, a stray member) out of the index, and they are skipped here too.

    Args:
        location: the dataset's location.
        name: the shard's file name (as in the manifest).
        class_to_idx: for :func:`parts_to_sample`; a sample whose class index is not one of its
            values is a :class:`CorruptDataError`.
        index: the shard's offset-index file name, if it has one.
        sha256: the shard's digest from the manifest: the bytes read are hashed, and once the last
            sample is out, the rest of the shard is read and the digest compared (a copy made from
            the samples must not carry damage the tar structure does not show).

    Raises:
        CorruptDataError: a damaged tar or sample (names the shard and the key/offset); with
            ``sha256``, after the last sample, a shard whose bytes differ from the manifest's.
        FileNotFoundError, DataSourceError: the shard cannot be opened.
    """
    from shardfeed.readers.format.tario import iter_members, iter_samples

    source = location.where(name)
    labels = None if class_to_idx is None else frozenset(class_to_idx.values())
    starts = set(decode_index(location.read_bytes(index), location.where(index))) if index else None
    stream, _ = location.open(name)
    with stream:
        reader = HashingReader(stream) if sha256 else stream
        for key, parts, offset in iter_samples(iter_members(reader, source=source), source=source):
            if starts is not None and offset not in starts:
                continue
            sample = parts_to_sample(key, parts, source=source, class_to_idx=class_to_idx, labels=labels,
                                     labelled=labelled)
            if fields:
                yield sample, {f: parts[d["member"]] for f, d in fields.items() if d["member"] in parts}
            else:
                yield sample
        if sha256:
            reader.drain()
            if reader.hexdigest() != sha256:
                raise CorruptDataError(f"{source}: sha256 {reader.hexdigest()[:16]}... differs from the manifest's "
                                       f"{sha256[:16]}...: the shard's bytes changed since it was packed; run "
                                       "`shardfeed check` on the dataset and repack or restage it")


def _open_lmdb(root: Path):
    """This process's shared read-only environment (:func:`~shardfeed.readers.storage.lmdb_io.process_env`):
    a dataset object may have it open already, and LMDB allows one per process. Not to be closed."""
    from shardfeed.readers.storage.lmdb_io import process_env

    return process_env(root)


def iter_lmdb_records(root: str | os.PathLike, *, verify: bool = True) -> Iterator[tuple[str, dict | Exception]]:
    """Yield ``(key, record)`` for every sample record of a local LMDB dataset, in key order.

    A record that fails to decode (or its CRC-32, with ``verify``) is yielded as
    ``(key, CorruptDataError)`` instead of stopping the iteration, so checks can report every bad
    key. The reserved manifest record is skipped.
    """

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




def iter_raw_samples(path_or_url: str | os.PathLike | DatasetLocation, manifest: Manifest | None = None,
                     *, with_fields: bool = False) -> Iterator[tuple]:
    """Yield ``(shard_name, sample)`` for every sample of a packed dataset, in storage order.

    No decoding, no shuffling, no torch: the exact stored bytes, labels (-1 in an unlabelled
    dataset) and metadata. With ``with_fields``, ``(shard_name, sample, {field: stored bytes})``
    (the manifest's extra fields, byte for byte). WebDataset works locally and over HTTP; LMDB
    locally only.

    Raises:
        CorruptDataError: a damaged shard or record (names it and the key).
        ManifestError: no manifest, or an LMDB dataset given as a URL.
    """
    loc = path_or_url if isinstance(path_or_url, DatasetLocation) else DatasetLocation(path_or_url)
    manifest = manifest or loc.load_manifest(check_files=not loc.remote)
    spec = describe(manifest.format)
    if spec.records is not None:
        if loc.remote:
            raise ManifestError(f"{loc.root}: an {spec.title} dataset cannot be read over HTTP; stage it locally first")
        name = manifest.shards[0].name if manifest.shards else "data.mdb"
        for _key, rec in resolve(spec.records)(loc.root):
            if isinstance(rec, Exception):
                raise rec
            sample = Sample(rec["key"], rec["data"], rec["ext"], rec["label"], rec["meta"])
            if with_fields:
                yield name, sample, dict(rec.get("fields") or {})
            else:
                yield name, sample
        return
    for shard in manifest.shards:
        for item in iter_shard_samples(loc, shard.name, class_to_idx=manifest.class_to_idx, index=shard.index,
                                       sha256=shard.sha256, labelled=manifest.labelled,
                                       fields=manifest.fields if with_fields else None):
            if with_fields:
                sample, fields = item if manifest.fields else (item, {})
                yield shard.name, sample, fields
            else:
                yield shard.name, item

