#!/usr/bin/env python
"""CPU per image of a weighted mix of two sources against one source, side by side, in one run.

Makes a small sample folder and packs it (LMDB and WebDataset each); the second source is a copy
of the first, so both cases decode images of the same sizes and kinds. Then reads, in rotating
order each round, one epoch of decoded images (``image_size=64``, ``num_workers=0``, batches of 64):

* ``single``: one source, a plain epoch (``make_loader(a)``);
* ``mix``: both sources, ``weights=[1, 1]``, ``samples_per_epoch`` = the size of one source.

Prints images per CPU second (this process: steadier than wall time on a shared machine) and the
ratio of CPU per image, mix / single (target: at most 1.05). Runs in about a minute on 2 cores.

    .venv/bin/python scripts/bench_mixing.py
    .venv/bin/python scripts/bench_mixing.py --num-images 4000 --rounds 7 --json out/mixing.json
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-images", type=int, default=3000, help="in each source")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from shardfeed.convert.pack import PackOptions, pack
    from shardfeed.readers import make_loader

    work = Path(tempfile.mkdtemp(prefix="bench-mixing-"))
    make_image_folder(work / "images", num_images=args.num_images, min_size=64, max_size=128)
    cases = {}
    for fmt in ("lmdb", "wds"):
        a, b = work / f"{fmt}-a", work / f"{fmt}-b"
        pack(work / "images", a, PackOptions(format=fmt, max_count=100, workers=1, seed=0))
        shutil.copytree(a, b)
        opts = dict(image_size=64, num_workers=0, batch_size=64, seed=0)
        cases[f"{fmt} single"] = functools.partial(_epoch, make_loader(str(a), **opts))
        cases[f"{fmt} mix"] = functools.partial(_epoch, make_loader([str(a), str(b)], weights=[1, 1],
                                                                    samples_per_epoch=args.num_images, **opts))
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
