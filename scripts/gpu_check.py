#!/usr/bin/env python3
"""``make gpu-check``: the one-shot check for a machine with a CUDA GPU.

1. Checks that torch sees a CUDA device; without one it prints one line and exits 2.
2. Installs what it needs beyond ``make install``: the torchvision release matching the installed
   torch (``--no-deps``; nvJPEG batch decoding and resnet50), the ``gpu`` extra (``nvidia-ml-py``, for GPU
   utilisation from NVML). ResNet-50 needs no download: ``shardfeed.readers.measure.models`` builds it
   with torchvision when a working torchvision is installed, else from torch alone, randomly
   initialised either way (no pretrained weights are fetched).
3. Runs the ``gpu``-marked tests (``pytest -m gpu``).
4. Generates an ImageNet-sized image folder (375-500 px JPEGs, 100 classes; 4,096 images by
   default, written by all cores), packs it to WebDataset and LMDB, and runs
   ``shardfeed verify --device cuda --model resnet50`` folder vs WebDataset and folder vs LMDB,
   warm and ``--cold``, each with alternating rounds.
5. Writes ``OUT/report.json`` and prints a table: images/s (median and range of the rounds),
   data stall, GPU utilisation and memory (NVML), and the verdict of each comparison.

Sized to finish in under 8 minutes on one data-centre GPU (about 4 verify runs of 3 rounds, each
round reading ~2,800 images per side); comparisons that would not fit in ``--budget-s`` are
skipped and listed as such. Exit status: 0 when every step ran, 1 when a step failed, 2 without
CUDA.

``--device cpu`` runs every step on the CPU instead (to test this script on a machine without a
GPU); its figures are not a GPU check, and the report says so.

Examples::

    make gpu-check
    python scripts/gpu_check.py --out out/gpu-check --images 8192 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

__all__ = ["main", "cuda_status", "summarise_verify", "format_rows"]

#: Exit status without a usable CUDA device.
EXIT_NO_CUDA = 2


def cuda_status() -> tuple[bool, str, dict]:
    """``(usable, reason, info)``: whether torch sees a CUDA device, and why not when it does not."""
    smi = shutil.which("nvidia-smi")
    smi_ok = False
    if smi:
        try:
            smi_ok = subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            smi_ok = False
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (run make install)", {"nvidia_smi": smi_ok}
    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "nvidia_smi": smi_ok}
    if torch.cuda.is_available():
        info.update(device_count=torch.cuda.device_count(), name=torch.cuda.get_device_name(0))
        return True, "", info
    if smi_ok and torch.version.cuda is None:
        why = (f"nvidia-smi sees a GPU but torch {torch.__version__} is a CPU build: reinstall it "
               "(make install TORCH_SPEC='torch>=2.1' in a fresh .venv)")
    elif smi_ok:
        why = f"nvidia-smi sees a GPU but torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use it"
    else:
        why = f"no CUDA GPU on this machine (nvidia-smi {'fails' if smi else 'not found'}; torch {torch.__version__})"
    return False, why, info


def ensure_nvml(log) -> str | None:
    """Install the ``gpu`` extra when ``pynvml`` is missing; returns an error text or None."""
    try:
        import pynvml  # noqa: F401

        return None
    except ImportError:
        pass
    log("installing the gpu extra (nvidia-ml-py) for GPU utilisation ...")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{REPO}[gpu]"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"pip install -e '.[gpu]' failed: {r.stderr.strip()[-300:]}"
    return None


def matching_torchvision_spec(torch_version: str) -> str | None:
    """The torchvision release built against ``torch_version`` (torch 2.N.x pairs with 0.(N+15).x).

    The pairing is PyTorch's release table (torch 2.5 / torchvision 0.20 ... torch 2.9 / 0.24).
    Returns None for a version outside the 2.x series.
    """
    m = re.match(r"2\.(\d+)\.(\d+)", torch_version)
    if not m:
        return None
    return f"torchvision==0.{int(m.group(1)) + 15}.*"


def ensure_torchvision(log) -> str | None:
    """Install the torchvision matching the installed torch (nvJPEG decoding and resnet50).

    Installed with ``--no-deps`` so pip never swaps the CUDA torch for another build. Returns an
    error text or None; a failure only means the nvJPEG tests skip with their reason.
    """
    try:
        import torchvision  # noqa: F401

        return None
    except Exception:  # noqa: BLE001 - a torchvision built for another torch fails at import
        pass
    import torch

    spec = matching_torchvision_spec(torch.__version__)
    if spec is None:
        return f"no torchvision release known for torch {torch.__version__}"
    log(f"installing {spec} (nvJPEG batch decoding) ...")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", spec],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"pip install {spec} failed: {r.stderr.strip()[-300:]}"
    return None


def run_gpu_tests(out: Path, tests: str, log) -> dict:
    """``pytest -m gpu`` on ``tests``; the output goes to ``OUT/pytest-gpu.txt``."""
    log(f"pytest -m gpu {tests} ...")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-m", "gpu and not ray", "-p", "no:cacheprovider",
                        tests], cwd=REPO, capture_output=True, text=True)
    (out / "pytest-gpu.txt").write_text(r.stdout + r.stderr)
    lines = [x for x in r.stdout.strip().splitlines() if x.strip()]
    return {"returncode": r.returncode, "summary": lines[-1] if lines else "", "seconds": time.perf_counter() - t0,
            "ok": r.returncode == 0}


def _gen_part(args) -> int:
    from make_sample_data import make_image_folder

    folder, params, part = args
    return make_image_folder(folder, part=part, **params)


def make_data(folder: Path, num_images: int, num_classes: int, min_size: int, max_size: int) -> dict:
    """The ImageNet-sized folder (JPEG only), written by one process per core; kept between runs."""
    t0 = time.perf_counter()
    params = {"num_images": num_images, "num_classes": num_classes, "min_size": min_size, "max_size": max_size,
              "png_share": 0.0, "seed": 0}
    n = max(1, min(os.cpu_count() or 1, 32))
    with mp.get_context("spawn").Pool(n) as pool:
        written = sum(pool.map(_gen_part, [(str(folder), params, (k, n)) for k in range(n)]))
    size = sum(f.stat().st_size for f in folder.rglob("*.jpg"))
    return {"folder": str(folder), "num_images": num_images, "num_classes": num_classes, "written_now": written,
            "bytes": size, "sizes_px": [min_size, max_size], "seconds": time.perf_counter() - t0}


def _shardfeed() -> list[str]:
    exe = Path(sys.executable).with_name("shardfeed")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "shardfeed.convert.cli"]


def pack(folder: Path, out: Path, fmt: str, max_count: int) -> dict:
    """``shardfeed pack`` (WebDataset with ``max_count`` samples per shard, or LMDB)."""
    t0 = time.perf_counter()
    args = [*_shardfeed(), "pack", str(folder), str(out), "--format", fmt, "--overwrite"]
    if fmt == "wds":
        args += ["--max-count", str(max_count)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"shardfeed pack --format {fmt} failed: {r.stderr.strip()[-500:]}")
    return {"out": str(out), "format": fmt, "seconds": time.perf_counter() - t0}


def run_verify(before: Path, after: Path, json_path: Path, cold: bool, a: argparse.Namespace, log) -> dict:
    """``shardfeed verify BEFORE AFTER --device ... --json``; returns its JSON (or the error)."""
    args = [*_shardfeed(), "verify", str(before), str(after), "--device", a.device, "--model", a.model,
            "--batch-size", str(a.batch_size), "--image-size", str(a.image_size), "--batches", str(a.batches),
            "--warmup", str(a.warmup), "--repeats", str(a.repeats), "--num-workers", str(a.num_workers),
            "--json", str(json_path)]
    if cold:
        args.append("--cold")
    log("$ " + " ".join(args[1:] if args[0].endswith("shardfeed") else args))
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    (json_path.with_suffix(".txt")).write_text(r.stdout + r.stderr)
    if r.returncode != 0 or not json_path.exists():
        return {"ok": False, "returncode": r.returncode, "seconds": seconds, "error": r.stderr.strip()[-800:]}
    return {"ok": True, "returncode": 0, "seconds": seconds, "result": json.loads(json_path.read_text())}


def _side(runs: list[dict], label: str) -> dict:
    ips = [r["images_per_s"] for r in runs if r.get("label") == label]
    util = [r["gpu_util"] for r in runs if r.get("label") == label and r.get("gpu_util") is not None]
    mem = [((r.get("gpu") or {}).get("nvml") or {}).get("memory_used_max_bytes") for r in runs
           if r.get("label") == label]
    mem = [m for m in mem if m]
    return {"images_per_s": ips, "gpu_util": util, "gpu_memory_max_bytes": max(mem) if mem else None}


def summarise_verify(result: dict) -> dict:
    """The figures of one ``verify --json`` result that the table shows, per side."""
    runs = result.get("runs") or []
    out = {}
    for label in ("before", "after"):
        median = result[label]
        side = _side(runs, label)
        out[label] = {"source": median["config"].get("source"), "format": median["config"].get("source_format"),
                      "images_per_s_median": median["images_per_s"], "images_per_s_rounds": side["images_per_s"],
                      "stall_share": median["stall_share"], "gpu_util_median_run": median.get("gpu_util"),
                      "gpu_util_rounds": side["gpu_util"], "gpu_memory_max_bytes": side["gpu_memory_max_bytes"],
                      "device": median.get("device"), "gpu_name": (median.get("gpu") or {}).get("name")}
    verdict = result.get("verdict") or {}
    out["speedup"] = result.get("speedup")
    out["verdict"] = verdict.get("text") or result.get("headline")
    out["verdict_kind"] = verdict.get("kind")
    return out


def pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def format_rows(comparisons: list[dict]) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """Table rows (and the header) from the report's comparisons."""
    header = ("cache", "dataset", "images/s", "rounds (min-max)", "data stall", "GPU util", "GPU mem", "verdict")
    rows = []
    for c in comparisons:
        if not c.get("ok"):
            rows.append((c["cache"], c["after_format"], "-", "-", "-", "-", "-", c.get("status", "failed")))
            continue
        s = c["summary"]
        for label in ("before", "after"):
            side = s[label]
            rounds = side["images_per_s_rounds"] or [side["images_per_s_median"]]
            mem = side["gpu_memory_max_bytes"]
            verdict = "" if label == "before" else (s["verdict"] or "")
            rows.append((c["cache"], side["format"] or "?", f"{side['images_per_s_median']:.0f}",
                         f"{min(rounds):.0f}-{max(rounds):.0f}", pct(side["stall_share"]),
                         pct(side["gpu_util_median_run"]), "n/a" if not mem else f"{mem / 2**30:.1f} GiB", verdict))
    return rows, header


