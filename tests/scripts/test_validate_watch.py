"""scripts/validate_watch.py's bookkeeping on planted runs: the matrix, the targets' figures, the loop's own clock."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "validate_watch.py"


def _load():
    spec = importlib.util.spec_from_file_location("validate_watch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


vw = _load()


def _row(scenario, named, between=None, stall=0.5, own=0.5):
    planted, kinds = vw.SCENARIOS[scenario][:2]
    d = {"kind": named, "between": between}
    return {"scenario": scenario, "mode": "inproc", "planted": planted, "named": named, "between": between,
            "ok": vw._accepted(d, kinds), "stall": stall, "own_stall": own}


def test_the_matrix_counts_planted_against_named_and_the_targets():
    rows = [_row("storage-2ms", "storage-bound", stall=0.80, own=0.78),
            _row("compute", "storage-bound", stall=0.03, own=0.03),  # a page-cache run called storage-bound
            _row("cpu-decode", "borderline", ["cpu-bound", "cpu-contended"]),  # both accepted
            _row("handoff", "borderline", ["storage-bound", "handoff-bound"], stall=0.50, own=0.56)]
    s = vw.summarise(rows)
    assert s["matrix"] == {"storage-bound": {"storage-bound": 1}, "compute-bound": {"storage-bound": 1},
                           "cpu-bound": {"borderline": 1}, "handoff-bound": {"borderline": 1}}
    assert s["runs"] == 4 and s["named_planted_share"] == 0.5
    assert s["page_cache_called_storage"] == 1
    assert s["stall_delta_max_points"] == pytest.approx(6.0)


def test_the_loop_s_own_stall_leaves_out_the_first_batch_and_a_trainer_s_window_its_edges():
    assert vw.own_stall([9.0, 1.0, 1.0], [5.0, 3.0, 3.0]) == pytest.approx(2 / 8)
    # fetches (start, end): the one before the first step's end is left out; one past the last is cut
    fetches = [(0.0, 1.0), (2.0, 3.0), (5.0, 6.0), (9.5, 11.0)]
    assert vw.window_stall(fetches, 1.5, 10.0) == pytest.approx((1.0 + 1.0 + 0.5) / 8.5)
    assert vw.window_stall(fetches, None, 10.0) is None
    # the call that ends the pass (no batch: the workers shut down) is left out of the window
    assert vw.window_stall(fetches + [(7.0, 8.0, False)], 1.5, 10.0) == pytest.approx((1.0 + 1.0 + 0.5) / 7.5)
