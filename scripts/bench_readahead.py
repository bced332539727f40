#!/usr/bin/env python3
"""WebDataset (and LMDB) on **emulated** slow storage, with and without read-ahead, against local disk.

Mounts the dataset through ``scripts/storage_emulator.py`` (a FUSE passthrough adding a fixed
latency per open and per read request) at each ``--latencies`` value, then runs, in interleaved
rounds (each case a subprocess): ``make_loader(DATA, 64, num_workers=2, image_size=224,
train=True)`` with a ``--compute-ms`` sleep per batch standing in for the GPU step, on the local
folder and on every mount, ``readahead=True`` and ``readahead=False``. Prints images/s with the
load average beside each figure (on a mount also the most requests in flight, and the requests
and megabytes it served per 1,000 images timed), and the ratios mount / local disk (the target: >= 0.9 at 2 and
10 ms) and read-ahead on / off, each the median of per-round ratios. ``--lmdb`` adds the LMDB copy
(read-ahead there: a batch's records read ahead by the read pool, one ``pread`` each, at most
``LMDBSource.read_ahead_records`` records and ``read_ahead_bytes`` bytes ahead; the kernel's
read-around left automatic, or set by ``--lmdb-readahead``) and the ratio LMDB / WebDataset on the
same mount. Each case also prints the wait for its next epoch's first batch (the 40 timed batches
of the 1,600-image set cross one epoch start), the cost that reading the next epoch's first
samples ahead hides. ``--raw`` reads raw samples (``decode=False``): the storage side alone,
hardly any CPU per sample, so the figures hold on a busy machine too. ``--baseline-src DIR`` runs
every case a second time with another copy of the package (``DIR/shardfeed/readers``, e.g. ``git
archive`` of another commit, or a checkout such as a git worktree), interleaved in the same rounds, and prints its ratios beside these
and local / local.

Figures measured on an emulator show the shape of the effect (latency x requests in series); they
are not measurements of NFS, a cloud disk or a bucket.

    .venv/bin/python scripts/bench_readahead.py --wds /tmp/perf_data/inet2-wds --lmdb /tmp/perf_data/inet2-lmdb \\
        --latencies 0.5,2,10 --rounds 2 --json out/bench_readahead.json
    mkdir -p /tmp/ref/shardfeed && git archive HEAD~1 readers convert | tar -x -C /tmp/ref/shardfeed
    .venv/bin/python scripts/bench_readahead.py --wds ... --lmdb ... --baseline-src /tmp/ref --raw
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run_case(data: Path, readahead: bool, batches: int, compute_ms: float, raw: bool = False,
             lmdb_readahead: bool | None = None) -> dict:
    import torch

    from shardfeed.readers import make_loader

    torch.set_num_threads(1)
    lmdb = (data / "data.mdb").exists()
    # LMDB: readahead on/off is its records read ahead by batch (kernel read-around left automatic)
    opts = {"decode": False} if raw else {"image_size": 224, "train": True}
    loader = make_loader(data, 64, num_workers=2, pin_memory=False, readahead=lmdb_readahead if lmdb else readahead,
                         seed=0, **opts)
    if lmdb and not readahead:
        loader.dataset.read_ahead_records = 0
    n = 0
    t0 = None
    done = 0
    first_waits = []  # per epoch after the first: seconds from asking for its first batch to getting it
    while done < batches + 2:
        asked = time.perf_counter()
        for k, batch in enumerate(loader):
            if k == 0 and done:
                first_waits.append(time.perf_counter() - asked)
            done += 1
            if done == 2:
                t0 = time.perf_counter()
            elif done > 2:
                n += len(batch) if raw else len(batch[1])
            time.sleep(compute_ms / 1000)
            if done >= batches + 2:
                break
    wall = time.perf_counter() - t0
    import shardfeed.readers

    return {"images": n, "images_per_s": n / wall, "epoch_first_batch_s": [round(w, 4) for w in first_waits],
            "package": str(Path(shardfeed.readers.__file__).resolve().parent)}


def baseline_path(src: Path, scratch: Path) -> Path:
    """The folder to put first on ``PYTHONPATH`` so that ``import shardfeed.readers`` loads the copy
    in ``src``: ``src`` itself when it holds ``shardfeed/readers`` (a ``git archive`` of another
    commit); for a checkout laid out as this repository (``readers/`` and ``convert/`` at the top),
    a folder under ``scratch`` whose ``shardfeed/`` links to them.

    Raises:
        SystemExit: ``src`` holds neither layout (the message gives the ``git archive`` command).
    """
    if (src / "shardfeed" / "readers" / "__init__.py").is_file():
        return src
    if (src / "readers" / "__init__.py").is_file() and (src / "convert" / "__init__.py").is_file():
        pkg = scratch / "shardfeed"
        pkg.mkdir(parents=True, exist_ok=True)
        for part in ("readers", "convert"):
            (pkg / part).symlink_to((src / part).resolve(), target_is_directory=True)
        return scratch
    raise SystemExit(f"{src}: --baseline-src needs a copy of the package as shardfeed/readers in it, or a checkout "
                     "with readers/ and convert/ at its top; e.g. mkdir -p /tmp/ref/shardfeed && git archive HEAD~1 "
                     "readers convert | tar -x -C /tmp/ref/shardfeed")


def _subprocess(data: Path, readahead: bool, batches: int, compute_ms: float, raw: bool = False,
                src: Path | None = None, lmdb_readahead: str = "auto") -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", str(data), "--readahead", str(int(readahead)),
           "--batches", str(batches), "--compute-ms", str(compute_ms), "--lmdb-readahead", lmdb_readahead]
    cmd += ["--raw"] if raw else []
    env = None
    if src is not None:  # another copy of the package, found before the installed one
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["load_avg_1min"] = round(os.getloadavg()[0], 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wds", type=Path, help="a packed WebDataset directory (local)")
    p.add_argument("--lmdb", type=Path, default=None, help="its LMDB copy (optional)")
    p.add_argument("--latencies", default="0.5,2,10", help="ms per open and per read request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=40, help="timed batches per case (after 2 warm-up)")
    p.add_argument("--compute-ms", type=float, default=20.0, help="sleep per batch (the training step)")
    p.add_argument("--max-background", type=int, default=64,
                   help="the emulated mount's kernel limit on background (readahead) requests; 0: the kernel's "
                        "default, 12 (see storage_emulator.EmulatorConfig) [default: 64]")
    p.add_argument("--raw", action="store_true",
                   help="raw samples (decode=False): the storage side alone, with hardly any CPU per sample")
    p.add_argument("--lmdb-readahead", choices=["auto", "on", "off"], default="auto",
                   help="the LMDB environment's kernel read-around (LMDBSource readahead=): auto (by the file's size "
                        "against RAM: on for this small copy), or off, what a database over half the RAM gets "
                        "[default: auto]")
    p.add_argument("--baseline-src", type=Path, default=None,
                   help="another copy of the package: a folder holding DIR/shardfeed/readers (git archive of "
                        "another commit), or a checkout of this repository (readers/ and convert/ at its top): "
                        "every case also runs with it, interleaved, named '... [baseline]', and the ratios are "
                        "printed for both; each baseline case checks that it loaded that copy")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--case", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--readahead", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        lmdb_ra = {"auto": None, "on": True, "off": False}[args.lmdb_readahead]
        print(json.dumps(run_case(args.case, bool(args.readahead), args.batches, args.compute_ms, args.raw, lmdb_ra)))
        return 0
    from storage_emulator import StorageEmulator

    if args.baseline_src is not None:
        import tempfile

        args.baseline_src = baseline_path(args.baseline_src, Path(tempfile.mkdtemp(prefix="shardfeed-baseline-")))
        print(f"baseline: shardfeed.readers from {(args.baseline_src / 'shardfeed' / 'readers').resolve()}", flush=True)
    latencies = [float(x) for x in args.latencies.split(",") if x]
    formats = {"wds": args.wds, **({"lmdb": args.lmdb} if args.lmdb else {})}
    mounts = {}
    results: dict[str, list] = {}
    try:
        for ms in latencies:
            for fmt, path in formats.items():
                mounts[(fmt, ms)] = StorageEmulator(path, open_ms=ms, read_ms=ms,
                                                   max_background=args.max_background or None).start()
        cases = []
        tags = [("", None)] + ([(" [baseline]", args.baseline_src)] if args.baseline_src else [])
        for fmt, path in formats.items():
            for tag, src in tags:
                cases.append((f"{fmt} local{tag}", path, True, src))
                for ms in latencies:
                    for ra in (True, False):
                        cases.append((f"{fmt} {ms:g}ms readahead={'on' if ra else 'off'}{tag}",
                                      mounts[(fmt, ms)].mountpoint, ra, src))
        by_mountpoint = {m.mountpoint: m for m in mounts.values()}
        for r in range(args.rounds):
            for name, path, ra, src in cases:
                emu = by_mountpoint.get(path)
                if emu is not None:
                    emu.reset_stats()
                res = _subprocess(path, ra, args.batches, args.compute_ms, args.raw, src, args.lmdb_readahead)
                want = str((src / "shardfeed" / "readers").resolve()) if src is not None else None
                if want is not None and res.get("package", want) != want:
                    raise SystemExit(f"{name}: loaded shardfeed.readers from {res['package']}, not the baseline "
                                     f"{want} (an installed copy found first?)")
                if emu is not None:
                    st = emu.stats()
                    res["max_in_flight"] = st["max_in_flight"]  # requests the mount served at once
                    # what the whole run asked of the storage (warm-up, start-up and the worker's reads
                    # ahead of the last batch included), per image timed
                    per = 1000 / max(1, res.get("images", 0))
                    res["requests_per_1000_images"] = round(st["reads"] * per)
                    res["mb_per_1000_images"] = round(st["read_bytes"] / 1e6 * per, 1)
                results.setdefault(name, []).append(res)
                shown = f"{res['images_per_s']:8,.0f} img/s" if "error" not in res else f"ERROR {res['error']}"
                inflight = (f"  in flight <= {res['max_in_flight']}, {res['requests_per_1000_images']} requests "
                            f"{res['mb_per_1000_images']} MB per 1000 images" if "max_in_flight" in res else "")
                waits = res.get("epoch_first_batch_s")
                firsts = f"  epoch's first batch {max(waits):.3f} s" if waits else ""
                print(f"round {r + 1}  {name:43s} {shown}  load {res.get('load_avg_1min')}{inflight}{firsts}",
                      flush=True)
    finally:
        for m in mounts.values():
            m.stop()

    def paired(a: str, b: str) -> float | None:
        pairs = [(x["images_per_s"], y["images_per_s"]) for x, y in zip(results.get(a, []), results.get(b, []))
                 if "images_per_s" in x and "images_per_s" in y]
        return statistics.median([x / y for x, y in pairs]) if pairs else None

    ratios = []

    def ratio(label: str, a: str, b: str, target: str = "") -> None:
        v = paired(a, b)
        loads = [x.get("load_avg_1min") for x in results.get(a, [])]
        ratios.append({"ratio": label, "value": v, "target": target, "a": a, "b": b, "load_avg_1min": loads})
        print(f"{label:60s} {('%.3f' % v) if v is not None else 'n/a':>7s}  {target:8s} load {loads}")

    print(f"\nmedian of per-round ratios (emulated storage; {'raw samples' if args.raw else 'train'}, 2 workers, "
          f"{args.compute_ms:g} ms step):")
    for tag, _ in tags:
        for fmt in formats:
            for ms in latencies:
                ratio(f"{fmt} {ms:g} ms, read-ahead on / local disk{tag}", f"{fmt} {ms:g}ms readahead=on{tag}",
                      f"{fmt} local{tag}", ">= 0.9" if fmt == "wds" and ms >= 2 else "")
                ratio(f"{fmt} {ms:g} ms, read-ahead off / local disk{tag}", f"{fmt} {ms:g}ms readahead=off{tag}",
                      f"{fmt} local{tag}")
                ratio(f"{fmt} {ms:g} ms, read-ahead on / off{tag}", f"{fmt} {ms:g}ms readahead=on{tag}",
                      f"{fmt} {ms:g}ms readahead=off{tag}", "> 1")
        if tag:
            for fmt in formats:
                ratio(f"{fmt} local / local{tag}", f"{fmt} local", f"{fmt} local{tag}", "~ 1")
    if "lmdb" in formats:
        for ms in latencies:
            ratio(f"lmdb / wds at {ms:g} ms (both read-ahead on)", f"lmdb {ms:g}ms readahead=on",
                  f"wds {ms:g}ms readahead=on", ">= 0.8" if ms >= 2 else "")
    if "lmdb" in formats and args.baseline_src:
        for ms in latencies:
            ratio(f"lmdb / wds at {ms:g} ms (both read-ahead on) [baseline]", f"lmdb {ms:g}ms readahead=on [baseline]",
                  f"wds {ms:g}ms readahead=on [baseline]")
            ratio(f"lmdb / lmdb [baseline] at {ms:g} ms (read-ahead on)", f"lmdb {ms:g}ms readahead=on",
                  f"lmdb {ms:g}ms readahead=on [baseline]")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": results, "ratios": ratios, "latencies_ms": latencies,
                                         "compute_ms": args.compute_ms, "batches": args.batches}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
