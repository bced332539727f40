#!/usr/bin/env python3
"""shardfeed beside other loaders on the same train and val tasks: images/s and CPU ms per image.

Tasks (batch 64, ``--workers`` loader workers or decode threads): **train** = decode + random
resized crop 224 + horizontal flip; **val** = decode + resize shorter side 256 + centre crop 224.
Each peer is imported only if installed; one that is not installed, or fails, is a row saying so
(never hidden). Peers:

* ``shardfeed``: ``make_loader(WDS, 64, image_size=224, train=..., resize_size=256)``;
* ``webdataset``: ``webdataset.WebDataset(shards).shuffle(1000).decode("rgb8")`` (its Pillow
  decode) with the same crop/resize done on the decoded array by torch (``interpolate``,
  antialiased), in a ``DataLoader``;
* ``dali-cpu``: NVIDIA DALI on the CPU: ``fn.readers.file`` over the image folder,
  ``fn.decoders.image_random_crop`` / ``fn.decoders.image`` + ``fn.resize`` + ``fn.crop``;
* ``ffcv``: ``ffcv.loader.Loader`` over its own ``.beton`` copy of the image folder (written once
  by ``ffcv.writer.DatasetWriter`` into ``--ffcv-cache``, images re-encoded as JPEG quality 90 by
  its writer, so its bytes differ from the other peers'), ``RandomResizedCropRGBImageDecoder`` +
  ``RandomHorizontalFlip`` / ``CenterCropRGBImageDecoder`` (ratio 224/256), ``--workers``
  threads, random order;
* ``litdata``, ``mosaicml-streaming``, ``torchvision-imagefolder``: rows saying whether the package
  imports (each needs its own converted copy of the data and, for torchvision, a wheel matching
  the installed torch; ``make bench`` tries to install them).

A peer that does not import here but does under ``--peer-python PY`` (another interpreter, e.g. a
separate virtual environment holding FFCV and its numba, which would not fit this one's pins) is
run by that interpreter: this script runs its cases as ``PY bench_peers.py --case ...``.

Each case runs in its own subprocess, cases interleaved round by round; the load average is printed
beside every figure, and the 2-core decode limit (twice a plain one-thread decode of every image)
beside the table. ``--storage-ms X`` runs the same cases with the data behind
``scripts/storage_emulator.py`` (X ms per open and per read request).

    .venv/bin/python scripts/bench_peers.py --folder /tmp/perf_data/inet --wds /tmp/perf_data/inet-wds \\
        --rounds 2 --json out/bench_peers.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PEERS = ("shardfeed", "webdataset", "dali-cpu", "litdata", "mosaicml-streaming", "ffcv", "torchvision-imagefolder")
_MODULES = {"shardfeed": "shardfeed.readers", "webdataset": "webdataset", "dali-cpu": "nvidia.dali",
            "litdata": "litdata", "mosaicml-streaming": "streaming", "ffcv": "ffcv",
            "torchvision-imagefolder": "torchvision"}
#: peers this script drives; the others are reported as imported or not
_DRIVEN = ("shardfeed", "webdataset", "dali-cpu", "ffcv")
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _WdsTransform:
    """The tasks on a decoded ``(H, W, 3)`` uint8 array, with torch (for the webdataset peer)."""

    def __init__(self, train: bool):
        self.train = train

    def __call__(self, sample):
        import numpy as np
        import torch
        import torch.nn.functional as F

        img, label = sample
        x = torch.from_numpy(np.require(img, requirements=["C", "W"])).permute(2, 0, 1)[None]
        h, w = x.shape[2:]
        if self.train:
            rng = np.random.default_rng()
            for _ in range(10):
                area = h * w * rng.uniform(0.08, 1.0)
                ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
                cw, ch = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
                if 0 < cw <= w and 0 < ch <= h:
                    top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
                    break
            else:
                ch, cw, top, left = h, w, 0, 0
            x = F.interpolate(x[:, :, top:top + ch, left:left + cw], size=(224, 224), mode="bilinear",
                              antialias=True)[0]
            if rng.random() < 0.5:
                x = x.flip(2)
        else:
            nh, nw = (256, int(w * 256 / h + 0.5)) if h <= w else (int(h * 256 / w + 0.5), 256)
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True)[0]
            top, left = (nh - 224) // 2, (nw - 224) // 2
            x = x[:, top:top + 224, left:left + 224]
        return x.contiguous(), int(label)


def _time_loader(loader, batches: int) -> dict:
    it = iter(loader)
    next(it)
    procs = list(getattr(it, "_workers", None) or getattr(getattr(getattr(loader, "loader", None), "_iterator", None),
                                                         "_workers", None) or [])
    cpu0 = _own_cpu_s() + sum(_proc_cpu_s(p.pid) for p in procs)
    t0 = time.perf_counter()
    n = 0
    for i, batch in enumerate(it):
        n += len(batch[1])
        if i + 1 >= batches:
            break
    wall = time.perf_counter() - t0
    cpu = _own_cpu_s() + sum(_proc_cpu_s(p.pid) for p in procs) - cpu0
    return {"images": n, "images_per_s": n / wall, "cpu_ms_per_image": 1000 * cpu / max(n, 1)}


def run_case(peer: str, task: str, folder: Path, wds: Path, workers: int, batches: int,
             ffcv_cache: Path = Path("/tmp/shardfeed-bench-ffcv")) -> dict:
    import torch

    torch.set_num_threads(1)
    train = task == "train"
    if peer == "shardfeed":
        from shardfeed.readers import make_loader

        opts = {} if train else {"resize_size": 256}
        loader = make_loader(wds, 64, num_workers=workers, image_size=224, train=train, pin_memory=False, **opts)
        return _time_loader(_Repeat(loader), batches)
    if peer == "webdataset":
        import webdataset as wdsmod

        shards = sorted(str(p) for p in Path(wds).glob("*.tar"))
        ds = (wdsmod.WebDataset(shards, shardshuffle=True, empty_check=False).repeat().shuffle(1000)
              .decode("rgb8").to_tuple("jpg;jpeg;png", "cls").map(_WdsTransform(train)).batched(64))
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
        return _time_loader(loader, batches)
    if peer == "dali-cpu":
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        @pipeline_def(batch_size=64, num_threads=max(1, workers), device_id=None)
        def pipe():
            jpegs, labels = fn.readers.file(file_root=str(folder), random_shuffle=True, name="r")
            if train:
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_x=224, resize_y=224)
                images = fn.flip(images, horizontal=fn.random.coin_flip())
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=256)
                images = fn.crop(images, crop=(224, 224))
            return fn.transpose(images, perm=[2, 0, 1]), labels

        p = pipe()
        p.build()
        it = DALIGenericIterator(p, ["images", "labels"], reader_name="r", auto_reset=True)
        return _time_loader(_DaliBatches(it), batches)
    if peer == "ffcv":
        return _time_loader(_Repeat(_ffcv_loader(folder, train, workers, ffcv_cache)), batches)
    raise ValueError(peer)


def _ffcv_loader(folder: Path, train: bool, workers: int, cache: Path):
    """FFCV's loader over its ``.beton`` copy of ``folder`` (written on first use, not timed)."""
    import hashlib

    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
    from PIL import Image

    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files = [(f, label) for label, c in enumerate(classes) for f in sorted((folder / c).iterdir()) if f.is_file()]
    tag = hashlib.sha256("\n".join(f"{f}:{f.stat().st_size}" for f, _ in files).encode()).hexdigest()[:16]
    beton = cache / f"{folder.name}-{tag}.beton"
    if not beton.exists():
        cache.mkdir(parents=True, exist_ok=True)

        class Folder:
            def __len__(self):
                return len(files)

            def __getitem__(self, i):
                f, label = files[i]
                with Image.open(f) as im:
                    return im.convert("RGB"), label

        tmp = beton.with_suffix(".partial")
        DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                      num_workers=max(1, workers)).from_indexed_dataset(Folder())
        tmp.rename(beton)
    if train:
        image = [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
    else:
        image = [CenterCropRGBImageDecoder((224, 224), ratio=224 / 256), ToTensor(), ToTorchImage()]
    return Loader(str(beton), batch_size=64, num_workers=max(1, workers), order=OrderOption.RANDOM, drop_last=True,
                  pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]})


