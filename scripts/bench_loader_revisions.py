#!/usr/bin/env python3
"""The loader of this checkout against the one at another git revision: CPU seconds per epoch.

Each round runs one epoch of ``make_loader(DATASET, batch_size, num_workers=0, image_size=S)``
(decoded) and one of ``decode=False`` (the raw read) in a fresh process per revision, in
alternating order; the figure is the CPU time of that process for the epoch (``time.process_time``:
steadier than wall time on a busy machine, and with ``num_workers=0`` all of the loader's work),
the ratio the median of the per-round ratios ``baseline / current`` (above 1: this checkout is
faster). The baseline's ``convert/`` and ``readers/`` come from ``git archive`` into a temporary
folder, put first on ``PYTHONPATH`` as the ``shardfeed`` package.

Usage::

    python scripts/bench_loader_revisions.py out/throughput/wds --baseline main --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent

_EPOCH = """
import json, sys, time
from shardfeed.readers import make_loader
src, bs, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = {"readers": list(sys.modules["shardfeed.readers"].__path__)[0]}
for name, kw in (("decoded", dict(image_size=size)), ("raw", dict(decode=False))):
    loader = make_loader(src, bs, num_workers=0, **kw)
    t0 = time.process_time()
    n = sum(len(b[1]) if name == "decoded" else len(b) for b in loader)
    out[name] = {"cpu_s": time.process_time() - t0, "samples": n}
print(json.dumps(out))
"""


def _baseline_tree(rev: str, into: Path) -> Path:
    """``into/shardfeed/{convert,readers}`` from ``git archive rev``; returns the path entry."""
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(["git", "archive", rev, "convert", "readers"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "shim" / "shardfeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for part in ("convert", "readers"):
        (pkg / part).symlink_to(src / part)
    return into / "shim"


def _epoch(dataset: str, batch_size: int, image_size: int, path_entry: str | None) -> dict:
    env = dict(os.environ)
    if path_entry:
        env["PYTHONPATH"] = path_entry + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", _EPOCH, dataset, str(batch_size), str(image_size)], env=env,
                         check=True, capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="a packed dataset (WebDataset or LMDB) or an image folder")
    ap.add_argument("--baseline", default="main", help="git revision to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (default: 5; one warm-up first)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=64)
    args = ap.parse_args(argv)
    figures: dict[str, dict[str, list[float]]] = {"baseline": {"decoded": [], "raw": []},
                                                  "current": {"decoded": [], "raw": []}}
    with tempfile.TemporaryDirectory() as tmp:
        shim = str(_baseline_tree(args.baseline, Path(tmp)))
        runs = {"baseline": shim, "current": None}
        for r in range(-1, args.rounds):
            order = ["baseline", "current"] if r % 2 == 0 else ["current", "baseline"]
            for name in order:
                res = _epoch(args.dataset, args.batch_size, args.image_size, runs[name])
                if r >= 0:
                    for kind in ("decoded", "raw"):
                        figures[name][kind].append(res[kind]["cpu_s"])
                samples = res["decoded"]["samples"]
                if r < 0:
                    print(f"{name}: readers from {res['readers']}")
    print(f"{samples:,} samples; CPU seconds per epoch (median of {args.rounds} rounds), num_workers=0")
    print(f"{'epoch':<8} {'baseline':>9} {'current':>9} {'baseline/current':>17}")
    for kind in ("decoded", "raw"):
        b, c = figures["baseline"][kind], figures["current"][kind]
        ratio = statistics.median([x / y for x, y in zip(b, c) if y > 0])
        print(f"{kind:<8} {statistics.median(b):>8.3f}s {statistics.median(c):>8.3f}s {ratio:>16.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
