"""The decision rules of run-time ``auto``: keep, re-plan or revert at a check; which trial plan wins.

Rank 0 of :class:`gradsched.torch.runtime.autotune.AutoTuner` applies them to what it
measured and broadcasts the outcome; they are plain functions of medians.
"""

from __future__ import annotations


def decide(current: str, measured_s: float, expected_s: float, measured_by_plan: dict[str, float],
           threshold: float) -> tuple[str, str | None]:
    """What rank 0 does at a check: ``("keep", None)``, ``("replan", None)`` or ``("revert", plan_hash)``.

    Revert when another plan already measured faster than the current one by more than
    ``threshold`` (the simulator chose wrongly: trust the measurement); otherwise
    re-plan when this check's measurement ``measured_s`` is off what was expected of the
    plan (``expected_s``: its prediction, corrected by what has been measured) by more
    than ``threshold``.  ``measured_by_plan`` holds each plan's median over every
    iteration measured under it (the current one's included): one slow window of a
    noisy machine must not undo a choice that many iterations made."""
    others = {h: t for h, t in measured_by_plan.items() if h != current}
    if others:
        best = min(others, key=others.__getitem__)
        if others[best] * (1 + threshold) < measured_by_plan.get(current, measured_s):
            return "revert", best
    if abs(measured_s - expected_s) / expected_s > threshold:
        return "replan", None
    return "keep", None


def fastest(measured_by_plan: dict[str, float], baseline: str | None, min_gain: float) -> str:
    """The plan the trials keep: the one that measured fastest, unless that is DDP's buckets'
    (``baseline``) within ``min_gain``; then the baseline.

    Picking the smallest of a few noisy medians favours whichever plan had a lucky window
    (on 4 ranks sharing 2 cores, a plan 1% faster than DDP's buckets in its trial ran 14%
    slower than PyTorch DDP in the rounds after); what users would run anyway keeps its
    place unless something is clearly faster."""
    best = min(measured_by_plan, key=measured_by_plan.__getitem__)
    if baseline in measured_by_plan and measured_by_plan[best] > measured_by_plan[baseline] * (1 - min_gain):
        return baseline
    return best
