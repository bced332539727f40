"""`--resume` on a first run and SIGTERM during a parallel pack.

Expectations come from a plain pack of the same folder (byte-identical shards) and the files
written here."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, size=(40, 40, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stop") / "src"
    for i in range(40):
        p = root / f"c{i % 4}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_jpeg(i))
    return root


@pytest.fixture(scope="module")
def ref(src, tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Every file of a plain pack, per format."""
    out = {}
    for fmt in ("wds", "lmdb"):
        d = tmp_path_factory.mktemp("ref") / fmt
        pack(src, d, PackOptions(format=fmt, workers=1, **({"max_count": 4} if fmt == "wds" else {})))
        out[fmt] = _files(d)
    return out


def _files(d: Path) -> dict[str, bytes]:
    """Every file's bytes; for LMDB, every record of data.mdb instead of its pages (their layout
    depends on the order of the transactions)."""
    files = {p.name: p.read_bytes() for p in d.iterdir() if p.name not in ("data.mdb", "lock.mdb")}
    if (d / "data.mdb").exists():
        import lmdb

        env = lmdb.open(str(d), subdir=True, readonly=True, lock=False)
        with env.begin() as txn:  # the records; the manifest copy names the file's size, which layout decides
            files.update({"data.mdb:" + bytes(k).decode(): bytes(v) for k, v in txn.cursor()
                          if not bytes(k).startswith(b"__shardfeed_manifest")})
        env.close()
        m = json.loads(files.pop("manifest.json"))
        for s in m["shards"]:
            s.pop("num_bytes")
        files["manifest.json"] = m
    return files


def _count(fmt: str) -> list[str]:
    return ["--max-count", "4"] if fmt == "wds" else []


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
@pytest.mark.parametrize("state", ["missing", "empty"])
def test_resume_on_a_first_run_starts_the_pack(fmt, state, src, ref, tmp_path):
    out = tmp_path / "out"
    if state == "empty":
        out.mkdir()
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", fmt, *_count(fmt), "-j", "1",
                        "--resume"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _files(out) == ref[fmt]
    # the same command again (scripts may always pass --resume): exit 0, it is complete, nothing rewritten
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", fmt, *_count(fmt), "-j", "1",
                        "--resume"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "already holds this finished dataset" in r.stdout and "nothing to resume" in r.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    assert _files(out) == ref[fmt]
    # another command (other options) on the finished dataset: nothing to resume, rebuild it with --overwrite
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", fmt, "--seed", "7", "--resume"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "packed with other options" in r.stderr and "seed" in r.stderr
    assert "--overwrite" in r.stderr and "PackOptions" not in r.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
@pytest.mark.parametrize("target", ["main-process", "process-group"])
def test_sigterm_during_a_parallel_pack_prints_one_line_and_resumes(fmt, target, src, ref, tmp_path, hooked_cli):
    """``kill PID`` (the main process only) and ``kill -- -PGID`` (as ``timeout`` or a container
    stop may do): one line on stderr, exit 143, no worker traceback; --resume then finishes it."""
    out = tmp_path / "o"
    hooks = {"sample_delay_s": 0.08} if fmt == "wds" else {"lmdb_commit_count": 4, "lmdb_commit_delay_s": 0.15}
    proc = subprocess.Popen([*hooked_cli(hooks), "-q", "pack", str(src), str(out), "--format", fmt,
                             *_count(fmt), "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    started = (lambda: len(list(out.glob("*.tar"))) >= 2) if fmt == "wds" else (lambda: (out / "data.mdb").exists())
    while time.monotonic() < deadline and not started():
        time.sleep(0.02)
    time.sleep(0.3 if fmt == "lmdb" else 0)
    assert proc.poll() is None, "the pack finished before SIGTERM"
    t0 = time.monotonic()
    if target == "main-process":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10, "SIGTERM must stop the pack promptly"
    time.sleep(0.5)  # orphaned workers (the bug) would print their tracebacks after the main process exits
    assert proc.returncode == 143, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardfeed: terminated") and "--resume" in lines[0], err
    if fmt == "wds":  # the line counts the shards really kept: those with a completion record
        records = [json.loads(p.read_text()) for p in (out / ".shardfeed-pack").glob("[0-9]*.json")]
        shards, samples = len(records), sum(r["entry"]["num_samples"] for r in records)
        if shards:
            kept = f"{shards} complete shard{'s' if shards != 1 else ''} ({samples} samples) in {out} are kept"
            assert kept in err, err
        else:  # stopped before any shard's completion record (a slow machine)
            assert f"no shard of {out} was complete yet" in err, err
    assert not (out / "manifest.json").exists() and not list(out.glob(".*.tmp"))
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", fmt, *_count(fmt),
                        "--resume"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _files(out) == ref[fmt]


def test_resume_refused_names_the_changed_options_and_files(tmp_path):
    """A pack stopped by a bad file; then the file is removed, another one rewritten and an
    option changed: --resume names each."""
    src, out = tmp_path / "src", tmp_path / "out"
    for i in range(8):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i}.jpg").write_bytes(_jpeg(i))
    (src / "c0" / "zz_empty.jpg").write_bytes(b"")  # an empty image stops the pack
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--max-count", "2", "-j", "1", "--no-shuffle"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "zz_empty.jpg" in r.stderr
    (src / "c0" / "zz_empty.jpg").unlink()
    (src / "c1" / "1.jpg").write_bytes(_jpeg(100))  # another size
    (src / "c1" / "new.jpg").write_bytes(_jpeg(101))
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--max-count", "3", "-j", "1", "--no-shuffle",
                        "--resume"], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    err = " ".join(r.stderr.split())
    assert "options changed: --max-count 2 then, 3 now" in err, err
    assert "1 file(s) added: c1/new.jpg" in err and "1 file(s) removed: c0/zz_empty.jpg" in err
    assert "1 file(s) changed (size or modification time): c1/1.jpg" in err


