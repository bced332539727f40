"""verify's progress lines: how many runs, and the time left estimated from the runs so far."""

from __future__ import annotations

import types

from shardfeed.readers.measure import verify as verify_mod
from shardfeed.readers.measure.verify import compare_sources, time_left_text


def test_time_left_is_the_runs_left_times_the_mean_run():
    assert time_left_text([], 6) is None  # nothing to go by before the first run ends
    assert time_left_text([50.0, 70.0], 0) is None
    assert time_left_text([50.0, 70.0], 4) == "about 4 min 0 s left"  # 60 s each, 4 to go
    assert time_left_text([12.4], 3) == "about 37 s left"
    assert time_left_text([55.0], 5) == "about 4 min 35 s left"


def test_verify_announces_its_runs_and_then_the_time_left(tmp_path, monkeypatch):
    clock = {"now": 1000.0}
    run_s = {"before": 40.0, "after": 20.0}  # planted durations of each side's run

    def fake_bench(src, *, label, **_options):
        clock["now"] += run_s[label]
        return types.SimpleNamespace(label=label, images_per_s=100.0, config={}, num_samples=10,
                                     cpu={"total_s": 1.0, "others_share": 0.0})

    monkeypatch.setattr(verify_mod, "bench_source", fake_bench)
    monkeypatch.setattr(verify_mod, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lines: list[str] = []
    compare_sources(tmp_path / "a", tmp_path / "b", repeats=2, check=False, settle=False, warm_cache=False,
                    progress=lines.append)
    assert lines[0].startswith("4 runs to measure (2 round(s) of both sides)")
    rounds = lines[1:]
    assert [x.split(":")[0] for x in rounds] == ["round 1/2", "round 1/2", "round 2/2", "round 2/2"]
    assert "left" not in rounds[0]
    assert rounds[1].endswith("; about 2 min 0 s left")  # before took 40 s: 3 runs of 40 s
    assert rounds[2].endswith("; about 1 min 0 s left")  # (40 + 20) / 2 = 30 s, 2 to go
    assert rounds[3].endswith("; about 27 s left")  # round 2 runs after first: (40 + 20 + 20) / 3 = 26.7 s, 1 to go
