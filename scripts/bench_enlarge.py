#!/usr/bin/env python3
"""OpenCV's 8-bit against its 16-bit bilinear kernel for the enlarging resize of the built-in transforms.

Small images (64-96 px) enlarged to 224 x 224 spend about a third of their loader time in this
resize and the HWC -> CHW split after it. For each band of window heights, random ``uint8``
windows are enlarged to 224 x 224 and split into the planes of 64 rotating batch rows, both ways
side by side in this one run (one thread, best of 9 passes each, the two interleaved twice):

* **8-bit**: ``cv2.resize(window, INTER_LINEAR)`` then ``cv2.split``;
* **16-bit**: the window widened to ``uint16``, resized, narrowed back, then split (what
  ``shardfeed.readers.decode.transforms`` does from ``_WIDE_BILINEAR_MIN_ROWS`` rows up).

Also printed: the share of output values that differ from the exact bilinear value (float64
``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)``, rounded), each way.

Usage::

    python scripts/bench_enlarge.py [--json out/bench/enlarge.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

SIZE = 224
BANDS = ((8, 20), (20, 32), (32, 48), (48, 64), (64, 96), (96, 160), (160, 224))


def _resize_8bit(window: np.ndarray) -> np.ndarray:
    return cv2.resize(window, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)


def _resize_16bit(window: np.ndarray) -> np.ndarray:
    return cv2.resize(window.astype(np.uint16), (SIZE, SIZE), interpolation=cv2.INTER_LINEAR).astype(np.uint8)


def _ms_per_window(resize, windows: list[np.ndarray], rows: list[np.ndarray], passes: int = 9) -> float:
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for i, window in enumerate(windows):
            planes = rows[i % len(rows)]
            cv2.split(resize(window), [planes[0], planes[1], planes[2]])
        best = min(best, (time.perf_counter() - t0) / len(windows) * 1e3)
    return best


def _off_share(resize, windows: list[np.ndarray]) -> float:
    off = total = 0
    for window in windows[:20]:
        x = torch.from_numpy(window).permute(2, 0, 1)[None].double()
        exact = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0]
        exact = exact.round().permute(1, 2, 0).numpy().astype(np.int16)
        off += int((resize(window).astype(np.int16) != exact).sum())
        total += exact.size
    return off / total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = [np.empty((3, SIZE, SIZE), np.uint8) for _ in range(64)]
    results = []
    print(f"{'window rows':>12s} {'8-bit ms':>9s} {'16-bit ms':>10s} {'16/8':>6s} {'off exact 8-bit':>16s} "
          f"{'16-bit':>7s}")
    for lo, hi in BANDS:
        windows = [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
                   for h, w in zip(rng.integers(lo, hi, 200), rng.integers(lo, hi, 200))]
        t8 = min(_ms_per_window(_resize_8bit, windows, rows), _ms_per_window(_resize_8bit, windows, rows))
        t16 = min(_ms_per_window(_resize_16bit, windows, rows), _ms_per_window(_resize_16bit, windows, rows))
        row = {"rows": [lo, hi - 1], "ms_8bit": t8, "ms_16bit": t16, "ratio_16_over_8": t16 / t8,
               "off_exact_8bit": _off_share(_resize_8bit, windows), "off_exact_16bit": _off_share(_resize_16bit, windows)}
        results.append(row)
        print(f"{f'{lo}-{hi - 1}':>12s} {t8:9.4f} {t16:10.4f} {t16 / t8:6.3f} {row['off_exact_8bit']:16.2%} "
              f"{row['off_exact_16bit']:7.2%}", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"size": SIZE, "opencv": cv2.__version__, "rows": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
