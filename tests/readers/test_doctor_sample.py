"""``doctor``'s stratified sample of an image folder: the allocation, the draw over folders, the
stratified mean and its error, the growth of the sample, the layout test (the same files in class
folders and in one flat folder), the decoder named per format and the advice's one line per action."""

from __future__ import annotations

import io
import math
import random
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.readers.measure import doctor_folder
from shardfeed.readers.measure.doctor import doctor
from shardfeed.readers.measure.doctor_advice import advice_action, advice_lines
from shardfeed.readers.measure.doctor_sample import (FIRST_SAMPLE, TARGET_RELATIVE_ERROR, StratifiedSample, allocate,
                                                   image_format, make_strata, size_bucket, stratified_mean)
from shardfeed.readers.decode.image import backend_for_format

N_SMALL, N_LARGE, N_CLASSES = 300, 6, 3


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> dict:
    """The same files twice: ``classes`` (ROOT/CLASS/IMAGE) and ``flat`` (ROOT/IMAGE): 300 small PNGs
    (32 to 71 pixels a side) and 6 large JPEGs (2000 to 3000 by 2250), 2 % of the files and most of
    the decode time."""
    base = tmp_path_factory.mktemp("mixed")
    classes, flat = base / "classes", base / "flat"
    rng = np.random.default_rng(7)
    tile = rng.integers(0, 255, (72, 72, 3), dtype=np.uint8)
    y, x = np.mgrid[0:2250, 0:3000]
    big = np.stack([(x * 7) % 256, (y * 3) % 256, ((x + y) * 5) % 256], -1).astype(np.uint8)
    names = [(f"c{i % N_CLASSES}", f"s{i:04d}.png") for i in range(N_SMALL)]
    names += [(f"c{i % N_CLASSES}", f"photo{i:03d}.jpg") for i in range(N_LARGE)]
    flat.mkdir(parents=True)
    for i, (cls, name) in enumerate(names):
        (classes / cls).mkdir(parents=True, exist_ok=True)
        p = classes / cls / name
        if name.endswith(".png"):
            side = 32 + (i * 7) % 40
            Image.fromarray(np.ascontiguousarray(np.roll(tile, i, axis=0)[:side, :side])).save(p)
        else:
            width = 2000 + 200 * (i - N_SMALL)
            Image.fromarray(np.ascontiguousarray(big[:, :width])).save(p, quality=92)
        shutil.copy(p, flat / f"{cls}_{name}")
    return {"classes": classes, "flat": flat}


# ---------------------------------------------------------------------------------------------
# allocation, draw, mean


def test_allocation_is_proportional_with_two_per_stratum():
    counts = {"png": 980, "jpg": 20, "webp": 1}
    alloc = allocate(counts, 64)
    assert sum(alloc.values()) == 64
    assert alloc["webp"] == 1 and alloc["jpg"] >= 2  # every stratum measured, twice where it can be
    assert alloc["png"] == 64 - alloc["jpg"] - 1 and abs(alloc["png"] - 64 * 980 / 1001) <= 2
    assert allocate({"a": 3, "b": 2}, 100) == {"a": 3, "b": 2}  # never more than a stratum holds
    # a cap below the floors: one file in each of the largest strata, none twice
    assert allocate({"a": 10, "b": 30, "c": 20, "d": 5}, 3) == {"a": 1, "b": 1, "c": 1, "d": 0}
    assert allocate({"a": 10, "b": 30, "c": 20, "d": 5}, 6) == {"a": 1, "b": 2, "c": 2, "d": 1}


def test_strata_by_format_and_size():
    assert image_format("x/y.JPG") == image_format("y.jpeg") == "JPEG" and image_format("a.png") == "PNG"
    assert size_bucket(1000) == size_bucket(4095) == 0
    assert size_bucket(10 * 1024) == 1 and size_bucket(5 * 1024 * 1024) == 6  # 4-16 KiB, 4-16 MiB
    strata = make_strata([("b/2.png", 9000), ("a/1.png", 9000), ("c.jpg", 6_000_000)])
    assert strata == {("JPEG", 6): [("c.jpg", 6_000_000)], ("PNG", 1): [("a/1.png", 9000), ("b/2.png", 9000)]}


def test_the_draw_spreads_over_the_folders_in_proportion():
    # one stratum, 4 folders of 100 files each: 8 files drawn are 2 per folder, for any seed
    files = [(f"d{f}/{i:03d}.png", 5000) for f in range(4) for i in range(100)]
    for seed in range(5):
        picked: list[str] = []
        s = StratifiedSample(files, random.Random(seed), lambda p, seen=picked: seen.append(p) or _rec(1.0))
        s.run(8, math.inf, _judge)
        assert sorted(p.split("/")[0] for p in picked) == ["d0", "d0", "d1", "d1", "d2", "d2", "d3", "d3"]
        assert len(set(picked)) == 8


