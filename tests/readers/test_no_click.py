"""``readers/`` is what a training process needs: no module under it imports Click.

The command line lives in ``convert/cli/``; imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

READERS = Path(__file__).resolve().parents[2] / "readers"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_module_under_readers_imports_click():
    modules = sorted(READERS.rglob("*.py"))
    assert len(modules) > 10, f"expected the readers package at {READERS}"
    offenders = [str(p.relative_to(READERS)) for p in modules
                 if any(m == "click" or m.startswith("click.") for m in _imported_modules(p))]
    assert offenders == [], f"modules under readers/ import click: {offenders}"


def test_the_check_sees_a_click_import(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from click import echo\n    echo('x')\n")
    assert "click" in _imported_modules(mod)
