"""A local manifest (and the other small control files read whole) that is not a regular file or
is too large: refused with a ManifestError naming the file, before anything big is read and without
waiting on a FIFO. Right values: the files planted here and their sizes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from shardfeed.readers.storage import local_manifest
from shardfeed.readers.errors import DataSourceError, ManifestError
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.file_io import read_small_file
from shardfeed.readers.storage.location import LocalLocation

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]


@pytest.fixture
def zero_manifest(tmp_path):
    d = tmp_path / "zero"
    d.mkdir()
    (d / "manifest.json").symlink_to("/dev/zero")
    return d


@pytest.fixture
def fifo_manifest(tmp_path):
    d = tmp_path / "fifo"
    d.mkdir()
    os.mkfifo(d / "manifest.json")
    return d


def test_a_manifest_linked_to_dev_zero_is_refused(zero_manifest):
    with pytest.raises(ManifestError) as e:
        load_manifest(zero_manifest)
    assert str(zero_manifest / "manifest.json") in str(e.value) and "not a regular file" in str(e.value)


def test_a_fifo_manifest_is_refused_without_blocking(fifo_manifest):
    code = ("from shardfeed.readers.storage.local_manifest import load_manifest\n"
            f"try:\n    load_manifest({str(fifo_manifest)!r})\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("ManifestError") and "not a regular file" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["zero", "fifo"])
def test_inspect_refuses_it_in_one_line(kind, zero_manifest, fifo_manifest):
    d = zero_manifest if kind == "zero" else fifo_manifest
    r = subprocess.run([*SHARDFEED, "inspect", str(d)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr
    assert "manifest.json" in r.stderr and "not a regular file" in r.stderr, r.stderr


def test_a_manifest_over_the_cap_is_refused(tmp_path, monkeypatch, packed_wds):
    d = tmp_path / "ds"
    shutil.copytree(packed_wds, d)
    size = (d / "manifest.json").stat().st_size
    num_samples = json.loads((packed_wds / "manifest.json").read_bytes())["num_samples"]
    monkeypatch.setattr(local_manifest, "MAX_MANIFEST_BYTES", size)  # exactly the cap: read
    assert load_manifest(d).num_samples == num_samples
    monkeypatch.setattr(local_manifest, "MAX_MANIFEST_BYTES", size - 1)
    with pytest.raises(ManifestError) as e:
        load_manifest(d)
    assert str(d / "manifest.json") in str(e.value) and f"more than {size - 1:,} bytes" in str(e.value)


def test_read_small_file_bounds(tmp_path):
    f = tmp_path / "plan.json"
    f.write_bytes(b"x" * 100)
    assert read_small_file(f, max_bytes=100) == b"x" * 100
    with pytest.raises(ManifestError, match="more than 99 bytes"):
        read_small_file(f, max_bytes=99)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DataSourceError, match="not a regular file"):
        read_small_file(tmp_path / "fifo", error=DataSourceError)
    with pytest.raises(ManifestError, match="not a regular file"):
        read_small_file(tmp_path)  # a folder


def test_a_local_location_bounded_read_refuses_a_fifo(fifo_manifest):
    with pytest.raises(DataSourceError, match="not a regular file"):
        LocalLocation(fifo_manifest).read_bytes("manifest.json", max_bytes=1 << 20, what="the manifest")


def test_fifo_pack_state_files_do_not_block(tmp_path):
    state = tmp_path / ".shardfeed-pack"
    state.mkdir()
    os.mkfifo(state / "000000.json")
    os.mkfifo(state / "files.jsonl.z")
    code = ("from shardfeed.convert.write.pack_state import finished_shard_record, describe_plan_change\n"
            f"print(finished_shard_record({str(tmp_path)!r}, 0))\n"
            f"print(describe_plan_change({str(state)!r}, {{'options': {{}}}}, {{}}, []))\n")
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "None" and "list of the interrupted pack's files is missing" in r.stdout
