#!/usr/bin/env python3
"""Where a small image's validation time goes, beside FFCV's own decode and resize, in one run.

The validation task of ``scripts/bench_peers.py`` (decode, resize the shorter side to 256, centre
crop 224) on small JPEGs (e.g. ``data/bench-small``: 64-96 px, enlarged), split into parts:

* **decode**: simplejpeg's plain RGB decode of each file (one thread, best of 7 passes);
* **SampleDecoder**: shardfeed's whole per-sample call (header walk, checks, crop-first decode,
  resize, write into the rows of a reused 64-row batch buffer);
* **FFCV imdecode** and **FFCV imdecode + resize_crop**: FFCV's libjpeg-turbo call into a
  preallocated buffer, then its OpenCV resize of the centre crop into a 224 x 224 destination
  (``--peer-python``: an interpreter with FFCV; it runs this script with ``--ffcv-part``), and
  how far FFCV's decoded pixels are from Pillow's (libjpeg's default IDCT and upsampling);
* **reader, no-op decoder**: ``make_loader(WDS, 64, image_size=224, resize_size=256)`` with the
  decoder's call replaced by one that only takes its batch row, CPU per image of this process
  and its workers (``num_workers`` 0 and 2, forked workers inherit the replacement);
* **loader**: the same loader, decoding; and the main process's CPU per batch with 2 workers.

Per-part figures are best-of-passes milliseconds per image on one thread; loader figures are CPU
milliseconds per image (all processes) over ``--epochs`` epochs after a warm-up one, best of
``--rounds``.

Usage::

    python scripts/bench_small_val.py --folder data/bench-small --wds data/bench-small-wds \\
        --peer-python .venv-peers/bin/python [--json out/bench/small-val.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FILES = 512
SIZE, RESIZE = 224, 256


def _files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:FILES]
    if not files:
        raise SystemExit(f"{folder}: no JPEG files")
    return files


def _best_ms(fn, n: int, passes: int = 7) -> float:
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e3)
    return best


def ffcv_part(folder: Path) -> dict:
    """FFCV's decode and decode + centre-crop resize, ms per image (run under FFCV's interpreter)."""
    import cv2
    import numpy as np
    from ffcv.libffcv import imdecode, resize_crop
    from PIL import Image

    cv2.setNumThreads(1)
    files = _files(folder)
    blobs = [np.frombuffer(f.read_bytes(), np.uint8) for f in files]
    sizes = []
    for f in files:
        with Image.open(f) as im:
            sizes.append(im.size)
    side = max(max(s) for s in sizes)
    scratch = np.empty((side, side, 3), np.uint8)
    out = np.empty((SIZE, SIZE, 3), np.uint8)

    def decode():
        for blob, (w, h) in zip(blobs, sizes):
            imdecode(blob, scratch, h, w, h, w, 0, 0, 1, 1, False, False)

    def decode_resize():
        for blob, (w, h) in zip(blobs, sizes):
            imdecode(blob, scratch, h, w, h, w, 0, 0, 1, 1, False, False)
            image = scratch.reshape(-1)[: 3 * h * w].reshape(h, w, 3)
            c = int(SIZE / RESIZE * min(h, w))  # FFCV's get_center_crop with ratio 224 / 256
            top, left = (h - c) // 2, (w - c) // 2
            resize_crop(image, top, top + c, left, left + c, out)

    differ, largest = [], 0  # FFCV's pixels against Pillow's decode (libjpeg's default IDCT and upsampling)
    for f, blob, (w, h) in zip(files, blobs, sizes):
        imdecode(blob, scratch, h, w, h, w, 0, 0, 1, 1, False, False)
        ours = scratch.reshape(-1)[: 3 * h * w].reshape(h, w, 3).astype(np.int16)
        with Image.open(f) as im:
            diff = np.abs(ours - np.asarray(im.convert("RGB"), dtype=np.int16))
        differ.append(float((diff > 0).mean()))
        largest = max(largest, int(diff.max()))
    return {"ffcv_imdecode_ms": _best_ms(decode, len(blobs)),
            "ffcv_imdecode_resize_ms": _best_ms(decode_resize, len(blobs)),
            "ffcv_vs_pillow_values_differing": sum(differ) / len(differ), "ffcv_vs_pillow_max_levels": largest}


def _loader_cpu_ms(wds: Path, workers: int, epochs: int, rounds: int) -> tuple[float, float]:
    """(CPU ms per image of this process and its workers, main-process CPU ms per batch), best rounds."""
    from shardfeed.readers import make_loader

    loader = make_loader(wds, 64, num_workers=workers, image_size=SIZE, train=False, resize_size=RESIZE,
                         pin_memory=False)
    for _ in loader:  # warm-up epoch: workers started, buffers mapped
        pass
    best, best_main = float("inf"), float("inf")
    for _ in range(rounds):
        own0, children0 = time.process_time(), _children_cpu_s()
        n = batches = 0
        for _ in range(epochs):
            for _, labels in loader:
                n += len(labels)
                batches += 1
        own = time.process_time() - own0
        best = min(best, (own + _children_cpu_s() - children0) / n * 1e3)
        best_main = min(best_main, own / batches * 1e3)
    return best, best_main


def _children_cpu_s() -> float:
    """CPU seconds of this process's live children (DataLoader workers), from /proc."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            total += int(fields[11]) + int(fields[12])
    return total / tick


