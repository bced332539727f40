"""``scripts/gpu_check.py`` (``make gpu-check``) on a machine without a GPU.

The CUDA path itself needs a GPU; here: the one-line exit 2 without CUDA, and every other step
(generation, packing, pytest -m gpu, verify in a subprocess, report and table) with
``--device cpu`` on a tiny folder. Expectations come from the files on disk and the options
given, not from the script's own summaries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_available(), reason="a CUDA GPU is present: the script would run the whole check")
def test_gpu_check_without_cuda_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: ") and "nothing checked" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing generated, nothing measured


@pytest.mark.slow
@pytest.mark.multiprocess
def test_gpu_check_steps_on_cpu(tmp_path):
    out = tmp_path / "gc"
    images, classes, repeats = 48, 3, 1
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), "--images", str(images),
                        "--classes", str(classes), "--min-size", "40", "--max-size", "56", "--image-size", "32",
                        "--batch-size", "8", "--batches", "2", "--warmup", "1", "--repeats", str(repeats),
                        "--model", "tiny", "--num-workers", "1", "--shard-count", "16",
                        "--tests", "tests/readers/test_measure.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    jpgs = sorted((out / "data" / "folder").rglob("*.jpg"))
    assert len(jpgs) == images
    assert sorted(p.name for p in (out / "data" / "folder").iterdir()) == [f"class_{i:02d}" for i in range(classes)]
    assert len(list((out / "data" / "wds").glob("*.tar"))) == images // 16
    assert (out / "data" / "lmdb" / "data.mdb").is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["device"] == "cpu" and "not a GPU check" in report["machine"]["note"]
    assert report["data"]["bytes"] == sum(p.stat().st_size for p in jpgs)
    assert report["gpu_tests"]["returncode"] == 0  # the gpu-marked tests collected here are skipped without CUDA
    pairs = [(c["cache"], c["after_format"]) for c in report["comparisons"]]
    assert pairs == [("warm", "webdataset"), ("warm", "lmdb"), ("cold", "webdataset"), ("cold", "lmdb")]
    for c in report["comparisons"]:
        assert c["ok"], c
        raw = json.loads(Path(c["json"]).read_text())
        assert len(raw["runs"]) == 2 * repeats
        s = c["summary"]
        assert s["before"]["format"] == "folder" and s["after"]["format"] == c["after_format"]
        for side in ("before", "after"):
            rounds = [x["images_per_s"] for x in raw["runs"] if x["label"] == side]
            assert sorted(s[side]["images_per_s_rounds"]) == sorted(rounds)
            assert s[side]["images_per_s_median"] in rounds
            assert s[side]["device"] == "cpu" and s[side]["gpu_util_median_run"] is None
        assert raw["cold"] is (c["cache"] == "cold")
    table = r.stdout.splitlines()
    assert table[0].split()[:3] == ["cache", "dataset", "images/s"] and "GPU util" in table[0]
    assert sum(1 for line in table if line.startswith(("warm", "cold"))) == 8
    assert f"wrote {out / 'report.json'}" in r.stdout


@pytest.mark.parametrize("args,option", [
    (["--images", "-5"], "--images"),
    (["--images", "2", "--classes", "3"], "--images"),
    (["--classes", "0"], "--classes"),
    (["--min-size", "0"], "--min-size"),
    (["--min-size", "60", "--max-size", "50"], "--max-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--batches", "0"], "--batches"),
    (["--repeats", "0"], "--repeats"),
    (["--shard-count", "0"], "--shard-count"),
    (["--budget-s", "nan"], "--budget-s"),
    (["--num-workers", "-1"], "--num-workers"),
])
def test_gpu_check_refuses_bad_numbers_before_any_work(tmp_path, args, option):
    """``--device cpu --images -5`` printed "generating -5 images" and went on to run verify."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path / "out"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and option in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
