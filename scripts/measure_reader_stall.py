#!/usr/bin/env python3
"""The data stall of one WebDataset or LMDB reader on **emulated** slow storage, without decoding.

Mounts ``DATA`` through ``scripts/storage_emulator.py`` (``--ms`` per open and per read request)
and reads every sample once in one process (``open_dataset(mount, decode=False)``; LMDB by batches
of 64 through ``__getitems__``, as a loader asks), sleeping ``--per-sample-ms`` after each sample
in place of decoding (a sleep, so other processes' load on the CPUs changes the figure little).
Prints, per round: the wall time, the ideal (samples x per-sample time), the time spent waiting
for samples (the data stall), their ratio ideal / wall, and the requests the mount served at once;
with the load average beside each line. The figure is an emulation, not a measurement of NFS or
of a bucket.

    .venv/bin/python scripts/measure_reader_stall.py /tmp/perf_data/inet2-wds --ms 10 --per-sample-ms 1.5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a packed WebDataset or LMDB directory (local)")
    p.add_argument("--ms", type=float, default=10.0, help="emulated latency per open and per read request")
    p.add_argument("--per-sample-ms", type=float, default=1.5, help="sleep per sample (the decoder's time)")
    p.add_argument("--rounds", type=int, default=2, help="passes over the dataset (each on a fresh mount)")
    p.add_argument("--max-background", type=int, default=64,
                   help="the mount's kernel limit on background requests (0: the kernel's default, 12)")
    p.add_argument("--lmdb-records", type=int, default=None,
                   help="LMDB: records read ahead per batch (LMDBSource.read_ahead_records; 0: none)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from storage_emulator import StorageEmulator

    from shardfeed.readers import open_dataset
    from shardfeed.readers.storage.lmdb_io import close_environments

    cost = args.per_sample_ms / 1000
    rounds = []
    for r in range(args.rounds):
        with StorageEmulator(args.data, open_ms=args.ms, read_ms=args.ms,
                             max_background=args.max_background or None) as emu:
            ds = open_dataset(emu.mountpoint, decode=False, shuffle=True, seed=r)
            batched = hasattr(ds, "__getitems__")
            if batched and args.lmdb_records is not None:
                ds.read_ahead_records = args.lmdb_records
            n, waits = 0, 0.0
            t0 = time.perf_counter()
            if batched:
                order = list(range(len(ds)))
                random.Random(r).shuffle(order)
                for b in range(0, len(order), 64):
                    tw = time.perf_counter()
                    got = ds.__getitems__(order[b:b + 64])
                    waits += time.perf_counter() - tw
                    for _ in got:
                        n += 1
                        time.sleep(cost)
            else:
                it = iter(ds)
                while True:
                    tw = time.perf_counter()
                    try:
                        next(it)
                    except StopIteration:
                        break
                    waits += time.perf_counter() - tw
                    n += 1
                    time.sleep(cost)
            wall = time.perf_counter() - t0
            stats = emu.stats()
            del ds
            close_environments([emu.mountpoint])  # LMDB's map of data.mdb, so that the mount can go
        res = {"samples": n, "wall_s": round(wall, 3), "ideal_s": round(n * cost, 3), "stall_s": round(waits, 3),
               "ideal_over_wall": round(n * cost / wall, 3), "max_in_flight": stats["max_in_flight"],
               "reads": stats["reads"], "load_avg_1min": round(os.getloadavg()[0], 2)}
        rounds.append(res)
        print(f"round {r + 1}: {n} samples, wall {wall:.2f} s, ideal {n * cost:.2f} s, stall {waits:.2f} s, "
              f"ideal/wall {n * cost / wall:.3f}, in flight <= {stats['max_in_flight']}, "
              f"load {res['load_avg_1min']}  ({emu.describe()})", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"data": str(args.data), "ms": args.ms, "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
