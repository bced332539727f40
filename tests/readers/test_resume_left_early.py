"""``loader.state_dict()`` after the training loop left the epoch early.

However the loop ends (``break``, an exception in the step, ``itertools.islice``, ``del it``),
the state describes the batches the loop received (torchdata's ``StatefulDataLoader`` contract):
a new loader resumed from it reads the rest of the epoch, and the samples read before and after
are the epoch's samples exactly once. The expectation is the planted image folder (paths, bytes,
labels), never the loader's own output.
"""

from __future__ import annotations

import gc
import itertools
import json
from collections import Counter

import pytest

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create")]

BATCH = 7
TAKEN = 3  # batches the loop takes before it leaves


def _leave_early(loader, way: str) -> list:
    """Take ``TAKEN`` batches from ``loader`` and leave the loop by ``way``; returns the batches."""
    got: list = []
    if way == "break":
        for batch in loader:
            got.append(batch)
            if len(got) == TAKEN:
                break
    elif way == "exception":
        with pytest.raises(RuntimeError, match="the step failed"):
            for batch in loader:
                got.append(batch)
                if len(got) == TAKEN:
                    raise RuntimeError("the step failed")
    elif way == "islice":
        got = list(itertools.islice(loader, TAKEN))
    elif way == "del":
        it = iter(loader)
        got = [next(it) for _ in range(TAKEN)]
        del it
    else:  # pragma: no cover - a typo in the parametrisation
        raise AssertionError(way)
    gc.collect()  # the abandoned iterator is gone for good
    return got


def _samples(batches) -> list[tuple[str, bytes, int]]:
    return [(s.meta["path"], s.data, int(s.label)) for batch in batches for s in batch]


def _check_exactly_once(samples, expected) -> None:
    assert Counter(path for path, _, _ in samples) == Counter(expected.keys())  # every sample once, none twice
    for path, data, label in samples:
        assert (data, label) == expected[path], path


def _sources(packed_wds, packed_lmdb, tiny_image_folder) -> dict:
    return {"wds": (packed_wds, {"shuffle_buffer": 10}), "lmdb": (packed_lmdb, {}),
            "folder": (tiny_image_folder, {})}


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=[pytest.mark.multiprocess, pytest.mark.slow])])
@pytest.mark.parametrize("way", ["break", "exception", "islice", "del"])
def test_state_after_leaving_the_loop_resumes_the_rest_of_the_epoch(
        packed_wds, packed_lmdb, tiny_image_folder, tiny_folder_expected, way, num_workers):
    from shardfeed.readers import make_loader

    sources = _sources(packed_wds, packed_lmdb, tiny_image_folder)
    names = ["wds", "lmdb", "folder"] if num_workers == 0 else ["wds", "lmdb"] if way == "break" else ["wds"]
    for name in names:
        source, kw = sources[name]
        opts = dict(kw, num_workers=num_workers, decode=False, seed=5)
        loader = make_loader(source, BATCH, **opts)
        before = _samples(_leave_early(loader, way))
        assert len(before) == TAKEN * BATCH
        state = json.loads(json.dumps(loader.state_dict()))  # what a checkpoint keeps
        assert (state["epoch"], state["samples_consumed"]) == (0, TAKEN * BATCH), name
        del loader
        resumed = make_loader(source, BATCH, **opts)
        resumed.load_state_dict(state)
        after = _samples(resumed)  # the rest of epoch 0
        _check_exactly_once(before + after, tiny_folder_expected)


def test_a_new_iteration_after_leaving_early_is_the_next_epoch(packed_lmdb, tiny_folder_expected):
    """``StatefulDataLoader``: the state follows the latest ``iter(loader)``; one that ran to its
    end stands for the start of the next epoch."""
    from shardfeed.readers import make_loader

    loader = make_loader(packed_lmdb, BATCH, num_workers=0, decode=False, seed=5)
    _leave_early(loader, "break")
    second = list(itertools.islice(loader, 2))  # epoch 1
    assert Counter(p for p, _, _ in _samples(second)) <= Counter(tiny_folder_expected.keys())
    state = loader.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (1, 2 * BATCH)
    rest = list(iter(loader))  # epoch 2, to its end
    _check_exactly_once(_samples(rest), tiny_folder_expected)
    state = loader.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (3, 0)
