"""MkDocs hook: make the packages findable by import name for the API reference.

shardfeed's packages live in ``convert/`` and ``readers/`` and install as ``shardfeed.convert`` and
``shardfeed.readers`` (``[tool.setuptools.package-dir]``). mkdocstrings (griffe) reads source by
folder name, so before a build this links both folders into ``build/apisrc/shardfeed/``, the path
``mkdocs.yml`` gives the Python handler. Nothing is imported for the API pages; the command
reference (mkdocs-click) imports ``shardfeed.convert.cli`` as installed.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_SRC = ROOT / "build" / "apisrc"


def on_startup(command, dirty):  # noqa: ARG001 - the MkDocs hook signature
    pkg = API_SRC / "shardfeed"
    pkg.mkdir(parents=True, exist_ok=True)
    for folder in ("convert", "readers"):
        link = pkg / folder
        target = ROOT / folder
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
