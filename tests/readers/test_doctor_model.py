"""doctor's model of the loader ceiling (the batch costs besides decoding: collate, hand-off, conversion
to float) and the rules it shares with watch; expectations worked out by hand from planted costs."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.readers.measure.doctor import doctor
from shardfeed.readers.measure.doctor_advice import advice_lines, decode_bound
from shardfeed.readers.measure.doctor_model import (BATCH_SIZE, batch_cost_terms, batch_costs, cpu_ceiling,
                                                    predict_images_per_s, predict_with_more_workers)
from shardfeed.readers.measure.watch_rules import WORKER_CPU_SATURATED, resize_target, storage_workers

_COSTS = dict(t_decode_s=0.002, t_open_s=0.0, t_first_read_s=0.0, median_bytes=50_000, read_bytes_per_s=100e6,
              folder_io_s=0.001, t_file_cpu_s=0.0001)


def test_the_batch_costs_lower_the_ceiling_where_they_are_paid():
    """2 workers on 4 cores: a worker pays decode + collate (+ the file's calls), the main process
    the hand-off and the conversion, every process shares the 4 cores."""
    p = predict_images_per_s(num_workers=2, cpus=4, t_collate_s=0.0005, t_handoff_s=0.0002, t_to_float_s=0.0003,
                             **_COSTS)
    # folder: a worker's wall time 0.001 + 0.002 + 0.0005 s per image, 2 of them
    assert p["folder_images_per_s"] == pytest.approx(2 / 0.0035)
    # packed: 50 kB at 100 MB/s = 0.0005 s; CPU: 2 / 0.0025 = 800 < 4 / 0.003 = 1333 < 1 / 0.0005 = 2000
    assert p["packed_images_per_s"] == pytest.approx(min(2 / (0.0005 + 0.0025), 2 / 0.0025))
    assert p["local_images_per_s"] == pytest.approx(800)


def test_without_batch_costs_the_model_is_decode_and_reads_only():
    p = predict_images_per_s(num_workers=4, cpus=2, **_COSTS)
    assert p["folder_images_per_s"] == pytest.approx(min(4 / 0.003, 2 / 0.0021))
    assert p["local_images_per_s"] == pytest.approx(2 / 0.002)


def test_the_main_process_alone_can_set_the_pace():
    """Slow conversion in the one main process: 1 / 0.004 = 250 images/s whatever the workers."""
    p = predict_images_per_s(num_workers=8, cpus=16, t_to_float_s=0.004, **_COSTS)
    assert p["local_images_per_s"] == pytest.approx(250)
    assert p["folder_images_per_s"] == pytest.approx(250)


def test_the_cores_are_shared_by_the_workers_and_the_main_process():
    # 4 workers on 2 cores: 2 / 0.001 = 2000 for the workers, 2 / (0.001 + 0.0005) = 1333 for all
    assert cpu_ceiling(num_workers=4, cpus=2, t_worker_s=0.001, t_main_s=0.0005) == pytest.approx(2 / 0.0015)
    # one worker on many cores: its own CPU sets the pace
    assert cpu_ceiling(num_workers=1, cpus=8, t_worker_s=0.001, t_main_s=0.0005) == pytest.approx(1000)


def test_with_no_workers_the_main_process_does_everything_in_turn_and_hands_nothing_over():
    p = predict_images_per_s(num_workers=0, cpus=4, t_collate_s=0.0005, t_handoff_s=0.01, t_to_float_s=0.0003,
                             **_COSTS)
    # one process: reads 0.001, decode 0.002, collate 0.0005, conversion 0.0003; the hand-off is not paid
    assert p["folder_images_per_s"] == pytest.approx(1 / 0.0038)


def test_batch_costs_measure_a_batch_of_the_most_common_shape():
    small = [np.full((8, 6, 3), i, dtype=np.uint8) for i in range(3)]
    odd = [np.zeros((4, 4, 3), dtype=np.uint8)] * 2
    got = batch_costs(small + odd)
    assert got["batch_size"] == BATCH_SIZE
    for k in ("collate_ms_per_image", "to_float_ms_per_image", "handoff_ms_per_image"):
        assert got[k] >= 0
    # the hand-off is one image's bytes (8 * 6 * 3) at the measured copy rate
    if got["copy_mb_per_s"]:
        assert got["handoff_ms_per_image"] == pytest.approx(8 * 6 * 3 / (got["copy_mb_per_s"] * 1e6) * 1e3)
    terms = batch_cost_terms(got)
    assert terms["t_to_float_s"] == pytest.approx(got["to_float_ms_per_image"] / 1e3)


def test_no_decoded_image_gives_no_batch_figures():
    got = batch_costs([])
    assert got["batch_size"] == 0 and got["collate_ms_per_image"] is None
    assert batch_cost_terms(got) == {"t_collate_s": 0.0, "t_handoff_s": 0.0, "t_to_float_s": 0.0}


def test_doctor_reports_and_counts_the_batch_costs(tiny_image_folder):
    rep = doctor(tiny_image_folder, num_workers=1, max_files=8, budget_s=20, image_size=16)
    batch = rep.decode["batch"]
    assert batch["batch_size"] == BATCH_SIZE and batch["to_float_ms_per_image"] is not None
    assert "to float" in rep.summary()


# ---------------------------------------------------------------------------------------------
# the rules shared with watch


def test_decoding_is_the_limit_by_watchs_cpu_saturation_rule():
    """The predicted share of the workers' time on the CPU (rate over the decode-only ceiling) is
    judged by watch's threshold and band: 65 % is CPU-saturated (watch: 60 % ± 10 points, first kind
    of the borderline), 45 % is not."""
    assert WORKER_CPU_SATURATED == 0.6
    assert decode_bound(650, 1000, nw=2)
    assert not decode_bound(450, 1000, nw=2)
    assert decode_bound(1000, 1000, nw=0)  # no workers counts as one


def _advice(folder, local, more_rate, nw=1, cpus=4, px=None, image_size=None):
    pred = {"folder_images_per_s": folder, "packed_images_per_s": folder, "local_images_per_s": local,
            "more_workers": {"num_workers": storage_workers(nw, cpus), "folder_images_per_s": more_rate,
                             "packed_images_per_s": more_rate}}
    return advice_lines("folder", "data", {"fs_class": "local"}, {"estimated_total_bytes": 1e12},
                        {"median_pixels": px, "image_size": image_size}, pred, nw, cpus, int(1e9), None)


def test_a_loader_at_65_percent_of_its_cpu_ceiling_is_told_decoding_is_the_limit():
    lines = [a for a in _advice(folder=650, local=1000, more_rate=700) if a.startswith("more workers")]
    assert lines == ["more workers: num_workers=1 → 4: decoding is the limit and this machine has 4 cores "
                     "(up to about 4,000 images/s)"]


def test_the_resize_advice_follows_the_training_size_as_watchs_does():
    assert resize_target(384) == 439 and resize_target(224) == 256 and resize_target(None) == 256
    lines = [a for a in _advice(folder=900, local=1000, more_rate=900, px=10**6, image_size=384)
             if a.startswith("re-encode")]
    assert len(lines) == 1 and "--resize 439 " in lines[0]


def test_more_workers_for_storage_waits_is_watchs_count():
    pred = predict_with_more_workers(40, 4, dict(_COSTS))
    assert pred["more_workers"]["num_workers"] == 42  # min(2 * 40, max(4 * 4, 40 + 2), 64)
    assert predict_with_more_workers(1, 4, dict(_COSTS))["more_workers"]["num_workers"] == 3
