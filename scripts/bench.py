#!/usr/bin/env python3
"""shardfeed's side-by-side benchmarks, run by ``make bench``.

Every comparison of the issue's table runs its candidates in this one run, round by round,
rotating their order (A B, B A, ...), after a warm-up round; a figure is the median over the
rounds (at least 5; 3 with ``--quick``) and a ratio the median of the per-round ratios. Packing
is timed as whole processes (``shardfeed pack`` as a user runs it, Python start-up and imports
included) against ``tar cf X -T LIST`` of the same files (``find | xargs tar cf`` would keep
only the last batch of files). Outputs are deleted and the disk synced, untimed, before each run.

Data (generated once, deterministically, by ``scripts/make_sample_data.py``, cached in
``data/bench/``): ``small``: 20,000 JPEGs of ~96 px in 10 classes; ``imagenet``: 3,000 JPEGs of
375-500 px in 10 classes; ``large``: 12 JPEGs of 2,560 x 1,600. ``small-2000`` (the first 2,000 of
``small``) and the ``--quick`` subsets are hard links.

Usage::

    python scripts/bench.py --out out/bench            # everything, ~10 minutes on 2 cores
    python scripts/bench.py --out out/bench --quick    # a 1-2 minute smoke run (subsets, 3 rounds)
    python scripts/bench.py --only pack,memory         # some groups: pack read cold loader decode http memory

Prints the table of ratios with the targets and PASS/MISS, and writes ``OUT/bench.json`` with every
figure, every round, and the machine (CPU model, cores, RAM, versions, file system).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_util import (  # noqa: E402
    cold_read_probe,
    drop_written,
    evict_files,
    machine_info,
    median,
    paired_ratio,
    resident_fraction,
    run_process,
    run_rounds,
)

__all__ = ["main"]

PY = sys.executable
SHARDFEED = str(Path(PY).with_name("shardfeed"))
SETS = {
    "small": dict(num_images=20000, min_size=88, max_size=104, seed=2),
    "imagenet": dict(num_images=3000, min_size=375, max_size=500, seed=1),
}
QUICK_COUNTS = {"small": 4000, "imagenet": 600}
LARGE = dict(num_images=12, width=2560, height=1600, seed=3)
GROUPS = ("pack", "read", "cold", "loader", "decode", "http", "memory")


def log(msg: str = "") -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# data

def _gen_part(args) -> int:
    from make_sample_data import make_image_folder

    out, params, part = args
    return make_image_folder(out, png_share=0.0, part=part, **params)


def _gen_large(out: Path) -> None:
    import numpy as np
    from PIL import Image

    from make_sample_data import make_image

    rng = np.random.default_rng(LARGE["seed"])
    for i in range(LARGE["num_images"]):
        label = i % 3
        seed = int(rng.integers(0, 2**31))
        path = out / f"class_{label:02d}" / f"large_{i:03d}.jpg"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = make_image(np.random.default_rng(seed), label, 3, LARGE["width"], LARGE["height"])
        tmp = path.with_name("." + path.name + ".tmp")
        Image.fromarray(pixels).save(tmp, format="JPEG", quality=90)
        os.replace(tmp, path)


def _link_subset(src: Path, dst: Path, count: int) -> None:
    """``dst``: hard links to the images of ``src`` with index < count (img_XXXXXX numbering)."""
    for cdir in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cdir.name).mkdir(parents=True, exist_ok=True)
        for f in cdir.iterdir():
            if f.name.startswith("img_") and int(f.stem[4:]) < count:
                target = dst / cdir.name / f.name
                if not target.exists():
                    os.link(f, target)


def _count_images(root: Path) -> int:
    return sum(1 for c in root.iterdir() if c.is_dir() for f in c.iterdir() if not f.name.startswith("."))


def prepare_data(data: Path, quick: bool) -> dict[str, Path]:
    """Generate (or reuse) the bench folders; returns name -> folder."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    counts = {name: (QUICK_COUNTS[name] if quick else p["num_images"]) for name, p in SETS.items()}
    jobs = []
    for name, params in SETS.items():
        root = data / name
        if root.exists() and _count_images(root) >= counts[name]:
            continue
        params = dict(params, num_images=counts[name])  # the first N images of the full set, same bytes
        jobs += [(str(root), params, (k, 2)) for k in range(2)]
    if jobs:
        log(f"generating bench data in {data} (once; cached for later runs) ...")
        with mp.get_context("fork").Pool(2) as pool:
            pool.map(_gen_part, jobs)
    _gen_large(data / "large")
    folders = {name: data / name for name in SETS}
    _link_subset(data / "small", data / "small-2000", 2000)
    folders["small-2000"] = data / "small-2000"
    folders["large"] = data / "large"
    if quick:
        for name, n in QUICK_COUNTS.items():
            _link_subset(data / name, data / f"quick-{name}", n)
            folders[name] = data / f"quick-{name}"
    log(f"data ready in {time.perf_counter() - t0:.1f} s: " + ", ".join(
        f"{k} {_count_images(v)} files" for k, v in folders.items()))
    return folders


