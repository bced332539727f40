"""watch's advice follows what the loader reads: planted datasets whose right advice is known.

* a packed WebDataset on local disk read by ``make_loader``: never ``shardfeed pack`` (it is packed)
  nor ``shardfeed stage`` (it is already local);
* small stored images (80 px shorter side) under ``image_size=64``: no ``--resize`` (it would
  enlarge them), no other ``image_size``, no advice to use the decoder already in use;
* large stored images: ``--resize`` with a number below their size;
* a remote packed dataset: ``stage``, no ``pack``;
* the ``cpu-bound`` text names the share that crossed :data:`WORKER_CPU_SATURATED`.
"""

from __future__ import annotations

import re

import pytest
from torch.utils.data import DataLoader

from shardfeed.convert import PackOptions, pack
from shardfeed.readers import make_loader
from shardfeed.readers.measure.watch import WORKER_CPU_SATURATED, data_facts, diagnose, watch

from .watch_helpers import FilesDataset, make_jpeg_folder, timed_loop

SMALL = (96, 80)  # w, h of the planted small images: shorter side 80 px
LARGE = (640, 480)  # shorter side 480 px

#: worker figures of each stalled verdict (shares in [0, 1])
STORAGE = {"num": 2, "cpu_busy_share": 0.05, "cpu_demand_share": 0.1, "disk_sleep_share": 0.3}  # in disk sleep
CPU = {"num": 2, "cpu_busy_share": 0.95, "cpu_demand_share": 1.0}
MAIN = {"num": 2, "cpu_busy_share": 0.05, "cpu_demand_share": 0.05}


def _advise(facts, workers, main=None, num_workers=2, data=None):
    return diagnose(stall_share=0.5, batches=50, num_workers=num_workers, workers=workers, main=main,
                    loader={"num_workers": num_workers}, cpu_count=8, cuda=False, epochs=1, facts=facts, data=data)


def _all_verdicts(facts, data=None):
    out = [_advise(facts, STORAGE, data=data), _advise(facts, CPU, data=data),
           _advise(facts, MAIN, main={"cpu_busy_share": 0.99}, data=data),
           _advise(facts, None, num_workers=0, data=data)]
    assert [d["kind"] for d in out] == ["storage-bound", "cpu-bound", "main-process-bound", "main-process-bound"]
    return out


@pytest.fixture(scope="module")
def small_wds(tmp_path_factory):
    root = tmp_path_factory.mktemp("advice")
    make_jpeg_folder(root / "images", 24, size=SMALL)
    pack(root / "images", root / "wds", PackOptions(format="wds", max_count=8))
    return root / "wds"


@pytest.fixture(scope="module")
def large_wds(tmp_path_factory):
    root = tmp_path_factory.mktemp("advice_large")
    make_jpeg_folder(root / "images", 4, size=LARGE)
    pack(root / "images", root / "wds", PackOptions(format="wds", max_count=8))
    return root / "wds"


def test_the_facts_of_a_local_packed_webdataset(small_wds):
    loader = make_loader(small_wds, 8, num_workers=0, image_size=64)
    facts = data_facts(loader)
    assert facts["reader"] == "shardfeed" and facts["format"] == "webdataset"
    assert facts["remote"] is False and facts["slow_storage"] is False
    assert facts["image_size"] == 64
    assert facts["image_side"] == min(SMALL)


def test_a_local_packed_dataset_is_told_neither_to_pack_nor_to_stage(small_wds):
    facts = data_facts(make_loader(small_wds, 8, num_workers=0, image_size=64))
    for d in _all_verdicts(facts, data=str(small_wds)):
        advice = " | ".join(d["advice"])
        assert "shardfeed pack" not in advice and "shardfeed stage" not in advice, d


def test_small_images_get_no_resize_no_other_image_size_and_no_decoder_in_use(small_wds):
    pytest.importorskip("simplejpeg")
    facts = data_facts(make_loader(small_wds, 8, num_workers=0, image_size=64, decoder="simplejpeg"))
    assert facts["decoder"] == "simplejpeg"
    for d in _all_verdicts(facts):
        advice = " | ".join(d["advice"])
        assert "--resize" not in advice, d
        assert not [s for s in re.findall(r"image_size=(\d+)", advice) if s != "64"], d
        assert "simplejpeg" not in advice, d


def test_another_decoder_is_told_about_simplejpeg(small_wds):
    facts = data_facts(make_loader(small_wds, 8, num_workers=0, image_size=64, decoder="pil"))
    assert facts["decoder"] == "pil"
    cpu = _advise(facts, CPU)
    assert any(a.startswith("decoder='pil' → 'simplejpeg'") for a in cpu["advice"]), cpu


