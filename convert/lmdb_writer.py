"""Moved: :mod:`shardfeed.convert.writers.lmdb` and :mod:`shardfeed.convert.writers.lmdb_store`
(this name stays for existing imports)."""

from .writers.lmdb import LmdbWriter, pack_lmdb
from .writers.lmdb_store import (
    COMMIT_BYTES,
    COMMIT_COUNT,
    COMPACT_MIN_FREE_BYTES,
    COMPACT_MIN_FREE_FRACTION,
    PACK_STATE_KEY,
    LmdbStore,
    estimate_map_size,
)

__all__ = [
    "LmdbWriter",
    "LmdbStore",
    "pack_lmdb",
    "estimate_map_size",
    "PACK_STATE_KEY",
    "COMMIT_COUNT",
    "COMMIT_BYTES",
    "COMPACT_MIN_FREE_FRACTION",
    "COMPACT_MIN_FREE_BYTES",
]