def test_overwrite_is_advised_only_where_it_works(src, tmp_path):
    foreign, ours = tmp_path / "foreign", tmp_path / "ours"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError) as err:
        pack(src, foreign, PackOptions(workers=1))
    msg = str(err.value)
    assert "notes.txt" in msg and "PackOptions(overwrite=True) would not delete" in msg and "use " not in msg
    with pytest.raises(ValueError, match=r"refusing to delete them with PackOptions\(overwrite=True\)"):
        pack(src, foreign, PackOptions(workers=1, overwrite=True))  # and indeed it refuses
    with pytest.raises(ValueError, match="not an interrupted shardfeed pack .* shardfeed did not write .notes.txt."):
        pack(src, foreign, PackOptions(workers=1, resume=True))
    pack(src, ours, PackOptions(workers=1))
    with pytest.raises(ValueError, match=r"use PackOptions\(overwrite=True\) to replace it") as err:
        pack(src, ours, PackOptions(workers=1))
    assert "--overwrite" not in str(err.value)  # the API caller reads the field, not the flag
    pack(src, ours, PackOptions(workers=1, overwrite=True))  # the advice works
    assert (foreign / "notes.txt").read_text() == "mine"


def test_the_cli_names_the_flag_the_api_the_field(src, tmp_path):
    out = tmp_path / "out"
    pack(src, out, PackOptions(workers=1))
    r = subprocess.run([*SHARDFEED, "pack", str(src), str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "use --overwrite to replace it" in r.stderr and "PackOptions" not in r.stderr
    (out / "notes.txt").write_text("mine")
    r = subprocess.run([*SHARDFEED, "pack", str(src), str(out), "--overwrite"], capture_output=True, text=True)
    assert r.returncode == 1 and "refusing to delete them with --overwrite" in r.stderr and "notes.txt" in r.stderr
    assert "PackOptions" not in r.stderr and (out / "notes.txt").read_text() == "mine"


def _noise_jpeg(seed: int, side: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, size=(side, side, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def pool_src(tmp_path_factory) -> Path:
    """160 JPEGs of ~37 KB (6 MB): LMDB cuts them into 3 chunks of 2 MB, so `-j 2` runs a real
    process pool (a folder of one chunk is packed inline), and WebDataset into 20 shards of 8."""
    root = tmp_path_factory.mktemp("pool") / "src"
    for i in range(160):
        p = root / f"c{i % 4}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_noise_jpeg(i, 200))
    return root


def _pool_count(fmt: str) -> list[str]:
    return ["--max-count", "8"] if fmt == "wds" else []


def _group_gone(pgid: int, timeout_s: float = 3.0) -> bool:
    """True once no process of the process group ``pgid`` is left (no orphaned worker)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("fmt,runs", [("lmdb", 12), ("wds", 8)])
def test_sigterm_at_random_moments_of_a_parallel_pack_ends_it_promptly_and_resumably(fmt, runs, pool_src,
                                                                                     tmp_path, hooked_cli):
    """SIGTERM at a random moment (0-1.5 s: interpreter start, option parsing, scan, pool start,
    packing, pool shutdown, or after the end), to the main process or to its whole process group
    (``timeout``, a container stop: the workers get it too, and one may die holding a lock the
    pool's ``terminate()`` waits on): every run ends within 10 s leaving no process behind, exits
    143 with one line (0 if it had finished; -15 if the signal came before the CLI installed its
    handler), and ``--resume`` gives the uninterrupted pack's records, byte for byte."""
    import random

    ref_dir = tmp_path / "ref"
    pack(pool_src, ref_dir, PackOptions(format=fmt, workers=1, **({"max_count": 8} if fmt == "wds" else {})))
    expected = _files(ref_dir)
    hooks = {"sample_delay_s": 0.008}
    if fmt == "lmdb":
        hooks.update(lmdb_commit_count=16, lmdb_commit_delay_s=0.02)
    rng = random.Random(f"sigterm-{fmt}")
    outcomes = []
    for run in range(runs):
        out = tmp_path / f"o{run}"
        delay, group = rng.uniform(0.0, 1.5), run % 2 == 1
        proc = subprocess.Popen([*hooked_cli(hooks), "-q", "pack", str(pool_src), str(out), "--format", fmt,
                                 *_pool_count(fmt), "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        time.sleep(delay)
        t0 = time.monotonic()
        try:
            os.killpg(proc.pid, signal.SIGTERM) if group else proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            _, err = proc.communicate(timeout=10)  # EOF on its pipes: no worker outlived it holding them
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"run {run}: SIGTERM after {delay:.2f} s to the {'group' if group else 'main process'}: "
                        "the pack did not end within 10 s")
        took = time.monotonic() - t0
        assert took < 10
        assert _group_gone(proc.pid), f"run {run}: processes of the pack outlived it"
        outcomes.append(proc.returncode)
        assert proc.returncode in (143, 0, -signal.SIGTERM), (run, delay, proc.returncode, err)
        if proc.returncode == 143:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("shardfeed: terminated"), (run, delay, err)
        if proc.returncode != 0 and not (out / "manifest.json").exists():  # (it may have finished as it stopped)
            r = subprocess.run([*SHARDFEED, "-q", "pack", str(pool_src), str(out), "--format", fmt,
                                *_pool_count(fmt), "-j", "2", "--resume"], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (run, delay, r.stderr)
        assert _files(out) == expected, f"run {run} (SIGTERM after {delay:.2f} s)"
    assert outcomes.count(143) >= 2, outcomes  # signals came while the pack ran (not all before or after it)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_resume_after_a_stop_before_the_plan_was_recorded_starts_the_pack(fmt, src, ref, tmp_path):
    """A pack killed between creating its state folder and recording its plan left no work:
    ``--resume`` starts it (it said the plan was missing and advised --overwrite)."""
    out = tmp_path / "out"
    (out / ".shardfeed-pack").mkdir(parents=True)
    (out / ".shardfeed-pack" / "files.jsonl.z").write_bytes(b"x")  # written before plan.json
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", fmt, *_count(fmt), "-j", "1",
                        "--resume"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _files(out) == ref[fmt]


def _sample_records(out: Path) -> dict[str, dict]:
    """``{key: decoded record}`` of the sample records committed to ``out/data.mdb`` so far
    (read-only, safe while a pack writes; reserved keys left out)."""
    import lmdb

    from shardfeed.readers.format.lmdb_record import decode_record

    if not (out / "data.mdb").exists():
        return {}
    env = lmdb.open(str(out), subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(k).decode(): decode_record(bytes(v)) for k, v in txn.cursor() if bytes(k)[:1].isdigit()}
    finally:
        env.close()


@pytest.mark.slow
def test_ctrl_c_during_a_reencoding_lmdb_pack_keeps_the_committed_chunks(pool_src, tmp_path, hooked_cli):
    """A real SIGINT to a re-encoding LMDB pack: the line names the samples really committed, and
    ``--resume`` keeps them (reports them resumed, re-does only the rest); the result is the
    uninterrupted pack's records, every planted file exactly once with its class's label."""
    import re

    ref_dir, out, report_path = tmp_path / "ref", tmp_path / "out", tmp_path / "report.json"
    pack(pool_src, ref_dir, PackOptions(format="lmdb", workers=1, reencode={"resize": 48}))
    args = [str(pool_src), str(out), "--format", "lmdb", "--resize", "48", "-j", "1"]
    proc = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.01}), "-q", "pack", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _sample_records(out) and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the pack finished before Ctrl-C"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    kept = _sample_records(out)
    assert 0 < len(kept) < 160
    assert err.strip() == (f"shardfeed: interrupted; {len(kept)} samples committed to {out / 'data.mdb'} are kept: "
                           "the same command plus --resume continues after them"), err
    r = subprocess.run([*SHARDFEED, "-q", "pack", *args, "--resume", "--json", str(report_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(report_path.read_text())
    assert report["extra"]["lmdb_records_resumed"] == len(kept)  # kept, not redone
    assert report["num_samples"] == 160 and report["files"]["found"] == 160
    assert _files(out) == _files(ref_dir)  # the records of an uninterrupted pack, byte for byte
    records = _sample_records(out)
    classes = sorted(p.name for p in pool_src.iterdir())
    planted = {f"{p.parent.name}/{p.name}": classes.index(p.parent.name) for p in pool_src.rglob("*.jpg")}
    assert sorted(r["meta"]["path"] for r in records.values()) == sorted(planted)  # each file exactly once
    assert all(r["label"] == planted[r["meta"]["path"]] for r in records.values())
    assert all(records[k] == kept[k] for k in kept)  # the kept records were not rewritten differently
    assert not re.search(r"Traceback", err + r.stderr)


def test_signals_held_acts_on_a_ctrl_c_at_the_end_of_the_block():
    """What starting and stopping a pool runs under: the block is not cut, the signal is not lost."""
    from shardfeed.convert.write.executors import signals_held

    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is before and signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()


_TAMPERED_RECORDS = {
    "not an object": lambda rec: [1],
    "entry a list": lambda rec: {**rec, "entry": [1]},
    "entry without a name": lambda rec: {**rec, "entry": {}},
    "count a string": lambda rec: {**rec, "entry": {**rec["entry"], "num_samples": "4"}},
    "name out of OUT": lambda rec: {**rec, "entry": {**rec["entry"], "name": "../victim-000000.tar"}},
    "another shard's name": lambda rec: {**rec, "entry": {**rec["entry"], "name": "shard-000001.tar",
                                                          "index": "shard-000001.sfidx"}},
    "digest not hex": lambda rec: {**rec, "entry": {**rec["entry"], "sha256": "z" * 64}},
    "skipped a string": lambda rec: {**rec, "skipped": "abc"},
}


@pytest.mark.slow
def test_a_tampered_shard_record_is_packed_again_on_resume(src, ref, tmp_path, hooked_cli):
    """A shard's completion record in OUT is untrusted: one that is not what a pack writes for that
    shard makes --resume pack the shard again (the uninterrupted pack's files, no traceback), and
    nothing outside OUT is touched."""
    import shutil

    stopped = tmp_path / "stopped"
    proc = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.05}), "-q", "pack", str(src), str(stopped),
                             "--max-count", "4", "-j", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    records = stopped / ".shardfeed-pack"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(records.glob("[0-9]*.json"))) < 3:
        time.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=20)
    assert (records / "000000.json").exists() and not (stopped / "manifest.json").exists()
    record = json.loads((records / "000000.json").read_text())
    victim = tmp_path / "victim-000000.tar"
    victim.write_bytes(b"v" * record["entry"]["num_bytes"])  # the size the record names
    shards_before = {p.name: p.read_bytes() for p in stopped.glob("*.tar")}
    for case, tamper in [*_TAMPERED_RECORDS.items(), ("nested too deep", None)]:
        out = tmp_path / case.replace(" ", "-").replace("'", "")
        shutil.copytree(stopped, out, symlinks=True)
        text = "[" * 100_000 + "]" * 100_000 if tamper is None else json.dumps(tamper(record))
        (out / ".shardfeed-pack" / "000000.json").write_text(text)
        r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--max-count", "4", "-j", "1", "--resume"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (case, r.stderr)
        assert _files(out) == ref["wds"], case
    assert victim.read_bytes() == b"v" * record["entry"]["num_bytes"]
    assert {p.name: p.read_bytes() for p in stopped.glob("*.tar")} == shards_before
    plan = json.loads((records / "plan.json").read_text())
    for case, text in {"plan a list": "[1, 2]", "plan options a list": json.dumps({**plan, "options": [1],
                                                                                   "fingerprint": "x"}),
                       "plan nested too deep": "[" * 100_000 + "]" * 100_000}.items():
        out = tmp_path / case.replace(" ", "-")
        shutil.copytree(stopped, out, symlinks=True)
        (out / ".shardfeed-pack" / "plan.json").write_text(text)
        r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--max-count", "4", "-j", "1", "--resume"],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (case, r.stderr)
        assert r.stderr.startswith(f"shardfeed: error: {out}") and len(r.stderr.splitlines()) == 1, (case, r.stderr)
