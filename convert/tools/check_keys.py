"""Whether every key of a tar-sharded dataset is unique, in memory that does not grow with the dataset.

The format promises unique keys across the whole dataset (docs/format.md, "Samples and keys"), and
shardfeed writes them increasing through the shards in manifest order. :class:`KeyLedger` checks the
promise exactly:

* While every key is greater than the one before (across shards too), the keys are unique, and the
  ledger holds the last key and the current shard's keys only.
* At the first key that is not, the ledger reads the keys of the shards already checked once more
  (``reread``) and from then on keeps an 8-byte digest and a shard number of every key (12 bytes a
  key, in sorted runs), besides the current shard's keys. A key whose digest an earlier shard holds
  is reported as a duplicate of a key there (two different keys share a digest with a probability
  of about ``n**2 / 2**65``: 3e-4 at 100 million keys).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable

import numpy as np

__all__ = ["KeyLedger"]


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "little")


class KeyLedger:
    """Keys seen so far, shard by shard: :meth:`start_shard`, then :meth:`add` for each key.

    Args:
        reread: ``reread(i)`` yields the keys of the ``i``-th shard started (as :meth:`add` got them);
            called at most once per shard, only when the keys stop increasing.
    """

    def __init__(self, reread: Callable[[int], Iterable[str]]) -> None:
        self._reread = reread
        self._names: list[str] = []
        self._last: str | None = None
        self._sorted = True
        self._shard: set[str] = set()
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted uint64 digests, int32 shard numbers)
        self._pending: list[int] = []

    @property
    def num_digests(self) -> int:
        """Digests held (0 while the keys increase)."""
        return sum(len(d) for d, _ in self._runs) + len(self._pending)

    def start_shard(self, name: str) -> None:
        """Begin the next shard (``name`` is what a duplicate's message names)."""
        self._close_shard()
        self._names.append(name)

    def add(self, key: str) -> str | None:
        """Record ``key`` of the current shard.

        Returns:
            The name of the shard that already holds ``key`` (this one for a key repeated within the
            shard), or None when it is new.
        """
        if key in self._shard:  # while keys increase, no earlier shard holds a key of this one
            return (None if self._sorted else self._owner(_digest(key))) or self._names[-1]
        if self._sorted and (self._last is None or key > self._last):
            self._last = key
            self._shard.add(key)
            return None
        if self._sorted:
            self._to_digests()
        d = _digest(key)
        owner = self._owner(d)
        self._shard.add(key)
        self._pending.append(d)
        return owner

    def _owner(self, d: int) -> str | None:
        want = np.uint64(d)
        for digests, owners in self._runs:
            i = int(np.searchsorted(digests, want))
            if i < len(digests) and digests[i] == want:
                return self._names[int(owners[i])]
        return None

    def _to_digests(self) -> None:
        """Leave the increasing mode: digests of every earlier shard's keys, and of this shard's so far."""
        self._sorted = False
        current = len(self._names) - 1
        for i in range(current):
            self._push([_digest(k) for k in self._reread(i)], i)
        self._pending = [_digest(k) for k in self._shard]

    def _close_shard(self) -> None:
        if self._pending:
            self._push(self._pending, len(self._names) - 1)
        self._pending = []
        self._shard = set()

    def _push(self, digests: list[int], shard: int) -> None:
        d = np.unique(np.asarray(digests, dtype=np.uint64))
        self._runs.append((d, np.full(len(d), shard, dtype=np.int32)))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (d1, o1), (d2, o2) = self._runs.pop(), self._runs.pop()
            d, o = np.concatenate([d2, d1]), np.concatenate([o2, o1])
            order = np.argsort(d, kind="stable")  # an earlier shard keeps the first place
            self._runs.append((d[order], o[order]))
