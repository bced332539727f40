#!/usr/bin/env python3
"""``shardfeed doctor``'s predicted images/s against ``shardfeed bench`` measured, on a folder of mixed
small and large images.

It plants a folder (default: 2,000 small PNGs of 48x48 and 40 photos of 3000x2250 as JPEG, 2 % of
the files and most of the decode time) in class folders, then runs, for each round, ``doctor``
(page cache warm, the loader's ``--image-size``) and ``bench --model none`` (the loader's
ceiling: no step) with the same workers, one after the other. It prints per round:

* doctor's prediction for a quiet machine, and for the cores other processes left free while
  ``bench`` ran (doctor's CPU ceiling, :func:`shardfeed.readers.measure.doctor_model.cpu_ceiling`,
  on the free cores, capped by the quiet figure), against bench's images/s, and the ratios;
* the CPU seconds per image: doctor's decode, file system calls, collate, hand-off and conversion
  to float, bench's workers and main process, a figure other processes change much less.

On a machine other processes keep busy, the quiet prediction is a ceiling the measurement does
not reach; compare the "now" column.

Examples::

    python scripts/doctor_vs_bench.py
    python scripts/doctor_vs_bench.py --data data/mixed --rounds 5 --num-workers 2 --json out/doctor_vs_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["main", "make_mixed_folder", "run_round"]


def make_mixed_folder(root: Path, small: int, large: int, classes: int = 4) -> Path:
    """Plant ``small`` PNGs (48x48) and ``large`` JPEGs (3000x2250) in ``classes`` class folders under
    ``root`` (deterministic content); returns ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(7)
    tile = rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)
    y, x = np.mgrid[0:2250, 0:3000]
    big = np.stack([(x * 7) % 256, (y * 3) % 256, ((x + y) * 5) % 256], -1).astype(np.uint8)
    for i in range(small + large):
        d = root / f"c{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        if i < small:
            Image.fromarray(np.roll(tile, i, axis=0)).save(d / f"s{i:05d}.png")
        else:
            Image.fromarray(np.roll(big, 37 * i, axis=1)).save(d / f"photo{i:05d}.jpg", quality=92)
    return root


def _cli() -> list[str]:
    return [sys.executable, "-m", "shardfeed.convert.cli", "-q"]


def _run_json(cmd: list[str], json_path: Path) -> dict:
    r = subprocess.run(cmd + ["--json", str(json_path)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return json.loads(json_path.read_text())


def run_round(data: Path, args: argparse.Namespace, out: Path, i: int) -> dict:
    """One round: doctor, then bench, on ``data``; the figures of the printed row."""
    w = str(args.num_workers)
    doc = _run_json([*_cli(), "doctor", str(data), "--warm", "--num-workers", w, "--image-size",
                     str(args.image_size), "--seed", str(i)], out / f"doctor-{i}.json")
    ben = _run_json([*_cli(), "bench", str(data), "--model", "none", "--num-workers", w, "--image-size",
                     str(args.image_size), "--batch-size", str(args.batch_size), "--batches", str(args.batches),
                     "--warmup", str(args.warmup), "--threads", "1"], out / f"bench-{i}.json")
    from shardfeed.readers.measure.doctor_model import cpu_ceiling

    p, cpus = doc["predicted"], doc["cpus"]
    batch = doc["decode"].get("batch") or {}
    t_worker = (1 / doc["decode"]["images_per_cpu_s"] + (doc["storage"].get("file_cpu_ms") or 0) / 1e3
                + (batch.get("collate_ms_per_image") or 0) / 1e3)
    t_main = ((batch.get("handoff_ms_per_image") or 0) + (batch.get("to_float_ms_per_image") or 0)) / 1e3
    cpu_per_image = t_worker + t_main
    others = (ben.get("cpu") or {}).get("others_share") or 0.0
    free = max(0.1, cpus * (1 - others))
    now = min(p["folder_images_per_s"], cpu_ceiling(num_workers=args.num_workers, cpus=free, t_worker_s=t_worker,
                                                     t_main_s=t_main))
    bench_cpu = (ben.get("cpu") or {}).get("total_s")
    return {"round": i + 1, "predicted": p["folder_images_per_s"], "predicted_now": now,
            "error_share": p.get("error_share"), "sampled": doc["files"]["sampled"],
            "measured": ben["images_per_s"], "ratio": p["folder_images_per_s"] / ben["images_per_s"],
            "ratio_now": now / ben["images_per_s"], "others_cpu_share": others,
            "doctor_cpu_ms_per_image": cpu_per_image * 1e3,
            "bench_cpu_ms_per_image": bench_cpu / ben["num_samples"] * 1e3 if bench_cpu else None,
            "decoders": "; ".join(f"{r['format']} {r['share']:.0%}: {r['decoder']}"
                                  for r in doc["decode"].get("by_format") or [])}


def format_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"`shardfeed doctor --warm` predicted vs `shardfeed bench --model none` measured, images/s, "
             f"num_workers={args.num_workers}, image_size={args.image_size}:", "",
             "| round | predicted quiet (error, files) | predicted now | measured | predicted / measured: quiet, now "
             "| CPU ms/image: doctor / bench | other processes' CPU during bench |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        err = "?" if r["error_share"] is None else f"±{r['error_share']:.0%}"
        bench_cpu = "n/a" if r["bench_cpu_ms_per_image"] is None else f"{r['bench_cpu_ms_per_image']:.2f}"
        lines.append(f"| {r['round']} | {r['predicted']:.0f} ({err}, {r['sampled']}) | {r['predicted_now']:.0f} | "
                     f"{r['measured']:.0f} | {r['ratio']:.2f}x, {r['ratio_now']:.2f}x | "
                     f"{r['doctor_cpu_ms_per_image']:.2f} / {bench_cpu} | {r['others_cpu_share']:.0%} |")
    lines += ["", f"decoders: {rows[0]['decoders']}",
              f"median predicted / measured: quiet {statistics.median(r['ratio'] for r in rows):.2f}x, "
              f"now {statistics.median(r['ratio_now'] for r in rows):.2f}x"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="an image folder in class folders [planted]")
    p.add_argument("--small", type=int, default=2000, help="small PNGs planted [2000]")
    p.add_argument("--large", type=int, default=40, help="large JPEGs planted [40]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="doctor-vs-bench-") as tmp:
        work = Path(tmp)
        data = args.data
        if data is None:
            print(f"doctor_vs_bench: planting {args.small} PNGs and {args.large} JPEGs ...", file=sys.stderr)
            data = make_mixed_folder(work / "mixed", args.small, args.large)
        rows = []
        for i in range(args.rounds):
            print(f"doctor_vs_bench: round {i + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
            rows.append(run_round(data, args, work, i))
    print(format_markdown(rows, args))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
