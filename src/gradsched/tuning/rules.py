"""Run-time ``auto``'s rules as plain functions: checks and their cap, the trial candidates, the baseline.

Torch-free; the runtime's driver (:class:`gradsched.torch.runtime.autotune.AutoTuner`) applies them
to what it measured and broadcasts the outcome.  ``tried`` maps a plan hash to ``(strategy, plan)``
as the driver holds them (every rank alike).  The numeric rules are in :mod:`gradsched.calibration`
(:func:`~gradsched.calibration.decide`, :func:`~gradsched.calibration.fastest`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gradsched.calibration.decisions import runoff_plans
from gradsched.plan import Plan
from gradsched.tuning.candidates import is_torch_ddp
from gradsched.tuning.config import OFFLINE_TRIALS, RUNOFF_PLANS, AutoTuneConfig

if TYPE_CHECKING:
    from gradsched.planners.auto import Ranked


def capped(decision: tuple[str, str | None], replans: int, max_replans: int) -> tuple[str, str | None]:
    """A check's decision under the re-plan cap: past ``max_replans`` a check may keep or revert, never re-plan
    (the check after the last re-plan exists to revert a plan no trial measured)."""
    if decision[0] == "replan" and replans >= max_replans:
        return "keep", None
    return decision


def next_check(step: int, config: AutoTuneConfig, replans: int, after_replan: bool, on_torch_ddp: bool) -> int | None:
    """The iteration of the next check after ``step`` (None: no more checks, nor their broadcasts).

    Checks stop at the re-plan cap, but a re-plan's plan, which ran in no trial, is checked once more;
    on PyTorch's DDP nothing is traced, so there is nothing to re-plan from: no checks at all."""
    more = (replans < config.max_replans or after_replan) and not on_torch_ddp
    return step + config.patience + 1 if more else None


def replan_at(step: int, config: AutoTuneConfig) -> int:
    """Where a re-plan decided at ``step`` plans: after ``patience`` iterations of the current plan measured
    with every completion stamped (and one for the switch)."""
    return step + config.patience + 1


def runnable(candidates: list["Ranked"], has_optimizer: bool) -> list["Ranked"]:
    """The plans that run as the simulator predicts them: without a DistributedOptimizer an overlapping plan
    waits at the end of backward (gradsched.torch.runtime.inflight), so only the others (all, if none is)."""
    if has_optimizer:
        return candidates
    return [r for r in candidates if not r.plan.overlap_forward] or candidates


def trial_candidates(results: list["Ranked"], config: AutoTuneConfig, with_defaults: Callable[[str], "Ranked"],
                     offline: list["Ranked"] | None) -> list["Ranked"]:
    """The plans measured beside the chosen one (``results[0]``): its strategy with default options, the best
    plan of each of the next ``trials - 1`` strategies in predicted order, the best of ``offline`` (the plans
    of a profile and cluster the user gave, best first) and, without PyTorch's DDP among the candidates,
    DDP's buckets on the executor (what the user would run otherwise).

    The search tunes each strategy's options on the simulator's model; the options its authors chose by hand
    are measured beside them.  On 2 hosts at 1gbit (vgg) the search's usbyte and bytescheduler plans measured
    584-623 ms in one job's trials, DDP's buckets 563-574; their default options ran at 509-511 ms in the next
    job's rounds."""
    chosen = results[0].strategy
    trials = [with_defaults(chosen)]
    picked = {chosen}
    for r in results[1:]:
        if len(picked) < config.trials and r.strategy not in picked:
            picked.add(r.strategy)
            trials.append(r)
    if offline is not None:
        trials.extend(offline[:OFFLINE_TRIALS])
    if "ddp" not in picked and not config.torch_ddp:
        trials.append(with_defaults("ddp"))
    return trials


def baseline_of(tried: Mapping[str, tuple[str, Plan]], bucket_cap_mb: float) -> str | None:
    """What a trial plan must beat: PyTorch's DDP at the user's bucket size (the latest such plan: deferred,
    the one planned from the measured profile, not the one built to start on), else DDP's buckets on the
    executor, else None."""
    own = [h for h, (_, plan) in tried.items() if is_torch_ddp(plan) and plan.options["bucket_cap_mb"] == bucket_cap_mb]
    return next(reversed(own), None) or next((h for h, (name, _) in tried.items() if name == "ddp"), None)