def folder_files(root: Path) -> list[str]:
    """Relative paths of a folder's images, sorted like ImageFolder."""
    out = []
    for c in sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out += [f"{c}/{n}" for n in sorted(os.listdir(root / c)) if not n.startswith(".")]
    return out


def sh_pack(src: Path, out: Path, *args: str, check: bool = True) -> dict:
    return run_process([SHARDFEED, "pack", str(src), str(out), *args], check=check)


# ----------------------------------------------------------------------------------------------
# results

class Results:
    """Collects table rows and every figure for bench.json."""

    def __init__(self):
        self.rows: list[dict] = []
        self.figures: dict = {}
        self.notes: list[str] = []

    def row(self, comparison: str, dataset: str, ratio: float | None, target: str, op: str, bound: float,
            detail: str = "") -> None:
        ok = None if ratio is None or ratio != ratio else (ratio <= bound if op == "<=" else ratio >= bound)
        self.rows.append({"comparison": comparison, "dataset": dataset, "ratio": ratio, "target": target,
                          "status": "n/a" if ok is None else ("PASS" if ok else "MISS"), "detail": detail})
        status = self.rows[-1]["status"]
        log(f"  => {comparison} [{dataset}]: {'-' if ratio is None else f'{ratio:.2f}'} (target {target}) {status}"
            + (f"  {detail}" if detail else ""))

    def note(self, text: str) -> None:
        self.notes.append(text)
        log(f"  note: {text}")

    def table(self) -> str:
        w = max(len(r["comparison"]) for r in self.rows) if self.rows else 10
        lines = [f"{'comparison':<{w}}  {'data':<10} {'ratio':>7}  {'target':<8} status  detail",
                 "-" * (w + 60)]
        for r in self.rows:
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
            lines.append(f"{r['comparison']:<{w}}  {r['dataset']:<10} {ratio:>7}  {r['target']:<8} {r['status']:<6}  "
                         f"{r['detail']}")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| comparison | data | ratio | target | status | detail |", "| --- | --- | ---: | --- | --- | --- |"]
        for r in self.rows:
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
            lines.append(f"| {r['comparison']} | {r['dataset']} | {ratio} | {r['target']} | {r['status']} | "
                         f"{r['detail']} |")
        return "\n".join(lines)


def _summ(values: list[float]) -> dict:
    return {"median": median(values), "min": min(values) if values else None,
            "max": max(values) if values else None, "rounds": values}


# ----------------------------------------------------------------------------------------------
# pack

