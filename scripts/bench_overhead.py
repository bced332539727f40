#!/usr/bin/env python3
"""Loader CPU per image beyond decoding: evaluation crop, workers, small images; ratios in one run.

Every case runs in its own subprocess (``--case``), one after another in interleaved rounds, so the
figures of a round share the machine's load. A case builds ``make_loader(WDS, 64, ...)`` with
persistent workers, reads one warm-up epoch, then times ``--epochs`` epochs: images/s (wall clock)
and CPU ms per image (the main process's CPU time plus each worker's, from ``/proc/PID/stat``).
With ``--baseline-src DIR`` (a folder holding ``shardfeed/readers`` and ``shardfeed/convert`` of
another commit, e.g. ``git archive COMMIT readers convert | tar -x -C DIR/shardfeed``), the same
cases also run on that code (``PYTHONPATH=DIR``) for before/after ratios.

Cases (``train`` = random resized crop 224 + flip; ``val`` = resize shorter side 256, centre crop
224):

* ``val_builtin``: ``image_size=224, resize_size=256`` (the built-in evaluation transform);
* ``val_transform``: ``transform=`` a user function doing the same with
  ``torch.nn.functional.interpolate(antialias=True)`` on the whole decoded image (torchvision's
  ``Resize(256)`` + ``CenterCrop(224)`` on tensors);
* ``train_w2``, ``train_w0``: the training transform with 2 workers and in the main process;
* ``decode``: a plain simplejpeg decode of each image, main process (the decode floor).

CPU ms per image counts the main process and the workers together; for the 2-worker cases the main
process's share (receiving batches) is printed beside it.

The load average (``os.getloadavg``) is printed beside every figure: on a shared machine absolute
figures are noisy; the ratios of one round are what to read.

    .venv/bin/python scripts/bench_overhead.py --imagenet /tmp/perf_data/inet-wds \\
        --small /tmp/perf_data/small-wds --baseline-src /tmp/perf_base/src --rounds 3 \\
        --json out/bench_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = ("val_builtin", "val_transform", "train_w2", "train_w0", "val_w2", "decode")
_TICK = os.sysconf("SC_CLK_TCK")


def eval_transform_256_224(x):
    """User transform: ``uint8 [3, H, W]`` -> resize shorter side to 256 (antialiased bilinear) -> centre 224."""
    import torch.nn.functional as F

    h, w = x.shape[1:]
    nh, nw = (256, int(w * 256 / h + 0.5)) if h <= w else (int(h * 256 / w + 0.5), 256)
    y = F.interpolate(x[None], size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)[0]
    top, left = (nh - 224) // 2, (nw - 224) // 2
    return y[:, top : top + 224, left : left + 224].contiguous()


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _own_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _cpu_s(workers) -> float:
    return _own_cpu_s() + sum(_proc_cpu_s(w.pid) for w in workers)


def run_case(case: str, data: Path, epochs: int) -> dict:
    import torch

    from shardfeed.readers import make_loader

    torch.set_num_threads(1)
    if case == "decode":
        from shardfeed.readers import open_dataset
        from shardfeed.readers.decode.jpeg import simplejpeg_module

        sj = simplejpeg_module()
        blobs = []
        for s in open_dataset(data, decode=False, shuffle=False):
            try:
                sj.decode_jpeg(s.data, "RGB")  # what simplejpeg refuses (PNG, odd JPEGs) is left out
                blobs.append(s.data)
            except ValueError:
                pass
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for _ in range(epochs):
            for b in blobs:
                sj.decode_jpeg(b, "RGB")
                n += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"images": n, "images_per_s": n / wall, "cpu_ms_per_image": 1000 * cpu / n}
    workers = 0 if case.endswith("_w0") else 2
    opts: dict = {"image_size": 224, "train": case.startswith("train")}
    if case == "val_builtin":
        opts["resize_size"] = 256
    elif case == "val_transform":
        opts = {"image_size": None, "transform": eval_transform_256_224}
    loader = make_loader(data, 64, num_workers=workers, shuffle=True, seed=0, pin_memory=False, **opts)
    for _ in loader:  # warm-up epoch: starts the persistent workers
        pass
    it = iter(loader)
    first = next(it)
    procs = list(getattr(it, "_workers", []) or [])
    n = 0
    t0, c0, m0 = time.perf_counter(), _cpu_s(procs), _own_cpu_s()
    for images, labels in it:
        n += len(labels)
    for _ in range(epochs - 1):
        for images, labels in loader:
            n += len(labels)
    wall, cpu, main = time.perf_counter() - t0, _cpu_s(procs) - c0, _own_cpu_s() - m0
    assert first[0].shape[1:] == (3, 224, 224)
    return {"images": n, "images_per_s": n / wall, "cpu_ms_per_image": 1000 * cpu / n,
            "main_cpu_ms_per_image": 1000 * main / n}


def _subprocess(case: str, data: Path, epochs: int, baseline_src: Path | None) -> dict:
    env = dict(os.environ)
    if baseline_src is not None:
        env["PYTHONPATH"] = str(baseline_src)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", case, "--data", str(data), "--epochs", str(epochs)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["load_avg_1min"] = round(os.getloadavg()[0], 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--imagenet", type=Path, help="WebDataset of ImageNet-sized JPEGs (375-500 px)")
    p.add_argument("--small", type=Path, help="WebDataset of small JPEGs (64-96 px)")
    p.add_argument("--baseline-src", type=Path, default=None, help="folder holding another commit's shardfeed/")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per case")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args.data, args.epochs)))
        return 0
    plan = []
    for name, data, cases in (("imagenet", args.imagenet, ("val_builtin", "val_transform", "train_w2", "train_w0",
                                                            "decode")),
                              ("small", args.small, ("train_w2", "val_w2", "train_w0", "decode"))):
        if data is None:
            continue
        for case in cases:
            plan.append((name, case, "new", None))
            if args.baseline_src is not None and case not in ("val_builtin", "decode"):
                plan.append((name, case, "base", args.baseline_src))
    results: dict = {f"{d}/{c}/{v}": [] for d, c, v, _ in plan}
    for r in range(args.rounds):
        for dset, case, version, src in plan:
            data = args.imagenet if dset == "imagenet" else args.small
            res = _subprocess(case, data, args.epochs, src)
            results[f"{dset}/{case}/{version}"].append(res)
            shown = (f"{res['images_per_s']:8,.0f} img/s  {res['cpu_ms_per_image']:.3f} CPU ms/img"
                     if "error" not in res else f"ERROR {res['error']}")
            if "main_cpu_ms_per_image" in res and case.endswith("_w2"):
                shown += f" (main process {res['main_cpu_ms_per_image']:.3f})"
            print(f"round {r + 1}  {dset:8s} {case:14s} {version:4s} {shown}  load {res.get('load_avg_1min')}",
                  flush=True)

    def med(key: str, field: str) -> float | None:
        vals = [x[field] for x in results.get(key, []) if field in x]
        return statistics.median(vals) if vals else None

    def paired(a: str, b: str, field: str) -> float | None:
        pairs = [(x[field], y[field]) for x, y in zip(results.get(a, []), results.get(b, []))
                 if field in x and field in y]
        return statistics.median([x / y for x, y in pairs]) if pairs else None

    ratios = []

    def ratio(label: str, a: str, b: str, field: str, target: str = "") -> None:
        v = paired(a, b, field)
        loads = [x.get("load_avg_1min") for x in results.get(a, [])]
        ratios.append({"ratio": label, "value": v, "target": target, "a": a, "b": b, "field": field,
                       "load_avg_1min": loads})
        shown = f"{v:.3f}" if v is not None else "n/a"
        print(f"{label:70s} {shown:>7s}  {target:12s} load {loads}")

    print()
    print("median of per-round ratios (each round's figures share the machine's load):")
    if args.imagenet is not None:
        ratio("imagenet val: built-in resize_size=256 / transform= images/s", "imagenet/val_builtin/new",
              "imagenet/val_transform/new", "images_per_s", "> 1")
        ratio("imagenet val: built-in / transform= CPU ms per image", "imagenet/val_builtin/new",
              "imagenet/val_transform/new", "cpu_ms_per_image", "< 1")
        ratio("imagenet train: CPU ms/img 2 workers / 0 workers", "imagenet/train_w2/new",
              "imagenet/train_w0/new", "cpu_ms_per_image", "<= 1.05")
        ratio("imagenet train: CPU ms/img 2 workers / plain decode", "imagenet/train_w2/new",
              "imagenet/decode/new", "cpu_ms_per_image", "")
        if args.baseline_src is not None:
            ratio("imagenet train: 2 workers, CPU ms/img this / baseline", "imagenet/train_w2/new",
                  "imagenet/train_w2/base", "cpu_ms_per_image", "< 1")
            ratio("imagenet train: 2 workers, images/s this / baseline", "imagenet/train_w2/new",
                  "imagenet/train_w2/base", "images_per_s", "> 1")
            ratio("imagenet train: CPU ms/img 2 workers / 0 workers, baseline", "imagenet/train_w2/base",
                  "imagenet/train_w0/base", "cpu_ms_per_image", "")
            ratio("imagenet val: built-in 256/224 / baseline transform= images/s", "imagenet/val_builtin/new",
                  "imagenet/val_transform/base", "images_per_s", "> 1")
    if args.small is not None:
        ratio("small train: CPU ms/img 2 workers / 0 workers", "small/train_w2/new", "small/train_w0/new",
              "cpu_ms_per_image", "<= 1.05")
        ratio("small train: CPU ms/img 2 workers / plain decode", "small/train_w2/new", "small/decode/new",
              "cpu_ms_per_image", "")
        ratio("small val: CPU ms/img 2 workers / plain decode", "small/val_w2/new", "small/decode/new",
              "cpu_ms_per_image", "")
        if args.baseline_src is not None:
            for case in ("train_w2", "val_w2", "train_w0"):
                ratio(f"small {case}: CPU ms/img this / baseline", f"small/{case}/new", f"small/{case}/base",
                      "cpu_ms_per_image", "< 1")
                ratio(f"small {case}: images/s this / baseline", f"small/{case}/new", f"small/{case}/base",
                      "images_per_s", "> 1")
    medians = {k: {"images_per_s": med(k, "images_per_s"), "cpu_ms_per_image": med(k, "cpu_ms_per_image")}
               for k in results}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": results, "medians": medians, "ratios": ratios,
                                         "cpus": os.cpu_count(), "epochs": args.epochs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
