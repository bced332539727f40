"""Resume mid-epoch from an object store (moto's S3 server on loopback), in a fresh process.

A loader state holds positions only: a state saved while reading ``s3://`` resumes reading
``s3://`` and, as well, the same dataset on a local disk (same manifest, same fingerprint).
Expectations come from the uninterrupted run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.network, pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]

HELPER = Path(__file__).parent.parent / "readers" / "resume_reader.py"
BATCH, NB = 7, 9  # 60 samples: 9 batches per epoch
KW = {"decode": False, "num_workers": 2, "seed": 11, "shuffle_buffer": 10}


def _run_job(job: dict) -> dict:
    spec = importlib.util.spec_from_file_location("resume_reader", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_job(job)


def test_resume_from_s3_in_a_fresh_process_and_across_storages(s3_packed, packed_wds, tmp_path):
    url, _ = s3_packed
    total = 2 * NB
    points = [1, NB - 1, NB + 2]
    remote = _run_job({"source": url, "batch_size": BATCH, "kw": KW, "num_batches": total, "save_after": points})
    local = _run_job({"source": str(packed_wds), "batch_size": BATCH, "kw": KW, "num_batches": total,
                      "save_after": points})
    assert remote["batches"] == local["batches"]  # one epoch split, whatever the storage
    assert remote["states"] == local["states"]  # the state names positions and the manifest, not the storage
    jobs = [{"name": f"s3-at{g}", "source": url, "batch_size": BATCH, "kw": KW, "state": remote["states"][str(g)],
             "num_batches": total - g} for g in points]
    jobs.append({"name": "local-from-s3-state", "source": str(packed_wds), "batch_size": BATCH, "kw": KW,
                 "state": remote["states"]["1"], "num_batches": total - 1})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    res = subprocess.run([sys.executable, "-P", str(HELPER), str(tmp_path / "jobs.json"), str(tmp_path)],
                         capture_output=True, text=True, timeout=240)  # inherits the S3 endpoint's environment
    assert res.returncode == 0, res.stderr[-3000:]
    out = {job["name"]: json.loads((tmp_path / f"{job['name']}.json").read_text()) for job in jobs}
    for g in points:
        assert out[f"s3-at{g}"]["batches"] == remote["batches"][g:], f"resumed after batch {g}"
    assert out["local-from-s3-state"]["batches"] == remote["batches"][1:]
