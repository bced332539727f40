"""A per-process cache of shards' sample offsets, bounded in bytes (least recently used first out)."""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from typing import Callable, Sequence

__all__ = ["OffsetCache", "DEFAULT_OFFSET_CACHE_BYTES", "ENTRY_OVERHEAD_BYTES"]

#: Default bound of one process's offset cache: 64 MiB, about 8 million samples' offsets.
DEFAULT_OFFSET_CACHE_BYTES = 64 << 20
#: Bytes counted per cached shard besides its 8 bytes per offset (the array and the map's entry).
ENTRY_OVERHEAD_BYTES = 160


class OffsetCache:
    """Shard number -> its sample offsets (``array('Q')``, or None for a shard without an index).

    Holds at most ``max_bytes``, counted as 8 bytes per offset plus :data:`ENTRY_OVERHEAD_BYTES` per
    shard; the shards used least recently leave first. A shard whose offsets alone exceed the bound
    is returned but not kept. Safe to use from several threads. A pickled copy (a worker's) starts
    empty, with the same bound.
    """

    def __init__(self, max_bytes: int = DEFAULT_OFFSET_CACHE_BYTES) -> None:
        if type(max_bytes) is not int or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, array | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __reduce__(self):
        return (OffsetCache, (self.max_bytes,))

    @staticmethod
    def cost(offsets: Sequence[int] | None) -> int:
        """Bytes one entry is counted as."""
        return ENTRY_OVERHEAD_BYTES + 8 * (0 if offsets is None else len(offsets))

    @property
    def num_bytes(self) -> int:
        """Bytes held now (by :meth:`cost`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, shard: int) -> bool:
        return shard in self._entries

    def get(self, shard: int, load: Callable[[int], Sequence[int] | None]) -> array | None:
        """The offsets of ``shard``: cached, or ``load(shard)`` (outside the lock) kept as ``array('Q')``.

        Raises:
            whatever ``load`` raises (nothing is kept then).
        """
        with self._lock:
            if shard in self._entries:
                self._entries.move_to_end(shard)
                return self._entries[shard]
        loaded = load(shard)
        offsets = None if loaded is None else (loaded if isinstance(loaded, array) else array("Q", loaded))
        size = self.cost(offsets)
        with self._lock:
            if shard in self._entries or size > self.max_bytes:
                return offsets
            self._entries[shard] = offsets
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= self.cost(old)
        return offsets
