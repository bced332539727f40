"""shardfeed.readers.watch on a plain DataLoader over a user-written Dataset (local disk).

The diagnosis is checked against loops built to be CPU-bound (a heavy transform in the workers),
compute-bound (a long step) and main-process-bound (num_workers=0); the stall share against the
test's own perf_counter timing around next().
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.utils.data import DataLoader

from shardfeed.readers import watch as watch_from_package
from shardfeed.readers.measure.watch import DIAGNOSIS_KINDS, Watch, batch_length, watch

from .watch_helpers import FilesDataset, heavy_transform, make_jpeg_folder, stall_of, timed_loop


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return make_jpeg_folder(tmp_path_factory.mktemp("watch") / "images", 96)


def test_watch_yields_exactly_what_the_loader_yields_and_counts_epochs():
    data = [(torch.arange(4) + 10 * i, torch.tensor([i])) for i in range(5)]
    w = watch(data)
    for _ in range(2):
        got = list(w)
        assert len(got) == 5
        for (x, y), (ex, ey) in zip(got, data):
            assert x is ex and y is ey
    rep = w.report()
    w.close()
    assert rep.epochs == 2
    assert rep.batches == 2 * 5 - 1  # the very first batch is the warm-up
    assert rep.num_samples == 9 * 4
    assert rep.gpu_util is None


def test_summary_says_the_first_batch_is_left_out_of_the_count():
    # 6 batches, one pass: the summary counts 5 timed and names the first as reported apart, so a
    # reader who counts the loader's batches is not left wondering where one went
    w = watch([torch.zeros(2, 3)] * 6)
    timed_loop(w, 0.001)
    rep = w.report()
    w.close()
    head = rep.summary().splitlines()[0]
    assert " 5 batches timed over 1 epoch(s)" in head
    assert "after the first, worker start-up" in head and "reported apart" in head


def test_batch_length_reads_tensors_tuples_and_dicts():
    assert batch_length(torch.zeros(7, 3)) == 7
    assert batch_length((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert batch_length({"pixel_values": torch.zeros(3, 1), "labels": torch.zeros(3)}) == 3
    assert batch_length([1, 2, 3, 4]) == 4
    assert batch_length(object()) is None
    # a collate_fn that does not stack: a list of per-sample tensors or (image, label) tuples
    assert batch_length([torch.zeros(3, 8, 8)] * 6) == 6
    assert batch_length(([torch.zeros(3, 8, 8)] * 6, torch.zeros(6))) == 6
    assert batch_length([(torch.zeros(3, 8, 8), 1)] * 6) == 6
    assert batch_length([torch.zeros(5, 3), torch.zeros(5, 3)]) == 5  # two fields of one shape: a batch


def test_report_json_has_the_documented_keys():
    w = watch([torch.zeros(2, 3)] * 6)
    timed_loop(w, 0.002)
    d = json.loads(json.dumps(w.report().to_json()))
    w.close()
    for key in ("batches", "t_wait_s", "t_step_s", "stall_share", "samples_per_s", "workers", "gpu_util", "diagnosis"):
        assert key in d
    for key in ("t_wait_s", "t_step_s"):
        assert set(d[key]) >= {"mean", "p50", "p95", "total"}
    assert set(d["diagnosis"]) == {"kind", "text", "advice", "between", "evidence", "decided_by"}
    assert d["diagnosis"]["kind"] in DIAGNOSIS_KINDS
    assert watch_from_package is watch


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="sample_interval_s"):
        Watch([], sample_interval_s=0)
    with pytest.raises(ValueError, match="warmup"):
        Watch([], warmup=-1)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cpu_heavy_transform_is_cpu_bound(jpegs):
    # 8 images of ~15 ms CPU per batch and worker against a 10 ms step: the workers cannot keep up
    loader = DataLoader(FilesDataset(jpegs[:96], transform=heavy_transform), batch_size=8, num_workers=2)
    w = watch(loader)
    waits, steps, _ = timed_loop(w, 0.01)
    rep = w.report()
    w.close()
    assert rep.stall_share == pytest.approx(stall_of(waits, steps), abs=0.05)
    assert rep.stall_share > 0.10
    assert rep.workers["num"] == 2
    # the CPU is the limit: the workers' own decoding, or cores that other processes on a busy machine hold
    cpu_kinds = {"cpu-bound", "cpu-contended"}
    d = rep.diagnosis
    assert d["kind"] in cpu_kinds or (d["kind"] == "borderline" and set(d["between"]) <= cpu_kinds), rep.summary()
    # the planted images are 48 x 48: no pack-time resize would shrink them
    assert not any("--resize" in a for a in rep.diagnosis["advice"]), rep.summary()
    assert any(a.startswith("make_loader(OUT, image_size=SIZE)") for a in rep.diagnosis["advice"])
    assert not any("--format wds" in a for a in rep.diagnosis["advice"])


@pytest.mark.multiprocess
def test_long_step_is_compute_bound(jpegs):
    # the loop still waits a few ms per batch for the hand-off and for the main process to wake (5 to
    # 15 ms at a load average of 10 to 12 on 2 cores): against a 150 ms step that was a stall of 7 to
    # 12 %, inside the band of the 10 % threshold; against 500 ms it is at most about 3 %
    loader = DataLoader(FilesDataset(jpegs[:32]), batch_size=4, num_workers=2)
    w = watch(loader)
    waits, steps, batches = timed_loop(w, 0.5)
    rep = w.report()
    w.close()
    assert len(batches) == 8
    assert rep.batches == 7
    assert rep.stall_share == pytest.approx(stall_of(waits, steps), abs=0.05)
    assert rep.diagnosis["kind"] == "compute-bound", rep.summary()
    assert rep.diagnosis["advice"] == []
    assert rep.samples_per_s == pytest.approx(28 / (sum(waits[1:]) + sum(steps[1:])), rel=0.05)


def test_loading_in_the_main_process_is_main_process_bound(jpegs):
    loader = DataLoader(FilesDataset(jpegs[:24], transform=heavy_transform), batch_size=4, num_workers=0)
    w = watch(loader)
    waits, steps, _ = timed_loop(w, 0.005)
    rep = w.report()
    w.close()
    assert rep.stall_share == pytest.approx(stall_of(waits, steps), abs=0.05)
    assert rep.diagnosis["kind"] == "main-process-bound", rep.summary()
    assert rep.diagnosis["advice"][0].startswith("num_workers=0 → ")


def test_status_line_is_logged_when_asked(caplog):
    w = watch([torch.zeros(1)] * 5, status_every_s=0.001)
    with caplog.at_level("INFO", logger="shardfeed.watch"):
        for _ in w:
            time.sleep(0.002)
    w.close()
    assert any("data stall" in r.getMessage() for r in caplog.records)


def test_diagnose_names_the_datasets_folder_and_the_order_of_advice():
    from shardfeed.readers.measure.watch import diagnose

    workers = {"num": 2, "cpu_busy_share": 0.05, "cpu_demand_share": 0.1, "disk_sleep_share": 0.3}  # in disk sleep
    d = diagnose(stall_share=0.5, batches=50, num_workers=2, workers=workers, main={"cpu_busy_share": 0.1},
                 loader={"num_workers": 2, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": False},
                 cpu_count=8, cuda=True, epochs=3, t_wait_s={"p50": 0.01, "p95": 0.08}, data="/data/train")
    assert d["kind"] == "storage-bound"
    first_words = [a.split(" ")[0] for a in d["advice"]]
    assert first_words == ["num_workers=2", "pin_memory=False", "prefetch_factor=2", "persistent_workers=False",
                           "shardfeed", "shardfeed", "make_loader(OUT,"]
    assert d["advice"][0].startswith("num_workers=2 → 4") and "8 cores" in d["advice"][0]
    assert d["advice"][4].startswith("shardfeed pack /data/train OUT")
    cpu = diagnose(stall_share=0.5, batches=50, num_workers=2, workers={"num": 2, "cpu_busy_share": 0.95,
                   "cpu_demand_share": 1.0}, main=None, loader={"num_workers": 2}, cpu_count=8, cuda=False, epochs=1)
    assert cpu["kind"] == "cpu-bound" and cpu["advice"][0] == ("num_workers=2 → 8: the workers are CPU-saturated "
                                                               "and this machine has 8 cores")


def test_a_slow_generator_is_loading_in_the_main_process():
    def batches():
        for i in range(8):
            time.sleep(0.01)  # the work of producing a batch, in this process
            yield torch.full((2,), i)

    w = watch(batches())
    waits, steps, got = timed_loop(w, 0.002)
    rep = w.report()
    w.close()
    assert [int(b[0]) for b in got] == list(range(8))
    assert rep.workers["num"] == 0
    assert rep.stall_share == pytest.approx(stall_of(waits, steps), abs=0.05)
    assert rep.diagnosis["kind"] == "main-process-bound"


def test_a_pass_left_early_does_not_count_its_unfinished_step():
    data = [torch.zeros(3)] * 6
    w = watch(data, warmup=0)
    for i, _ in enumerate(w):
        time.sleep(0.001)
        if i == 2:
            break  # the third batch's step never ends inside the watch
    for _ in w:
        time.sleep(0.001)
    rep = w.report()
    w.close()
    assert rep.epochs == 2
    assert rep.batches == 2 + 6
    assert rep.num_samples == 8 * 3
    assert rep.t_wait_s["total"] < rep.t_step_s["total"]  # every wait paired with its own step


def test_more_workers_are_predicted_to_deliver_proportionally_up_to_the_step_and_the_cores():
    from shardfeed.readers.measure.watch import predict_batch_interval

    # stalled: 2 workers deliver a batch per 30 ms (10 ms wait + 20 ms step)
    assert predict_batch_interval(2, 3, 0.010, 0.020, None, 8) == pytest.approx(0.020)  # 30 * 2/3 = 20: the step
    assert predict_batch_interval(2, 4, 0.010, 0.020, None, 8) == pytest.approx(0.020)  # never faster than the step
    assert predict_batch_interval(2, 4, 0.050, 0.010, None, 8) == pytest.approx(0.030)  # 60 * 2/4
    # the workers' CPU per batch (0.2 s) over 4 cores bounds it at 50 ms
    assert predict_batch_interval(2, 8, 0.050, 0.010, 0.2, 4) == pytest.approx(0.050)


def test_status_goes_to_a_tqdm_postfix_when_given_a_bar():
    import io

    from tqdm import tqdm

    data = [torch.zeros(1)] * 5
    with tqdm(total=5, file=io.StringIO()) as bar:
        w = watch(data, status_every_s=0.001, status_bar=bar)
        for _ in w:
            time.sleep(0.002)
            bar.update(1)
        w.close()
        assert bar.postfix.startswith("data stall ")


class _SmallTensors:
    """A ``Dataset`` of 8 x 8 zero images, ready at once; with :func:`_per_sample_list` as
    ``collate_fn`` each batch is a list of one tensor per sample."""

    length = 16 * 40

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return torch.zeros(3, 8, 8, dtype=torch.uint8)


class _SlowReads(_SmallTensors):
    """The same samples, each after a 30 ms wait (a request to slow storage) that uses no CPU."""

    length = 4 * 12

    def __getitem__(self, i):
        time.sleep(0.03)
        return torch.zeros(3, 8, 8, dtype=torch.uint8)


def _per_sample_list(samples):
    return list(samples)


def _loop_asking_only_for_ready_batches(w, step_s: float, batches: int):
    """Like :func:`timed_loop`, but each step ends only once the batch due has come back from the
    worker (a bounded poll of the loader's queue, not a guess of how long the worker takes): every
    request finds its batch ready, however busy the machine."""
    from shardfeed.readers.measure.watch import batch_ready

    waits, steps = [], []
    it = iter(w)
    for i in range(batches):
        t0 = time.perf_counter()
        next(it)
        t1 = time.perf_counter()
        time.sleep(step_s)
        deadline = time.monotonic() + 30
        while i + 1 < batches and not batch_ready(it) and time.monotonic() < deadline:
            time.sleep(0.0002)
        assert i + 1 == batches or batch_ready(it), "the worker sent no batch in 30 s"
        waits.append(t1 - t0)
        steps.append(time.perf_counter() - t1)
    assert next(it, None) is None
    return waits, steps


@pytest.mark.multiprocess
def test_batches_ready_before_they_are_asked_for_stall_on_the_hand_off_not_the_workers():
    # 16 tensors per batch handed over one by one cost the main process several ms per batch; the
    # loop asks for a batch only once it has come back from the (one, so in-order) worker, so the
    # wait is the hand-off alone. The kind's rule is checked on planted figures in test_watch_rules.
    loader = DataLoader(_SmallTensors(), batch_size=16, num_workers=1, collate_fn=_per_sample_list)
    w = watch(loader)
    waits, steps = _loop_asking_only_for_ready_batches(w, 0.002, 40)
    rep = w.report()
    w.close()
    assert rep.stall_share == pytest.approx(stall_of(waits, steps), abs=0.05)
    # every timed request found its batch ready: the count, not a share near a threshold
    assert rep.workers["batch_ready_share"] == 1.0 and rep.workers["ready_wait_share"] == 1.0, rep.summary()
    assert rep.workers["batch_tensors"] == 16
    assert rep.num_samples == 16 * 39  # a list of 16 per-sample tensors is 16 samples, not 3 channels
    # the hand-off of 16 tensors against the 2 ms step: a stall of 52-66 % measured over 5 runs each,
    # alone and with two CPU burners beside the test on 2 busy cores; 13 % leaves the compute-bound band
    assert rep.stall_share > 0.13, rep.summary()
    assert rep.diagnosis["kind"] == "handoff-bound", rep.summary()
    advice = rep.diagnosis["advice"]
    assert advice[0].startswith("a batch holds 16 tensors"), advice
    # a larger batch of per-sample tensors hands over more of them: no batch-size advice then
    assert not any(a.startswith("batch_size=") for a in advice), advice
    assert not any(a.startswith("num_workers=1 →") for a in advice), advice
    assert not any("shardfeed pack" in a for a in advice), advice


@pytest.mark.multiprocess
def test_workers_sleeping_in_the_datasets_code_are_not_storage_bound_and_the_batches_were_not_ready():
    # 4 samples of 30 ms waits per batch and worker (about 60 ms a batch with 2 workers) against a
    # 2 ms step: the loop asks before the next batch has come back
    loader = DataLoader(_SlowReads(), batch_size=4, num_workers=2)
    w = watch(loader)
    waits, steps, _ = timed_loop(w, 0.002)
    rep = w.report()
    w.close()
    assert rep.stall_share > 0.5, rep.summary()
    assert rep.workers["ready_wait_share"] <= 0.2, rep.summary()
    # the dataset sleeps: no block reads, no I/O wait, no slow mount, so nothing says storage
    assert rep.diagnosis["kind"] == "unknown", rep.summary()
    assert "no sign of storage" in rep.diagnosis["text"], rep.summary()
    assert rep.diagnosis["advice"][0].startswith("num_workers=2 → 4"), rep.summary()
    assert not any("shardfeed pack" in a or "cache=" in a for a in rep.diagnosis["advice"]), rep.summary()


def test_batch_ready_is_unknown_for_an_iterable_that_is_no_multi_process_loader():
    from shardfeed.readers.measure.watch import batch_ready, count_tensors

    assert batch_ready(iter([1, 2])) is None
    assert batch_ready(iter(DataLoader(_SmallTensors(), batch_size=2, num_workers=0))) is None
    assert count_tensors((torch.zeros(2), {"a": [torch.zeros(1)] * 3, "b": 5})) == 4


def test_diagnose_tells_the_hand_off_from_storage_by_the_waiting_spent_on_batches_already_back():
    from shardfeed.readers.measure.watch import diagnose

    def kind_and_advice(ready):
        workers = {"num": 2, "cpu_busy_share": 0.3, "cpu_demand_share": 0.3, "ready_wait_share": ready,
                   "batch_tensors": 2, "disk_sleep_share": 0.3}  # in disk sleep: a sign of storage
        d = diagnose(stall_share=0.3, batches=50, num_workers=2, workers=workers, main={"cpu_busy_share": 0.2},
                     loader={"num_workers": 2, "batch_size": 64}, cpu_count=2, cuda=False, epochs=1,
                     t_wait_s={"mean": 0.004, "p50": 0.004, "p95": 0.005})
        return d["kind"], d["advice"]

    kind, advice = kind_and_advice(0.95)
    assert kind == "handoff-bound"
    assert advice[0].startswith("batch_size=64 → 128") and "4.0 ms now" in advice[0]
    assert advice[1].startswith("keep num_workers=2")
    kind, advice = kind_and_advice(0.3)
    assert kind == "storage-bound" and advice[0].startswith("num_workers=2 → 4")
    kind, _ = kind_and_advice(None)  # not known: the CPU shares alone decide, as before
    assert kind == "storage-bound"
