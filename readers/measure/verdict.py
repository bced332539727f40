"""``verify``'s verdict from its rounds: faster, slower, no clear difference, or no verdict at all.

A verdict has to hold still when the same command runs again. One round each of BEFORE and
AFTER cannot show how much a figure moves by itself, and a machine where other processes take
the CPU moves it a lot, so the verdict is read from every round:

* each side's images/s over the rounds: min, median, max and the *spread*
  ``(max - min) / median``;
* the *effect*: the ratio of the two medians, AFTER ÷ BEFORE, and its size
  ``max(ratio, 1 / ratio) - 1`` (the same for 2x faster and 2x slower);
* the CPU time other processes took while each run was measured, as a share of the machine
  (``RunReport.cpu["others_share"]``, read from ``/proc/stat``).

The verdict says "faster" or "slower" only when the effect is at least
:data:`MIN_EFFECT_SHARE`, every AFTER round lies beyond every BEFORE round (the two ranges do
not overlap) and the effect exceeds the larger spread. An effect under
:data:`MIN_EFFECT_SHARE` is "no clear difference". Otherwise there is no verdict: "rounds
disagree by N %" (``noisy``), or, where other processes took more than
:data:`OTHERS_CPU_LIMIT_SHARE` of the CPU and the effect is no larger than that share,
"other processes took N % of the CPU" (``busy``), with advice. A single round measures no noise;
its verdict says so.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["MIN_EFFECT_SHARE", "OTHERS_CPU_LIMIT_SHARE", "VERDICT_KINDS", "round_spread", "judge_rounds",
           "others_cpu_shares"]

#: An effect (relative difference of the medians) below this is "no clear difference".
MIN_EFFECT_SHARE = 0.05
#: Other processes taking more than this share of the machine's CPU during a run make it busy.
OTHERS_CPU_LIMIT_SHARE = 0.10
#: The verdict kinds: a clear result (``faster``, ``slower``, ``same``) or none (``noisy``, ``busy``).
VERDICT_KINDS = ("faster", "slower", "same", "noisy", "busy")


def round_spread(images_per_s: Sequence[float]) -> dict:
    """One side's rounds: ``{"rounds", "min", "median", "max", "spread_share"}``.

    Args:
        images_per_s: the side's images/s, one per round (at least one).

    Returns:
        ``median`` is the middle round (the lower of the two middle ones for an even count: the
        figure of a round that ran, the run ``verify`` reports); ``spread_share`` is
        ``(max - min) / median`` (0.0 for one round; None when the median is 0).

    Raises:
        ValueError: no rounds.
    """
    if not images_per_s:
        raise ValueError("no rounds to summarise")
    xs = [float(x) for x in images_per_s]
    med = sorted(xs)[(len(xs) - 1) // 2]  # the lower middle: a round that ran, as verify reports
    spread = (max(xs) - min(xs)) / med if med > 0 else None
    return {"rounds": xs, "min": min(xs), "median": med, "max": max(xs), "spread_share": spread}


def others_cpu_shares(runs: Sequence) -> list[float]:
    """The ``cpu["others_share"]`` of every run that has it (runs are :class:`RunReport` or JSON dicts)."""
    out = []
    for r in runs:
        cpu = r.get("cpu") if isinstance(r, dict) else getattr(r, "cpu", None)
        if cpu and cpu.get("others_share") is not None:
            out.append(float(cpu["others_share"]))
    return out


def _advice(kind: str, num_rounds: int, others_max: float | None) -> list[str]:
    advice = []
    if kind in ("noisy", "busy") or num_rounds < 2:
        more = max(3, 2 * num_rounds + 1)
        advice.append(f"run more rounds (--repeats {more}): the verdict compares every round of both sides")
    if kind == "busy" or (others_max is not None and others_max > OTHERS_CPU_LIMIT_SHARE):
        advice.append("run on a quieter machine: other processes took "
                      f"{others_max:.0%} of the CPU while a run was measured")
    elif kind == "noisy":
        advice.append("run on a quieter machine (check `top` for other processes and disk write-back)")
    return advice


def _text(kind: str, ratio: float, spread: float | None, others_max: float | None, num_rounds: int,
          noisy: bool) -> str:
    if kind == "faster":
        head = f"{ratio:.1f}x faster"
    elif kind == "slower":
        head = f"{1 / ratio:.1f}x slower ({ratio:.2f}x)"
    elif kind == "same":
        head = f"no clear difference ({ratio:.2f}x)"
    elif kind == "noisy":
        head = f"no clear difference; rounds disagree by {spread:.0%} ({ratio:.2f}x between medians)"
    else:
        head = (f"no clear difference; other processes took {others_max:.0%} of the CPU"
                + (f", rounds disagree by {spread:.0%}" if noisy and spread else "")
                + f" ({ratio:.2f}x between medians)")
    if kind in ("faster", "slower", "same"):
        if num_rounds < 2:
            head += "; one round, noise not measured"
        elif spread is not None:
            head += f"; rounds vary by {spread:.0%}"
    return head


def judge_rounds(before_images_per_s: Sequence[float], after_images_per_s: Sequence[float],
                 others_shares: Sequence[float] = ()) -> dict:
    """The verdict of ``verify`` from each side's images/s per round (see the module docstring).

    Args:
        before_images_per_s: BEFORE's images/s, one per round.
        after_images_per_s: AFTER's images/s, one per round.
        others_shares: the share of the machine's CPU other processes took during each run, in
            [0, 1] (any number of runs; empty when unknown).

    Returns:
        ``{"kind", "text", "ratio", "effect_share", "spread_share", "others_cpu_share_max",
        "before", "after", "separated", "num_rounds", "advice"}``: ``kind`` is one of
        :data:`VERDICT_KINDS`; ``ratio`` is AFTER's median ÷ BEFORE's median; ``spread_share`` the
        larger of the two sides' spreads; ``separated`` whether the two ranges of rounds do not
        overlap; ``advice`` lines for a verdict that is missing or rests on one round.

    Raises:
        ValueError: a side without rounds, or BEFORE's median is 0 images/s.
    """
    b, a = round_spread(before_images_per_s), round_spread(after_images_per_s)
    if b["median"] <= 0:
        raise ValueError("BEFORE measured 0 images/s: nothing to compare against")
    ratio = a["median"] / b["median"]
    effect = max(ratio, 1 / ratio) - 1 if ratio > 0 else float("inf")
    spreads = [s for s in (b["spread_share"], a["spread_share"]) if s is not None]
    spread = max(spreads) if spreads else None
    num_rounds = min(len(b["rounds"]), len(a["rounds"]))
    separated = a["min"] > b["max"] if ratio >= 1 else a["max"] < b["min"]
    others_max = max(others_shares) if others_shares else None
    busy = others_max is not None and others_max > OTHERS_CPU_LIMIT_SHARE
    noisy = not separated or (spread is not None and effect <= spread)
    if effect < MIN_EFFECT_SHARE:
        kind = "same"
    elif noisy:
        kind = "busy" if busy else "noisy"
    elif busy and effect <= others_max:
        kind = "busy"
    else:
        kind = "faster" if ratio > 1 else "slower"
    return {"kind": kind, "text": _text(kind, ratio, spread, others_max, num_rounds, noisy), "ratio": ratio,
            "effect_share": effect, "spread_share": spread, "others_cpu_share_max": others_max,
            "before": b, "after": a, "separated": separated, "num_rounds": num_rounds,
            "advice": _advice(kind, num_rounds, others_max)}
