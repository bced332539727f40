"""Weighted mixing and fixed-size epochs: ``make_loader([a, b], weights=[...], samples_per_epoch=N)``.

The datasets are planted: every sample's stored path names its dataset and its index
(``"a/7.jpg"``), so the source and sample of each item read back are known without the reader.
Expected counts are computed here by hand (largest remainder), never by the code under test.
"""

from __future__ import annotations

from collections import Counter

import pytest

from shardfeed.convert import write_dataset
from shardfeed.readers import make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _plant(out, name: str, n: int, fmt: str) -> str:
    write_dataset(({"image": b"\xff\xd8" + f"{name}-{i}".encode(), "ext": "jpg", "label": i % 3,
                    "path": f"{name}/{i}.jpg"} for i in range(n)), out, format=fmt, classes=["x", "y", "z"],
                  max_count=4)
    return str(out)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    # a: 10 samples (LMDB), b: 37 samples (WebDataset, shards of 4 with offset indexes)
    return _plant(root / "a", "a", 10, "lmdb"), _plant(root / "b", "b", 37, "webdataset")


def _items(batch):
    """``(source field, dataset name, sample index, label)`` of each raw item of a batch."""
    out = []
    for sample, fields in batch:
        name, file = sample.meta["path"].split("/")
        out.append((fields["source"], name, int(file.split(".")[0]), sample.label))
    return out


def _epoch(loader):
    return [item for batch in loader for item in _items(batch)]


def _loader(planted, **kw):
    opts = dict(weights=[1, 2], samples_per_epoch=25, decode=False, num_workers=0, fields=("source",), seed=3)
    opts.update(kw)
    return make_loader(list(planted), opts.pop("batch_size", 5), **opts)


def test_counts_per_source_are_the_largest_remainder_split(planted):
    # 25 * 1/3 = 8.33, 25 * 2/3 = 16.67: floors 8 + 16 = 24, the one left goes to b (remainder .67)
    loader = _loader(planted)
    for _ in range(3):
        got = Counter(name for _, name, _, _ in _epoch(loader))
        assert got == {"a": 8, "b": 17}
    # 10 * (1, 1, 1) / 3 = 3.33 each: one left, to the first source (ties: lower index)
    a, b = planted
    loader = make_loader([a, b, a], 5, weights=[1, 1, 1], samples_per_epoch=10, decode=False, num_workers=0,
                         fields=("source",))
    got = Counter(src for src, _, _, _ in _epoch(loader))
    assert got == {0: 4, 1: 3, 2: 3}
    # 7 * (0.5, 0.3, 0.2) = 3.5, 2.1, 1.4: floors 3 + 2 + 1 = 6, the one left to the largest remainder (0.5)
    loader = make_loader([a, b, a], 7, weights=[0.5, 0.3, 0.2], samples_per_epoch=7, decode=False,
                         num_workers=0, fields=("source",))
    assert Counter(src for src, _, _, _ in _epoch(loader)) == {0: 4, 1: 2, 2: 1}


def test_each_item_names_its_source_and_keeps_its_label(planted):
    for src, name, index, label in _epoch(_loader(planted)):
        assert name == "ab"[src]
        assert label == index % 3  # the label planted in that dataset


def test_large_source_has_no_repeat_within_an_epoch_and_passes_whole(planted):
    # b: 37 samples, 17 per epoch (never a whole number of passes per epoch)
    loader = _loader(planted)
    seen: Counter = Counter()
    for _ in range(9):  # 153 draws: four passes and more
        drawn = [index for _, name, index, _ in _epoch(loader) if name == "b"]
        assert len(drawn) == len(set(drawn)) == 17
        seen.update(drawn)
        # every sample drawn once before any is drawn again: the counts differ by at most one
        assert max(seen[i] for i in range(37)) - min(seen[i] for i in range(37)) <= 1


