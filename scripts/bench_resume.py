#!/usr/bin/env python3
"""Resume mid-epoch: time to the first batch after resuming at 90 % of an epoch, against
the time to the first batch at the start of an epoch, for every source.

Time to first batch (``ttfb``): from ``make_loader(...)`` (plus ``load_state_dict(state)`` for the
resumed case) to the first decoded batch in hand, workers started afresh each time (as after a
restart). Both cases of a source run side by side, round by round, rotating their order
(``bench_util.run_rounds``); the ratio is the median of the per-round ratios; target <= 1.5.
The state at 90 % is a real ``loader.state_dict()``, taken once, untimed, after reading 90 % of an
epoch's batches.

The shuffle is unchanged by resuming (the same windows of the shuffle buffer, whose order is
computed per place), so there is no mixing figure to compare.

Usage::

    python scripts/bench_resume.py --out out/bench/resume           # ~2 minutes on 2 cores
    python scripts/bench_resume.py --out out/bench/resume --quick   # a smaller set, 3 rounds
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_util import Timer, machine_info, median, run_rounds  # noqa: E402


def _dataset(root: Path, num_images: int) -> dict[str, str]:
    """Image folder + WebDataset (500 samples per shard) + LMDB under ``root`` (made once)."""
    from make_sample_data import make_image_folder

    from shardfeed.convert.write.pack import PackOptions, pack

    folder = root / f"folder-{num_images}"
    if not (folder / ".complete").exists():
        make_image_folder(folder, num_images=num_images, num_classes=10, min_size=64, max_size=128)
        (folder / ".complete").write_text("")
    out = {"folder": str(folder)}
    for fmt, name in (("wds", "wds"), ("lmdb", "lmdb")):
        dst = root / f"{name}-{num_images}"
        if not (dst / "manifest.json").exists():
            pack(folder, dst, PackOptions(format=fmt, max_count=500, workers=2, overwrite=True))
        out[name] = str(dst)
    return out


def _state_at(source: str, fraction: float, kw: dict) -> tuple[dict, int]:
    """A real state after ``fraction`` of an epoch's batches (raw mode: no decoding, same split)."""
    from shardfeed.readers import make_loader

    raw_kw = {k: v for k, v in kw.items() if k not in ("image_size", "train")}
    loader = make_loader(source, decode=False, **raw_kw)
    want = int(len(loader) * fraction)
    it = iter(loader)
    for _ in range(want):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it, loader
    return state, want


def _ttfb(source: str, kw: dict, state: dict | None) -> float:
    from shardfeed.readers import make_loader

    gc.collect()
    with Timer() as t:
        loader = make_loader(source, **kw)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        images, _ = next(it)
    assert images.shape[0] == kw["batch_size"]
    del it, loader  # workers stop here, untimed
    gc.collect()
    return t.s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench/resume")
    p.add_argument("--data", default="data/bench-resume", help="where the generated data sets are cached")
    p.add_argument("--num-images", type=int, default=6000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="2,000 images, 3 rounds")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)
    if args.quick:
        args.num_images, args.rounds = 2000, 3
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = _dataset(Path(args.data), args.num_images)
    from shardfeed.convert.tools.serve import serve_directory

    kw = {"batch_size": args.batch_size, "num_workers": args.num_workers, "image_size": 64, "train": True,
          "seed": 1, "persistent_workers": False}
    report = {"machine": machine_info(Path(args.data)), "num_images": args.num_images, "rounds": args.rounds, "cases": {}}
    rows = []
    with serve_directory(data["wds"]) as (url, _):
        sources = {"wds (local)": data["wds"], "wds (HTTP, Range)": url, "lmdb": data["lmdb"],
                   "folder": data["folder"]}
        for name, source in sources.items():
            state, at = _state_at(source, 0.9, kw)
            res = run_rounds({"start": lambda s=source: _ttfb(s, kw, None),
                              "resume@90%": lambda s=source, st=state: _ttfb(s, kw, st)},
                             rounds=args.rounds, log=lambda m: None)
            start, resume = res["values"]["start"], res["values"]["resume@90%"]
            ratio = median([r / s for s, r in zip(start, resume)])
            rows.append((name, median(start), median(resume), ratio))
            report["cases"][name] = {"start_s": start, "resume_s": resume, "ratio": ratio,
                                     "state": {k: state[k] for k in ("epoch", "samples_consumed", "batches_consumed")},
                                     "resumed_after_batches": at}
    print(f"time to first batch, {args.num_images} images, batch {args.batch_size}, {args.num_workers} workers, "
          f"train transforms at 64 px; median of {args.rounds} paired rounds")
    print(f"{'source':<20} {'start (s)':>10} {'resume@90% (s)':>15} {'ratio':>7}  target <= 1.5")
    ok = True
    for name, s, r, ratio in rows:
        verdict = "PASS" if ratio <= 1.5 else "MISS"
        ok &= ratio <= 1.5
        print(f"{name:<20} {s:>10.3f} {r:>15.3f} {ratio:>7.2f}  {verdict}")
    (out_dir / "resume.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out_dir / 'resume.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
