#!/usr/bin/env python
"""CPU per image of a weighted mix of two sources against one source, side by side, in one run.

Makes a small sample folder and packs it (LMDB and WebDataset each); the second source is a copy
of the first, so both cases decode images of the same sizes and kinds. Then reads, in rotating
order each round, one epoch of decoded images (``image_size=64``, ``num_workers=0``, batches of 64):

* ``single``: one source, a plain epoch (``make_loader(a)``);
* ``mix``: both sources, ``weights=[1, 1]``, ``samples_per_epoch`` = the size of one source.

Prints images per CPU second (this process: steadier than wall time on a shared machine) and the
ratio of CPU per image, mix / single (target: at most 1.05). Runs in about a minute on 2 cores.

With ``--baseline-src DIR`` (a folder holding another commit's ``shardfeed/``) the same data is
read by this code and by that one, side by side: each round runs one process of each (in turn),
which reads a warm-up epoch of each case and then ``--epochs`` epochs in rotating order; a
process's ratio is the median of its epochs' ratios, and the table gives the median over rounds.

    .venv/bin/python scripts/bench_mixing.py
    .venv/bin/python scripts/bench_mixing.py --num-images 4000 --rounds 7 --json out/mixing.json
    .venv/bin/python scripts/bench_mixing.py --baseline-src /tmp/base/src --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_util import median, paired_ratio, run_rounds  # noqa: E402
from make_sample_data import make_image_folder  # noqa: E402


def _epoch(loader) -> dict:
    """Images per CPU second of this process over one epoch of ``loader`` (``value``)."""
    c0 = time.process_time()
    n = sum(len(batch[1]) for batch in loader)
    return {"value": n / max(time.process_time() - c0, 1e-9), "images": n}


def _make_data(work: Path, num_images: int) -> None:
    """The sample folder, packed as LMDB and WebDataset, each copied once (the second source)."""
    from shardfeed.convert.write.pack import PackOptions, pack

    make_image_folder(work / "images", num_images=num_images, min_size=64, max_size=128)
    for fmt in ("lmdb", "wds"):
        a, b = work / f"{fmt}-a", work / f"{fmt}-b"
        pack(work / "images", a, PackOptions(format=fmt, max_count=100, workers=1, seed=0))
        shutil.copytree(a, b)


def _cases(work: Path, num_images: int, decode: bool = True) -> dict:
    from shardfeed.readers import make_loader

    cases = {}
    for fmt in ("lmdb", "wds"):
        a, b = work / f"{fmt}-a", work / f"{fmt}-b"
        opts = dict(image_size=64, num_workers=0, batch_size=64, seed=0, decode=decode)
        cases[f"{fmt} single"] = functools.partial(_epoch, make_loader(str(a), **opts))
        cases[f"{fmt} mix"] = functools.partial(_epoch, make_loader([str(a), str(b)], weights=[1, 1],
                                                                    samples_per_epoch=num_images, **opts))
    return cases


def _child(work: Path, num_images: int, epochs: int) -> int:
    """One process of a side-by-side run: prints ``{fmt: ratio}`` (median over its epochs) as JSON."""
    result = run_rounds(_cases(work, num_images), rounds=epochs, warmup=1, log=lambda text: None)
    values = result["values"]
    print(json.dumps({fmt: paired_ratio(values[f"{fmt} single"], values[f"{fmt} mix"]) for fmt in ("lmdb", "wds")}))
    return 0


def _side_by_side(work: Path, args) -> int:
    """This code and ``--baseline-src``'s, one process each per round, in turn; prints both ratios."""
    import os

    from bench_util import run_process

    import shardfeed.readers

    here = str(Path(shardfeed.readers.__file__).parents[2])  # the folder holding this code's shardfeed/
    codes = {"this": here, "baseline": str(args.baseline_src)}
    ratios: dict = {name: {"lmdb": [], "wds": []} for name in codes}
    for r in range(args.rounds):
        for name in (list(codes) if r % 2 == 0 else list(codes)[::-1]):
            env = {**os.environ, "PYTHONPATH": codes[name]}
            out = run_process([sys.executable, "-P", __file__, "--child", str(work), "--num-images",
                               str(args.num_images), "--epochs", str(args.epochs)], env=env)
            got = json.loads(out["stdout"].strip().splitlines()[-1])
            for fmt in ("lmdb", "wds"):
                ratios[name][fmt].append(got[fmt])
            print(f"round {r + 1}: {name}: " + ", ".join(f"{f} {got[f]:.3f}x" for f in ("lmdb", "wds")), flush=True)
    print(f"\nCPU per image, mix / single (target <= 1.05); median of {args.rounds} rounds")
    print(f"{'':8}{'baseline':>12}{'this':>12}")
    for fmt in ("lmdb", "wds"):
        print(f"{fmt:8}{median(ratios['baseline'][fmt]):>11.3f}x{median(ratios['this'][fmt]):>11.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"num_images": args.num_images, "rounds": args.rounds,
                                               "epochs": args.epochs, "cpu_ratios": ratios}, indent=2))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-images", type=int, default=3000, help="in each source")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--baseline-src", type=Path, default=None, metavar="DIR",
                    help="a folder holding another commit's shardfeed/: run both side by side")
    ap.add_argument("--epochs", type=int, default=3, help="with --baseline-src: measured epochs per process")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.child is not None:
        return _child(args.child, args.num_images, args.epochs)

    work = Path(tempfile.mkdtemp(prefix="bench-mixing-"))
    _make_data(work, args.num_images)
    if args.baseline_src is not None:
        try:
            return _side_by_side(work, args)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    cases = _cases(work, args.num_images)
    print(f"two sources of {args.num_images} images; {args.rounds} rounds (warm-up round first)")
    result = run_rounds(cases, rounds=args.rounds, warmup=1)
    values = result["values"]
    out: dict = {"num_images": args.num_images, "rounds": args.rounds,
                 "images_per_cpu_s": {k: median(v) for k, v in values.items()}}
    print(f"\n{'':8}{'single':>14}{'mix':>14}{'CPU per image, mix/single':>28}")
    for fmt in ("lmdb", "wds"):
        ratio = paired_ratio(values[f"{fmt} single"], values[f"{fmt} mix"])  # rates: single/mix = CPU mix/single
        out[f"cpu_ratio_{fmt}"] = ratio
        print(f"{fmt:8}{median(values[f'{fmt} single']):>14,.0f}{median(values[f'{fmt} mix']):>14,.0f}"
              f"{ratio:>27.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
