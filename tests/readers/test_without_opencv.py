"""OpenCV is optional: ``pip install shardfeed`` does not pull it in (its two distributions,
opencv-python and opencv-python-headless, replace each other's ``cv2``). The default path — pack,
then read with ``decoder="auto"`` at a fixed ``image_size``, train or eval transforms, from the
folder and from the shards — runs with ``cv2`` unimportable; the paths that need OpenCV say so
and name the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def test_default_paths_run_without_opencv(tmp_path):
    rng = np.random.default_rng(0)
    expected = {}
    for c, label in (("cat", 0), ("dog", 1)):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i in range(6):
            ext = "png" if i % 3 == 0 else "jpg"
            Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(tmp_path / "src" / c / f"{i}.{ext}")
            expected[f"{c}/{i}.{ext}"] = label
    code = textwrap.dedent(f"""
        import sys
        sys.modules["cv2"] = None  # every `import cv2` now fails
        from shardfeed.convert import pack, PackOptions
        from shardfeed.readers import make_loader
        pack({str(tmp_path / "src")!r}, {str(tmp_path / "out")!r}, PackOptions(workers=1))
        for src in ({str(tmp_path / "src")!r}, {str(tmp_path / "out")!r}):
            for train in (False, True):
                labels = []
                for x, y in make_loader(src, batch_size=4, num_workers=0, image_size=32, train=train):
                    assert x.shape[1:] == (3, 32, 32) and str(x.dtype) == "torch.uint8", x.shape
                    labels += y.tolist()
                print(sorted(labels))
        try:
            next(iter(make_loader({str(tmp_path / "out")!r}, batch_size=4, num_workers=0, image_size=32,
                                  decoder="cv2")))
        except ImportError as exc:
            print("ImportError:", exc)
        assert "cv2" not in [m for m, v in sys.modules.items() if v is not None]
    """)
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    want = str(sorted(expected.values()))
    assert lines[:4] == [want] * 4
    assert lines[4].startswith("ImportError:") and "pip install 'shardfeed[opencv]'" in lines[4]
    assert "opencv-python" in lines[4]
