"""Resume mid-epoch: ``loader.state_dict()`` / ``loader.load_state_dict(state)``.

Each test reads an uninterrupted run (real ``DataLoader`` workers, persistent), takes the loader's
state after chosen batches (what a checkpoint would save: after the first batch, in the middle,
before the last batch, at the epoch's end, and inside the next epoch), resumes from each state in a
*fresh process* (``resume_reader.py``) and compares:

* exact (same world size, workers, batch size, seed): the batches after the state equal the
  uninterrupted run's: epochs, sample keys and labels (raw mode), or labels and image tensors with
  random crops and flips (``train=True``);
* elastic (another worker count or world size): the samples not yet consumed in that epoch are
  read exactly once, and every rank yields the same number of batches.

The expected values come from the uninterrupted run and from the image folder, never from the
resume code.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]

HELPER = Path(__file__).with_name("resume_reader.py")
BATCH = 7
EPOCHS = 2
NB = -(-60 // BATCH)  # 9 batches per epoch, the last one of 4 samples
POINTS = [1, NB // 2, NB - 1, NB, NB + 2]  # first batch, middle, before the last, epoch end, next epoch
FEW_POINTS = [1, NB - 1, NB + 2]  # for the cases that repeat a path the others cover


def _helper():
    spec = importlib.util.spec_from_file_location("resume_reader", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fresh_process(jobs: list[dict], tmp_path: Path) -> dict[str, dict]:
    """Run ``jobs`` in a new Python process; returns ``{name: result}``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    res = subprocess.run([sys.executable, "-P", str(HELPER), str(spec), str(tmp_path)], capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    return {job["name"]: json.loads((tmp_path / f"{job['name']}.json").read_text()) for job in jobs}


@pytest.fixture(scope="module")
def resume_sources(packed_wds, packed_lmdb, tiny_image_folder, simple_http_server, nginx_server):
    return {"wds": str(packed_wds), "wds-http": f"{simple_http_server}/wds/",
            "wds-nginx": f"{nginx_server}/wds/", "lmdb": str(packed_lmdb), "folder": str(tiny_image_folder)}


RAW = {"decode": False, "num_workers": 2, "seed": 11}
TRAIN = {"image_size": 12, "train": True, "num_workers": 2, "seed": 11}


def _damaged_copy(packed_wds: Path, dst: Path) -> tuple[Path, str]:
    """A copy whose shard 1 holds a sample with an unreadable label member (same size)."""
    shutil.copytree(packed_wds, dst)
    shard = dst / "shard-000001.tar"
    with tarfile.open(shard) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith(".cls"))
    data = bytearray(shard.read_bytes())
    data[member.offset_data:member.offset_data + member.size] = b"x" * member.size
    shard.write_bytes(bytes(data))
    return dst, member.name.split(".")[0]


@pytest.fixture(scope="module")
def exact_runs(resume_sources, packed_wds, tmp_path_factory):
    """``{case: (uninterrupted, {point: resumed})}``: every case's uninterrupted run here, and all
    the resumed runs in one fresh process (starting Python and torch is the slow part)."""
    tmp = tmp_path_factory.mktemp("resume")
    damaged, bad_key = _damaged_copy(packed_wds, tmp / "damaged")
    cases = {  # case: (source, make_loader options, interruption points)
        "raw-wds": (resume_sources["wds"], dict(RAW, shuffle_buffer=10), POINTS),
        "raw-wds-http": (resume_sources["wds-http"], dict(RAW, shuffle_buffer=10), FEW_POINTS),
        "raw-lmdb": (resume_sources["lmdb"], RAW, FEW_POINTS),
        "raw-folder": (resume_sources["folder"], RAW, FEW_POINTS),
        "train-wds-nginx": (resume_sources["wds-nginx"], dict(TRAIN, shuffle_buffer=10), POINTS),
        "train-lmdb": (resume_sources["lmdb"], TRAIN, FEW_POINTS),
        "skip-wds": (str(damaged), dict(RAW, shuffle_buffer=10, on_error="skip"), FEW_POINTS),
    }
    run_job = _helper().run_job
    total = NB * EPOCHS
    full, jobs = {}, []
    for case, (source, kw, points) in cases.items():
        full[case] = run_job({"source": source, "batch_size": BATCH, "kw": kw, "num_batches": total,
                              "save_after": points})
        jobs += [{"name": f"{case}-at{g}", "source": source, "batch_size": BATCH, "kw": kw,
                  "state": full[case]["states"][str(g)], "num_batches": total - g} for g in points]
    resumed = _fresh_process(jobs, tmp / "out")
    return {case: (full[case], {g: resumed[f"{case}-at{g}"] for g in pts}) for case, (_, _, pts) in cases.items()
            }, bad_key


