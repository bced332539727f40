"""scripts/bench_tario.py: the baseline reader it loads from git reads the shards it builds as this checkout's does."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_tario.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_tario", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shard_and_both_readers_agree_with_tarfile(tmp_path):
    bench = _load()
    from shardfeed.readers.format import tario

    baseline = bench.load_baseline("HEAD")
    for pax in (False, True):
        data, offsets = bench.make_shard(12, pax=pax, image_bytes=(100, 3000))
        expected = [(m.name, tarfile.open(fileobj=io.BytesIO(data)).extractfile(m).read())
                    for m in tarfile.open(fileobj=io.BytesIO(data)) if m.isreg()]
        for module in (tario, baseline):
            got = [(n, d) for n, d, _ in module.iter_members(io.BytesIO(data), source="t.tar")]
            assert got == expected
    assert offsets[0] == 0 and len(offsets) == 12
    out = tmp_path / "r.json"
    assert bench.main(["--baseline", "HEAD", "--samples", "40", "--rounds", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert sorted(report["readers"]) == ["indexed", "members", "pax"]
    assert all(r["ratio"] > 0 for r in report["readers"].values())
