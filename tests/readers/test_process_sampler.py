"""ProcessSampler (psutil): CPU time and bytes read of worker processes, reaped ones included.

Expectations are lower bounds from what the test's children did: CPU they burned (time.process_time
in the child, reported back), bytes of the file they read (the planted file's size).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from shardfeed.readers.measure.sampling import ProcessSampler

pytestmark = pytest.mark.multiprocess


def _work(path: str, burn_s: float, done, stay, go=None) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    if go is not None:
        go.wait(30)  # the test lets it burn once the sampler has seen it
    t0 = time.process_time()
    while time.process_time() - t0 < burn_s:
        pass
    done.put(time.process_time())
    stay.wait(30)


def test_workers_cpu_and_reads_count_live_and_reaped_children(tmp_path):
    data = tmp_path / "blob.bin"
    data.write_bytes(os.urandom(3 * 1024 * 1024))
    ctx = mp.get_context("fork")
    done, stay_live, stay_reaped = ctx.Queue(), ctx.Event(), ctx.Event()
    stay_reaped.set()
    sampler = ProcessSampler()
    sampler.start()
    reaped = ctx.Process(target=_work, args=(str(data), 0.2, done, stay_reaped))
    live = ctx.Process(target=_work, args=(str(data), 0.2, done, stay_live))
    reaped.start()
    live.start()
    burned = [done.get(timeout=60), done.get(timeout=60)]
    reaped.join(timeout=60)  # finished and reaped: counted through the parent's children CPU and I/O
    cpu, io, memory, _system = sampler.stop()
    stay_live.set()
    live.join(timeout=60)
    assert cpu["workers_s"] >= 0.9 * sum(burned) - 0.05
    assert cpu["num_worker_processes"] >= 1
    assert io["rchar"] >= 2 * data.stat().st_size
    assert memory["main_rss_end_bytes"] > 0


def test_the_background_sampler_follows_each_worker_and_the_same_window_gives_the_harness_figures(tmp_path):
    data = tmp_path / "blob.bin"
    data.write_bytes(os.urandom(2 * 1024 * 1024))
    ctx = mp.get_context("fork")
    done, stay, go = ctx.Queue(), ctx.Event(), ctx.Event()
    sampler = ProcessSampler(interval_s=0.01)  # workers unknown: every child of this process
    sampler.start()
    worker = ctx.Process(target=_work, args=(str(data), 0.3, done, stay, go))
    worker.start()

    def mine(snap):
        return [w for w in snap["workers"] if w["pid"] == worker.pid]

    deadline = time.monotonic() + 30  # a loaded machine may delay the background thread's samples
    while not mine(sampler.snapshot()) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.set()  # seen before it burns: all the CPU it burns is inside its watched span
    burned = done.get(timeout=60)
    snap = sampler.snapshot()
    while not (mine(snap) and mine(snap)[0]["cpu_s"] >= 0.8 * burned - 0.05) and time.monotonic() < deadline:
        time.sleep(0.05)  # until a background sample after the burn (the worker waits on ``stay``)
        snap = sampler.snapshot()
    cpu, io, _memory, _system = sampler.stop()
    stay.set()
    worker.join(timeout=60)
    assert sampler.children_mode
    assert len(mine(snap)) == 1
    assert mine(snap)[0]["cpu_s"] >= 0.8 * burned - 0.05
    assert cpu["workers_s"] >= 0.9 * burned - 0.05  # started inside the window: counted from zero
    assert io["rchar"] >= data.stat().st_size  # its reads before its first background sample too
