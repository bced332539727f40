#!/usr/bin/env python3
"""Before/after on **emulated** network storage: ``verify`` folder vs WebDataset and LMDB per latency.

Every dataset is served through ``scripts/storage_emulator.py`` (a FUSE passthrough that adds a
fixed latency per open and per read request; see its docstring for the public figures each latency
stands for). For each latency (default 0, 0.5, 2 and 10 ms per open and per read request) it runs
``shardfeed verify FOLDER WDS`` and ``shardfeed verify FOLDER LMDB`` as the CLI does (subprocesses,
``--cold``, 2 loader workers, ``--compute-ms 20`` standing in for a GPU step), each pair side by
side in one run with alternating rounds, and prints a table (markdown, and JSON with every
report) of images/s before and after, the speed-up and the data-stall shares. At 2 and 10 ms it
also verifies folder vs WebDataset on mounts whose readahead window is 1 MiB (``read_ahead_kb``:
1 MiB read requests instead of the kernel's 128 KiB), in the same run. Then ``tune`` on the
slowest mount: how many workers the folder would need to keep up, against the shards.

Also recorded per row: the machine's load average and the share of the CPU that processes other
than ours took during the row (this benchmark competes with whatever else runs), and, once, a
profile of what each format asks of the storage (opens, read requests and bytes per 1000 images,
request sizes) from the emulator's counters.

These figures come from an emulator on this machine: they show the *shape* of the win (per-file
latency multiplied by files read) and are not measurements of NFS, a cloud disk or a bucket.

Examples::

    python scripts/bench_storage.py                                  # make bench runs this
    python scripts/bench_storage.py --latencies 2 --no-tune --repeats 1   # one quick row
    python scripts/bench_storage.py --read-policy stream             # bucket-mount streaming reads
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from storage_emulator import StorageEmulator, StorageEmulatorError, fuse_unavailable_reason  # noqa: E402

__all__ = ["main", "prepare_data", "run_row", "format_markdown"]

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"speedup_at_2ms": 3.0, "speedup_at_10ms": 10.0, "max_stall_after": 0.10}


def _shardfeed() -> str:
    exe = Path(sys.executable).parent / "shardfeed"
    return str(exe) if exe.exists() else (shutil.which("shardfeed") or "shardfeed")


def _run(cmd: list[str], *, log_prefix: str = "") -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{log_prefix}command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return r


def prepare_data(src: Path, work: Path) -> Path:
    """``work/data/{folder,wds,lmdb}``: the folder (hard links to ``src``) and its packed copies."""
    data = work / "data"
    if not src.is_dir():
        print(f"bench_storage: generating the demo data in {src}", file=sys.stderr)
        _run([sys.executable, str(ROOT / "scripts" / "make_sample_data.py"), str(src)])
    folder = data / "folder"
    if not folder.is_dir():
        tmp = data / ".folder.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(src, tmp, copy_function=os.link)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
        tmp.rename(folder)
    for fmt, extra in (("wds", ["--max-count", "500"]), ("lmdb", [])):
        if not (data / fmt / "manifest.json").is_file():
            _run([_shardfeed(), "pack", str(folder), str(data / fmt), "--format", fmt, "--overwrite", *extra])
    return data


class _CpuMeter:
    """CPU taken by other processes than ours (this script, its children, the emulators) over a span."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    @staticmethod
    def _machine() -> tuple[float, float]:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        idle = v[3] + v[4]
        return (sum(v[:8]) - idle) / tick, sum(v[:8]) / tick

    def _ours(self) -> float:
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
        tick = os.sysconf("SC_CLK_TCK")
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (float(fields[11]) + float(fields[12])) / tick
            except OSError:
                pass
        return total

    def __enter__(self) -> "_CpuMeter":
        self.busy0, self.all0 = self._machine()
        self.ours0 = self._ours()
        self.load0 = os.getloadavg()[0]
        return self

    def __exit__(self, *exc) -> None:
        busy1, all1 = self._machine()
        ours = self._ours() - self.ours0
        span = max(all1 - self.all0, 1e-9)
        self.other_cpu_share = max(0.0, (busy1 - self.busy0) - ours) / span
        self.load = (self.load0, os.getloadavg()[0])


