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

from shardfeed.convert.pack import PackOptions, pack

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
    # a second --resume on the finished dataset still says there is nothing to resume
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", fmt, "--resume"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "already holds a finished dataset" in r.stderr


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
    assert "notes.txt" in msg and "--overwrite would not delete" in msg and "use --overwrite" not in msg
    with pytest.raises(ValueError, match="refusing to delete them with --overwrite"):  # and indeed it refuses
        pack(src, foreign, PackOptions(workers=1, overwrite=True))
    with pytest.raises(ValueError, match="it holds files shardfeed did not write .notes.txt.: choose an empty"):
        pack(src, foreign, PackOptions(workers=1, resume=True))
    pack(src, ours, PackOptions(workers=1))
    with pytest.raises(ValueError, match=r"use --overwrite \(PackOptions\(overwrite=True\)\) to replace it"):
        pack(src, ours, PackOptions(workers=1))
    pack(src, ours, PackOptions(workers=1, overwrite=True))  # the advice works
    assert (foreign / "notes.txt").read_text() == "mine"
