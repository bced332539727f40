"""The README's quick start works as written: its shell block (bar ``pip install``) and its Python
block run on a small ImageFolder planted at ``data/train``, and the loader yields every planted
label once per epoch with the documented shapes and dtypes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_blocks() -> tuple[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    sh = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    py = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return sh, py


def test_readme_is_a_short_landing_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first_screen = "\n".join(text.splitlines()[:25])
    assert "make demo" in first_screen and "make test" in first_screen
    sh, py = _quick_start_blocks()
    assert len(sh.strip().splitlines()) + len(py.strip().splitlines()) <= 12
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", text):
        assert (ROOT / link).is_file(), link



def test_readme_first_screen_says_how_to_install_today_and_what_make_does_to_the_machine():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()[:25]
    first_screen = "\n".join(lines)
    # nothing on the package index yet: the install is `pip install .` of the clone, CPU torch first
    assert re.search(r"pip install shardfeed(?![\[\w])", text) is None
    cpu_index = r"pip install torch .*download\.pytorch\.org/whl/cpu"
    torch_cpu = [i for i, line in enumerate(lines) if re.match(cpu_index, line)]
    clone = [i for i, line in enumerate(lines) if re.match(r"pip install \.(\s|$)", line)]
    assert torch_cpu and clone and torch_cpu[0] < clone[0]
    assert re.search(r"about \d+ minutes", first_screen)
    # every Debian package scripts/system_deps.sh may install is named, with when it does so
    script = (ROOT / "scripts" / "system_deps.sh").read_text()
    packages = {p for group in re.findall(r"apt-get install ([\w\s-]+)\)", script) for p in group.split()}
    assert {"fuse3", "libfuse2", "nginx-light", "openssl", "chromium"} <= packages
    flat = " ".join(first_screen.split())
    for package in packages:
        assert package in flat, package
    assert "apt-get" in flat and "root" in flat and "nothing outside" in flat


@pytest.mark.slow
def test_readme_quick_start_runs(tmp_path):
    rng = np.random.default_rng(0)
    planted = {"cat": 90, "dog": 60, "fish": 50}
    for name, n in planted.items():
        (tmp_path / "data" / "train" / name).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / "train" / name / f"{i}.jpg")
    sh, py = _quick_start_blocks()
    shardfeed = Path(sys.executable).with_name("shardfeed")
    env = {**os.environ, "PATH": f"{shardfeed.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line in sh.replace("\\\n", " ").strip().splitlines():  # a trailing \ continues the line
        cmd = line.split("#", 1)[0].strip()
        if not cmd or cmd.startswith("pip "):
            continue
        out = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    manifest = json.loads((tmp_path / "out" / "train" / "manifest.json").read_text())
    assert manifest["num_samples"] == sum(planted.values()) and manifest["classes"] == sorted(planted)
    check = py + (
        "\nimport collections, json\n"
        "seen = collections.Counter()\n"
        "for images, labels in loader:\n"
        "    assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.uint8, images.shape\n"
        "    assert labels.dtype == torch.int64\n"
        "    seen.update(labels.tolist())\n"
        "print(json.dumps({'seen': sorted(seen.items()), 'x': str(x.dtype), 'shape': list(x.shape[1:])}))\n")
    out = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["seen"] == [[i, planted[c]] for i, c in enumerate(sorted(planted))]
    assert result["x"] == "torch.float32" and result["shape"] == [3, 224, 224]
