#!/usr/bin/env python
"""Loader throughput (images/s) of the three sources: folder, WebDataset, LMDB.

Packs FOLDER into OUT/wds and OUT/lmdb (unless they exist), then for each source and each
``--workers`` value runs ``make_loader(source, batch_size, num_workers=W, image_size=S)``: one
warm-up epoch (starts the persistent workers, fills the page cache), then ``--epochs`` timed
epochs. Also times the raw read (``decode=False``, main process). Prints a table; ``--json``
writes it.

    .venv/bin/python scripts/loader_throughput.py data/sample --out out/throughput \\
        --image-size 64 --batch-size 64 --workers 0,2
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def ensure_packed(folder: Path, out: Path) -> dict[str, Path]:
    from shardfeed.convert.write.pack import PackOptions, pack

    paths = {"folder": folder, "webdataset": out / "wds", "lmdb": out / "lmdb"}
    for fmt, key in (("wds", "webdataset"), ("lmdb", "lmdb")):
        if not (paths[key] / "manifest.json").exists():
            pack(folder, paths[key], PackOptions(format=fmt, max_count=1000, overwrite=True))
    return paths


def time_loader(source: Path, *, batch_size: int, workers: int, image_size: int, epochs: int) -> float:
    from shardfeed.readers import make_loader

    loader = make_loader(source, batch_size, num_workers=workers, image_size=image_size)
    for _ in loader:  # warm-up epoch
        pass
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for _, labels in loader:
            n += len(labels)
    return n / (time.perf_counter() - t0)


def time_raw(source: Path, epochs: int) -> float:
    import torch

    from shardfeed.readers import open_dataset

    ds = open_dataset(source, decode=False)
    if isinstance(ds, torch.utils.data.IterableDataset):
        def one():
            return sum(1 for _ in ds)
    else:
        def one():
            return sum(1 for i in range(len(ds)) if ds[i] is not None)
    one()
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        n += one()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, default=Path("out/throughput"))
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    paths = ensure_packed(args.folder, args.out)
    workers = [int(w) for w in args.workers.split(",")]
    rows = []
    print(f"{'source':12s} " + " ".join(f"{'workers=' + str(w):>14s}" for w in workers) + f" {'raw read':>14s}")
    for name, path in paths.items():
        row = {"source": name, "path": str(path)}
        for w in workers:
            row[f"images_per_s_workers_{w}"] = round(time_loader(path, batch_size=args.batch_size, workers=w,
                                                                 image_size=args.image_size, epochs=args.epochs), 1)
        row["raw_samples_per_s"] = round(time_raw(path, args.epochs), 1)
        rows.append(row)
        print(f"{name:12s} " + " ".join(f"{row[f'images_per_s_workers_{w}']:14,.0f}" for w in workers)
              + f" {row['raw_samples_per_s']:14,.0f}")
    meta = {"cpus": os.cpu_count(), "image_size": args.image_size, "batch_size": args.batch_size,
            "epochs": args.epochs, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
