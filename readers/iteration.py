"""The iterator ``iter(ShardfeedLoader)`` returns, and what it records of the epoch.

:class:`EpochIterator` wraps the ``DataLoader``'s iterator: it counts the batches delivered (for
:meth:`~shardfeed.readers.loader.ShardfeedLoader.state_dict`), reports the epoch's skipped samples
once at its end, and turns a worker's batch in a reused shared-memory slot into a view of it.
:class:`EpochProgress` is what the loader keeps of the latest iteration.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, cast

from .batching.buffers import RingBatch
from .runtime import at_exit

if TYPE_CHECKING:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

__all__ = ["EpochIterator", "EpochProgress", "release_epoch_iterators"]


class EpochProgress:
    """What the training loop received from the latest ``iter(loader)``: its epoch, the batches
    delivered, whether it ran to its end, and the earlier runs of that epoch (``segments``) when it
    was a resumed one. The loader holds it strongly and the iterator updates it, so an iteration
    left early (``break``, an exception in the step, ``itertools.islice``, ``del it``) still counts
    after its iterator is gone (the iterator holds the loader, the loader never holds the iterator)."""

    __slots__ = ("epoch", "batches", "finished", "segments")

    def __init__(self, epoch: int, segments: list[dict[str, Any]]) -> None:
        self.epoch = int(epoch)
        self.batches = 0
        self.finished = False
        self.segments = segments


#: The epoch iterators alive in this process, released before the interpreter exits
#: (:func:`release_epoch_iterators`).
_LIVE_ITERATORS: "weakref.WeakSet[EpochIterator]" = weakref.WeakSet()


def release_epoch_iterators() -> None:
    """Drop the ``DataLoader`` iterators still held at exit (``it = iter(loader)`` in a global), so
    their readers close their files while the modules are still whole. Finalised later, with their
    modules' names set to None, each would print "Exception ignored in: <generator ...>"."""
    for epoch_it in list(_LIVE_ITERATORS):
        # a later next() (a thread still iterating, an exit handler) stops, and the epoch stays
        # where the loop left it: the loader's state_dict() still names the batches not yet read
        epoch_it._released = True
        epoch_it._it = cast("_BaseDataLoaderIter", iter(()))


at_exit(release_epoch_iterators)


class EpochIterator:
    """The ``DataLoader``'s iterator, plus one report of the epoch's skipped samples at its end,
    and the count of batches delivered (for :meth:`ShardfeedLoader.state_dict`). ``loader`` is the
    :class:`~shardfeed.readers.loader.ShardfeedLoader` iterated (its ring and its epoch report)."""

    def __init__(self, it: _BaseDataLoaderIter, loader: Any, progress: EpochProgress) -> None:
        self._it = it
        self._loader = loader
        self._progress = progress
        self._reported = False
        self._released = False  # by release_epoch_iterators: its end is not the epoch's
        _LIVE_ITERATORS.add(self)

    @property
    def num_batches_delivered(self) -> int:
        """Batches delivered so far in this iteration."""
        return self._progress.batches

    @property
    def finished(self) -> bool:
        """True once the iteration has ended (``StopIteration``)."""
        return self._progress.finished

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            if self._released:
                raise
            self._progress.finished = True
            if not self._reported:
                self._reported = True
                self._loader._report_epoch(self._progress.epoch)
            raise
        if type(batch) is tuple and len(batch) == 2 and isinstance(batch[0], RingBatch):
            # a worker's batch in a reused shared-memory slot: a view of it, held while the loop holds it
            ring = self._loader._batch_ring
            assert ring is not None  # a RingBatch comes only from a loader with a ring
            batch = ring.take_batch(batch[0], pin_memory=self._loader._pin_ring)
        self._progress.batches += 1  # the batch is the loop's from here on, whatever it does with it
        return batch

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)
