#!/usr/bin/env python3
"""One rank's epoch order of a shuffled random-access source: the list shuffle against the
per-position permutation, side by side.

* ``list``: ``random.Random(seed + epoch).shuffle(list(range(N)))``, then the rank's range of it
  (the epoch order of version 1, written here as the baseline).
* ``permutation``: :func:`shardfeed.readers.order.epoch.positions_to_indices` over the rank's positions
  only (an ``int64`` array of the rank's whole share, as a worker's read-ahead needs at most).
* ``first chunk``: what a sampler computes before it hands out the first index
  (:data:`~shardfeed.readers.order.permutation.CHUNK` positions).

Each case runs in a fresh process. Time is wall-clock seconds; memory is the growth of the process's
peak resident set (``ru_maxrss``) over its size before the case.

Usage::

    python scripts/bench_epoch_order.py                       # N = 1M and 10M, one rank of 1
    python scripts/bench_epoch_order.py --sizes 1000000 --world-size 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CASE = r"""
import json, random, resource, sys, time
import numpy as np
from shardfeed.readers.order.epoch import positions_to_indices, rank_span
from shardfeed.readers.order.permutation import CHUNK
kind, n, ws = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seed, epoch = 0, 1
start, stop = rank_span(n, 0, ws)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if kind == "list":
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    mine = [order[p % n] for p in range(start, stop)]
    count = len(mine)
elif kind == "permutation":
    mine = positions_to_indices(n, np.arange(start, stop, dtype=np.int64), seed=seed, epoch=epoch, shuffle=True)
    count = len(mine)
else:
    mine = positions_to_indices(n, np.arange(start, min(stop, start + CHUNK), dtype=np.int64), seed=seed,
                                epoch=epoch, shuffle=True)
    count = len(mine)
took = time.perf_counter() - t
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"seconds": took, "peak_growth_mb": grown / 1024, "count": count}))
"""

KINDS = ("list", "permutation", "first chunk")


def _run(kind: str, n: int, world_size: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CASE, kind, str(n), str(world_size)], check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,10000000", help="comma-separated sample counts N")
    ap.add_argument("--world-size", type=int, default=1, help="ranks; rank 0's order is computed (default 1)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows = []
    print(f"rank 0 of {args.world_size}: seconds / peak memory growth (MB)")
    print(f"{'N':>12}  " + "  ".join(f"{k:>22}" for k in KINDS))
    for n in sizes:
        res = {kind: _run(kind, n, args.world_size) for kind in KINDS}
        rows.append({"num_samples": n, "world_size": args.world_size, **res})
        print(f"{n:>12,}  " + "  ".join(f"{r['seconds']:>9.3f} s {r['peak_growth_mb']:>7.1f} MB" for r in res.values()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
