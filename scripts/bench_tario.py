#!/usr/bin/env python3
"""The tar reader of this checkout against the one at another git revision, side by side in one run.

Both versions of the tar reader (``readers/format/tario.py`` and, where a revision has it,
``readers/format/tario_indexed.py``) read the same shards in memory (no disk, no page cache in
the figures), in rounds that alternate their order (``bench_util.run_rounds``); each figure is the
median over the rounds of the CPU time of the reading thread, the ratio the median of the per-round
ratios (``baseline / current``: above 1 means this checkout is faster). Three readers are timed:

- ``indexed``: :func:`~shardfeed.readers.format.tario_indexed.iter_indexed_samples`, the local reader's fast path
  (one ``read_at`` per ~96 KiB of whole samples, from the ``.sfidx`` offsets);
- ``members``: :func:`~shardfeed.readers.format.tario.iter_members` + ``iter_samples`` over a stream
  (the general path: an unindexed shard, a stream, a shard in a bucket);
- ``pax``: the general path over a shard whose every member has a PAX header (``tarfile``'s
  ``PAX_FORMAT`` with long names), the exotic layout the general path exists for.

Usage::

    python scripts/bench_tario.py                    # against main
    python scripts/bench_tario.py --baseline HEAD~3 --samples 20000 --rounds 7 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_util import median, paired_ratio, run_rounds  # noqa: E402

__all__ = ["load_baseline", "load_current", "make_shard", "main"]

ROOT = Path(__file__).resolve().parent.parent


class _CPUTimer:
    """``with _CPUTimer() as t: ...`` then ``t.s``: this thread's CPU seconds (steadier than wall
    time on a busy machine; the readers run in the calling thread, no prefetch)."""

    def __enter__(self) -> "_CPUTimer":
        self.t0 = time.thread_time()
        return self

    def __exit__(self, *exc) -> None:
        self.s = time.thread_time() - self.t0


def _git_source(rev: str, path: str) -> str | None:
    """The text of ``path`` at git revision ``rev`` (None when the revision has no such file)."""
    r = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _exec_module(name: str, source: str, file: str, package: str = "shardfeed.readers") -> types.ModuleType:
    module = types.ModuleType(f"{package}.{name}")
    module.__package__ = package
    module.__file__ = file
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def load_baseline(rev: str):
    """The tar reader at git revision ``rev``: ``readers/format/tario.py`` (``readers/tario.py`` in
    revisions before the sub-packages) imported as a module of its package (so its relative imports
    resolve to this checkout's ``errors``), with the indexed path of ``tario_indexed.py`` beside it at
    ``rev`` (read against that ``tario``) where the revision keeps it in its own module."""
    import importlib

    for folder, package in (("readers/format", "shardfeed.readers.format"), ("readers", "shardfeed.readers")):
        source = _git_source(rev, f"{folder}/tario.py")
        if source is not None:
            break
    else:
        raise SystemExit(f"git revision {rev!r} has no readers/format/tario.py or readers/tario.py")
    importlib.import_module(package)  # the package the module's relative imports need

    if folder == "readers":  # a revision before the sub-packages: its format module is format.manifest
        source = source.replace("from .format import", "from .format.manifest import")
    module = _exec_module("_tario_baseline", source, f"{rev}:{folder}/tario.py", package)
    indexed = _git_source(rev, f"{folder}/tario_indexed.py")
    if indexed is not None:
        indexed = indexed.replace("from .tario import", "from ._tario_baseline import")
        if folder == "readers":  # a revision before the sub-packages: its format module is format.manifest
            indexed = indexed.replace("from .format import", "from .format.manifest import")
        part = _exec_module("_tario_indexed_baseline", indexed, f"{rev}:{folder}/tario_indexed.py", package)
        module.iter_indexed_samples = part.iter_indexed_samples
    return module


def load_current():
    """This checkout's tar reader, both paths: ``iter_members``, ``iter_samples`` and ``iter_indexed_samples``."""
    from shardfeed.readers.format import tario, tario_indexed

    return types.SimpleNamespace(iter_members=tario.iter_members, iter_samples=tario.iter_samples,
                                 iter_indexed_samples=tario_indexed.iter_indexed_samples)


def make_shard(num_samples: int, *, pax: bool = False, seed: int = 0,
               image_bytes: tuple[int, int] = (2048, 40960)) -> tuple[bytes, list[int]]:
    """A WebDataset shard in memory (``.jpg`` of random bytes, ``image_bytes`` the range of their
    sizes, ``.cls``, ``.json``) and its sample offsets; ``pax``: every member with a PAX header."""
    import random

    rng = random.Random(seed)
    buf = io.BytesIO()
    offsets = []
    fmt = tarfile.PAX_FORMAT if pax else tarfile.USTAR_FORMAT
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i in range(num_samples):
            offsets.append(buf.tell())
            key = (f"{'d' * 120}/{i:09d}" if pax else f"{i:09d}")
            for ext, data in (("jpg", rng.randbytes(rng.randrange(*image_bytes))), ("cls", str(i % 1000).encode()),
                              ("json", b'{"class":"n01440764","path":"n01440764/x_%d.JPEG"}' % i)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 0
                if pax:
                    info.pax_headers = {"comment": "x"}
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue(), offsets


def _time_members(tario, data: bytes, expect: int) -> float:
    with _CPUTimer() as t:
        n = 0
        for _ in tario.iter_samples(tario.iter_members(io.BytesIO(data), source="bench.tar"), source="bench.tar"):
            n += 1
    assert n == expect, (n, expect)
    return t.s


def _time_indexed(tario, data: bytes, offsets: list[int], expect: int) -> float:
    view = memoryview(data)

    def read_at(offset: int, nbytes: int) -> bytes:
        return bytes(view[offset:offset + nbytes])

    with _CPUTimer() as t:
        n = sum(1 for _ in tario.iter_indexed_samples(read_at, offsets, 0, len(offsets), len(data),
                                                      source="bench.tar"))
    assert n == expect, (n, expect)
    return t.s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="main", help="git revision of the reader to compare with (default: main)")
    ap.add_argument("--samples", type=int, default=10_000, help="samples per shard (default: 10000)")
    ap.add_argument("--image-kib", type=float, nargs=2, default=(2, 40), metavar=("MIN", "MAX"),
                    help="range of the image members' sizes, KiB (default: 2 40)")
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds (default: 7)")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)

    current = load_current()
    baseline = load_baseline(args.baseline)
    image_bytes = (int(args.image_kib[0] * 1024), int(args.image_kib[1] * 1024) + 1)
    plain, offsets = make_shard(args.samples, image_bytes=image_bytes)
    pax, _ = make_shard(max(1, args.samples // 4), pax=True, image_bytes=image_bytes)
    n, n_pax = args.samples, max(1, args.samples // 4)
    print(f"shard: {n:,} samples, {len(plain) / 1e6:.1f} MB; PAX shard: {n_pax:,} samples, {len(pax) / 1e6:.1f} MB")

    report = {"baseline": args.baseline, "samples": n, "rounds": args.rounds, "readers": {}}
    print(f"{'reader':<9} {'baseline':>12} {'current':>12} {'baseline/current':>17}")
    for reader, run in (("indexed", lambda m: _time_indexed(m, plain, offsets, n)),
                        ("members", lambda m: _time_members(m, plain, n)),
                        ("pax", lambda m: _time_members(m, pax, n_pax))):
        res = run_rounds({"baseline": lambda: run(baseline), "current": lambda: run(current)},
                         rounds=args.rounds, log=lambda _msg: None)
        b, c = res["values"]["baseline"], res["values"]["current"]
        count = n_pax if reader == "pax" else n
        ratio = paired_ratio(b, c)
        report["readers"][reader] = {"baseline_s": median(b), "current_s": median(c), "ratio": ratio,
                                     "baseline_samples_per_s": count / median(b),
                                     "current_samples_per_s": count / median(c)}
        print(f"{reader:<9} {count / median(b):>9,.0f}/s {count / median(c):>9,.0f}/s {ratio:>16.3f}x")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
