#!/usr/bin/env python3
"""The pack driver's memory per file: the scan and the plan of an image folder, by ``tracemalloc``.

Writes a class folder of N tiny files named like ImageNet's (``n01440764/n01440764_10026.JPEG``,
100 classes) into a temporary folder, unless ``--src`` names one. Then, in this process:
``scan_image_folder``, ``plan_samples`` (shuffled) and ``plan_shards`` (1,000 samples a shard).
Prints the bytes a file held after the scan and after the plan, and the peak of each step.
The shards are not written: their writing holds one shard at a time.

Usage::

    python scripts/bench_pack_driver.py                    # 100,000 files (~10 s)
    python scripts/bench_pack_driver.py --files 1000000    # 1M files (a few minutes, 1M inodes)
    python scripts/bench_pack_driver.py --src ~/data/train
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import tracemalloc

CLASSES = 100


def make_folder(root: str, n: int) -> None:
    """``n`` files of 8 bytes in :data:`CLASSES` class folders below ``root``."""
    per_class = -(-n // CLASSES)
    for c in range(CLASSES):
        name = f"n{1440764 + c:08d}"
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        for i in range(min(per_class, n - c * per_class)):
            fd = os.open(os.path.join(folder, f"{name}_{i * 7 + 10}.JPEG"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.write(fd, b"\xff\xd8\xff\xe0tiny")
            os.close(fd)


def measure(src: str) -> dict:
    """Bytes a file held and at the peak, after each step (``{"files", "scan", "plan", ...}``)."""
    from shardfeed.convert.write.plan import plan_samples, plan_shards
    from shardfeed.convert.write.scan import scan_image_folder

    gc.collect()
    tracemalloc.start()
    try:
        scan = scan_image_folder(src)
        n = len(scan.files)
        scan_held, scan_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        plan = plan_samples(scan, seed=0)
        plan_shards(plan, max_count=1000, max_bytes=1 << 40)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"files": n, "scan_held_b": scan_held / n, "scan_peak_b": scan_peak / n, "plan_held_b": held / n,
            "plan_peak_b": peak / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000, help="files of the generated folder (default 100,000)")
    ap.add_argument("--src", help="measure this image folder instead of a generated one")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    tmp = None
    try:
        if args.src is None:
            tmp = tempfile.mkdtemp(prefix="pack-driver-")
            make_folder(tmp, args.files)
        res = measure(args.src or tmp)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{res['files']:,} files: the scan holds {res['scan_held_b']:.1f} bytes a file (peak "
          f"{res['scan_peak_b']:.1f}); with the plan and the shard cuts {res['plan_held_b']:.1f} (peak "
          f"{res['plan_peak_b']:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
