"""The random-access epoch order written from its specification (docs/format.md, "Splitting an
epoch"), one position at a time in plain Python integers: the tests' independent reference."""

from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_at(position: int, n: int, seed: int, epoch: int) -> int:
    """The sample index at ``position`` of epoch ``epoch``'s permutation of ``range(n)``."""
    if n <= 1:
        return position
    digest = hashlib.blake2b(f"shardfeed-epoch-order:{seed}:{epoch}".encode(), digest_size=48).digest()
    keys = [int.from_bytes(digest[i:i + 8], "little") for i in range(0, 48, 8)]
    half = ((n - 1).bit_length() + 1) // 2
    mask = (1 << half) - 1
    x = position
    while True:
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        x = (left << half) | right
        if x < n:
            return x


def permutation(n: int, seed: int, epoch: int) -> list[int]:
    """The whole permutation (small ``n`` only)."""
    return [sample_at(p, n, seed, epoch) for p in range(n)]
