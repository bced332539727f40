#!/usr/bin/env python
"""A warm shard cache against a staged local copy: images/s side by side, in one run.

Makes a small sample dataset, packs it, serves it over HTTP on 127.0.0.1 (Python's threaded
``http.server``, which counts the requests and bytes it sends), then:

* ``staged``: ``shardfeed stage URL DIR`` (the verified copy), read from DIR;
* ``cached``: ``open_dataset(URL, cache_dir=...)``, warmed by one epoch, then read.

Each round reads each case in rotating order: five epochs of raw samples (``decode=False``, the
I/O path alone) and one epoch of decoded images (``image_size=64``, one process). Prints the
medians and the ratio cached / staged (wall time, and per CPU second: steadier on a shared
machine), and the shard bytes the server sent during the measured rounds (0: the warm cache reads
nothing from the remote). Runs in about a minute and a half on 2 cores.

    .venv/bin/python scripts/bench_shard_cache.py
    .venv/bin/python scripts/bench_shard_cache.py --num-images 3000 --rounds 7 --json out/cache.json
"""

from __future__ import annotations

import argparse
import collections
import functools
import http.server
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_util import median, paired_ratio, run_rounds  # noqa: E402
from make_sample_data import make_image_folder  # noqa: E402


class _Counting(http.server.SimpleHTTPRequestHandler):
    sent: collections.Counter

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.translate_path(self.path)
        if path.endswith((".tar", ".sfidx")):
            self.sent["requests"] += 1
            self.sent["bytes"] += Path(path).stat().st_size  # the whole file: the cache never asks a range
        super().do_GET()


def _serve(root: Path) -> tuple[str, collections.Counter]:
    sent: collections.Counter = collections.Counter()
    handler = functools.partial(type("Handler", (_Counting,), {"sent": sent}), directory=str(root))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/wds/", sent


def _epochs(ds, epochs: int) -> dict:
    """Items/s over ``epochs`` epochs of ``ds`` (``value``), and items per CPU second of this
    process (``cpu``: less sensitive than wall time to other work on a shared machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(1 for _ in range(epochs) for _ in ds)
    return {"value": n / (time.perf_counter() - t0), "cpu": n / max(time.process_time() - c0, 1e-9)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from shardfeed.convert.write.pack import PackOptions, pack
    from shardfeed.convert.tools.stage import stage
    from shardfeed.readers import open_dataset

    work = Path(tempfile.mkdtemp(prefix="bench-shard-cache-"))
    make_image_folder(work / "images", num_images=args.num_images, min_size=64, max_size=128)
    pack(work / "images", work / "served" / "wds", PackOptions(format="wds", max_count=100, workers=1, seed=0))
    url, sent = _serve(work / "served")
    report = stage(url, work / "staged", min_free_bytes=0)
    assert report.ok, report.summary()
    sent.clear()

    cases = {}
    for kind, opts, epochs in (("raw", dict(decode=False), 5), ("decoded", dict(image_size=64), 1)):
        staged = open_dataset(str(work / "staged"), shuffle=True, seed=0, **opts)
        cached = open_dataset(url, shuffle=True, seed=0, cache_dir=work / "cache", **opts)
        cases[f"staged {kind}"] = functools.partial(_epochs, staged, epochs)
        cases[f"cached {kind}"] = functools.partial(_epochs, cached, epochs)
    cached_warm = open_dataset(url, decode=False, cache_dir=work / "cache")
    sum(1 for _ in cached_warm)  # warm the cache: every shard downloaded once
    warm_bytes = sent["bytes"]
    sent.clear()
    print(f"dataset: {args.num_images} images, {warm_bytes / 1e6:.1f} MB of shards and indexes; "
          f"{args.rounds} rounds (warm-up round first)")
    result = run_rounds(cases, rounds=args.rounds, warmup=1)
    values = result["values"]
    out = {"num_images": args.num_images, "rounds": args.rounds,
           "images_per_s": {k: median(v) for k, v in values.items()}, "shard_bytes_fetched_while_measured": sent["bytes"], "requests_while_measured": sent["requests"]}
    cpu = {k: [e["cpu"] for e in v] for k, v in result["extra"].items()}
    out["images_per_cpu_s"] = {k: median(v) for k, v in cpu.items()}
    print(f"\n{'':22}{'staged':>12}{'cached':>12}{'cached/staged':>15}")
    for kind in ("raw", "decoded"):
        for unit, figures in (("images/s", values), ("images/CPU-s", cpu)):
            ratio = paired_ratio(figures[f"cached {kind}"], figures[f"staged {kind}"])
            out[f"ratio_{kind}" + ("" if unit == "images/s" else "_cpu")] = ratio
            print(f"{kind + ' ' + unit:22}{median(figures[f'staged {kind}']):>12,.0f}"
                  f"{median(figures[f'cached {kind}']):>12,.0f}{ratio:>14.3f}x")
    print(f"shard bytes sent by the server while measured: {sent['bytes']} ({sent['requests']} requests)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
