"""The order in which a WebDataset worker's shuffle buffer emits its samples, computed per position.

A worker reads its sub-range of the epoch front to back (docs/format.md, "Splitting an epoch"). The
shuffle buffer cuts that stream into *windows* of ``buffer`` samples (the last one may be shorter),
reads one window into memory and emits it in a seeded permuted order before it reads the next. The
rule (binding; this module is its one implementation):

* Window ``w`` holds the worker's stream places ``[w * B, w * B + m)``, ``m = min(B, n - w * B)``.
* Emission place ``k`` is slot ``s = k % B`` of window ``w = k // B``; it emits stream place
  ``w * B + P_w(s)``, where ``P_w`` is the Feistel permutation of ``[0, m)`` of
  :mod:`~shardfeed.readers.order.permutation` (same passes and cycle walking) with round keys
  ``mix64(base_r + (w + 1) * 0x9E3779B97F4A7C15)`` (modulo ``2**64``), ``base_r`` the 6 little-endian
  64-bit words of ``blake2b(f"shardfeed-shuffle-buffer:{seed}:{epoch}:{rank}:{worker}", digest_size=48)``.

So the place of any emitted sample is found in constant time and memory, and a resumed worker
continues by seeking to its window's first sample and reading at most one window again (the buffer
held no more). Memory stays one window. (Epoch order version 2 used a reservoir buffer, whose state
at a place could only be found by replaying it from the sub-range's start.)
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Iterator

import numpy as np

from .permutation import CHUNK, ROUNDS, mix64, permute_keyed

__all__ = ["window_keys", "shuffle_buffer_order", "shuffled_windows"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _base_keys(seed: int, epoch: int, rank: int, worker: int) -> np.ndarray:
    text = f"shardfeed-shuffle-buffer:{int(seed)}:{int(epoch)}:{int(rank)}:{int(worker)}"
    digest = hashlib.blake2b(text.encode(), digest_size=8 * ROUNDS).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def window_keys(windows: np.ndarray, *, seed: int, epoch: int, rank: int, worker: int) -> np.ndarray:
    """Round keys of windows ``windows`` (``int64 [m]``) of one worker: ``uint64 [ROUNDS, m]``."""
    w = np.asarray(windows, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        return mix64(_base_keys(seed, epoch, rank, worker)[:, None] + w[None, :] * _GOLDEN)


def shuffle_buffer_order(num_items: int, *, buffer: int, seed: int, epoch: int, rank: int, worker: int,
                         start: int = 0, stop: int | None = None) -> np.ndarray:
    """The stream places a worker's shuffle buffer emits at emission places ``[start, stop)``.

    Costs ``O(stop - start)`` time, whatever ``num_items`` is (the module's rule), and temporaries
    of a few MiB (:data:`~shardfeed.readers.order.permutation.CHUNK` places at a time) besides the result.

    Args:
        num_items: n, the samples in the worker's stream.
        buffer: B, samples per window (``<= 1``: no buffer, the stream's own order).
        seed, epoch, rank, worker: what the windows' permutations are keyed by.
        start, stop: the emission places wanted (default: all, ``[0, n)``; clipped to it).

    Returns:
        ``int64 [stop - start]``: places in the worker's stream, in emission order.
    """
    n = int(num_items)
    a, b = max(0, int(start)), n if stop is None else min(n, int(stop))
    if b <= a:
        return np.empty(0, dtype=np.int64)
    if buffer <= 1:
        return np.arange(a, b, dtype=np.int64)
    size = int(buffer)
    last = (n - 1) // size  # the last window, the only one that may be short
    out = np.empty(b - a, dtype=np.int64)
    for c in range(a, b, CHUNK):  # the keys of a chunk's places at a time: bounded temporaries
        k = np.arange(c, min(b, c + CHUNK), dtype=np.int64)
        window, slot = k // size, k % size
        for short in (False, True):
            pick = np.flatnonzero((window == last) == short)
            if pick.size == 0:
                continue
            m = n - last * size if short else size
            keys = window_keys(window[pick], seed=seed, epoch=epoch, rank=rank, worker=worker)
            out[c - a + pick] = window[pick] * size + permute_keyed(slot[pick], m, keys)
    return out


def shuffled_windows(items: Iterable, buffer: int, *, num_items: int, seed: int, epoch: int, rank: int,
                     worker: int, first: int = 0) -> Iterator:
    """The items of a worker's stream through its shuffle buffer, from emission place ``first`` on.

    ``items`` is the stream from the first place of window ``first // buffer`` on (a fresh epoch:
    from its start). Each window is read whole, then emitted in the order of
    :func:`shuffle_buffer_order`; the first ``first % buffer`` of the first window are dropped. A
    stream that ends early (samples lost to damage under ``on_error="skip"``) emits what its last
    window got, in the same order; items past ``num_items`` pass in stream order.

    Args:
        items: the stream (any objects).
        buffer: samples per window (``<= 1``: the stream unchanged).
        num_items: n, the samples of the worker's whole stream.
        seed, epoch, rank, worker: the buffer's keys.
        first: the emission place to start at.
    """
    it = iter(items)
    size = int(buffer)
    if size <= 1:
        yield from it
        return
    n = int(num_items)
    w = int(first) // size
    skip = int(first) - w * size
    while w * size < n:
        m = min(size, n - w * size)
        held = [item for _, item in zip(range(m), it)]
        order = shuffle_buffer_order(n, buffer=size, seed=seed, epoch=epoch, rank=rank, worker=worker,
                                     start=w * size, stop=w * size + m) - w * size
        got = len(held)
        for place in order[skip:].tolist():
            if place < got:
                yield held[place]
        if got < m:
            return
        skip, w = 0, w + 1
    yield from it
