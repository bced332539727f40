"""Choose the object-store client by measurement: ranged-GET throughput and per-request latency of
boto3, obstore and fsspec/s3fs against one real S3-API server on loopback (moto's standalone
server), side by side in one run.

Usage: .venv/bin/python scripts/measure_s3_clients.py [--size-mib 64] [--rounds 3]

Prints, for each installed client: MiB/s reading one object in 8 MiB ranged GETs (the reader's
shard read), the median latency of a 4 KiB ranged GET (an index or a small image: per-request
overhead), and of a HEAD. Clients that are not installed are skipped (pip install boto3 obstore
s3fs). The server is the same process for all, so the ratios compare the clients only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

BUCKET = "measure"
KEY = "big.bin"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", type=int, default=200, help="small ranged GETs per latency round")
    args = ap.parse_args(argv)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    size = args.size_mib << 20
    payload = os.urandom(size)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=payload)
    chunk = 8 << 20

    clients = {}

    def boto3_client():
        c = boto3.client("s3")

        def ranged(start, end):
            return c.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={start}-{end - 1}")["Body"].read()

        def head():
            return c.head_object(Bucket=BUCKET, Key=KEY)["ContentLength"]
        return ranged, head

    clients["boto3"] = boto3_client
    try:
        import obstore
        from obstore.store import S3Store

        def obstore_client():
            st = S3Store(BUCKET, config={"endpoint": endpoint, "allow_http": True, "region": "us-east-1"})

            def ranged(start, end):
                return bytes(obstore.get_range(st, KEY, start=start, end=end))

            def head():
                return obstore.head(st, KEY)["size"]
            return ranged, head
        clients["obstore"] = obstore_client
    except ImportError:
        print("obstore not installed: skipped")
    try:
        import s3fs

        def s3fs_client():
            fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)

            def ranged(start, end):
                return fs.cat_file(f"{BUCKET}/{KEY}", start=start, end=end)

            def head():
                return fs.info(f"{BUCKET}/{KEY}", refresh=True)["size"]
            return ranged, head
        clients["s3fs"] = s3fs_client
    except ImportError:
        print("s3fs not installed: skipped")

    made = {name: make() for name, make in clients.items()}
    results = {name: {"mib_s": [], "small_ms": [], "head_ms": []} for name in made}
    for _ in range(args.rounds):
        for name, (ranged, head) in made.items():  # interleaved: each round measures every client
            t = time.perf_counter()
            got = 0
            for start in range(0, size, chunk):
                data = ranged(start, min(size, start + chunk))
                got += len(data)
            dt = time.perf_counter() - t
            if got != size or data != payload[size - len(data):]:
                raise SystemExit(f"{name}: wrong bytes")
            results[name]["mib_s"].append(size / dt / (1 << 20))
            lat = []
            for i in range(args.small):
                s = (i * 7919 * 4096) % (size - 4096)
                t = time.perf_counter()
                d = ranged(s, s + 4096)
                lat.append(time.perf_counter() - t)
                if d != payload[s:s + 4096]:
                    raise SystemExit(f"{name}: wrong small range")
            results[name]["small_ms"].append(statistics.median(lat) * 1e3)
            lat = []
            for _ in range(50):
                t = time.perf_counter()
                head()
                lat.append(time.perf_counter() - t)
            results[name]["head_ms"].append(statistics.median(lat) * 1e3)
    print(f"server: moto {endpoint} (one process for all clients); object {args.size_mib} MiB, 8 MiB ranged GETs; "
          f"{args.rounds} interleaved rounds, medians")
    print(f"{'client':10} {'ranged GET MiB/s':>17} {'4 KiB GET ms':>13} {'HEAD ms':>8}")
    for name, r in results.items():
        print(f"{name:10} {statistics.median(r['mib_s']):17.0f} {statistics.median(r['small_ms']):13.2f} "
              f"{statistics.median(r['head_ms']):8.2f}")
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
