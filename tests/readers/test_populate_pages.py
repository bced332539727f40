"""``populate_pages`` (``madvise(MADV_POPULATE_WRITE)``): only whole pages inside the range are
asked for, a failing or missing ``madvise`` is harmless, and the ring's rows still carry the
planted bytes."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from shardfeed.readers.batching import pages as pages_module
from shardfeed.readers.batching.buffers import BatchRing
from shardfeed.readers.batching.pages import populate_pages

PAGE = mmap.PAGESIZE


def _recorder(monkeypatch):
    calls = []

    def madvise(start, length, advice):
        calls.append((start, length, advice))
        return 0

    monkeypatch.setattr(pages_module, "_madvise", madvise)
    monkeypatch.setattr(pages_module.sys, "platform", "linux")
    return calls


def test_only_whole_pages_inside_the_range_are_asked_for(monkeypatch):
    calls = _recorder(monkeypatch)
    base = 1000 * PAGE
    # a range starting 100 bytes into a page and ending 200 bytes into another
    assert populate_pages(base + 100, 5 * PAGE) is True
    assert calls == [(base + PAGE, 4 * PAGE, 23)]
    calls.clear()
    assert populate_pages(base, 3 * PAGE) is True  # page-aligned both ends: all of it
    assert calls == [(base, 3 * PAGE, 23)]
    calls.clear()
    # less than one whole page: nothing to ask for, no call
    assert populate_pages(base + 1, PAGE) is False
    assert populate_pages(base + 10, 20) is False
    assert populate_pages(base, 0) is False and populate_pages(base, -PAGE) is False
    assert calls == []


@pytest.mark.parametrize("failure", ["returns -1 (EINVAL)", "raises OSError", "raises TypeError"])
def test_a_failing_madvise_is_harmless_and_the_rows_keep_their_bytes(monkeypatch, failure):
    import torch

    calls = []

    def madvise(start, length, advice):
        calls.append((start, length, advice))
        if failure == "raises OSError":
            raise OSError(22, "Invalid argument")
        if failure == "raises TypeError":
            raise TypeError("wrong argument types")
        return -1

    monkeypatch.setattr(pages_module, "_madvise", madvise)
    monkeypatch.setattr(pages_module.sys, "platform", "linux")
    ring = BatchRing(num_workers=2, slots=2, batch_size=2, image_size=64)
    ring.reset_worker(1)  # must not raise
    assert populate_pages(ring.buffers[1].data_ptr(), ring.buffers[1].numel()) is False
    assert calls and all(advice == 23 for _, _, advice in calls)
    row = ring.next_row(1)
    assert row is not None
    planted = (np.arange(row.numel()) % 251).astype(np.uint8).reshape(tuple(row.shape))
    row.copy_(torch.from_numpy(planted))
    assert np.array_equal(ring.buffers[1, 0, 0].numpy(), planted)


def test_off_linux_it_is_not_called(monkeypatch):
    calls = _recorder(monkeypatch)
    monkeypatch.setattr(pages_module.sys, "platform", "darwin")
    assert populate_pages(1000 * PAGE, 4 * PAGE) is False
    assert calls == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_the_kernel_call_leaves_every_byte_as_it_was():
    ring = BatchRing(num_workers=3, slots=2, batch_size=1, image_size=41)  # slots not page-aligned
    whole = ring.buffers.numpy().reshape(-1)
    planted = (np.arange(whole.size, dtype=np.int64) * 7 % 253).astype(np.uint8)
    whole[:] = planted
    part = ring.buffers[1]
    populate_pages(part.data_ptr(), part.numel())
    assert np.array_equal(whole, planted)
