"""torchrun --nproc_per_node=2 (gloo, CPU): ranks read disjoint samples, union = all but the
documented remainder, equal batch counts (docs/format.md "Splitting an epoch")."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("torchrun_reader.py")


def _folder(root: Path, n: int) -> Path:
    from PIL import Image

    rng = np.random.default_rng(n)
    for i in range(n):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(d / f"{i:04d}.png")
    return root


@pytest.fixture(scope="module")
def dist_datasets(tmp_path_factory):
    from shardfeed.convert.write.pack import PackOptions, pack

    base = tmp_path_factory.mktemp("dist")
    three = base / "three"
    pack(_folder(base / "f250", 250), three, PackOptions(format="wds", max_count=100, workers=1))
    one = base / "one"
    pack(_folder(base / "f101", 101), one, PackOptions(format="wds", max_count=1000, workers=1))
    counts3 = [s["num_samples"] for s in json.loads((three / "manifest.json").read_text())["shards"]]
    counts1 = [s["num_samples"] for s in json.loads((one / "manifest.json").read_text())["shards"]]
    assert counts3 == [100, 100, 50] and counts1 == [101]
    return {"three": three, "one": one}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def torchrun_reports(dist_datasets, tmp_path_factory) -> dict[str, list[dict]]:
    """One torchrun --nproc_per_node=2 run reading both datasets (starting torch is the slow part)."""
    out = tmp_path_factory.mktemp("torchrun")
    specs = {"three": (dist_datasets["three"], 7, 0, 1), "one": (dist_datasets["one"], 7, 2, 2)}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(SCRIPT), str(out)]
    cmd += [f"{name}={src},{b},{w},{e}" for name, (src, b, w, e) in specs.items()]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    return {name: [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(2)] for name in specs}


def _all_keys(root: Path) -> set[str]:
    from shardfeed.readers import open_dataset

    return {s.key for s in open_dataset(root, decode=False, shuffle=False)}


def _check(reports, all_keys, per_rank, batch):
    assert [r["world_size"] for r in reports] == [2, 2]
    expected_batches = -(-per_rank // batch)
    for e in range(len(reports[0]["epochs"])):
        seen = []
        for r in reports:
            batches = r["epochs"][e]
            assert r["len"] == len(batches) == expected_batches
            keys = [k for b in batches for k in b]
            assert len(keys) == per_rank
            seen.append(set(keys))
        assert not seen[0] & seen[1]
        union = seen[0] | seen[1]
        assert union <= all_keys and len(all_keys - union) == len(all_keys) % 2


def test_three_shards_batch_7(dist_datasets, torchrun_reports):
    reports = torchrun_reports["three"]
    _check(reports, _all_keys(dist_datasets["three"]), per_rank=125, batch=7)


def test_single_shard_two_workers_per_rank(dist_datasets, torchrun_reports):
    reports = torchrun_reports["one"]
    _check(reports, _all_keys(dist_datasets["one"]), per_rank=50, batch=7)
    # the second epoch (persistent workers) is shuffled differently
    assert reports[0]["epochs"][0] != reports[0]["epochs"][1]
