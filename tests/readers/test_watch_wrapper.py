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


def test_the_watch_forwards_the_loaders_attributes_so_a_ddp_loop_sets_each_epoch():
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from shardfeed.readers import watch

    data = TensorDataset(torch.arange(32))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    w = watch(loader, warmup=0)
    seen = []
    for epoch in range(2):
        if hasattr(w.sampler, "set_epoch"):  # as DDP loops are written
            w.sampler.set_epoch(epoch)
        seen.append([int(i) for (x,) in w for i in x])
    w.close()
    # the order each epoch, from a sampler of our own told the same epoch
    for epoch in range(2):
        own = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=5)
        own.set_epoch(epoch)
        assert seen[epoch] == list(own)
    assert seen[0] != seen[1]
    assert w.sampler is sampler and w.dataset is data and w.batch_size == 4 and w.batch_sampler is loader.batch_sampler
    assert w.report().epochs == 2  # the watch's own attributes stay its own
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = w.no_such_thing


def test_the_watch_forwards_set_epoch_and_the_resume_state_of_make_loader(tiny_image_folder):
    import copy

    from shardfeed.readers import make_loader, watch

    loader = make_loader(tiny_image_folder, batch_size=8, num_workers=0, image_size=16, seed=3)
    w = watch(loader)
    w.set_epoch(4)
    assert loader.epoch == 4
    it = iter(w)
    for _ in range(3):
        next(it)
    state = w.state_dict()
    assert state == loader.state_dict()
    # a fresh loader resumed from the state the watch gave delivers the rest of epoch 4: the
    # batches after the first 3 of an uninterrupted epoch 4
    whole = make_loader(tiny_image_folder, batch_size=8, num_workers=0, image_size=16, seed=3)
    whole.set_epoch(4)
    expected = [(labels.tolist(), int(images.sum())) for images, labels in whole][3:]
    resumed = make_loader(tiny_image_folder, batch_size=8, num_workers=0, image_size=16, seed=3)
    w2 = watch(resumed)
    w2.load_state_dict(state)
    assert [(labels.tolist(), int(images.sum())) for images, labels in w2] == expected
    w.close()
    w2.close()
    # a copy of the watch does not recurse through the forwarding before its loader is set
    assert copy.copy(w).loader is loader


def test_a_loader_whose_fetches_a_callback_times_pickles_as_its_own_class_and_is_given_back():
    import pickle

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from shardfeed.readers.integrations._common import make_watch, stop_timing_fetches

    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2)
    w = make_watch(loader, {}, "train", iterate=True)
    assert isinstance(loader, DataLoader) and type(loader) is not DataLoader
    assert [x.tolist() for (x,) in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # through the watch
    assert w.report().batches == 4 - 1  # each fetch, the first (warm-up) left out
    clone = pickle.loads(pickle.dumps(loader))
    assert type(clone) is DataLoader
    assert [x.tolist() for (x,) in clone] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    stop_timing_fetches(loader)
    assert type(loader) is DataLoader
    w.close()
