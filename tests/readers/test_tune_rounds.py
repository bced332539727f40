"""``tune``'s rounds and decision rule, on planted measurements: the measuring function and the
clock are injected, so the order of the trials and the setting kept follow from the numbers here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shardfeed.readers.measure.tune import setting_beats, storage_was_read, tune_loader


@dataclasses.dataclass
class _Report:
    images_per_s: float
    stall_share: float = 0.5
    cpu: dict | None = None
    io: dict | None = None
    system: dict | None = None
    config: dict = dataclasses.field(default_factory=dict)

    def to_json(self, per_batch: bool = True) -> dict:
        return {"images_per_s": self.images_per_s}


class _Planted:
    """A measuring function: images/s for each setting, one value per round in turn; records the
    order of the calls."""

    def __init__(self, table: dict, report_kw: dict | None = None):
        self.table = table
        self.calls: list[tuple] = []
        self.seen: dict[tuple, int] = {}
        self.report_kw = report_kw or {}

    def __call__(self, source: Any, *, label: str, **options: Any) -> _Report:
        key = (options["num_workers"], options["prefetch_factor"], options["persistent_workers"])
        self.calls.append((label, key))
        i = self.seen.get(key, 0)
        self.seen[key] = i + 1
        values = self.table.get(key, self.table.get("default"))
        kw = dict(self.report_kw)
        kw.setdefault("config", {"loader": {"num_workers": options["num_workers"]}})
        return _Report(images_per_s=values[i % len(values)], **kw)


class _Clock:
    """Each reading one second after the last: every trial takes 1 s of budget."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def _tune(measure, **kw):
    return tune_loader("planted", device="cpu", max_workers=4, measure=measure, clock=_Clock(), budget_s=10_000, **kw)


def test_rounds_are_interleaved_across_settings():
    m = _Planted({"default": [100.0, 100.0, 100.0]})
    _tune(m)
    workers = [k[0] for label, k in m.calls if label == "num_workers"]
    assert workers == [0, 1, 2, 4] * 3  # round-robin: round 1 of every count, then round 2, then 3
    # no gain anywhere: the default (0 workers) is kept and the worker knobs are not tried
    assert [label for label, _ in m.calls if label != "num_workers"] == []


def test_a_setting_within_the_spread_is_not_kept():
    # 4 workers' median is 12 % above 2 workers', but its rounds overlap 2 workers' rounds
    m = _Planted({(0, 2, True): [100.0, 101.0, 99.0], (1, 2, True): [150.0, 152.0, 148.0],
                  (2, 2, True): [200.0, 205.0, 195.0], (4, 2, True): [224.0, 190.0, 240.0],
                  "default": [200.0, 205.0, 195.0]})
    r = _tune(m)
    assert r.best_options["num_workers"] == 2
    assert r.best["images_per_s"] == 200.0  # the median round of the setting kept
    assert any("num_workers=4 not kept" in d for d in r.decisions)
    assert "num_workers=2" in r.call


def test_a_setting_kept_only_when_every_round_beats_every_default_round():
    m = _Planted({(0, 2, True): [100.0, 101.0, 99.0], (1, 2, True): [150.0, 152.0, 148.0],
                  (2, 2, True): [150.0, 149.0, 151.0], (4, 2, True): [151.0, 150.0, 152.0],
                  (1, 4, True): [170.0, 171.0, 169.0], (1, 4, False): [171.0, 160.0, 175.0]})
    r = _tune(m)
    assert r.best_options == {"num_workers": 1, "pin_memory": False, "prefetch_factor": 4,
                              "persistent_workers": True}
    # the prefetch step re-measures the setting kept so far against the changed one, interleaved
    pf = [k for label, k in m.calls if label == "prefetch_factor"]
    assert pf == [(1, 2, True), (1, 4, True)] * 3
    pw = [k for label, k in m.calls if label == "persistent_workers"]
    assert pw == [(1, 4, True), (1, 4, False)] * 3


def test_one_fast_round_recommends_nothing():
    # one trial per setting would have picked 4 workers from its first round
    m = _Planted({(0, 2, True): [100.0, 100.0, 100.0], (1, 2, True): [100.0, 99.0, 101.0],
                  (2, 2, True): [101.0, 100.0, 99.0], (4, 2, True): [180.0, 95.0, 99.0]})
    r = _tune(m)
    assert r.best_options["num_workers"] == 0


@pytest.mark.parametrize("default, setting, min_gain, won", [
    ([100, 101, 99], [120, 119, 121], 0.05, True),     # ranges apart, gain 20 % above the 2 % spread
    ([100, 110, 90], [115, 114, 116], 0.05, False),    # gain 15 % but the default spreads 20 %
    ([100, 101, 99], [103, 102, 104], 0.05, False),    # apart but a gain under 5 %
    ([100, 101, 99], [108, 107, 109], 0.10, False),    # under the caller's min_gain
    ([100, 120, 80], [125, 70, 130], 0.05, False),     # the setting's worst round below the default's best
])
def test_setting_beats_rule(default, setting, min_gain, won):
    assert setting_beats(default, setting, min_gain)[0] is won


def test_busy_rounds_recommend_nothing():
    # other processes took 30 % of the CPU: a 20 % gain is within what they can move
    assert setting_beats([100, 101, 99], [120, 119, 121], 0.05, [0.3, 0.3])[0] is False


def test_rounds_below_three_are_refused():
    with pytest.raises(ValueError, match="rounds must be at least 3"):
        _tune(_Planted({"default": [1.0]}), rounds=2)


_CPU_BUSY = {"cpu_count": 2, "workers_cores": 1.9, "main_cores": 0.95}
_PAGE_CACHE = {"rchar": 50_000_000, "read_bytes": 0}
_FROM_DISK = {"rchar": 50_000_000, "read_bytes": 48_000_000}


def test_no_storage_advice_when_decoding_is_the_limit(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x" * 1000)
    m = _Planted({"default": [100.0]}, {"cpu": _CPU_BUSY, "io": _PAGE_CACHE, "system": {"iowait_share": 0.0}})
    r = tune_loader(tmp_path, device="cpu", max_workers=2, measure=m, clock=_Clock(), budget_s=10_000)
    assert r.advice == []
    # read from disk, but the workers kept both cores busy: still decoding, still no storage advice
    m = _Planted({"default": [100.0]}, {"cpu": _CPU_BUSY, "io": _FROM_DISK, "system": {"iowait_share": 0.01}})
    r = tune_loader(tmp_path, device="cpu", max_workers=2, measure=m, clock=_Clock(), budget_s=10_000)
    assert r.advice == []


def test_storage_advice_when_the_workers_waited_on_the_disk(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x" * 1000)
    idle = {"cpu_count": 2, "workers_cores": 0.3, "main_cores": 0.2}
    m = _Planted({"default": [100.0]}, {"cpu": idle, "io": _FROM_DISK, "system": {"iowait_share": 0.4}})
    r = tune_loader(tmp_path, device="cpu", max_workers=2, measure=m, clock=_Clock(), budget_s=10_000)
    assert any("cache='memory'" in a for a in r.advice), r.advice


def test_storage_was_read_needs_the_figures():
    assert storage_was_read(_Report(1.0)) is False
    rep = _Report(1.0, cpu={"cpu_count": 2, "main_cores": 0.1}, io=_FROM_DISK, config={"loader": {"num_workers": 0}})
    assert storage_was_read(rep) is True
