"""Mutation testing of the modules that carry the README's promises (``make mutants``).

Built on cosmic-ray (https://cosmic-ray.readthedocs.io): each mutant is one small change to one
module (``<`` for ``<=``, ``n + 1`` for ``n``, ``and`` for ``or``, a loop that never runs ...);
the module's fast tests (``scripts/mutants.toml``) run against it, and a mutant that passes them
*survives*: a change of behaviour no test notices.

The run never touches the working tree: the sources and tests are copied to ``OUT/tree`` and
imported from there (``OUT/tree/_import/shardfeed/{convert,readers}`` link to the copies and
come first on ``PYTHONPATH``, ahead of the editable install). Per module it writes a cosmic-ray
config and session database (``OUT/<module>.toml``, ``OUT/<module>.sqlite``; ``cr-report`` and
``cr-html`` read them too), and at the end ``OUT/report.json`` and ``OUT/report.txt``: per
module the mutants tried, killed, survived and timed out, and every survivor as
``path:line operator  source line``.

Reading the report: a survivor is either a gap in the tests (write a test that fails on it:
assert the value, not just that no error occurs), or an equivalent mutant (the change cannot be
observed, e.g. a buffer size or a log message); the survival share is survivors / (killed +
survivors). Timeouts (a mutant that makes the tests hang) count as killed.

Usage::

    python scripts/mutants.py [--out out/mutants] [--only readers/storage/http_io.py ...] [--deliberate-only]
                              [--sample N] [--seed S] [--no-deliberate]

The deliberate bugs of ``scripts/mutants.toml`` (a retry one byte late, a 403 retried,
no CRC check, a case-insensitive class sort ...) are tried first, each against its tests; the
report names the tests that caught it, and the run fails if one was not caught.

``--sample N`` tries a seeded random sample of N mutants per module (a quicker, representative
run); the default tries them all (tens of minutes per module on 2 cores).

Requires cosmic-ray (``pip install -e ".[mutants]"``; ``make mutants`` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scripts" / "mutants.toml"
PYTEST_MARKS = "not slow and not multiprocess and not ray and not gpu"


def _load_config(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(path.read_text())


def _copy_tree(out: Path) -> Path:
    """Copy what the tests need to ``out/tree``; return the directory to put on PYTHONPATH."""
    tree = out / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("convert", "readers", "tests", "scripts"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", tree / "pyproject.toml")
    shim = tree / "_import" / "shardfeed"
    shim.mkdir(parents=True)
    for pkg in ("convert", "readers"):
        (shim / pkg).symlink_to(Path("..", "..", pkg))
    return tree


def _test_command(tests: list[str]) -> list[str]:
    return [sys.executable, "-P", "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
            "-m", PYTEST_MARKS, *tests]


def _env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "_import") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CI", None)  # a skip is not a failure here: only the kill counts
    return env


def _check_imports_from_copy(tree: Path) -> None:
    code = ("import shardfeed.readers.format.manifest as r, shardfeed.convert.write.tarwriter as c; "
            "print(r.__file__); print(c.__file__)")
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=tree, env=_env(tree), capture_output=True,
                         text=True, check=True).stdout.split()
    for f in out:
        if not str(Path(f).resolve()).startswith(str(tree.resolve())):
            raise SystemExit(f"the tests would import {f}, not the copy under {tree}: the mutants would not "
                             "be seen (is shardfeed installed non-editable under the same path?)")


def _run_module(module: dict, operators: list[re.Pattern], tree: Path, out: Path, sample: int | None,
                seed: int) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    path, tests = module["path"], module["tests"]
    stem = path.replace("/", "_").removesuffix(".py")
    # baseline: the tests pass on the unmutated copy, and how long they take
    t0 = time.monotonic()
    base = subprocess.run(_test_command(tests), cwd=tree, env=_env(tree), capture_output=True, text=True)
    baseline_s = time.monotonic() - t0
    if base.returncode != 0:
        raise SystemExit(f"{path}: its tests fail without any mutant:\n{base.stdout[-3000:]}{base.stderr[-2000:]}")
    timeout_s = max(30.0, 4 * baseline_s)
    cfg = out / f"{stem}.toml"
    session = out / f"{stem}.sqlite"
    session.unlink(missing_ok=True)
    cmd = " ".join(_quote(a) for a in _test_command(tests))
    cfg.write_text(f'[cosmic-ray]\nmodule-path = "{path}"\ntimeout = {timeout_s:.0f}\nexcluded-modules = []\n'
                   f'test-command = "{_toml_escape(cmd)}"\n\n[cosmic-ray.distributor]\nname = "local"\n')
    subprocess.run([sys.executable, "-m", "cosmic_ray.cli", "init", str(cfg), str(session)], cwd=tree,
                   env=_env(tree), check=True, capture_output=True)
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = list(db.work_items)
        keep = [it for it in items if all(any(p.fullmatch(m.operator_name) for p in operators)
                                          for m in it.mutations)]
        if sample is not None and len(keep) > sample:
            keep = random.Random(seed).sample(keep, sample)
        kept = {it.job_id for it in keep}
        skip = [it.job_id for it in items if it.job_id not in kept]
        if skip:
            db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED,
                                                     output="not selected (operator filter or --sample)"))
    print(f"{path}: {len(kept)} mutants of {len(items)} (baseline {baseline_s:.1f} s, timeout {timeout_s:.0f} s)",
          flush=True)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "cosmic_ray.cli", "exec", str(cfg), str(session)], cwd=tree,
                   env=_env(tree), check=True)
    elapsed_s = time.monotonic() - t0
    source = (tree / path).read_text().splitlines()
    killed = survived = timeouts = errors = 0
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if item.job_id not in kept:
                continue
            outcome = result.test_outcome.value if result.test_outcome else None
            if result.worker_outcome == WorkerOutcome.ABNORMAL:  # timed out: the tests hung
                timeouts += 1
            elif outcome == "killed":
                killed += 1
            elif outcome == "survived":
                survived += 1
                m = item.mutations[0]
                line = m.start_pos[0]
                survivors.append({"line": line, "operator": m.operator_name, "occurrence": m.occurrence,
                                  "source": source[line - 1].strip() if line <= len(source) else "",
                                  "diff": result.diff})
            else:
                errors += 1
    decided = killed + timeouts + survived
    return {"path": path, "tests": tests, "mutants": len(kept), "of": len(items), "killed": killed,
            "timeouts": timeouts, "survived": survived, "errors": errors,
            "survival_share": round(survived / decided, 4) if decided else None,
            "baseline_s": round(baseline_s, 1), "elapsed_s": round(elapsed_s, 1),
            "survivors": sorted(survivors, key=lambda s: s["line"])}


def _run_deliberate(bug: dict, tree: Path) -> dict:
    """Put one deliberate bug into the copy, run its tests (all of them, not -x), take it out."""
    target = tree / bug["path"]
    original = target.read_text()
    if original.count(bug["old"]) != 1:
        raise SystemExit(f"{bug['path']}: the text to replace for {bug['what']!r} occurs "
                         f"{original.count(bug['old'])} times (the code moved? edit scripts/mutants.toml)")
    target.write_text(original.replace(bug["old"], bug["new"]))
    try:
        cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not ray",
               *bug["tests"]]
        r = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=900)
    finally:
        target.write_text(original)
    failed = sorted({line.split()[1] for line in r.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))})
    return {"what": bug["what"], "path": bug["path"], "caught": r.returncode != 0 and bool(failed),
            "failing_tests": failed}


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w./:=-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def _toml_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _text_report(results: list[dict], deliberate: list[dict] = ()) -> str:
    lines = []
    for d in deliberate:
        lines.append(f"deliberate: {d['what']} ({d['path']}): "
                     + (f"caught by {len(d['failing_tests'])} tests, e.g. {', '.join(d['failing_tests'][:3])}"
                        if d["caught"] else "NOT CAUGHT"))
    tot_s = tot_d = 0
    for r in results:
        d = r["killed"] + r["timeouts"] + r["survived"]
        tot_s += r["survived"]
        tot_d += d
        share = f"{100 * r['survival_share']:.1f} %" if r["survival_share"] is not None else "-"
        lines.append(f"{r['path']}: {r['mutants']} mutants (of {r['of']}): {r['killed']} killed, "
                     f"{r['timeouts']} timed out, {r['survived']} survived ({share}), {r['errors']} errors; "
                     f"{r['elapsed_s']:.0f} s")
        for s in r["survivors"]:
            lines.append(f"    {r['path']}:{s['line']} {s['operator'].removeprefix('core/')}  {s['source'][:90]}")
    if tot_d:
        lines.append(f"total: {tot_s} of {tot_d} mutants survived ({100 * tot_s / tot_d:.1f} %)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "out" / "mutants"), help="output folder")
    ap.add_argument("--config", default=str(CONFIG), help="modules and their tests (TOML)")
    ap.add_argument("--only", nargs="*", help="module paths to run (default: all in the config)")
    ap.add_argument("--sample", type=int, help="try a seeded random sample of N mutants per module")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deliberate-only", action="store_true", help="try only the deliberate bugs")
    ap.add_argument("--no-deliberate", action="store_true", help="skip the deliberate bugs")
    args = ap.parse_args(argv)
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        raise SystemExit('cosmic-ray is not installed: pip install -e ".[mutants]" (or make mutants)') from None
    cfg = _load_config(Path(args.config))
    operators = [re.compile(p) for p in cfg["operators"]]
    modules = [m for m in cfg["module"] if not args.only or m["path"] in args.only]
    if args.only and len(modules) != len(args.only):
        raise SystemExit(f"not in {args.config}: {sorted(set(args.only) - {m['path'] for m in modules})}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree = _copy_tree(out)
    _check_imports_from_copy(tree)
    deliberate = []
    if not args.no_deliberate:
        for bug in cfg.get("deliberate", []):
            if args.only and bug["path"] not in args.only:
                continue
            deliberate.append(_run_deliberate(bug, tree))
            print(_text_report([], deliberate[-1:]), end="", flush=True)
    results = []
    if not args.deliberate_only:
        for m in modules:
            results.append(_run_module(m, operators, tree, out, args.sample, args.seed))
            (out / "report.json").write_text(json.dumps({"deliberate": deliberate, "modules": results}, indent=1))
            (out / "report.txt").write_text(_text_report(results, deliberate))
    (out / "report.json").write_text(json.dumps({"deliberate": deliberate, "modules": results}, indent=1))
    (out / "report.txt").write_text(_text_report(results, deliberate))
    print(_text_report(results, deliberate), end="")
    if any(not d["caught"] for d in deliberate):
        print("some deliberate bugs were not caught", file=sys.stderr)
        return 1
    print(f"reports: {out / 'report.txt'}, {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