def bench_pack(res: Results, folders: dict, work: Path, rounds: int, info_rounds: int = 2) -> None:
    for name in ("small", "imagenet"):
        src = folders[name]
        files = folder_files(src)
        lst = work / f"{name}.list"
        lst.write_text("\n".join(files) + "\n")
        outs = {k: work / "pack" / f"{name}-{k}" for k in
                ("tar", "w1", "w2", "lmdb", "wds", "wds_float", "tarfile")}
        tar_file = outs["tar"] / "x.tar"
        cases = {
            "tar": lambda: (outs["tar"].mkdir(parents=True, exist_ok=True),
                            run_process(["tar", "cf", str(tar_file), "-T", str(lst)], cwd=str(src)))[1],
            "tar_sync": lambda: (outs["tar"].mkdir(parents=True, exist_ok=True),
                                 run_process(["sh", "-c", 'tar cf "$0" -T "$1" && sync "$0"', str(tar_file), str(lst)],
                                             cwd=str(src)))[1],
            "pack_w1": lambda: sh_pack(src, outs["w1"], "--format", "wds", "--workers", "1"),
            "pack_w2": lambda: sh_pack(src, outs["w2"], "--format", "wds", "--workers", "2"),
            "pack_lmdb": lambda: sh_pack(src, outs["lmdb"], "--format", "lmdb"),
            "webdataset_ShardWriter": lambda: run_process([PY, str(HERE / "bench_writers.py"), "wds", str(src),
                                                           str(outs["wds"])]),
        }
        info_cases = {  # information only (not in the table): fewer rounds
            "webdataset_ShardWriter": cases["webdataset_ShardWriter"],
            "webdataset_ShardWriter_float_mtime": lambda: run_process(
                [PY, str(HERE / "bench_writers.py"), "wds-float-mtime", str(src), str(outs["wds_float"])]),
            "tar": cases["tar"],
            "tarfile_loop": lambda: run_process([PY, str(HERE / "bench_writers.py"), "tarfile", str(src),
                                                 str(outs["tarfile"])]),
        }
        log(f"[pack] {name}: {len(files)} files, {sum(os.path.getsize(src / f) for f in files) / 1e6:.1f} MB; "
            f"{rounds} rounds + warm-up")

        def before(case: str) -> None:
            drop_written(list(outs.values()))

        r = run_rounds(cases, rounds=rounds, before_each=before, log=log)
        if not info_rounds:
            info_cases = {}
        else:
            log(f"  (information: webdataset with a float mtime, a tarfile loop; {info_rounds} rounds)")
        r_info = run_rounds(info_cases, rounds=info_rounds, warmup=0, before_each=before, log=log)
        # sanity, untimed: every file is in tar's archive and in each shardfeed dataset
        before("")
        cases["tar"]()
        n_tar = int(subprocess.run(f"tar tf {tar_file} | wc -l", shell=True, capture_output=True, text=True).stdout)
        sizes = {}
        for k in ("pack_w1", "pack_lmdb", "webdataset_ShardWriter"):
            cases[k]()
        if info_cases:
            info_cases["webdataset_ShardWriter_float_mtime"]()
        for k, d in (("pack_w1", outs["w1"]), ("pack_lmdb", outs["lmdb"])):
            m = json.loads((d / "manifest.json").read_text())
            if m["num_samples"] != len(files):
                raise RuntimeError(f"{k}: packed {m['num_samples']} of {len(files)} samples")
        for k, d in (("shardfeed", outs["w1"]), ("webdataset_int_mtime", outs["wds"]),
                     ("webdataset_float_mtime", outs["wds_float"]), ("tar", outs["tar"])):
            if d.exists():
                sizes[k] = sum(p.stat().st_size for p in d.glob("*.tar"))
        if n_tar != len(files):
            raise RuntimeError(f"tar archived {n_tar} of {len(files)} files")
        drop_written(list(outs.values()))
        v, extra = r["values"], r["extra"]
        fig = {k: _summ(x) for k, x in v.items()}
        for k, ex in extra.items():
            fig[k]["cpu_s"] = median([e["cpu_s"] for e in ex])
            fig[k]["max_rss_bytes"] = max((e["max_rss_bytes"] or 0) for e in ex)
        wds_write = [json.loads(e["stdout"].strip().splitlines()[-1]) for e in extra["webdataset_ShardWriter"]]
        fig["webdataset_ShardWriter"]["import_s"] = median([w["import_s"] for w in wds_write])
        fig["webdataset_ShardWriter"]["write_s"] = median([w["write_s"] for w in wds_write])
        fig["output_bytes"] = sizes
        fig["num_files"] = len(files)
        floor = json.loads(run_process([PY, str(HERE / "bench_floor.py"), str(src), str(work / "floor"),
                                        str(sizes.get("shardfeed", 0))])["stdout"])
        fig["floor"] = floor
        tar_s = median(v["tar"])
        log(f"  floor (Python, this machine): start {floor['cli_start_s']:.3f} s (bare interpreter "
            f"{floor['python_start_s']:.3f}), stat every file {floor['stat_loop_s']:.3f} s, open+fstat+read+close "
            f"every file {floor['read_loop_s']:.3f} s, sha256 of the shards {floor['sha256_s']:.3f} s, write them "
            f"{floor['write_s']:.3f} s + fsync {floor['fsync_s']:.3f} s; a bare py-lmdb read+put loop "
            f"{floor['lmdb_put_loop_s']:.3f} s ({floor['lmdb_put_loop_s'] / tar_s:.1f}x tar); tar cf {tar_s:.3f} s")
        res.figures[f"pack_{name}"] = fig
        res.row("pack --workers 1 / tar cf", name, paired_ratio(v["pack_w1"], v["tar"]), "<= 2.0", "<=", 2.0,
                f"{median(v['pack_w1']):.3f} s vs {median(v['tar']):.3f} s")
        res.row("pack --workers 2 / tar cf", name, paired_ratio(v["pack_w2"], v["tar"]), "<= 1.3", "<=", 1.3,
                f"{median(v['pack_w2']):.3f} s")
        bound = 4.0 if name == "small" else 2.0
        res.row("webdataset ShardWriter / pack --workers 1", name,
                paired_ratio(v["webdataset_ShardWriter"], v["pack_w1"]), f">= {bound:g}", ">=", bound,
                f"{median(v['webdataset_ShardWriter']):.3f} s (import {fig['webdataset_ShardWriter']['import_s']:.2f} s)")
        res.row("pack --format lmdb / tar cf", name, paired_ratio(v["pack_lmdb"], v["tar"]), "<= 2.0", "<=", 2.0,
                f"{median(v['pack_lmdb']):.3f} s")
        vi = r_info["values"]
        fig["information_rounds"] = {k: _summ(x) for k, x in vi.items()}
        if not info_cases:
            res.figures[f"pack_{name}"]["info"] = {
                "pack_w1_over_tar_sync": paired_ratio(v["pack_w1"], v["tar_sync"]),
                "pack_w2_over_tar_sync": paired_ratio(v["pack_w2"], v["tar_sync"])}
            continue
        res.figures[f"pack_{name}"]["info"] = {
            "webdataset_float_mtime_over_int_mtime_time": paired_ratio(vi["webdataset_ShardWriter_float_mtime"],
                                                                       vi["webdataset_ShardWriter"]),
            "webdataset_float_mtime_over_int_mtime_bytes": sizes["webdataset_float_mtime"] / sizes["webdataset_int_mtime"],
            "webdataset_write_only_over_pack_w1": fig["webdataset_ShardWriter"]["write_s"] / median(v["pack_w1"]),
            "tarfile_loop_over_tar": paired_ratio(vi["tarfile_loop"], vi["tar"]),
            "tar_sync_over_tar": paired_ratio(v["tar_sync"], v["tar"]),
            "pack_w1_over_tar_sync": paired_ratio(v["pack_w1"], v["tar_sync"]),
            "pack_w2_over_tar_sync": paired_ratio(v["pack_w2"], v["tar_sync"]),
            "webdataset_ShardWriter_over_tar": paired_ratio(v["webdataset_ShardWriter"], v["tar"]),
        }
        info = res.figures[f"pack_{name}"]["info"]
        log(f"  info: webdataset float mtime: {info['webdataset_float_mtime_over_int_mtime_time']:.2f}x the time, "
            f"{info['webdataset_float_mtime_over_int_mtime_bytes']:.2f}x the bytes of int mtime; ShardWriter "
            f"{info['webdataset_ShardWriter_over_tar']:.1f}x tar; tarfile loop {info['tarfile_loop_over_tar']:.1f}x tar; "
            f"pack (durable: fsync) / (tar cf && sync X): --workers 1 {info['pack_w1_over_tar_sync']:.2f}, "
            f"--workers 2 {info['pack_w2_over_tar_sync']:.2f}")


