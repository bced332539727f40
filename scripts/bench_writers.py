#!/usr/bin/env python3
"""The other writers ``scripts/bench.py`` compares ``shardfeed pack`` with, each as a whole process.

Each mode lists the ImageFolder the way a typical user script does (sorted ``os.walk``), reads
every image and writes the same samples as ``shardfeed pack --format wds`` (``{key}.jpg``,
``{key}.cls``, ``{key}.json``; at most 10,000 samples and 256 MB per shard):

* ``wds``: webdataset's ``ShardWriter`` with an integer ``mtime`` (0).
* ``wds-float-mtime``: the same with webdataset's default ``mtime`` (``time.time()``, a float),
  which makes Python's ``tarfile`` add a PAX header (an extra 1 KB) to every member —
  webdataset issue #207.
* ``tarfile``: a plain ``tarfile`` loop (``TarFile.add`` per image, one archive).

Usage: ``bench_writers.py MODE SRC OUT_DIR`` (prints a JSON line: samples, seconds after imports).
"""

from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["list_folder", "main"]

IMAGE_EXTS = (".jpg", ".jpeg", ".png")


def list_folder(root: str) -> list[tuple[str, str, int]]:
    """``[(path, class_name, label)]`` of an ImageFolder, sorted like torchvision's."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    out = []
    for label, c in enumerate(classes):
        for dirpath, dirnames, names in sorted(os.walk(os.path.join(root, c))):
            for n in sorted(names):
                if n.lower().endswith(IMAGE_EXTS):
                    out.append((os.path.join(dirpath, n), c, label))
    return out


def main(argv: list[str]) -> int:
    mode, src, out = argv
    t_start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    if mode in ("wds", "wds-float-mtime"):
        import webdataset as wds  # imports torch: part of this writer's cost, as for its users
    t_import = time.perf_counter()
    files = list_folder(src)
    if mode in ("wds", "wds-float-mtime"):
        kw = {} if mode == "wds-float-mtime" else {"mtime": 0}
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=10000, maxsize=256e6, verbose=0,
                             **kw) as sink:
            for i, (path, cname, label) in enumerate(files):
                with open(path, "rb") as f:
                    data = f.read()
                rel = os.path.relpath(path, src)
                meta = json.dumps({"class": cname, "path": rel}, separators=(",", ":")).encode()
                sink.write({"__key__": "%09d" % i, "jpg": data, "cls": str(label).encode(), "json": meta})
    elif mode == "tarfile":
        import tarfile

        with tarfile.open(os.path.join(out, "shard-000000.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            for path, _, _ in files:
                tf.add(path, arcname=os.path.relpath(path, src))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    t_end = time.perf_counter()
    print(json.dumps({"samples": len(files), "import_s": t_import - t_start, "write_s": t_end - t_import}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