def _check_numbers(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse sizes and counts no check can run with (exit 2 naming the option), before any work."""
    import math

    at_least = {"--classes": (a.classes, 1), "--images": (a.images, max(a.classes, 1)),
                "--min-size": (a.min_size, 1), "--max-size": (a.max_size, a.min_size),
                "--image-size": (a.image_size, 1), "--batch-size": (a.batch_size, 1), "--batches": (a.batches, 1),
                "--warmup": (a.warmup, 0), "--repeats": (a.repeats, 1), "--shard-count": (a.shard_count, 1)}
    if a.num_workers is not None:
        at_least["--num-workers"] = (a.num_workers, 0)
    for option, (value, low) in at_least.items():
        if value < low:
            what = {"--images": "--classes (one image a class at least)", "--max-size": "--min-size"}.get(option)
            p.error(f"{option} {value}: must be at least {low}" + (f", from {what}" if what else ""))
    if not math.isfinite(a.budget_s) or a.budget_s <= 0:
        p.error(f"--budget-s {a.budget_s}: must be a positive number of seconds")


def _parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/gpu-check", help="output folder (report.json, logs, data)")
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (to test this script only)")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--images", type=int, default=4096, help="images generated (ImageNet-sized)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--min-size", type=int, default=375, help="smallest width/height, px")
    p.add_argument("--max-size", type=int, default=500, help="largest width/height, px")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=96, help="images per batch")
    p.add_argument("--batches", type=int, default=24, help="measured batches per run")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds per comparison")
    p.add_argument("--num-workers", type=int, default=None, help="loader workers [min(12, CPU count - 2), >= 2]")
    p.add_argument("--shard-count", type=int, default=256, help="WebDataset: samples per shard")
    p.add_argument("--budget-s", type=float, default=420, help="comparisons that would end later are skipped")
    p.add_argument("--tests", default="tests", help="where pytest looks for gpu-marked tests")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    a = p.parse_args(argv)
    _check_numbers(p, a)
    if a.num_workers is None:
        a.num_workers = max(2, min(12, (os.cpu_count() or 1) - 2))
    return a


def _comparisons(a: argparse.Namespace, out: Path, data: Path, packed: dict, t_start: float, log) -> list[dict]:
    comps = []
    last_s = 0.0
    for cold in (False, True):
        for fmt in ("webdataset", "lmdb"):
            cache = "cold" if cold else "warm"
            entry = {"cache": cache, "after_format": fmt, "ok": False}
            if time.perf_counter() - t_start + last_s > a.budget_s:
                entry["status"] = f"skipped (--budget-s {a.budget_s:.0f} s)"
                comps.append(entry)
                continue
            res = run_verify(data, packed[fmt], out / f"verify-{cache}-{fmt}.json", cold, a, log)
            last_s = max(last_s, res["seconds"])
            entry.update(ok=res["ok"], seconds=res["seconds"])
            if res["ok"]:
                entry["summary"] = summarise_verify(res["result"])
                entry["json"] = str(out / f"verify-{cache}-{fmt}.json")
                log(f"  {cache} folder vs {fmt}: {entry['summary']['verdict']} ({res['seconds']:.0f} s)")
            else:
                entry["status"] = f"verify failed (status {res['returncode']})"
                entry["error"] = res["error"]
                log(f"  {cache} folder vs {fmt}: FAILED: {res['error'][-300:]}")
            comps.append(entry)
    return comps


def main(argv=None) -> int:
    a = _parse(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"gpu-check: {msg}", file=sys.stderr, flush=True)

    if a.device.startswith("cuda"):
        ok, why, info = cuda_status()
        if not ok:
            print(f"gpu-check: {why}: nothing checked", file=sys.stderr)
            return EXIT_NO_CUDA
    else:
        info = {"note": "--device cpu: this tests the script; it is not a GPU check"}
        log(info["note"])
    out = Path(a.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"version": 1, "device": a.device, "machine": info, "cpu_count": os.cpu_count(),
                    "settings": {k: v for k, v in vars(a).items() if k != "out"}, "problems": []}
    if a.device.startswith("cuda"):
        for ensure in (ensure_nvml, ensure_torchvision):
            err = ensure(log)
            if err:
                report["problems"].append(err)
    report["gpu_tests"] = None if a.skip_tests else run_gpu_tests(out, a.tests, log)
    if report["gpu_tests"] and not report["gpu_tests"]["ok"]:
        report["problems"].append(f"gpu tests: {report['gpu_tests']['summary']}")
    log(f"generating {a.images} images ({a.min_size}-{a.max_size} px) ...")
    data = out / "data" / "folder"
    report["data"] = make_data(data, a.images, a.classes, a.min_size, a.max_size)
    packed = {"webdataset": out / "data" / "wds", "lmdb": out / "data" / "lmdb"}
    report["pack"] = [pack(data, packed["webdataset"], "wds", a.shard_count), pack(data, packed["lmdb"], "lmdb", 0)]
    report["comparisons"] = _comparisons(a, out, data, packed, t_start, log)
    report["problems"] += [f"{c['cache']} folder vs {c['after_format']}: {c['status']}"
                           for c in report["comparisons"] if not c["ok"] and "error" in c]
    report["skipped"] = [f"{c['cache']} folder vs {c['after_format']}: {c['status']}"
                         for c in report["comparisons"] if not c["ok"] and "error" not in c]
    report["total_s"] = time.perf_counter() - t_start
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    from shardfeed.readers.measure import format_table

    rows, header = format_rows(report["comparisons"])
    print(format_table(rows, header=header))
    name = info.get("name") or a.device
    print(f"{name}; model {a.model}, batch {a.batch_size}, {a.num_workers} loader workers, {a.repeats} rounds; "
          f"{report['data']['num_images']} images of {a.min_size}-{a.max_size} px; {report['total_s']:.0f} s in all")
    if report["gpu_tests"]:
        print(f"gpu tests: {report['gpu_tests']['summary']}")
    for skip in report["skipped"]:
        print(f"skipped: {skip}")
    for prob in report["problems"]:
        print(f"problem: {prob}")
    print(f"wrote {out / 'report.json'}")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
