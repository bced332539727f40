#!/usr/bin/env python3
"""Pack scaling and packing from slow storage, side by side in one run.

Rows (every ratio the median of per-round ratios; the cases of a group run round by round in
rotated order after a warm-up round; outputs deleted and the disk synced, untimed, before each run):

* warm, small set (20,000 files): ``pack --workers 2`` / ``pack --workers 1`` (target <= 0.7);
* cold (the source files' pages evicted before every run, checked with mincore), small and
  ImageNet-sized sets: ``pack --workers 2`` / ``tar cf`` (targets <= 1.2 and <= 1.3);
* emulated network storage (``scripts/storage_emulator.py``: a FUSE passthrough adding ``--open-ms``
  per open, 5 ms by default), 2,000 small files, default options: ``tar cf`` / ``pack`` (target
  >= 8: pack at least 8x faster), with ``pack --read-ahead 0`` (one file after another, as before)
  for reference. Skipped, saying why, where FUSE cannot mount.

Every row also records the load average before and after it (other jobs on the machine slow
both sides of a ratio, not always equally). Data: ``data/bench/`` as ``scripts/bench.py`` makes
it (generated on first use).

Usage::

    python scripts/bench_pack_scaling.py                   # all groups (~5 minutes on 2 cores)
    python scripts/bench_pack_scaling.py --only slow --rounds 3
    python scripts/bench_pack_scaling.py --only warm,cold --json out/pack_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_util import drop_written, evict_files, median, paired_ratio, resident_fraction, run_process, run_rounds  # noqa: E402

__all__ = ["main"]

PY = sys.executable
SHARDFEED = str(Path(PY).with_name("shardfeed"))
GROUPS = ("warm", "cold", "slow")


def log(msg: str = "") -> None:
    print(msg, file=sys.stderr, flush=True)


def _files(root: Path) -> list[str]:
    out = []
    for c in sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out += [f"{c}/{n}" for n in sorted(os.listdir(root / c)) if not n.startswith(".")]
    return out


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _pack(src: Path, out: Path, *args: str) -> dict:
    return run_process([SHARDFEED, "-q", "pack", str(src), str(out), "--format", "wds", *args])


def _tar(src: Path, lst: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    return run_process(["tar", "cf", str(out / "x.tar"), "-T", str(lst)], cwd=str(src))


class Table:
    def __init__(self):
        self.rows: list[dict] = []

    def row(self, name: str, dataset: str, ratio: float, target: str, ok: bool, detail: str, load: tuple) -> None:
        r = dict(comparison=name, dataset=dataset, ratio=round(ratio, 3), target=target,
                 verdict="PASS" if ok else "MISS", detail=detail, load_before_after=load)
        self.rows.append(r)
        log(f"  {name} [{dataset}]: {ratio:.2f} (target {target}) {r['verdict']}; {detail}; load {load[0]} -> {load[1]}")

    def markdown(self) -> str:
        lines = ["| comparison | data | ratio | target | verdict | detail | load (1 min) before -> after |",
                 "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r['comparison']} | {r['dataset']} | {r['ratio']:.2f} | {r['target']} | {r['verdict']} | "
                         f"{r['detail']} | {r['load_before_after'][0]} -> {r['load_before_after'][1]} |")
        return "\n".join(lines)


def bench_warm(t: Table, folders: dict, work: Path, rounds: int) -> dict:
    src = folders["small"]
    lst = work / "small.list"
    lst.write_text("\n".join(_files(src)) + "\n")
    outs = {k: work / f"warm-{k}" for k in ("w1", "w2", "w2_ra0", "tar")}
    cases = {
        "pack_w1": lambda: _pack(src, outs["w1"], "--workers", "1"),
        "pack_w2": lambda: _pack(src, outs["w2"], "--workers", "2"),
        "pack_w2_read_ahead_0": lambda: _pack(src, outs["w2_ra0"], "--workers", "2", "--read-ahead", "0"),
        "tar": lambda: _tar(src, lst, outs["tar"]),
    }
    log(f"[warm] small set, {rounds} rounds + warm-up")
    load0 = _load()
    r = run_rounds(cases, rounds=rounds, before_each=lambda c: drop_written(list(outs.values())), log=log)
    drop_written(list(outs.values()))
    v = r["values"]
    t.row("pack --workers 2 / pack --workers 1 (warm)", "small", paired_ratio(v["pack_w2"], v["pack_w1"]), "<= 0.7",
          paired_ratio(v["pack_w2"], v["pack_w1"]) <= 0.7,
          f"{median(v['pack_w2']):.2f} s vs {median(v['pack_w1']):.2f} s; tar cf {median(v['tar']):.2f} s; "
          f"--workers 2 --read-ahead 0 / --workers 1: {paired_ratio(v['pack_w2_read_ahead_0'], v['pack_w1']):.2f}",
          (load0, _load()))
    return v


def bench_cold(t: Table, folders: dict, work: Path, rounds: int) -> dict:
    figures = {}
    for name, bound in (("small", 1.2), ("imagenet", 1.3)):
        src = folders[name]
        files = _files(src)
        paths = [str(src / f) for f in files]
        lst = work / f"{name}.list"
        lst.write_text("\n".join(files) + "\n")
        outs = {k: work / f"cold-{name}-{k}" for k in ("w2", "w2_ra0", "tar")}
        residency = []

        def before(case: str) -> None:
            drop_written(list(outs.values()))
            evict_files(paths)
            frac = resident_fraction(paths[:: max(1, len(paths) // 2000)])
            residency.append(frac)
            if frac > 0.02:
                raise RuntimeError(f"{case}: {frac:.1%} of the source pages still cached after eviction")

        cases = {"pack_w2": lambda: _pack(src, outs["w2"], "--workers", "2"),
                 "pack_w2_read_ahead_0": lambda: _pack(src, outs["w2_ra0"], "--workers", "2", "--read-ahead", "0"),
                 "tar": lambda: _tar(src, lst, outs["tar"])}
        log(f"[cold] {name}: {len(files)} files, source evicted before each run; {rounds} rounds + warm-up")
        load0 = _load()
        r = run_rounds(cases, rounds=rounds, before_each=before, log=log)
        drop_written(list(outs.values()))
        v = r["values"]
        ratio = paired_ratio(v["pack_w2"], v["tar"])
        t.row("pack --workers 2 / tar cf (cold)", name, ratio, f"<= {bound}", ratio <= bound,
              f"{median(v['pack_w2']):.2f} s vs {median(v['tar']):.2f} s; with --read-ahead 0 (files read one "
              f"after another, as before): {paired_ratio(v['pack_w2_read_ahead_0'], v['tar']):.2f}", (load0, _load()))
        figures[name] = dict(v, max_resident_fraction=max(residency))
    return figures


def bench_slow(t: Table, folders: dict, work: Path, rounds: int, open_ms: float) -> dict:
    sys.path.insert(0, str(HERE))
    try:
        from storage_emulator import StorageEmulator, fuse_unavailable_reason
    except ImportError as exc:
        log(f"[slow] skipped: scripts/storage_emulator.py unavailable ({exc})")
        return {"skipped": str(exc)}
    reason = fuse_unavailable_reason()
    if reason:
        log(f"[slow] skipped: {reason}")
        return {"skipped": reason}
    src = folders["small-2000"]
    files = _files(src)
    lst = work / "small-2000.list"
    lst.write_text("\n".join(files) + "\n")
    outs = {k: work / f"slow-{k}" for k in ("pack", "pack_ra0", "tar")}
    with StorageEmulator(src, open_ms=open_ms) as emu:
        mnt = Path(emu.mountpoint)
        cases = {"pack": lambda: _pack(mnt, outs["pack"]),
                 "pack_read_ahead_0": lambda: _pack(mnt, outs["pack_ra0"], "--read-ahead", "0"),
                 "tar": lambda: _tar(mnt, lst, outs["tar"])}
        log(f"[slow] {len(files)} small files behind an emulated {open_ms:g} ms per open ({emu.describe()}); "
            f"default pack options; {rounds} rounds + warm-up")
        load0 = _load()
        r = run_rounds(cases, rounds=rounds, before_each=lambda c: drop_written(list(outs.values())), log=log)
        stats = emu.stats()
    drop_written(list(outs.values()))
    v = r["values"]
    ratio = paired_ratio(v["tar"], v["pack"])
    t.row(f"tar cf / pack, emulated {open_ms:g} ms per open (pack N x faster)", "small-2000", ratio, ">= 8",
          ratio >= 8, f"pack {median(v['pack']):.2f} s, pack --read-ahead 0 {median(v['pack_read_ahead_0']):.2f} s, "
          f"tar cf {median(v['tar']):.2f} s", (load0, _load()))
    return dict(v, emulator_stats=stats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(HERE.parent / "data" / "bench"))
    p.add_argument("--work", default=None, help="scratch folder for the outputs [default: a temporary one]")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default=",".join(GROUPS), help=f"groups: {','.join(GROUPS)}")
    p.add_argument("--open-ms", type=float, default=5.0, help="emulated latency per open (slow group), ms")
    p.add_argument("--json", default=None, help="write every figure here")
    args = p.parse_args(argv)
    groups = set(args.only.split(","))
    if groups - set(GROUPS):
        p.error(f"unknown groups {sorted(groups - set(GROUPS))}; choose from {GROUPS}")
    from bench import prepare_data

    folders = prepare_data(Path(args.data), quick=False)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="shardfeed-pack-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    t = Table()
    figures: dict = {"cpus": os.cpu_count(), "load_start": _load()}
    t0 = time.perf_counter()
    try:
        if "warm" in groups:
            figures["warm"] = bench_warm(t, folders, work, args.rounds)
        if "cold" in groups:
            figures["cold"] = bench_cold(t, folders, work, args.rounds)
        if "slow" in groups:
            figures["slow"] = bench_slow(t, folders, work, args.rounds, args.open_ms)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    print(t.markdown())
    print(f"\n{os.cpu_count()} CPUs; load average at start {figures['load_start']}, at end {_load()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": t.rows, "figures": figures}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
