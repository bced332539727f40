"""The path index beside a WebDataset dataset: which source paths it holds, for ``pack --append``.

``OUT/.shardfeed-paths`` (:data:`PATHS_NAME`) is written with the manifest by ``pack`` and by
``pack --append``. It holds, little-endian:

* the magic ``b"SFPATHS1"`` (:data:`MAGIC`);
* 32 bytes: :func:`dataset_identity` of the manifest it describes;
* three ``uint64``: the number of samples ``n``, the first unused key index, the key width;
* ``n`` ``uint64``: the sorted 64-bit hashes of every sample's metadata ``path``;
* ``n`` ``uint64``: each sample's source file size in bytes, in the hashes' order
  (:data:`UNKNOWN_SIZE`: not known);
* ``n`` ``int64``: each source file's modification time in nanoseconds, in the same order
  (:data:`UNKNOWN_MTIME`: not known).

24 bytes a sample. The sizes and times let an append tell a changed file at a packed path.
It is a cache. An append trusts it only when its identity matches the manifest and its counts
agree with it (one record per sample, a next key past every sample and skipped file); otherwise
(missing, stale, damaged, or the hashes-only ``SFPATHS1`` of earlier versions) the paths and
image sizes are read from the shards. Readers never look at it.
"""

from __future__ import annotations

import dataclasses
import re
import hashlib
import os
import struct
from pathlib import Path
from typing import Iterable

import numpy as np

from shardfeed.readers.format.manifest import PATH_INDEX_NAME, Manifest
from shardfeed.readers.file_io import write_bytes_atomic

__all__ = ["PATHS_NAME", "MAGIC", "UNKNOWN_SIZE", "UNKNOWN_MTIME", "PathRecords", "path_hash", "path_hashes",
           "dataset_identity", "write_path_index", "read_path_index", "is_path_index", "skipped_keys_end"]

#: The path index's file name inside OUT.
PATHS_NAME = PATH_INDEX_NAME
#: The first bytes of a path index (``SFPATHS1``: hashes only, no longer written).
MAGIC = b"SFPATHS2"
_HEAD = struct.Struct("<8s32sQQQ")
#: Most samples read back (24 bytes each: 6 GiB).
MAX_HASHES = 1 << 28
#: A size the index does not know (the sample came from ``write_dataset``, or an older index).
UNKNOWN_SIZE = (1 << 64) - 1
#: A modification time the index does not know.
UNKNOWN_MTIME = -1


