"""The documented recipes run as written: ``docs/recipes/ddp_train.py`` under ``torchrun`` with two
CPU processes (gloo) on a small packed folder, interrupted and resumed from its checkpoint.

Expectations come from the planted folder: every epoch, across both ranks and both runs, reads each
class as many times as it has images, and both ranks take the same number of steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DDP_SCRIPT = ROOT / "docs" / "recipes" / "ddp_train.py"
CLASS_SIZES = {"a": 20, "b": 12, "c": 8}  # 40 images: divides by world size 2 and batch size 4


def _torchrun(data: Path, ckpt: Path, *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(DDP_SCRIPT),
           str(data), "--epochs", "2", "--batch-size", "4", "--image-size", "16", "--num-workers", "1",
           "--backend", "gloo", "--checkpoint", str(ckpt), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=data.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_recipe_on_cpu_gloo_resumes_mid_epoch(tmp_path):
    from shardfeed.convert import PackOptions, pack

    rng = np.random.default_rng(0)
    for name, n in CLASS_SIZES.items():
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "src" / name / f"{i}.jpg")
    pack(tmp_path / "src", tmp_path / "out", PackOptions(max_count=12, workers=1))  # 4 shards for 2 ranks
    ckpt = tmp_path / "ckpt.pt"
    planted = [CLASS_SIZES[c] for c in sorted(CLASS_SIZES)]

    first = _torchrun(tmp_path / "out", ckpt, "--max-steps", "3")  # stops mid-epoch 0, as a crash would
    assert [r.get("stopped_after_steps") for r in first] == [3]
    assert first[0]["samples_per_rank"] == [12, 12]
    assert ckpt.exists()

    second = _torchrun(tmp_path / "out", ckpt)
    assert second[0] == {"resumed": True, "epoch": 0}
    rest, epoch1 = second[1], second[2]
    assert (rest["epoch"], epoch1["epoch"]) == (0, 1)
    # epoch 0 = the part before the interruption + the part after it: every image once
    assert [a + b for a, b in zip(first[0]["label_counts"], rest["label_counts"])] == planted
    assert rest["samples_per_rank"] == [8, 8] and rest["batches_per_rank"] == [2, 2]
    # epoch 1 in full: every image once, equal shares and steps on both ranks
    assert epoch1["label_counts"] == planted
    assert epoch1["samples_per_rank"] == [20, 20] and epoch1["batches_per_rank"] == [5, 5]
