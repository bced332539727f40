#!/usr/bin/env python
"""Raw HTTP reader throughput: a packed WebDataset read over nginx on 127.0.0.1.

Starts nginx serving the dataset's parent folder, then reads every sample with
``open_dataset(URL, decode=False, shuffle=False)`` in this process: whole epochs ("epoch": one
stream a shard) and the same epoch split over ``--ranks`` ranks ("ranks": each rank opens the
dataset, checks sizes with HEAD, and reads ranges that start inside shards: request-bound).
Prints the best of ``--repeats`` runs of each as samples/s and MB/s, with the requests and the
connections one run made (counted in nginx's access log: keep-alive reuse shows as fewer
connections than requests); ``--json`` writes them.
Run it at two commits to compare the HTTP transport (the ratio is the figure; loopback hides the
network, so it measures the client's own cost).

    .venv/bin/python scripts/make_sample_data.py data/sample
    .venv/bin/python -m shardfeed.convert.cli pack data/sample out/http-wds --format wds --max-count 100
    .venv/bin/python scripts/http_reader_throughput.py out/http-wds --repeats 7
    .venv/bin/python scripts/http_reader_throughput.py out/http-wds --repeats 7 --https
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


def make_certificate(work: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (``openssl``): ``(cert.pem, key.pem)``."""
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def start_nginx(root: Path, work: Path, tls: tuple[Path, Path] | None = None) -> tuple[subprocess.Popen, int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    user = "user root;\n" if os.geteuid() == 0 else ""
    ssl = "" if tls is None else f" ssl; ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]}"
    temp = " ".join(f"{k}_temp_path {work}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        f"{user}daemon off; worker_processes 2; pid {work}/nginx.pid; error_log {work}/error.log warn;\n"
        f"events {{ worker_connections 256; }}\n"
        f"http {{ log_format conn '$connection'; access_log {work}/access.log conn; {temp} server {{ listen 127.0.0.1:{port}{ssl}; root {root}; location / {{ }} }} }}\n")
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


def requests_and_connections(log: Path, seen: int) -> tuple[int, int, int]:
    """``(requests, connections, lines)`` of the access log's lines after the first ``seen``."""
    lines = log.read_text().splitlines() if log.exists() else []
    new = lines[seen:]
    return len(new), len(set(new)), len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path, help="a packed WebDataset folder")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--https", action="store_true",
                    help="serve over TLS (a self-signed certificate, trusted through SSL_CERT_FILE): each new "
                         "connection then costs a TLS handshake, as against a real server")
    args = ap.parse_args()
    root = args.dataset.resolve()
    with tempfile.TemporaryDirectory() as work:
        tls = make_certificate(Path(work)) if args.https else None
        if tls is not None:
            os.environ["SSL_CERT_FILE"] = str(tls[0])
        proc, port = start_nginx(root.parent, Path(work), tls)
        try:
            url = f"http{'s' if tls else ''}://127.0.0.1:{port}/{root.name}/"
            out = {}
            for name, ranks in (("epoch", 1), ("ranks", args.ranks)):
                best = None
                log = Path(work) / "access.log"
                for _ in range(args.repeats):
                    _, _, seen = requests_and_connections(log, 0)
                    t0 = time.perf_counter()
                    n, nbytes = read_all(url, ranks)
                    dt = time.perf_counter() - t0
                    best = dt if best is None else min(best, dt)
                    requests, connections, _ = requests_and_connections(log, seen)
                out[name] = {"samples": n, "samples_per_s": n / best, "mb_per_s": nbytes / best / 1e6,
                             "ranks": ranks, "repeats": args.repeats, "requests": requests,
                             "connections": connections}
                print(f"{name:6s} ({ranks} rank{'s' if ranks > 1 else ''}): {n} samples, best of {args.repeats}: "
                      f"{n / best:,.0f} samples/s, {nbytes / best / 1e6:,.0f} MB/s; {requests} requests over "
                      f"{connections} connections a run")
        finally:
            proc.terminate()
            proc.wait()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
