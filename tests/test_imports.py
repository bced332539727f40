"""The import graph of ``shardfeed.convert`` and ``shardfeed.readers``, read from the source with ``ast``.

Every ``import``/``from ... import`` counts, at module level and inside functions (relative ones
resolved). The rules (docs/architecture.md):

* no import cycle inside a package (a module that imports, directly or not, a module that imports it);
* ``shardfeed.readers`` never imports ``shardfeed.convert`` (a training process needs readers only);
* no module uses another module's private (``_name``) names, by ``from m import _name`` or by
  ``m._name`` on an imported module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: package name -> its folder (the package-dir mapping of pyproject.toml)
PACKAGES = {"shardfeed.convert": ROOT / "convert", "shardfeed.readers": ROOT / "readers"}


def _modules() -> dict[str, Path]:
    """Every module of both packages: dotted name -> file (packages by their ``__init__.py``)."""
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:  # `from pkg import submodule`
                    out.append((sub, None, node.lineno))
                else:
                    out.append((target, alias.name, node.lineno))
    return out


def _edges(package: str) -> dict[str, set[str]]:
    """Imports between the modules of ``package``.

    Importing ``a.b.c`` also runs ``a.b``'s ``__init__``, unless ``a.b`` is a package the importer
    lives in (it was initialised before the importer ran: a package's ``__init__`` importing its
    submodules, which import their siblings, is no cycle).
    """
    graph: dict[str, set[str]] = {m: set() for m in MODULES if m.startswith(package + ".") or m == package}
    for m in graph:
        for target, _, _ in _targets(m):
            parts = target.split(".")
            for i in range(len(package.split(".")) + 1, len(parts) + 1):
                t = ".".join(parts[:i])
                if t in graph and t != m and not m.startswith(t + "."):
                    graph[m].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", ["shardfeed.convert", "shardfeed.readers"])
def test_no_import_cycle_within_a_package(package):
    cycles = _cycles(_edges(package))
    assert not cycles, "import cycles (counting imports inside functions): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_readers_never_import_convert():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
           for m in MODULES if m.startswith("shardfeed.readers")
           for t, _, line in _targets(m) if t == "shardfeed.convert" or t.startswith("shardfeed.convert.")]
    assert not bad, bad


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_uses_another_modules_private_names():
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        module_aliases: dict[str, str] = {}  # local name -> our module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(m, node)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in MODULES:
                        module_aliases[alias.asname or alias.name] = sub
                        if _private(alias.name):
                            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports private module {sub}")
                    elif target in MODULES and target != m and _private(alias.name):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {target} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES and alias.asname:
                        module_aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in module_aliases and module_aliases[node.value.id] != m
                    and _private(node.attr)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr} "
                           f"(private to {module_aliases[node.value.id]})")
    assert not bad, "\n".join(bad)


def test_the_checks_see_imports_inside_functions():
    """The graph holds function-level imports (the pack <-> executors cycle of old hid there)."""
    edges = _edges("shardfeed.readers")
    # the one opener imports http_io (and objstore) only inside functions
    assert "shardfeed.readers.storage.http_io" in edges["shardfeed.readers.storage.opener"]
    assert "shardfeed.readers.storage.objstore" in edges["shardfeed.readers.storage.opener"]


#: the stages of each package, highest first (docs/architecture.md): a module imports modules of its own
#: stage and of the stages below it, never above. A root module not listed is the package's base
#: (errors, version, keywords, runtime, background, file_io, sizes), below every stage.
STAGES = {
    "shardfeed.convert": ["cli", "tools", "write|writers"],
    "shardfeed.readers": ["integrations|consumers", "measure", "loader|iteration|device", "sources", "decode|batching",
                          "storage", "order", "format"],
}


def _stage(package: str, module: str) -> int:
    """The rank of ``module`` in ``package``'s stage list (its length for the base)."""
    head = module[len(package) + 1:].split(".")[0] if module != package else ""
    for rank, names in enumerate(STAGES[package]):
        if head in names.split("|"):
            return rank
    return len(STAGES[package])


@pytest.mark.parametrize("package", sorted(STAGES))
def test_imports_follow_the_stage_order(package):
    bad = []
    for m in MODULES:
        if not m.startswith(package + "."):
            continue
        for target, _, line in _targets(m):
            parts = target.split(".")
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            t = ".".join(parts)
            if t.startswith(package + ".") and _stage(package, t) < _stage(package, m):
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports {t} (a higher stage)")
    assert not bad, "\n".join(sorted(set(bad)))
