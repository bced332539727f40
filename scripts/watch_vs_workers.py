#!/usr/bin/env python3
"""``watch``'s "more workers" prediction against the loop run with more workers, on emulated storage.

A user-written map-style ``Dataset`` over the image files of a folder (open, read, PIL decode,
resize to 32 px) feeds a plain ``DataLoader``; the step sleeps ``--step-ms`` (a GPU-like step that
leaves the CPU free). For each latency (scripts/storage_emulator.py, per open and per read request)
the loop runs under :func:`shardfeed.readers.watch` with ``--num-workers``, whose diagnosis and
advice are read, then again with the worker count the advice names; the table gives the batches
per second predicted (:func:`~shardfeed.readers.measure.watch.predict_batch_interval`) and
measured. Emulated storage: figures of an emulation, not of NFS or a bucket.

Example::

    python scripts/watch_vs_workers.py --data data/sample --latencies 2,10
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storage import prepare_data  # noqa: E402
from storage_emulator import StorageEmulator, fuse_unavailable_reason  # noqa: E402
from validate_watch import FilesDataset  # noqa: E402  (a user's map-style Dataset over image files)

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _run(paths, workers: int, args):
    from torch.utils.data import DataLoader

    from shardfeed.readers import watch

    loader = DataLoader(FilesDataset(paths), batch_size=args.batch_size, num_workers=workers, shuffle=True)
    w = watch(loader)
    for n, _ in enumerate(w):
        time.sleep(args.step_ms / 1000)
        if n + 1 >= args.batches:
            break
    rep = w.report()
    w.close()
    t = rep.t_wait_s["mean"] + rep.t_step_s["mean"]
    return rep, 1 / t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "data" / "sample")
    p.add_argument("--work", type=Path, default=Path("/tmp/shardfeed-watch-vs-workers"))
    p.add_argument("--latencies", default="2,10")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--step-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    reason = fuse_unavailable_reason()
    if reason:
        print(f"watch_vs_workers: {reason}", file=sys.stderr)
        return 2
    from shardfeed.readers.measure.watch import predict_batch_interval

    data = prepare_data(args.data, args.work)
    rows = []
    for lat in (float(x) for x in args.latencies.split(",")):
        with StorageEmulator(data / "folder", open_ms=lat, read_ms=lat) as emu:
            paths = sorted(p for p in emu.mountpoint.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
            rep, rate = _run(paths, args.num_workers, args)
            advice = next((a for a in rep.diagnosis["advice"] if a.startswith(f"num_workers={args.num_workers} → ")),
                          None)
            if advice is None:
                rows.append((lat, rep.diagnosis["kind"], rate, None, None, None))
                continue
            more = int(re.match(r"num_workers=\d+ → (\d+)", advice).group(1))
            per = rep.workers["per_worker"]
            cpu_per_batch = sum(x["cpu_s"] for x in per) / max(rep.batches, 1)
            predicted = 1 / predict_batch_interval(args.num_workers, more, rep.t_wait_s["mean"], rep.t_step_s["mean"],
                                                   cpu_per_batch, rep.system["cpu_count"])
            _, measured = _run(paths, more, args)
            rows.append((lat, rep.diagnosis["kind"], rate, more, predicted, measured))
    print(f"watch's advice checked: {args.batches} batches of {args.batch_size}, {args.step_ms:g} ms step, "
          f"emulated latency per open and per read request\n")
    print("| latency | diagnosis | batches/s now | advised num_workers | predicted batches/s | measured batches/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for lat, kind, rate, more, pred, meas in rows:
        print(f"| {lat:g} ms | {kind} | {rate:.1f} (num_workers={args.num_workers}) | {more or '-'} | "
              f"{'-' if pred is None else f'{pred:.1f}'} | {'-' if meas is None else f'{meas:.1f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
