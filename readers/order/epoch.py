"""The rule that splits an epoch across ranks and workers, and where a resumed epoch continues.

Pure functions (numpy and the standard library only; no torch, no sources), used by every source
(:mod:`~shardfeed.readers.sources.webdataset_source`, :mod:`~shardfeed.readers.sources.lmdb_source`,
:mod:`~shardfeed.readers.sources.folder_source`, :mod:`~shardfeed.readers.sources.memory_cache`) and by the
loader (:mod:`~shardfeed.readers.loader`). The format specification (docs/format.md,
"Splitting an epoch") is binding; this module is its one implementation.

**The epoch's global sequence** ``G`` of N positions. For every epoch:

1. shards (WebDataset): the shard order is the seeded permutation of the shard indices, place by
   place (:func:`shard_order`; ``shuffle=False`` keeps the manifest order), and the shards are laid
   end to end; random-access sources (LMDB, folder, ``cache="memory"``) use the same permutation of
   the N sample indices instead, computed per position (:func:`positions_to_indices`,
   :func:`~shardfeed.readers.order.permutation.permute`), so a process computes only the positions it reads;
2. ``G`` is cut into ``world_size`` equal contiguous ranges of ``N // world_size`` positions: the
   remainder ``N % world_size`` (the end of ``G``) is dropped, or, with ``pad=True``, every rank
   gets ``ceil(N / world_size)`` positions and the missing ones repeat ``G`` from its start
   (position ``p >= N`` stands for ``p % N``);
3. ``drop_last=True`` cuts each rank's range to whole batches (every rank alike);
4. the rank's *sequence* (the order in which its batches are delivered to the training loop):

   * random-access sources: the rank's range of ``G`` in order (the ``DataLoader``'s sampler
     hands the indices to the workers; the order does not depend on ``num_workers``);
   * WebDataset (a stream per worker): the rank's range is cut into ``num_workers`` contiguous
     sub-ranges of whole batches (the first ``nb % W`` workers get one batch more,
     :func:`worker_span`); each worker reads its sub-range front to back and mixes it
     with a seeded shuffle buffer (``shuffle_buffer`` samples: windows of that many samples, each
     emitted in a permuted order; :mod:`~shardfeed.readers.order.buffer_order`, whose order at any place
     is computed in constant time, :func:`shuffle_buffer_order`); the ``DataLoader`` takes one batch from each
     worker in turn, so batch ``j`` of the rank is batch ``j // W`` of worker ``j % W``
     (:func:`fresh_rank_sequence`).

**Resuming.** After ``k`` positions of every rank's sequence were consumed (``k = batches *
batch_size``, the same on every rank), the rest of the epoch is the concatenation, rank by rank,
of each rank's sequence from ``k`` on (:func:`remaining_sequence`). A resumed run cuts that
sequence again by steps 2-3 (with its own world size and batch size) and delivers each rank's
part in order; a worker reads every ``W``-th batch of it (:func:`worker_batches`), which the
``DataLoader``'s round robin delivers in order. So:

* with the same world size, batch size and number of workers, the batches equal those of the
  uninterrupted run (exact);
* with another number of workers or world size, every sample not yet consumed is read exactly once
  across ranks when ``ws * (L - k)`` divides by the new world size; otherwise the usual remainder
  rule applies to the rest of the epoch (its last ``M % world_size`` positions are dropped, or
  repeated from its start with ``pad=True``), and every rank gets the same number of batches.

A run may be resumed several times within one epoch: each earlier run is one *segment*
``{"world_size", "num_workers", "batch_size", "shuffle_buffer", "samples_consumed"}`` of the state, and
the sequences compose. Everything here depends only on positions and counts, never on where the
bytes are stored.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import ON_ERROR  # accepted values of ``on_error`` (defined with their one check)
from .buffer_order import shuffle_buffer_order
from .permutation import CHUNK, EPOCH_ORDER_VERSION, permute, unpermute

__all__ = [
    "ON_ERROR",
    "resolve_rank",
    "samples_per_rank",
    "num_batches",
    "rank_span",
    "worker_span",
    "shard_order",
    "spans_to_ranges",
    "iter_spans",
    "epoch_ranges",
    "epoch_positions",
    "shuffle_buffer_order",
    "fresh_rank_sequence",
    "remaining_sequence",
    "resumed_rank_sequence",
    "resumed_samples_per_rank",
    "worker_batches",
    "worker_batch_counts_before",
    "positions_to_indices",
    "RankOrder",
    "EPOCH_ORDER_VERSION",
    "SEGMENT_KEYS",
    "validate_resume_state",
    "MAX_RESUME_WORKERS",
    "MAX_RESUME_WORLD_SIZE",
    "MAX_RESUME_SEGMENTS",
]


#: The fields of one earlier run (segment) of a resumed epoch.
SEGMENT_KEYS = ("world_size", "num_workers", "batch_size", "shuffle_buffer", "samples_consumed")
#: Bounds on a loaded resume state's fields (far above any real run; a larger value is a damaged
#: or hostile state, and would make rebuilding the epoch's order loop or allocate without end).
MAX_RESUME_WORKERS = 4096
MAX_RESUME_WORLD_SIZE = 1 << 20
MAX_RESUME_SEGMENTS = 10_000
_MAX_RESUME_INT = 1 << 62


def validate_resume_state(state: Mapping, *, num_samples: int) -> None:
    """Check every field of a loaded loader state (``ShardfeedLoader.state_dict()``) before use.

    A resume state comes from a checkpoint file, so it is checked for type and range, and for
    consistency with the dataset, before any of it shapes an epoch:

    * ``fingerprint`` a string; ``seed`` an integer; ``shuffle``, ``pad``, ``drop_last`` booleans;
    * ``num_samples``, ``epoch``, ``batches_consumed`` non-negative integers;
    * ``world_size`` and ``batch_size`` in ``1..`` (:data:`MAX_RESUME_WORLD_SIZE` ranks),
      ``num_workers`` in ``0..``:data:`MAX_RESUME_WORKERS`, ``shuffle_buffer`` and
      ``samples_consumed`` non-negative, the latter at most ``num_samples`` (the epoch's length);
    * ``access``, when present, ``"stream"`` or ``"random"``;
    * ``segments`` a list of at most :data:`MAX_RESUME_SEGMENTS` objects with the same
      :data:`SEGMENT_KEYS` fields, checked the same way.

    (Whether a count fits what the earlier runs left, and whether the fields match this loader, is
    checked afterwards by the loader, which knows its own options.)

    Args:
        state: the state dict.
        num_samples: the dataset's sample count.

    Raises:
        ResumeStateError: the first bad field, named (``samples_consumed``, ``segments[0].num_workers``).
    """
    from ..errors import ResumeStateError

    def bad(field: str, problem: str) -> ResumeStateError:
        return ResumeStateError(f"loader state field {field} {problem}: pass what loader.state_dict() returned, or "
                                "start the epoch afresh with loader.set_epoch(epoch)")

    def integer(obj: Mapping, key: str, field: str, low: int, high: int) -> int:
        if key not in obj:
            raise bad(field, "is missing")
        v = obj[key]
        if type(v) is not int:
            raise bad(field, f"is {type(v).__name__} {v!r}, not an integer")
        if not low <= v <= high:
            raise bad(field, f"is {v}, outside {low}..{high}")
        return v

    def segment(obj: Mapping, prefix: str) -> None:
        integer(obj, "world_size", prefix + "world_size", 1, MAX_RESUME_WORLD_SIZE)
        integer(obj, "num_workers", prefix + "num_workers", 0, MAX_RESUME_WORKERS)
        integer(obj, "batch_size", prefix + "batch_size", 1, _MAX_RESUME_INT)
        integer(obj, "shuffle_buffer", prefix + "shuffle_buffer", 0, _MAX_RESUME_INT)
        integer(obj, "samples_consumed", prefix + "samples_consumed", 0, max(int(num_samples), 0))

    if not isinstance(state, Mapping):
        raise ResumeStateError(f"a loader state is a dict, not {type(state).__name__}")
    if not isinstance(state.get("fingerprint"), str):
        raise bad("fingerprint", f"is {state.get('fingerprint')!r}, not a string")
    integer(state, "seed", "seed", -_MAX_RESUME_INT, _MAX_RESUME_INT)
    for key in ("shuffle", "pad", "drop_last"):
        if type(state.get(key)) is not bool:
            raise bad(key, f"is {state.get(key)!r}, not true or false")
    integer(state, "num_samples", "num_samples", 0, _MAX_RESUME_INT)
    integer(state, "epoch", "epoch", 0, _MAX_RESUME_INT)
    integer(state, "batches_consumed", "batches_consumed", 0, _MAX_RESUME_INT)
    if "access" in state and state["access"] not in ("stream", "random"):
        raise bad("access", f"is {state['access']!r}, not \"stream\" or \"random\"")
    segment(state, "")
    segments = state.get("segments", [])
    if not isinstance(segments, list) or len(segments) > MAX_RESUME_SEGMENTS:
        raise bad("segments", f"is not a list of at most {MAX_RESUME_SEGMENTS} earlier runs")
    for i, seg in enumerate(segments):
        if not isinstance(seg, Mapping):
            raise bad(f"segments[{i}]", f"is {type(seg).__name__}, not an object")
        segment(seg, f"segments[{i}].")


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """The ``(rank, world_size)`` a reader should use.

    Precedence: explicit arguments, then ``torch.distributed`` when it is initialised, then the
    ``RANK``/``WORLD_SIZE`` environment variables (set by ``torchrun``), then ``(0, 1)``.
    An explicit argument wins so that a caller can always override what the process sees.

    Raises:
        ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.
    """
    r, w = rank, world_size
    if r is None or w is None:
        dr = dw = None
        try:
            import sys

            if "torch.distributed" in sys.modules:  # never import torch just to ask
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    dr, dw = dist.get_rank(), dist.get_world_size()
        except Exception:  # pragma: no cover - a broken torch build: fall back to the environment
            pass
        if dr is None:
            env_r, env_w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
            try:
                dr = int(env_r) if env_r is not None else None
                dw = int(env_w) if env_w is not None else None
            except ValueError:
                raise ValueError(f"RANK={env_r!r} / WORLD_SIZE={env_w!r} are not integers") from None
        if r is None:
            r = dr if dr is not None else 0
        if w is None:
            w = dw if dw is not None else 1
    if int(w) < 1:
        raise ValueError(f"world_size must be at least 1, got {w}")
    if not 0 <= int(r) < int(w):
        raise ValueError(f"rank {r} is outside [0, world_size={w})")
    return int(r), int(w)


def samples_per_rank(num_samples: int, world_size: int, *, pad: bool = False, batch_size: int = 1,
                     drop_last: bool = False) -> int:
    """Samples each rank reads per epoch (L): ``N // world_size`` (``ceil`` with ``pad``),
    cut down to whole batches with ``drop_last``."""
    n = -(-num_samples // world_size) if pad else num_samples // world_size
    if pad and num_samples == 0:
        n = 0
    if drop_last:
        n -= n % batch_size
    return n


def num_batches(num_samples: int, world_size: int, batch_size: int, *, pad: bool = False,
                drop_last: bool = False) -> int:
    """Batches per rank per epoch: ``ceil(L / batch_size)`` (``L // batch_size`` with ``drop_last``)."""
    n = samples_per_rank(num_samples, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    return -(-n // batch_size)


def rank_span(num_samples: int, rank: int, world_size: int, *, pad: bool = False, batch_size: int = 1,
              drop_last: bool = False) -> tuple[int, int]:
    """Half-open range ``[start, stop)`` of the epoch's global sequence that ``rank`` reads.

    With ``pad`` the range may pass ``num_samples``: position ``p`` then stands for ``p % N``.
    """
    per_rank = samples_per_rank(num_samples, world_size, pad=pad)
    start = rank * per_rank
    n = samples_per_rank(num_samples, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    return start, start + n


def worker_span(start: int, stop: int, num_workers: int, worker: int, *, batch_size: int = 1) -> tuple[int, int]:
    """Sub-range of ``[start, stop)`` read by ``worker`` of ``num_workers``, cut on batch boundaries.

    The ``nb`` batches of the range are dealt out in contiguous runs: every worker gets
    ``nb // W`` batches and the first ``nb % W`` workers one more, so that the ``DataLoader``'s
    round robin (one batch per worker in turn) delivers batch ``j`` of the rank from worker
    ``j % W``. Only the worker holding the range's last batch can hold a partial batch.

    Raises:
        ValueError: ``worker`` outside ``[0, num_workers)``.
    """
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is outside [0, num_workers={num_workers})")
    n = stop - start
    nb = -(-n // batch_size)
    q, r = divmod(nb, num_workers)
    b0 = worker * q + min(worker, r)
    b1 = b0 + q + (1 if worker < r else 0)
    return start + min(n, b0 * batch_size), start + min(n, b1 * batch_size)


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's shard order: place ``j`` holds shard ``permute(j)`` of the seeded permutation of
    ``[0, num_shards)`` keyed by ``(seed, epoch)`` (:func:`~shardfeed.readers.order.permutation.permute`,
    the rule random-access sources use for samples; epoch order 4), or ``j`` without ``shuffle``.

    Returns:
        ``int64 [num_shards]`` shard indices (into the manifest's shard list), in reading order.
    """
    places = np.arange(int(num_shards), dtype=np.int64)
    return permute(places, int(num_shards), seed=seed, epoch=epoch) if shuffle and num_shards > 1 else places


#: Places of the shard order turned into Python values at a time by :func:`iter_spans`.
_SPAN_BLOCK = 256


def iter_spans(counts: Sequence[int] | np.ndarray, order: Sequence[int] | np.ndarray, start: int,
               stop: int) -> Iterator[tuple[int, int, int]]:
    """The pieces of :func:`spans_to_ranges`, one at a time, as they are read.

    The first shard is found by a binary search over the shards' ends in ``order`` (numpy, one pass
    over the shard count, about 0.1 ms per 10,000 shards); the pieces after it are built
    :data:`_SPAN_BLOCK` shards at a time, so a reader that starts deep into an epoch, or stops
    early, builds only the pieces it reads.
    """
    start, stop = int(start), int(stop)  # numpy integers too: the pieces hold Python ints
    order_arr = np.asarray(order, dtype=np.int64)
    in_order = np.asarray(counts, dtype=np.int64)[order_arr] if len(order_arr) else np.zeros(0, np.int64)
    total = int(in_order.sum())
    if total == 0 or stop <= start:
        return
    ends = np.cumsum(in_order)
    last: tuple[int, int, int] | None = None
    pos = start
    while pos < stop:
        base = pos - pos % total
        rel, rel_stop = pos - base, min(stop - base, total)
        j = int(np.searchsorted(ends, rel, side="right"))
        k = int(np.searchsorted(ends, rel_stop - 1, side="right")) + 1
        for b0 in range(j, k, _SPAN_BLOCK):
            b1 = min(k, b0 + _SPAN_BLOCK)
            for i, c, end in zip(order_arr[b0:b1].tolist(), in_order[b0:b1].tolist(), ends[b0:b1].tolist()):
                first = end - c
                a, b = max(rel, first) - first, min(rel_stop, end) - first
                if b <= a:
                    continue
                if last is not None and last[0] == i and last[2] == a:
                    last = (i, last[1], b)
                    continue
                if last is not None:
                    yield last
                last = (i, a, b)
        pos = base + rel_stop
    if last is not None:
        yield last


def spans_to_ranges(counts: Sequence[int] | np.ndarray, order: Sequence[int] | np.ndarray, start: int,
                    stop: int) -> list[tuple[int, int, int]]:
    """Map global positions ``[start, stop)`` (shards laid end to end in ``order``) to
    ``(shard_index, start_sample, end_sample)`` pieces; positions past N wrap to the start
    (:func:`iter_spans` gives them one at a time)."""
    return list(iter_spans(counts, order, start, stop))


def epoch_ranges(shard_counts: Sequence[int], *, seed: int = 0, epoch: int = 0, rank: int = 0,
                 world_size: int = 1, num_workers: int = 1, worker: int = 0, pad: bool = False,
                 shuffle: bool = True, batch_size: int = 1,
                 drop_last: bool = False) -> list[tuple[int, int, int]]:
    """The sample ranges one worker of one rank reads in one (fresh) epoch.

    Args:
        shard_counts: samples per shard, in manifest order.
        seed, epoch: the shard order's permutation is keyed by ``(seed, epoch)`` (:func:`shard_order`).
        rank, world_size: this process's place among the ranks.
        num_workers, worker: DataLoader workers of this rank (1, 0 without workers).
        pad: fill the remainder ``N % world_size`` by repeating samples instead of dropping it.
        shuffle: shuffle the shard order (False: manifest order).
        batch_size: worker sub-ranges are cut on batch boundaries of this size.
        drop_last: drop each rank's last partial batch.

    Returns:
        ``[(shard_index, start_sample, end_sample), ...]``: half-open sample ranges inside shards
        (indices into the manifest's shard list), in reading order.

    Raises:
        ValueError: bad rank/worker or sizes.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    n = sum(shard_counts)
    start, stop = rank_span(n, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    a, b = worker_span(start, stop, num_workers, worker, batch_size=batch_size)
    order = shard_order(len(shard_counts), seed=seed, epoch=epoch, shuffle=shuffle)
    return spans_to_ranges(shard_counts, order, a, b)


def epoch_positions(num_samples: int, *, seed: int, epoch: int, shuffle: bool, rank: int, world_size: int,
                    pad: bool = False, batch_size: int = 1, drop_last: bool = False) -> list[int]:
    """Sample indices one rank reads in a fresh epoch, for random-access sources.

    The epoch's global sequence is the seeded permutation of ``range(num_samples)`` of
    :func:`positions_to_indices` (identity without ``shuffle``); the rank takes its contiguous range
    of it (:func:`rank_span`), wrapping with ``pad``. Only the rank's own positions are computed.
    """
    start, stop = rank_span(num_samples, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    if num_samples == 0:
        return []
    return positions_to_indices(num_samples, np.arange(start, stop, dtype=np.int64), seed=seed, epoch=epoch,
                                shuffle=shuffle).tolist()


# ---------------------------------------------------------------------------------------------
# sequences (numpy int64 arrays of positions in G) and resuming

def _worker_order(a: int, b: int, *, shuffle: bool, buffer: int, seed: int, epoch: int, rank: int,
                  worker: int) -> np.ndarray:
    if not shuffle or buffer <= 1:
        return np.arange(a, b, dtype=np.int64)
    return a + shuffle_buffer_order(b - a, buffer=buffer, seed=seed, epoch=epoch, rank=rank, worker=worker)


def fresh_rank_sequence(num_samples: int, *, rank: int, world_size: int, batch_size: int, num_workers: int,
                        buffer: int, seed: int, epoch: int, shuffle: bool, pad: bool = False,
                        drop_last: bool = False, streams: bool = False) -> np.ndarray:
    """The rank's positions in ``G`` in the order its batches are delivered, for a fresh epoch.

    Random-access sources (``streams=False``: the sampler hands out the positions), or one worker
    without a shuffle buffer: the rank's range in order. Else the WebDataset rule of the module
    docstring (``streams=True``: worker sub-ranges, shuffle buffers, round robin of batches over
    ``num_workers`` workers), with or without a buffer.

    Returns:
        ``int64 [L]`` positions (``>= N`` for padded ones: ``p % N``).
    """
    start, stop = rank_span(num_samples, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    if (not shuffle or buffer <= 1) and (not streams or num_workers <= 1):
        return np.arange(start, stop, dtype=np.int64)
    w_count = max(1, int(num_workers))
    parts, keys = [], []
    for w in range(w_count):
        a, b = worker_span(start, stop, w_count, w, batch_size=batch_size)
        parts.append(_worker_order(a, b, shuffle=shuffle, buffer=buffer, seed=seed, epoch=epoch, rank=rank,
                                   worker=w))
        keys.append((np.arange(b - a, dtype=np.int64) // batch_size) * w_count + w)
    if not parts:
        return np.empty(0, dtype=np.int64)
    seq, key = np.concatenate(parts), np.concatenate(keys)
    return seq[np.argsort(key, kind="stable")]


def _check_segment(seg: Mapping, length: int) -> tuple[int, int, int, int, int]:
    try:
        ws, nw, bs, win, k = (int(seg[name]) for name in SEGMENT_KEYS)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"a resume segment needs integer fields {', '.join(SEGMENT_KEYS)}; got {dict(seg)!r}"
                         ) from None
    if ws < 1 or bs < 1 or nw < 0 or k < 0:
        raise ValueError(f"a resume segment has impossible values: {dict(seg)!r}")
    return ws, nw, bs, win, k


def resumed_samples_per_rank(num_samples: int, segments: Iterable[Mapping], *, world_size: int, batch_size: int,
                             pad: bool = False, drop_last: bool = False) -> int:
    """Positions each rank reads in the rest of an epoch after the earlier runs ``segments``.

    Arithmetic only: each segment leaves ``ws * (L - k)`` positions for the next.

    Raises:
        ValueError: a segment consumed more than its ranks had.
    """
    m = int(num_samples)
    for seg in segments:
        ws, _, bs, _, k = _check_segment(seg, m)
        length = samples_per_rank(m, ws, pad=pad, batch_size=bs, drop_last=drop_last)
        if k > length:
            raise ValueError(f"a resume segment consumed {k} samples per rank but its ranks had {length}")
        m = ws * (length - k)
    return samples_per_rank(m, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)


def remaining_sequence(num_samples: int, segments: Sequence[Mapping], *, seed: int, epoch: int, shuffle: bool,
                       pad: bool = False, drop_last: bool = False, streams: bool = False) -> np.ndarray | None:
    """What is left of the epoch after the earlier runs ``segments`` (None: nothing consumed yet).
    ``streams``: the runs read a WebDataset, a stream per worker (:func:`fresh_rank_sequence`).

    Returns:
        ``int64 [M]``: positions in ``G``, rank 0's rest first, each rank's in delivery order.

    Raises:
        ValueError: a malformed segment, or one that consumed more than its ranks had.
    """
    rest: np.ndarray | None = None
    for seg in segments:
        ws, nw, bs, win, k = _check_segment(seg, num_samples)
        seqs = [_segment_rank_sequence(num_samples, rest, rank=r, world_size=ws, batch_size=bs, num_workers=nw,
                                       buffer=win, seed=seed, epoch=epoch, shuffle=shuffle, pad=pad,
                                       drop_last=drop_last, streams=streams) for r in range(ws)]
        if seqs and k > len(seqs[0]):
            raise ValueError(f"a resume segment consumed {k} samples per rank but its ranks had {len(seqs[0])}")
        rest = np.concatenate([s[k:] for s in seqs]) if seqs else np.empty(0, dtype=np.int64)
    return rest


def _segment_rank_sequence(num_samples: int, rest: np.ndarray | None, *, rank: int, world_size: int,
                           batch_size: int, num_workers: int, buffer: int, seed: int, epoch: int, shuffle: bool,
                           pad: bool, drop_last: bool, streams: bool = False) -> np.ndarray:
    if rest is None:
        return fresh_rank_sequence(num_samples, rank=rank, world_size=world_size, batch_size=batch_size,
                                   num_workers=num_workers, buffer=buffer, seed=seed, epoch=epoch,
                                   shuffle=shuffle, pad=pad, drop_last=drop_last, streams=streams)
    m = len(rest)
    start, stop = rank_span(m, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    if m == 0 or stop <= start:
        return np.empty(0, dtype=np.int64)
    return rest[np.arange(start, stop, dtype=np.int64) % m]


def resumed_rank_sequence(num_samples: int, segments: Sequence[Mapping], *, rank: int, world_size: int,
                          batch_size: int, num_workers: int, buffer: int, seed: int, epoch: int, shuffle: bool,
                          pad: bool = False, drop_last: bool = False, streams: bool = False) -> np.ndarray:
    """The rank's positions in delivery order for this run, after the earlier runs ``segments``
    (a fresh epoch when ``segments`` is empty). ``streams``: a WebDataset, a stream per worker
    (:func:`fresh_rank_sequence`).

    Returns:
        ``int64 [L]`` positions in ``G`` (``p % N`` for padded ones).
    """
    rest = remaining_sequence(num_samples, segments, seed=seed, epoch=epoch, shuffle=shuffle, pad=pad,
                              drop_last=drop_last, streams=streams)
    return _segment_rank_sequence(num_samples, rest, rank=rank, world_size=world_size, batch_size=batch_size,
                                  num_workers=num_workers, buffer=buffer, seed=seed, epoch=epoch,
                                  shuffle=shuffle, pad=pad, drop_last=drop_last, streams=streams)


def worker_batches(sequence: np.ndarray, *, batch_size: int, num_workers: int, worker: int) -> np.ndarray:
    """The part of a rank's sequence that ``worker`` reads: batches ``worker, worker + W, ...``.

    The ``DataLoader`` takes one batch from each worker in turn, so it delivers them in the
    sequence's order whatever ``num_workers`` is.
    """
    idx = np.arange(len(sequence), dtype=np.int64)
    return sequence[(idx // batch_size) % max(1, num_workers) == worker]


def worker_batch_counts_before(num_batches_consumed: int, num_workers: int) -> list[int]:
    """Batches each worker had delivered when ``num_batches_consumed`` batches of a rank were
    consumed (batch ``j`` comes from worker ``j % W``)."""
    w = max(1, int(num_workers))
    b = int(num_batches_consumed)
    return [(b - i + w - 1) // w if b > i else 0 for i in range(w)]


def positions_to_indices(num_samples: int, positions: np.ndarray, *, seed: int, epoch: int,
                         shuffle: bool) -> np.ndarray:
    """Sample indices of positions in ``G`` for random-access sources (``p >= N`` wraps to ``p % N``).

    ``G`` is the seeded permutation of ``range(num_samples)`` keyed by ``(seed, epoch)``
    (:func:`~shardfeed.readers.order.permutation.permute`, epoch order version :data:`EPOCH_ORDER_VERSION`),
    or the identity without ``shuffle``. Costs ``O(len(positions))`` time and memory whatever N is.

    Returns:
        ``int64`` array of sample indices, same shape as ``positions``.
    """
    if num_samples == 0 or len(positions) == 0:
        return np.empty(0, dtype=np.int64)
    phys = np.asarray(positions, dtype=np.int64)
    if int(phys.min()) < 0 or int(phys.max()) >= num_samples:  # padded positions: wrap (a copy)
        phys = phys % num_samples
    if not shuffle:
        return phys.copy() if phys is positions else phys
    return permute(phys, num_samples, seed=seed, epoch=epoch)


#: A resumed order held as more runs of consecutive positions than this is held as an array instead.
_MAX_RUNS = 1 << 16


def _take_runs(runs: Sequence[tuple[int, int]], total: int, start: int, stop: int) -> list[tuple[int, int]]:
    """Places ``[start, stop)`` of the concatenation of ``runs`` (``(first position, length)`` each,
    ``total`` places in all; places ``>= total`` wrap around), as runs."""
    out: list[tuple[int, int]] = []
    q = start
    while q < stop and total > 0:  # a rank's share is at most the whole: at most three pieces
        base = q % total
        take = min(stop - q, total - base)
        place = 0
        for first, length in runs:
            lo, hi = max(base, place), min(base + take, place + length)
            if lo < hi:
                out.append((first + lo - place, hi - lo))
            place += length
            if place >= base + take:
                break
        q += take
    return out


def _resumed_runs(num_samples: int, segments: Sequence[Mapping], *, rank: int, world_size: int, batch_size: int,
                  shuffle: bool, pad: bool, drop_last: bool) -> list[tuple[int, int]] | None:
    """The rank's positions after ``segments`` as runs of consecutive positions, by the rule of
    :func:`remaining_sequence` (None: a segment had a shuffle buffer, or the runs are too many)."""
    runs: list[tuple[int, int]] | None = None
    total = int(num_samples)
    for seg in segments:
        ws, _, bs, win, k = _check_segment(seg, num_samples)
        if shuffle and win > 1:
            return None
        per_rank = []
        for r in range(ws):
            a, b = rank_span(total, r, ws, pad=pad, batch_size=bs, drop_last=drop_last)
            if runs is None:
                per_rank.append([(a, b - a)] if b > a and total else [])
            else:
                per_rank.append(_take_runs(runs, total, a, b))
        have = sum(length for _, length in per_rank[0]) if per_rank else 0
        if per_rank and k > have:
            raise ValueError(f"a resume segment consumed {k} samples per rank but its ranks had {have}")
        runs = []
        for mine in per_rank:
            mine_total = sum(length for _, length in mine)
            runs += _take_runs(mine, mine_total, k, mine_total)
        total = sum(length for _, length in runs)
        if len(runs) > _MAX_RUNS:
            return None
    a, b = rank_span(total, rank, world_size, pad=pad, batch_size=batch_size, drop_last=drop_last)
    if runs is None:  # a fresh epoch: the rank's range
        return [(a, b - a)] if b > a and total else []
    return _take_runs(runs, total, a, b)


class RankOrder:
    """One rank's sample indices of one epoch of a random-access source, in the order its sampler
    hands them out, computed a slice at a time.

    The rank's positions in ``G`` are held as runs of consecutive positions: one run, the rank's
    range (:func:`rank_span`), in a fresh epoch; a few per earlier run in a resumed one (``segments``,
    the rank's part of :func:`remaining_sequence`). So a slice costs its own length, whatever N is.
    (Segments with a shuffle buffer, which random-access sources do not write, are computed as one array.)

    Raises:
        ValueError: a malformed segment, or one that consumed more than its ranks had.
    """

    def __init__(self, num_samples: int, segments: Sequence[Mapping] = (), *, rank: int, world_size: int,
                 batch_size: int, seed: int, epoch: int, shuffle: bool, pad: bool = False,
                 drop_last: bool = False) -> None:
        self.num_samples, self.seed, self.epoch, self.shuffle = int(num_samples), int(seed), int(epoch), bool(shuffle)
        self._held: np.ndarray | None = None
        runs = _resumed_runs(self.num_samples, segments, rank=rank, world_size=world_size, batch_size=batch_size,
                             shuffle=self.shuffle, pad=pad, drop_last=drop_last)
        if runs is None:
            seq = resumed_rank_sequence(self.num_samples, segments, rank=rank, world_size=world_size,
                                        batch_size=batch_size, num_workers=1, buffer=0, seed=seed, epoch=epoch,
                                        shuffle=shuffle, pad=pad, drop_last=drop_last)
            self._held = positions_to_indices(self.num_samples, seq, seed=seed, epoch=epoch, shuffle=shuffle)
            runs = [(0, len(seq))]
        self._firsts = np.array([first for first, _ in runs], dtype=np.int64)
        self._lengths = np.array([length for _, length in runs], dtype=np.int64)
        self._places = np.concatenate([[0], np.cumsum(self._lengths)]).astype(np.int64)
        self._len = int(self._places[-1])

    def __len__(self) -> int:
        return self._len

    def _positions(self, a: int, b: int) -> np.ndarray:
        i = int(np.searchsorted(self._places, a, side="right")) - 1
        parts = []
        while a < b:
            first, place, length = int(self._firsts[i]), int(self._places[i]), int(self._lengths[i])
            hi = min(b, place + length)
            parts.append(np.arange(first + a - place, first + hi - place, dtype=np.int64))
            a, i = hi, i + 1
        return np.concatenate(parts)

    def slice(self, a: int, b: int) -> np.ndarray:
        """The sample indices at places ``[a, b)`` (clipped to the order; ``int64``)."""
        a, b = max(0, int(a)), min(self._len, int(b))
        if b <= a:
            return np.empty(0, dtype=np.int64)
        if self._held is not None:
            return self._held[a:b]
        return positions_to_indices(self.num_samples, self._positions(a, b), seed=self.seed, epoch=self.epoch,
                                    shuffle=self.shuffle)

    def chunks(self, size: int = CHUNK) -> Iterator[np.ndarray]:
        """The whole order, ``size`` indices at a time (each computed when it is asked for)."""
        for a in range(0, self._len, max(1, int(size))):
            yield self.slice(a, a + size)

    def places_of(self, index: int) -> np.ndarray:
        """The places holding sample ``index``, ascending (more than one only with ``pad``; ``int64``)."""
        n, index = self.num_samples, int(index)
        if not 0 <= index < n or self._len == 0:
            return np.empty(0, dtype=np.int64)
        if self._held is not None:
            return np.flatnonzero(self._held == index).astype(np.int64)
        g = int(unpermute(np.array([index]), n, seed=self.seed, epoch=self.epoch)[0]) if self.shuffle else index
        ends = self._firsts + self._lengths
        firsts = g + n * np.maximum(0, -((g - self._firsts) // n))  # each run's first position holding it
        out = [np.arange(f, e, n, dtype=np.int64) - s + p
               for f, e, s, p in zip(firsts, ends, self._firsts, self._places) if f < e]
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)
