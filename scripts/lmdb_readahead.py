#!/usr/bin/env python
"""Measure LMDB ``readahead`` on/off for cold-cache reads, as a map-style Dataset reads.

For each setting and order (shuffled, sequential) the page cache of ``data.mdb`` is dropped with
``posix_fadvise(DONTNEED)``, then every record is read once (value copied out, CRC checked).
Prints records/s and MB/s; ``--json PATH`` writes them.

    .venv/bin/python scripts/lmdb_readahead.py out/demo/lmdb [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from shardfeed.readers.format import decode_record, format_key, key_width, load_manifest
from shardfeed.readers.lmdb_io import open_lmdb_readonly


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(root: Path, readahead: bool, order: list[int], width: int) -> tuple[float, int]:
    evict(root / "data.mdb")
    t0 = time.perf_counter()
    env = open_lmdb_readonly(root, readahead=readahead)
    nbytes = 0
    with env.begin(buffers=False) as txn:
        for i in order:
            rec = decode_record(txn.get(format_key(i, width).encode()))
            nbytes += len(rec["data"])
    env.close()
    return time.perf_counter() - t0, nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    m = load_manifest(args.root)
    n, width = m.num_samples, key_width(m.num_samples)
    shuffled = list(range(n))
    random.Random(0).shuffle(shuffled)
    results = []
    for order_name, order in (("shuffled", shuffled), ("sequential", list(range(n)))):
        for readahead in (True, False):
            times = []
            for _ in range(args.repeats):
                dt, nbytes = run(args.root, readahead, order, width)
                times.append(dt)
            med = statistics.median(times)
            r = {"order": order_name, "readahead": readahead, "median_s": round(med, 4),
                 "records_per_s": round(n / med, 1), "mb_per_s": round(nbytes / 1e6 / med, 2)}
            results.append(r)
            print(f"{order_name:10s} readahead={str(readahead):5s}  {r['records_per_s']:10,.0f} records/s  "
                  f"{r['mb_per_s']:8.1f} MB/s  (median of {args.repeats}, cold cache)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
