"""``verify``'s verdict from constructed round figures (:mod:`shardfeed.readers.measure.verdict`).

Expected values are worked out by hand from the figures (the docstring rule: medians are the
middle round, the lower of two middles; spread = (max - min) / median; a verdict needs an effect
of 5 % or more, non-overlapping ranges and an effect above the spread).
"""

from __future__ import annotations


import pytest

from shardfeed.readers.measure import judge_rounds, verdict_headline
from shardfeed.readers.measure.sampling import others_cpu
from shardfeed.readers.measure.verdict import round_spread


def test_demo_rounds_that_disagree_give_no_verdict():
    # a `make demo` run whose medians alone would print "2.0x faster"
    v = judge_rounds([1514, 948, 973], [1901, 2120, 1025])
    assert v["kind"] == "noisy"
    assert v["before"]["median"] == 973 and v["after"]["median"] == 1901
    assert v["ratio"] == pytest.approx(1901 / 973)
    assert v["spread_share"] == pytest.approx((1514 - 948) / 973)  # 58 %, the larger of the two
    assert not v["separated"]  # AFTER's 1025 is below BEFORE's 1514
    assert v["text"] == "no clear difference; rounds disagree by 58% (1.95x between medians)"
    assert any("--repeats 7" in a for a in v["advice"]) and any("quieter machine" in a for a in v["advice"])


def test_overlapping_rounds_give_no_verdict():
    # rounds 141, 153 vs 154, 153 images/s: printed "1.1x"
    v = judge_rounds([141, 153], [154, 153])
    assert v["before"]["median"] == 141 and v["after"]["median"] == 153
    assert v["ratio"] == pytest.approx(153 / 141)
    assert not v["separated"]  # 153 is in both ranges
    assert v["kind"] == "noisy"
    assert v["text"].startswith("no clear difference; rounds disagree by 9%")


def test_clear_speedup():
    v = judge_rounds([300, 310, 305], [900, 920, 880])
    assert v["kind"] == "faster" and v["separated"]
    assert v["ratio"] == pytest.approx(900 / 305)
    assert v["spread_share"] == pytest.approx(40 / 900)
    assert v["text"] == "3.0x faster; rounds vary by 4%"
    assert v["advice"] == []


def test_clear_slowdown():
    v = judge_rounds([1000, 1010, 990], [500, 505, 495])
    assert v["kind"] == "slower"
    assert v["ratio"] == pytest.approx(0.5)
    assert v["effect_share"] == pytest.approx(1.0)  # 2x slower is as large an effect as 2x faster
    assert v["text"] == "2.0x slower (0.50x); rounds vary by 2%"


def test_small_effect_is_no_clear_difference():
    v = judge_rounds([100, 101, 99], [102, 100, 101])
    assert v["kind"] == "same"
    assert v["ratio"] == pytest.approx(1.01)
    assert v["text"] == "no clear difference (1.01x); rounds vary by 2%"


def test_separated_but_effect_within_spread_is_noisy():
    # AFTER always ahead, but by less than BEFORE's own rounds move: 20 % effect, 40 % spread
    v = judge_rounds([100, 140, 138], [168, 170, 169])
    assert v["separated"]
    assert v["ratio"] == pytest.approx(169 / 138)
    assert v["spread_share"] == pytest.approx(40 / 138)
    assert v["kind"] == "noisy"


def test_other_processes_larger_than_the_effect_give_no_verdict():
    v = judge_rounds([100, 101, 102], [120, 121, 122], [0.40, 0.10, 0.05])
    assert v["separated"] and v["effect_share"] == pytest.approx(121 / 101 - 1)
    assert v["others_cpu_share_max"] == pytest.approx(0.40)
    assert v["kind"] == "busy"
    assert v["text"] == "no clear difference; other processes took 40% of the CPU (1.20x between medians)"
    assert any("quieter machine" in a and "40%" in a for a in v["advice"])


def test_busy_and_noisy_names_both():
    v = judge_rounds([100, 150, 120], [140, 130, 160], [0.3])
    assert v["kind"] == "busy"
    assert v["text"].startswith("no clear difference; other processes took 30% of the CPU, rounds disagree by")


def test_large_effect_holds_on_a_busy_machine():
    v = judge_rounds([100, 102, 101], [300, 305, 310], [0.30])
    assert v["kind"] == "faster"
    assert v["text"] == "3.0x faster; rounds vary by 3%"
    assert any("quieter machine" in a for a in v["advice"])  # still said: the load was there


def test_one_round_says_its_noise_is_unknown():
    v = judge_rounds([100], [300])
    assert v["kind"] == "faster" and v["num_rounds"] == 1
    assert v["text"] == "3.0x faster; one round, noise not measured"
    assert any("--repeats 3" in a for a in v["advice"])


def test_round_spread_even_count_and_errors():
    s = round_spread([4, 1, 3, 2])
    assert (s["min"], s["median"], s["max"]) == (1, 2, 4)
    assert s["spread_share"] == pytest.approx(1.5)
    with pytest.raises(ValueError):
        round_spread([])
    with pytest.raises(ValueError):
        judge_rounds([0.0], [10.0])


def test_verdict_headline_adds_the_stall():
    v = judge_rounds([300, 310, 305], [900, 920, 880])
    assert verdict_headline(v, 900 / 305, 0.71, 0.06) == "3.0x faster; rounds vary by 4%; data stall 71% -> 6%"
    assert verdict_headline(None, 2.0, 0.5, 0.1) == "2.0x faster; data stall 50% -> 10%"


def test_others_cpu_from_the_machines_cpu_times():
    import psutil

    zero = psutil.cpu_times()._replace(**{f: 0.0 for f in psutil.cpu_times()._fields})
    # 3 s busy (2 user + 1 system); idle and iowait left out
    end = zero._replace(user=2.0, system=1.0, idle=5.0, **({"iowait": 1.0} if "iowait" in zero._fields else {}))
    out = others_cpu(zero, end, ours_s=1.0, wall_s=2.0, cpu_count=2)
    assert out["others_s"] == pytest.approx(2.0)
    assert out["others_share"] == pytest.approx(2.0 / (2.0 * 2))
    assert others_cpu(None, end, 1.0, 2.0, 2) == {"others_s": None, "others_share": None}
    assert others_cpu(zero, end, ours_s=5.0, wall_s=2.0, cpu_count=2)["others_s"] == 0.0  # never negative