def _verify(before: Path, after: Path, args, json_path: Path) -> dict:
    cmd = [_shardfeed(), "verify", str(before), str(after), "--cold", "--compute-ms", str(args.compute_ms),
           "--num-workers", str(args.num_workers), "--repeats", str(args.repeats), "--threads", "1",
           "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
           "--batches", str(args.batches), "--warmup", str(args.warmup), "--json", str(json_path)]
    _run(cmd, log_prefix="verify: ")
    return json.loads(json_path.read_text())


def run_row(data: Path, latency_ms: float, args, out: Path, *, read_ahead_kb: int | None,
            formats: list[str]) -> dict:
    """One latency: verify folder vs each of ``formats`` (wds, lmdb) on emulated mounts."""
    mounts = {}
    try:
        for name in ("folder", *formats):
            mounts[name] = StorageEmulator(data / name, open_ms=latency_ms, read_ms=latency_ms,
                                           read_policy=args.read_policy, read_ahead_kb=read_ahead_kb).start()
        pids = [m._proc.pid for m in mounts.values() if m._proc is not None]
        row = {"latency_ms": latency_ms, "storage": mounts["folder"].describe(),
               "read_ahead_kb": mounts["folder"].read_ahead_kb, "formats": {}}
        ra = "" if read_ahead_kb is None else f"-ra{read_ahead_kb}"
        for fmt in formats:
            for m in mounts.values():
                m.reset_stats()
            print(f"bench_storage: {latency_ms:g} ms: verify folder vs {fmt} ...", file=sys.stderr, flush=True)
            with _CpuMeter(pids) as meter:
                t0 = time.perf_counter()
                rep = _verify(mounts["folder"].mountpoint, mounts[fmt].mountpoint, args,
                              out / f"verify-{fmt}-{latency_ms:g}ms{ra}.json")
                took_s = time.perf_counter() - t0
            row["formats"][fmt] = {
                "before_images_per_s": rep["before"]["images_per_s"],
                "after_images_per_s": rep["after"]["images_per_s"],
                "speedup": rep["speedup"],
                "stall_before": rep["stall_share_before"],
                "stall_after": rep["stall_share_after"],
                "headline": rep["headline"],
                "verdict": rep.get("verdict"),
                "rounds_images_per_s": {lab: [r["images_per_s"] for r in rep["runs"] if r.get("label") == lab]
                                        for lab in ("before", "after")},
                "other_cpu_share": meter.other_cpu_share,
                "loadavg_1min": list(meter.load),
                "took_s": took_s,
                "emulator_stats": {"folder": mounts["folder"].stats(), fmt: mounts[fmt].stats()},
            }
        return row
    finally:
        for m in mounts.values():
            m.stop()


def profile(data: Path, latency_ms: float, args, out: Path) -> dict:
    """Opens, read requests and bytes per 1000 images each format asks of the storage (no eviction)."""
    res = {}
    images = (args.warmup + args.batches) * args.batch_size
    for name in ("folder", "wds", "lmdb"):
        with StorageEmulator(data / name, open_ms=latency_ms, read_ms=latency_ms,
                             read_policy=args.read_policy, read_ahead_kb=args.read_ahead_kb) as emu:
            emu.reset_stats()
            _run([_shardfeed(), "bench", str(emu.mountpoint), "--compute-ms", str(args.compute_ms),
                  "--num-workers", str(args.num_workers), "--threads", "1", "--image-size", str(args.image_size),
                  "--batch-size", str(args.batch_size), "--batches", str(args.batches), "--warmup",
                  str(args.warmup), "--json", str(out / f"profile-{name}.json")])
            s = emu.stats()
        per_k = 1000.0 / images
        sizes = {int(k): v for k, v in s["read_sizes"].items()}
        res[name] = {"images": images, "opens_per_1000": s["opens"] * per_k, "reads_per_1000": s["reads"] * per_k,
                     "mb_per_1000": s["read_bytes"] * per_k / 1e6,
                     "mean_request_kib": (s["read_bytes"] / s["reads"] / 1024) if s["reads"] else 0.0,
                     "max_request_kib": s["max_request_bytes"] / 1024,
                     "requests_of_128kib_or_more": sum(v for k, v in sizes.items() if k >= 128 * 1024),
                     "max_in_flight": s["max_in_flight"], "stats": s}
    return res