# ----------------------------------------------------------------------------------------------
# datasets for the readers

def prepare_datasets(folders: dict, work: Path, groups: set) -> dict[str, Path]:
    ds = {}
    need_small = groups & {"read", "cold", "http"}
    need_in = groups & {"loader", "http"}
    jobs = []
    if need_small:
        jobs += [("small-wds", folders["small"], ["--format", "wds"]),
                 ("small-lmdb", folders["small"], ["--format", "lmdb"])]
    if need_in:
        jobs += [("imagenet-wds", folders["imagenet"], ["--format", "wds", "--max-count", "500"]),
                 ("imagenet-wds-1shard", folders["imagenet"], ["--format", "wds", "--max-count", "100000",
                                                               "--max-bytes", "4GB"]),
                 ("imagenet-lmdb", folders["imagenet"], ["--format", "lmdb"])]
    for name, src, args in jobs:
        out = work / "ds" / name
        if out.exists():
            shutil.rmtree(out)
        sh_pack(src, out, *args)
        ds[name] = out
    os.sync()
    return ds


def _read_map_style(ds) -> int:
    n = len(ds)
    for i in range(n):
        ds[i]
    return n


def _timed_rate(fn) -> dict:
    gc.collect()
    t0 = time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t0
    return {"value": n / dt, "seconds": dt, "samples": n}


def _folder_plain_read(root: Path, files: list[str]) -> int:
    n = 0
    base = str(root) + "/"
    for f in files:
        with open(base + f, "rb") as fh:
            fh.read()
        n += 1
    return n


def _raw_reader(src, **kw):
    from shardfeed.readers.sources.dataset import open_dataset

    def run() -> int:
        import torch.utils.data

        ds = open_dataset(src, decode=False, shuffle=False, **kw)
        if not isinstance(ds, torch.utils.data.IterableDataset):
            return _read_map_style(ds)
        n = 0
        for _ in ds:
            n += 1
        return n

    return run


def _webdataset_reader(root: Path):
    import webdataset as wds

    urls = sorted(str(p) for p in root.glob("*.tar"))

    def run() -> int:
        n = 0
        for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
            n += 1
        return n

    return run


