"""What a regular (non-editable) install ships: every package folder must be listed in pyproject.toml.

An editable install maps whole folders, so a sub-package missing from ``[tool.setuptools]
packages`` goes unnoticed in development and breaks ``pip install .`` / a wheel (``shardfeed
pack`` then fails importing ``shardfeed.convert.writers``). The expectation comes from the file
system (every folder with an ``__init__.py`` under the mapped package directories), not from the
build backend.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: setuptools (the build backend) bundles a TOML reader
    from setuptools.config.pyprojecttoml import load_file as _load_toml
else:
    def _load_toml(path: Path) -> dict:
        with open(path, "rb") as f:
            return tomllib.load(f)

REPO = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_for_the_wheel():
    setuptools_cfg = _load_toml(REPO / "pyproject.toml")["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools_cfg["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(root).parts]))
    assert found, "no package folder found"
    missing = sorted(found - set(setuptools_cfg["packages"]))
    assert not missing, f"package folders not listed in pyproject.toml [tool.setuptools] packages: {missing}"


#: Distributions that belong to the test, docs, interop, Ray, trainer and benchmark set-ups, not to the demo.
NOT_FOR_THE_DEMO = {"pytest", "pytest-timeout", "ruff", "mypy", "moto", "playwright", "mkdocs", "mkdocs-material",
                    "mkdocstrings", "mkdocs-click", "nvidia-dali-cuda120", "wids", "datasets", "webdataset", "ray",
                    "lightning", "transformers", "accelerate", "cosmic-ray", "matplotlib", "boto3"}


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower()


def _make_dry_run(target: str, tmp_path: Path) -> list[str]:
    """The commands ``make TARGET`` would run on a fresh clone (no .venv yet), without running them."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _installed_extras(commands: list[str]) -> set[str]:
    extras = set()
    for line in commands:
        m = re.search(r"pip install .*-e \"\.\[([\w,-]+)\]\"", line)
        if m:
            extras.update(m.group(1).split(","))
    return extras


def test_make_demo_installs_only_what_the_demo_runs(tmp_path):
    commands = _make_dry_run("demo", tmp_path)
    assert any(line.startswith("python3 -m venv") for line in commands)  # a fresh clone gets its .venv
    assert any("scripts/install_torch.sh" in line for line in commands)  # the CPU torch step comes first
    assert _installed_extras(commands) == {"opencv", "demo"}
    extras = _load_toml(REPO / "pyproject.toml")["project"]["optional-dependencies"]
    demo_dists = {_dist_name(r) for name in ("opencv", "demo") for r in extras[name]}
    assert demo_dists == {"opencv-python-headless", "mfusepy"}
    assert not demo_dists & NOT_FOR_THE_DEMO
    # the demo's system packages are FUSE's alone (no web server, no browser)
    assert any(line.strip() == "sh scripts/system_deps.sh demo" for line in commands)


@pytest.mark.parametrize("target", ["test", "docs", "lint"])
def test_the_full_set_up_builds_on_the_demo_set_up(tmp_path, target):
    commands = _make_dry_run(target, tmp_path)
    assert any(line.startswith("python3 -m venv") for line in commands)
    extras = _installed_extras(commands)
    assert {"opencv", "demo", "dev", "docs", "interop", "ray", "lightning", "transformers"} <= extras


def test_the_demo_cold_run_measures_every_disk_read_it_makes(tmp_path):
    """A shard reader reads ahead: on the demo's 40 MB sample a warm-up batch or two takes in every
    shard before the measured window, which then runs from memory (and says so). The demo's cold
    verify therefore measures one whole epoch from its first batch."""
    commands = "\n".join(_make_dry_run("demo", tmp_path)).replace("\\\n", " ")
    verify = next(line for line in commands.splitlines() if " verify " in line and "--cold" in line)
    args = shlex.split(verify)
    opt = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    sample = next(line for line in commands.splitlines() if "scripts/make_sample_data.py" in line)
    assert "--num-images" not in sample  # the script's default count, read from its command line below
    script = (REPO / "scripts" / "make_sample_data.py").read_text()
    num_images = int(re.search(r'"--num-images", type=int, default=(\d+)', script).group(1))
    warmup, batches, batch_size = int(opt["--warmup"]), int(opt["--batches"]), int(opt["--batch-size"])
    assert warmup == 0  # no batch is read before the window opens
    assert num_images - batch_size < batches * batch_size <= num_images  # one whole epoch, never a second


NAMED_EXTRA = re.compile(r"shardfeed\[([a-z0-9,-]+)\]|\bthe (?!optional\b)([a-z0-9-]+) extra\b(?! field)")


def _named_extras() -> dict[str, list[str]]:
    """Extra name -> the places (file:line) in the package's sources whose text names it
    (``shardfeed[NAME]``, "the NAME extra")."""
    found: dict[str, list[str]] = {}
    for folder in ("convert", "readers"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in NAMED_EXTRA.finditer(line):
                    for name in (m.group(1) or m.group(2)).split(","):
                        found.setdefault(name, []).append(f"{path.relative_to(REPO)}:{no}")
    return found


def test_every_extra_a_message_names_exists_and_adds_a_package():
    """simplejpeg is a core dependency: no message sends people to an extra for it (or for any
    other core dependency)."""
    project = _load_toml(REPO / "pyproject.toml")["project"]
    core = {_dist_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    named = _named_extras()
    assert "plot" in named and "s3" in named  # the scan sees the messages it is meant to check
    for name, places in named.items():
        assert name in extras, f"{places}: no extra named {name!r} in pyproject.toml"
        packages = {_dist_name(r) for r in extras[name]}
        assert packages - core, f"{places}: the {name!r} extra adds nothing: {sorted(packages)} are core dependencies"
