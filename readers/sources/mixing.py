"""Weighted mixing of several sources, and epochs of a fixed number of samples.

:func:`~shardfeed.readers.loader.make_loader` builds a :class:`MixedSource` when it is given a list
of sources, or ``samples_per_epoch=N`` (one source is a mix of one). The rule (docs/scale.md):

* **Counts.** Each epoch holds exactly N samples. Source ``s`` gets ``k_s`` of them: ``N * w_s / sum(w)``
  rounded down, and the ``N - sum(floor)`` samples left go one each to the sources with the largest
  remainders (ties: the lower source index first) (:func:`split_counts`). The counts are the same in
  every epoch.
* **Slots.** The epoch's N positions are permuted like those of a random-access source of N samples
  (:class:`~shardfeed.readers.order.epoch.RankOrder`, keyed by ``(seed, epoch)``; the identity without
  ``shuffle``), and split across ranks and workers by the same rule. A permuted position ``q`` is a
  *slot*: slots ``[c_s, c_s + k_s)`` belong to source ``s`` (``c_s``: the counts of the sources before
  it), and slot ``c_s + j`` is draw ``j`` of source ``s`` in the epoch.
* **Draws.** Draw ``j`` of epoch ``e`` is the source's draw number ``g = e * k_s + j`` since the start.
  Draws go through the source's samples in a seeded order, pass after pass (:class:`SourceDraws`):
  every sample is drawn once before any is drawn again. The order is a seeded permutation of the
  source's ``M`` samples, kept for a *cycle* of ``lcm(M, k_s)`` draws (a whole number of passes and of
  epochs), and a new one is drawn for the next cycle. So an epoch never spans two orders: a source with
  ``k_s <= M`` never repeats a sample within an epoch, and one with ``k_s > M`` repeats a sample only
  after all of its samples were drawn.

Everything is computed per position, so a resumed epoch only needs the epoch and the positions
consumed (the loader's state; :mod:`~shardfeed.readers.loader`). Under a loader, the sampler works
out ``(source, sample index, pass)`` for a chunk of slots at once (:meth:`MixedSource.locate_items`);
the workers only read and decode.

Sources are read by index: LMDB, image folders, ``cache="memory"``, and WebDataset through its offset
index (each sample one read of its bytes; give remote ones a ``cache_dir`` so each shard is fetched
once). A WebDataset without offset indexes is refused.

Each item may say its source: ``fields=("source",)`` appends the source's index (``int``, the order
of the list) to the item, after the other fields. Labels stay each source's own labels.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
from typing import Any, Sequence

import numpy as np
import torch.utils.data

from .options import ReadOptions
from ..order.permutation import permute
from .source_base import SourceBase

__all__ = ["MixedSource", "SourceDraws", "split_counts", "check_mix", "SOURCE_FIELD", "MAX_SOURCES"]

#: The field that names an item's source (its index in the list of sources).
SOURCE_FIELD = "source"
#: Most sources one mix may hold.
MAX_SOURCES = 1024


def check_mix(num_sources: int, weights: Any, samples_per_epoch: Any) -> tuple[list[float], int]:
    """Check the weights and epoch size of a mix; returns ``(weights as floats, N)``.

    ``weights=None`` gives every source the weight 1.

    Raises:
        ValueError: no sources or more than :data:`MAX_SOURCES`; a weight count other than the
            source count; a weight that is not positive and finite; ``samples_per_epoch`` below 1.
        TypeError: ``samples_per_epoch`` is not an integer (a bool, float or string); a weight is not a number.
    """
    if num_sources < 1 or num_sources > MAX_SOURCES:
        raise ValueError(f"a mix needs 1 to {MAX_SOURCES} sources, got {num_sources}")
    if isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, numbers.Integral):
        raise TypeError(f"samples_per_epoch must be an integer, got {samples_per_epoch!r} "
                        f"({type(samples_per_epoch).__name__})")
    n = int(samples_per_epoch)
    if n < 1:
        raise ValueError(f"samples_per_epoch must be at least 1, got {n}")
    if weights is None:
        return [1.0] * num_sources, n
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"weights must be a list of numbers, one per source, got {weights!r}")
    if len(weights) != num_sources:
        raise ValueError(f"weights has {len(weights)} values but there are {num_sources} sources: give one "
                         "weight per source")
    out = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise TypeError(f"weights[{i}] is {w!r}, not a number")
        if not math.isfinite(float(w)) or float(w) <= 0:
            raise ValueError(f"weights[{i}] is {w!r}: every weight must be positive and finite")
        out.append(float(w))
    return out, n


def split_counts(samples_per_epoch: int, weights: Sequence[float]) -> list[int]:
    """Samples of each source per epoch: ``N * w / sum(w)`` by the largest-remainder rule.

    Args:
        samples_per_epoch: N (``>= 1``).
        weights: positive finite weights, one per source.

    Returns:
        One count per source (``int``), summing to N.
    """
    n = int(samples_per_epoch)
    total = math.fsum(weights)
    shares = [n * w / total for w in weights]
    counts = [min(n, math.floor(s)) for s in shares]
    left = n - sum(counts)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in by_remainder[:max(0, left)]:
        counts[i] += 1
    return counts


def _cycle_seed(seed: int, source: int, cycle: int) -> int:
    """The key of source ``source``'s order in cycle ``cycle`` (a 63-bit integer, distinct from the
    epoch orders' keys by its derivation)."""
    digest = hashlib.blake2b(f"shardfeed-mix-draws:{int(seed)}:{int(source)}:{int(cycle)}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SourceDraws:
    """Which sample each draw of one source of a mix reads (the module docstring's rule).

    Args:
        num_samples: M, the source's samples (``>= 1``).
        per_epoch: ``k``, the source's draws per epoch (``>= 1``).
        seed: the run's seed.
        source: the source's index in the mix (keys its order).
        shuffle: False draws the samples in packing order, pass after pass.
    """

    def __init__(self, num_samples: int, per_epoch: int, *, seed: int, source: int, shuffle: bool = True) -> None:
        self.num_samples, self.per_epoch = int(num_samples), int(per_epoch)
        self.seed, self.source, self.shuffle = int(seed), int(source), bool(shuffle)
        #: draws that share one order: whole passes and whole epochs
        self.cycle = math.lcm(self.num_samples, self.per_epoch)

    def indices(self, epoch: int, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sample index, pass)`` of draws ``draws`` (``[0, k)``) of ``epoch``: the samples' packing-order
        indices and the pass over the source each draw belongs to (both ``int64``, shaped like ``draws``)."""
        g = int(epoch) * self.per_epoch + np.asarray(draws, dtype=np.int64)
        within, passes = g % self.num_samples, g // self.num_samples
        if not self.shuffle or self.num_samples <= 1 or within.size == 0:
            return within, passes
        cycles = g // self.cycle
        out = np.empty_like(within)
        for c in np.unique(cycles).tolist():  # one epoch lies in one cycle: one pass of this loop
            sel = cycles == c
            out[sel] = permute(within[sel], self.num_samples, seed=_cycle_seed(self.seed, self.source, c), epoch=0)
        return out, passes


class MixedSource(SourceBase, torch.utils.data.Dataset):
    """A map-style dataset of ``samples_per_epoch`` items per epoch drawn from several sources by weight.

    Built by :func:`~shardfeed.readers.loader.make_loader`; ``self[q]`` reads slot ``q`` (``[0, N)``)
    of the current epoch (see the module docstring). ``len(ds)`` and :attr:`num_samples` are N.

    Args:
        sources: opened sources, read by index (LMDB, folder, memory cache, or WebDataset with offset
            indexes), all with the same decode options.
        weights: one positive weight per source (None: equal).
        samples_per_epoch: N, items per epoch, all ranks together.
        read: the shared options (seed, shuffle, pad, rank, world size, decode, on_error); its
            ``fields`` may name :data:`SOURCE_FIELD` besides the sources' own fields.

    Raises:
        ValueError, TypeError: bad weights or N (:func:`check_mix`); an empty source; a WebDataset
            without offset indexes.
    """

    map_style = True

    def __init__(self, sources: Sequence[Any], weights: Sequence[float] | None, samples_per_epoch: int,
                 read: ReadOptions) -> None:
        from .mixing_access import by_index

        self.weights, n = check_mix(len(sources), weights, samples_per_epoch)
        self.sources = [by_index(s) for s in sources]
        for i, s in enumerate(self.sources):
            if s.num_samples < 1:
                raise ValueError(f"source {i} ({s!r}) holds no samples: a mix cannot draw from it")
        self._init_common(ReadOptions(**{**_read_fields(read), "fields": ()}))
        self.fields = tuple(read.fields)
        self._source_field = SOURCE_FIELD in self.fields
        self._num_samples = n
        self.counts = split_counts(n, self.weights)
        self._starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.draws = [SourceDraws(s.num_samples, k, seed=self.seed, source=i, shuffle=self.shuffle)
                      for i, (s, k) in enumerate(zip(self.sources, self.counts))]
        self.sample_decoder = self.sources[0].sample_decoder  # one decoder for every source
        for s in self.sources:
            s.sample_decoder = self.sample_decoder
            s.set_distributed(self.rank, self.world_size)
            s._mix_draw = (0, 0)
            s.sample_rng = functools.partial(_draw_generator, s)
        self._classes = []
        self._class_to_idx = {}

    def __repr__(self) -> str:
        parts = ", ".join(f"{s!r}: {k}" for s, k in zip(self.sources, self.counts))
        return f"MixedSource({parts}; {self._num_samples} per epoch, rank={self.rank}/{self.world_size})"

    def __len__(self) -> int:
        return self._num_samples

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the sources' fingerprints, their counts per epoch and N."""
        doc = {"sources": [s.fingerprint for s in self.sources], "counts": self.counts, "n": self._num_samples}
        return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()

    @property
    def classes(self) -> list[list[str]]:  # type: ignore[override]  # one list per source
        """Each source's class names (labels are per source: read them with the ``source`` field)."""
        return [s.classes for s in self.sources]

    # ---- configuration reaches the sources
    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        for s in self.sources:
            s.set_epoch(epoch)

    def configure_batching(self, batch_size: int, drop_last: bool = False) -> None:
        super().configure_batching(batch_size, drop_last)
        for s in self.sources:
            s.configure_batching(batch_size, drop_last)
            s.batch_rows = self.batch_rows  # one decoder, one set of rows: a batch's rows fill one buffer

    def separate_shared_state(self) -> None:
        super().separate_shared_state()
        for s in self.sources:
            s.separate_shared_state()

    def set_distributed(self, rank: int | None = None, world_size: int | None = None) -> None:
        super().set_distributed(rank, world_size)
        for s in getattr(self, "sources", ()):
            s.set_distributed(self.rank, self.world_size)

    def worker_init(self, worker_id: int) -> None:
        super().worker_init(worker_id)
        for s in self.sources:
            s._worker_id = int(worker_id)

    def _enter_epoch(self, e: int, worker: int | None) -> None:
        super()._enter_epoch(e, worker)  # the one decoder starts the epoch once
        for s in self.sources:
            s._ctx_epoch = e  # the sources then see no change of epoch mid-batch

    # ---- reading
    def locate(self, epoch: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source index, sample index, pass)`` of each slot of ``epoch`` (``int64`` arrays shaped like
        ``slots``; ``pass``: the pass over that source the draw belongs to).

        Raises:
            IndexError: a slot outside ``[0, N)``.
        """
        q = np.asarray(slots, dtype=np.int64)
        if q.size and (int(q.min()) < 0 or int(q.max()) >= self._num_samples):
            raise IndexError(f"slot {int(q.min()) if int(q.min()) < 0 else int(q.max())} is outside "
                             f"[0, {self._num_samples})")
        which = np.searchsorted(self._starts, q, side="right") - 1
        index, passes = np.empty_like(q), np.empty_like(q)
        for s in np.unique(which).tolist():
            sel = which == s
            index[sel], passes[sel] = self.draws[s].indices(epoch, q[sel] - self._starts[s])
        return which, index, passes

    def locate_items(self, epoch: int, slots: np.ndarray) -> list[tuple[int, int, int]]:
        """``(source, sample index, pass)`` of each slot of ``epoch``: what the loader's sampler hands
        to :meth:`__getitems__` (computed a chunk at a time there, not a batch at a time in the workers)."""
        return list(zip(*(a.tolist() for a in self.locate(epoch, slots))))

    def __getitem__(self, q: int):
        return self.__getitems__([q])[0]

    def __getitems__(self, slots) -> list:
        """The items of ``slots`` of the current epoch, in that order (None for a skipped one); each slot
        an ``int`` in ``[0, N)`` or, from the loader's sampler, its ``(source, sample index, pass)``.

        Each source reads its samples of the batch together (its own ``__getitems__`` where it has one),
        one read per pass over it. A sample's random crop and flip are keyed by the pass and the
        sample (:func:`_draw_generator`), so a sample drawn again is cropped anew.
        """
        self._map_epoch_check()
        epoch = self._ctx_epoch if self._ctx_epoch is not None else 0
        slots = list(slots)
        if slots and isinstance(slots[0], tuple):  # located by the loader's sampler (locate_items)
            which, index, passes = (np.asarray(a, dtype=np.int64) for a in zip(*slots))
        else:
            which, index, passes = self.locate(epoch, np.asarray(slots, dtype=np.int64))
        out: list[Any] = [None] * len(which)
        for s, p in sorted(set(zip(which.tolist(), passes.tolist()))):
            places = np.flatnonzero((which == s) & (passes == p)).tolist()
            src = self.sources[s]
            src._mix_draw = (len(self.sources) * p, s)  # read by _draw_generator while these samples decode
            wanted = index[places].tolist()
            items = src.__getitems__(wanted) if hasattr(src, "__getitems__") else [src[i] for i in wanted]
            for place, item in zip(places, items):
                out[place] = item
        if self._source_field:
            out = [None if item is None else _with_source(item, int(s), self.decode)
                   for item, s in zip(out, which.tolist())]
        return out

    # ---- skipped samples are counted by the sources
    def skipped_in_epoch(self, epoch: int) -> int:
        """Samples skipped in ``epoch`` in every source of the mix, by every process."""
        return super().skipped_in_epoch(epoch) + sum(s.skipped_in_epoch(epoch) for s in self.sources)

    @property
    def skipped_total(self) -> int:
        """Samples skipped in all epochs so far in every source of the mix, all processes together."""
        return int(self._skip_table[:, 2].sum()) + sum(s.skipped_total for s in self.sources)


def _draw_generator(source: Any, index: int) -> np.random.Generator:
    """A mixed source's ``sample_rng``: the generator of sample ``index`` keyed by ``(seed, S * pass + s,
    index)`` (``S`` sources, this one ``s``; :func:`~shardfeed.readers.decode.transforms.sample_generator`), so
    each draw of a sample is cropped and flipped anew, and two sources' samples of one index differently."""
    from ..decode.transforms import sample_generator

    key, s = source._mix_draw
    return sample_generator(source.seed, key + s, index)


