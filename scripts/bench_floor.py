#!/usr/bin/env python3
"""What any Python packer pays before writing a byte: the floor under ``shardfeed pack``'s time.

Run by ``scripts/bench.py`` next to the pack comparison, on the same folder, as a fresh process
(page cache warm). Prints one JSON object, every figure in seconds:

* ``python_start_s``: a bare interpreter (``python -c pass``), as a child process.
* ``cli_start_s``: ``shardfeed --help`` (interpreter, Click, shardfeed's CLI imports).
* ``stat_loop_s``: ``os.stat`` of every file (what a scan must do to plan shards up front).
* ``read_loop_s``: ``os.open``, ``os.fstat``, ``os.read``, ``os.close`` of every file: the
  least a reader of separate files does per file in Python.
* ``sha256_s``: sha256 over as many bytes as the shards hold (the manifest's ``sha256``).
* ``write_s``: writing those bytes in 1 MiB blocks to a new file (page cache), ``fsync_s`` then
  syncing it to the disk.
* ``lmdb_put_loop_s``: the least an LMDB packer in Python does: read every file and
  ``txn.put`` its bytes as they are (no record encoding, no CRC), appending in key order,
  committing every 64 MiB with LMDB's default durable commits, then ``env.sync``.

Usage: ``bench_floor.py SRC OUT_DIR SHARD_BYTES``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

__all__ = ["main"]


def _best(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _lmdb_put_loop(paths: list[str], db_dir: str) -> float:
    import shutil

    import lmdb

    shutil.rmtree(db_dir, ignore_errors=True)
    os.sync()
    t0 = time.perf_counter()
    env = lmdb.open(db_dir, map_size=1 << 40, readahead=False)
    txn = env.begin(write=True)
    pending = 0
    for i, p in enumerate(paths):
        with open(p, "rb") as fh:
            data = fh.read()
        txn.put(b"%09d" % i, data, append=True)
        pending += len(data)
        if pending >= 64 << 20:
            txn.commit()
            txn = env.begin(write=True)
            pending = 0
    txn.commit()
    env.sync(True)
    env.close()
    seconds = time.perf_counter() - t0
    shutil.rmtree(db_dir, ignore_errors=True)
    return seconds


def main(argv: list[str]) -> int:
    src, out_dir, shard_bytes = argv[0], argv[1], int(argv[2])
    paths = []
    for c in sorted(os.listdir(src)):
        d = os.path.join(src, c)
        if os.path.isdir(d):
            paths += [os.path.join(d, n) for n in sorted(os.listdir(d))]
    shardfeed = os.path.join(os.path.dirname(sys.executable), "shardfeed")

    def stat_loop():
        for p in paths:
            os.stat(p)

    def read_loop():
        o, f, r, c, rd = os.open, os.fstat, os.read, os.close, os.O_RDONLY
        for p in paths:
            fd = o(p, rd)
            r(fd, f(fd).st_size)
            c(fd)

    block = os.urandom(1 << 20)
    n_blocks = max(1, shard_bytes >> 20)

    def sha():
        h = hashlib.sha256()
        for _ in range(n_blocks):
            h.update(block)

    out = {"num_files": len(paths), "shard_bytes": shard_bytes,
           "python_start_s": _best(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)),
           "cli_start_s": _best(lambda: subprocess.run([shardfeed, "--help"], check=True, stdout=subprocess.DEVNULL)),
           "stat_loop_s": _best(stat_loop), "read_loop_s": _best(read_loop), "sha256_s": _best(sha)}
    target = os.path.join(out_dir, "floor.bin")
    os.makedirs(out_dir, exist_ok=True)
    os.sync()
    t0 = time.perf_counter()
    with open(target, "wb", buffering=0) as f:
        for _ in range(n_blocks):
            f.write(block)
        t1 = time.perf_counter()
        os.fsync(f.fileno())
        t2 = time.perf_counter()
    os.unlink(target)
    out.update(write_s=t1 - t0, fsync_s=t2 - t1)
    out["lmdb_put_loop_s"] = _lmdb_put_loop(paths, os.path.join(out_dir, "floor-lmdb"))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
