"""The printed reports of `bench` and `verify`: a compact table by default, every row with `--details`.

The runs are planted: every figure of a :class:`RunReport` is set here, and each expected cell is
computed from the planted numbers (images/s, milliseconds, CPU seconds per image), not taken from
the code under test.
"""

from __future__ import annotations

import pytest

from shardfeed.readers.measure.report import RunReport, TimingStats
from shardfeed.readers.measure.tables import format_comparison, format_report, report_rows
from shardfeed.readers.measure.verify import VerifyReport

#: Rows that mean little at first sight: only `--details` shows them.
DETAIL_ONLY = ("read calls (incl. page cache)", "  of which in the loader, ms (mean/p50/p95)", "memory growth",
               "swap in use", "CPU, loader workers", "CPU time in I/O wait (machine)", "batches x images")


def _run(label, images_per_s, wait_ms, cpu_total_s, device="cpu"):
    w = TimingStats(wait_ms / 1e3, wait_ms / 1e3, 2 * wait_ms / 1e3)
    c = TimingStats(0.020, 0.020, 0.021)
    return RunReport(
        images_per_s=images_per_s, num_batches=30, num_samples=1920, seconds=1920 / images_per_s, t_wait_s=w,
        t_compute_s=c, stall_share=wait_ms / (wait_ms + 20.0), device=device, timing="perf_counter",
        gpu_util=0.5 if device.startswith("cuda") else None,
        cpu={"workers_cores": 1.2, "main_cores": 0.3, "util_share": 0.75, "cpu_count": 2, "total_s": cpu_total_s,
             "others_share": 0.1},
        io={"read_bytes_per_s": 5e6, "read_bytes_with_warmup": 9e6, "rchar_per_s": 7e6, "read_bytes": 4e6},
        memory={"main_rss_start_bytes": 3e8, "main_rss_end_bytes": 3.1e8, "workers_rss_start_bytes": 2e8,
                "workers_rss_end_bytes": 2e8, "growth_flag": False, "growth_bytes": 1e7},
        system={"swap_used_end_bytes": 0, "iowait_share": 0.02},
        cache={"files": 12, "bytes": 1_200_000, "cached_bytes_after": 0, "unmeasurable_bytes": 0},
        config={"source": f"/data/{label}", "source_format": "folder" if label == "before" else "webdataset",
                "batch_size": 64, "warmup": 5, "loader": {"num_workers": 2}},
        label=label, warmup_s=0.5, warmup_samples=320,
        t_loader_wait_s=TimingStats(wait_ms / 2e3, wait_ms / 2e3, wait_ms / 1e3))


def _verify(device="cpu"):
    before, after = _run("before", 400.0, 30.0, 3.84, device), _run("after", 1200.0, 2.0, 1.92, device)
    verdict = {"kind": "faster", "text": "3.0x faster; rounds vary by 4%", "advice": [],
               "before": {"rounds": [400.0, 390.0, 410.0], "median": 400.0, "spread_share": 0.05},
               "after": {"rounds": [1200.0, 1150.0, 1210.0], "median": 1200.0, "spread_share": 0.05},
               "others_cpu_share_max": 0.1}
    return VerifyReport(before=before, after=after, speedup=3.0, check=None, repeats=3, cold=True,
                        settle={"method": "os.sync", "dirty_bytes_before": 1e6, "seconds": 0.1}, warm_cache=None,
                        verdict=verdict, cpu_s_per_image={"before": 3.84 / 1920, "after": 1.92 / 1920},
                        runs=[before, after])


def _table_rows(text: str) -> dict[str, str]:
    """The table's rows by name (the lines between the header's rule and the first line after the table)."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.replace(" ", "")) == {"-"})
    rows = {}
    for line in lines[rule + 1:]:
        if line.startswith(("warning:", "rounds:", "disk settled", "  ")) and not line.startswith("  of which"):
            break
        name = line.split("  ")[0] if not line.startswith("  of which") else line[:line.index(")") + 1]
        rows[name] = line
    return rows


def test_verify_prints_a_compact_table_by_default():
    text = format_comparison(_verify())
    rows = _table_rows(text)
    assert len(rows) <= 12, list(rows)
    assert list(rows)[:2] == ["source", "images/s"]
    assert "400.0" in rows["images/s"] and "1200.0" in rows["images/s"]
    assert rows["data stall"].split()[-2:] == [f"{30 / 50:.0%}", f"{2 / 22:.0%}"]
    assert "30.0 / 30.0 / 60.0" in rows["wait for data, ms (mean/p50/p95)"]
    assert "20.0 / 20.0 / 21.0" in rows["compute, ms (mean/p50/p95)"]
    # CPU per image: the planted CPU seconds over the 1,920 images, in ms
    assert rows["CPU per image, main + workers"].split()[-4:] == ["2.00", "ms", "1.00", "ms"]
    for name in DETAIL_ONLY:
        assert name.strip() not in text, name
    assert "GPU utilisation" not in rows  # n/a off CUDA: left out of the compact table
    assert "sync()" not in text  # how the disk was settled: --details
    # the verdict and its evidence: every round of both sides, then the verdict line
    assert "BEFORE 400 390 410" in text and "AFTER  1200 1150 1210" in text
    assert text.splitlines()[-1].startswith("3.0x faster; rounds vary by 4%; data stall 60% -> 9%")


def test_verify_details_shows_every_row():
    compact, full = format_comparison(_verify()), format_comparison(_verify(), details=True)
    for name in DETAIL_ONLY:
        assert name.strip() in full, name
    assert "disk settled before measuring: sync() wrote back 1.0 MB of dirty pages" in full
    assert "CPU per image (main + workers), median: BEFORE 2.00 ms, AFTER 1.00 ms" in full
    # the compact table's rows are the same rows, with the same cells
    full_rows = _table_rows(full)
    for name, line in _table_rows(compact).items():
        assert full_rows[name].split() == line.split(), name


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_bench_compact_and_detailed_rows(device):
    run = _run("before", 400.0, 30.0, 3.84, device)
    compact = dict(report_rows(run))
    assert set(compact) <= {"source", "images/s", "wait for data, ms (mean/p50/p95)", "compute, ms (mean/p50/p95)",
                            "data stall", "GPU utilisation", "CPU per image, main + workers", "page cache",
                            "images/s incl. warm-up (cold start)", "device"}
    assert ("GPU utilisation" in compact) == (device == "cuda:0")
    assert compact.get("GPU utilisation", "50%") == "50%"
    assert compact["images/s incl. warm-up (cold start)"] == f"{(320 + 1920) / (0.5 + 1920 / 400.0):.1f}"
    detailed = dict(report_rows(run, details=True))
    assert set(compact) < set(detailed) and detailed["read calls (incl. page cache)"] == "7.0 MB/s"
    assert format_report(run).count("\n") + 1 == len(compact) + 2  # header, rule, rows
