#!/usr/bin/env python3
"""``make demo``'s second verdict: the same ``verify`` over **emulated** network storage.

Mounts the image folder and its packed copy through ``scripts/storage_emulator.py`` (a FUSE
passthrough adding, by default, 2 ms per open and per read request: about a cloud block disk at
queue depth 1; sources in that module's docstring), runs ``shardfeed verify`` over the two mounts
with the demo's settings, and prints both verdicts: the local disk's (from the demo's first
``verify --json``) and the emulated network storage's. Where no FUSE mount can be made it says why
in one line and exits 0, so the demo still shows the local comparison.

No ``--cold`` here (extra ``verify`` options pass through, ``--cold`` included): the emulator opens
files without ``keep_cache``, so the kernel drops a file's cached pages on every open and each run
reads through the emulated storage anyway, while ``--cold``'s eviction (three opens of every file
of both datasets before each run, each paying the emulated latency) would add ~70 s to the demo.
For the same reason ``verify`` runs with ``--no-warm-cache``: its warm-up read through the mounts
would cache nothing and took ~24 s; instead the two backing folders are read once here, directly
(well under a second), so neither side's emulated reads wait on the local disk behind the mount.

Example::

    python scripts/demo_network.py data/sample out/demo/wds --local-json out/demo/verify.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from storage_emulator import StorageEmulator, StorageEmulatorError, fuse_unavailable_reason  # noqa: E402

from shardfeed.readers.measure.cache import dataset_files, warm_page_cache  # noqa: E402

__all__ = ["main"]


def _shardfeed() -> str:
    exe = Path(sys.executable).parent / "shardfeed"
    return str(exe) if exe.exists() else (shutil.which("shardfeed") or "shardfeed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="the image folder (BEFORE)")
    p.add_argument("packed", help="its packed copy (AFTER)")
    p.add_argument("--latency-ms", type=float, default=2.0, help="emulated latency per open and per read request")
    p.add_argument("--local-json", default=None, help="the local verify's --json report, for the side-by-side verdicts")
    p.add_argument("--json", default=None, help="where this verify writes its report")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args, verify_extra = p.parse_known_args(argv)

    label = f"emulated network storage ({args.latency_ms:g} ms per open and per read request, FUSE emulator)"
    reason = fuse_unavailable_reason()
    if reason is None:
        try:
            folder_mnt = StorageEmulator(args.folder, open_ms=args.latency_ms, read_ms=args.latency_ms).start()
        except StorageEmulatorError as e:
            reason = f"{str(e).splitlines()[0][:200]}"
    if reason:
        print(f"demo: network-storage verify skipped ({reason}); the local comparison above is the demo's verdict.")
        return 0
    # the backing files, read directly: the mounts cache nothing, the disk behind them should
    warm_page_cache(dataset_files(args.folder) + dataset_files(args.packed))
    try:
        with StorageEmulator(args.packed, open_ms=args.latency_ms, read_ms=args.latency_ms) as packed_mnt:
            print(f"\ndemo: verify again over {label} ...", flush=True)
            cmd = [_shardfeed(), "verify", str(folder_mnt.mountpoint), str(packed_mnt.mountpoint),
                   "--compute-ms", "20", "--num-workers", "2", "--threads", "1", "--image-size", "64",
                   "--batch-size", "64", "--repeats", str(args.repeats), "--batches", str(args.batches),
                   "--warmup", str(args.warmup), "--no-warm-cache", *verify_extra]
            if args.json:
                cmd += ["--json", args.json]
            r = subprocess.run(cmd)
            if r.returncode != 0:
                print(f"demo: the verify over {label} failed (status {r.returncode})", file=sys.stderr)
                return r.returncode
    finally:
        folder_mnt.stop()
    print("\nverdicts (same loop, same data; the second storage is an emulation, not a measurement of real NFS,"
          " disks or buckets):")
    if args.local_json and Path(args.local_json).is_file():
        print(f"  local disk:                {json.loads(Path(args.local_json).read_text()).get('headline', '?')}")
    if args.json and Path(args.json).is_file():
        print(f"  emulated network storage:  {json.loads(Path(args.json).read_text()).get('headline', '?')}"
              f"  [{args.latency_ms:g} ms per open and per read request]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