def resized_of(tried: Mapping[str, tuple[str, Plan]], baseline: str | None, taken: Mapping[str, float]) -> set[str]:
    """The candidates of ``taken`` that are the baseline at other bucket sizes: PyTorch's DDP, when it is."""
    if baseline is None or not is_torch_ddp(tried[baseline][1]):
        return set()
    return {h for h in taken if h != baseline and is_torch_ddp(tried[h][1])}


def next_window(turns: list[str], base: str | None, taken: Mapping[str, float], runoff_started: bool,
                config: AutoTuneConfig, window: int, rest: Callable[[], int]) -> dict[str, Any]:
    """Budgeted trials, at the end of a window: what runs next, given the ``turns`` still to come (candidates out
    of the running already left out), the baseline ``base`` and the medians ``taken`` of the candidates still in
    the running.

    When no candidate but the baseline is left in the turns and no run-off has been held, the plans the rounds
    could not tell apart (:func:`~gradsched.calibration.runoff_plans`, the baseline first) take
    ``runoff_rounds`` more turns; when none is left at all: ``{"kind": "end"}`` (the caller picks the plan).
    Otherwise the next candidate's window of ``window`` iterations, or first a rest on the baseline of
    ``rest()`` iterations (at least ``window``) if the budget needs one.  ``turns``/``runoff`` in the result:
    what is left to run and the run-off's plans, if one starts now."""
    runoff = None
    if not any(h != base for h in turns) and not runoff_started and config.runoff_rounds:
        close = runoff_plans(dict(taken), base, config.runoff_margin, RUNOFF_PLANS)
        runoff = sorted(close, key=lambda h: h != base)  # the baseline first, as in the rounds
        turns = runoff * config.runoff_rounds if any(h != base for h in runoff) else []
    if not any(h != base for h in turns):
        return {"kind": "end", "plan": None, "turns": [], "runoff": runoff}
    nxt = turns[0]
    if nxt != base:
        needed = rest()
        if needed:
            return {"kind": "rest", "plan": base, "iterations": max(needed, window), "turns": turns,
                    "runoff": runoff}
    return {"kind": "window", "plan": nxt, "iterations": window, "turns": turns[1:], "runoff": runoff}


def control_of(settled: Mapping[str, float], current: str, tried: Mapping[str, tuple[str, Plan]]) -> str | None:
    """The plan a drifting check measures beside the current one (:func:`shared_drift`): the fastest other plan the
    trials measured taking turns (``settled``: :attr:`~gradsched.tuning.records.PlanMeasurements.settled`, what it is
    expected to measure again, untraced) that runs on gradsched's executor, which switches plans without building
    anything (PyTorch's DDPs other than the one running are released once the trials are decided); None where there
    is none (no trials: the initial plan's only measurement was traced in full; the check then acts alone)."""
    others = {h: t for h, t in settled.items() if h != current and h in tried and not is_torch_ddp(tried[h][1])}
    return min(others, key=others.__getitem__) if others else None


def shared_drift(measured_s: float, expected_s: float, control_s: float, control_expected_s: float,
                 threshold: float) -> bool:
    """Whether a check's drift is the machine's, not the plan's: the control plan, measured right after the check,
    is off what it measured before (``control_expected_s``) by the same factor, within ``threshold``, as the current
    plan is off what was expected of it.  Then the plan keeps its measured lead over the control and a re-plan has
    nothing to gain: every plan slowed alike.  On 8 emulated hosts (runs12, ResNet-50) a check measured 227 ms
    against 175 expected while other sessions' tests loaded the machine; it re-planned, and the re-plan's plan was
    reverted 12 iterations later (docs/notes/2026-12-err12.md)."""
    if not (expected_s > 0 and control_s > 0 and control_expected_s > 0):
        return False
    own = (measured_s / expected_s) / (control_s / control_expected_s)
    return abs(own - 1) <= threshold
