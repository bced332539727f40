"""Batching: where decoded images are written, and how they become batches.

This module owns every batch buffer. :class:`BatchRows` hands a source the row each decoded image
is written into (:class:`~shardfeed.readers.sample_decoder.SampleDecoder` writes into the row it is
given, and knows nothing of buffers). :func:`collate_uint8` turns rows into a batch, without a
copy when they are consecutive rows of one buffer. It is the only user of torch's private storage
calls (``UntypedStorage._new_shared``, ``torch._C._storage_Use_Count``): where they are missing, a
buffer is never reused and batches are plain ``torch.empty`` tensors.

Two kinds of buffer:

* In the main process (``num_workers=0``), :class:`BatchRows` fills ``[batch_size, 3, S, S]``
  buffers and keeps the last few. A buffer is written again only once no tensor refers to its
  memory (torch's reference count of the storage: the batch, a slice, a row, a ``.numpy()`` array
  all count).
* In a ``DataLoader`` worker, the rows are slots of a :class:`BatchRing` when the loader made one
  (below), else rows of a new shared-memory buffer per batch.

A batch made in a worker reaches the main process through shared memory. ``torch``'s way creates
a new shared-memory file per batch, and every page of it faults on first write: on this machine
writing a fresh 9.6 MB shared batch (64 x 3 x 224 x 224 ``uint8``) costs about 180 us per image,
writing the same bytes into already-mapped memory about 2 us, and a private allocation in the
main process about 24 us (``scripts/bench_overhead.py`` measures the loader with and without).

:class:`BatchRing` keeps, for each worker, ``slots`` batch buffers ``[batch_size, 3, S, S]``
``uint8`` in shared memory, made once before the workers start (:func:`batch_ring_for`). A
worker's :class:`BatchRows` hands out the next row of its current slot; the collate step (in the
worker) sends a small :class:`RingBatch` handle instead of the pixels when the batch is exactly
the slot's first rows (should a slot's rows ever leave as tensors instead, the ring is switched
off in that process before any slot could be written again: rows someone may hold are never
overwritten). The main process turns the handle
into a tensor over the slot, no copy (:meth:`BatchRing.take`); the batch's labels travel in a
small shared-memory array beside the slots (:meth:`BatchRing.take_batch`), since a labels tensor
of its own would cost a new shared-memory file and a passed file descriptor per batch (about
0.2 ms in each process, a tenth of a batch of small images). The slot stays held until the
last tensor sharing its memory is freed, and only then may a worker write into it again. With
``pin_memory`` the batch is copied into page-locked memory instead and the slot freed at once.

Each slot's state is one ``int64`` in shared memory: 0 free, else the sequence number of the batch
it holds. A worker takes its next free slot; when none is free (the training loop holds that
many batches) it never waits: that batch is made the ordinary way (a fresh shared tensor, always
correct). Before each iteration the main process frees the slots of batches never taken (an
iteration that ended early, :meth:`BatchRing.reclaim`); it raises on a handle whose slot no
longer holds its batch. One iteration's workers at a time write into a ring: a second iteration
of the same loader started while the first is alive makes its batches the ordinary way
(:class:`~shardfeed.readers.loader.ShardfeedLoader`). The ring reaches the workers one way only:
before each iteration starts its workers, the loader passes the ring (or None) to the source's
:meth:`~shardfeed.readers.sources.source_base.SourceBase.use_batch_ring`, and the workers copy the
source, its :class:`BatchRows` and so the ring, as they start.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import TYPE_CHECKING, Any

from .pages import populate_pages

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    import numpy as np
    import torch

__all__ = ["BatchRing", "RingBatch", "BatchRows", "row_planes", "populate_pages",
           "collate_uint8", "collate_decoded", "batch_ring_for", "BATCH_RING_MAX_BYTES"]

logger = logging.getLogger(__name__)

def row_planes(buf: "torch.Tensor") -> "list[list[np.ndarray]]":
    """Each row's three planes of a batch buffer, as numpy views for OpenCV to write into.

    Made once per buffer: ``Tensor.numpy()`` taken per image inside the decode loop costs several
    microseconds (docs/performance.md, small-image validation, with the command that measures it).

    Args:
        buf: contiguous ``torch.uint8`` ``[rows, 3, S, S]`` (CPU).

    Returns:
        ``rows`` lists ``[R, G, B]`` of ``(S, S)`` ``uint8`` arrays sharing ``buf``'s memory.
    """
    return [[row[0], row[1], row[2]] for row in buf.numpy()]


class RingBatch:
    """A handle to ``rows`` images in slot ``slot`` of worker ``worker``'s part of a :class:`BatchRing`.

    Picklable and small; the main process turns it into a tensor with :meth:`BatchRing.take`.
    """

    __slots__ = ("ring_id", "worker", "slot", "rows", "seq")

    def __init__(self, ring_id: int, worker: int, slot: int, rows: int, seq: int) -> None:
        self.ring_id, self.worker, self.slot, self.rows, self.seq = ring_id, worker, slot, rows, seq

    def __getstate__(self):
        return (self.ring_id, self.worker, self.slot, self.rows, self.seq)

    def __setstate__(self, state) -> None:
        self.ring_id, self.worker, self.slot, self.rows, self.seq = state

    def __repr__(self) -> str:
        return f"RingBatch(worker={self.worker}, slot={self.slot}, rows={self.rows}, seq={self.seq})"


class BatchRing:
    """``slots`` reused shared-memory batch buffers per worker (see the module docstring).

    Args:
        num_workers: ``DataLoader`` workers (``>= 1``).
        slots: Buffers per worker (``>= 2``): batches in flight plus those the training loop holds.
        batch_size: Rows per buffer.
        image_size: Images are ``[3, image_size, image_size]`` ``uint8``.

    Memory: ``num_workers * slots * batch_size * 3 * image_size**2`` bytes of shared memory,
    e.g. 77 MB for 2 workers, 4 slots, batches of 64 at 224 px.

    Raises:
        ValueError: A size is out of range.
    """

    def __init__(self, num_workers: int, slots: int, batch_size: int, image_size: int) -> None:
        import torch

        if num_workers < 1 or slots < 2 or batch_size < 1 or image_size < 1:
            raise ValueError(f"BatchRing needs num_workers >= 1, slots >= 2, batch_size >= 1 and image_size >= 1, "
                             f"got {num_workers}, {slots}, {batch_size}, {image_size}")
        self.num_workers, self.slots, self.batch_size, self.image_size = num_workers, slots, batch_size, image_size
        self.buffers = torch.empty((num_workers, slots, batch_size, 3, image_size, image_size),
                                   dtype=torch.uint8).share_memory_()
        self.state = torch.zeros((num_workers, slots), dtype=torch.int64).share_memory_()
        self.labels = torch.zeros((num_workers, slots, batch_size), dtype=torch.int64).share_memory_()
        self.ring_id = id(self)
        self._init_process()

    def _init_process(self) -> None:
        self._worker: int | None = None
        self._slot = -1  # the slot being filled in this process (-1: none)
        self._next_row = 0
        self._fallback_rows = 0
        self._published = False  # whether the current slot's rows went out as a handle
        self._disabled = False
        self._seq = 0
        self._state_np = self.state.numpy()
        self._labels_np = self.labels.numpy()
        self._buffers_np = None
        self._held: dict[tuple[int, int], int] = {}  # main process: slots of taken batches -> seq
        self._slot_rows: dict[tuple[int, int], tuple] = {}  # worker side: (worker, slot) -> (rows, planes)
        self._populated: set[int] = set()  # workers whose slots this process mapped (populate_pages)

    def __getstate__(self) -> dict:
        return {"num_workers": self.num_workers, "slots": self.slots, "batch_size": self.batch_size,
                "image_size": self.image_size, "buffers": self.buffers, "state": self.state,
                "labels": self.labels, "ring_id": self.ring_id}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process()

    # ---- worker side
    def reset_worker(self, worker: int) -> None:
        """Start an epoch in worker ``worker``: the next image starts a new slot."""
        self._worker, self._slot, self._next_row, self._fallback_rows = worker, -1, 0, 0
        if 0 <= worker < self.num_workers and worker not in self._populated:
            # this process's first epoch in the worker's slots: map their pages now, in one call,
            # rather than by a page fault on each page's first write (see populate_pages)
            self._populated.add(worker)
            part = self.buffers[worker]
            populate_pages(part.data_ptr(), part.numel())

    def next_row(self, worker: int) -> "torch.Tensor | None":
        """The next ``[3, S, S]`` row to write an image into, in worker ``worker``.

        None when every slot of the worker still holds a batch the main process has not copied
        out: that batch's rows are then the caller's own tensors (the ring never waits).
        """
        got = self.next_row_planes(worker)
        return None if got is None else got[0]

    def next_row_planes(self, worker: int) -> "tuple[torch.Tensor, Sequence[np.ndarray]] | None":
        """:meth:`next_row`, with the row's three ``(S, S)`` planes as numpy views (:func:`row_planes`).

        Returns:
            ``(row, planes)``: the ``torch.uint8`` ``[3, S, S]`` row and its planes ``[R, G, B]``;
            or None (as :meth:`next_row`).
        """
        if not 0 <= worker < self.num_workers:
            return None
        if self._worker != worker:
            self.reset_worker(worker)
        if self._fallback_rows > 0:  # this batch's rows are the caller's own
            self._fallback_rows -= 1
            return None
        if self._disabled:
            return None
        if self._slot < 0 or self._next_row >= self.batch_size:
            if self._slot >= 0 and not self._published:
                # the slot's rows left as tensors, not as a handle (a collate other than the
                # loader's, or batches out of step with the slots): rows might still be held,
                # so no slot is ever written again in this process
                logger.debug("batch ring: worker %d's rows left without a handle; ring off in this process", worker)
                self._disabled = True
                return None
            free = self._state_np[worker] == 0
            slot = next((s % self.slots for s in range(self._slot + 1, self._slot + 1 + self.slots)
                         if free[s % self.slots]), None)
            if slot is None:  # every slot still holds a batch (in flight, or held by the training loop)
                self._slot, self._fallback_rows = -1, self.batch_size - 1
                return None
            self._slot, self._next_row, self._published = slot, 0, False
        key = (worker, self._slot)
        rows = self._slot_rows.get(key)
        if rows is None:  # views made once per slot and process (indexing a tensor costs ~6 us)
            part = self.buffers[worker, self._slot]
            rows = self._slot_rows[key] = (part.unbind(0), row_planes(part))
        k = self._next_row
        self._next_row = k + 1
        return rows[0][k], rows[1][k]

    def _take_back(self, fallback: bool) -> None:
        """Undo the latest :meth:`next_row_planes`: its row (or, with ``fallback``, its turn to make
        the row elsewhere) comes again on the next call (:meth:`BatchRows.put_back`)."""
        if fallback:
            self._fallback_rows += 1
        elif self._next_row > 0:
            self._next_row -= 1

    def publish(self, images: "list[torch.Tensor]", labels: "list[int] | None" = None) -> RingBatch | None:
        """A handle for ``images`` when they are rows 0..n-1 of this worker's current slot, else None.

        On success the slot is marked as holding the batch, and the next image starts a new slot.

        Args:
            images: The batch's image tensors, in order.
            labels: Optional class indices, one per image (int64 range), kept beside the slot
                for :meth:`take_batch`.

        Raises:
            ValueError: ``labels`` does not have one entry per image.
            OverflowError: A label does not fit in int64.
        """
        worker, slot = self._worker, self._slot
        if worker is None or slot < 0 or len(images) > self.batch_size:
            return None
        if labels is not None and len(labels) != len(images):
            raise ValueError(f"publish: {len(labels)} labels for {len(images)} images")
        base = self.buffers[worker, slot]
        row_bytes = base[0].numel()
        start = base.data_ptr()
        for i, image in enumerate(images):
            if image.data_ptr() != start + i * row_bytes or not image.is_contiguous():
                return None
        if labels is not None:
            self._labels_np[worker, slot, : len(labels)] = labels
        self._seq += 1
        self._state_np[worker, slot] = self._seq
        self._published = True
        self._next_row = self.batch_size  # the next image starts the next slot
        return RingBatch(self.ring_id, worker, slot, len(images), self._seq)

    # ---- main process side
    def take(self, handle: RingBatch, *, pin_memory: bool = False) -> "torch.Tensor":
        """The batch of ``handle`` as a tensor for the training loop.

        Without ``pin_memory``: a view of the slot, no copy. The slot stays marked as holding the
        batch until the last tensor sharing that memory (the view, its slices, ``.numpy()``
        arrays of it) is freed; only then may a worker write into it again. With
        ``pin_memory``: a copy into page-locked memory, and the slot is freed at once.

        Args:
            handle: From :meth:`publish` in a worker.
            pin_memory: Copy into page-locked memory (for ``non_blocking`` device copies).

        Returns:
            ``torch.uint8`` ``[rows, 3, S, S]``, contiguous.

        Raises:
            RuntimeError: The handle is not from this ring, or its slot no longer holds its batch.
        """
        import torch

        state = self._state_np
        w, slot, seq = handle.worker, handle.slot, handle.seq
        if handle.ring_id != self.ring_id or not (0 <= w < self.num_workers and 0 <= slot < self.slots) \
                or state[w, slot] != seq:
            raise RuntimeError(f"{handle!r} no longer names its batch (the slot was reused): a batch handle "
                               "was used after its loader iteration ended")
        if pin_memory:
            size = self.image_size
            out = torch.empty((handle.rows, 3, size, size), dtype=torch.uint8, pin_memory=True)
            out.copy_(self.buffers[w, slot, : handle.rows])
            state[w, slot] = 0
            return out
        if self._buffers_np is None:
            self._buffers_np = self.buffers.numpy()
        view = self._buffers_np[w, slot, : handle.rows]
        self._held[(w, slot)] = seq
        weakref.finalize(view, self._release, w, slot, seq)
        return torch.from_numpy(view)  # the tensor's memory keeps ``view`` alive, and so the slot held

    def take_batch(self, handle: RingBatch, *, pin_memory: bool = False) -> "tuple[torch.Tensor, torch.Tensor]":
        """``(images, labels)`` of ``handle``: :meth:`take`'s images and the labels published with them.

        Args:
            handle: From :meth:`publish` (with ``labels``) in a worker.
            pin_memory: Page-locked copies of both (the slot is freed at once).

        Returns:
            ``torch.uint8`` ``[rows, 3, S, S]`` and a new ``torch.int64`` ``[rows]``.

        Raises:
            RuntimeError: As :meth:`take`.
        """
        import torch

        w, slot = handle.worker, handle.slot
        if not (0 <= w < self.num_workers and 0 <= slot < self.slots):
            self.take(handle)  # raises: not a slot of this ring
        # copied before take(): with pin_memory, take() frees the slot for the worker's next batch
        labels = torch.from_numpy(self._labels_np[w, slot, : handle.rows].copy())
        images = self.take(handle, pin_memory=pin_memory)  # raises on a stale or foreign handle
        return images, (labels.pin_memory() if pin_memory else labels)

    def _release(self, worker: int, slot: int, seq: int) -> None:
        """The last tensor over a taken slot is gone: a worker may write into it again."""
        if self._held.get((worker, slot)) == seq:
            del self._held[(worker, slot)]
            if self._state_np[worker, slot] == seq:
                self._state_np[worker, slot] = 0

    def reclaim(self) -> None:
        """Main process, before an iteration starts: free every slot not held by a taken batch.

        Batches that workers put in slots for an iteration that ended early are never taken;
        without this their slots would stay marked until the process ends.
        """
        state = self._state_np
        for w in range(self.num_workers):
            for slot in range(self.slots):
                if state[w, slot] != 0 and self._held.get((w, slot)) != state[w, slot]:
                    state[w, slot] = 0


# ---------------------------------------------------------------------------------------------
# The rows decoded images are written into


_get_worker_info: Any = None


def _worker_id() -> int:
    """This ``DataLoader`` worker's id; -1 outside a worker."""
    global _get_worker_info
    if _get_worker_info is None:
        from torch.utils.data import get_worker_info

        _get_worker_info = get_worker_info
    info = _get_worker_info()
    return -1 if info is None else info.id


