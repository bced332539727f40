#!/usr/bin/env python3
"""The overhead of ``shardfeed.readers.watch`` on a training loop, as a share of a 20 ms step.

Three figures, each watched against plain:

1. per batch: a tight loop over in-memory batches (no step), watched minus plain, µs per batch
   (the two ``perf_counter`` calls, the bookkeeping, the wrapper's ``__next__``);
2. the background sampler: CPU seconds per wall second of the sampler thread (its own CPU
   clock) while a watch runs over a 2-worker ``DataLoader`` and sleeping steps (psutil reads of
   the main process and the workers every 50 ms, memory and I/O every 500 ms);
3. end to end: ``--steps`` steps of ``time.sleep(step)`` (a GPU-like step that leaves the CPU
   free) over a 2-worker ``DataLoader``, the wall time watched over plain (noisy: shown, not the
   verdict).

The overhead ratio printed is ``(per-batch µs + sampler CPU s per s x step s) / step s``; the
target is under 1 % of a 20 ms step.

Example::

    python scripts/bench_watch.py                   # 20 ms step
    python scripts/bench_watch.py --step-ms 20 --steps 300 --json out/bench_watch.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

__all__ = ["main"]


def _per_batch_us(n: int, rounds: int) -> tuple[float, float, float]:
    import torch

    from shardfeed.readers.measure.watch import watch

    batches = [(torch.zeros(2, 3), torch.zeros(2))] * n
    plain, watched = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _b in batches:
            pass
        plain.append((time.perf_counter() - t0) / n)
        w = watch(batches)
        t0 = time.perf_counter()
        for _b in w:
            pass
        watched.append((time.perf_counter() - t0) / n)
        w.close()
    p, q = statistics.median(plain), statistics.median(watched)
    return p * 1e6, q * 1e6, (q - p) * 1e6


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sampler_cpu_per_s(seconds: float, step_s: float, num_workers: int) -> float:
    """CPU seconds per second of the watch's sampler thread over a ``num_workers`` DataLoader,
    read from that thread's own CPU clock (``pthread_getcpuclockid``: ns resolution)."""
    import threading

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from shardfeed.readers.measure.watch import watch

    n = max(1, int(seconds / step_s))
    loader = DataLoader(TensorDataset(torch.zeros(n, 1)), batch_size=1, num_workers=num_workers,
                        persistent_workers=num_workers > 0)
    list(iter(loader))  # start the workers outside the measured span
    w = watch(loader)
    it = iter(w)
    next(it)
    thread = next(t for t in threading.enumerate() if t.name == "shardfeed-watch")
    clock = time.pthread_getcpuclockid(thread.ident)
    c0, t0 = time.clock_gettime(clock), time.perf_counter()
    for _b in it:
        time.sleep(step_s)
    c1, t1 = time.clock_gettime(clock), time.perf_counter()
    w.close()
    return (c1 - c0) / (t1 - t0)


def _end_to_end(steps: int, step_s: float, num_workers: int) -> tuple[float, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from shardfeed.readers.measure.watch import watch

    ds = TensorDataset(torch.zeros(steps * 4, 3, 8, 8), torch.zeros(steps * 4))

    def run(wrap):
        loader = DataLoader(ds, batch_size=4, num_workers=num_workers, persistent_workers=num_workers > 0)
        list(iter(loader))  # start-up outside the timed loop
        it = wrap(loader)
        t0 = time.perf_counter()
        for _b in it:
            time.sleep(step_s)
        dt = time.perf_counter() - t0
        if hasattr(it, "close"):
            it.close()
        return dt

    return run(lambda x: x), run(watch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=200, help="end-to-end steps")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--sampler-seconds", type=float, default=4.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    step_s = args.step_ms / 1000
    plain_us, watched_us, per_batch_us = _per_batch_us(20000, 5)
    sampler = _sampler_cpu_per_s(args.sampler_seconds, step_s, args.num_workers)
    e2e_plain, e2e_watched = _end_to_end(args.steps, step_s, args.num_workers)
    ratio = (per_batch_us / 1e6 + sampler * step_s) / step_s
    out = {"step_ms": args.step_ms, "per_batch_plain_us": plain_us, "per_batch_watched_us": watched_us,
           "per_batch_overhead_us": per_batch_us, "sampler_cpu_s_per_s": sampler,
           "end_to_end_plain_s": e2e_plain, "end_to_end_watched_s": e2e_watched,
           "end_to_end_ratio": e2e_watched / e2e_plain, "overhead_ratio": ratio, "cpus": os.cpu_count()}
    print(f"per batch: {per_batch_us:.1f} µs more than a plain loop ({plain_us:.2f} → {watched_us:.2f} µs)")
    print(f"sampler: {sampler * 1e3:.2f} ms of CPU per second")
    print(f"end to end ({args.steps} steps of {args.step_ms:g} ms, {args.num_workers} workers): "
          f"{e2e_plain:.3f} s plain, {e2e_watched:.3f} s watched ({e2e_watched / e2e_plain:.4f}x)")
    print(f"overhead: {ratio:.3%} of a {args.step_ms:g} ms step (target < 1 %): {'met' if ratio < 0.01 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
