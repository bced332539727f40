"""The watch wrapper sees through the loader it wraps: the batches the loop receives, the
loader's own attributes, the ``DataLoader`` iterator inside shardfeed's loader."""

from __future__ import annotations

import time

import pytest


@pytest.mark.multiprocess
def test_batch_ready_sees_the_dataloader_iterator_inside_make_loaders_iterator(tiny_image_folder):
    from shardfeed.readers import make_loader
    from shardfeed.readers.measure.watch import batch_ready

    loader = make_loader(tiny_image_folder, batch_size=4, num_workers=1, image_size=16, prefetch_factor=2)
    it = iter(loader)
    next(it)
    # the worker makes the next batches ahead; once one has come back, the request would not wait
    deadline = time.monotonic() + 60
    ready = batch_ready(it)
    while ready is False and time.monotonic() < deadline:
        time.sleep(0.02)
        ready = batch_ready(it)
    assert ready is True
    del it
