"""Shared by the readers tests (watch, doctor, read-ahead): a user-written ``Dataset`` of image
files, image folders, the storage emulator, and a loop timed independently of
:func:`shardfeed.readers.watch`."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_emulator():
    """The ``scripts/storage_emulator.py`` module (loaded once)."""
    if "storage_emulator" in sys.modules:
        return sys.modules["storage_emulator"]
    spec = importlib.util.spec_from_file_location("storage_emulator", SCRIPTS / "storage_emulator.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def require_fuse() -> None:
    """Skip without FUSE (a failure under CI=true, which must exercise it)."""
    reason = load_emulator().fuse_unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI=true: FUSE is required here)")
        pytest.skip(reason)


def make_jpeg_folder(root: Path, n: int, size: tuple[int, int] = (48, 48), classes: int = 2) -> list[Path]:
    """``n`` RGB JPEGs of ``size`` (w, h) in ``classes`` class folders; returns the paths in order."""
    from PIL import Image

    rng = np.random.default_rng(7)
    paths = []
    for i in range(n):
        d = root / f"class{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        p = d / f"img{i:04d}.jpg"
        Image.fromarray(arr).save(p, quality=90)
        paths.append(p)
    return paths


class FilesDataset:
    """What a user writes: a map-style ``Dataset`` over a list of image files, PIL decode, a
    transform, ``(float32 [3, H, W], int64 label)``."""

    def __init__(self, paths, transform=None):
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        with open(self.paths[i], "rb") as f:
            img = Image.open(f)
            img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        arr = np.asarray(img.resize((32, 32)), dtype=np.float32) / 255.0
        return torch.from_numpy(arr).permute(2, 0, 1).contiguous(), i % 2


def heavy_transform(img):
    """A CPU-heavy augmentation: upscale and blur repeatedly (about 15 ms of CPU per image here)."""
    from PIL import ImageFilter

    big = img.resize((448, 448))
    for _ in range(3):
        big = big.filter(ImageFilter.GaussianBlur(4))
    return big


def timed_loop(iterable, step_s: float):
    """Iterate ``iterable``, sleeping ``step_s`` per batch (a GPU-like step that leaves the CPU free);
    returns ``(waits, steps, batches)`` measured here with ``time.perf_counter``."""
    waits, steps, batches = [], [], []
    it = iter(iterable)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        batches.append(batch)
        time.sleep(step_s)
        waits.append(t1 - t0)
        steps.append(time.perf_counter() - t1)
    return waits, steps, batches


def stall_of(waits, steps, skip: int = 1) -> float:
    """Σ wait / Σ (wait + step), leaving out the first ``skip`` batches (the watch's warm-up)."""
    w, s = sum(waits[skip:]), sum(steps[skip:])
    return w / (w + s)
