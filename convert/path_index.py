"""The path index beside a WebDataset dataset: which source paths it holds, for ``pack --append``.

``OUT/.shardfeed-paths`` (:data:`PATHS_NAME`) is written with the manifest by ``pack`` and by
``pack --append``. It holds, little-endian:

* the magic ``b"SFPATHS1"`` (:data:`MAGIC`);
* 32 bytes: :func:`dataset_identity` of the manifest it describes;
* three ``uint64``: the number of hashes, the first unused key index, the key width;
* the sorted 64-bit hashes of every sample's metadata ``path`` (8 bytes a sample).

It is a cache. An append trusts it only when its identity matches the manifest; otherwise
(missing, stale, damaged) the paths are read from the shards. Readers never look at it.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import sys
from array import array
from pathlib import Path
from typing import Iterable

from shardfeed.readers.format import PATH_INDEX_NAME, Manifest
from shardfeed.readers.file_io import write_bytes_atomic

__all__ = ["PATHS_NAME", "MAGIC", "path_hash", "dataset_identity", "write_path_index", "read_path_index",
           "is_path_index"]

#: The path index's file name inside OUT.
PATHS_NAME = PATH_INDEX_NAME
#: The first bytes of a path index.
MAGIC = b"SFPATHS1"
_HEAD = struct.Struct("<8s32sQQQ")
#: Most hashes read back (8 bytes each: 2 GiB).
MAX_HASHES = 1 << 28


def path_hash(rel: str) -> int:
    """A 64-bit hash of a relative path (two paths sharing one: about 1 in 2**64 per pair)."""
    return int.from_bytes(hashlib.blake2b(rel.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "little")


def dataset_identity(manifest: Manifest) -> bytes:
    """32 bytes naming the dataset's content: its sample count and every shard's name and sha256."""
    h = hashlib.sha256(str(manifest.num_samples).encode())
    for s in manifest.shards:
        h.update(f"\0{s.name}\0{s.sha256}".encode())
    return h.digest()


def write_path_index(out: str | os.PathLike, manifest: Manifest, paths: Iterable[str] | array, next_key: int,
                     width: int) -> None:
    """Write ``OUT/.shardfeed-paths`` for ``manifest`` (atomically).

    Args:
        out: the dataset folder.
        manifest: the manifest written with it.
        paths: the samples' metadata paths (str), or their :func:`path_hash` values (an ``array("Q")``).
        next_key: the first unused key index.
        width: the digits of the keys.
    """
    hashes = paths if isinstance(paths, array) else array("Q", (path_hash(p) for p in paths))
    hashes = array("Q", sorted(hashes))
    if sys.byteorder != "little":
        hashes.byteswap()
    head = _HEAD.pack(MAGIC, dataset_identity(manifest), len(hashes), next_key, width)
    write_bytes_atomic(Path(out) / PATHS_NAME, head + hashes.tobytes())


def read_path_index(out: str | os.PathLike, manifest: Manifest) -> tuple[array, int, int] | None:
    """``(sorted hashes, next key index, key width)`` of OUT's path index when it describes
    ``manifest``; None when it is missing, damaged, or of another version of the dataset."""
    path = Path(out) / PATHS_NAME
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            if len(head) != _HEAD.size:
                return None
            magic, identity, count, next_key, width = _HEAD.unpack(head)
            if magic != MAGIC or identity != dataset_identity(manifest) or count > MAX_HASHES:
                return None
            data = f.read(8 * count + 1)
    except OSError:
        return None
    if len(data) != 8 * count or not 0 < width <= 64:
        return None
    hashes = array("Q")
    hashes.frombytes(data)
    if sys.byteorder != "little":
        hashes.byteswap()
    if any(a > b for a, b in zip(hashes, itertools.islice(hashes, 1, None))):
        return None  # not sorted: a search would miss paths it holds
    return hashes, next_key, width


def is_path_index(head: bytes | None) -> bool:
    """Whether a file's first bytes are a path index's (ownership: a file shardfeed wrote)."""
    return head is not None and head[:len(MAGIC)] == MAGIC
