#!/usr/bin/env python3
"""What each per-process cost of shardfeed does as a dataset grows: 100k and 1M tiny images by default.

For each format (WebDataset, LMDB) and size N, three fresh processes:

* ``pack``: :func:`shardfeed.convert.write_dataset` of N samples (one 8x8 PNG, labels 0-9; WebDataset
  shards of ``--max-count`` samples, so the shard count grows with N too);
* ``read``: ``open_dataset`` (``open``: the machine's first process, which parses ``manifest.json``;
  each dataset gets an empty manifest cache, ``SHARDFEED_MANIFEST_CACHE``), a ``make_loader`` (batch 256, ``num_workers=0``, raw samples,
  shuffled) and its first batch (``first batch``), its whole epoch (``epoch``; ``--no-epoch`` stops
  after the resume point), the ``state_dict()`` taken 200 batches in, and a new loader's first batch
  after ``load_state_dict`` of it (``first batch after resume``);
* ``open again``: ``open_dataset`` in another process (``open, another process``), which maps the
  parsed manifest the first one left (large manifests only);
* ``check``: :func:`shardfeed.convert.tools.check.check_dataset` (every shard or record, no decode).

Each cost is wall-clock seconds, and the growth of the process's peak resident set (``ru_maxrss``)
during that step, in MB. The growth exponent between two sizes is ``log(cost2 / cost1) / log(N2 / N1)``:
0 is a constant cost, 1 a linear one. Exponents of costs under 10 ms or 4 MB are left out (noise).

Usage::

    python scripts/bench_scale.py                         # 100k and 1M, about 1.5 minutes on 2 cores
    python scripts/bench_scale.py --large                 # and 10M (about 12 minutes, 35 GB of disk)
    python scripts/bench_scale.py --sizes 10000,100000 --json out/bench/scale.json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

BATCH = 256
RESUME_BATCHES = 200
COSTS = ("pack", "open", "open, another process", "first batch", "first batch after resume", "epoch", "check")
FORMATS = ("webdataset", "lmdb")
CLASSES = [str(i) for i in range(10)]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Steps:
    """Seconds and peak-RSS growth (MB) of named steps of this process."""

    def __init__(self) -> None:
        self.out: dict[str, dict] = {}

    def run(self, name: str, fn):
        peak, t = _peak_mb(), time.perf_counter()
        value = fn()
        self.out[name] = {"s": time.perf_counter() - t, "mb": _peak_mb() - peak}
        return value


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (40, 90, 160)).save(buf, format="PNG")
    return buf.getvalue()


def stage_pack(fmt: str, n: int, path: str, max_count: int) -> dict:
    from shardfeed.convert import write_dataset

    png = _png()
    steps = _Steps()
    samples = ({"image": png, "ext": "png", "label": i % 10} for i in range(n))
    steps.run("pack", lambda: write_dataset(samples, path, format=fmt, max_count=max_count, classes=CLASSES,
                                            map_size=max(1 << 30, n * 4096)))
    return steps.out


def stage_read(fmt: str, n: int, path: str, epoch: bool) -> dict:
    import shardfeed.readers.sources.lmdb_source  # noqa: F401  (imports, torch's included, are not the open's cost)
    import shardfeed.readers.sources.webdataset_source  # noqa: F401
    from shardfeed.readers import make_loader, open_dataset

    steps = _Steps()
    steps.run("open", lambda: open_dataset(path, decode=False))
    loader = make_loader(path, BATCH, num_workers=0, decode=False, seed=0)
    it = iter(loader)
    steps.run("first batch", lambda: next(it))
    state = {}

    def rest():
        for count, _ in enumerate(it, start=2):
            if count == RESUME_BATCHES:
                state.update(loader.state_dict())
                if not epoch:
                    return
        if not state:
            raise SystemExit(f"an epoch of {n} samples has fewer than {RESUME_BATCHES} batches of {BATCH}")

    t = time.perf_counter() - steps.out["first batch"]["s"]
    steps.run("epoch", rest)
    if epoch:
        steps.out["epoch"]["s"] = time.perf_counter() - t
    else:
        del steps.out["epoch"]
    resumed = make_loader(path, BATCH, num_workers=0, decode=False, seed=0)
    resumed.load_state_dict(state)
    steps.run("first batch after resume", lambda: next(iter(resumed)))
    return steps.out


def stage_open(fmt: str, n: int, path: str) -> dict:
    import shardfeed.readers.sources.lmdb_source  # noqa: F401  (as in stage_read)
    import shardfeed.readers.sources.webdataset_source  # noqa: F401
    from shardfeed.readers import open_dataset

    steps = _Steps()
    steps.run("open, another process", lambda: open_dataset(path, decode=False))
    return steps.out


def stage_check(fmt: str, n: int, path: str) -> dict:
    from shardfeed.convert.tools.check import check_dataset

    steps = _Steps()
    report = steps.run("check", lambda: check_dataset(path))
    if not report.ok:
        raise SystemExit(f"check found problems in {path}: {report.summary()}")
    return steps.out


def _stage(args: list[str], env: dict | None = None) -> dict:
    """Run one stage in a fresh process; its last output line is the JSON of its steps."""
    cmd = [sys.executable, os.path.abspath(__file__), "--stage", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if out.returncode != 0:
        raise SystemExit(f"stage {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(fmt: str, n: int, root: str, *, max_count: int, epoch: bool) -> dict:
    """Every cost of ``fmt`` at ``n`` samples: ``{cost: {"s", "mb"}}`` (the dataset deleted after)."""
    path = os.path.join(root, f"{fmt}-{n}")
    manifests = os.path.join(root, f"manifest-cache-{fmt}-{n}")
    env = dict(os.environ, SHARDFEED_MANIFEST_CACHE=manifests)
    try:
        res = _stage(["pack", fmt, str(n), path, str(max_count)])
        res.update(_stage(["read", fmt, str(n), path, "1" if epoch else "0"], env))
        res.update(_stage(["open", fmt, str(n), path], env))
        res.update(_stage(["check", fmt, str(n), path]))
    finally:
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(manifests, ignore_errors=True)
    return res


def exponent(a: float, b: float, n1: int, n2: int, floor: float) -> float | None:
    """``log(b / a) / log(n2 / n1)``; None when either cost is under ``floor`` (noise)."""
    if a < floor or b < floor:
        return None
    return math.log(b / a) / math.log(n2 / n1)


def table(results: dict, sizes: list[int]) -> str:
    """A markdown table: one row per format and cost, seconds and MB per size, exponents between sizes."""
    head = ["format", "cost"] + [f"{n:,}" for n in sizes]
    pairs = list(zip(sizes, sizes[1:]))
    head += [f"exp. {a:,}→{b:,} (s / MB)" for a, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fmt in FORMATS:
        for cost in COSTS:
            cells = [results.get((fmt, n), {}).get(cost) for n in sizes]
            if not any(cells):
                continue
            row = [fmt, cost] + [f"{c['s']:.3f} s, {c['mb']:.0f} MB" if c else "–" for c in cells]
            for (a, b), (ca, cb) in zip(pairs, zip(cells, cells[1:])):
                if not (ca and cb):
                    row.append("–")
                    continue
                es, em = exponent(ca["s"], cb["s"], a, b, 0.01), exponent(ca["mb"], cb["mb"], a, b, 4.0)
                row.append(" / ".join("–" if e is None else f"{e:.2f}" for e in (es, em)))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated sample counts (default 100k, 1M)")
    ap.add_argument("--large", action="store_true", help="add 10M samples (slow: about 12 minutes, 35 GB of disk)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: webdataset, lmdb")
    ap.add_argument("--max-count", type=int, default=1000, help="WebDataset samples per shard (default 1000)")
    ap.add_argument("--no-epoch", action="store_true", help="do not time a whole epoch")
    ap.add_argument("--dir", default=None, help="where the datasets are written (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stage:
        kind, fmt, n, path, *rest = args.stage
        if kind == "pack":
            out = stage_pack(fmt, int(n), path, int(rest[0]))
        elif kind == "read":
            out = stage_read(fmt, int(n), path, rest[0] == "1")
        elif kind == "open":
            out = stage_open(fmt, int(n), path)
        else:
            out = stage_check(fmt, int(n), path)
        print(json.dumps(out))
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",") if s} | ({10_000_000} if args.large else set()))
    formats = [f for f in args.formats.split(",") if f]
    results: dict = {}
    root = args.dir or tempfile.mkdtemp(prefix="shardfeed-scale-")
    os.makedirs(root, exist_ok=True)
    t0 = time.perf_counter()
    try:
        for fmt in formats:
            for n in sizes:
                results[(fmt, n)] = measure(fmt, n, root, max_count=args.max_count, epoch=not args.no_epoch)
                print(f"{fmt} {n:,}: " + ", ".join(f"{k} {v['s']:.3f} s / {v['mb']:.0f} MB"
                                                   for k, v in results[(fmt, n)].items()), flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\nbatch {BATCH}, num_workers=0, raw samples; resume state {RESUME_BATCHES} batches in; "
          f"WebDataset shards of {args.max_count}; {time.perf_counter() - t0:.0f} s in all\n")
    print(table(results, sizes))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([{"format": f, "num_samples": n, **r} for (f, n), r in results.items()], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