#: batch buffers a process keeps for reuse (:class:`BatchRows`): the batch the training loop holds,
#: the one being filled, and one more
_POOL = 3
#: what :meth:`BatchRows.put_back` undoes: a ring row, a ring fallback turn, a row of the own buffer
_RING_ROW, _RING_FALLBACK, _OWN_ROW = 1, 2, 4


class BatchRows:
    """The rows a source's decoded images are written into, so that a batch needs no stacking.

    A source under a loader takes :meth:`next_row` for each image it decodes and hands that row
    to the decoder. When the loader's batch is those rows in order, :func:`collate_uint8` returns
    the buffer itself (main process) and :meth:`BatchRing.publish` a handle to it (worker).

    * In a ``DataLoader`` worker with a ring: the rows of the worker's current slot. When every
      slot is held, and without a ring: the rows of a new shared-memory buffer per batch.
    * Elsewhere: rows of ``[batch_size, 3, S, S]`` buffers, the last few kept and written again
      only once no tensor refers to their memory (torch's count of the storage; where that
      private call is missing, a buffer is never reused).

    Picklable: a copy (a worker's) keeps the sizes and the ring and fills buffers of its own.

    Args:
        batch_size: Rows per buffer: the loader's batch size (``>= 1``).
        image_size: Images are ``[3, image_size, image_size]`` ``uint8`` (``>= 1``).
        ring: The :class:`BatchRing` whose slots the workers write into, or None.

    Raises:
        ValueError: A size below 1.
    """

    def __init__(self, batch_size: int, image_size: int, ring: "BatchRing | None" = None) -> None:
        if int(batch_size) < 1 or int(image_size) < 1:
            raise ValueError(f"BatchRows needs batch_size >= 1 and image_size >= 1, got {batch_size}, {image_size}")
        self.batch_size, self.image_size = int(batch_size), int(image_size)
        self.ring = ring
        self._init_process()

    def _init_process(self) -> None:
        self._buf: "torch.Tensor | None" = None
        self._rows: "Sequence[torch.Tensor]" = ()
        self._planes: "Sequence[Sequence[np.ndarray]]" = ()
        self._next = 0
        #: (buffer, its storage's reference count with no row view alive, its rows' planes)
        self._pool: list = []
        self._undo = 0

    def __getstate__(self) -> dict:
        return {"batch_size": self.batch_size, "image_size": self.image_size, "ring": self.ring}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process()

    def use_ring(self, ring: "BatchRing | None") -> None:
        """Write into ``ring``'s slots in the workers started from now on (None: a buffer per batch).

        Workers copy this object when they start: one already running keeps what it copied.
        """
        self.ring = ring

    def start_epoch(self) -> None:
        """An epoch starts in this process: the next image starts a new buffer (in a worker with a
        ring, a new slot: :meth:`BatchRing.reset_worker`)."""
        self._buf, self._next, self._undo = None, 0, 0
        if self.ring is not None:
            worker = _worker_id()
            if worker >= 0:
                self.ring.reset_worker(worker)  # an epoch starts: this worker's slots are free

    def next_row(self) -> "tuple[torch.Tensor, Sequence[np.ndarray]]":
        """The row the next decoded image is written into.

        Returns:
            ``(row, planes)``: a contiguous ``torch.uint8`` ``[3, S, S]`` row of a batch buffer and
            its three ``(S, S)`` ``uint8`` planes as numpy views (:func:`row_planes`, made once per
            buffer: ``Tensor.numpy()`` per image costs several microseconds).
        """
        ring = self.ring
        undo = _OWN_ROW
        if ring is not None:
            turns = ring._fallback_rows
            got = ring.next_row_planes(_worker_id())  # None outside a worker
            if got is not None:
                self._undo = _RING_ROW
                return got
            if ring._fallback_rows < turns:
                undo |= _RING_FALLBACK
        if self._buf is None or self._next >= len(self._rows):
            self._buf, self._rows, self._planes = self._next_buffer()
            self._next = 0
        k = self._next
        self._next = k + 1
        self._undo = undo
        return self._rows[k], self._planes[k]

    def put_back(self) -> None:
        """Undo the latest :meth:`next_row`, whose row was not written (its sample failed to
        decode): the next call returns that row again, so a batch's images stay consecutive rows."""
        undo, self._undo = self._undo, 0
        if undo & (_RING_ROW | _RING_FALLBACK) and self.ring is not None:
            self.ring._take_back(fallback=bool(undo & _RING_FALLBACK))
        if undo & _OWN_ROW and self._next > 0:
            self._next -= 1

    def _next_buffer(self) -> "tuple[torch.Tensor, Sequence[torch.Tensor], Sequence[Sequence[np.ndarray]]]":
        """A batch buffer, fresh row views of it and each row's planes as numpy views: outside a
        worker, one of the last few this process filled whose memory no tensor refers to anymore
        (its pages are mapped already: the first write into a fresh 9.6 MB buffer costs more page
        faults than the resize), else a new one.

        The pool keeps the buffers, their planes and each buffer's storage reference count with
        only those alive; every use makes new row views (one ``unbind`` call), so each row handed
        out, and anything made from it, counts as a reference until it is freed. Inside a worker a
        buffer is always new: the main process's references to its shared memory are not counted
        here (the batch ring reuses worker memory instead).
        """
        shape = (self.batch_size, 3, self.image_size, self.image_size)
        in_worker = _worker_id() >= 0
        pool = self._pool
        self._buf, self._rows, self._planes = None, (), ()  # the finished buffer's: ours no longer
        if not in_worker:
            for i, (buf, base, planes) in enumerate(pool):
                if _storage_refs(buf) == base:
                    pool.append(pool.pop(i))
                    return buf, buf.unbind(0), planes
        buf = _new_batch_buffer(shape)
        planes = row_planes(buf)
        if not in_worker:
            base = _storage_refs(buf)  # only this buffer (and its planes) refer to its memory now
            if base > 0:
                pool.append((buf, base, planes))
                del pool[:-_POOL]
        return buf, buf.unbind(0), planes  # one call for every row's view


