"""The check that a streaming writer's sample keys are unique, in bounded memory per key.

Keys that arrive in increasing order (the positional keys of ``write_dataset``, or sorted keys)
are unique by that order alone. Each key also leaves a 16-byte BLAKE2b digest (16 bytes a
sample, not a set of strings: about 100 bytes a sample). Once a key arrives out of order, the
digests are checked for repeats when the writer closes, before the manifest is written.
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np

#: bytes of each key's digest: two keys share one by chance with probability about n² / 2**129
DIGEST_BYTES = 16


class UniqueKeys:
    """Sample keys seen so far, for :meth:`add` and :meth:`check`."""

    def __init__(self) -> None:
        self._last: str | None = None
        self._ordered = True
        self._digests = array("Q")  # two 64-bit words per key, in writing order

    def __len__(self) -> int:
        return len(self._digests) // 2

    def repeats_last(self, key: str) -> bool:
        """Whether ``key`` equals the key recorded just before (checked before a sample is written)."""
        return key == self._last

    def add(self, key: str) -> None:
        """Record ``key``, once its sample is written."""
        if self._ordered and self._last is not None and key <= self._last:
            self._ordered = False
        self._last = key
        self._digests.frombytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"),
                                                digest_size=DIGEST_BYTES).digest())

    def check(self) -> None:
        """Raise when two keys written out of order are the same.

        Raises:
            ValueError: two samples share a key; names their positions in writing order (0-based).
        """
        if self._ordered or len(self) < 2:
            return
        words = np.frombuffer(self._digests, dtype=np.uint64).reshape(-1, 2)
        order = np.lexsort((words[:, 1], words[:, 0]))
        ranked = words[order]
        same = np.flatnonzero((ranked[1:] == ranked[:-1]).all(axis=1))
        if len(same):
            a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
            raise ValueError(f"the samples written at positions {a:,} and {b:,} have the same key "
                             f"({len(same):,} repeated key(s) in all); keys must be unique")