def test_stratified_mean_and_its_standard_error():
    values = {"a": [1.0, 3.0], "b": [10.0, 14.0, 12.0]}
    counts = {"a": 10, "b": 30}
    mean, se = stratified_mean(values, counts)
    assert mean == pytest.approx(0.25 * 2.0 + 0.75 * 12.0)
    var = 0.25 ** 2 * (1 - 2 / 10) * 2.0 / 2 + 0.75 ** 2 * (1 - 3 / 30) * 4.0 / 3
    assert se == pytest.approx(math.sqrt(var))
    # a stratum measured once borrows the largest relative variance of the others
    mean1, se1 = stratified_mean({"a": [1.0, 3.0], "b": [12.0]}, counts)
    assert se1 == pytest.approx(math.sqrt(0.25 ** 2 * 0.8 * 1.0 + 0.75 ** 2 * (1 - 1 / 30) * 0.5 * 144.0))


def _rec(decode_s: float) -> dict:
    return {"open_s": 0.0, "first_s": 0.0, "rest": 0, "rest_s": 0.0, "cpu_s": 0.0, "decode_s": decode_s,
            "pixels": 100}


def _judge(sample):
    mean, se = sample.mean(lambda r: r["decode_s"])
    return (2 * se / mean if mean else None), (lambda r: r["decode_s"])


def test_the_sample_stops_when_the_error_is_small():
    files = [(f"{i:04d}.png", 5000) for i in range(1000)]
    s = StratifiedSample(files, random.Random(0), lambda p: _rec(1.0))
    s.run(512, math.inf, _judge)
    assert s.sampled == FIRST_SAMPLE and s.stopped_by == "target"


def test_the_sample_grows_while_the_error_is_large():
    files = [(f"{i:04d}.png", 5000) for i in range(1000)]
    s = StratifiedSample(files, random.Random(0), lambda p: _rec(1.0 if int(p[:4]) % 2 else 20.0))
    s.run(512, math.inf, _judge)
    err, _ = _judge(s)
    assert s.sampled > FIRST_SAMPLE
    assert (s.stopped_by == "target" and err <= TARGET_RELATIVE_ERROR) or (s.stopped_by == "max_files"
                                                                            and s.sampled == 512)


def test_the_sample_stops_at_the_deadline():
    ticks = iter(range(10_000))
    files = [(f"{i:04d}.png", 5000) for i in range(1000)]
    s = StratifiedSample(files, random.Random(0), lambda p: _rec(1.0 if int(p[:4]) % 2 else 20.0),
                         clock=lambda: next(ticks))
    s.run(512, 10, _judge)
    # 3 files before the clock is read, then one reading per file: readings 0 to 10 let 11 more through
    assert s.stopped_by == "budget" and s.sampled == 3 + 11


# ---------------------------------------------------------------------------------------------
# doctor on the mixed folder


def _rate(rep) -> float:
    return rep.predicted["folder_images_per_s"]


#: Planted costs: every file's open and first read take 0.1 ms, its system calls 0.05 ms of CPU, the
#: rest is read at 1 GB/s, and decoding costs 2 ns per pixel plus 0.05 ms.
_OPEN_S, _FIRST_S, _FILE_CPU_S, _BYTES_PER_S, _S_PER_PIXEL, _DECODE_BASE_S = 1e-4, 1e-4, 5e-5, 1e9, 2e-9, 5e-5


def _planted_read(path, keep, max_rest=None, keep_max=None):
    data = Path(path).read_bytes()
    rest = max(0, len(data) - 64 * 1024)
    return {"open_s": _OPEN_S, "first_s": _FIRST_S, "rest_s": rest / _BYTES_PER_S, "size": len(data), "rest": rest,
            "cpu_s": _FILE_CPU_S, "data": data}


def _planted_decode(name, data, decoder, image_size, keep=None):
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
    return _DECODE_BASE_S + _S_PER_PIXEL * w * h, w * h


def _true_rate(root: Path, workers: int) -> float:
    """The folder rate of the model from every file's planted costs (no sample)."""
    wall, cpu = [], []
    for p in sorted(root.rglob("*.*")):
        r = _planted_read(p, True)
        dec = _planted_decode(p.name, r["data"], "pil", None)[0]
        wall.append(_OPEN_S + _FIRST_S + r["rest"] / _BYTES_PER_S + dec)
        cpu.append(dec + _FILE_CPU_S)
    return min(workers / statistics.fmean(wall), workers / statistics.fmean(cpu))


