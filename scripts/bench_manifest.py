"""Open a large manifest: parse time and memory per process, with and without the parsed-manifest cache.

Writes a WebDataset ``manifest.json`` of N shard entries (1,000 samples each, names, hashes, offset
indexes and extension counts as ``pack`` writes them) and loads it with
``load_manifest(check_files=False)`` in fresh processes:

* ``json``: the cache off (``SHARDFEED_MANIFEST_CACHE=off``): every process parses and validates;
* ``first``: the first process of a node (parses, validates, writes the compact form);
* ``shared``: every later process (maps the compact form).

Prints, per size, each mode's seconds, RSS growth and heap growth (``Private_Dirty``: memory of
this process alone; RSS also counts the mapped table, page cache that the node's processes share),
and ``json / shared``.

    python scripts/bench_manifest.py                   # 10,000 and 100,000 shards (10M, 100M samples)
    python scripts/bench_manifest.py --shards 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time
import numpy  # imported by every reader (torch) before a manifest is opened
from shardfeed.readers.storage.local_manifest import load_manifest

def mem():
    rss = private = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k == "Rss":
                rss = int(v.split()[0])
            elif k == "Private_Dirty":
                private += int(v.split()[0])
    return rss * 1024, private * 1024

r0, p0 = mem()
t0 = time.perf_counter()
m = load_manifest(sys.argv[1], check_files=False)
dt = time.perf_counter() - t0
r1, p1 = mem()
assert len(m.shards) == int(sys.argv[2])
print(json.dumps({"s": dt, "rss": r1 - r0, "private": p1 - p0, "table": type(m.shards).__name__}))
"""


def write_manifest(folder: str, shards: int) -> int:
    """``folder/manifest.json`` with ``shards`` entries; returns its size in bytes."""
    entries = [{"name": f"shard-{i:06d}.tar", "num_samples": 1000, "num_bytes": 52_000_000 + i,
                "sha256": hashlib.sha256(b"s%d" % i).hexdigest(), "index": f"shard-{i:06d}.sfidx",
                "index_sha256": hashlib.sha256(b"i%d" % i).hexdigest(), "extensions": {"jpg": 1000}}
               for i in range(shards)]
    doc = {"format": "webdataset", "version": 2, "created_by": "shardfeed bench", "num_samples": 1000 * shards,
           "classes": [f"n{c:08d}" for c in range(1000)], "class_to_idx": {f"n{c:08d}": c for c in range(1000)},
           "shards": entries, "skipped": [], "options": {"shard_size": "50MB"}, "files": {},
           "extensions": {"jpg": 1000 * shards}}
    raw = (json.dumps(doc, indent=1) + "\n").encode()
    with open(os.path.join(folder, "manifest.json"), "wb") as f:
        f.write(raw)
    return len(raw)


def run_child(folder: str, shards: int, cache: str) -> dict:
    env = {**os.environ, "SHARDFEED_MANIFEST_CACHE": cache}
    out = subprocess.run([sys.executable, "-c", _CHILD, folder, str(shards)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=2, help="processes per mode (the best time is shown)")
    args = ap.parse_args()
    print(f"{'shards':>8} {'JSON MB':>8} {'mode':>7} {'s':>7} {'RSS MB':>7} {'heap MB':>10}")
    for shards in args.shards:
        with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as cache:
            size = write_manifest(data, shards)
            rows = {"json": [run_child(data, shards, "off") for _ in range(args.repeat)],
                    "first": [run_child(data, shards, cache)]}
            rows["shared"] = [run_child(data, shards, cache) for _ in range(args.repeat)]
            best = {}
            for mode, got in rows.items():
                b = min(got, key=lambda r: r["s"])
                best[mode] = b
                print(f"{shards:>8} {size / 1e6:>8.1f} {mode:>7} {b['s']:>7.3f} {b['rss'] / 1e6:>7.1f} "
                      f"{b['private'] / 1e6:>10.1f}")
            j, s = best["json"], best["shared"]
            print(f"{shards:>8} {'':>8} {'json/shared':>11}: time x{j['s'] / s['s']:.1f}, RSS x"
                  f"{j['rss'] / max(s['rss'], 1):.1f}, heap x{j['private'] / max(s['private'], 1):.1f}")


if __name__ == "__main__":
    main()
