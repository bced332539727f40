"""The epoch's order of a random-access source: a seeded permutation of ``[0, N)`` computed per position.

The permutation is never built as a whole. Position ``p`` of epoch ``e`` maps to sample index
``permute(p)`` in constant time and memory, so each process computes only the positions it reads.
The rule (docs/format.md, "Splitting an epoch", is binding; this module is its one implementation):

* ``N <= 1``: the identity.
* ``h = ceil(bits(N - 1) / 2)``: the domain is ``[0, 4**h)``, the smallest power of four that holds ``N``
  values, so it is at most four times ``N``.
* Round keys: the :data:`ROUNDS` little-endian 64-bit words of
  ``blake2b(f"shardfeed-epoch-order:{seed}:{epoch}", digest_size=8 * ROUNDS)``.
* One Feistel pass over ``x`` in the domain: ``L = x >> h``, ``R = x & (2**h - 1)``; for each key ``k``:
  ``L, R = R, L ^ (mix64(R ^ k) & (2**h - 1))``; the result is ``(L << h) | R``. ``mix64`` is the
  splitmix64 finaliser (``z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb;
  z ^= z >> 31``, modulo ``2**64``).
* Cycle walking: the pass is applied again while the value is ``>= N``. The pass is a bijection of the
  domain, so the walk from a value ``< N`` returns below ``N`` (at the latest at its start), and the
  result is a bijection of ``[0, N)``. A walk takes at most four passes on average.

Version 1 of the epoch order (``random.Random(seed + epoch).shuffle(list(range(N)))``) materialised
the whole permutation in every process; :data:`EPOCH_ORDER_VERSION` names the rule above.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np

__all__ = ["EPOCH_ORDER_VERSION", "RANDOM_ACCESS_ORDER_SINCE", "SHARD_ORDER_SINCE", "ROUNDS",
           "round_keys", "mix64", "permute", "permute_keyed", "unpermute", "CHUNK", "check_state_epoch_order"]

#: The version of the epoch order (1: random-access sources shuffle a list of ``range(N)``, WebDataset
#: workers mix through a reservoir buffer; 2: random-access sources use this module; 3: WebDataset
#: workers mix through windows, :mod:`~shardfeed.readers.order.buffer_order`; 4: the WebDataset shard
#: order is this module's permutation of the shard indices, not ``random.Random(seed + epoch).shuffle``).
EPOCH_ORDER_VERSION = 4
#: The first version of the current random-access order, and of the current WebDataset order (its
#: shard order; its shuffle buffer's order dates from 3).
RANDOM_ACCESS_ORDER_SINCE = 2
SHARD_ORDER_SINCE = 4
#: Feistel rounds per pass.
ROUNDS = 6
#: Positions computed at once (bounds the temporary arrays to a few MiB).
CHUNK = 1 << 16

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def round_keys(seed: int, epoch: int) -> np.ndarray:
    """The :data:`ROUNDS` round keys of ``(seed, epoch)`` (``uint64 [ROUNDS]``)."""
    digest = hashlib.blake2b(f"shardfeed-epoch-order:{int(seed)}:{int(epoch)}".encode(), digest_size=8 * ROUNDS)
    return np.frombuffer(digest.digest(), dtype="<u8").astype(np.uint64)


def _half_bits(num_samples: int) -> int:
    return ((int(num_samples) - 1).bit_length() + 1) // 2


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``uint64`` values (same shape), modulo ``2**64``."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def _feistel(x: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    h = np.uint64(half)
    mask = np.uint64((1 << half) - 1)
    left, right = x >> h, x & mask
    for k in keys:
        left, right = right, left ^ (mix64(right ^ k) & mask)
    return (left << h) | right


def _feistel_inverse(y: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    h = np.uint64(half)
    mask = np.uint64((1 << half) - 1)
    left, right = y >> h, y & mask
    for k in keys[::-1]:
        left, right = right ^ (mix64(left ^ k) & mask), left
    return (left << h) | right


def _permute_chunk(x: np.ndarray, n: int, keys: np.ndarray, half: int, inverse: bool = False) -> np.ndarray:
    step = _feistel_inverse if inverse else _feistel
    y = step(x, keys, half)
    limit = np.uint64(n)
    todo = np.flatnonzero(y >= limit)
    for _ in range(1 << (2 * half)):  # a walk never passes the domain's size; in practice it ends in tens
        if todo.size == 0:
            break
        z = step(y[todo], keys if keys.ndim == 1 else keys[:, todo], half)
        y[todo] = z
        todo = todo[z >= limit]
    return y


def permute(positions: np.ndarray, num_samples: int, *, seed: int, epoch: int, inverse: bool = False) -> np.ndarray:
    """Sample indices of ``positions`` in the epoch's permutation of ``[0, num_samples)``.

    Costs ``O(len(positions))`` time and memory, whatever ``num_samples`` is.

    Args:
        positions: integer array, any shape, values in ``[0, num_samples)``.
        num_samples: N, the size of the permuted range.
        seed, epoch: what the permutation is keyed by.
        inverse: map sample indices back to their positions instead (:func:`unpermute`).

    Returns:
        ``int64`` array of the same shape.

    Raises:
        ValueError: a position outside ``[0, num_samples)``.
    """
    return permute_keyed(positions, num_samples, round_keys(seed, epoch), inverse=inverse)


def permute_keyed(positions: np.ndarray, num_samples: int, keys: np.ndarray, *, inverse: bool = False) -> np.ndarray:
    """:func:`permute` with its round keys given: ``uint64 [ROUNDS]`` for every position, or
    ``uint64 [ROUNDS, positions.size]``, one column per position (several permutations of ``[0, N)``
    at once, as the shuffle buffer's windows use them).

    Returns:
        ``int64`` array, the shape of ``positions``.

    Raises:
        ValueError: a position outside ``[0, num_samples)``, or keys of another shape.
    """
    pos = np.asarray(positions, dtype=np.int64)
    n = int(num_samples)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"positions must lie in [0, {n}), got {int(pos.min())}..{int(pos.max())}")
    keys = np.asarray(keys, dtype=np.uint64)
    if keys.shape not in ((ROUNDS,), (ROUNDS, pos.size)):
        raise ValueError(f"round keys have shape {keys.shape}, not ({ROUNDS},) or ({ROUNDS}, {pos.size})")
    if n <= 1 or pos.size == 0:
        return pos.copy()
    half = _half_bits(n)
    flat = pos.reshape(-1)
    out = np.empty(flat.shape, dtype=np.int64)
    for a in range(0, flat.size, CHUNK):
        k = keys if keys.ndim == 1 else keys[:, a:a + CHUNK]
        out[a:a + CHUNK] = _permute_chunk(flat[a:a + CHUNK].astype(np.uint64), n, k, half, inverse)
    return out.reshape(pos.shape)


def unpermute(indices: np.ndarray, num_samples: int, *, seed: int, epoch: int) -> np.ndarray:
    """Positions of sample ``indices`` in the epoch's permutation: ``unpermute(permute(p)) == p``.

    The same cost and errors as :func:`permute` (``int64``, the shape of ``indices``).
    """
    return permute(indices, num_samples, seed=seed, epoch=epoch, inverse=True)


def check_state_epoch_order(state: Mapping, *, random_access: bool, shuffle: bool, mid_epoch: bool) -> None:
    """Refuse a loader state whose positions mean other samples under this epoch order.

    A state of version 1 has no ``epoch_order``: it was saved under epoch order 1. A state's positions
    still hold where the order it was saved under did not change: ``shuffle=False`` (the identity), a
    state at an epoch's start (nothing consumed) or at its end (it resumes at the next epoch's
    start), a random-access source's state of order 2 or later
    (:data:`RANDOM_ACCESS_ORDER_SINCE`), or a WebDataset state of order 4 or later
    (:data:`SHARD_ORDER_SINCE`: its shard order changed then, and its shuffle buffer's order at 3).
    Any other mid-epoch state of an older order is refused, and so is a mid-epoch state of a newer
    order than this shardfeed's.

    Args:
        state: a loader state (``ShardfeedLoader.state_dict()``), its other fields already checked.
        random_access: the loader's source is random-access (LMDB, folder, memory).
        shuffle: the loader shuffles.
        mid_epoch: the state names positions inside its epoch: some consumed, some left (at an
            epoch's start or after its last batch, its positions name nothing).

    Raises:
        ResumeStateError: ``epoch_order`` is not an integer, or names another order where it matters.
    """
    from ..errors import ResumeStateError

    order = state.get("epoch_order", 1 if state.get("version") == 1 else None)
    if type(order) is not int:
        raise ResumeStateError(f"loader state field epoch_order is {order!r}, not an integer: pass what "
                               "loader.state_dict() returned, or start the epoch afresh with loader.set_epoch(epoch)")
    if not (shuffle and mid_epoch) or order == EPOCH_ORDER_VERSION:
        return
    if order > EPOCH_ORDER_VERSION:
        what = f"an epoch order newer than this shardfeed's ({EPOCH_ORDER_VERSION})"
    elif random_access and order < RANDOM_ACCESS_ORDER_SINCE:
        what = f"random-access datasets by epoch order {EPOCH_ORDER_VERSION}"
    elif not random_access and order < SHARD_ORDER_SINCE:
        what = f"WebDataset shards (and shuffle buffers) by epoch order {EPOCH_ORDER_VERSION}"
    else:
        return
    raise ResumeStateError(f"the loader state was saved mid-epoch under epoch order {order}, and this "
                           f"shardfeed shuffles {what}: its positions would name other samples. Start the epoch "
                           f"afresh with loader.set_epoch({state.get('epoch')}), or finish the epoch with the "
                           "shardfeed that saved the state")
