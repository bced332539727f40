"""Reused shared-memory batch slots between ``DataLoader`` workers and the main process.

A batch made in a worker reaches the main process through shared memory. ``torch``'s way creates
a new shared-memory file per batch, and every page of it faults on first write: on this machine
writing a fresh 9.6 MB shared batch (64 x 3 x 224 x 224 ``uint8``) costs about 180 us per image,
writing the same bytes into already-mapped memory about 2 us, and a private allocation in the
main process about 24 us (``scripts/bench_overhead.py`` measures the loader with and without).

:class:`BatchRing` keeps, for each worker, ``slots`` batch buffers ``[batch_size, 3, S, S]``
``uint8`` in shared memory, made once before the workers start. A worker's
:class:`~shardfeed.readers.transforms.SampleDecoder` writes each image straight into the next row
of its current slot; the collate step (in the worker) sends a small :class:`RingBatch` handle
instead of the pixels when the batch is exactly the slot's first rows (should a slot's rows ever
leave as tensors instead, the ring is switched off in that process before any slot could be
written again: rows someone may hold are never overwritten). The main process turns the handle
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
(:class:`~shardfeed.readers.loader.ShardfeedLoader`).
"""

from __future__ import annotations

import logging
import mmap
import sys
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    import numpy as np
    import torch

__all__ = ["BatchRing", "RingBatch", "active_ring", "row_planes"]

logger = logging.getLogger(__name__)

_active: "BatchRing | None" = None

#: ``madvise`` advice that maps every page of a range writable in one call (Linux 5.14+)
_MADV_POPULATE_WRITE = 23
_madvise = None


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


def populate_pages(address: int, nbytes: int) -> bool:
    """Map the pages of ``[address, address + nbytes)`` for writing, in one ``madvise`` call.

    Pages of a shared-memory mapping inherited through ``fork`` (or mapped anew in a spawned
    worker) are not in the worker's page tables: each first write to one of them traps (a minor
    page fault, about 1-3 us on a loaded machine, 2,352 of them per 9.6 MB batch: more than the
    resize of a small image). ``MADV_POPULATE_WRITE`` maps them all in the kernel at once.

    Args:
        address: Start of the range (inside one mapping).
        nbytes: Length of the range, bytes. Only the pages wholly inside the range are mapped
            (a partial page at either end faults on its first write as before), so no page of a
            neighbouring range is touched.

    Returns:
        Whether the kernel did it (False off Linux, on kernels before 5.14 (``EINVAL``), when
        ``libc`` cannot be loaded, or when the range holds no whole page: the pages then fault
        one by one, with the same contents). Never raises.
    """
    global _madvise
    if nbytes <= 0 or not sys.platform.startswith("linux"):
        return False
    if _madvise is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.madvise
            fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            fn.restype = ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    if not _madvise:
        return False
    page = mmap.PAGESIZE
    start = -(-address // page) * page  # whole pages inside the range only: nothing outside it
    end = (address + nbytes) // page * page
    if end <= start:
        return False
    try:
        return _madvise(start, end - start, _MADV_POPULATE_WRITE) == 0
    except (OSError, ValueError, TypeError):  # a libc without a usable madvise
        return False


def active_ring() -> "BatchRing | None":
    """The ring this process's decoder writes into (set on its first row), else None."""
    return _active


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
        global _active
        self._worker, self._slot, self._next_row, self._fallback_rows = worker, -1, 0, 0
        _active = self
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
        global _active
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
        _active = self
        key = (worker, self._slot)
        rows = self._slot_rows.get(key)
        if rows is None:  # views made once per slot and process (indexing a tensor costs ~6 us)
            part = self.buffers[worker, self._slot]
            rows = self._slot_rows[key] = (part.unbind(0), row_planes(part))
        k = self._next_row
        self._next_row = k + 1
        return rows[0][k], rows[1][k]

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
