#!/usr/bin/env python3
"""Benchmark re-encoding while packing; ``make bench`` runs it through :func:`run`.

Two measurements, each with its candidates side by side in paired, order-rotated rounds
(:func:`bench_util.run_rounds`; figures are medians over the rounds, ratios medians of the
per-round ratios):

1. **Pack throughput with and without reduced-size JPEG decoding** (Pillow ``draft``): ``pack
   --resize 256`` of large JPEGs (default 40 at 2560x1600, q90, generated with
   ``make_sample_data.make_image``), one worker process, so the figure is images/s per core.
   ``draft=False`` decodes every JPEG at full size before the Lanczos resize. Target: >= 1.8x.
2. **What ``--resize 256`` buys on ImageNet-sized data** (default 300 JPEGs at 500x375, q90):
   stored bytes of ``pack`` (original bytes) versus ``pack --resize 256``, the pack time of each
   (one worker), and the loader's decode + random-resized-crop 224 cost per image on each
   dataset (``SampleDecoder(224, train=True)``, the readers' exact path, in one process over the
   samples read from the shards into memory, so only the CPU work differs).

"Per core" figures are images per CPU second of the measuring process (``time.process_time``;
everything runs in it: one pack worker runs inline), so they hold on a busy machine too; the
wall-clock rates are kept in the JSON as ``images_per_s``; on an idle machine the two agree.

Usage::

    python scripts/bench_reencode.py --out out/bench/reencode            # about 2-3 minutes on 2 cores
    python scripts/bench_reencode.py --out /tmp/r --num-large 8 --num-small 60 --rounds 1   # quick

Writes ``OUT/bench_reencode.json`` and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_util import machine_info, median, paired_ratio, run_rounds  # noqa: E402
from make_sample_data import make_image  # noqa: E402

__all__ = ["make_jpeg_folder", "bench_draft", "bench_imagenet_resize", "run", "main"]


def make_jpeg_folder(root: Path, num_images: int, width: int, height: int, *, num_classes: int = 4,
                     quality: int = 90, seed: int = 0) -> Path:
    """An ImageFolder of ``num_images`` textured JPEGs of exactly ``width`` x ``height`` px (kept if present)."""
    rng = np.random.default_rng(seed)
    for i in range(num_images):
        label = i % num_classes
        path = root / f"class_{label:02d}" / f"img_{i:05d}.jpg"
        img_seed = int(rng.integers(0, 2**31))
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = make_image(np.random.default_rng(img_seed), label, num_classes, width, height)
        tmp = path.with_name("." + path.name + ".tmp")
        Image.fromarray(pixels).save(tmp, format="JPEG", quality=quality)
        os.replace(tmp, path)
    return root


def _pack_once(src: Path, out: Path, reencode: dict | None, workers: int = 1) -> dict:
    from shardfeed.convert.write.pack import PackOptions, pack

    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    report = pack(src, out, PackOptions(workers=workers, reencode=reencode))
    s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"value": report.num_samples / cpu_s, "images_per_s": report.num_samples / s, "seconds": s,
            "cpu_seconds": cpu_s, "num_samples": report.num_samples,
            "input_bytes": report.input_bytes, "output_bytes": report.num_bytes,
            "image_bytes": _image_bytes(out)}


def _image_bytes(out: Path) -> int:
    """Bytes of the stored images alone (tar members other than .cls/.json)."""
    total = 0
    for p in sorted(out.glob("*.tar")):
        with tarfile.open(p) as tf:
            total += sum(m.size for m in tf.getmembers() if not m.name.endswith((".cls", ".json")))
    return total


def bench_draft(src: Path, work: Path, *, resize: int = 256, rounds: int = 3, log=print) -> dict:
    """Pack ``src`` with ``--resize`` on one core, with and without draft; images/s and the speed-up."""
    cases = {
        "draft": lambda: _pack_once(src, work / "draft", {"resize": resize, "draft": True}),
        "no_draft": lambda: _pack_once(src, work / "no_draft", {"resize": resize, "draft": False}),
    }
    res = run_rounds(cases, rounds=rounds, warmup=1, log=log)
    v = res["values"]
    return {"resize": resize, "images_per_s_per_core": {k: median(x) for k, x in v.items()},
            "speedup": paired_ratio(v["draft"], v["no_draft"]), "rounds": v}


def _load_samples(out: Path) -> list[tuple[bytes, str]]:
    samples = []
    for p in sorted(out.glob("*.tar")):
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                if not m.name.endswith((".cls", ".json")):
                    samples.append((tf.extractfile(m).read(), m.name.split(".", 1)[1]))
    return samples


def _decode_rate(samples: list[tuple[bytes, str]], image_size: int) -> dict:
    import cv2
    import torch

    from shardfeed.readers.decode.transforms import SampleDecoder

    cv2.setNumThreads(1)  # as in every DataLoader worker (readers/loader.py): one core per worker
    torch.set_num_threads(1)
    dec = SampleDecoder(image_size=image_size, train=True, seed=0)
    t0, c0 = time.perf_counter(), time.process_time()
    for i, (data, ext) in enumerate(samples):
        dec(data, ext, 0, f"sample {i}")
    s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"value": len(samples) / cpu_s, "images_per_s": len(samples) / s}


def bench_imagenet_resize(src: Path, work: Path, *, resize: int = 256, crop: int = 224, rounds: int = 3,
                          log=print) -> dict:
    """Sizes, pack speed and loader decode speed of ``pack`` versus ``pack --resize`` on ``src``."""
    packs = run_rounds({
        "original": lambda: _pack_once(src, work / "original", None),
        "resized": lambda: _pack_once(src, work / "resized", {"resize": resize}),
    }, rounds=rounds, warmup=1, log=log)
    orig, resized = _load_samples(work / "original"), _load_samples(work / "resized")
    loads = run_rounds({
        "original": lambda: _decode_rate(orig, crop),
        "resized": lambda: _decode_rate(resized, crop),
    }, rounds=rounds, warmup=1, log=log)
    o, r = packs["extra"]["original"][-1], packs["extra"]["resized"][-1]
    lv = loads["values"]
    return {
        "resize": resize, "crop": crop, "num_images": o["num_samples"],
        "image_bytes": {"original": o["image_bytes"], "resized": r["image_bytes"]},
        "shard_bytes": {"original": o["output_bytes"], "resized": r["output_bytes"]},
        "size_ratio": o["image_bytes"] / r["image_bytes"],
        "pack_images_per_s_per_core": {k: median(x) for k, x in packs["values"].items()},
        "decode_crop_images_per_s_per_core": {k: median(x) for k, x in lv.items()},
        "decode_speedup": paired_ratio(lv["resized"], lv["original"]),
        "rounds": {"pack": packs["values"], "decode": lv},
    }


def run(out: Path, *, data: Path | None = None, num_large: int = 40, large_size=(2560, 1600),
        num_small: int = 300, small_size=(500, 375), rounds: int = 3, log=print) -> dict:
    """Generate the data (kept between runs), run both measurements, write ``OUT/bench_reencode.json``."""
    out.mkdir(parents=True, exist_ok=True)
    data = data or out / "data"
    t0 = time.perf_counter()
    large = make_jpeg_folder(data / f"large-{large_size[0]}x{large_size[1]}-{num_large}", num_large, *large_size)
    small = make_jpeg_folder(data / f"imagenet-{small_size[0]}x{small_size[1]}-{num_small}", num_small, *small_size)
    log(f"data ready in {time.perf_counter() - t0:.1f} s")
    log(f"1. pack --resize 256 of {num_large} JPEGs at {large_size[0]}x{large_size[1]}, one core: draft vs full decode")
    draft = bench_draft(large, out / "work", rounds=rounds, log=log)
    log(f"2. pack vs pack --resize 256 of {num_small} JPEGs at {small_size[0]}x{small_size[1]}")
    imagenet = bench_imagenet_resize(small, out / "work", rounds=rounds, log=log)
    shutil.rmtree(out / "work", ignore_errors=True)
    report = {"draft": draft, "imagenet_resize": imagenet, "machine": machine_info(out),
              "settings": {"num_large": num_large, "large_size": large_size, "num_small": num_small,
                           "small_size": small_size, "rounds": rounds}}
    (out / "bench_reencode.json").write_text(json.dumps(report, indent=2))
    d, m = draft["images_per_s_per_core"], imagenet
    log("")
    log(f"re-encode pack, {large_size[0]}x{large_size[1]} JPEG -> --resize 256, images/s per core: "
        f"draft {d['draft']:.1f}, full decode {d['no_draft']:.1f}; speed-up {draft['speedup']:.2f}x (target >= 1.8x)")
    log(f"--resize 256 on {num_small} images at {small_size[0]}x{small_size[1]}: images "
        f"{m['image_bytes']['original'] / 1e6:.1f} MB -> {m['image_bytes']['resized'] / 1e6:.1f} MB "
        f"({m['size_ratio']:.2f}x smaller); pack {m['pack_images_per_s_per_core']['original']:.0f} -> "
        f"{m['pack_images_per_s_per_core']['resized']:.0f} images/s per core; decode + random crop {m['crop']}: "
        f"{m['decode_crop_images_per_s_per_core']['original']:.0f} -> "
        f"{m['decode_crop_images_per_s_per_core']['resized']:.0f} images/s per core "
        f"({m['decode_speedup']:.2f}x)")
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench/reencode", help="output folder (JSON report, generated data)")
    p.add_argument("--data", default=None, help="where to generate/keep the images [default: OUT/data]")
    p.add_argument("--num-large", type=int, default=40, help="large JPEGs for the draft comparison")
    p.add_argument("--num-small", type=int, default=300, help="ImageNet-sized JPEGs for the --resize 256 figures")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after one warm-up round)")
    a = p.parse_args(argv)
    run(Path(a.out), data=Path(a.data) if a.data else None, num_large=a.num_large, num_small=a.num_small,
        rounds=a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
