"""Bad input and faults while packing LMDB.

Ctrl-C in the middle of ``shardfeed pack --format lmdb`` and the output disk filling up
(``RLIMIT_FSIZE``): a prompt, clean exit, nothing that looks complete (no ``manifest.json``, no
manifest record, refused by ``open_dataset``), and ``--resume`` gives exactly the records of an
uninterrupted pack. Records are compared with ``lmdb`` alone; expectations come from the source
files. (``kill -9`` + resume is in ``test_lmdb.py``; the WebDataset cases in
``test_bad_input_pack.py``.)
"""

from __future__ import annotations

import io
import json
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

from shardfeed.readers.errors import IncompleteDatasetError

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]
MANIFEST_KEY = b"__shardfeed_manifest__"


def _records(out: Path) -> dict[bytes, bytes]:
    """Every key/value of ``out/data.mdb`` (lmdb module only, read-only, no lock)."""
    env = lmdb.open(str(out), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def _same_as_reference(out: Path, ref: Path) -> None:
    got, want = _records(out), _records(ref)
    assert {k: v for k, v in got.items() if k != MANIFEST_KEY} == {k: v for k, v in want.items() if k != MANIFEST_KEY}
    m_got, m_want = json.loads(got[MANIFEST_KEY]), json.loads(want[MANIFEST_KEY])
    for m in (m_got, m_want):
        m["shards"][0].pop("num_bytes")  # page layout differs after a resume; records do not
    assert m_got == m_want
    assert got[MANIFEST_KEY] == (out / "manifest.json").read_bytes()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """60 noise JPEGs (~6 KB each) in 3 classes."""
    root = tmp_path_factory.mktemp("lmdb_faults") / "src"
    for i in range(60):
        p = root / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(i)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        p.write_bytes(buf.getvalue())
    return root


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lmdb_faults_ref") / "ref"
    r = subprocess.run([*SHARDFEED, "-q", "pack", str(folder), str(out), "--format", "lmdb", "-j", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the reference holds every source file, byte for byte
    from shardfeed.readers.format.manifest import decode_record

    recs = [decode_record(v, source=str(k)) for k, v in _records(out).items() if k != MANIFEST_KEY]
    assert sorted((r["meta"]["path"], r["data"]) for r in recs) == sorted(
        (p.relative_to(folder).as_posix(), p.read_bytes()) for p in folder.rglob("*.jpg"))
    return out


def _refused_as_incomplete(out: Path) -> None:
    from shardfeed.readers import open_dataset

    assert not (out / "manifest.json").exists()
    assert MANIFEST_KEY not in _records(out)
    with pytest.raises(IncompleteDatasetError, match="--resume"):
        open_dataset(out)


@pytest.mark.multiprocess
def test_ctrl_c_mid_lmdb_pack_then_resume(hooked_cli, folder, reference, tmp_path, lmdb_entries):
    out = tmp_path / "o"
    hooks = {"lmdb_commit_count": 5, "lmdb_commit_delay_s": 0.1}
    proc = subprocess.Popen([*hooked_cli(hooks), "-q", "pack", str(folder), str(out), "--format", "lmdb", "-j", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and lmdb_entries(out) < 15 and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the pack finished before Ctrl-C: " + proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)  # exits (the timeout only guards against a hang)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardfeed: interrupted") and "--resume" in lines[0], err
    assert 15 <= lmdb_entries(out) < 60
    _refused_as_incomplete(out)

    r = subprocess.run([*SHARDFEED, "pack", str(folder), str(out), "--format", "lmdb", "-j", "2", "--resume",
                        "--json", "-"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["extra"]["lmdb_records_resumed"] >= 15
    _same_as_reference(out, reference)


def test_disk_full_mid_lmdb_pack_names_output_and_resume_works(hooked_cli, folder, reference, tmp_path, lmdb_entries):
    out = tmp_path / "o"
    # RLIMIT_FSIZE caps every file the pack writes: data.mdb cannot grow past half its final size
    limit = (reference / "data.mdb").stat().st_size // 2

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([*hooked_cli({"lmdb_commit_count": 5}), "pack", str(folder), str(out), "--format", "lmdb",
                        "-j", "1"], capture_output=True, text=True, preexec_fn=small_disk)
    assert r.returncode not in (0, -signal.SIGXFSZ) and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(out / "data.mdb") in r.stderr and "--resume" in r.stderr, r.stderr
    assert lmdb_entries(out) < 60
    _refused_as_incomplete(out)

    # space is back: resume finishes with the records of an uninterrupted pack
    r = subprocess.run([*SHARDFEED, "pack", str(folder), str(out), "--format", "lmdb", "-j", "1", "--resume"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    _same_as_reference(out, reference)