def shardfeed_parts(folder: Path, wds: Path, epochs: int, rounds: int) -> dict:
    import cv2
    import simplejpeg
    import torch

    from shardfeed.readers.batching.buffers import BatchRows
    from shardfeed.readers.decode.transforms import SampleDecoder

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    blobs = [f.read_bytes() for f in _files(folder)]
    decoder = SampleDecoder(image_size=SIZE, train=False, resize_size=RESIZE)
    rows = BatchRows(64, SIZE)
    out = {"files": len(blobs),
           "decode_ms": _best_ms(lambda: [simplejpeg.decode_jpeg(b, "RGB") for b in blobs], len(blobs)),
           "sample_decoder_ms": _best_ms(lambda: [decoder(b, "jpg", 0, "bench", out=rows.next_row())[1]
                                                  for b in blobs], len(blobs))}
    for workers in (0, 2):
        out[f"loader_w{workers}_cpu_ms"], main = _loader_cpu_ms(wds, workers, epochs, rounds)
        if workers:
            out["loader_w2_main_ms_per_batch"] = main
    real_call = SampleDecoder.__call__

    def take_row_only(self, data, ext, label, source, rng=None, out=None):
        return (out[0] if out is not None else torch.zeros((3, SIZE, SIZE), dtype=torch.uint8)), int(label)

    SampleDecoder.__call__ = take_row_only  # forked workers inherit it
    try:
        for workers in (0, 2):
            out[f"reader_w{workers}_cpu_ms"], _ = _loader_cpu_ms(wds, workers, epochs, rounds)
    finally:
        SampleDecoder.__call__ = real_call
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", type=Path, required=True, help="the image folder (its first 512 JPEGs)")
    p.add_argument("--wds", type=Path, help="its shardfeed WebDataset copy (the loader parts)")
    p.add_argument("--peer-python", help="an interpreter with FFCV (e.g. .venv-peers/bin/python)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per loader round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--ffcv-part", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.ffcv_part:
        print(json.dumps(ffcv_part(a.folder)))
        return 0
    if a.wds is None:
        p.error("--wds is required")
    results = shardfeed_parts(a.folder, a.wds, a.epochs, a.rounds)
    if a.peer_python:
        run = subprocess.run([a.peer_python, __file__, "--folder", str(a.folder), "--ffcv-part"],
                             capture_output=True, text=True, timeout=600)
        if run.returncode == 0:
            results.update(json.loads(run.stdout.strip().splitlines()[-1]))
        else:
            results["ffcv_error"] = (run.stderr.strip().splitlines() or ["failed"])[-1]
    rows = [("simplejpeg decode", "decode_ms", "ms/image, one thread"),
            ("FFCV imdecode", "ffcv_imdecode_ms", "ms/image, one thread"),
            ("shardfeed SampleDecoder call", "sample_decoder_ms", "ms/image, one thread"),
            ("FFCV imdecode + resize_crop", "ffcv_imdecode_resize_ms", "ms/image, one thread"),
            ("reader, no-op decoder, 0 workers", "reader_w0_cpu_ms", "CPU ms/image"),
            ("reader, no-op decoder, 2 workers", "reader_w2_cpu_ms", "CPU ms/image"),
            ("loader, 0 workers", "loader_w0_cpu_ms", "CPU ms/image"),
            ("loader, 2 workers", "loader_w2_cpu_ms", "CPU ms/image"),
            ("main process, 2 workers", "loader_w2_main_ms_per_batch", "CPU ms/batch of 64")]
    for label, key, unit in rows:
        value = results.get(key)
        print(f"{label:36s} {'-' if value is None else f'{value:.4f}':>8s}  {unit}")
    if "ffcv_vs_pillow_values_differing" in results:
        print(f"FFCV's decoded pixels against Pillow's: {100 * results['ffcv_vs_pillow_values_differing']:.0f} % of "
              f"values differ, by at most {results['ffcv_vs_pillow_max_levels']} grey levels")
    if "ffcv_error" in results:
        print(f"FFCV parts not measured: {results['ffcv_error']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