def path_hash(rel: str) -> int:
    """A 64-bit hash of a relative path (two paths sharing one: about 1 in 2**64 per pair)."""
    return int.from_bytes(hashlib.blake2b(rel.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "little")


def path_hashes(rels: Iterable[str]) -> np.ndarray:
    """:func:`path_hash` of each path, as a ``uint64`` array of the same order."""
    return np.fromiter((path_hash(r) for r in rels), dtype=np.uint64)


@dataclasses.dataclass
class PathRecords:
    """The samples a dataset holds: their path hashes, sorted, and their source file sizes and times.

    Attributes:
        hashes: ``uint64`` (n,), sorted: :func:`path_hash` of each sample's metadata ``path``.
        sizes: ``uint64`` (n,): the source file's size in bytes (:data:`UNKNOWN_SIZE`: not known).
        mtimes_ns: ``int64`` (n,): its modification time in ns (:data:`UNKNOWN_MTIME`: not known).
    """

    hashes: np.ndarray
    sizes: np.ndarray
    mtimes_ns: np.ndarray

    @classmethod
    def build(cls, hashes, sizes=None, mtimes_ns=None) -> "PathRecords":
        """Records of ``hashes`` (any order; sorted here) with their sizes and times (None: unknown)."""
        hashes = np.asarray(hashes, dtype=np.uint64).reshape(-1)
        n = len(hashes)
        sizes = np.full(n, UNKNOWN_SIZE, np.uint64) if sizes is None else np.asarray(sizes).astype(np.uint64)
        mtimes = np.full(n, UNKNOWN_MTIME, np.int64) if mtimes_ns is None else np.asarray(mtimes_ns, np.int64)
        order = np.argsort(hashes, kind="stable")
        return cls(hashes[order], sizes[order], mtimes[order])

    @classmethod
    def of_files(cls, files, gone: set | frozenset = frozenset()) -> "PathRecords":
        """Records of scanned files (:class:`~shardfeed.readers.format.imagefolder.ScannedFiles`), less those in
        ``gone``."""
        keep = [j for j, r in enumerate(files.rels) if r not in gone] if gone else None
        rels = files.rels if keep is None else [files.rels[j] for j in keep]
        sizes = np.asarray(files.sizes, dtype=np.int64)
        mtimes = np.asarray(files.mtimes_ns, dtype=np.int64)
        if keep is not None:
            sizes, mtimes = sizes[keep], mtimes[keep]
        return cls.build(path_hashes(rels), sizes, mtimes)

    def __len__(self) -> int:
        return len(self.hashes)

    def __add__(self, other: "PathRecords") -> "PathRecords":
        return PathRecords.build(np.concatenate([self.hashes, other.hashes]),
                                 np.concatenate([self.sizes, other.sizes]),
                                 np.concatenate([self.mtimes_ns, other.mtimes_ns]))

    def positions(self, hashes: np.ndarray) -> np.ndarray:
        """``int64`` (len(hashes),): where each hash is in :attr:`hashes`; -1 where it is not."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if not len(self.hashes):
            return np.full(len(hashes), -1, np.int64)
        at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        return np.where(self.hashes[at] == hashes, at, -1).astype(np.int64)

    def __contains__(self, rel: str) -> bool:
        return bool(self.positions(np.array([path_hash(rel)], np.uint64))[0] >= 0)


def dataset_identity(manifest: Manifest) -> bytes:
    """32 bytes naming the dataset's content: its sample count and every shard's name and sha256."""
    h = hashlib.sha256(str(manifest.num_samples).encode())
    for s in manifest.shards:
        h.update(f"\0{s.name}\0{s.sha256}".encode())
    return h.digest()


def write_path_index(out: str | os.PathLike, manifest: Manifest, records: PathRecords, next_key: int,
                     width: int) -> None:
    """Write ``OUT/.shardfeed-paths`` for ``manifest`` (atomically).

    Args:
        out: the dataset folder.
        manifest: the manifest written with it.
        records: the samples' :class:`PathRecords`.
        next_key: the first unused key index.
        width: the digits of the keys.
    """
    head = _HEAD.pack(MAGIC, dataset_identity(manifest), len(records), next_key, width)
    body = (records.hashes.astype("<u8").tobytes() + records.sizes.astype("<u8").tobytes()
            + records.mtimes_ns.astype("<i8").tobytes())
    write_bytes_atomic(Path(out) / PATHS_NAME, head + body)


def skipped_keys_end(manifest: Manifest) -> int:
    """One past the largest decimal key that ``manifest``'s ``skipped`` list names (0: none)."""
    keys = (item.get("key") if isinstance(item, dict) else None for item in manifest.skipped)
    return max((int(k) + 1 for k in keys if isinstance(k, str) and k.isdigit()), default=0)


def read_path_index(out: str | os.PathLike, manifest: Manifest) -> tuple[PathRecords, int, int] | None:
    """``(records, next key index, key width)`` of OUT's path index when it describes
    ``manifest``; None when it is missing, damaged, of an earlier version, or of another version of the
    dataset, or when its counts disagree with the manifest (not one record per sample, a next key a
    sample or a skipped file holds already, a size that is not its records')."""
    path = Path(out) / PATHS_NAME
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_HEAD.size)
            if len(head) != _HEAD.size:
                return None
            magic, identity, count, next_key, width = _HEAD.unpack(head)
            if (magic != MAGIC or identity != dataset_identity(manifest) or count > MAX_HASHES
                    or count != manifest.num_samples or size != _HEAD.size + 24 * count):
                return None
            data = f.read(24 * count + 1)
    except OSError:
        return None
    if (len(data) != 24 * count or not 0 < width <= 64
            or next_key < max(count, skipped_keys_end(manifest))):
        return None
    hashes = np.frombuffer(data, "<u8", count, 0).astype(np.uint64)
    if count > 1 and bool(np.any(hashes[1:] < hashes[:-1])):
        return None  # not sorted: a search would miss paths it holds
    sizes = np.frombuffer(data, "<u8", count, 8 * count).astype(np.uint64)
    mtimes = np.frombuffer(data, "<i8", count, 16 * count).astype(np.int64)
    return PathRecords(hashes, sizes, mtimes), next_key, width


def is_path_index(head: bytes | None) -> bool:
    """Whether a file's first bytes are a path index's, of any version (ownership: a file shardfeed wrote)."""
    return head is not None and re.fullmatch(rb"SFPATHS[0-9]", head[:len(MAGIC)]) is not None
