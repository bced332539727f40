"""One writer per output folder: a second command writing the same OUT fails
at once naming the holder (PID, host), a stale lock from a dead process is taken over, and every
writing command (pack, convert, index, stage, unpack) takes the lock. Right values come from the
source folders (bytes per path) and from the holder process itself (its PID)."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.outlock import LOCK_NAME, OutputBusyError, output_lock
from shardfeed.convert.write.pack import PackOptions, pack

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _folder(root: Path, seed: int, n: int = 24) -> dict[str, bytes]:
    files = {}
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed * 1000 + i).integers(0, 255, (9, 9, 3), dtype=np.uint8)).save(
            buf, "PNG")
        rel = f"c{i % 2}/s{seed}_{i:02d}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(buf.getvalue())
        files[rel] = buf.getvalue()
    return files


def _packed_paths(out: Path) -> dict[str, bytes]:
    got, data = {}, {}
    for t in sorted(out.glob("*.tar")):
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                if ext == "json":
                    got[key] = json.loads(tf.extractfile(m).read())["path"]
                elif ext != "cls":
                    data[key] = tf.extractfile(m).read()
    return {got[k]: data[k] for k in got}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_second_pack_into_the_same_out_fails_at_once_naming_the_first(tmp_path, hooked_cli):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    files_a, _ = _folder(a, 1), _folder(b, 2)
    first = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.06}), "-q", "pack", str(a), str(out), "--overwrite",
                              "--max-count", "4", "-j", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(out.glob("*.tar")):
        time.sleep(0.02)
    assert (out / LOCK_NAME).exists()
    t0 = time.monotonic()
    second = subprocess.run([*SHARDFEED, "-q", "pack", str(b), str(out), "--overwrite", "--max-count", "4"],
                            capture_output=True, text=True)
    assert time.monotonic() - t0 < 10  # at once, not after the first finishes
    assert second.returncode != 0 and "Traceback" not in second.stderr
    assert "another shardfeed command is writing" in second.stderr
    assert f"PID {first.pid} on host {socket.gethostname()}" in second.stderr, second.stderr
    assert first.poll() is None, "the second run must not disturb the first"
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert _packed_paths(out) == files_a  # the first source, whole
    assert not (out / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    src, out = tmp_path / "src", tmp_path / "out"
    files = _folder(src, 3, n=6)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its PID no longer runs, and it held no lock
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "command": "pack",
                                             "since": time.time() - 60}))
    with caplog.at_level("INFO", logger="shardfeed.convert.write.outlock"):
        pack(src, out, PackOptions(workers=1))
    assert _packed_paths(out) == files
    assert any(f"PID {dead.pid}" in r.getMessage() and "stale" in r.getMessage() for r in caplog.records)
    assert not (out / LOCK_NAME).exists()


def test_every_writing_command_takes_the_lock(tmp_path):
    from shardfeed.convert.tools.convert import convert_dataset
    from shardfeed.convert.tools.index import index_shards
    from shardfeed.convert.tools.stage import stage
    from shardfeed.convert.tools.unpack import unpack

    src, packed = tmp_path / "src", tmp_path / "packed"
    _folder(src, 4, n=6)
    pack(src, packed, PackOptions(workers=1))
    shards = tmp_path / "shards"
    shards.mkdir()
    for t in packed.glob("*.tar"):
        shutil.copy2(t, shards / t.name)
    busy = rf"another shardfeed command is writing this folder: PID {os.getpid()} on host .*`held-by-test`"
    calls = {
        "pack": lambda out: pack(src, out, PackOptions(workers=1, overwrite=True)),
        "convert": lambda out: convert_dataset(packed, out, format="lmdb", overwrite=True),
        "stage": lambda out: stage(packed, out),
        "unpack": lambda out: unpack(packed, out, overwrite=True),
        "index": lambda out: index_shards(str(out / "*.tar")),
    }
    for name, call in calls.items():
        out = shards if name == "index" else tmp_path / f"out-{name}"
        with output_lock(out, "held-by-test"):
            with pytest.raises(OutputBusyError, match=busy):
                call(out)
        assert not (out / LOCK_NAME).exists()
        call(out)  # once released, the command runs
    # the CLI says it in one line
    with output_lock(tmp_path / "out-cli", "held-by-test"):
        r = subprocess.run([*SHARDFEED, "unpack", str(packed), str(tmp_path / "out-cli")], capture_output=True,
                           text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr and f"PID {os.getpid()}" in r.stderr


# the secrets a command line may carry, each in a recognisable form
_SECRETS = {
    "storage option": ("--storage-option", "secret=SfLockSecret-7c1e9a"),
    "URL password": ("http://alice:SfLockPassword-4b2d@127.0.0.1:9/ds/",),
    "pre-signed token": ("https://b.s3.amazonaws.com/ds/manifest.json?X-Amz-Security-Token=SfLockToken-e8f0"
                         "&X-Amz-Signature=SfLockSignature-0a9b",),
}


def test_the_lock_file_records_no_secret_and_is_private(tmp_path, monkeypatch):
    argv = ["shardfeed"] + [a for args in _SECRETS.values() for a in args]
    monkeypatch.setattr(sys, "argv", argv)
    out = tmp_path / "out"
    with output_lock(out, "stage") as path:
        raw = path.read_text()
        mode = path.stat().st_mode & 0o777
    for word in ("SfLockSecret-7c1e9a", "SfLockPassword-4b2d", "SfLockToken-e8f0", "SfLockSignature-0a9b"):
        assert word not in raw
    info = json.loads(raw)
    assert info["command"] == "stage" and info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert mode == 0o600, oct(mode)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_running_packs_lock_file_holds_no_storage_secret(tmp_path, hooked_cli):
    src, out = tmp_path / "src", tmp_path / "out"
    _folder(src, 7, n=12)
    secret = "SfLockSecret-7c1e9a"
    proc = subprocess.Popen([*hooked_cli({"sample_delay_s": 0.1}), "-q", "pack", "--storage-option",
                             f"secret={secret}", str(src), str(out), "--max-count", "2", "-j", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    raw = ""
    while time.monotonic() < deadline and not raw:
        try:
            raw = (out / LOCK_NAME).read_text()
            mode = (out / LOCK_NAME).stat().st_mode & 0o777
        except FileNotFoundError:
            time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert raw and secret not in raw and json.loads(raw)["pid"] == proc.pid
    assert mode == 0o600


@pytest.mark.parametrize("command", ["pack", "stage"])
def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_kept(command, tmp_path):
    from shardfeed.convert.tools.stage import stage

    src, packed = tmp_path / "src", tmp_path / "packed"
    _folder(src, 5, n=6)
    pack(src, packed, PackOptions(workers=1))
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's own bytes\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(victim)
    with pytest.raises(OSError, match=rf"{LOCK_NAME}: is a symbolic link"):
        if command == "pack":
            pack(src, out, PackOptions(workers=1))
        else:
            stage(packed, out)
    assert victim.read_bytes() == b"the victim's own bytes\n"
    assert (out / LOCK_NAME).is_symlink()
    r = subprocess.run([*SHARDFEED, command, str(src if command == "pack" else packed), str(out)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "is a symbolic link" in r.stderr, r.stderr
    assert victim.read_bytes() == b"the victim's own bytes\n"


def test_a_second_pack_is_told_the_folder_is_busy_before_what_it_holds(tmp_path):
    """While a pack writes OUT, its state folder is there: the second pack must hear that OUT is
    being written (PID, host), not that it holds an unfinished pack to --resume."""
    src, out = tmp_path / "src", tmp_path / "out"
    _folder(src, 6, n=6)
    out.mkdir()
    (out / ".shardfeed-pack").mkdir()  # what a running pack holds
    (out / ".shardfeed-pack" / "plan.json").write_text("{}")
    with output_lock(out, "pack"):
        for extra in ([], ["--resume"], ["--overwrite"]):
            r = subprocess.run([*SHARDFEED, "pack", str(src), str(out), *extra], capture_output=True, text=True)
            assert r.returncode != 0 and "Traceback" not in r.stderr
            assert f"another shardfeed command is writing this folder: PID {os.getpid()} on host" in r.stderr, \
                r.stderr
            assert "unfinished" not in r.stderr