def tune_slowest(data: Path, latency_ms: float, args, out: Path) -> dict:
    """``shardfeed tune`` on folder and WebDataset at the slowest latency; workers the folder needs."""
    res = {}
    for name in ("folder", "wds"):
        with StorageEmulator(data / name, open_ms=latency_ms, read_ms=latency_ms,
                             read_policy=args.read_policy, read_ahead_kb=args.read_ahead_kb) as emu:
            jp = out / f"tune-{name}-{latency_ms:g}ms.json"
            print(f"bench_storage: {latency_ms:g} ms: tune {name} ...", file=sys.stderr, flush=True)
            # no --cold: files are opened without keep_cache, so every open re-reads through the emulator
            _run([_shardfeed(), "tune", str(emu.mountpoint), "--compute-ms", str(args.compute_ms), "--threads", "1",
                  "--image-size", str(args.image_size), "--batch-size", str(args.batch_size), "--batches",
                  str(args.tune_batches), "--warmup", "3", "--max-num-workers", str(args.tune_max_workers),
                  "--budget-s", str(args.tune_budget_s), "--json", str(jp)])
            t = json.loads(jp.read_text())
        trials = [{"num_workers": tr["options"].get("num_workers"), "step": tr["step"],
                   "images_per_s": tr["images_per_s"], "stall_share": tr["stall_share"]}
                  for tr in t["trials"] if tr["step"] == "num_workers"]
        res[name] = {"trials": trials, "best": {k: t["best"].get(k) for k in ("options", "images_per_s", "stall_share")},
                     "call": t.get("call")}
    need_rate = args.batch_size / (args.compute_ms / 1000.0)  # images/s the stand-in GPU step consumes
    kept_up = [tr for tr in res["folder"]["trials"] if tr["stall_share"] <= TARGETS["max_stall_after"]]
    if kept_up:
        workers = min(tr["num_workers"] for tr in kept_up)
        note = f"the folder keeps up (data stall <= 10 %) with {workers} workers"
    else:
        with_workers = [tr for tr in res["folder"]["trials"] if tr["num_workers"]]
        best = max(with_workers, key=lambda tr: tr["images_per_s"] / tr["num_workers"]) if with_workers else None
        if best:
            per_worker = best["images_per_s"] / best["num_workers"]
            workers = math.ceil(need_rate / per_worker)
            note = (f"the folder did not keep up with up to {args.tune_max_workers} workers; at "
                    f"{per_worker:.0f} images/s per worker (best trial: {best['num_workers']} workers) it would need "
                    f"about {workers} workers for {need_rate:.0f} images/s (extrapolated; this machine has "
                    f"{os.cpu_count()} cores)")
        else:
            workers, note = None, "no trial with workers ran within the budget"
    wds_kept = [tr for tr in res["wds"]["trials"] if tr["stall_share"] <= TARGETS["max_stall_after"]]
    res["folder_workers_needed"] = workers
    res["wds_workers_needed"] = min(tr["num_workers"] for tr in wds_kept) if wds_kept else None
    res["needed_images_per_s"] = need_rate
    res["note"] = note
    return res


