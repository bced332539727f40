"""Resume under real torchrun ranks (gloo, CPU): rank 0's state restores every rank.

The state is taken here from rank 0's loader (explicit ``rank=0, world_size=2``) after 3 batches of
an uninterrupted epoch; then

* ``torchrun --nproc_per_node=2`` reads the uninterrupted run on both ranks (and checks that its
  rank 0 saved the very same state) and, in the same processes, resumes from the state: every
  rank's batches after the state equal its uninterrupted ones (exact);
* ``torchrun --nproc_per_node=3`` resumes from the same state (elastic): the samples the two
  ranks had not consumed are read exactly once across the three, each rank the same number of
  batches.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]

HELPER = Path(__file__).with_name("resume_reader.py")
BATCH, SAVED_AFTER = 4, 3
KW = {"decode": False, "num_workers": 2, "seed": 5, "shuffle_buffer": 8}
PER_RANK_BATCHES = -(-30 // BATCH)  # 60 samples, 2 ranks: 30 each, 8 batches


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, jobs: list[dict], out: Path) -> dict[str, list[dict]]:
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(HELPER), str(spec), str(out)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    return {job["name"]: [json.loads((out / f"{job['name']}-rank{r}.json").read_text()) for r in range(nproc)]
            for job in jobs}


@pytest.fixture(scope="module")
def rank0_state(packed_wds) -> dict:
    spec = importlib.util.spec_from_file_location("resume_reader", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run = mod.run_job({"source": str(packed_wds), "batch_size": BATCH, "kw": dict(KW, rank=0, world_size=2),
                       "num_batches": SAVED_AFTER, "save_after": [SAVED_AFTER]})
    return run["states"][str(SAVED_AFTER)]


def test_torchrun_exact_and_elastic_resume(packed_wds, rank0_state, tmp_path):
    src = str(packed_wds)
    total = PER_RANK_BATCHES + 2  # into the next epoch
    two = _torchrun(2, [
        {"name": "full", "source": src, "batch_size": BATCH, "kw": KW, "num_batches": total,
         "save_after": [SAVED_AFTER]},
        {"name": "exact", "source": src, "batch_size": BATCH, "kw": KW, "state": rank0_state,
         "num_batches": total - SAVED_AFTER},
    ], tmp_path / "two")
    consumed = []
    for r in range(2):
        full, exact = two["full"][r], two["exact"][r]
        assert full["len"] == PER_RANK_BATCHES
        assert full["states"][str(SAVED_AFTER)] == rank0_state  # every rank's state equals rank 0's
        assert exact["batches"] == full["batches"][SAVED_AFTER:], f"rank {r}"
        consumed += [k for b in full["batches"][:SAVED_AFTER] for k in b[1]]
    epoch0 = [k for r in range(2) for b in two["full"][r]["batches"] if b[0] == 0 for k in b[1]]
    assert sorted(epoch0) == [f"{i:09d}" for i in range(60)]

    three = _torchrun(3, [
        {"name": "elastic", "source": src, "batch_size": BATCH, "kw": KW, "state": rank0_state,
         "num_batches": 3},
    ], tmp_path / "three")
    rest = []
    for r in range(3):
        out = three["elastic"][r]
        assert out["len"] == 3  # (60 - 2 * 12) / 3 = 12 samples: 3 batches of 4 on every rank
        assert [b[0] for b in out["batches"]] == [0, 0, 0]
        rest += [k for b in out["batches"] for k in b[1]]
    assert Counter(consumed + rest) == Counter(f"{i:09d}" for i in range(60))
