"""The documented recipes run as written: ``docs/recipes/ddp_train.py`` under ``torchrun`` with two
CPU processes (gloo) on a small packed folder, interrupted and resumed from its checkpoint.

Expectations come from the planted folder: every epoch, across both ranks and both runs, reads each
class as many times as it has images, and both ranks take the same number of steps.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DDP_SCRIPT = ROOT / "docs" / "recipes" / "ddp_train.py"
CLASS_SIZES = {"a": 20, "b": 12, "c": 8}  # 40 images: divides by world size 2 and batch size 4


def _torchrun(data: Path | list[str], ckpt: Path, *extra: str) -> list[dict]:
    sources = [str(data)] if isinstance(data, Path) else data
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(DDP_SCRIPT),
           *sources, "--epochs", "2", "--batch-size", "4", "--image-size", "16", "--num-workers", "1",
           "--backend", "gloo", "--checkpoint", str(ckpt), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ckpt.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _plant_folder(src: Path, class_sizes: dict[str, int], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for name, n in class_sizes.items():
        (src / name).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(src / name / f"{i}.jpg")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_recipe_on_cpu_gloo_resumes_mid_epoch(tmp_path):
    from shardfeed.convert import PackOptions, pack

    _plant_folder(tmp_path / "src", CLASS_SIZES)
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


MIX_SIZES = {"x": 10, "y": 6}  # the second dataset: 16 images, other classes


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    gets: Counter

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.gets[self.path] += 1
        super().do_GET()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_recipe_mixes_two_remote_datasets_through_a_shared_cache(tmp_path, start_http_server):
    from shardfeed.convert import PackOptions, pack

    _plant_folder(tmp_path / "src_a", CLASS_SIZES)
    _plant_folder(tmp_path / "src_b", MIX_SIZES, seed=1)
    pack(tmp_path / "src_a", tmp_path / "served" / "a", PackOptions(max_count=12, workers=1))
    pack(tmp_path / "src_b", tmp_path / "served" / "b", PackOptions(max_count=5, workers=1))
    gets: Counter = Counter()
    url = start_http_server(tmp_path / "served", type("Handler", (_CountingHandler,), {"gets": gets}))
    ckpt, cache = tmp_path / "ckpt.pt", tmp_path / "cache"
    # 48 samples per epoch, weights 3:1: 36 from a (40 images), 12 from b (16 images); 24 per rank
    mix = [f"{url}/a/", f"{url}/b/", "--weights", "3", "1", "--samples-per-epoch", "48", "--cache-dir", str(cache)]

    first = _torchrun(mix, ckpt, "--max-steps", "2")  # stops mid-epoch 0
    assert [r.get("stopped_after_steps") for r in first] == [2]
    second = _torchrun(mix, ckpt)
    assert second[0] == {"resumed": True, "epoch": 0}
    rest, epoch1 = second[1], second[2]
    sizes = [CLASS_SIZES[c] for c in sorted(CLASS_SIZES)] + [MIX_SIZES[c] for c in sorted(MIX_SIZES)]
    epoch0 = [a + b for a, b in zip(first[0]["label_counts"], rest["label_counts"])]
    for counts in (epoch0, epoch1["label_counts"]):
        assert sum(counts[:3]) == 36 and sum(counts[3:]) == 12  # per dataset: round(48 * w)
        assert all(c <= n for c, n in zip(counts, sizes))  # no image twice within an epoch
    # two epochs: 72 draws of a's 40 images, 24 of b's 16: every image once before any twice
    both = [a + b for a, b in zip(epoch0, epoch1["label_counts"])]
    assert all(n <= c <= 2 * n for c, n in zip(both, sizes))
    assert epoch1["samples_per_rank"] == [24, 24] and epoch1["batches_per_rank"] == [6, 6]
    # every shard downloaded once, by one process, for both runs and both ranks
    shard_gets = {path: n for path, n in gets.items() if path.endswith(".tar")}
    assert shard_gets and max(shard_gets.values()) == 1
    assert any(cache.iterdir())
