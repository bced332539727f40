"""Local vs Ray pack time on the sample folder: what ``--executor ray`` costs per shard.

For several shard sizes (``--max-counts``) the same folder is packed to WebDataset with the local
process pool and with Ray (a local Ray instance with the same number of CPUs, started once and
timed on its own), each ``--repeats`` times after a warm-up pack that fills the page cache; the
median times are compared. The Ray overhead per shard is the slope of (Ray time - local time)
against the number of shards (least squares over the shard sizes), the fixed overhead per pack
its intercept; the start-up of a local Ray instance is reported apart (a cluster is started once,
not per pack). On one machine Ray cannot be faster than the process pool: this measures its cost.

    python scripts/bench_ray.py [--src data/sample] [--workers 2] [--json out/bench/ray.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def _timed_pack(src: Path, out: Path, options) -> tuple[float, object]:
    from shardfeed.convert.write.pack import pack

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    report = pack(src, out, options)
    return time.perf_counter() - t0, report


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line ``y = a + b x``; returns (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="data/sample", help="image folder (default: data/sample)")
    ap.add_argument("--workers", type=int, default=2, help="local processes = CPUs of the Ray instance")
    ap.add_argument("--max-counts", default="1000,200,50,25", help="samples per shard to try (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    try:
        import ray
    except ImportError:
        print("bench_ray: Ray is not installed: pip install 'shardfeed[ray]'", file=sys.stderr)
        return 2
    from shardfeed.convert.write.pack import PackOptions

    src = Path(args.src)
    if not src.is_dir():
        print(f"bench_ray: {src}: no such folder (make demo builds data/sample)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="shardfeed-bench-ray-"))
    try:
        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        ray_start_s = time.perf_counter() - t0
        _timed_pack(src, tmp / "warm", PackOptions(max_count=200, workers=args.workers))  # page cache
        _timed_pack(src, tmp / "warm", PackOptions(max_count=200, workers=args.workers, executor="ray"))  # workers
        rows = []
        for max_count in (int(x) for x in args.max_counts.split(",")):
            times = {"local": [], "ray": []}
            for _ in range(args.repeats):
                for ex in ("local", "ray"):
                    s, report = _timed_pack(src, tmp / ex, PackOptions(max_count=max_count, workers=args.workers,
                                                                       executor=ex))
                    times[ex].append(s)
            same = ({p.name: p.read_bytes() for p in (tmp / "local").iterdir()}
                    == {p.name: p.read_bytes() for p in (tmp / "ray").iterdir()})
            row = {"max_count": max_count, "num_shards": report.num_shards, "num_samples": report.num_samples,
                   "local_s": statistics.median(times["local"]), "ray_s": statistics.median(times["ray"]),
                   "identical": same}
            row["overhead_per_shard_s"] = (row["ray_s"] - row["local_s"]) / row["num_shards"]
            rows.append(row)
        a, b = _fit([r["num_shards"] for r in rows], [r["ray_s"] - r["local_s"] for r in rows])
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"source": str(src), "workers": args.workers, "ray_version": ray.__version__,
              "ray_local_start_s": round(ray_start_s, 2), "rows": rows,
              "ray_overhead_per_shard_s": round(b, 4), "ray_overhead_per_pack_s": round(a, 3)}
    print(f"pack {rows[0]['num_samples']} images from {src}, {args.workers} workers/CPUs, median of {args.repeats}; "
          f"Ray {ray.__version__}, local instance start {ray_start_s:.1f} s (not included below)")
    print(f"{'max_count':>9} {'shards':>6} {'local s':>8} {'ray s':>8} {'ray/local':>9} {'extra s/shard':>13} same")
    for r in rows:
        print(f"{r['max_count']:>9} {r['num_shards']:>6} {r['local_s']:>8.2f} {r['ray_s']:>8.2f} "
              f"{r['ray_s'] / r['local_s']:>9.2f} {r['overhead_per_shard_s']:>13.4f} "
              f"{'yes' if r['identical'] else 'NO'}")
    print(f"Ray overhead: {b * 1000:.1f} ms per shard (slope), {a:.2f} s per pack (intercept)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
