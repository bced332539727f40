#!/usr/bin/env python3
"""Generate a deterministic ImageFolder of textured JPEG/PNG images (the demo and bench data).

Each class has its own hue and stripe frequency, so a model can learn the classes; sizes and
textures vary per image. The same arguments always give byte-identical files.

Examples::

    python scripts/make_sample_data.py data/sample                       # 3,000 images, 10 classes
    python scripts/make_sample_data.py data/small --num-images 20000 --min-size 96 --max-size 96
    python scripts/make_sample_data.py data/imagenet --num-images 3000 --min-size 375 --max-size 500
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["make_image", "make_image_folder"]


def make_image(rng: np.random.Generator, label: int, num_classes: int, width: int, height: int) -> np.ndarray:
    """One textured RGB image, uint8 [height, width, 3]: class hue, stripes, a blob and noise."""
    hue = label / num_classes
    base = np.array([np.sin(2 * np.pi * (hue + k / 3)) * 0.5 + 0.5 for k in range(3)], dtype=np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    freq = 0.05 + 0.03 * label + rng.uniform(0, 0.02)
    angle = rng.uniform(0, np.pi)
    stripes = 0.5 + 0.5 * np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)))
    cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.1, 0.4) * min(width, height)
    blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
    img = base[None, None, :] * (0.55 + 0.35 * stripes[..., None]) + 0.25 * blob[..., None]
    img += rng.normal(0, 0.04, size=img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def make_image_folder(out: str | os.PathLike, *, num_images: int = 3000, num_classes: int = 10,
                      min_size: int = 64, max_size: int = 160, png_share: float = 0.2, seed: int = 0,
                      quality: int = 90, part: tuple[int, int] = (0, 1)) -> int:
    """Write ``num_images`` images into ``out/class_XX/img_XXXXXX.{jpg,png}``; returns the count.

    Existing files with the right name are kept (re-running is cheap and gives the same folder).
    ``part=(k, n)`` writes only images ``i`` with ``i % n == k`` (the same files as a full run),
    so ``n`` processes can share the work.
    """
    out = Path(out)
    rng = np.random.default_rng(seed)
    written = 0
    k, n = part
    for i in range(num_images):
        label = i % num_classes
        w, h = (int(v) for v in rng.integers(min_size, max_size + 1, size=2))
        is_png = rng.random() < png_share
        img_seed = int(rng.integers(0, 2**31))
        if i % n != k:
            continue
        d = out / f"class_{label:02d}"
        path = d / f"img_{i:06d}.{'png' if is_png else 'jpg'}"
        if path.exists():
            continue
        d.mkdir(parents=True, exist_ok=True)
        pixels = make_image(np.random.default_rng(img_seed), label, num_classes, w, h)
        tmp = path.with_name("." + path.name + ".tmp")
        if is_png:
            Image.fromarray(pixels).save(tmp, format="PNG", compress_level=1)
        else:
            Image.fromarray(pixels).save(tmp, format="JPEG", quality=quality)
        os.replace(tmp, path)
        written += 1
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="output image folder (ImageFolder layout)")
    p.add_argument("--num-images", type=int, default=3000)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--min-size", type=int, default=64, help="smallest width/height, px")
    p.add_argument("--max-size", type=int, default=160, help="largest width/height, px")
    p.add_argument("--png-share", type=float, default=0.2, help="share of PNG files (the rest JPEG)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    n = make_image_folder(a.out, num_images=a.num_images, num_classes=a.num_classes, min_size=a.min_size,
                          max_size=a.max_size, png_share=a.png_share, seed=a.seed, quality=a.quality)
    print(f"{a.out}: {a.num_images} images in {a.num_classes} classes ({n} written now) "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