def bench_read(res: Results, folders: dict, ds: dict, rounds: int) -> None:
    src = folders["small"]
    files = folder_files(src)
    cases = {
        "folder_open_read": lambda: _timed_rate(lambda: _folder_plain_read(src, files)),
        "shardfeed_folder_raw": lambda: _timed_rate(_raw_reader(src)),
        "shardfeed_wds_raw": lambda: _timed_rate(_raw_reader(ds["small-wds"])),
        "shardfeed_lmdb_raw": lambda: _timed_rate(_raw_reader(ds["small-lmdb"])),
        # information: what checking each record's CRC-32 costs
        "shardfeed_lmdb_raw_no_crc": lambda: _timed_rate(_raw_reader(ds["small-lmdb"], verify=False)),
        "webdataset_pipeline": lambda: _timed_rate(_webdataset_reader(ds["small-wds"])),
    }
    log(f"[read] raw samples, warm page cache, small set ({len(files)} samples); {rounds} rounds + warm-up")
    r = run_rounds(cases, rounds=rounds, log=log)
    v = r["values"]
    for k, ex in r["extra"].items():
        if any(e["samples"] != len(files) for e in ex):
            raise RuntimeError(f"{k} read {ex[0]['samples']} samples, expected {len(files)}")
    res.figures["read_warm_small"] = {k: _summ(x) for k, x in v.items()}
    res.row("raw read warm: WebDataset source / folder open+read", "small",
            paired_ratio(v["shardfeed_wds_raw"], v["folder_open_read"]), ">= 1.0", ">=", 1.0,
            f"{median(v['shardfeed_wds_raw']):,.0f} vs {median(v['folder_open_read']):,.0f} samples/s")
    res.row("raw read: WebDataset source / webdataset pipeline", "small",
            paired_ratio(v["shardfeed_wds_raw"], v["webdataset_pipeline"]), ">= 5", ">=", 5.0,
            f"webdataset {median(v['webdataset_pipeline']):,.0f} samples/s")
    res.row("raw read warm: LMDB source / folder open+read", "small",
            paired_ratio(v["shardfeed_lmdb_raw"], v["folder_open_read"]), ">= 3", ">=", 3.0,
            f"{median(v['shardfeed_lmdb_raw']):,.0f} samples/s")
    no_crc = paired_ratio(v["shardfeed_lmdb_raw_no_crc"], v["folder_open_read"])
    res.figures["read_warm_small"]["lmdb_no_crc_over_folder"] = no_crc
    log(f"  info: LMDB source with verify=False (no CRC-32 check) / folder open+read: {no_crc:.2f} "
        f"({median(v['shardfeed_lmdb_raw_no_crc']):,.0f} samples/s)")