def test_large_images_get_a_resize_below_their_size(large_wds):
    facts = data_facts(make_loader(large_wds, 4, num_workers=0, image_size=64))
    assert facts["image_side"] == min(LARGE)
    cpu = _advise(facts, CPU)
    sizes = [int(m) for a in cpu["advice"] for m in re.findall(r"--resize (\d+)", a)]
    assert len(sizes) == 1 and 64 <= sizes[0] < min(LARGE), cpu


def test_a_remote_packed_dataset_is_told_to_stage_not_to_pack():
    facts = {"reader": "shardfeed", "format": "webdataset", "remote": True, "slow_storage": False,
             "decoder": "simplejpeg", "image_size": 64, "image_side": None}
    d = _advise(facts, STORAGE, data="https://example.org/train")
    advice = " | ".join(d["advice"])
    assert "shardfeed pack" not in advice
    assert any(a.startswith("shardfeed stage https://example.org/train ") for a in d["advice"]), d
    assert any(a.startswith("make_loader('https://example.org/train', cache=\"memory\")") for a in d["advice"]), d


def test_an_image_folder_read_by_shardfeed_is_told_to_pack_not_to_stage(tmp_path):
    make_jpeg_folder(tmp_path / "images", 4, size=SMALL)
    facts = data_facts(make_loader(tmp_path / "images", 2, num_workers=0, image_size=64))
    assert facts["format"] == "folder" and facts["remote"] is False and facts["image_side"] == min(SMALL)
    d = _advise(facts, STORAGE, data=str(tmp_path / "images"))
    assert d["advice"][1].startswith(f"shardfeed pack {tmp_path / 'images'} OUT --format wds"), d
    assert not any("shardfeed stage" in a for a in d["advice"]), d


def test_a_users_dataset_of_small_files_gets_pack_but_no_resize(tmp_path):
    paths = make_jpeg_folder(tmp_path / "images", 4, size=SMALL)
    facts = data_facts(DataLoader(FilesDataset(paths), batch_size=2))
    assert facts["reader"] == "other" and facts["format"] is None and facts["image_side"] == min(SMALL)
    for d in _all_verdicts(facts):
        assert "--resize" not in " | ".join(d["advice"]), d
    assert any(a.startswith("shardfeed pack DATA OUT --format wds") for a in _advise(facts, STORAGE)["advice"])


def test_unknown_image_sizes_get_no_resize_number():
    cpu = _advise({}, CPU)
    resize = [a for a in cpu["advice"] if "--resize" in a]
    assert resize and not re.search(r"--resize \d", resize[0]), cpu


def test_the_cpu_bound_text_names_the_share_that_crossed_the_threshold():
    waiting = _advise(None, {"num": 2, "cpu_busy_share": 0.36, "cpu_demand_share": 0.95})
    assert 0.36 < WORKER_CPU_SATURATED <= 0.95
    assert waiting["kind"] == "cpu-bound"
    assert "running or runnable 95%" in waiting["text"] and "CPU-saturated" not in waiting["text"], waiting
    assert "CPU-saturated" not in waiting["advice"][0] and "running or runnable 95%" in waiting["advice"][0]
    busy = _advise(None, {"num": 2, "cpu_busy_share": 0.9, "cpu_demand_share": 0.95})
    assert "CPU-saturated (CPU busy 90%" in busy["text"], busy


def test_a_watched_loop_over_a_local_packed_dataset_gives_no_pack_stage_or_resize(small_wds):
    loader = make_loader(small_wds, 4, num_workers=0, image_size=64)
    w = watch(loader)
    timed_loop(w, 0.0)
    rep = w.report()
    w.close()
    advice = " | ".join(rep.diagnosis["advice"])
    for word in ("shardfeed pack", "shardfeed stage", "--resize", "simplejpeg", "image_size=224"):
        assert word not in advice, rep.summary()


def test_a_dataset_cached_in_memory_is_told_neither_to_pack_stage_nor_cache(small_wds):
    facts = data_facts(make_loader(small_wds, 8, num_workers=0, image_size=64, cache="memory"))
    assert facts["in_memory"] is True and facts["image_side"] == min(SMALL)
    for d in _all_verdicts(facts):
        advice = " | ".join(d["advice"])
        for word in ("shardfeed pack", "shardfeed stage", 'cache="memory"', "--resize"):
            assert word not in advice, d