# ---------------------------------------------------------------------------------------------
# Buffers and collation


def _storage_refs(buf: "torch.Tensor") -> int:
    """How many references ``buf``'s memory has (torch's count of its storage); 0 when unknown."""
    import torch

    try:
        return int(torch._C._storage_Use_Count(buf.untyped_storage()._cdata))
    except (AttributeError, RuntimeError, TypeError):  # private API moved: never reuse a buffer
        return 0


#: live batch buffers of this process by address: only their rows are collated without a copy
_batch_buffers: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def _new_batch_buffer(shape: tuple[int, ...]) -> "torch.Tensor":
    """:func:`_new_buffer`, registered so that :func:`collate_uint8` may return its rows as a view."""
    buf = _new_buffer(shape)
    _batch_buffers[buf.data_ptr()] = buf
    return buf


def _new_buffer(shape: tuple[int, ...]) -> "torch.Tensor":
    """An uninitialised ``uint8`` tensor of ``shape``, in shared memory inside a worker.

    Inside a DataLoader worker a batch goes to the main process through shared memory;
    allocating it there directly saves a copy (what ``default_collate`` does).
    """
    import torch

    if _worker_id() >= 0:
        try:
            storage = torch.UntypedStorage._new_shared(math.prod(shape))
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)
        except (AttributeError, RuntimeError, TypeError) as exc:  # private API moved
            logger.debug("shared-memory batch allocation unavailable (%s); using torch.empty", exc)
    return torch.empty(shape, dtype=torch.uint8)


