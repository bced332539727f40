#!/usr/bin/env python3
"""Fused decode-and-crop vs today's decode path vs DALI's CPU pipeline, run by ``make bench``.

Rows, each measured side by side in this one run, one process (one thread: OpenCV and torch are
held to one thread, DALI runs ``num_threads=1`` without pipelining), on ImageNet-sized JPEGs
(375-500 px, quality 90, from ``scripts/make_sample_data.py``) to 224 x 224:

* **train**: ``SampleDecoder(224, train=True)`` with ``decoder="pil"`` (today's path: decode,
  maybe at a reduced scale keeping the shorter side >= 224, then the random-resized crop) against
  ``decoder="auto"`` (simplejpeg, the box drawn from the header, the window decoded at the
  smallest power-of-two scale that still covers 224 pixels) and against DALI
  (``fn.decoders.image_random_crop`` + ``fn.resize`` + ``fn.crop_mirror_normalize`` for the flip
  and the CHW layout, ``device_id=None``). Target: auto / pil >= 1.6; auto >= DALI per CPU-second.
* **val**: ``SampleDecoder(224)`` (resize the shorter side to 224, centre crop) pil vs auto;
  DALI (``fn.decoders.image`` + ``fn.resize(resize_shorter=224)`` + centre crop) for reference.
  Target: auto / pil >= 1.3.
* **loader**: ``make_loader(..., num_workers=2, batch_size=64, train=True)`` over the folder and
  over its WebDataset shards, ``decoder="pil"`` vs ``"auto"`` (the ``make bench`` loader rows,
  with the new path).

Images/s is wall time; "per CPU-s" divides by the process's CPU time (DALI's threads included),
which is the per-core comparison. A figure is the median over the rounds (order rotated each
round, after a warm-up round), a ratio the median of the per-round ratios.

Usage::

    python scripts/bench_decode.py [--images 400] [--rounds 5] [--json out/bench/decode.json] [--no-loader]

DALI comes from the ``bench`` extra (``pip install nvidia-dali-cuda120``, ~1 GB); without it its
rows are left out with a note.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

__all__ = ["main"]

IMAGE_SIZE = 224


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_folder(root: Path, num_images: int) -> Path:
    """ImageNet-sized JPEG folder (cached): 375-500 px, 10 classes."""
    from make_sample_data import make_image_folder

    done = root / ".done"
    if not done.exists() or done.read_text() != str(num_images):
        if root.exists():
            import shutil

            shutil.rmtree(root)
        make_image_folder(root, num_images=num_images, min_size=375, max_size=500, png_share=0.0, seed=1)
        done.write_text(str(num_images))
    return root


def folder_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.jpg"))


def _rate(fn, count: int) -> dict:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"value": count / wall, "per_cpu_s": count / max(cpu, 1e-9)}


def sample_decoder_case(blobs: list[bytes], decoder: str, train: bool):
    from shardfeed.readers.decode.transforms import SampleDecoder

    dec = SampleDecoder(image_size=IMAGE_SIZE, train=train, decoder=decoder, seed=0)
    dec.set_context(0, 0, 0)

    def run():
        for i, b in enumerate(blobs):
            out, _ = dec(b, "jpg", 0, f"image {i}")
        assert tuple(out.shape) == (3, IMAGE_SIZE, IMAGE_SIZE)

    return lambda: _rate(run, len(blobs))


def dali_case(blobs: list[bytes], train: bool, batch_size: int = 32):
    """DALI CPU pipeline on one thread: the same work as the SampleDecoder rows."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, exec_async=False,
                  exec_pipelined=False, seed=0, prefetch_queue_depth=1)
    def pipe():
        enc = fn.external_source(name="enc", dtype=types.UINT8)
        if train:
            img = fn.decoders.image_random_crop(enc, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                                random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
            img = fn.resize(img, resize_x=IMAGE_SIZE, resize_y=IMAGE_SIZE)
            return fn.crop_mirror_normalize(img, dtype=types.UINT8, output_layout="CHW",
                                            mirror=fn.random.coin_flip())
        img = fn.decoders.image(enc, device="cpu", output_type=types.RGB)
        img = fn.resize(img, resize_shorter=IMAGE_SIZE)
        return fn.crop_mirror_normalize(img, dtype=types.UINT8, output_layout="CHW",
                                        crop=(IMAGE_SIZE, IMAGE_SIZE))

    p = pipe()
    p.build()
    arrays = [np.frombuffer(b, np.uint8) for b in blobs]
    usable = len(arrays) - len(arrays) % batch_size

    def run():
        for i in range(0, usable, batch_size):
            p.feed_input("enc", arrays[i:i + batch_size])
            (out,) = p.run()
        assert tuple(out.at(0).shape) == (3, IMAGE_SIZE, IMAGE_SIZE)

    return lambda: _rate(run, usable)


def loader_case(src: Path, decoder: str, num_batches: int):
    from shardfeed.readers.loader import make_loader

    def f():
        loader = make_loader(str(src), batch_size=64, num_workers=2, image_size=IMAGE_SIZE, train=True,
                             decoder=decoder, persistent_workers=False)
        it = iter(loader)
        n = 0
        for i, (images, _labels) in enumerate(it):
            if i == 0:
                t_first = time.perf_counter()  # start-up (worker spawn, first batch) left out
            else:
                n += images.shape[0]
            if i >= num_batches:
                break
        rate = n / (time.perf_counter() - t_first)
        del it, loader
        gc.collect()
        return {"value": rate}

    return f


def pixel_difference(blobs: list[bytes], upscale: int = 1, boxes_per_image: int = 4) -> dict:
    """Mean absolute difference (grey levels) between the fused path and today's for the same box.

    Today's: Pillow's full decode, the box cut, OpenCV ``INTER_AREA`` (``INTER_LINEAR`` when
    growing) to 224. Fused: ``decode_crop`` (simplejpeg at the scale covering 224) +
    ``TrainTransform.finish`` with ``resample="antialias"``. ``upscale`` > 1 re-encodes the images
    that many times larger, so the crops are decoded at 1/2 .. 1/8 scale.
    """
    import io

    import cv2
    from PIL import Image

    from shardfeed.readers.decode.image import decode_crop
    from shardfeed.readers.decode.transforms import TrainTransform, make_rng

    transform = TrainTransform(IMAGE_SIZE, flip=False, resample="antialias")
    rng = make_rng(0, 0, 0, 0)
    diffs = []
    for b in blobs:
        if upscale > 1:
            img = Image.open(io.BytesIO(b)).convert("RGB")
            img = img.resize((img.width * upscale, img.height * upscale), Image.BICUBIC)
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            b = buf.getvalue()
        full = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
        for _ in range(boxes_per_image):
            top, left, bh, bw = box = transform.sample_crop(full.shape[0], full.shape[1], rng)
            out = transform.finish(decode_crop(b, crop=lambda h, w: box, min_side=IMAGE_SIZE)).permute(1, 2, 0)
            win = full[top:top + bh, left:left + bw]
            grow = bh < IMAGE_SIZE or bw < IMAGE_SIZE
            ref = cv2.resize(win, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_LINEAR if grow else cv2.INTER_AREA)
            diffs.append(float(np.abs(out.numpy().astype(np.int32) - ref).mean()))
    return {"mean": float(np.mean(diffs)), "p99": float(np.quantile(diffs, 0.99)), "max": float(np.max(diffs)),
            "boxes": len(diffs)}


def run_rounds(cases: dict, rounds: int) -> dict[str, list[dict]]:
    names = list(cases)
    out: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds + 1):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            res = cases[n]()
            if r:
                out[n].append(res)
        log(f"  round {r}{' (warm-up)' if r == 0 else ''}: " + ", ".join(
            f"{n} {out[n][-1]['value']:.0f}" if r else n for n in names))
    return out


