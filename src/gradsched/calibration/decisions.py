"""The decision rules of run-time ``auto``: keep, re-plan or revert at a check; which trial plan wins.

Rank 0 of :class:`gradsched.torch.runtime.autotune.AutoTuner` applies them to what it
measured and broadcasts the outcome; they are plain functions of medians.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def decide(current: str, measured_s: float, expected_s: float, measured_by_plan: dict[str, float],
           threshold: float, must_gain: float | None = None) -> tuple[str, str | None]:
    """What rank 0 does at a check: ``("keep", None)``, ``("replan", None)`` or ``("revert", plan_hash)``.

    Revert when another plan already measured faster than the current one by more than
    ``threshold`` (the simulator chose wrongly: trust the measurement); otherwise
    re-plan when this check's measurement ``measured_s`` is off what was expected of the
    plan (``expected_s``: its prediction, corrected by what has been measured) by more
    than ``threshold``.  ``measured_by_plan`` holds each plan's median over every
    iteration measured under it (the current one's included): one slow window of a
    noisy machine must not undo a choice that many iterations made.

    ``must_gain`` (a plan that no trial measured: a re-plan's): the current plan stays
    only while it measures faster than every other measured plan by that fraction, the
    rule a trial plan had to pass against PyTorch's DDP; otherwise revert to the best."""
    others = {h: t for h, t in measured_by_plan.items() if h != current}
    if others:
        best = min(others, key=others.__getitem__)
        allowed = 1 + threshold if must_gain is None else 1 - must_gain  # times the best other's time
        if measured_by_plan.get(current, measured_s) > others[best] * allowed:
            return "revert", best
    if abs(measured_s - expected_s) / expected_s > threshold:
        return "replan", None
    return "keep", None


def clear_wins(windows: Sequence[float], against: Sequence[float], margin: float) -> list[bool]:
    """Whether each of a plan's windows beat the baseline's window paired with it (``against``, same order) by
    ``margin``: took less than ``1 - margin`` of its time (0: faster at all)."""
    return [a < b * (1 - margin) for a, b in zip(windows, against)]


def fastest(measured_by_plan: dict[str, float], baseline: str | None, min_gain: float,
            rounds: dict[str, list[float]] | None = None, resized: Collection[str] = (),
            resized_min_gain: float | None = None, paired: dict[str, list[float]] | None = None) -> str:
    """The plan the trials keep: the fastest of those whose median beats DDP's buckets (``baseline``) by
    ``min_gain`` and, given ``rounds`` (each plan's window medians, round by round), whose window beat the
    baseline's window of the same round by ``min_gain`` in most rounds (more than half); the baseline if none.

    Picking the smallest of a few noisy medians favours whichever plan had a lucky window
    (on 4 ranks sharing 2 cores, a plan 1% faster than DDP's buckets in its trial ran 14%
    slower than PyTorch DDP in the rounds after); what users would run anyway keeps its
    place unless something is clearly faster: faster by ``min_gain`` in most rounds, where both ran in the
    same phase of the machine, so one lucky window cannot carry it, nor one slow window undo a clear gain
    (usbyte's windows [0.532, 0.890, 0.617] s against DDP's [0.713, 0.788, 0.749] are kept; the rules
    compared on every stored trial decision: ``python benchmarks/trial_rules.py``).

    ``resized``: plans that are the baseline with other bucket sizes (PyTorch's DDP at
    another ``bucket_cap_mb``): they need beat it by ``resized_min_gain`` only (default
    ``min_gain``), and in most rounds by any margin.  Nothing else changes between
    them, so a noisy pick costs nothing on average, while a real gain of a few % (one
    bucket over DDP's default for a small CNN over loopback: 4-8%) would rarely clear 3% in
    most of several rounds of 5-10% noise.

    ``paired``: per plan, the baseline's window medians to compare its windows with, one each
    (the budgeted trials compare each window with the baseline's window just before it);
    default: the baseline's own ``rounds``, round by round."""
    if baseline not in measured_by_plan:
        return min(measured_by_plan, key=measured_by_plan.__getitem__)
    base, rounds = measured_by_plan[baseline], rounds or {}
    small = min_gain if resized_min_gain is None else resized_min_gain

    def beats(plan: str) -> bool:
        against = (paired or {}).get(plan, rounds.get(baseline, []))
        gain = small if plan in resized else min_gain
        wins = clear_wins(rounds.get(plan, []), against, 0.0 if plan in resized else min_gain)
        return measured_by_plan[plan] <= base * (1 - gain) and (not wins or 2 * sum(wins) > len(wins))

    winners = [h for h in measured_by_plan if h != baseline and beats(h)]
    return min(winners, key=measured_by_plan.__getitem__) if winners else baseline


def runoff_plans(measured_by_plan: dict[str, float], baseline: str | None, margin: float, limit: int) -> list[str]:
    """The plans the trials' rounds could not tell apart, which take more turns before :func:`fastest`
    decides: those within ``margin`` of the fastest median (the fastest first), at most ``limit``
    with the baseline, which comes last (the rule compares them with it round by round); none
    if only one plan is that close."""
    if not measured_by_plan:
        return []
    fastest_s = min(measured_by_plan.values())
    close = sorted((h for h, t in measured_by_plan.items() if t <= fastest_s * (1 + margin)),
                   key=measured_by_plan.__getitem__)
    if len(close) < 2:
        return []
    plans = [h for h in close if h != baseline]
    if baseline is None or baseline not in measured_by_plan:
        return plans[:limit]
    return plans[:limit - 1] + [baseline]
