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
* ``litdata``: ``litdata.StreamingDataset`` over its own copy of the image folder (written once by
  ``litdata.optimize`` into ``--peer-cache``: each image's file bytes as they are, and its label),
  in its ``StreamingDataLoader``;
* ``mosaicml-streaming``: ``streaming.StreamingDataset`` over its own MDS copy of the image folder
  (written once by ``streaming.MDSWriter`` into ``--peer-cache``: the file bytes and the label), in
  a ``DataLoader``;
* ``torchvision-imagefolder``: ``torchvision.datasets.ImageFolder`` over the image folder, in a
  ``DataLoader`` (shuffled).

The last three decode with Pillow and crop with torchvision's classic transforms on the decoded
image: ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()`` (train) or ``Resize(256)`` +
``CenterCrop(224)`` (val), then ``PILToTensor()``. Converted copies (FFCV's, litdata's, MDS) are
written before the timed cases, and their writing time is reported beside the table, never inside
a case's figures. CPU time per image is the process's own CPU time plus that of all its child
processes (loader workers) over the timed batches, divided by the images they delivered.

A peer that does not import here but does under ``--peer-python PY`` (another interpreter, e.g. a
separate virtual environment holding FFCV and its numba, which would not fit this one's pins) is
run by that interpreter: this script runs its cases as ``PY bench_peers.py --case ...``.

Each case runs in its own subprocess, cases interleaved round by round; the load average is printed
beside every figure, and the 2-core decode limit (twice a plain one-thread decode of every image)
beside the table. ``--storage-ms X`` runs the same cases with the data behind
``scripts/storage_emulator.py`` (X ms per open and per read request): the image folder, the
WebDataset shards and each peer's converted copy are read through their own mounts.

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
#: the modules each peer's cases import (comma-separated)
_MODULES = {"shardfeed": "shardfeed.readers", "webdataset": "webdataset", "dali-cpu": "nvidia.dali",
            "litdata": "litdata, torchvision.transforms", "mosaicml-streaming": "streaming, torchvision.transforms",
            "ffcv": "ffcv", "torchvision-imagefolder": "torchvision.datasets, torchvision.transforms"}
#: peers this script drives; the others are reported as imported or not
_DRIVEN = PEERS
#: peers that read their own copy of the image folder, written once before the timed cases
_CONVERTED = ("litdata", "mosaicml-streaming", "ffcv")


def _thread_cpu_ns(pid: int) -> dict[tuple[int, int], int]:
    """Each live thread of process ``pid`` and its time on a CPU so far, nanoseconds, from
    ``/proc/PID/task/TID/schedstat`` (as precise as ``getrusage`` is for this process; the clock
    ticks of ``/proc/PID/stat`` are 10 ms, some 10 ms of rounding per worker over a short window).
    Empty when the process is gone or the kernel keeps no schedstat."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids[:4096]:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[(pid, int(tid))] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended between the listing and the read
            continue
    return out


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


def _descendants(root: int) -> list[int]:
    """The process ids of every live descendant of ``root`` (loader workers and their children)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo and len(out) < 10_000:
        pid = todo.pop()
        kids = [c for c, pp in parent.items() if pp == pid]
        out += kids
        todo += kids
    return out


def _children_threads_ns(pids: list[int]) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for pid in pids:
        out.update(_thread_cpu_ns(pid))
    return out


def _cpu_between_s(before: dict[tuple[int, int], int], after: dict[tuple[int, int], int]) -> float:
    """CPU seconds the threads alive at the end spent since ``before`` (a thread started inside the
    window counts whole; one that ended inside it is not counted)."""
    return sum(ns - before.get(key, 0) for key, ns in after.items()) / 1e9


def _time_loader(loader, batches: int, warmup: int = 1) -> dict:
    """Images/s and CPU ms per image over ``batches`` batches of ``loader``, after ``warmup`` batches.

    With one warm-up batch per loader worker (or decode thread), each worker's one-time start-up
    (imports, its first buffers) falls before the timed window for every peer alike. CPU is this
    process's plus that of its descendants alive after the warm-up (their threads' nanoseconds on a
    CPU, read from ``/proc``), so loader workers count whatever loader started them.
    """
    it = iter(loader)
    for _ in range(max(1, warmup)):
        next(it)
    procs = _descendants(os.getpid())
    own0, threads0 = _own_cpu_s(), _children_threads_ns(procs)
    t0 = time.perf_counter()
    n = 0
    for i, batch in enumerate(it):
        n += len(batch[1])
        if i + 1 >= batches:
            break
    wall = time.perf_counter() - t0
    cpu = _own_cpu_s() - own0 + _cpu_between_s(threads0, _children_threads_ns(procs))
    return {"images": n, "images_per_s": n / wall, "cpu_ms_per_image": 1000 * cpu / max(n, 1),
            "child_processes": len(procs)}


def run_case(peer: str, task: str, folder: Path, wds: Path, workers: int, batches: int,
             ffcv_cache: Path = Path("/tmp/shardfeed-bench-ffcv"), data: Path | None = None,
             warmup: int = 1) -> dict:
    """One timed case: ``peer`` on ``task`` ("train" or "val"), in this process.

    ``data`` is the peer's own converted copy (``prepare``'s path; for FFCV, ``ffcv_cache`` is used
    to write one when it is None). Returns ``_time_loader``'s figures; raises ``ValueError`` for an
    unknown peer and whatever the peer raises.
    """
    import torch

    torch.set_num_threads(1)
    train = task == "train"
    if peer == "shardfeed":
        from shardfeed.readers import make_loader

        opts = {} if train else {"resize_size": 256}
        loader = make_loader(wds, 64, num_workers=workers, image_size=224, train=train, pin_memory=False, **opts)
        return _time_loader(_Repeat(loader), batches, warmup)
    if peer == "webdataset":
        import webdataset as wdsmod

        shards = sorted(str(p) for p in Path(wds).glob("*.tar"))
        ds = (wdsmod.WebDataset(shards, shardshuffle=True, empty_check=False).repeat().shuffle(1000)
              .decode("rgb8").to_tuple("jpg;jpeg;png", "cls").map(_WdsTransform(train)).batched(64))
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
        return _time_loader(loader, batches, warmup)
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
        return _time_loader(_DaliBatches(it), batches, warmup)
    if peer == "ffcv":
        beton = data if data is not None else _ffcv_write(folder, ffcv_cache)
        return _time_loader(_Repeat(_ffcv_loader(beton, train, workers)), batches, warmup)
    if peer == "torchvision-imagefolder":
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(str(folder), transform=_tv_transform(train))
        return _time_loader(_Repeat(_torch_loader(ds, workers, shuffle=True)), batches, warmup)
    if peer == "litdata":
        from litdata import StreamingDataLoader

        loader = StreamingDataLoader(_litdata_dataset(_need(data, peer), train), batch_size=64, num_workers=workers,
                                     drop_last=True, persistent_workers=workers > 0)
        return _time_loader(_Repeat(loader), batches, warmup)
    if peer == "mosaicml-streaming":
        return _time_loader(_Repeat(_torch_loader(_mds_dataset(_need(data, peer), train), workers)), batches, warmup)
    raise ValueError(peer)


def _need(data: Path | None, peer: str) -> Path:
    if data is None:
        raise ValueError(f"{peer} needs --data (its converted copy of the folder)")
    return data


def _torch_loader(ds, workers: int, shuffle: bool = False):
    import torch

    return torch.utils.data.DataLoader(ds, batch_size=64, shuffle=shuffle, num_workers=workers, drop_last=True,
                                       persistent_workers=workers > 0)


def _tv_transform(train: bool):
    """torchvision's classic tasks on a decoded Pillow image, ending in a uint8 (3, 224, 224) tensor."""
    from torchvision import transforms as T

    if train:
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])


