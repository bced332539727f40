"""Bounded, order-preserving read-ahead: many reads in flight, results handed back in input order.

A packer reads its sources one after another; on storage where every open waits milliseconds
(NFS, a bucket mount, an object store) that makes one reader's latency the whole pack's pace.
:func:`read_ahead` keeps up to ``max_in_flight`` reads running in threads ahead of the consumer
and yields their results strictly in input order, so the bytes a writer appends (and so the output)
are exactly those of the serial loop. It is storage-agnostic: it takes any ``read(item)`` function
(a local ``open``/``read``, an object store's GET) and never looks inside the items.

Bounds:

* reads in flight: at most ``max_in_flight`` threads run ``read`` at once;
* memory: the bytes of the items read or being read but not yet taken by the consumer stay at or
  under ``max_bytes_in_flight`` (the sizes come from ``size_of``, known before reading: the scan's
  sizes); an item larger than the whole budget is read alone, so a pack never stalls on one large
  file;
* batching: consecutive items go to the threads in batches of up to ``batch`` (each batch read
  serially by one thread), so fast local reads pay one thread hand-off per batch, not per file.

A failed read does not stop the others: its exception is handed back in the failed item's place
(:class:`ReadResult`), so the consumer reports (or skips) the right file, in order.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Generator, Generic, Iterable, Iterator, TypeVar

__all__ = ["ReadResult", "read_ahead", "DEFAULT_READ_AHEAD", "DEFAULT_READ_AHEAD_BYTES", "DEFAULT_BATCH",
           "ADAPTIVE_FIRST_ITEMS", "ADAPTIVE_PROBE_ITEMS", "ADAPTIVE_BASE_S", "ADAPTIVE_BYTES_PER_S"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Reads in flight per shard by default (``--read-ahead``), chosen by measurement
#: (scripts/bench_pack_scaling.py): 2,000 small files behind an emulated 5 ms per open took 0.8 s
#: to write with 16 reads in flight and 0.6 s with 32, against 11.6 s one after another;
#: on warm local files the threads cost ~6 % more CPU. 0 or 1 reads serially, in the caller's thread.
DEFAULT_READ_AHEAD = 32
#: Bytes read ahead of the consumer at most (per reader), 64 MiB.
DEFAULT_READ_AHEAD_BYTES = 64 * 1024 * 1024
#: Items per thread hand-off by default.
DEFAULT_BATCH = 8
#: ``adaptive``: items read inline in the first probe block and in each later one, and what a
#: page-cache read costs at most (seconds per item, plus bytes at this rate); a block where most
#: reads were slower switches to the threads.
ADAPTIVE_FIRST_ITEMS = 8
ADAPTIVE_PROBE_ITEMS = 64
ADAPTIVE_BASE_S = 30e-6
ADAPTIVE_BYTES_PER_S = 2e9


@dataclasses.dataclass
class ReadResult(Generic[T, R]):
    """One item's outcome, in input order.

    Attributes:
        item: the input item.
        value: what ``read(item)`` returned (None when it raised).
        error: the exception ``read(item)`` raised (None when it returned).
    """

    item: T
    value: R | None
    error: BaseException | None = None


def _read_batch(read: Callable[[T], R], items: list) -> list[ReadResult]:
    out = []
    for it in items:
        try:
            out.append(ReadResult(it, read(it)))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, in this item's place
            out.append(ReadResult(it, None, exc))
    return out


def _slow_read(seconds: float, num_bytes: int) -> bool:
    """Whether a read of ``num_bytes`` that took ``seconds`` waited on storage.

    Page-cache reads cost ~10 us a small file plus the copy (~2 GB/s here, loaded); a cold local
    disk ~85 us a small file and ~210 us an ImageNet-sized one, network storage milliseconds.
    """
    return seconds > ADAPTIVE_BASE_S + num_bytes / ADAPTIVE_BYTES_PER_S


def read_ahead(items: Iterable[T], read: Callable[[T], R], *, max_in_flight: int = DEFAULT_READ_AHEAD,
               max_bytes_in_flight: int = DEFAULT_READ_AHEAD_BYTES, size_of: Callable[[T], int] | None = None,
               batch: int = DEFAULT_BATCH, adaptive: bool = False,
               thread_name: str = "shardfeed-read") -> Iterator[ReadResult[T, R]]:
    """Run ``read(item)`` for every item with reads in flight ahead; yield results in input order.

    Args:
        items: the items, in the order their results must come back.
        read: ``read(item) -> value``, called in a worker thread (must be thread-safe; blocking I/O
            releases the GIL). Exceptions (``Exception`` subclasses) are returned, not raised.
        max_in_flight: threads reading at once (>= 1). 1 (or less) reads serially in the
            caller's thread, with no thread at all: the plain loop.
        max_bytes_in_flight: bytes (by ``size_of``) read ahead of the consumer at most, the batch
            being read included; a single item above it is read alone.
        size_of: ``size_of(item) -> bytes``, known before reading (None: memory is bounded by
            ``max_in_flight * batch`` items only).
        batch: consecutive items per thread hand-off (>= 1).
        adaptive: start reading inline (no thread) in blocks (:data:`ADAPTIVE_FIRST_ITEMS`, then
            :data:`ADAPTIVE_PROBE_ITEMS` items), and go to the threads for the rest once most reads
            of a block took longer than page-cache reads do (``ADAPTIVE_BASE_S`` plus the bytes at
            ``ADAPTIVE_BYTES_PER_S``): files already in
            memory then pay no thread hand-offs (on 2 cores, two packing processes with 32 reader
            threads each were ~15 % slower than without), files behind a disk or a network get
            the concurrency.
        thread_name: the reader threads' name prefix.

    Yields:
        :class:`ReadResult` per item, in the order of ``items``.

    Raises:
        ValueError: ``batch`` < 1 or ``max_bytes_in_flight`` < 1.

    Closing the generator early (``break``, an exception in the consumer) cancels the reads not
    yet started and waits for the running ones before returning.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if max_bytes_in_flight < 1:
        raise ValueError(f"max_bytes_in_flight must be at least 1 byte, got {max_bytes_in_flight}")
    if max_in_flight <= 1:
        yield from _read_inline(items, read)
        return
    size_of = size_of or (lambda it: 0)
    it = iter(items)
    if adaptive and not (yield from _read_until_slow(it, read, size_of, max_in_flight)):
        return
    yield from _read_threaded(it, read, size_of, int(max_in_flight), max_bytes_in_flight, batch, thread_name)


