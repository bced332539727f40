"""The wheel works alone: ``python -m build`` makes the sdist and the wheel, the wheel installs into
a fresh virtual environment (no editable install, the repository not on the path), and there the
``shardfeed`` command packs a small folder that the installed readers read back, and mypy sees the
installed package's types; its ``--help`` works with the heavy dependencies (torch, Pillow, LMDB ...)
refused.

Heavy dependencies (torch, numpy, Pillow ...) are reused from the test's own environment through a
path entry placed after the fresh environment's own site-packages; that entry is a plain folder on
``sys.path`` (its ``.pth`` files, such as an editable install's finder, are not run), and the test
checks that ``shardfeed`` is imported from the fresh environment, not from the repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_wheel_installs_alone_and_packs_and_reads(tmp_path):
    import torch

    dist = tmp_path / "dist"
    import importlib.metadata

    # the backend pyproject.toml asks for is here: build without fetching it (else build isolates)
    backend_here = int(importlib.metadata.version("setuptools").split(".")[0]) >= 77
    _run([sys.executable, "-m", "build", *(["--no-isolation"] if backend_here else []), "--outdir", str(dist),
          str(ROOT)], cwd=tmp_path)
    wheels, sdists = list(dist.glob("shardfeed-*.whl")), list(dist.glob("shardfeed-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    from shardfeed.readers.version import __version__

    assert wheels[0].name == f"shardfeed-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheels[0]).namelist()
    for must in ("shardfeed/convert/py.typed", "shardfeed/readers/py.typed", "shardfeed/readers/version.py",
                 "shardfeed/convert/cli/__init__.py", "shardfeed/convert/writers/webdataset.py"):
        assert must in names, must
    assert not any(n.startswith(("tests/", "scripts/", "docs/")) for n in names)
    with tarfile.open(sdists[0]) as t:
        sdist_names = t.getnames()
    assert any(n.endswith("/readers/py.typed") for n in sdist_names)

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False, symlinks=True)
    py = env_dir / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    heavy = Path(torch.__file__).resolve().parents[1]  # the folder torch (and the other dependencies) live in
    (site / "zz_dependencies.pth").write_text(str(heavy) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
          str(wheels[0])])

    rng = np.random.default_rng(0)
    planted = {"cat": 5, "dog": 3}
    for name, n in planted.items():
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(n):
            ext = "png" if i == 0 else "jpg"
            pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "src" / name / f"{i}.{ext}")
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    work = tmp_path / "work"  # neither the repository nor its parent
    work.mkdir()
    shardfeed = env_dir / "bin" / "shardfeed"
    _run([str(shardfeed), "pack", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "1", "-q"],
         cwd=work, env=clean_env)
    code = (
        "import json, shardfeed.convert, shardfeed.readers\n"
        "from shardfeed.readers import make_loader\n"
        f"loader = make_loader({str(tmp_path / 'out')!r}, batch_size=4, num_workers=0, image_size=8)\n"
        "labels = sorted(int(y) for _, ys in loader for y in ys)\n"
        "print(json.dumps({'labels': labels, 'convert': shardfeed.convert.__file__,"
        " 'readers': shardfeed.readers.__file__, 'version': shardfeed.readers.__version__}))\n")
    # the installed command teaches without the heavy dependencies (each import of them refused)
    no_heavy = ("import sys\n"
                "for name in ('torch', 'PIL', 'lmdb', 'cv2', 'simplejpeg', 'boto3', 'webdataset'):\n"
                "    sys.modules[name] = None\n"
                "from shardfeed.convert.cli import main\n"
                "sys.argv = ['shardfeed'] + sys.argv[1:]\n"
                "main()\n")
    assert "pack" in _run([str(py), "-I", "-c", no_heavy, "--help"], cwd=work, env=clean_env).stdout
    assert "--max-bytes" in _run([str(py), "-I", "-c", no_heavy, "pack", "--help"], cwd=work, env=clean_env).stdout
    report = json.loads(_run([str(py), "-I", "-c", code], cwd=work, env=clean_env).stdout)
    assert report["labels"] == [0] * planted["cat"] + [1] * planted["dog"]
    for key in ("convert", "readers"):
        assert Path(report[key]).resolve().is_relative_to(env_dir.resolve()), report[key]
        assert not Path(report[key]).resolve().is_relative_to(ROOT), report[key]
    assert report["version"] == __version__
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["created_by"] == f"shardfeed {__version__}" and manifest["num_samples"] == 8

    # a type checker sees the installed package's public API (py.typed, the TYPE_CHECKING imports)
    (work / "snippet.py").write_text(
        "from shardfeed.convert import PackOptions, pack\n"
        "from shardfeed.readers import make_loader\n"
        "reveal_type(pack)\nreveal_type(make_loader)\n"
        "options: PackOptions = PackOptions(max_bytes=1_000_000)\n")
    (work / "mypy.ini").write_text(
        "[mypy]\nfollow_imports = silent\n"
        "[mypy-torch.*,numpy.*,PIL.*,lmdb.*,msgpack.*,click.*,tqdm.*,simplejpeg.*,cv2.*,boto3.*,botocore.*]\n"
        "follow_imports = skip\nignore_missing_imports = True\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--python-executable", str(py),
                          "--no-incremental", "snippet.py"], capture_output=True, text=True, cwd=work, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "-> shardfeed.convert.write.report.PackReport" in out.stdout, out.stdout
    assert "-> shardfeed.readers.loader.ShardfeedLoader" in out.stdout, out.stdout
