"""Process-wide hooks are installed in one module (readers/runtime.py); other modules add callbacks."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the calls that install a process-wide hook
_HOOK_CALLS = {("os", "register_at_fork"), ("atexit", "register"), ("signal", "signal"), ("weakref", "finalize")}
#: hooks installed outside the runtime module, each for a reason its module states
_ALLOWED_ELSEWHERE = {
    ("readers/integrations/autowatch.py", "atexit.register"),  # must run after or before foreign exit callbacks
    ("readers/batching/buffers.py", "weakref.finalize"),  # one per lent batch view, not process-wide
}


def _hook_sites() -> list[tuple[str, int, str]]:
    sites = []
    for top in ("readers", "convert"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name)
                        and (node.func.value.id, node.func.attr) in _HOOK_CALLS):
                    sites.append((rel, node.lineno, f"{node.func.value.id}.{node.func.attr}"))
                elif isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "sys"
                        and t.attr == "unraisablehook" for t in node.targets):
                    sites.append((rel, node.lineno, "sys.unraisablehook"))
    return sites


def test_process_wide_hooks_are_installed_by_the_runtime_module_only():
    sites = _hook_sites()
    elsewhere = [s for s in sites if s[0] != "readers/runtime.py" and (s[0], s[2]) not in _ALLOWED_ELSEWHERE]
    assert not elsewhere, "install these through shardfeed.readers.runtime: " + "; ".join(map(str, elsewhere))
    kinds = [kind for path, _, kind in sites if path == "readers/runtime.py"]
    assert sorted(kinds) == ["atexit.register", "os.register_at_fork", "signal.signal", "sys.unraisablehook"]
    assert len(sites) <= 12, sites


def _child(body: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_callbacks_run_in_order_in_the_child_and_one_failing_does_not_stop_the_others():
    r = _child("""
        import os
        from shardfeed.readers.runtime import after_fork_in_child
        def fail():
            raise RuntimeError("planted failure")
        after_fork_in_child(lambda: os.write(1, b"first\\n"))
        after_fork_in_child(fail)
        after_fork_in_child(lambda: os.write(1, b"third\\n"))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent", flush=True)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["first", "third", "parent"], r.stdout + r.stderr
    assert "planted failure" in r.stderr


def test_exit_callbacks_run_last_added_first():
    r = _child("""
        from shardfeed.readers.runtime import at_exit
        at_exit(lambda: print("added first", flush=True))
        at_exit(lambda: print("added second", flush=True))
        print("main done", flush=True)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["main done", "added second", "added first"], r.stdout