def _decode(blob: bytes):
    import io

    from PIL import Image

    with Image.open(io.BytesIO(blob)) as im:
        return im.convert("RGB")


def _folder_files(folder: Path) -> list[tuple[Path, int]]:
    """(file, label) of an ImageFolder layout: classes are the sorted sub-folder names."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return [(f, label) for label, c in enumerate(classes) for f in sorted((folder / c).iterdir()) if f.is_file()]


def _folder_tag(folder: Path, files: list[tuple[Path, int]]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(f"{f}:{f.stat().st_size}" for f, _ in files).encode()).hexdigest()[:16]


def _litdata_item(item):
    """litdata.optimize's per-input function: one (path, label) to its stored sample."""
    path, label = item
    return {"image": Path(path).read_bytes(), "label": int(label)}


def _litdata_write(folder: Path, cache: Path) -> Path:
    """litdata's copy of ``folder`` (``litdata.optimize``: file bytes + label), written once."""
    import shutil

    import litdata

    files = _folder_files(folder)
    out = cache / "litdata" / f"{folder.name}-{_folder_tag(folder, files)}"
    if not (out / "index.json").exists():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        litdata.optimize(fn=_litdata_item, inputs=[(str(f), label) for f, label in files], output_dir=str(tmp),
                         chunk_bytes="64MB", num_workers=1)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def _litdata_dataset(path: Path, train: bool):
    import litdata

    transform = _tv_transform(train)

    class Decoded(litdata.StreamingDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return transform(_decode(sample["image"])), int(sample["label"])

    return Decoded(str(path), shuffle=True, drop_last=True)


def _mds_write(folder: Path, cache: Path) -> Path:
    """MosaicML streaming's MDS copy of ``folder`` (``MDSWriter``: file bytes + label), written once."""
    import shutil

    from streaming import MDSWriter

    files = _folder_files(folder)
    out = cache / "mds" / f"{folder.name}-{_folder_tag(folder, files)}"
    if not (out / "index.json").exists():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        with MDSWriter(out=str(tmp), columns={"image": "bytes", "label": "int"}, size_limit=64 << 20) as w:
            for f, label in files:
                w.write({"image": f.read_bytes(), "label": label})
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def _mds_dataset(path: Path, train: bool):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    transform = _tv_transform(train)

    class Decoded(StreamingDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return transform(_decode(sample["image"])), int(sample["label"])

    return Decoded(local=str(path), shuffle=True, batch_size=64)


def prepare(peer: str, folder: Path, peer_cache: Path, ffcv_cache: Path) -> Path | None:
    """Write ``peer``'s own copy of ``folder`` (once; reused while the folder's files are the same).

    Returns its path (a ``.beton`` file for FFCV, a folder for litdata and MDS), or None for a peer
    that reads the folder or the shards as they are. Raises whatever the peer's writer raises.
    """
    if peer == "ffcv":
        return _ffcv_write(folder, ffcv_cache)
    if peer == "litdata":
        return _litdata_write(folder, peer_cache)
    if peer == "mosaicml-streaming":
        return _mds_write(folder, peer_cache)
    return None


def _ffcv_write(folder: Path, cache: Path) -> Path:
    """FFCV's ``.beton`` copy of ``folder`` (JPEG quality 90 by its writer), written once."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    files = _folder_files(folder)
    beton = cache / f"{folder.name}-{_folder_tag(folder, files)}.beton"
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
                      num_workers=2).from_indexed_dataset(Folder())
        tmp.rename(beton)
    return beton


def _ffcv_loader(beton: Path, train: bool, workers: int):
    """FFCV's loader over the ``.beton`` file ``beton``."""
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

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
    """None when the peer imports (here, or under the interpreter ``python``), else the reason.

    Under ``python``, a ``peers-install.txt`` beside its virtual environment (written by
    ``scripts/install_peers.sh``) that names the peer adds why its install failed.
    """
    mods = [m.strip() for m in _MODULES[peer].split(",")]
    if python is not None:
        try:
            proc = subprocess.run([python, "-c", "import " + ", ".join(mods)], capture_output=True, text=True,
                                  timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{python}: {exc}"[:160]
        if proc.returncode == 0:
            return None
        lines = proc.stderr.strip().splitlines()
        why = f"{python}: {lines[-1] if lines else proc.returncode}"[:160]
        return why + _install_note(peer, python)
    try:
        for m in mods:
            importlib.import_module(m)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"{type(exc).__name__}: {exc}"[:160]
    return None


def _install_note(peer: str, python: str) -> str:
    report = Path(python).parent.parent / "peers-install.txt"
    try:
        lines = report.read_text(errors="replace").splitlines()[:50]
    except OSError:
        return ""
    for line in lines:
        if line.startswith(f"{peer}: ") or (line.startswith("torch: ") and "torchvision" in _MODULES[peer]):
            return f" (install: {line[:200]})"
    return ""


def _last_line(text: str, fallback: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return (lines[-1] if lines else fallback)[:300]


def markdown_table(rows: list[dict]) -> str:
    """The result rows (``main``'s ``rows``, as in ``--json``) as a Markdown table.

    Rates are images/s, CPU in ms per image (medians over the rounds), and the last column the
    range of the 1-minute load average over the row's cases; a row that did not run says why.
    """
    out = ["| storage | loader | train images/s | train CPU ms/image | val images/s | val CPU ms/image "
           "| load average (1 min) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            why = str(r["status"]).replace("|", "/")[:300]
            out.append(f"| {r['place']} | {r['peer']} | {why} | | | | |")
            continue
        cells, loads = [], []
        for task in ("train", "val"):
            x = r.get(task, {})
            if "images_per_s" not in x:
                err = (x.get("error") or ["no result"])[0]
                cells += ["failed: " + str(err).replace("|", "/")[:160], ""]
                continue
            cells += [f"{x['images_per_s']:,.0f}", f"{x['cpu_ms_per_image']:.2f}"]
            loads += [y["load_avg_1min"] for y in x["rounds"] if "load_avg_1min" in y]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else ""
        out.append(f"| {r['place']} | {r['peer']} | " + " | ".join(cells) + f" | {load} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", type=Path, help="the image folder (ImageFolder layout)")
    p.add_argument("--wds", type=Path, help="its shardfeed WebDataset copy")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=20, help="timed batches per case")
    p.add_argument("--warmup", type=int, default=None,
                   help="batches before the timed ones [default: one per worker, at least 1: every worker's "
                        "start-up falls before the timed window]")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--storage-ms", type=float, default=None, help="also through the storage emulator at X ms")
    p.add_argument("--peer-python", default=None,
                   help="another interpreter that runs the peers this one cannot import (e.g. "
                        ".venv-peers/bin/python holding ffcv, litdata, mosaicml-streaming, torchvision)")
    p.add_argument("--ffcv-cache", type=Path, default=Path("/tmp/shardfeed-bench-ffcv"),
                   help="where FFCV's .beton copy of --folder is written once [default: %(default)s]")
    p.add_argument("--peer-cache", type=Path, default=Path("/tmp/shardfeed-bench-peers"),
                   help="where litdata's and MDS copies of --folder are written once [default: %(default)s]")
    p.add_argument("--peers", default=",".join(PEERS),
                   help="comma-separated peers to run [default: all: %(default)s]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None,
                   help="also write the table as Markdown (the one in docs/performance.md) to this file")
    p.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--prepare", help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    chosen = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in PEERS]
    if unknown:
        p.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    if args.workers < 0 or args.batches < 1 or args.rounds < 1 or (args.warmup is not None and args.warmup < 1):
        p.error("--workers must be >= 0, --batches, --rounds and --warmup >= 1")
    warmup = args.warmup if args.warmup is not None else max(1, args.workers)
    if args.prepare:
        if args.prepare not in PEERS:
            p.error(f"unknown peer {args.prepare}")
        t0 = time.perf_counter()
        out = prepare(args.prepare, args.folder, args.peer_cache, args.ffcv_cache)
        print(json.dumps({"path": None if out is None else str(out), "seconds": time.perf_counter() - t0}))
        return 0
    if args.case:
        peer, task = args.case
        print(json.dumps(run_case(peer, task, args.folder, args.wds, args.workers, args.batches, args.ffcv_cache,
                                  args.data, warmup)))
        return 0
    if args.folder is None or args.wds is None:
        p.error("--folder and --wds are required")
    status = {peer: _available(peer) if peer in chosen else "not chosen (--peers)" for peer in PEERS}
    runner = {peer: sys.executable for peer in PEERS}
    if args.peer_python:
        for peer in chosen:
            if status[peer] is not None:
                elsewhere = _available(peer, args.peer_python)
                if elsewhere is None:
                    status[peer], runner[peer] = None, args.peer_python
                else:
                    status[peer] += f"; {elsewhere}"
    script = str(Path(__file__).resolve())
    # each converted peer's own copy, written before any timed case
    copies: dict[str, Path] = {}
    convert_s: dict[str, float] = {}
    for peer in _CONVERTED:
        if status[peer] is not None:
            continue
        print(f"writing {peer}'s copy of {args.folder} (not timed in the cases)", flush=True)
        proc = subprocess.run([runner[peer], script, "--prepare", peer, "--folder", str(args.folder),
                               "--peer-cache", str(args.peer_cache), "--ffcv-cache", str(args.ffcv_cache)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            status[peer] = "writing its copy failed: " + _last_line(proc.stderr, f"exit {proc.returncode}")
            print(f"{peer}: {status[peer]}", flush=True)
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        copies[peer], convert_s[peer] = Path(got["path"]), round(got["seconds"], 1)
    places = [("local", args.folder, args.wds, dict(copies))]
    emus = []
    try:
        if args.storage_ms is not None:
            from storage_emulator import StorageEmulator

            def mount(src: Path) -> Path:
                emus.append(StorageEmulator(src, open_ms=args.storage_ms, read_ms=args.storage_ms).start())
                return Path(emus[-1].mountpoint)

            em_folder, em_wds = mount(args.folder), mount(args.wds)
            em_copies = {}
            roots: dict[Path, Path] = {}
            for peer, path in copies.items():
                root = args.ffcv_cache if peer == "ffcv" else args.peer_cache
                if root not in roots:
                    roots[root] = mount(root)
                em_copies[peer] = roots[root] / path.relative_to(root)
            places.append((f"emulated {args.storage_ms:g} ms", em_folder, em_wds, em_copies))
        results: dict = {}
        for r in range(args.rounds):
            for place, folder, wds, data in places:
                for peer in _DRIVEN:
                    if status[peer] is not None:
                        continue
                    for task in ("train", "val"):
                        cmd = [runner[peer], script, "--case", peer, task, "--folder",
                               str(folder), "--wds", str(wds), "--workers", str(args.workers), "--batches",
                               str(args.batches), "--warmup", str(warmup), "--ffcv-cache", str(args.ffcv_cache)]
                        if peer in data:
                            cmd += ["--data", str(data[peer])]
                        proc = subprocess.run(cmd, capture_output=True, text=True)
                        if proc.returncode == 0:
                            res = json.loads(proc.stdout.strip().splitlines()[-1])
                        else:
                            res = {"error": _last_line(proc.stderr, f"exit {proc.returncode}")}
                        res["load_avg_1min"] = round(os.getloadavg()[0], 2)
                        results.setdefault(f"{place}|{peer}|{task}", []).append(res)
                        shown = (f"{res['images_per_s']:8,.0f} img/s {res['cpu_ms_per_image']:.3f} CPU ms/img"
                                 if "error" not in res else f"FAILED {res['error'][:100]}")
                        print(f"round {r + 1} {place:16s} {peer:24s} {task:5s} {shown}  load {res['load_avg_1min']}",
                              flush=True)
    finally:
        for e in emus:
            e.stop()
    limit = _decode_limit(args.folder)
    rows = []
    print(f"\n2-core decode limit (2 x one thread's plain decode): {limit:,.0f} images/s")
    if convert_s:
        print("copies written before the cases (s): " + ", ".join(f"{k} {v:g}" for k, v in convert_s.items()))
    print(f"{'place':16s} {'peer':24s} {'train img/s':>12s} {'CPU ms':>7s} {'val img/s':>10s} {'CPU ms':>7s}  load")
    for place, _, _, _ in places:
        for peer in PEERS:
            if status[peer] is not None or peer not in _DRIVEN:
                why = status[peer] if status[peer] else "imports; not driven here"
                if status[peer] and not status[peer].startswith(("not chosen", "writing")):
                    why = "not installed/importable: " + status[peer]
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
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown_table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "decode_limit_images_per_s": limit, "workers": args.workers,
                                         "batches": args.batches, "warmup": warmup, "peer_status": status,
                                         "peer_interpreter": runner, "copy_write_s": convert_s}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
