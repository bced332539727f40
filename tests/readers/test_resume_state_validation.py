"""A tampered loader state (``loader.load_state_dict``): every field checked before use.

A state saved by the loader after 3 batches is edited one field at a time; each edit must be a
:class:`ResumeStateError` naming the field, and the loader must stay usable. The untouched state
still resumes: the samples read before plus those read after are the folder's files, each once.
"""

from __future__ import annotations

import copy

import pytest

from shardfeed.readers import make_loader
from shardfeed.readers.errors import ResumeStateError

BATCH = 4


def _loader(packed_wds, **kw):
    return make_loader(packed_wds, BATCH, num_workers=0, decode=False, shuffle_buffer=8, **kw)


@pytest.fixture(scope="module")
def saved(packed_wds):
    loader = _loader(packed_wds)
    it = iter(loader)
    seen = [s.meta["path"] for _ in range(3) for s in next(it)]
    return copy.deepcopy(loader.state_dict()), seen


def _segment(state):
    seg = {k: state[k] for k in ("world_size", "num_workers", "batch_size", "shuffle_buffer")}
    seg["samples_consumed"] = 4
    return seg


#: (field named in the error, edit)
CASES = [
    ("fingerprint", lambda s: s.update(fingerprint=123)),
    ("seed", lambda s: s.update(seed="0")),
    ("seed", lambda s: s.update(seed=10 ** 30)),
    ("shuffle", lambda s: s.update(shuffle=1)),
    ("pad", lambda s: s.update(pad="no")),
    ("drop_last", lambda s: s.update(drop_last=None)),
    ("num_samples", lambda s: s.update(num_samples="60")),
    ("num_samples", lambda s: s.update(num_samples=-60)),
    ("epoch", lambda s: s.update(epoch=-1)),
    ("epoch", lambda s: s.update(epoch=1.5)),
    ("batches_consumed", lambda s: s.update(batches_consumed=-3)),
    ("world_size", lambda s: s.update(world_size=0)),
    ("world_size", lambda s: s.update(world_size=10 ** 9)),
    ("num_workers", lambda s: s.update(num_workers=10 ** 9)),
    ("num_workers", lambda s: s.update(num_workers=-1)),
    ("batch_size", lambda s: s.update(batch_size=0)),
    ("batch_size", lambda s: s.update(batch_size="4")),
    ("shuffle_buffer", lambda s: s.update(shuffle_buffer=-5)),
    ("samples_consumed", lambda s: s.update(samples_consumed=-12)),
    ("samples_consumed", lambda s: s.update(samples_consumed=61)),
    ("samples_consumed", lambda s: s.update(samples_consumed=12.0)),
    ("samples_consumed", lambda s: s.pop("samples_consumed")),
    ("segments", lambda s: s.update(segments="x")),
    ("segments", lambda s: s.update(segments=[{}] * 10_001)),
    ("segments[0]", lambda s: s.update(segments=[7])),
    ("segments[0].num_workers", lambda s: s.update(segments=[{**_segment(s), "num_workers": 10 ** 9}])),
    ("segments[0].shuffle_buffer", lambda s: s.update(segments=[{**_segment(s), "shuffle_buffer": -5}])),
    ("segments[0].samples_consumed", lambda s: s.update(segments=[{**_segment(s), "samples_consumed": -1}])),
    ("segments[0].world_size", lambda s: s.update(segments=[{**_segment(s), "world_size": True}])),
    ("samples_consumed", lambda s: s.update(samples_consumed=60, world_size=2)),  # more than a rank's 30
]


@pytest.mark.parametrize("field,edit", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_every_tampered_field_is_refused_naming_it(packed_wds, saved, field, edit):
    state = copy.deepcopy(saved[0])
    edit(state)
    loader = _loader(packed_wds)
    with pytest.raises(ResumeStateError) as info:
        loader.load_state_dict(state)
    assert f"field {field} " in str(info.value), str(info.value)
    # the refused state changed nothing: the loader reads a whole fresh epoch
    assert sum(len(b) for b in loader) == 60


def test_the_untouched_state_resumes_the_rest_exactly_once(packed_wds, saved, tiny_folder_expected):
    state, seen = saved
    loader = _loader(packed_wds)
    loader.load_state_dict(copy.deepcopy(state))
    rest = [s.meta["path"] for b in loader for s in b]
    assert sorted(seen + rest) == sorted(tiny_folder_expected)