def test_class_folders_and_flat_predict_the_same(mixed, monkeypatch):
    """The same files predict within 1.25x of each other in either layout and for any seed, and of
    the rate every file's costs give; the costs are planted per file (a file's reads and decode),
    so the figures depend on the sample alone."""
    monkeypatch.setattr(doctor_folder, "timed_read", _planted_read)
    monkeypatch.setattr(doctor_folder, "decode_one", _planted_decode)
    reps = {(layout, seed): doctor(mixed[layout], num_workers=2, seed=seed, budget_s=120)
            for seed in range(4) for layout in ("classes", "flat")}
    rates = {k: _rate(r) for k, r in reps.items()}
    truth = _true_rate(mixed["flat"], 2)
    for seed in range(4):
        a, b = rates[("classes", seed)], rates[("flat", seed)]
        assert max(a, b) / min(a, b) <= 1.25, rates
    assert all(1 / 1.25 <= r / truth <= 1.25 for r in rates.values()), (truth, rates)
    for r in reps.values():
        assert r.files["count"] == N_SMALL + N_LARGE
        jpeg = [s for s in r.files["strata"] if s["format"] == "JPEG"]
        assert jpeg and all(s["sampled"] >= min(2, s["files"]) for s in jpeg)  # the rare photos are measured
        err = r.predicted["error_share"]
        assert err is not None and (err <= TARGET_RELATIVE_ERROR or r.files["sample_stopped_by"] != "target")


def test_a_random_sample_of_the_same_files_misses_the_photos(mixed):
    """Why the sample is stratified: 64 files drawn at random from these 306 hold none of the 6
    photos about a quarter of the time, and then the photos' decode time, most of the total, is
    not counted."""
    names = sorted(p.name for p in mixed["flat"].iterdir())
    misses = sum(not any(n.endswith(".jpg") for n in random.Random(seed).sample(names, 64)) for seed in range(200))
    assert 0.15 < misses / 200 < 0.45


@pytest.mark.slow
def test_the_decoder_is_named_per_format_share(mixed):
    rep = doctor(mixed["flat"], num_workers=1, cold=False, budget_s=60)
    rows = {r["format"]: r for r in rep.decode["by_format"]}
    assert set(rows) == {"PNG", "JPEG"}
    assert rows["PNG"]["share"] == pytest.approx(N_SMALL / (N_SMALL + N_LARGE))
    assert rows["JPEG"]["share"] == pytest.approx(N_LARGE / (N_SMALL + N_LARGE))
    assert rows["PNG"]["decoder"] == "Pillow"
    assert rows["JPEG"]["decoder"] == backend_for_format(rep.decode["decoder"], "JPEG")
    assert [r["format"] for r in rep.decode["by_format"]] == ["PNG", "JPEG"]  # largest share first
    assert f"PNG {N_SMALL / (N_SMALL + N_LARGE):.0%}: Pillow" in rep.summary()
    assert "±" in rep.summary() and "95 % interval" in rep.summary()
    assert len({advice_action(a) for a in rep.advice}) == len(rep.advice)


def test_backend_for_format():
    assert backend_for_format("simplejpeg", "JPEG") == "simplejpeg"
    assert backend_for_format("simplejpeg", "PNG") == "Pillow"
    assert backend_for_format("cv2", "PNG") == "OpenCV" and backend_for_format("cv2", "GIF") == "Pillow"
    assert backend_for_format("pil", "JPEG") == "Pillow"


# ---------------------------------------------------------------------------------------------
# advice


def _advice(folder, packed, local, more_rate, nw=1, cpus=4, px=None, fs="local", total=1e12, ram=1e9):
    pred = {"folder_images_per_s": folder, "packed_images_per_s": packed, "local_images_per_s": local,
            "more_workers": {"num_workers": max(2 * nw, nw + 2), "folder_images_per_s": more_rate,
                             "packed_images_per_s": more_rate}}
    return advice_lines("folder", "data", {"fs_class": fs}, {"estimated_total_bytes": total},
                        {"median_pixels": px}, pred, nw, cpus, int(ram), None)


@pytest.mark.parametrize("case", [
    dict(folder=900, packed=950, local=1000, more_rate=1800),            # decode-bound, more workers predicted
    dict(folder=900, packed=950, local=1000, more_rate=1800, px=10**6),  # and large images
    dict(folder=100, packed=900, local=1000, more_rate=300, fs="nfs", total=1e6),  # storage-bound on NFS
    dict(folder=100, packed=120, local=1000, more_rate=200, nw=4, cpus=4),
    dict(folder=990, packed=995, local=1000, more_rate=1000, nw=4, cpus=4),
])
def test_one_line_per_action(case):
    lines = _advice(**case)
    actions = [advice_action(a) for a in lines]
    assert len(actions) == len(set(actions)), lines
    assert sum(a.startswith("more workers") for a in lines) <= 1, lines
    if any(a.startswith("nothing to gain") for a in lines):
        assert len(lines) == 1


def test_decode_bound_more_workers_names_the_cores():
    lines = _advice(folder=900, packed=950, local=1000, more_rate=1800)
    more = [a for a in lines if a.startswith("more workers")]
    assert more == ["more workers: num_workers=1 → 4: decoding is the limit and this machine has 4 cores "
                    "(up to about 4,000 images/s)"]
