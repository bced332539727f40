"""watch's verdict rules on planted figures: the rules take the figures as input, so each case is exact.

* a CPU step on 2 cores with the data in the page cache (no block reads, no I/O wait; the workers
  runnable but not running) is CPU-starved, not storage-bound, and gets no storage advice;
* a figure near its threshold (a hand-off share of 78 % or 82 % against 80 %) gives the same
  ``borderline`` verdict on both sides instead of flipping;
* every verdict carries the figures that decided it, in its text and in the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from shardfeed.readers.measure.watch import watch
from shardfeed.readers.measure.watch_rules import (BATCH_READY_HANDOFF, THRESHOLDS, diagnose, gather_evidence, judge,
                                                   kind_label)

STORAGE_WORDS = ("--format wds", "shardfeed stage", 'cache="memory"')  # pack (not --resize), stage, cache

#: the loop reported as storage-bound: 2 cores, a CPU step, the data in the page cache
PAGE_CACHE_CPU = dict(workers={"num": 2, "cpu_busy_share": 0.26, "cpu_demand_share": 0.52, "runqueue_share": 0.26,
                               "disk_sleep_share": 0.0},
                      main={"cpu_busy_share": 0.55, "cpu_demand_share": 0.6},
                      io={"read_chars_per_s": 30e6, "read_bytes_per_s": 0.0, "iowait_share": 0.0},
                      system={"cpu_count": 2, "cpu_busy_share": 0.98, "others_cpu_share": 0.04})


def _diag(stall=0.45, num_workers=2, cpu_count=2, facts=None, **figures):
    return diagnose(stall_share=stall, batches=50, num_workers=num_workers, workers=figures.get("workers"),
                    main=figures.get("main"), loader={"num_workers": num_workers, "batch_size": 32},
                    cpu_count=cpu_count, cuda=False, epochs=1, io=figures.get("io"), system=figures.get("system"),
                    facts=facts, t_wait_s={"mean": 0.02, "p50": 0.02, "p95": 0.03})


def _storage_advice(d):
    return [a for a in d["advice"] if any(w in a for w in STORAGE_WORDS)]


@pytest.mark.parametrize("schedstat", [True, False])
def test_a_page_cache_cpu_step_on_two_cores_is_not_storage_bound_and_gets_no_storage_advice(schedstat):
    figures = json.loads(json.dumps(PAGE_CACHE_CPU))
    if not schedstat:  # no /proc/PID/schedstat: running-or-runnable less CPU busy tells the run-queue wait
        del figures["workers"]["runqueue_share"]
    d = _diag(**figures)
    assert d["kind"] == "cpu-bound", d["text"]
    assert d["evidence"]["page_cache"] is True and d["evidence"]["storage_signs"] == []
    assert d["evidence"]["workers_runqueue_share"] == pytest.approx(0.26)
    assert d["evidence"]["runqueue_source"] == ("schedstat" if schedstat else "states")
    assert _storage_advice(d) == [], d["advice"]
    # the cores are full: more workers would only queue for them
    assert not any(a.startswith("num_workers=2 →") for a in d["advice"]), d["advice"]
    assert d["advice"][0].startswith("keep num_workers=2"), d["advice"]
    assert "runnable but not running 26%" in d["text"]


def test_other_processes_taking_the_cores_are_named_as_contention():
    figures = json.loads(json.dumps(PAGE_CACHE_CPU))
    figures["system"]["others_cpu_share"] = 0.6
    d = _diag(**figures)
    assert d["kind"] == "cpu-contended"
    assert "other processes took 60%" in d["text"]
    assert _storage_advice(d) == []


def test_sleeping_workers_with_block_reads_are_storage_bound_with_storage_advice():
    figures = {"workers": {"num": 2, "cpu_busy_share": 0.05, "cpu_demand_share": 0.06, "runqueue_share": 0.01},
               "io": {"read_chars_per_s": 40e6, "read_bytes_per_s": 40e6, "iowait_share": 0.3},
               "system": {"cpu_busy_share": 0.1, "others_cpu_share": 0.0}}
    d = _diag(cpu_count=8, **figures)
    assert d["kind"] == "storage-bound"
    assert d["advice"][0].startswith("num_workers=2 → 4")
    assert any(a.startswith("shardfeed pack") and "--format wds" in a for a in d["advice"])
    assert "read from block devices 40.0 MB/s" in d["text"] and "I/O wait 30%" in d["text"]


def test_sleeping_workers_over_the_page_cache_are_not_storage_bound_and_get_more_workers_but_no_storage_advice():
    figures = {"workers": {"num": 2, "cpu_busy_share": 0.05, "cpu_demand_share": 0.06, "runqueue_share": 0.01,
                           "ready_wait_share": 0.1},
               "io": {"read_chars_per_s": 40e6, "read_bytes_per_s": 0.0, "iowait_share": 0.0},
               "system": {"cpu_busy_share": 0.1, "others_cpu_share": 0.0}}
    d = _diag(cpu_count=8, **figures)
    assert d["kind"] == "unknown" and d["evidence"]["page_cache"] is True, d["text"]
    assert d["advice"][0].startswith("num_workers=2 → 4")
    assert _storage_advice(d) == [], d["advice"]
    assert "no sign of storage: no block device was read" in d["text"]
    # the same figures on a network or user-space mount: storage-bound, and the storage advice comes back
    slow = _diag(cpu_count=8, facts={"slow_storage": True}, **figures)
    assert slow["kind"] == "storage-bound"
    assert slow["evidence"]["page_cache"] is False and _storage_advice(slow)


@pytest.mark.parametrize("io, facts", [
    ({"read_bytes_per_s": 0.0, "iowait_share": 0.0}, None),  # measured: the page cache
    (None, None),  # nothing measured about storage
    ({"read_bytes_per_s": 0.5e6, "iowait_share": 0.02}, {"slow_storage": False, "remote": False}),  # under each sign
])
def test_storage_bound_needs_a_sign_of_storage_and_is_never_the_default(io, facts):
    # idle workers of a loop with its stall at the band's upper edge: neither the CPU nor storage shows a wait
    workers = {"num": 2, "cpu_busy_share": 0.04, "cpu_demand_share": 0.05, "runqueue_share": 0.02}
    for stall in (0.12, 0.45):
        d = _diag(stall=stall, workers=workers, io=io, facts=facts)
        named = d["between"] if d["kind"] == "borderline" else [d["kind"]]
        assert "storage-bound" not in named, d["text"]
        assert _storage_advice(d) == [], d["advice"]
    assert _diag(stall=0.12, workers=workers, io=io, facts=facts)["between"] == ["unknown", "compute-bound"]
    # each sign of storage alone, with the same idle workers: storage-bound
    for sign_io, sign_facts in (({"read_bytes_per_s": 5e6}, None), ({"iowait_share": 0.2}, None),
                                (None, {"slow_storage": True}), (None, {"remote": True})):
        signed = _diag(stall=0.45, workers=dict(workers, disk_sleep_share=0.0), io=sign_io, facts=sign_facts)
        assert signed["kind"] == "storage-bound", signed["text"]
    assert _diag(stall=0.45, workers=dict(workers, disk_sleep_share=0.3))["kind"] == "storage-bound"


@pytest.mark.parametrize("share", [0.78, 0.82])
def test_a_hand_off_share_near_its_threshold_is_borderline_on_both_sides(share):
    assert THRESHOLDS["ready_wait_share"][0] == BATCH_READY_HANDOFF == 0.8
    workers = {"num": 2, "cpu_busy_share": 0.1, "cpu_demand_share": 0.12, "runqueue_share": 0.02,
               "ready_wait_share": share, "batch_tensors": 2, "disk_sleep_share": 0.3}  # a sign of storage
    d = _diag(cpu_count=8, workers=workers, io={"read_bytes_per_s": 0.0, "iowait_share": 0.0},
              system={"cpu_busy_share": 0.3, "others_cpu_share": 0.0})
    assert d["kind"] == "borderline"
    lead = "handoff-bound" if share >= 0.8 else "storage-bound"
    assert d["between"] == [lead, ({"handoff-bound", "storage-bound"} - {lead}).pop()]
    assert d["text"].startswith(f"borderline: {lead} or ")
    assert kind_label(d) == f"borderline ({d['between'][0]} or {d['between'][1]})"
    assert f"waiting on batches already back {share:.0%} near 80% ± 10 points" in d["text"]
    # the advice of both kinds, the leading kind's first
    assert d["advice"][0].startswith("batch_size=32 → 64" if lead == "handoff-bound" else "num_workers=2 → 4")


@pytest.mark.parametrize("share, kind", [(0.95, "handoff-bound"), (0.6, "storage-bound")])
def test_a_hand_off_share_clear_of_the_band_gives_one_kind(share, kind):
    workers = {"num": 2, "cpu_busy_share": 0.1, "cpu_demand_share": 0.12, "runqueue_share": 0.02,
               "ready_wait_share": share, "disk_sleep_share": 0.3}
    assert _diag(cpu_count=8, workers=workers)["kind"] == kind


def test_a_figure_in_its_band_that_does_not_change_the_kind_is_not_borderline():
    # the workers' CPU share is in its band, but both sides lead to the CPU: the run queue is long either way
    ev = gather_evidence(stall_share=0.5, num_workers=2,
                         workers={"cpu_busy_share": 0.55, "cpu_demand_share": 0.95, "runqueue_share": 0.4})
    v = judge(ev)
    assert v["kind"] == "cpu-bound" and v["between"] is None
    assert {"figure": "workers_cpu_busy_share", "value": 0.55, "threshold": 0.6, "margin": 0.1,
            "side": "band"} in v["decided_by"]


PLANTED = {
    "compute-bound": dict(stall=0.03),
    "main-process-bound": dict(num_workers=0),
    "handoff-bound": dict(workers={"cpu_busy_share": 0.1, "cpu_demand_share": 0.1, "ready_wait_share": 0.97}),
    "cpu-bound": dict(workers={"cpu_busy_share": 0.95, "cpu_demand_share": 1.0}),
    "cpu-contended": PAGE_CACHE_CPU | {"system": {"cpu_busy_share": 1.0, "others_cpu_share": 0.5}},
    "storage-bound": dict(workers={"cpu_busy_share": 0.02, "cpu_demand_share": 0.03, "runqueue_share": 0.0},
                          io={"read_bytes_per_s": 30e6, "iowait_share": 0.2}),
    "borderline": dict(workers={"cpu_busy_share": 0.02, "cpu_demand_share": 0.03, "ready_wait_share": 0.8},
                       facts={"slow_storage": True}),
    "unknown": dict(),
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_each_verdict_carries_the_figures_that_decided_it_in_text_and_json(kind):
    planted = dict(PLANTED[kind])
    d = json.loads(json.dumps(_diag(**planted)))
    assert d["kind"] == kind, d["text"]
    ev = d["evidence"]
    assert ev["stall_share"] == planted.get("stall", 0.45)
    for key in ("num_workers", "ready_wait_share", "workers_cpu_busy_share", "workers_runqueue_share",
                "main_cpu_share", "others_cpu_share", "read_bytes_per_s", "iowait_share", "page_cache"):
        assert key in ev
    figures = {x["figure"]: x for x in d["decided_by"]}
    assert figures["stall_share"]["value"] == planted.get("stall", 0.45)
    assert "[decided by: data stall " in d["text"]
    for src, key in (("ready_wait_share", "ready_wait_share"), ("cpu_busy_share", "workers_cpu_busy_share")):
        value = (planted.get("workers") or {}).get(src)
        if value is not None and key in figures:
            assert figures[key]["value"] == value
            assert f"{value:.0%}" in d["text"]


def test_the_summary_gives_one_first_action_then_what_is_also_worth_trying():
    w = watch([1, 2, 3])
    list(w)
    rep = dataclasses.replace(w.report(), diagnosis=_diag(cpu_count=8, **{
        "workers": {"cpu_busy_share": 0.02, "cpu_demand_share": 0.03, "runqueue_share": 0.0}}))
    w.close()
    lines = rep.summary().splitlines()
    assert sum(x.startswith("  do first: ") for x in lines) == 1
    first = next(i for i, x in enumerate(lines) if x.startswith("  do first: "))
    assert lines[first] == "  do first: " + rep.diagnosis["advice"][0]
    assert all(x.startswith("  also worth trying: ") for x in lines[first + 1:first + len(rep.diagnosis["advice"])])


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/schedstat"), reason="no /proc/PID/schedstat")
def test_the_run_queue_wait_is_read_from_schedstat():
    from shardfeed.readers.measure.sampling import _runqueue_wait_s

    with open(f"/proc/{os.getpid()}/schedstat") as f:
        before = int(f.read().split()[1]) / 1e9
    got = _runqueue_wait_s(os.getpid())
    assert got is not None and got >= before
    assert _runqueue_wait_s(2 ** 22 + 12345) is None  # no such process


def test_sleeping_workers_over_the_page_cache_without_ready_figures_do_not_rule_out_the_hand_off():
    # a trainer's fetch timed through its profiler: whether each batch had come back is not known
    figures = {"workers": {"num": 2, "cpu_busy_share": 0.05, "cpu_demand_share": 0.06, "runqueue_share": 0.01},
               "io": {"read_chars_per_s": 1e6, "read_bytes_per_s": 0.0, "iowait_share": 0.0}}
    d = _diag(cpu_count=8, **figures)
    assert d["kind"] == "unknown", d["text"]
    assert "or in the hand-off of each batch (not measured here)" in d["text"]
    assert _storage_advice(d) == [], d["advice"]
    # block reads seen: storage, whatever the hand-off
    figures["io"]["read_bytes_per_s"] = 20e6
    assert _diag(cpu_count=8, **figures)["kind"] == "storage-bound"


def test_workers_that_mostly_sleep_on_slow_storage_are_storage_bound_though_they_also_queue_for_a_core():
    # a busy machine: the workers queue for a core 20 % of the time after each read, and sleep 70 %
    figures = {"workers": {"num": 2, "cpu_busy_share": 0.1, "cpu_demand_share": 0.3, "runqueue_share": 0.2,
                           "ready_wait_share": 0.05},
               "io": {"read_chars_per_s": 1e6, "read_bytes_per_s": 0.0, "iowait_share": 0.0},
               "system": {"cpu_busy_share": 1.0, "others_cpu_share": 0.6}}
    d = _diag(facts={"slow_storage": True}, **figures)
    assert d["kind"] == "storage-bound", d["text"]
    assert d["evidence"]["workers_sleep_share"] == pytest.approx(0.7)
    assert "workers asleep 70% ≥ 35%" in d["text"]
    # the same figures over the page cache: nothing says storage, the run queue decides
    assert _diag(**figures)["kind"] == "cpu-contended"


#: workers reading through a user-space mount with 2 ms per request, on 2 cores (figures measured by
#: scripts/validate_watch.py storage-2ms, the run queue wait from /proc/PID/schedstat)
MOUNT_WORKERS_TWO_BURNERS = {"num": 2, "cpu_busy_share": 0.09, "cpu_demand_share": 0.32, "runqueue_share": 0.25,
                             "disk_sleep_share": 0.28}  # two CPU burners beside it, load average about 5
MOUNT_WORKERS_LOAD_11 = {"num": 2, "cpu_busy_share": 0.03, "cpu_demand_share": 0.65, "runqueue_share": 0.65,
                         "disk_sleep_share": 0.08}  # ten CPU burners beside it, load average about 11


def test_workers_on_slow_storage_that_also_queue_for_a_core_most_of_the_time_are_borderline_not_storage_bound():
    system = {"cpu_busy_share": 1.0, "others_cpu_share": 0.95}
    facts = {"slow_storage": True}
    d = _diag(stall=0.79, workers=MOUNT_WORKERS_TWO_BURNERS, system=system, facts=facts)
    assert d["kind"] == "storage-bound", d["text"]  # asleep 66 %: the wait for a core is the smaller part
    d = _diag(stall=0.88, workers=MOUNT_WORKERS_LOAD_11, system=system, facts=facts)
    # runnable but not running 65 % of the time, asleep 32 %: both waits are real and the larger one is
    # the wait for a core, so the verdict names both, the run queue's first
    assert d["evidence"]["workers_sleep_share"] == pytest.approx(0.32)
    assert d["kind"] == "borderline" and d["between"] == ["cpu-contended", "storage-bound"], d["text"]
    assert "workers asleep 32% near 35% ± 10 points" in d["text"]