@pytest.mark.parametrize("case", ["raw-wds", "raw-wds-http", "raw-lmdb", "raw-folder", "train-wds-nginx",
                                  "train-lmdb"])
def test_exact_resume(exact_runs, tiny_folder_expected, case):
    """Keys and labels (raw), or labels and cropped/flipped image tensors (train), equal the
    uninterrupted run's after every interruption point."""
    full, resumed = exact_runs[0][case]
    assert full["len"] == NB
    assert [b[0] for b in full["batches"]] == [e for e in range(EPOCHS) for _ in range(NB)]
    if case.startswith("raw"):
        keys = [k for b in full["batches"][:NB] for k in b[1]]
        assert sorted(keys) == [f"{i:09d}" for i in range(60)]  # one epoch: every sample once
        labels = sorted(y for b in full["batches"][:NB] for y in b[2])
        assert labels == sorted(y for _, y in tiny_folder_expected.values())
    for g in resumed:
        state = full["states"][str(g)]
        assert (state["epoch"], state["samples_consumed"]) == (g // NB, min(g % NB * BATCH, 60)) or g == NB
        assert resumed[g]["batches"] == full["batches"][g:], f"resumed after batch {g}"


def test_exact_resume_with_skipped_samples(exact_runs):
    """on_error="skip": a damaged sample is left out of its batch and counts as consumed."""
    results, bad_key = exact_runs
    full, resumed = results["skip-wds"]
    keys = [k for b in full["batches"][:NB] for k in b[1]]
    assert bad_key not in keys and len(keys) == len(set(keys)) == 59
    assert len(full["batches"]) == NB * EPOCHS
    for g in resumed:
        assert resumed[g]["batches"] == full["batches"][g:], f"resumed after batch {g}"


ELASTIC = {"wds": dict(RAW, shuffle_buffer=10), "lmdb": dict(RAW),
           # a WebDataset without a buffer still reads a stream per worker: batch j of a rank comes
           # from worker j % 2, whose sub-range is contiguous, so the consumed samples are not the
           # start of the rank's range
           "wds-unbuffered": dict(RAW, shuffle_buffer=0), "wds-unshuffled": dict(RAW, shuffle=False)}


@pytest.mark.parametrize("name", list(ELASTIC))
def test_elastic_worker_count(resume_sources, tiny_folder_expected, name, tmp_path):
    """Saved with 2 workers, resumed with 0 and with 3: the rest of the epoch exactly once."""
    source = resume_sources[name.split("-")[0]]
    kw = ELASTIC[name]
    g = 4
    full = _helper().run_job({"source": source, "batch_size": BATCH, "kw": kw, "num_batches": NB, "save_after": [g]})
    consumed = [k for b in full["batches"][:g] for k in b[1]]
    every = {f"{i:09d}" for i in range(60)}
    assert sorted(k for b in full["batches"] for k in b[1]) == sorted(every)
    jobs = [{"name": f"w{nw}", "source": source, "batch_size": BATCH, "kw": dict(kw, num_workers=nw),
             "state": full["states"][str(g)], "num_batches": NB - g} for nw in (0, 3)]
    resumed = _fresh_process(jobs, tmp_path)
    label_of = {f"{i:09d}": None for i in range(60)}
    for b in full["batches"]:
        for k, y in zip(b[1], b[2]):
            label_of[k] = y
    for nw in (0, 3):
        out = resumed[f"w{nw}"]
        assert out["len"] == NB - g
        rest = [(k, y) for b in out["batches"] if b[0] == 0 for k, y in zip(b[1], b[2])]
        assert [b[0] for b in out["batches"]] == [0] * (NB - g)
        assert Counter(k for k, _ in rest) == Counter(every - set(consumed))  # each exactly once
        assert all(label_of[k] == y for k, y in rest)


def test_elastic_world_size(packed_wds, packed_lmdb, tmp_path):
    """Saved by rank 0 of 2 after 3 batches, resumed by 3 ranks (explicit rank/world_size, each in a
    fresh process run): the rest of the epoch exactly once, the same number of batches per rank."""
    run_job = _helper().run_job
    batch, g = 4, 3
    for name, src, kw in (("wds", packed_wds, dict(RAW, shuffle_buffer=8)), ("lmdb", packed_lmdb, dict(RAW)),
                          ("wds-unbuffered", packed_wds, dict(RAW, shuffle_buffer=0))):
        before = [run_job({"source": str(src), "batch_size": batch, "kw": dict(kw, rank=r, world_size=2),
                           "num_batches": 8, "save_after": [g]}) for r in range(2)]
        assert before[0]["states"][str(g)] == before[1]["states"][str(g)]  # every rank's state is the same
        consumed = [k for r in before for b in r["batches"][:g] for k in b[1]]
        assert len(consumed) == len(set(consumed)) == 2 * g * batch
        jobs = [{"name": f"{name}-r{r}", "source": str(src), "batch_size": batch,
                 "kw": dict(kw, rank=r, world_size=3), "state": before[0]["states"][str(g)], "num_batches": 3}
                for r in range(3)]
        after = _fresh_process(jobs, tmp_path / name)
        rest = []
        for r in range(3):
            out = after[f"{name}-r{r}"]
            assert out["len"] == 3  # (60 - 24) / 3 = 12 samples = 3 batches of 4 on every rank
            assert [b[0] for b in out["batches"]] == [0, 0, 0]
            rest += [k for b in out["batches"] for k in b[1]]
        assert Counter(consumed + rest) == Counter(f"{i:09d}" for i in range(60)), name


def test_changed_dataset_and_other_rules_are_refused(packed_wds, packed_lmdb, tmp_path):
    from shardfeed.readers import make_loader
    from shardfeed.readers.errors import ResumeStateError

    loader = make_loader(packed_wds, BATCH, num_workers=0, decode=False, seed=11)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["samples_consumed"] == BATCH and state["epoch"] == 0
    assert state["version"] == 2 and state["epoch_order"] == 4
    assert {"fingerprint", "seed", "world_size", "batch_size", "num_workers"} <= set(state)
    with pytest.raises(ResumeStateError, match="another dataset"):
        make_loader(packed_lmdb, BATCH, num_workers=0, decode=False, seed=11).load_state_dict(state)
    changed = tmp_path / "changed"
    shutil.copytree(packed_wds, changed)
    manifest = json.loads((changed / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = "0" * 64  # a repacked shard
    (changed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResumeStateError, match="changed since"):
        make_loader(changed, BATCH, num_workers=0, decode=False, seed=11).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="seed"):
        make_loader(packed_wds, BATCH, num_workers=0, decode=False, seed=12).load_state_dict(state)
    with pytest.raises(ResumeStateError, match="version"):
        make_loader(packed_wds, BATCH, num_workers=0, decode=False, seed=11).load_state_dict(dict(state, version=99))


def test_a_stream_state_and_a_random_access_state_do_not_resume_each_other(packed_wds, tiny_folder_expected):
    """A WebDataset read by worker streams and the same dataset read through ``cache="memory"``
    deliver an epoch's positions in other orders: a mid-epoch state of one is refused by the other."""
    from shardfeed.readers import make_loader
    from shardfeed.readers.errors import ResumeStateError

    def saved(loader):
        it = iter(loader)
        next(it)
        return json.loads(json.dumps(loader.state_dict()))

    def stream():
        return make_loader(packed_wds, BATCH, num_workers=0, decode=False, seed=11)

    def memory():
        return make_loader(packed_wds, BATCH, num_workers=0, decode=False, seed=11, cache="memory")

    from_stream, from_memory = saved(stream()), saved(memory())
    assert (from_stream["access"], from_memory["access"]) == ("stream", "random")
    with pytest.raises(ResumeStateError, match=r"stream per worker.*cache=.*set_epoch\(0\)"):
        memory().load_state_dict(from_stream)
    with pytest.raises(ResumeStateError, match="indices from the sampler"):
        stream().load_state_dict(from_memory)
    older = {k: v for k, v in from_stream.items() if k != "access"}  # saved before states named it
    with pytest.raises(ResumeStateError, match="stream per worker"):
        memory().load_state_dict(older)
    with pytest.raises(ResumeStateError, match="access"):
        stream().load_state_dict(dict(from_stream, access="sideways"))
    for state, loader in ((from_stream, stream()), (from_memory, memory())):  # its own kind resumes
        loader.load_state_dict(state)
        assert len(list(loader)) == len(loader) > 0
    start = memory()  # at an epoch's start the positions name nothing yet
    start.load_state_dict(dict(from_stream, samples_consumed=0, batches_consumed=0))
    assert sum(len(b) for b in start) == len(tiny_folder_expected)  # the whole epoch, every planted image
