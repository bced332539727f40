"""README promises about ``make_loader`` and ``cache="memory"`` with real DataLoader workers.

* ``cache="memory"``: one contiguous buffer shared with forked workers *without copy-on-write
  growth*: each worker's private memory (``Private_Dirty`` in ``/proc/PID/smaps_rollup``, read
  by the kernel, not by us) grows by far less than its share of the cache while it reads every
  sample. A cache held as one Python ``bytes`` object per sample grows each worker by about the
  bytes it reads (~24 MB of 40 MB here, measured), as reference-count writes copy the pages.
* ``train=True`` through ``make_loader`` with workers: seeded augmentation, reproducible, new
  crops each epoch, labels untouched.
* Defaults: ``num_workers = min(4, usable CPUs)``; every worker runs with one torch and one
  OpenCV thread (checked in a separate process, whose CPU set and thread settings we choose).
  Forked workers get one OpenCV thread too (the parent does not hold OpenCV when it forks).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from shardfeed.readers import make_loader, open_dataset

NUM_SMALL_FILES = 16_000
SMALL_FILE_BYTES = 2_000


def _rollup(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0]) * 1024
    return out


def _record_rollup(directory: str, worker_id: int) -> None:
    """``worker_init_fn``: write this worker's PID and memory at start-up to ``directory``."""
    Path(directory, f"{os.getpid()}.json").write_text(json.dumps(_rollup(os.getpid())))


@pytest.fixture(scope="module")
def many_small_files(tmp_path_factory) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """4 classes of 2 KB files (random bytes, read raw: ``decode=False``), 32 MB in all; many
    small samples are where copy-on-write of per-sample objects would show."""
    root = tmp_path_factory.mktemp("small") / "images"
    rng = np.random.default_rng(5)
    expected = {}
    for c in range(4):
        (root / f"class{c}").mkdir(parents=True)
    for i in range(NUM_SMALL_FILES):
        rel = f"class{i % 4}/{i:06d}.jpg"
        data = rng.bytes(SMALL_FILE_BYTES)
        (root / rel).write_bytes(data)
        expected[rel] = (data, i % 4)
    return root, expected


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_memory_cache_shared_by_forked_workers_without_copy_on_write_growth(many_small_files, tmp_path):
    root, expected = many_small_files
    ds = open_dataset(root, decode=False, cache="memory")
    cache_bytes = NUM_SMALL_FILES * SMALL_FILE_BYTES
    assert ds.num_bytes == cache_bytes
    starts = tmp_path / "starts"
    starts.mkdir()
    loader = make_loader(ds, 64, num_workers=2, multiprocessing_context="fork", persistent_workers=True,
                         worker_init_fn=functools.partial(_record_rollup, str(starts)), timeout=120)
    samples = [s for batch in loader for s in batch]  # one epoch; the workers stay alive (persistent)
    assert sorted((s.meta["path"], s.data, s.label) for s in samples) == \
        sorted((p, d, y) for p, (d, y) in expected.items())
    growth = {}
    for f in starts.iterdir():
        start, end = json.loads(f.read_text()), _rollup(int(f.stem))
        growth[int(f.stem)] = end["Private_Dirty"] - start["Private_Dirty"]
    assert len(growth) == 2
    # each worker read half the cache (16 MB); copied pages would show as that much private memory
    assert all(g < 0.25 * cache_bytes for g in growth.values()), {p: g / 1e6 for p, g in growth.items()}
    del loader


def _check_batches(batches, image_size):
    for x, y in batches:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, image_size, image_size)
        assert y.dtype == torch.int64 and x.shape[0] == y.shape[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", ["packed_wds", "packed_lmdb"])
def test_train_true_through_make_loader_with_workers(source, request, tiny_folder_expected):
    path = request.getfixturevalue(source)

    def epochs(**kw):
        loader = make_loader(path, 8, image_size=24, num_workers=2, seed=11, timeout=120, **kw)
        return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(2)]

    train = epochs(train=True)
    again = epochs(train=True)
    evaluation = epochs(train=False)
    expected_labels = sorted(y for _, y in tiny_folder_expected.values())
    for ep in train + evaluation:
        _check_batches(ep, 24)
        assert sorted(int(v) for _, y in ep for v in y) == expected_labels  # every sample once, its label
    # reproducible with the same seed, across worker processes
    for a, b in zip(train, again):
        assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))
    # the augmentation runs: other pixels than the evaluation transform (same sample order: the
    # shuffle does not depend on train), and other crops in the next epoch
    for t, e in zip(train, evaluation):
        assert all(torch.equal(yt, ye) for (_, yt), (_, ye) in zip(t, e))
        assert not all(torch.equal(xt, xe) for (xt, _), (xe, _) in zip(t, e))
    flat = [torch.cat([x for x, _ in ep]) for ep in train]
    assert not torch.equal(flat[0], flat[1])


_DEFAULTS_SCRIPT = r'''
import functools, json, os, sys

import torch

from shardfeed.readers import make_loader, open_dataset


def report(directory, worker_id):
    import cv2

    with open(os.path.join(directory, f"{worker_id}.json"), "w") as f:
        json.dump({"torch": torch.get_num_threads(), "cv2": cv2.getNumThreads()}, f)


def threads(src, out, ctx):
    d = os.path.join(out, ctx)
    os.makedirs(d)
    loader = make_loader(src, 8, num_workers=2, image_size=8, multiprocessing_context=ctx,
                         worker_init_fn=functools.partial(report, d), timeout=120)
    n = sum(len(y) for _, y in loader)
    return {"samples": n, "workers": [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))]}


if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    res = {"cpus": len(os.sched_getaffinity(0))}
    torch.set_num_threads(2)
    # forked workers (the parent holds cv2: shardfeed.readers.decode.transforms imports it)
    res["fork"] = threads(src, out, "fork")
    # spawned workers of a parent running 2 torch threads and a 4-thread OpenCV pool
    import cv2

    cv2.setNumThreads(4)
    res["spawn"] = threads(src, out, "spawn")
    ds = open_dataset(src, decode=False)
    res["default_workers"] = make_loader(ds, 4).num_workers
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    res["default_workers_on_one_cpu"] = make_loader(ds, 4).num_workers
    print(json.dumps(res))
'''


@pytest.fixture(scope="module")
def defaults_run(packed_wds, tmp_path_factory) -> dict:
    """What the script above saw (one run for the tests below)."""
    d = tmp_path_factory.mktemp("defaults")
    script = d / "defaults.py"
    script.write_text(_DEFAULTS_SCRIPT)
    r = subprocess.run([sys.executable, "-P", str(script), str(packed_wds), str(d / "out")],
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_loader_default_worker_count(defaults_run):
    res = defaults_run
    assert res["default_workers"] == min(4, res["cpus"]) == min(4, len(os.sched_getaffinity(0)))
    assert res["default_workers_on_one_cpu"] == 1


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_workers_run_one_torch_thread_and_spawned_ones_one_opencv_thread(defaults_run):
    for ctx in ("fork", "spawn"):
        assert defaults_run[ctx]["samples"] == 60
        assert [w["torch"] for w in defaults_run[ctx]["workers"]] == [1, 1], (ctx, defaults_run[ctx])
    assert [w["cv2"] for w in defaults_run["spawn"]["workers"]] == [1, 1], defaults_run["spawn"]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_forked_workers_run_one_opencv_thread(defaults_run):
    assert [w["cv2"] for w in defaults_run["fork"]["workers"]] == [1, 1], defaults_run["fork"]