def bench_cold(res: Results, folders: dict, ds: dict, rounds: int) -> None:
    src = folders["small"]
    files = folder_files(src)
    src_paths = [str(src / f) for f in files]
    shard_paths = [str(p) for p in sorted(ds["small-wds"].glob("*.tar"))] + \
                  [str(p) for p in sorted(ds["small-wds"].glob("*.sfidx"))]
    check_sample = src_paths[:: max(1, len(src_paths) // 2000)]
    residency: dict[str, list[float]] = {"folder_open_read": [], "shardfeed_wds_raw": []}

    def evict(case: str) -> None:
        os.sync()
        paths = src_paths if case == "folder_open_read" else shard_paths
        evict_files(paths)
        frac = resident_fraction(check_sample if case == "folder_open_read" else shard_paths)
        residency[case].append(frac)
        if frac > 0.02:
            raise RuntimeError(f"{case}: {frac:.1%} of the pages are still cached after eviction")

    cases = {
        "folder_open_read": lambda: _timed_rate(lambda: _folder_plain_read(src, files)),
        "shardfeed_wds_raw": lambda: _timed_rate(_raw_reader(ds["small-wds"])),
    }
    log(f"[cold] raw samples after evicting the files from the page cache (posix_fadvise DONTNEED, checked "
        f"with mincore); small set; {rounds} rounds + warm-up")
    r = run_rounds(cases, rounds=rounds, before_each=evict, log=log)
    v = r["values"]
    probe = cold_read_probe(shard_paths[0])
    warm_mb_s = None
    with open(shard_paths[0], "rb") as f:  # now cached again: the warm rate, for comparison
        t0 = time.perf_counter()
        nbytes = len(f.read())
        warm_mb_s = nbytes / 1e6 / (time.perf_counter() - t0)
    res.figures["read_cold_small"] = {k: _summ(x) for k, x in v.items()}
    res.figures["read_cold_small"]["resident_fraction_after_eviction"] = residency
    res.figures["read_cold_small"]["cold_probe"] = dict(probe, warm_sequential_mb_per_s=warm_mb_s)
    cold_mb_s = median(v["shardfeed_wds_raw"]) * (sum(os.path.getsize(p) for p in shard_paths) / len(files)) / 1e6
    detail = (f"{median(v['shardfeed_wds_raw']):,.0f} vs {median(v['folder_open_read']):,.0f} samples/s; evicted "
              f"4 KiB reads {probe['random_4k_read_us']:.0f} us")
    res.row("raw read, cache evicted: WebDataset source / folder", "small",
            paired_ratio(v["shardfeed_wds_raw"], v["folder_open_read"]), ">= 1.5", ">=", 1.5, detail)
    if probe["random_4k_read_us"] < 60 or probe["sequential_mb_per_s"] > 1500:
        res.note(f"'cold' is optimistic here: pages evicted from this machine's cache came back at "
                 f"{probe['random_4k_read_us']:.0f} us per random 4 KiB read and {probe['sequential_mb_per_s']:,.0f} MB/s "
                 f"sequential (warm: {warm_mb_s:,.0f} MB/s; WebDataset cold read ran at {cold_mb_s:,.0f} MB/s) — "
                 "faster than a local NVMe SSD answers a random read (~80 us): the host's own page cache (this disk "
                 f"is {machine_info(src)['filesystem']['device']}, likely a file on the host) served them. On a real "
                 "disk the folder pays a seek per file and the gap grows.")


# ----------------------------------------------------------------------------------------------
# loaders and decoding

def _loader_rate(src, num_batches: int, num_workers: int = 2) -> dict:
    from shardfeed.readers.loader import make_loader

    loader = make_loader(str(src), batch_size=64, num_workers=num_workers, image_size=224,
                         persistent_workers=False)
    t_first = None
    n = 0
    it = iter(loader)
    t0 = time.perf_counter()
    for i, (images, labels) in enumerate(it):
        if i == 0:
            t_first = time.perf_counter()
        else:
            n += images.shape[0]
        if i >= num_batches:
            break
    t_end = time.perf_counter()
    del it, loader
    gc.collect()
    return {"value": n / (t_end - t_first), "images": n, "startup_s": t_first - t0}


def _decode_limit(src: Path, files: list[str]) -> dict:
    from shardfeed.readers.decode.transforms import SampleDecoder

    dec = SampleDecoder(image_size=224)
    blobs = [(src / f).read_bytes() for f in files]
    gc.collect()
    t0 = time.perf_counter()
    for i, b in enumerate(blobs):
        dec(b, "jpg", 0, files[i])
    return {"value": len(blobs) / (time.perf_counter() - t0)}


def bench_loader(res: Results, folders: dict, ds: dict, rounds: int, num_batches: int) -> None:
    src = folders["imagenet"]
    files = folder_files(src)
    sample = files[:: max(1, len(files) // 256)][:256]
    cases = {
        "decode_1proc": lambda: _decode_limit(src, sample),
        "folder": lambda: _loader_rate(src, num_batches),
        "webdataset": lambda: _loader_rate(ds["imagenet-wds"], num_batches),
        "webdataset_1shard": lambda: _loader_rate(ds["imagenet-wds-1shard"], num_batches),
        "lmdb": lambda: _loader_rate(ds["imagenet-lmdb"], num_batches),
    }
    log(f"[loader] imagenet set, image_size=224, batch 64, 2 workers, {num_batches} batches after the first; "
        f"{rounds} rounds + warm-up")
    r = run_rounds(cases, rounds=rounds, log=log)
    v = r["values"]
    limit = [2 * x for x in v["decode_1proc"]]
    fig = {k: _summ(x) for k, x in v.items()}
    fig["startup_s"] = {k: median([e["startup_s"] for e in ex]) for k, ex in r["extra"].items() if k != "decode_1proc"}
    res.figures["loader_imagenet"] = fig
    for k, label in (("folder", "folder"), ("webdataset", "WebDataset"), ("lmdb", "LMDB")):
        res.row(f"loader {label} / (1-process decode rate x 2)", "imagenet", paired_ratio(v[k], limit), ">= 0.8", ">=",
                0.8, f"{median(v[k]):,.0f} vs 2 x {median(v['decode_1proc']):,.0f} images/s")
    res.row("loader WebDataset / folder", "imagenet", paired_ratio(v["webdataset"], v["folder"]), ">= 0.95", ">=", 0.95,
            f"{len(list(ds['imagenet-wds'].glob('*.tar')))} shards")
    res.row("loader WebDataset (1 shard < 2 workers) / folder", "imagenet",
            paired_ratio(v["webdataset_1shard"], v["folder"]), ">= 0.95", ">=", 0.95,
            f"{median(v['webdataset_1shard']):,.0f} images/s")


def bench_decode(res: Results, folders: dict, rounds: int) -> None:
    from shardfeed.readers.decode.image import decode_image
    from shardfeed.readers.decode.transforms import EvalTransform

    src = folders["large"]
    files = folder_files(src)
    blobs = [(src / f).read_bytes() for f in files]
    tf = EvalTransform(224)

    def run(target):
        def f():
            gc.collect()
            t0 = time.perf_counter()
            for b in blobs:
                out = tf(decode_image(b, "jpg", target_size=target))
            assert tuple(out.shape) == (3, 224, 224)
            return {"value": len(blobs) / (time.perf_counter() - t0)}
        return f

    log(f"[decode] {len(blobs)} JPEGs of 2560x1600 -> 224 (resize shorter side + center crop); {rounds} rounds")
    r = run_rounds({"reduced": run(224), "full": run(None)}, rounds=rounds, log=log)
    v = r["values"]
    res.figures["decode_large"] = {k: _summ(x) for k, x in v.items()}
    res.row("reduced-size JPEG decode / full decode + resize", "large", paired_ratio(v["reduced"], v["full"]),
            ">= 1.8", ">=", 1.8, f"{median(v['reduced']):.1f} vs {median(v['full']):.1f} images/s")


# ----------------------------------------------------------------------------------------------
# HTTP

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 10.0) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}): {proc.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


def start_nginx(root: Path, work: Path) -> tuple[subprocess.Popen, int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise FileNotFoundError("nginx is not installed (make system-deps installs it on Debian)")
    port = _free_port()
    prefix = work / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = prefix / "nginx.conf"
    conf.write_text(f"""{user}daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  types {{ application/json json; application/x-tar tar; application/octet-stream idx sfidx; }}
  server {{
    listen 127.0.0.1:{port};
    root {root};
  }}
}}
""")
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(prefix)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _wait_port(port, proc, "nginx")
    return proc, port


def start_shardfeed_serve(root: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    cli = subprocess.run([SHARDFEED, "serve", "--help"], capture_output=True, text=True)
    if cli.returncode == 0:
        cmd = [SHARDFEED, "serve", str(root), "--host", "127.0.0.1", "--port", str(port)]
    else:  # the CLI command is not there yet: the same server, started directly
        cmd = [PY, "-c", "import sys; from shardfeed.convert.tools.serve import make_server; "
               "make_server(sys.argv[1], '127.0.0.1', int(sys.argv[2])).serve_forever()", str(root), str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_port(port, proc, "shardfeed serve")
    return proc, port


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bench_http(res: Results, ds: dict, work: Path, rounds: int) -> None:
    for name in ("small-wds", "imagenet-wds"):
        root = ds[name]
        servers = {}
        try:
            for sname, start in (("nginx", lambda: start_nginx(root, work)),
                                 ("shardfeed_serve", lambda: start_shardfeed_serve(root))):
                try:
                    servers[sname] = start()
                except (OSError, RuntimeError) as exc:
                    res.note(f"http: {sname} unavailable ({exc}); its row is skipped")
            cases = {"local": lambda: _timed_rate(_raw_reader(root))}
            for sname, (_, port) in servers.items():
                cases[sname] = (lambda p=port: _timed_rate(_raw_reader(f"http://127.0.0.1:{p}/")))
            log(f"[http] raw read of {name} over HTTP on loopback vs local; {rounds} rounds + warm-up")
            r = run_rounds(cases, rounds=rounds, log=log)
        finally:
            for proc, _ in servers.values():
                _stop(proc)
        v = r["values"]
        res.figures[f"http_{name}"] = {k: _summ(x) for k, x in v.items()}
        for sname in servers:
            res.row(f"raw read over HTTP ({sname}) / local", name.split("-")[0], paired_ratio(v[sname], v["local"]),
                    ">= 0.9", ">=", 0.9, f"{median(v[sname]):,.0f} vs {median(v['local']):,.0f} samples/s")


# ----------------------------------------------------------------------------------------------
# memory

def bench_memory(res: Results, folders: dict, work: Path, rounds: int) -> None:
    big, small = folders.get("small-full", folders["small"]), folders["small-2000"]
    out = work / "mem"
    cases = {}
    for label, src in (("files_20000", big), ("files_2000", small)):
        for fmt_label, args in (("wds_w1", ["--format", "wds", "--workers", "1"]),
                                ("wds_w2", ["--format", "wds", "--workers", "2"]),
                                ("lmdb", ["--format", "lmdb"])):
            def f(src=src, args=args, name=f"{label}_{fmt_label}"):
                r = sh_pack(src, out / name, *args)
                if r["max_rss_bytes"] is None:
                    raise RuntimeError("peak memory needs GNU time (/usr/bin/time); install the 'time' package")
                return {"value": r["max_rss_bytes"] / 1e6, "wall_s": r["wall_s"]}
            cases[f"{label}_{fmt_label}"] = f
    n_big, n_small = _count_images(big), _count_images(small)
    log(f"[memory] peak RSS (wait4) of shardfeed pack: {n_big} vs {n_small} files; {rounds} rounds")
    r = run_rounds(cases, rounds=rounds, warmup=0, before_each=lambda c: drop_written([out]), log=log)
    drop_written([out])
    v = r["values"]
    res.figures["pack_peak_memory_mb"] = {k: _summ(x) for k, x in v.items()}
    for fmt_label, text in (("wds_w1", "wds --workers 1"), ("wds_w2", "wds --workers 2"), ("lmdb", "lmdb")):
        a, b = median(v[f"files_20000_{fmt_label}"]), median(v[f"files_2000_{fmt_label}"])
        res.row(f"pack peak memory ({text}): {n_big} / {n_small} files", "small", a / b, "<= 1.2", "<=", 1.2,
                f"{a:.1f} vs {b:.1f} MB")


# ----------------------------------------------------------------------------------------------

def _busy_ticks() -> int:
    """CPU ticks the whole machine spent busy since boot (/proc/stat)."""
    try:
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    except OSError:
        return 0
    return sum(v) - v[3] - (v[4] if len(v) > 4 else 0)


def _our_cpu_s() -> float:
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench", help="output folder (bench.json, bench.md, work/)")
    p.add_argument("--data", default="data/bench", help="where the generated data is cached")
    p.add_argument("--quick", action="store_true", help="smoke run: subsets and 3 rounds (1-2 minutes)")
    p.add_argument("--rounds", type=int, default=None, help="measured rounds per comparison [5; 3 with --quick]")
    p.add_argument("--only", default=None, help=f"comma-separated groups: {','.join(GROUPS)}")
    a = p.parse_args(argv)
    groups = set(GROUPS if not a.only else a.only.split(","))
    unknown = groups - set(GROUPS)
    if unknown:
        p.error(f"unknown groups {sorted(unknown)}; choose from {','.join(GROUPS)}")
    rounds = a.rounds or (3 if a.quick else 5)
    out = Path(a.out).absolute()
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t_start = time.perf_counter()
    # What pip does at install time; this environment may set PYTHONDONTWRITEBYTECODE, and a
    # process that compiles shardfeed's modules at every start is not what users run.
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "convert"), str(REPO / "readers")],
                   stdout=subprocess.DEVNULL, check=False)
    folders = prepare_data(Path(a.data).absolute(), a.quick)
    if a.quick:
        folders["small-full"] = Path(a.data).absolute() / "small"
    res = Results()
    info = machine_info(Path(a.data))
    log(f"machine: {info['cpu_model']}, {info['cpu_affinity']} cores, {info['mem_total_bytes'] / 2**30:.1f} GiB, "
        f"Python {info['python']}, torch {info['versions']['torch']}, Pillow {info['versions']['pillow']}, "
        f"{info['filesystem']['type']} on {info['filesystem']['device']}")
    load1 = os.getloadavg()[0]
    busy0, cpu0 = _busy_ticks(), _our_cpu_s()
    if load1 > 0.5 * (os.cpu_count() or 1):
        res.note(f"load average {load1:.1f} at start on {os.cpu_count()} CPUs: other processes compete; "
                 "ratios are paired per round, absolute figures are noisy")
    timings = {}
    ds = {}

    def group(name, fn):
        if name not in groups:
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # one broken group must not hide the others' figures
            res.note(f"{name}: failed: {type(exc).__name__}: {exc}")
            import traceback

            traceback.print_exc()
        timings[name] = time.perf_counter() - t0

    group("pack", lambda: bench_pack(res, folders, work, rounds, 0 if a.quick else 2))
    group("memory", lambda: bench_memory(res, folders, work, 2 if a.quick else 3))
    t0 = time.perf_counter()
    if groups & {"read", "cold", "http", "loader"}:
        try:
            ds.update(prepare_datasets(folders, work, groups))
        except Exception as exc:
            res.note(f"packing the reader datasets failed: {exc}")
    timings["prepare_datasets"] = time.perf_counter() - t0
    group("read", lambda: bench_read(res, folders, ds, rounds))
    group("cold", lambda: bench_cold(res, folders, ds, rounds))
    group("loader", lambda: bench_loader(res, folders, ds, rounds, 4 if a.quick else 16))
    group("decode", lambda: bench_decode(res, folders, rounds))
    group("http", lambda: bench_http(res, ds, work, rounds))
    total = time.perf_counter() - t_start
    # CPU that other processes used meanwhile (their share of the machine): the figures' noise
    others_s = (_busy_ticks() - busy0) / os.sysconf("SC_CLK_TCK") - (_our_cpu_s() - cpu0)
    others_share = max(0.0, others_s) / (total * (os.cpu_count() or 1))
    if others_share > 0.1:
        res.note(f"other processes used {others_share:.0%} of this machine's CPU during the run (kernel "
                 "write-back of our own files included): figures are noisy; rerun on a quiet machine")
    table = res.table()
    print("\n" + table)
    for n in res.notes:
        print(f"note: {n}")
    n_pass = sum(r["status"] == "PASS" for r in res.rows)
    print(f"\n{n_pass}/{len(res.rows)} at target; {total:.0f} s in all "
          f"({', '.join(f'{k} {v:.0f} s' for k, v in timings.items())})")
    report = {"version": 1, "quick": a.quick, "rounds": rounds, "machine": info, "rows": res.rows,
              "figures": res.figures, "notes": res.notes, "timings_s": timings, "total_s": total,
              "load_average_at_start": load1, "others_cpu_share": others_share,
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "bench.md").write_text(res.markdown() + "\n")
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'}")
    if "work" in os.listdir(out):
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
