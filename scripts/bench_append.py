#!/usr/bin/env python3
"""Append 1 % new images to a dataset vs pack the union from scratch; prints the time ratio.

The base folder holds ``--images`` images in 20 classes; the new folder 1 % more, half in a
class the base has and half in a new class. Each round times, in one process:

* **full**: ``pack(union, OUT)`` of base + new into an empty folder;
* **append**: ``pack(new, OUT, PackOptions(append=True))`` onto a copy of the base dataset
  (its files hard-linked: the append never writes into an old file).

Each timed step starts after ``os.sync()`` (outside the timing): a pack ``fsync``s every shard it
writes, so each step is charged its own writes, and not the write-back of the gigabytes the step
before left in the page cache. The same append is also timed right after the full pack, without the
sync: Linux then throttles its writes behind the full pack's (``balance_dirty_pages``), and that
figure is printed beside the target's.

The images are JPEGs of about 60 to 160 KB (ImageNet's average is about 110 KB; a pack copies
them, it does not decode them); the union folder hard-links the base's files. A figure is the
median over the rounds. Target: append / full <= 0.02.

Usage::

    python scripts/bench_append.py [--images 20000] [--rounds 3] [--workers 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack


def _jpegs(n: int, seed: int = 0) -> list[bytes]:
    """``n`` distinct JPEGs of about 60 to 160 KB."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        side = int(rng.integers(260, 400))
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, size=(side, side, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _plant(root: Path, names: list[str], pool: list[bytes]) -> None:
    for i, rel in enumerate(names):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(pool[i % len(pool)])


def _link_copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=os.link)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=20000, help="images in the base dataset")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    n_new = max(2, args.images // 100)
    base_names = [f"class{c:02d}/img{i:06d}.jpg" for i in range(args.images) for c in (i % 20,)]
    new_names = ([f"class00/new{i:06d}.jpg" for i in range(n_new // 2)]
                 + [f"class99/new{i:06d}.jpg" for i in range(n_new - n_new // 2)])
    pool = _jpegs(64)
    opts = dict(workers=args.workers)  # the default shard limits
    with tempfile.TemporaryDirectory(prefix="bench_append_") as tmp:
        tmp = Path(tmp)
        _plant(tmp / "base", base_names, pool)
        _plant(tmp / "new", new_names, pool[::-1])
        _link_copy(tmp / "base", tmp / "union")
        _plant(tmp / "union", new_names, pool[::-1])
        pack(tmp / "base", tmp / "base_out", PackOptions(**opts))
        full, append, after_full = [], [], []
        for r in range(args.rounds):
            os.sync()  # each timed step starts from a quiet disk (outside the timing)
            t = time.perf_counter()
            pack(tmp / "union", tmp / f"full{r}", PackOptions(**opts))
            full.append(time.perf_counter() - t)
            for timed, settle in ((after_full, False), (append, True)):
                _link_copy(tmp / "base_out", tmp / f"app{r}")
                if settle:
                    os.sync()
                t = time.perf_counter()
                report = pack(tmp / "new", tmp / f"app{r}", PackOptions(append=True, **opts))
                timed.append(time.perf_counter() - t)
                assert report.num_samples == n_new, report.num_samples
                shutil.rmtree(tmp / f"app{r}")
            shutil.rmtree(tmp / f"full{r}")
    result = {"images": args.images, "new_images": n_new, "workers": args.workers, "rounds": args.rounds,
              "full_s": round(statistics.median(full), 3), "append_s": round(statistics.median(append), 4),
              "ratio": round(statistics.median(a / f for a, f in zip(append, full)), 4), "target": 0.02,
              "append_right_after_full_s": round(statistics.median(after_full), 4),
              "ratio_right_after_full": round(statistics.median(a / f for a, f in zip(after_full, full)), 4)}
    print(f"full pack of {args.images + n_new} images: {result['full_s']:.3f} s; append of {n_new}: "
          f"{result['append_s']:.4f} s; ratio {result['ratio']:.4f} (target <= 0.02)")
    print(f"the same append started while the full pack's writes still go to disk: "
          f"{result['append_right_after_full_s']:.4f} s; ratio {result['ratio_right_after_full']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
