#!/usr/bin/env python3
"""Measure LMDB ``readahead`` on/off for cold, map-style (random order) reads of a shardfeed DB.

For each setting the database file is evicted from the page cache (``posix_fadvise(DONTNEED)``),
then a fresh process opens it with :func:`shardfeed.readers.storage.lmdb_io.open_lmdb_readonly`, lists the
sample keys, and reads a seeded-shuffled share of the records (as one ``DataLoader`` worker of a
shuffled epoch does), decoding each record with its CRC check. Reported per run: records/s, MB/s
of image bytes, and the bytes the process really fetched from storage (``/proc/self/io``
``read_bytes``), which shows the read amplification of the kernel's read-around.

Examples::

    python scripts/measure_lmdb_readahead.py out/demo/lmdb                  # the whole epoch
    python scripts/measure_lmdb_readahead.py /tmp/big-lmdb --fraction 0.05  # 5 % of a big DB
    python scripts/measure_lmdb_readahead.py --make-synthetic /tmp/big-lmdb --num 20000 --size 110000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

__all__ = ["evict", "read_run", "main"]


def evict(path: str) -> None:
    """Drop ``path``'s clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def read_run(db: str, readahead: bool, fraction: float, order: str, seed: int) -> dict:
    """One measurement in this process (call it in a fresh process after :func:`evict`)."""
    from shardfeed.readers.format.manifest import decode_record
    from shardfeed.readers.storage.lmdb_io import is_reserved_key, open_lmdb_readonly

    io0 = _io_read_bytes()
    t0 = time.perf_counter()
    env = open_lmdb_readonly(db, readahead=readahead)
    with env.begin() as txn:
        keys = [bytes(k) for k in txn.cursor().iternext(values=False) if not is_reserved_key(k)]
    t_keys = time.perf_counter() - t0
    io_keys = _io_read_bytes()
    if order == "shuffle":
        random.Random(seed).shuffle(keys)
    keys = keys[: max(1, int(len(keys) * fraction))]
    # Measure the reads alone: unmap, evict what listing the keys brought in, reopen.
    env.close()
    evict(os.path.join(db, "data.mdb"))
    env = open_lmdb_readonly(db, readahead=readahead)
    io1 = _io_read_bytes()
    t1 = time.perf_counter()
    nbytes = 0
    with env.begin(buffers=True) as txn:
        for k in keys:
            nbytes += len(decode_record(txn.get(k), source=k.decode())["data"])
    dt = time.perf_counter() - t1
    io2 = _io_read_bytes()
    env.close()
    return {"readahead": readahead, "records": len(keys), "seconds": round(dt, 4),
            "records_per_s": round(len(keys) / dt, 1), "image_mb_per_s": round(nbytes / 1e6 / dt, 1),
            "image_mb": round(nbytes / 1e6, 2), "storage_read_mb": round((io2 - io1) / 1e6, 2),
            "key_list_s": round(t_keys, 4), "key_list_storage_read_mb": round((io_keys - io0) / 1e6, 2)}


def make_synthetic(out: str, num: int, size: int) -> None:
    """A shardfeed LMDB of ``num`` incompressible records of ~``size`` bytes (ImageNet-like JPEGs)."""
    from shardfeed.convert.writers.lmdb import LmdbWriter
    from shardfeed.readers.format.manifest import Sample, format_key

    rng = random.Random(0)
    with LmdbWriter(out, classes=[f"c{i}" for i in range(10)], expected_bytes=num * size) as w:
        for i in range(num):
            n = max(1000, int(rng.gauss(size, size / 3)))
            w.write(Sample(format_key(i), os.urandom(n), "jpg", i % 10, {"path": f"c{i % 10}/{i}.jpg",
                                                                         "class": f"c{i % 10}"}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("db", nargs="?", help="a shardfeed LMDB dataset folder")
    p.add_argument("--fraction", type=float, default=1.0, help="share of the records to read (default all)")
    p.add_argument("--order", choices=["shuffle", "sequential"], default="shuffle")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--make-synthetic", metavar="OUT", help="write a synthetic DB to OUT and exit")
    p.add_argument("--num", type=int, default=20000)
    p.add_argument("--size", type=int, default=110000, help="mean record image bytes (synthetic)")
    p.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        db, ra, frac, seed = args._child
        print(json.dumps(read_run(db, ra == "1", float(frac), args.order, int(seed))))
        return 0
    if args.make_synthetic:
        make_synthetic(args.make_synthetic, args.num, args.size)
        return 0
    if not args.db:
        p.error("give a database folder")
    data = os.path.join(args.db, "data.mdb")
    results = {True: [], False: []}
    for rep in range(args.repeats):
        for ra in (True, False):
            evict(data)
            out = subprocess.run([sys.executable, __file__, "--order", args.order, "--_child", args.db,
                                  "1" if ra else "0", str(args.fraction), str(rep)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout)
            results[ra].append(r)
            print(json.dumps(r), file=sys.stderr)
    summary = {}
    for ra, runs in results.items():
        summary[f"readahead={ra}"] = {
            "records": runs[0]["records"],
            "median_records_per_s": statistics.median(r["records_per_s"] for r in runs),
            "median_image_mb_per_s": statistics.median(r["image_mb_per_s"] for r in runs),
            "median_storage_read_mb": statistics.median(r["storage_read_mb"] for r in runs),
            "median_key_list_s": statistics.median(r["key_list_s"] for r in runs),
            "median_key_list_storage_read_mb": statistics.median(r["key_list_storage_read_mb"] for r in runs),
            "image_mb": runs[0]["image_mb"],
        }
    print(json.dumps({"db": args.db, "db_mb": round(os.path.getsize(data) / 1e6, 1), "order": args.order,
                      "fraction": args.fraction, **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
