#!/usr/bin/env python3
"""``shardfeed doctor``'s predicted loader ceiling against ``shardfeed verify`` measured, on emulated storage.

For each latency (default 0, 2 and 10 ms per open and per read request; scripts/storage_emulator.py,
a FUSE passthrough) it mounts the image folder and its WebDataset copy, runs ``shardfeed doctor``
on the mounted folder (which predicts the folder's and the packed form's images/s at
``--num-workers``), then ``shardfeed verify FOLDER WDS --model none --cold`` (the loader's ceiling:
no compute step) with the same worker count, and prints a Markdown table, predicted vs measured.

The figures are emulations (a fixed added latency), not measurements of NFS or a bucket. The doctor
counts the loader's decode, resize and crop (``--image-size``), the collate, the hand-off and the
conversion to float, but not the FUSE daemon's CPU or other processes', so where the CPU is the
limit the measured rate is expected below the prediction (the table shows the CPU other processes
took meanwhile).

Examples::

    python scripts/doctor_vs_verify.py                           # data/sample (generated when missing)
    python scripts/doctor_vs_verify.py --latencies 0,2,10 --num-workers 2 --json out/doctor_vs_verify.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storage import _shardfeed, prepare_data  # noqa: E402
from storage_emulator import StorageEmulator, fuse_unavailable_reason  # noqa: E402

__all__ = ["main", "run_latency"]

ROOT = Path(__file__).resolve().parents[1]


def _run_json(cmd: list[str], json_path: Path) -> dict:
    r = subprocess.run(cmd + ["--json", str(json_path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return json.loads(json_path.read_text())


def run_latency(data: Path, latency_ms: float, args, out: Path) -> dict:
    """One latency: doctor on the mounted folder, then verify folder vs WebDataset on the mounts."""
    with StorageEmulator(data / "folder", open_ms=latency_ms, read_ms=latency_ms) as folder, \
            StorageEmulator(data / "wds", open_ms=latency_ms, read_ms=latency_ms) as wds:
        print(f"doctor_vs_verify: {latency_ms:g} ms: doctor ...", file=sys.stderr, flush=True)
        doc = _run_json([_shardfeed(), "-q", "doctor", str(folder.mountpoint), "--num-workers", str(args.num_workers),
                         "--max-files", str(args.max_files), "--image-size", str(args.image_size)],
                        out / f"doctor-{latency_ms:g}ms.json")
        print(f"doctor_vs_verify: {latency_ms:g} ms: verify ...", file=sys.stderr, flush=True)
        ver = _run_json([_shardfeed(), "-q", "verify", str(folder.mountpoint), str(wds.mountpoint), "--model", "none",
                         "--cold", "--num-workers", str(args.num_workers), "--threads", "1", "--image-size",
                         str(args.image_size), "--batch-size", str(args.batch_size), "--batches", str(args.batches),
                         "--warmup", str(args.warmup), "--repeats", str(args.repeats)],
                        out / f"verify-{latency_ms:g}ms.json")
    p = doc["predicted"]
    return {"latency_ms": latency_ms, "open_latency_ms": doc["storage"]["open_latency_ms"]["p50"],
            "predicted_folder": p["folder_images_per_s"], "predicted_packed": p["packed_images_per_s"],
            "measured_folder": ver["before"]["images_per_s"], "measured_packed": ver["after"]["images_per_s"],
            "doctor_advises_pack": any(a.startswith("pack:") for a in doc["advice"]),
            "busy_machine": p.get("busy_machine"),
            "doctor_decode_ms_per_image": 1e3 / doc["decode"]["images_per_cpu_s"],
            "doctor_file_cpu_ms": doc["storage"].get("file_cpu_ms") or 0.0,
            "doctor_batch_ms_per_image": sum((doc["decode"].get("batch") or {}).get(k) or 0.0 for k in (
                "collate_ms_per_image", "handoff_ms_per_image", "to_float_ms_per_image")),
            "verify_cpu_ms_per_image": {k: v * 1e3 for k, v in ver["cpu_s_per_image"].items()},
            "doctor_others_cpu_share": doc.get("others_cpu_share") or 0.0,
            "others_cpu_share": max((r.get("cpu") or {}).get("others_share") or 0.0 for r in ver["runs"])}


def format_markdown(rows: list[dict], args) -> str:
    lines = [f"`shardfeed doctor` predicted vs `shardfeed verify --model none --cold` measured, images/s, "
             f"num_workers={args.num_workers}, emulated latency per open and per read request:", "",
             "| latency | doctor: open p50 | folder predicted (quiet / now) | folder measured "
             "| packed predicted (quiet / now) | packed measured | doctor advises pack "
             "| CPU ms/image, folder and packed: doctor / verify | other processes' CPU: doctor, verify |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        busy = r.get("busy_machine") or {}
        lines.append(f"| {r['latency_ms']:g} ms | {r['open_latency_ms']:.2f} ms | {r['predicted_folder']:.0f} / "
                     f"{busy.get('folder_images_per_s') or 0:.0f} | {r['measured_folder']:.0f} | "
                     f"{r['predicted_packed']:.0f} / {busy.get('packed_images_per_s') or 0:.0f} | "
                     f"{r['measured_packed']:.0f} | "
                     f"{'yes' if r['doctor_advises_pack'] else 'no'} | "
                     f"{r['doctor_decode_ms_per_image'] + r['doctor_file_cpu_ms'] + r['doctor_batch_ms_per_image']:.2f}, "
                     f"{r['doctor_decode_ms_per_image'] + r['doctor_batch_ms_per_image']:.2f} / "
                     f"{r['verify_cpu_ms_per_image']['before']:.2f}, {r['verify_cpu_ms_per_image']['after']:.2f} | "
                     f"{r['doctor_others_cpu_share']:.0%}, {r['others_cpu_share']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT / "data" / "sample", help="image folder [data/sample]")
    p.add_argument("--work", type=Path, default=None, help="working folder [a temporary one]")
    p.add_argument("--latencies", default="0,2,10", help="ms per open and per read request [0,2,10]")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--max-files", type=int, default=64)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    reason = fuse_unavailable_reason()
    if reason:
        print(f"doctor_vs_verify: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="doctor-vs-verify-") as tmp:
        work = args.work or Path(tmp)
        data = prepare_data(args.data, work)
        out = work / "reports"
        out.mkdir(parents=True, exist_ok=True)
        rows = [run_latency(data, float(x), args, out) for x in args.latencies.split(",")]
    print(format_markdown(rows, args))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
