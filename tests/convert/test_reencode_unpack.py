"""`pack --resize` then `unpack`: valid images of the right sizes, for both formats.

Expected sizes are worked out by hand: shorter side -> 32, the other side round(other * 32 / shorter).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardfeed.convert.write.pack import PackOptions, pack
from shardfeed.convert.tools.unpack import unpack

# source size (w, h) -> expected size after --resize 32 (shorter side), by hand
CASES = {
    "landscape.jpg": ((120, 80), (48, 32)),     # 120 * 32 / 80 = 48
    "portrait.png": ((50, 100), (32, 64)),      # 100 * 32 / 50 = 64
    "odd.jpg": ((97, 61), (51, 32)),            # 97 * 32 / 61 = 50.89 -> 51
    "tiny.png": ((20, 10), (20, 10)),           # smaller than 32: not upscaled
}


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_pack_resize_then_unpack_gives_valid_images_of_the_right_sizes(tmp_path: Path, fmt: str):
    src = tmp_path / "src"
    rng = np.random.default_rng(0)
    for i, (name, ((w, h), _)) in enumerate(CASES.items()):
        d = src / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / name)
    pack(src, tmp_path / "packed", PackOptions(format=fmt, workers=1, reencode={"resize": 32}))
    unpack(tmp_path / "packed", tmp_path / "back")
    suffix_of = {"JPEG": ".jpg", "PNG": ".png"}
    for i, (name, (_, expected)) in enumerate(CASES.items()):
        found = list((tmp_path / "back" / f"c{i % 2}").glob(Path(name).stem + ".*"))
        assert len(found) == 1, found
        with Image.open(found[0]) as img:
            img.load()  # decodes fully: a valid image
            assert img.size == expected, name
            assert img.mode == "RGB"
            assert suffix_of[img.format] == found[0].suffix  # the file name tells its real format
