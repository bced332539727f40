"""What the truncated-data checks of ``readers/decode/decode_backends.py`` cost next to a decode.

Times, on a 500x375 photo-like image (best of 5 rounds, microseconds a call): the cheap tail
tests that run on every decode (``_png_tail_blank``: are the last two rows blank;
``_jpeg_tail_flat``: is the last block flat) and the exact checks they trigger
(``_png_missing_data``: inflate and count the IDAT stream; ``_check_jpeg_scan``: simplejpeg's
strict decode at 1/8 scale), next to a full Pillow decode.

Run: ``.venv/bin/python -P scripts/bench_decode_checks.py``
"""

from __future__ import annotations

import io
import time

import numpy as np
from PIL import Image

from shardfeed.readers.decode import image as D
from shardfeed.readers.decode import decode_backends as B

__all__ = ["main"]


def _best_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    """Print the timings (microseconds a call)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    arr = np.clip(np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1) + rng.integers(0, 30, (375, 500, 3)),
                  0, 255).astype(np.uint8)
    encoded = {}
    for fmt in ("PNG", "JPEG"):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, fmt)
        encoded[fmt] = buf.getvalue()
    png_img = Image.open(io.BytesIO(encoded["PNG"]))
    png_img.load()
    jpg_img = Image.open(io.BytesIO(encoded["JPEG"]))
    rgb = D.decode_image(encoded["JPEG"])
    rows = [
        ("PNG  decode (pil)", _best_us(lambda: D.decode_image(encoded["PNG"], decoder="pil"), 100)),
        ("PNG  tail test (every decode)", _best_us(lambda: B._png_tail_blank(png_img), 2000)),
        ("PNG  exact count (blank tail only)", _best_us(lambda: B._png_missing_data(encoded["PNG"]), 100)),
        ("JPEG decode (pil)", _best_us(lambda: D.decode_image(encoded["JPEG"], decoder="pil"), 100)),
        ("JPEG tail test (every pil/cv2 decode)", _best_us(lambda: B._jpeg_tail_flat(rgb, 1), 2000)),
        ("JPEG exact scan check (flat tail only)",
         _best_us(lambda: B._check_jpeg_scan(encoded["JPEG"], jpg_img, "x"), 100)),
    ]
    for name, us in rows:
        print(f"{name:42s} {us:9.1f} us")


if __name__ == "__main__":
    main()
