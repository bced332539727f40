#!/usr/bin/env python
"""Raw HTTP reader throughput: a packed WebDataset read over nginx on 127.0.0.1.

Starts nginx serving the dataset's parent folder, then reads every sample with
``open_dataset(URL, decode=False, shuffle=False)`` in this process: whole epochs ("epoch": one
stream a shard) and the same epoch split over ``--ranks`` ranks ("ranks": each rank opens the
dataset, checks sizes with HEAD, and reads ranges that start inside shards: request-bound).
Prints the best of ``--repeats`` runs of each as samples/s and MB/s; ``--json`` writes them.
Run it at two commits to compare the HTTP transport (the ratio is the figure; loopback hides the
network, so it measures the client's own cost).

    .venv/bin/python scripts/make_sample_data.py data/sample
    .venv/bin/python -m shardfeed.convert.cli pack data/sample out/http-wds --format wds --max-count 100
    .venv/bin/python scripts/http_reader_throughput.py out/http-wds --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def start_nginx(root: Path, work: Path) -> tuple[subprocess.Popen, int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = " ".join(f"{k}_temp_path {work}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        f"{user}daemon off; worker_processes 2; pid {work}/nginx.pid; error_log {work}/error.log warn;\n"
        f"events {{ worker_connections 256; }}\n"
        f"http {{ access_log off; {temp} server {{ listen 127.0.0.1:{port}; root {root}; location / {{ }} }} }}\n")
    proc = subprocess.Popen([nginx, "-p", str(work), "-c", str(work / "nginx.conf")], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("nginx did not start")


def read_all(url: str, ranks: int) -> tuple[int, int]:
    from shardfeed.readers import open_dataset

    n = nbytes = 0
    for rank in range(ranks):
        kw = dict(rank=rank, world_size=ranks) if ranks > 1 else {}
        for s in open_dataset(url, decode=False, shuffle=False, **kw):
            n += 1
            nbytes += len(s.data)
    return n, nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path, help="a packed WebDataset folder")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = args.dataset.resolve()
    with tempfile.TemporaryDirectory() as work:
        proc, port = start_nginx(root.parent, Path(work))
        try:
            url = f"http://127.0.0.1:{port}/{root.name}/"
            out = {}
            for name, ranks in (("epoch", 1), ("ranks", args.ranks)):
                best = None
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    n, nbytes = read_all(url, ranks)
                    dt = time.perf_counter() - t0
                    best = dt if best is None else min(best, dt)
                out[name] = {"samples": n, "samples_per_s": n / best, "mb_per_s": nbytes / best / 1e6,
                             "ranks": ranks, "repeats": args.repeats}
                print(f"{name:6s} ({ranks} rank{'s' if ranks > 1 else ''}): {n} samples, best of {args.repeats}: "
                      f"{n / best:,.0f} samples/s, {nbytes / best / 1e6:,.0f} MB/s")
        finally:
            proc.terminate()
            proc.wait()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
