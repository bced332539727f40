"""Object-store benchmark rows, side by side in one run against a real S3-API server on
loopback (moto's standalone server, a separate process, as nginx is):

* raw read of the same shards from the S3-API server / from nginx (target >= 0.8), and / plain
  HTTP GETs of the same objects from the same server (presigned URLs: the server's own ceiling);
* ``shardfeed pack`` to a bucket / to the local disk (images/s);
* loader images/s: the image folder in a bucket (one GET per image) vs its shards in the same bucket.

Usage: .venv/bin/python scripts/bench_s3.py [--src data/sample] [--out out/bench] [--rounds 5]

Needs boto3 and moto[server] (the dev extra) and nginx (``make system-deps``; its row is skipped
without it). Writes OUT/s3.json. The server is moto (Python): its per-request cost bounds the
rows; a production store behaves otherwise, and the ratios say how the client side compares.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Results, _free_port, _stop, _wait_port, log, start_nginx  # noqa: E402
from bench_util import median, paired_ratio, run_rounds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent


def start_moto(work: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    # moto's threaded server in its own process (the moto_server CLI hung here under concurrent PUTs)
    code = ("import logging, sys, threading; logging.getLogger('werkzeug').setLevel(logging.ERROR); "
            "from moto.server import ThreadedMotoServer; "
            "s = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False); s.start(); "
            "threading.Event().wait()")
    env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(1 << 30)}  # objects in memory, not temp files
    proc = subprocess.Popen([PY, "-c", code, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _wait_port(port, proc, "moto_server", timeout_s=30)
    return proc, f"http://127.0.0.1:{port}"


def upload_tree(client, bucket: str, prefix: str, root: Path) -> None:
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.put_object(Bucket=bucket, Key=prefix + p.relative_to(root).as_posix(),
                                                  Body=p.read_bytes()), files))


def raw_read(loc, names: list[str]) -> dict:
    t = time.perf_counter()
    n = 0
    for name in names:
        stream, _ = loc.open(name)
        with stream:
            while True:
                chunk = stream.read(1 << 20)
                if not chunk:
                    break
                n += len(chunk)
    dt = time.perf_counter() - t
    return {"value": n / dt / 1e6, "bytes": n}


class _Presigned:
    """Opens presigned object URLs with shardfeed's HTTP reader (what a user without the s3 extra
    would do)."""

    def __init__(self, urls: dict[str, str]):
        self.urls = urls

    def open(self, name: str):
        from shardfeed.readers.storage.http_io import HttpRangeStream

        s = HttpRangeStream(self.urls[name])
        return s, 0


def loader_rate(src: str, num_workers: int, num_batches: int) -> dict:
    from shardfeed.readers import make_loader

    loader = make_loader(src, batch_size=64, num_workers=num_workers, image_size=64, persistent_workers=False)
    it = iter(loader)
    next(it)  # workers started, first batch out: not timed
    t = time.perf_counter()
    n = 0
    for _ in range(num_batches):
        try:
            _, labels = next(it)
        except StopIteration:
            break
        n += len(labels)
    dt = time.perf_counter() - t
    del it, loader
    return {"value": n / dt, "images": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=ROOT / "data" / "sample")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=30)
    args = ap.parse_args(argv)
    if not args.src.is_dir():
        subprocess.run([PY, str(ROOT / "scripts" / "make_sample_data.py"), str(args.src)], check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    res = Results()
    moto, endpoint = start_moto(work)
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", SHARDFEED_STAGING_DIR=str(work))
    nginx = None
    try:
        import boto3

        from shardfeed.readers.storage.http_io import HttpLocation
        from shardfeed.readers.storage.objstore import StoreLocation

        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        shards = work / "shards"
        subprocess.run([str(BIN / "shardfeed"), "-q", "pack", str(args.src), str(shards), "--format", "wds",
                        "--max-count", "500"], check=True)
        upload_tree(client, "bench", "shards/", shards)
        upload_tree(client, "bench", "folder/", args.src)
        names = sorted(p.name for p in shards.glob("*.tar"))
        info = {"src": str(args.src), "shard_bytes": sum((shards / n).stat().st_size for n in names),
                "num_shards": len(names), "server": "moto_server (separate process)"}

        # 1. raw read: S3-API server vs nginx, the same shards; and the S3 reader vs plain HTTP GETs
        # of the same objects from the same server (presigned URLs through shardfeed's HTTP reader):
        # the server's own ceiling, so the client's share is visible. The location (its client) is
        # made once, as each loader worker makes it once.
        store = StoreLocation("s3://bench/shards/")
        store.client()
        presigned = {n: client.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": "shards/" + n},
                                                      ExpiresIn=3600) for n in names}
        cases = {"s3": lambda: raw_read(store, names),
                 "s3_http": lambda: raw_read(_Presigned(presigned), names)}
        try:
            nginx, port = start_nginx(shards, work)
            cases["nginx"] = lambda: raw_read(HttpLocation(f"http://127.0.0.1:{port}/"), names)
        except (OSError, RuntimeError) as exc:
            res.note(f"nginx unavailable ({exc}); the raw-read row is skipped")
        log(f"[s3] raw read of {len(names)} shards ({info['shard_bytes'] / 1e6:.1f} MB): S3-API server vs nginx")
        r = run_rounds(cases, rounds=args.rounds, log=log)
        v = r["values"]
        res.figures["raw_read_mb_s"] = v
        res.row("raw read: S3 reader / plain HTTP GET, same server", "sample", paired_ratio(v["s3"], v["s3_http"]),
                ">= 0.8", ">=", 0.8, f"{median(v['s3']):,.0f} vs {median(v['s3_http']):,.0f} MB/s")
        if "nginx" in v:
            res.row("raw read from the S3-API server / nginx", "sample", paired_ratio(v["s3"], v["nginx"]), ">= 0.8",
                    ">=", 0.8, f"{median(v['s3']):,.0f} vs {median(v['nginx']):,.0f} MB/s")

        # 2. pack to a bucket vs to the local disk
        counter = [0]

        def pack_to(kind: str) -> dict:
            counter[0] += 1
            out = f"s3://bench/pack{counter[0]}" if kind == "s3" else str(work / f"pack{counter[0]}")
            t = time.perf_counter()
            subprocess.run([str(BIN / "shardfeed"), "-q", "pack", str(args.src), out, "--format", "wds",
                            "--max-count", "500", "-j", "2"], check=True, capture_output=True)
            dt = time.perf_counter() - t
            if kind == "local":
                shutil.rmtree(out)
            return {"value": dt}
        log("[s3] pack to a bucket vs to the local disk (wall s)")
        r = run_rounds({"s3": lambda: pack_to("s3"), "local": lambda: pack_to("local")}, rounds=args.rounds, log=log)
        v = r["values"]
        res.figures["pack_s"] = v
        res.row("pack to a bucket / to local disk (images/s)", "sample", paired_ratio(v["local"], v["s3"]), "info",
                ">=", 0.0, f"{median(v['s3']):.2f} s vs {median(v['local']):.2f} s")

        # 3. loader: folder in a bucket vs shards in the same bucket
        log(f"[s3] loader images/s ({args.num_workers} workers, 64 px): folder in the bucket vs shards")
        r = run_rounds({"folder": lambda: loader_rate("s3://bench/folder/", args.num_workers, args.batches),
                        "shards": lambda: loader_rate("s3://bench/shards/", args.num_workers, args.batches)},
                       rounds=args.rounds, log=log)
        v = r["values"]
        res.figures["loader_images_s"] = v
        res.row("loader: shards in a bucket / folder in the bucket", "sample", paired_ratio(v["shards"], v["folder"]),
                ">= 1", ">=", 1.0, f"{median(v['shards']):,.0f} vs {median(v['folder']):,.0f} images/s")
    finally:
        if nginx is not None:
            _stop(nginx)
        _stop(moto)
        shutil.rmtree(work, ignore_errors=True)
    print(res.table())
    (args.out / "s3.json").write_text(json.dumps({"rows": res.rows, "figures": res.figures, "notes": res.notes,
                                                  "info": info}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