def _read_inline(items: Iterable[T], read: Callable[[T], R]) -> Iterator[ReadResult[T, R]]:
    """Every item read in the caller's thread (:func:`read_ahead` with one read in flight)."""
    for it in items:
        try:
            yield ReadResult(it, read(it))
        except Exception as exc:  # noqa: BLE001 - same contract as the threaded path
            yield ReadResult(it, None, exc)


def _read_until_slow(it: Iterator[T], read: Callable[[T], R],
                     size_of: Callable[[T], int], max_in_flight: int) -> Generator[ReadResult[T, R], None, bool]:
    """:func:`read_ahead`'s adaptive start: items read inline in blocks until most reads of a block
    waited on storage (:func:`_slow_read`); returns True then (the rest goes to the threads), False
    when the items ran out first."""
    clock = time.perf_counter
    block_size = ADAPTIVE_FIRST_ITEMS  # small first: slow storage is found after a few reads
    while True:
        block = list(itertools.islice(it, block_size))
        if not block:
            return False
        block_size = ADAPTIVE_PROBE_ITEMS
        num_slow = 0
        for x in block:
            t0 = clock()
            try:
                r = ReadResult(x, read(x))
            except Exception as exc:  # noqa: BLE001 - same contract as the threaded path
                r = ReadResult(x, None, exc)
            num_slow += _slow_read(clock() - t0, size_of(x))  # the read only, not the consumer's work
            yield r
        if 2 * num_slow > len(block):  # most reads waited (one preempted read does not count)
            log.debug("%d of %d reads waited on storage: reading ahead with %d threads", num_slow,
                      len(block), max_in_flight)
            return True


def _read_threaded(it: Iterator[T], read: Callable[[T], R], size_of: Callable[[T], int], max_in_flight: int,
                   max_bytes_in_flight: int, batch: int, thread_name: str) -> Iterator[ReadResult[T, R]]:
    """:func:`read_ahead`'s threads: batches of ``batch`` items submitted while fewer than two per
    thread are in flight and their bytes stay within ``max_bytes_in_flight``; results in order."""
    pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix=thread_name)
    pending: collections.deque = collections.deque()  # (future, batch bytes)
    held = 0  # bytes submitted and not yet handed to the consumer
    carry: list = []  # the next batch, built but over the byte budget for now
    carry_bytes = 0
    # batches in flight: enough for every thread to have one, and one more batch queued behind each
    max_batches = 2 * max_in_flight
    try:
        while True:
            # fill: submit batches while the budget allows
            while len(pending) < max_batches:
                if not carry:
                    carry = list(itertools.islice(it, batch))
                    if not carry:
                        break
                    carry_bytes = sum(size_of(x) for x in carry)
                if held + carry_bytes > max_bytes_in_flight:
                    # over the budget: submit the part of the batch that fits (one item at least when
                    # nothing is in flight: an item above the whole budget is read alone), keep the rest
                    fit, acc = 0, 0
                    for x in carry:
                        s = size_of(x)
                        if held + acc + s > max_bytes_in_flight and (fit or pending):
                            break
                        acc += s
                        fit += 1
                    if fit:
                        head, carry = carry[:fit], carry[fit:]
                        carry_bytes -= acc
                        pending.append((pool.submit(_read_batch, read, head), acc))
                        held += acc
                    break
                pending.append((pool.submit(_read_batch, read, carry), carry_bytes))
                held += carry_bytes
                carry, carry_bytes = [], 0
            if not pending:
                return
            fut, nbytes = pending.popleft()
            results = fut.result()
            held -= nbytes
            yield from results
    finally:
        for fut, _ in pending:
            fut.cancel()
        pool.shutdown(wait=True)
