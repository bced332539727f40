"""What a regular (non-editable) install ships: every package folder must be listed in pyproject.toml.

An editable install maps whole folders, so a sub-package missing from ``[tool.setuptools]
packages`` goes unnoticed in development and breaks ``pip install .`` / a wheel (``shardfeed
pack`` then fails importing ``shardfeed.convert.writers``). The expectation comes from the file
system (every folder with an ``__init__.py`` under the mapped package directories), not from the
build backend.
"""

from __future__ import annotations

from pathlib import Path

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
