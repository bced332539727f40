"""mypy --strict on shardfeed's public surface, held to an error budget (``make lint``).

The packages live in ``convert/`` and ``readers/`` and install as ``shardfeed.convert`` and
``shardfeed.readers`` (``[tool.setuptools.package-dir]``); mypy reads modules from folders named
like the import, so this script links both folders into a temporary ``shardfeed/`` and runs mypy
there, with ``[tool.mypy]`` of ``pyproject.toml``. It checks the modules listed in
``[tool.shardfeed.mypy] modules`` and fails (exit 1) when mypy reports more errors than
``max_errors``, printing them; it says so when the count has fallen below the budget (lower it).

Usage: ``python scripts/mypy_budget.py [--show]`` (``--show`` prints every error).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from setuptools.config.pyprojecttoml import load_file as _load
else:
    def _load(path):
        with open(path, "rb") as f:
            return tomllib.load(f)

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", action="store_true", help="print every error, not only when over budget")
    args = ap.parse_args()
    cfg = _load(ROOT / "pyproject.toml")["tool"]["shardfeed"]["mypy"]
    with tempfile.TemporaryDirectory(prefix="shardfeed-mypy-") as tmp:
        os.mkdir(Path(tmp) / "shardfeed")
        for folder in ("convert", "readers"):
            os.symlink(ROOT / folder, Path(tmp) / "shardfeed" / folder)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(Path(tmp) / ".mypy_cache")]
        for m in cfg["modules"]:
            cmd += ["-m", m]
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    errors = [ln for ln in lines if re.match(r"^\S+:\d+: error:", ln)]
    if out.returncode not in (0, 1) or (out.returncode == 1 and not errors):
        print(out.stdout + out.stderr, file=sys.stderr)
        print("mypy_budget: mypy did not run cleanly", file=sys.stderr)
        return 2
    budget = int(cfg["max_errors"])
    if args.show or len(errors) > budget:
        print("\n".join(errors))
    print(f"mypy --strict, {len(cfg['modules'])} public modules: {len(errors)} errors (budget {budget})")
    if len(errors) > budget:
        print("mypy_budget: more errors than the budget: fix the new ones (type hints of public functions)",
              file=sys.stderr)
        return 1
    if len(errors) < budget:
        print(f"mypy_budget: {budget - len(errors)} under budget: lower max_errors in pyproject.toml to {len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