def _med(rs: list[dict], key: str = "value") -> float:
    return float(np.median([r[key] for r in rs]))


def _ratio(a: list[dict], b: list[dict], key: str = "value") -> float:
    return float(np.median([x[key] / y[key] for x, y in zip(a, b)]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=400, help="JPEGs decoded per round and case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data", default="data/bench/decode-imagenet", help="where the JPEG folder is cached")
    p.add_argument("--json", default=None)
    p.add_argument("--no-loader", action="store_true", help="leave out the loader rows")
    p.add_argument("--loader-batches", type=int, default=16)
    a = p.parse_args(argv)

    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    from shardfeed.readers.decode.image import simplejpeg_available

    if not simplejpeg_available():
        log("simplejpeg is not installed (pip install simplejpeg): decoder='auto' is Pillow, ratios ~1")
    data = make_folder(Path(a.data).absolute(), max(a.images, 600))
    files = folder_files(data)
    blobs = [f.read_bytes() for f in files[: a.images]]
    rows: list[tuple] = []
    figures: dict = {"images": len(blobs), "rounds": a.rounds, "load_at_start": os.getloadavg()[0]}

    try:
        import nvidia.dali  # noqa: F401

        have_dali = True
    except ImportError:
        have_dali = False
        log("nvidia-dali-cuda120 is not installed (pip install nvidia-dali-cuda120, or make bench): no DALI rows")

    for mode, train in (("train", True), ("val", False)):
        cases = {"pil": sample_decoder_case(blobs, "pil", train), "auto": sample_decoder_case(blobs, "auto", train)}
        if have_dali:
            cases["dali"] = dali_case(blobs, train)
        log(f"[{mode}] {len(blobs)} JPEGs of 375-500 px -> {IMAGE_SIZE}, one process, one thread; "
            f"{a.rounds} rounds + warm-up")
        r = run_rounds(cases, a.rounds)
        figures[mode] = r
        target = 1.6 if train else 1.3
        ratio = _ratio(r["auto"], r["pil"])
        rows.append((f"{mode} transform: auto (simplejpeg{', fused crop' if train else ''}) / pil (today)",
                     ratio, f">= {target}", ratio >= target,
                     f"{_med(r['auto']):.0f} vs {_med(r['pil']):.0f} images/s"))
        ratio_cpu = _ratio(r["auto"], r["pil"], "per_cpu_s")
        rows.append((f"{mode} transform: auto / pil, per CPU-s", ratio_cpu, f">= {target}", ratio_cpu >= target,
                     f"{_med(r['auto'], 'per_cpu_s'):.0f} vs {_med(r['pil'], 'per_cpu_s'):.0f} images/CPU-s"))
        if have_dali:
            ratio_cpu = _ratio(r["auto"], r["dali"], "per_cpu_s")
            rows.append((f"{mode} transform: auto / DALI CPU (1 thread), per CPU-s", ratio_cpu,
                         ">= 1.0" if train else "(info)", ratio_cpu >= 1.0 if train else None,
                         f"{_med(r['auto'], 'per_cpu_s'):.0f} vs {_med(r['dali'], 'per_cpu_s'):.0f} images/CPU-s; "
                         f"DALI {_med(r['dali']):.0f} images/s wall"))

    for up in (1, 4):
        d = pixel_difference(blobs[:50], upscale=up)
        figures[f"mad_upscale_{up}"] = d
        rows.append((f"pixel MAD fused vs today, same box ({'375-500 px' if up == 1 else '1500-2000 px'})",
                     d["mean"], "< 1.5", d["mean"] < 1.5,
                     f"grey levels; p99 {d['p99']:.2f}, max {d['max']:.2f} over {d['boxes']} boxes"))

    if not a.no_loader:
        work = Path(a.data).absolute().with_name("decode-imagenet-wds")
        if not (work / ".done").exists():
            subprocess.run([str(Path(sys.executable).with_name("shardfeed")), "pack", str(data), str(work),
                            "--format", "wds", "--max-count", "100", "--overwrite"], check=True,
                           stdout=subprocess.DEVNULL)
            (work / ".done").write_text("ok")
        cases = {}
        for label, src in (("folder", data), ("webdataset", work)):
            for dec in ("pil", "auto"):
                cases[f"{label}-{dec}"] = loader_case(src, dec, a.loader_batches)
        log(f"[loader] train=True, image_size={IMAGE_SIZE}, batch 64, 2 workers, {a.loader_batches} batches after "
            f"the first; {a.rounds} rounds + warm-up")
        r = run_rounds(cases, a.rounds)
        figures["loader"] = r
        for label in ("folder", "webdataset"):
            ratio = _ratio(r[f"{label}-auto"], r[f"{label}-pil"])
            rows.append((f"loader {label}, 2 workers, train: auto / pil", ratio, "(info)", None,
                         f"{_med(r[f'{label}-auto']):.0f} vs {_med(r[f'{label}-pil']):.0f} images/s"))

    print(f"\n{'comparison':62s} {'ratio':>6s}  {'target':8s} status  figures")
    for name, ratio, target, ok, fig in rows:
        status = "" if ok is None else ("PASS" if ok else "MISS")
        print(f"{name:62s} {ratio:6.2f}  {target:8s} {status:6s}  {fig}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        figures["rows"] = [dict(zip(("comparison", "ratio", "target", "pass", "figures"), row)) for row in rows]
        Path(a.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