def format_markdown(result: dict) -> str:
    lines = [f"Emulated network storage (FUSE emulator on this machine, not real NFS/disk/bucket figures): "
             f"latency per open and per read request ({result['read_policy']} policy), `--cold`, "
             f"{result['num_workers']} loader workers, `--compute-ms {result['compute_ms']:g}`, "
             f"{result['cpu_count']} cores.", "",
             "| latency per open / read | format | readahead KiB | before images/s | after images/s | speed-up | "
             "data stall before | data stall after | other processes' CPU | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        for fmt, r in row["formats"].items():
            lines.append(f"| {row['latency_ms']:g} ms | {fmt} | {row.get('read_ahead_kb')} | {r['before_images_per_s']:.0f} | "
                         f"{r['after_images_per_s']:.0f} | {r['speedup']:.2f}x | {r['stall_before']:.0%} | "
                         f"{r['stall_after']:.0%} | {r['other_cpu_share']:.0%} | "
                         f"{r['loadavg_1min'][0]:.1f}-{r['loadavg_1min'][1]:.1f} |")
    if result.get("profile"):
        lines += ["", f"What each format asks of the storage (emulator counters, {result['profile_latency_ms']:g} ms, "
                      "no eviction; per 1000 images, loader start-up included):", "",
                  "| format | opens | read requests | MB read | mean request KiB | largest request KiB | "
                  "requests in flight at most |", "|---|---|---|---|---|---|---|"]
        for name, p in result["profile"].items():
            lines.append(f"| {name} | {p['opens_per_1000']:.0f} | {p['reads_per_1000']:.0f} | {p['mb_per_1000']:.1f} | "
                         f"{p['mean_request_kib']:.1f} | {p['max_request_kib']:.0f} | {p['max_in_flight']} |")
    if result.get("tune"):
        t = result["tune"]
        lines += ["", f"`tune` at {t['latency_ms']:g} ms (num_workers step; the stand-in GPU step consumes "
                      f"{t['needed_images_per_s']:.0f} images/s):", "",
                  "| workers | folder images/s | folder stall | WebDataset images/s | WebDataset stall |",
                  "|---|---|---|---|---|"]
        by_w = {}
        for name in ("folder", "wds"):
            for tr in t[name]["trials"]:
                by_w.setdefault(tr["num_workers"], {})[name] = tr
        for w in sorted(by_w):
            f, s = by_w[w].get("folder"), by_w[w].get("wds")
            lines.append(f"| {w} | {f['images_per_s']:.0f} | {f['stall_share']:.0%} | " if f else f"| {w} | - | - | ")
            lines[-1] += (f"{s['images_per_s']:.0f} | {s['stall_share']:.0%} |" if s else "- | - |")
        lines += ["", f"{t['note']}; WebDataset keeps up with "
                      f"{t['wds_workers_needed'] if t['wds_workers_needed'] is not None else 'none of the tried'} workers."]
    lines += ["", "Targets: " + "; ".join(result["targets"])]
    return "\n".join(lines)


def _check_targets(result: dict) -> list[str]:
    out = []
    for row in result["rows"]:
        wds = row["formats"].get("wds")
        if not wds:
            continue
        lat = row["latency_ms"]
        want = {2.0: TARGETS["speedup_at_2ms"], 10.0: TARGETS["speedup_at_10ms"]}.get(lat)
        if want is not None:
            ok = wds["speedup"] >= want
            out.append(f"WebDataset {wds['speedup']:.2f}x at {lat:g} ms, readahead {row.get('read_ahead_kb')} KiB "
                       f"(target >= {want:g}x: {'met' if ok else 'MISSED'})")
        for fmt, r in row["formats"].items():
            if r["stall_after"] > TARGETS["max_stall_after"]:
                out.append(f"{fmt} data stall {r['stall_after']:.0%} at {lat:g} ms, readahead {row.get('read_ahead_kb')} "
                           "KiB (target <= 10 %: MISSED)")
    if not any("stall" in x for x in out):
        out.append("data stall after <= 10 % at every latency: met")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=str(ROOT / "data" / "sample"), help="image folder (generated when missing)")
    p.add_argument("--out", default=str(ROOT / "out" / "bench" / "storage"), help="work and report folder")
    p.add_argument("--latencies", default="0,0.5,2,10", help="ms per open and per read request, comma-separated")
    p.add_argument("--read-policy", choices=("request", "stream"), default="request")
    p.add_argument("--read-ahead-kb", type=int, default=None,
                   help="the mounts' kernel readahead window, KiB [default: the kernel's, 128]: 1024 gives 1 MiB "
                        "read requests (libfuse 3), as NFS and gcsfuse tuning guides set it")
    p.add_argument("--formats", default="wds,lmdb", help="AFTER formats verified against the folder")
    p.add_argument("--also-read-ahead-kb", default="1024",
                   help="also verify folder vs WebDataset with this readahead (KiB) at --also-latencies, in the "
                        "same run ('none': not)")
    p.add_argument("--also-latencies", default="2,10", help="latencies of the --also-read-ahead-kb rows")
    p.add_argument("--compute-ms", type=float, default=20.0)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="verify rounds per pair")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=True,
                   help="tune folder and WebDataset on the slowest mount")
    p.add_argument("--tune-batches", type=int, default=10)
    p.add_argument("--tune-max-workers", type=int, default=16)
    p.add_argument("--tune-budget-s", type=float, default=120.0)
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="count opens/reads per 1000 images per format (at 2 ms, or the first latency)")
    p.add_argument("--json", default=None, help="report path [default: OUT/bench_storage.json]")
    args = p.parse_args(argv)

    reason = fuse_unavailable_reason()
    if reason:
        print(f"bench_storage: skipped: {reason}", file=sys.stderr)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    latencies = [float(x) for x in args.latencies.split(",") if x.strip()]
    data = prepare_data(Path(args.src), out)
    result = {"emulated": True, "read_policy": args.read_policy, "read_ahead_kb": args.read_ahead_kb, "compute_ms": args.compute_ms,
              "num_workers": args.num_workers, "repeats": args.repeats, "batches": args.batches,
              "batch_size": args.batch_size, "image_size": args.image_size, "cpu_count": os.cpu_count(),
              "src": str(args.src), "rows": []}
    t0 = time.perf_counter()
    try:
        also_ra = None if args.also_read_ahead_kb.lower() == "none" else int(args.also_read_ahead_kb)
        also_lat = {float(x) for x in args.also_latencies.split(",") if x.strip()}
        for lat in latencies:
            result["rows"].append(run_row(data, lat, args, out, read_ahead_kb=args.read_ahead_kb,
                                          formats=args.formats.split(",")))
            if also_ra is not None and lat in also_lat and also_ra != args.read_ahead_kb:
                result["rows"].append(run_row(data, lat, args, out, read_ahead_kb=also_ra, formats=["wds"]))
        if args.profile:
            plat = 2.0 if 2.0 in latencies else latencies[0]
            result["profile_latency_ms"] = plat
            (out / "profile").mkdir(exist_ok=True)
            result["profile"] = profile(data, plat, args, out / "profile")
        if args.tune:
            slow = max(latencies)
            result["tune"] = {"latency_ms": slow, **tune_slowest(data, slow, args, out)}
    except StorageEmulatorError as e:
        print(f"bench_storage: skipped: {e}", file=sys.stderr)
        return 0
    result["took_s"] = time.perf_counter() - t0
    result["targets"] = _check_targets(result)
    md = format_markdown(result)
    print(md)
    jp = Path(args.json) if args.json else out / "bench_storage.json"
    jp.write_text(json.dumps(result, indent=1))
    (out / "bench_storage.md").write_text(md + "\n")
    print(f"\nbench_storage: {result['took_s']:.0f} s; report: {jp}, {out / 'bench_storage.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
