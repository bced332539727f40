"""A pack from a folder in a bucket accounts for its objects as a pack from the same folder on
disk does for its files: ``found``, ``packed``, ``skipped``, ``ignored``, and the name policy with
both ``--on-error`` choices. Against a real S3-API server on 127.0.0.1 (moto, ``conftest.py``);
the expected counts come from the tree the test plants, file by file."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from .conftest import _upload_dir

pytestmark = pytest.mark.network

SHARDFEED = [sys.executable, "-P", "-m", "shardfeed.convert.cli"]
BAD_NAME = "cat/bad\\name.jpg"  # a backslash: refused by the name policy (a folder separator elsewhere)
SHOWN = "cat/bad%5Cname.jpg"  # how messages and manifests name it (escaped, readers.format.imagefolder.display_name)


def _image(seed: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, size=(12, 10, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def _plant(root: Path, with_bad_name: bool) -> dict[str, str]:
    """Write the tree; returns ``{relative path: what a pack must make of it}``."""
    tree = {
        "cat/a.jpg": ("packed", _image(1, "JPEG")),
        "cat/sub/b.png": ("packed", _image(2, "PNG")),
        "dog/c.jpg": ("packed", _image(3, "JPEG")),
        "dog/notes.txt": ("ignored", b"not an image"),        # another extension
        "cat/.hidden.jpg": ("ignored", _image(4, "JPEG")),    # a hidden file
        ".cache/x.jpg": ("ignored", _image(5, "JPEG")),       # in a hidden folder
        "README.md": ("ignored", b"# beside the class folders"),
    }
    if with_bad_name:
        tree[BAD_NAME] = ("skipped", _image(6, "JPEG"))
    for rel, (_, data) in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return {rel: kind for rel, (kind, _) in tree.items()}


def _expected_files(kinds: dict[str, str]) -> dict[str, int]:
    return {"found": len(kinds), "packed": sum(k == "packed" for k in kinds.values()),
            "skipped": sum(k == "skipped" for k in kinds.values()),
            "ignored": sum(k == "ignored" for k in kinds.values())}


def _pack(src, out: Path, *extra: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*SHARDFEED, "-q", "pack", str(src), str(out), "--format", "wds", *extra],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def planted(tmp_path, s3_client, s3_bucket):
    """``make(with_bad_name) -> (local folder, bucket URL, kinds, env)``."""
    def make(with_bad_name: bool):
        name = "bad" if with_bad_name else "plain"
        root = tmp_path / name / "images"
        kinds = _plant(root, with_bad_name)
        bucket = s3_bucket("accounting")
        _upload_dir(s3_client, bucket, f"{name}/", root)
        (tmp_path / "staging").mkdir(exist_ok=True)
        env = {**os.environ, "SHARDFEED_STAGING_DIR": str(tmp_path / "staging")}
        return root, f"s3://{bucket}/{name}/", kinds, env
    return make


def test_a_pack_from_a_bucket_counts_its_objects_as_a_local_pack_counts_its_files(planted, tmp_path):
    root, url, kinds, env = planted(False)
    want = _expected_files(kinds)
    for src, out in ((root, tmp_path / "local"), (url, tmp_path / "from-bucket")):
        r = _pack(src, out, env=env)
        assert r.returncode == 0, r.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["files"] == want, src
        assert manifest["num_samples"] == want["packed"]
    assert (tmp_path / "local" / "shard-000000.tar").read_bytes() == \
        (tmp_path / "from-bucket" / "shard-000000.tar").read_bytes()


def test_a_name_breaking_the_policy_stops_a_pack_from_a_bucket_as_it_stops_a_local_one(planted, tmp_path):
    """``--on-error raise`` (the default): both stop (status 1) naming the file and the fix."""
    root, url, _, env = planted(True)
    local = _pack(root, tmp_path / "local", env=env)
    remote = _pack(url, tmp_path / "from-bucket", env=env)
    assert local.returncode == 1 and remote.returncode == 1, (local.stderr, remote.stderr)
    assert f"{root}/{SHOWN}" in local.stderr and "--on-error skip" in local.stderr
    assert f"{url}{SHOWN}" in remote.stderr and "--on-error skip" in remote.stderr, remote.stderr
    assert not (tmp_path / "from-bucket" / "manifest.json").exists()
    assert list((tmp_path / "staging").iterdir()) == []  # stopped before downloading anything


def test_a_name_breaking_the_policy_is_skipped_and_listed_from_a_bucket_as_locally(planted, tmp_path):
    root, url, kinds, env = planted(True)
    want = _expected_files(kinds)
    manifests = []
    for src, out in ((root, tmp_path / "local"), (url, tmp_path / "from-bucket")):
        r = _pack(src, out, "--on-error", "skip", env=env)
        assert r.returncode == 0, r.stderr
        manifests.append(json.loads((out / "manifest.json").read_text()))
    for m in manifests:
        assert m["files"] == want
        assert [s["path"] for s in m["skipped"]] == [SHOWN]
    assert manifests[0]["skipped"] == manifests[1]["skipped"]  # the same path and reason


def test_a_pack_from_a_bucket_shows_its_download_progress(planted, tmp_path):
    """The images are counted as they are downloaded (against the planted images), on stderr;
    nothing with ``-q``."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("progress_tty", Path(__file__).parents[1] / "convert" /
                                                  "progress_tty.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    run_on_tty = helper.run_on_tty
    _, url, kinds, env = planted(False)
    n = sum(k == "packed" for k in kinds.values())
    rc, _, err = run_on_tty([*SHARDFEED, "pack", url, str(tmp_path / "o"), "--format", "wds"], env=env)
    assert rc == 0, err
    assert re.search(rf"download: 100%.*\b{n}(\.0+)?/{n}(\.0+)? ", err), err
    rc, _, err = run_on_tty([*SHARDFEED, "-q", "pack", url, str(tmp_path / "q"), "--format", "wds"], env=env)
    assert rc == 0 and err == "", err