def test_small_source_repeats_only_after_a_full_pass(planted):
    # a: 10 samples, 23 per epoch (weights 23:2 of 25)
    loader = _loader(planted, weights=[23, 2])
    seen: Counter = Counter()
    for _ in range(4):
        drawn = [index for _, name, index, _ in _epoch(loader) if name == "a"]
        assert len(drawn) == 23
        seen.update(drawn)
        assert max(seen[i] for i in range(10)) - min(seen[i] for i in range(10)) <= 1
    assert sum(seen.values()) == 92


def test_epochs_differ(planted):
    loader = _loader(planted)
    first, second = _epoch(loader), _epoch(loader)
    assert first != second
    assert {(n, i) for _, n, i, _ in first if n == "b"} != {(n, i) for _, n, i, _ in second if n == "b"}


def test_one_source_with_a_fixed_epoch_size(planted):
    a, b = planted
    # bigger than the dataset: 25 draws of 10 samples: every sample twice or three times, each epoch
    loader = make_loader(a, 5, samples_per_epoch=25, decode=False, num_workers=0, fields=("source",))
    got = Counter(i for _, _, i, _ in _epoch(loader))
    assert sum(got.values()) == 25 and set(got.values()) <= {2, 3} and len(got) == 10
    # smaller: three epochs of 12 walk through the 37 samples, then go on
    loader = make_loader(b, 4, samples_per_epoch=12, decode=False, num_workers=0, fields=("source",))
    seen = [i for _ in range(3) for _, _, i, _ in _epoch(loader)]
    assert len(seen) == len(set(seen)) == 36


@pytest.mark.parametrize("world_size,num_workers", [(3, 0), (3, 2), (2, 2)])
def test_ranks_and_workers_split_the_epoch_exactly(planted, world_size, num_workers):
    whole = Counter((n, i) for _, n, i, _ in _epoch(_loader(planted, samples_per_epoch=24, batch_size=4)))
    parts = []
    for rank in range(world_size):
        loader = _loader(planted, samples_per_epoch=24, batch_size=4, rank=rank, world_size=world_size,
                         num_workers=num_workers, persistent_workers=False)
        items = _epoch(loader)
        assert len(items) == 24 // world_size
        parts.append(items)
    union = Counter((n, i) for part in parts for _, n, i, _ in part)
    assert union == whole  # the same epoch, each item on one rank only


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_gives_exactly_the_rest(planted, num_workers):
    loader = _loader(planted, batch_size=4, num_workers=num_workers, persistent_workers=False)
    _epoch(loader)  # epoch 0
    full = [_items(b) for b in loader]  # epoch 1, uninterrupted
    loader = _loader(planted, batch_size=4, num_workers=num_workers, persistent_workers=False)
    _epoch(loader)
    it = iter(loader)
    head = [_items(next(it)) for _ in range(3)]
    state = loader.state_dict()
    del it
    again = _loader(planted, batch_size=4, num_workers=num_workers, persistent_workers=False)
    again.load_state_dict(state)
    rest = [_items(b) for b in again]
    assert head == full[:3]
    assert rest == full[3:]
    assert [_items(b) for b in again] != []  # then the next epoch


def test_decoded_batches_carry_the_source_index(tiny_image_folder, packed_lmdb):
    loader = make_loader([str(tiny_image_folder), str(packed_lmdb)], 8, weights=[3, 1], samples_per_epoch=16,
                         image_size=32, num_workers=0, fields=("source",))
    sources = []
    for images, labels, srcs in loader:
        assert images.shape[1:] == (3, 32, 32) and labels.shape == (len(srcs),)
        sources += srcs
    assert Counter(sources) == {0: 12, 1: 4}
    plain = make_loader([str(tiny_image_folder), str(packed_lmdb)], 8, weights=[3, 1], samples_per_epoch=16,
                        image_size=32, num_workers=0)
    assert all(len(batch) == 2 for batch in plain)