def _rows_of_one_buffer(images: "Sequence[torch.Tensor]") -> "torch.Tensor | None":
    """``images`` as one ``[B, 3, H, W]`` view when they are consecutive rows of one buffer."""
    import torch

    first = images[0]
    if not first.is_contiguous():
        return None
    numel = first.numel()
    storage = first.untyped_storage()
    base_ptr, offset = storage.data_ptr(), first.storage_offset()
    owner = _batch_buffers.get(base_ptr)
    if owner is None or owner.untyped_storage().data_ptr() != base_ptr:
        return None  # not one of this process's batch buffers: a caller's tensors are copied
    if (offset + len(images) * numel) > storage.nbytes():
        return None
    for i, image in enumerate(images):
        if (image.untyped_storage().data_ptr() != base_ptr or image.storage_offset() != offset + i * numel
                or not image.is_contiguous()):
            return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, offset, (len(images), *first.shape))


def collate_uint8(
    batch: Sequence[tuple["torch.Tensor", Any]],
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Stack ``(image, label)`` samples into a batch (``DataLoader(collate_fn=collate_uint8)``).

    Args:
        batch: Non-empty sequence of ``(image, label)``: ``image`` a ``torch.uint8`` tensor
            ``[3, H, W]`` (all the same size), ``label`` an int (or 0-d tensor).

    Returns:
        ``(images, labels)``: ``torch.uint8`` ``[B, 3, H, W]`` (contiguous) and ``torch.int64``
        ``[B]``. When the images are consecutive rows of one of this process's batch buffers
        (:class:`BatchRows`), ``images`` is a view of those rows, no copy;
        otherwise (any other tensors) a new tensor (in shared memory inside a ``DataLoader`` worker).

    Raises:
        ValueError: The batch is empty, an item is not a pair, or the images differ in size
            (the message shows two shapes and suggests ``image_size=N``).
        TypeError: An image is not a ``torch.uint8`` tensor with 3 dimensions.
    """
    import torch

    if len(batch) == 0:
        raise ValueError("cannot collate an empty batch")
    images: list[torch.Tensor] = []
    labels: list[int] = []
    for item in batch:
        if len(item) != 2:
            raise ValueError(f"expected (image, label) pairs, got an item of length {len(item)}")
        image, label = item
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.dim() != 3:
            got = (
                f"{image.dtype} {tuple(image.shape)}"
                if isinstance(image, torch.Tensor)
                else type(image).__name__
            )
            raise TypeError(f"expected uint8 image tensors [3, H, W], got {got}")
        images.append(image)
        labels.append(int(label))
    first_shape = tuple(images[0].shape)
    for image in images[1:]:
        if tuple(image.shape) != first_shape:
            raise ValueError(
                f"images in a batch have different sizes {first_shape} vs {tuple(image.shape)}: "
                "pass image_size=N (e.g. image_size=224) to open_dataset/make_loader (on the command line "
                "--image-size N; 0 keeps decoded sizes) to resize and crop them to N x N"
            )
    out = _rows_of_one_buffer(images)
    if out is None:
        out = _new_buffer((len(images), *first_shape))
        torch.stack(images, dim=0, out=out)
    return out, torch.tensor(labels, dtype=torch.int64)


def _worker_ring() -> "BatchRing | None":
    """The ring this ``DataLoader`` worker's dataset writes into (its ``batch_rows``), else None."""
    if _worker_id() < 0:
        return None
    rows = getattr(_get_worker_info().dataset, "batch_rows", None)
    return rows.ring if isinstance(rows, BatchRows) else None


def collate_decoded(batch: "Sequence[Any]", image_size: int | None = None, num_fields: int = 0) -> tuple[Any, ...]:
    """The loader's collate for decoded samples: ``(uint8 [B, 3, H, W], int64 [B])``, plus one list
    of B values per extra field (``fields=``); the holes of skipped samples (None) are dropped.

    In a worker whose dataset writes into a batch ring (its :class:`BatchRows`), when the images are
    the rows of its current slot, the pair is ``(RingBatch, None)`` instead: a handle the main
    process turns into the batch (:meth:`BatchRing.take_batch`).
    """
    import torch

    items = [s for s in batch if s is not None]
    if not items:  # every sample of the batch was skipped (on_error="skip")
        side = image_size or 0
        return (torch.empty((0, 3, side, side), dtype=torch.uint8), torch.empty((0,), dtype=torch.int64),
                *([] for _ in range(num_fields)))
    if num_fields:
        images, labels = collate_uint8([s[:2] for s in items])
        return (images, labels, *[[s[2 + j] for s in items] for j in range(num_fields)])
    ring = _worker_ring()
    if ring is not None:
        handle = ring.publish([image for image, _ in items], [int(label) for _, label in items])
        if handle is not None:  # rows of one reused slot, labels beside it: send a handle
            return handle, None
    return collate_uint8(items)


#: Largest shared memory the reused batch slots may take (bytes); above it batches are made per batch.
BATCH_RING_MAX_BYTES = 1 << 30


def batch_ring_for(rows: "BatchRows | None", num_workers: int, prefetch_factor: int | None) -> "BatchRing | None":
    """The :class:`BatchRing` for ``num_workers`` workers filling ``rows``' batches, or None.

    ``prefetch_factor + 4`` slots per worker (batches in flight, plus those the training loop
    holds), if they fit in :data:`BATCH_RING_MAX_BYTES` and the system grants the shared memory.
    None without workers or without ``rows`` (a source whose images have no fixed size).
    """
    if rows is None or num_workers < 1:
        return None
    slots = (prefetch_factor or 2) + 4
    nbytes = num_workers * slots * rows.batch_size * 3 * rows.image_size ** 2
    if nbytes > BATCH_RING_MAX_BYTES:
        logger.debug("batch ring of %.0f MB over the %.0f MB cap: batches are made one by one", nbytes / 1e6,
                     BATCH_RING_MAX_BYTES / 1e6)
        return None
    try:
        return BatchRing(num_workers, slots, rows.batch_size, rows.image_size)
    except (OSError, RuntimeError) as exc:  # shared memory refused: the ordinary path
        logger.debug("batch ring unavailable (%s): batches are made one by one", exc)
        return None
