"""No function or method in the two packages is longer than 100 lines, from its ``def`` to its
last line, docstring included: a longer one is split into named parts (the architecture page's
rule; read with ``ast``, so nested functions count on their own too). No module is longer than
700 lines: a longer one is split by responsibility."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 100
MAX_MODULE_LINES = 700


def test_no_function_is_over_100_lines():
    long = []
    for package in ("convert", "readers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 100 lines; split them into named parts: " + ", ".join(long)


def test_no_module_is_over_700_lines():
    long = [f"{path.relative_to(ROOT)} ({n} lines)"
            for package in ("convert", "readers") for path in sorted((ROOT / package).rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 700 lines; split them by responsibility: " + ", ".join(long)
