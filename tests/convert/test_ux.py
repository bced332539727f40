"""What a new user sees: images beside the class folders are warned about with
their count, ``check --decode`` shows a progress bar on a terminal, ``tune`` prints PyTorch's
worker-count advice once. Right values come from the files written here."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack

SHARDFEED = [sys.executable, "-m", "shardfeed.convert.cli"]


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ux")
    src = root / "src"
    for i in range(12):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i}.png").write_bytes(_png(i))
    pack(src, root / "wds", PackOptions(workers=1, max_count=4))
    return root / "wds"


def test_images_beside_the_class_folders_are_warned_with_their_count(tmp_path):
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "a.png").write_bytes(_png(1))
    for name in ("stray1.png", "stray2.JPG", "stray3.jpeg"):
        (src / name).write_bytes(_png(2))
    (src / "notes.txt").write_text("not an image")
    r = subprocess.run([*SHARDFEED, "pack", str(src), str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 image(s) lie beside the class folders" in r.stderr and "move each into its class folder" in r.stderr
    assert "stray1.png" in r.stderr


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux `script` for a pseudo-terminal")
def test_check_decode_shows_a_progress_bar_on_a_terminal(packed):
    cmd = " ".join([*SHARDFEED, "check", str(packed), "--decode"])
    r = subprocess.run(["script", "-qec", f"stty cols 120 rows 40; {cmd}", "/dev/null"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.replace("\r", "\n")
    assert "check + decode:" in out and "12/12" in out.replace(".0", ""), out


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
def test_tune_prints_the_worker_count_warning_once(packed):
    """On one CPU, 2 workers are more than PyTorch suggests: its advice comes once, not twice."""
    r = subprocess.run([*SHARDFEED, "tune", str(packed), "--batches", "2", "--warmup", "1", "--image-size", "8",
                        "-b", "4", "--model", "none", "--budget-s", "120", "--max-num-workers", "2"],
                       capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("This DataLoader will create 2 worker processes") == 1, r.stderr