@pytest.mark.parametrize("kw,err,match", [
    (dict(weights=[1, -1]), ValueError, "positive and finite"),
    (dict(weights=[1, float("nan")]), ValueError, "positive and finite"),
    (dict(weights=[1, float("inf")]), ValueError, "positive and finite"),
    (dict(weights=[1]), ValueError, "one weight per source"),
    (dict(weights=[1, "2"]), TypeError, "not a number"),
    (dict(samples_per_epoch=0), ValueError, "at least 1"),
    (dict(samples_per_epoch=2.5), TypeError, "must be an integer"),
    (dict(samples_per_epoch=True), TypeError, "must be an integer"),
    (dict(samples_per_epoch=None), ValueError, "samples_per_epoch=N"),
])
def test_bad_mix_arguments_are_refused(planted, kw, err, match):
    opts = dict(weights=[1, 2], samples_per_epoch=10, num_workers=0)
    opts.update(kw)
    with pytest.raises(err, match=match):
        make_loader(list(planted), 4, **opts)


def test_weights_need_a_list_of_sources(planted):
    with pytest.raises(ValueError, match="weights apply to a list"):
        make_loader(planted[0], 4, weights=[1], samples_per_epoch=10, num_workers=0)


def test_webdataset_without_offset_index_is_refused(tmp_path, planted):
    import json

    b = tmp_path / "b"
    import shutil

    shutil.copytree(planted[1], b)
    manifest = json.loads((b / "manifest.json").read_text())
    for shard in manifest["shards"]:
        (b / shard.pop("index")).unlink()
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="shardfeed index"):
        make_loader([planted[0], str(b)], 4, samples_per_epoch=10, num_workers=0)


def test_workers_give_the_same_batches_as_the_main_process(tiny_image_folder, packed_wds):
    # two sources' images decode into one batch buffer (the shared-memory batch ring with workers)
    opts = dict(weights=[1, 2], samples_per_epoch=24, image_size=24, train=True, seed=5)
    here = [(x.clone(), y.clone()) for x, y in make_loader([str(tiny_image_folder), str(packed_wds)], 8,
                                                           num_workers=0, **opts)]
    loader = make_loader([str(tiny_image_folder), str(packed_wds)], 8, num_workers=2, persistent_workers=False,
                         **opts)
    there = [(x.clone(), y.clone()) for x, y in loader]
    assert len(here) == len(there) == 3
    for (xa, ya), (xb, yb) in zip(here, there):
        assert xa.equal(xb) and ya.equal(yb)


def test_a_sample_drawn_again_is_cropped_anew(tiny_image_folder):
    # unshuffled, an epoch of four passes over the folder: each image four times, each time cropped anew
    from shardfeed.readers import open_dataset

    n = open_dataset(str(tiny_image_folder)).num_samples
    loader = make_loader([str(tiny_image_folder)], 4, samples_per_epoch=4 * n, image_size=16, train=True,
                         num_workers=0, shuffle=False)
    images = [x for batch, _ in loader for x in batch]
    copies = images[0::n]  # sample 0 of every pass
    assert len(copies) == 4
    assert len({c.numpy().tobytes() for c in copies}) == 4


def test_a_state_of_another_mix_is_refused(planted):
    from shardfeed.readers.errors import ResumeStateError

    loader = _loader(planted)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    a, b = planted
    with pytest.raises(ResumeStateError, match="another dataset"):
        make_loader([a, a], 5, weights=[1, 2], samples_per_epoch=25, decode=False, num_workers=0,
                    fields=("source",), seed=3).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="another dataset"):  # other counts per source
        _loader(planted, weights=[1, 1]).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="num_samples"):
        _loader(planted, samples_per_epoch=30).load_state_dict(state)


def test_pad_gives_every_rank_the_same_share(planted):
    # 25 samples on 2 ranks: 13 each with pad=True, the 26th repeats the epoch's first
    whole = [(n, i) for _, n, i, _ in _epoch(_loader(planted, batch_size=4))]
    parts = [[(n, i) for _, n, i, _ in _epoch(_loader(planted, batch_size=4, rank=r, world_size=2, pad=True))]
             for r in range(2)]
    assert [len(p) for p in parts] == [13, 13]
    assert Counter(parts[0] + parts[1]) == Counter(whole + whole[:1])


def test_gpu_decoding_of_a_mix_is_refused(planted):
    with pytest.raises(ValueError, match="mix sources with CPU decoding"):
        make_loader(list(planted), 4, samples_per_epoch=10, num_workers=0, decode_device="cuda")
