"""The epoch orders written from their specification (docs/format.md, "Splitting an epoch"), one
position at a time in plain Python integers: the tests' independent reference (the random-access
permutation, and the order a WebDataset worker's shuffle buffer emits)."""

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
    return _walk(position, n, _words(f"shardfeed-epoch-order:{seed}:{epoch}"))


def _words(text: str) -> list[int]:
    digest = hashlib.blake2b(text.encode(), digest_size=48).digest()
    return [int.from_bytes(digest[i:i + 8], "little") for i in range(0, 48, 8)]


def _walk(position: int, n: int, keys: list[int]) -> int:
    if n <= 1:
        return position
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


def buffer_order(n: int, size: int, seed: int, epoch: int, rank: int, worker: int) -> list[int]:
    """Stream places in the order a worker's shuffle buffer of ``size`` emits its ``n`` samples:
    windows of ``size``, window ``w`` permuted with keys ``mix64(base + (w + 1) * golden)``."""
    return [buffer_place(k, n, size, seed, epoch, rank, worker) for k in range(n)]


def buffer_place(k: int, n: int, size: int, seed: int, epoch: int, rank: int, worker: int) -> int:
    """The stream place emitted at emission place ``k``: slot ``k % size`` of window ``k // size``."""
    if size <= 1:
        return k
    base = _words(f"shardfeed-shuffle-buffer:{seed}:{epoch}:{rank}:{worker}")
    w, slot = divmod(k, size)
    keys = [_mix64((b + (w + 1) * 0x9E3779B97F4A7C15) & _MASK64) for b in base]
    return w * size + _walk(slot, min(size, n - w * size), keys)