def _with_source(item: Any, source: int, decode: bool) -> Any:
    """``item`` with its source: appended to a decoded item, added to a raw item's field dict."""
    if decode:
        return (*item, source) if isinstance(item, tuple) else (item, source)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], dict):
        return (item[0], {**item[1], SOURCE_FIELD: source})
    return (item, {SOURCE_FIELD: source})


def _read_fields(read: ReadOptions) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(read, f.name) for f in dataclasses.fields(read)}


def open_mix(sources: Any, weights: Any, samples_per_epoch: Any, *, shuffle: bool, seed: int, pad: bool,
             rank: int | None, world_size: int | None, options: dict[str, Any]) -> MixedSource:
    """:func:`~shardfeed.readers.loader.make_loader`'s mixed dataset: each source (a path or URL, or
    a source already opened) opened with :func:`~shardfeed.readers.sources.dataset.open_dataset` and the same
    options, then mixed.

    Raises:
        ValueError, TypeError: what :func:`check_mix` and :func:`~shardfeed.readers.sources.dataset.open_dataset`
            raise; ``samples_per_epoch`` missing; options given with a source already opened.
    """
    from .dataset import open_dataset
    from .options import READ_OPTION_NAMES

    many = isinstance(sources, (list, tuple))
    listed = list(sources) if many else [sources]
    if weights is not None and not many:
        raise ValueError("weights apply to a list of sources: make_loader([a, b], weights=[...], "
                         "samples_per_epoch=N)")
    if samples_per_epoch is None:
        raise ValueError("a list of sources is mixed into epochs of a fixed size: pass samples_per_epoch=N "
                         "(and weights=[...], one per source)")
    check_mix(len(listed), weights, samples_per_epoch)
    fields = ReadOptions(fields=options.get("fields") or ()).fields
    own = {**options, "fields": tuple(f for f in fields if f != SOURCE_FIELD)}
    opened = []
    for src in listed:
        if isinstance(src, SourceBase):
            src.shuffle, src.seed, src.pad = bool(shuffle), int(seed), bool(pad)
            opened.append(src)
        else:
            opened.append(open_dataset(src, shuffle=shuffle, seed=seed, pad=pad, rank=rank, world_size=world_size,
                                       **own))
    read = ReadOptions(**{k: v for k, v in options.items() if k in READ_OPTION_NAMES and k != "fields"},
                       shuffle=shuffle, seed=seed, pad=pad, rank=rank, world_size=world_size, fields=fields)
    return MixedSource(opened, weights, samples_per_epoch, read)