class _Repeat:
    """Iterate a loader epoch after epoch."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        while True:
            yield from self.loader


class _DaliBatches:
    def __init__(self, it):
        self.it = it

    def __iter__(self):
        while True:
            for out in self.it:
                yield out[0]["images"], out[0]["labels"].view(-1)


def _decode_limit(folder: Path) -> float:
    """2 x one thread's plain simplejpeg (else Pillow) decodes per second of the folder's images."""
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:400]
    blobs = [p.read_bytes() for p in files]
    try:
        import simplejpeg

        def dec(b):
            return simplejpeg.decode_jpeg(b, "RGB")
    except ImportError:
        import io

        from PIL import Image

        def dec(b):
            return Image.open(io.BytesIO(b)).convert("RGB")
    t0 = time.process_time()
    for b in blobs:
        dec(b)
    return 2 * len(blobs) / max(time.process_time() - t0, 1e-9)


def _available(peer: str, python: str | None = None) -> str | None:
    """None when the peer imports (here, or under the interpreter ``python``), else the reason."""
    if python is not None:
        try:
            proc = subprocess.run([python, "-c", f"import {_MODULES[peer]}"], capture_output=True, text=True,
                                  timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{python}: {exc}"[:160]
        lines = proc.stderr.strip().splitlines()
        return None if proc.returncode == 0 else f"{python}: {lines[-1] if lines else proc.returncode}"[:160]
    try:
        importlib.import_module(_MODULES[peer])
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"{type(exc).__name__}: {exc}"[:160]
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", type=Path, help="the image folder (ImageFolder layout)")
    p.add_argument("--wds", type=Path, help="its shardfeed WebDataset copy")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=20, help="timed batches per case")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--storage-ms", type=float, default=None, help="also through the storage emulator at X ms")
    p.add_argument("--peer-python", default=None,
                   help="another interpreter that runs the peers this one cannot import (e.g. "
                        "/work/peers-venv/bin/python holding ffcv)")
    p.add_argument("--ffcv-cache", type=Path, default=Path("/tmp/shardfeed-bench-ffcv"),
                   help="where FFCV's .beton copy of --folder is written once [default: %(default)s]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        peer, task = args.case
        print(json.dumps(run_case(peer, task, args.folder, args.wds, args.workers, args.batches, args.ffcv_cache)))
        return 0
    status = {peer: _available(peer) for peer in PEERS}
    runner = {peer: sys.executable for peer in PEERS}
    if args.peer_python:
        for peer in PEERS:
            if status[peer] is not None:
                elsewhere = _available(peer, args.peer_python)
                if elsewhere is None:
                    status[peer], runner[peer] = None, args.peer_python
                else:
                    status[peer] += f"; {elsewhere}"
    places = [("local", args.folder, args.wds)]
    emus = []
    try:
        if args.storage_ms is not None:
            from storage_emulator import StorageEmulator

            emus = [StorageEmulator(args.folder, open_ms=args.storage_ms, read_ms=args.storage_ms).start(),
                    StorageEmulator(args.wds, open_ms=args.storage_ms, read_ms=args.storage_ms).start()]
            places.append((f"emulated {args.storage_ms:g} ms", emus[0].mountpoint, emus[1].mountpoint))
        results: dict = {}
        for r in range(args.rounds):
            for place, folder, wds in places:
                for peer in _DRIVEN:
                    if status[peer] is not None:
                        continue
                    for task in ("train", "val"):
                        cmd = [runner[peer], str(Path(__file__).resolve()), "--case", peer, task, "--folder",
                               str(folder), "--wds", str(wds), "--workers", str(args.workers), "--batches",
                               str(args.batches), "--ffcv-cache", str(args.ffcv_cache)]
                        proc = subprocess.run(cmd, capture_output=True, text=True)
                        if proc.returncode == 0:
                            res = json.loads(proc.stdout.strip().splitlines()[-1])
                        else:
                            res = {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
                        res["load_avg_1min"] = round(os.getloadavg()[0], 2)
                        results.setdefault(f"{place}|{peer}|{task}", []).append(res)
                        shown = (f"{res['images_per_s']:8,.0f} img/s {res['cpu_ms_per_image']:.3f} CPU ms/img"
                                 if "error" not in res else f"FAILED {res['error'][:100]}")
                        print(f"round {r + 1} {place:16s} {peer:12s} {task:5s} {shown}  load {res['load_avg_1min']}",
                              flush=True)
    finally:
        for e in emus:
            e.stop()
    limit = _decode_limit(args.folder)
    rows = []
    print(f"\n2-core decode limit (2 x one thread's plain decode): {limit:,.0f} images/s")
    print(f"{'place':16s} {'peer':24s} {'train img/s':>12s} {'CPU ms':>7s} {'val img/s':>10s} {'CPU ms':>7s}  load")
    for place, _, _ in places:
        for peer in PEERS:
            if status[peer] is not None or peer not in _DRIVEN:
                why = "not installed/importable: " + status[peer] if status[peer] else "imports; not driven here"
                rows.append({"place": place, "peer": peer, "status": why})
                print(f"{place:16s} {peer:24s} {why}")
                continue
            row = {"place": place, "peer": peer, "status": "ok"}
            cells = []
            for task in ("train", "val"):
                got = [x for x in results.get(f"{place}|{peer}|{task}", []) if "error" not in x]
                if not got:
                    errs = [x.get("error") for x in results.get(f"{place}|{peer}|{task}", [])]
                    row[task] = {"error": errs[:1]}
                    cells.append(f"{'failed':>12s} {'':>7s}")
                    continue
                ips = statistics.median(x["images_per_s"] for x in got)
                cpu = statistics.median(x["cpu_ms_per_image"] for x in got)
                row[task] = {"images_per_s": ips, "cpu_ms_per_image": cpu, "rounds": got}
                cells.append(f"{ips:12,.0f} {cpu:7.3f}")
            loads = [x.get("load_avg_1min") for t in ("train", "val") for x in results.get(f"{place}|{peer}|{t}", [])]
            rows.append(row)
            print(f"{place:16s} {peer:24s} {cells[0]} {cells[1] if len(cells) > 1 else ''}  {loads}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "decode_limit_images_per_s": limit, "workers": args.workers,
                                         "batches": args.batches, "peer_status": status,
                                         "peer_interpreter": runner}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
