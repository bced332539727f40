"""Forked DataLoader workers after the parent used OpenCV's thread pool must not deadlock.

OpenCV's pool does not survive ``fork``: ``cv2.setNumThreads`` in such a child hangs in
``pthread_cond_destroy``. A user who resized images with OpenCV (or decoded with
``decoder="cv2"``) in the main process, then built a loader with forked workers, hit that hang.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.multiprocess
def test_fork_workers_after_parent_used_cv2_threads(tiny_image_folder, tiny_folder_expected):
    code = textwrap.dedent(f"""
        import numpy as np, cv2
        big = np.random.default_rng(0).integers(0, 255, (1500, 1500, 3), dtype=np.uint8)
        for _ in range(3):  # start OpenCV's thread pool in the parent
            cv2.resize(big, (700, 700), interpolation=cv2.INTER_AREA)
        from shardfeed.readers import make_loader
        loader = make_loader({str(tiny_image_folder)!r}, 8, num_workers=2, image_size=16, decoder="cv2",
                             multiprocessing_context="fork", timeout=60)
        print("SAMPLES", sum(len(labels) for _, labels in loader))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"SAMPLES {len(tiny_folder_expected)}" in r.stdout
