"""Run-time ``auto``'s warm-up in the bench (:mod:`gradsched.torch.jobs.bench_worker`, step 4).

Whether it runs in situ or ``auto`` is planned at start-up, and how long it takes (:func:`_auto_warmup`, from
the start-up's profile and cluster: :func:`_warmup_s`, :func:`_simulated_s`), and the warm-up itself, off the
clock (:func:`auto_warm_up`), after which its drift checks are held through the counted rounds (:func:`hold_checks`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from gradsched.calibration import lower_bound_s, with_runtime_costs
from gradsched.jobs.config import BenchConfig, BenchEntry
from gradsched.jobs.startup import (SHORT_WARMUP, AutoWarmup, auto_warmup, initial_iterations, may_shorten,
                                   replay_start, shorter, warmup_estimate_s)
from gradsched.torch.jobs.bench_rows import _ddp_cap_mb
from gradsched.torch.jobs.bench_startup import _Start


def _auto_warmup(entry: BenchEntry, cfg: BenchConfig, start: _Start) -> AutoWarmup | None:
    """Run-time ``auto``'s warm-up in situ, or ``auto`` planned at start-up (:func:`auto_warmup`): the same
    decision on every rank (from the broadcast profile and cluster)."""
    if entry.torch_ddp or entry.fsdp2 or entry.strategy != "auto":
        return None
    from gradsched.tuning.config import AutoTuneConfig

    replay = bool(start.probe.get("host_work_hidden")) if start.probe else cfg.model.startswith("replay:")
    ddp_cap = _ddp_cap_mb(cfg)
    begin = replay_start(entry.options, ddp_cap) if replay else {}
    options = {"trial_share": 0, **begin, **(entry.options or {})}
    try:
        config = AutoTuneConfig.from_options(options)
    except Exception:  # noqa: BLE001 - the wrapper reports a bad option itself, as before
        return None
    bound_s = lower_bound_s(start.profile, start.cluster)["lower_bound_s"]
    if not config.adaptive:
        return auto_warmup(0, bound_s, entry.options, replay)
    ddp_options = {} if ddp_cap is None else {"bucket_cap_mb": ddp_cap, "first_bucket_mb": ddp_cap}
    speeds = (_simulated_s(config.initial, start, config.initial_options, torch_ddp=False),
              _simulated_s("ddp", start, ddp_options))  # the trials' baseline: the bench's ddp row
    iterations, seconds = _warmup_s(config, speeds, bound_s)
    full = dataclasses.replace(auto_warmup(iterations, seconds / iterations, entry.options, replay), start=begin)
    if full.in_situ or not replay or not may_shorten(entry.options):
        return full
    iterations, seconds = _warmup_s(AutoTuneConfig.from_options({**options, **SHORT_WARMUP}), speeds, bound_s)
    short = shorter(full, auto_warmup(iterations, seconds / iterations, entry.options, replay))
    return dataclasses.replace(short, start=begin)


def _warmup_s(config: Any, speeds: tuple[float, float], bound_s: float) -> tuple[int, float]:
    """Run-time ``auto``'s warm-up under ``config`` (an ``AutoTuneConfig``): its iterations and their wall seconds
    (:func:`warmup_estimate_s`), its initial plan and PyTorch DDP's default buckets at ``speeds``."""
    window = config.window_for(bound_s)
    iterations = config.tuning_iterations_for(window)
    first = initial_iterations(config.switch_iteration, config.trial_rounds, window, config.trials > 1)
    return iterations, warmup_estimate_s(iterations, first, speeds[0], speeds[1], bound_s)


def _simulated_s(strategy: str, start: _Start, options: dict[str, Any], torch_ddp: bool | None = None) -> float:
    """``strategy``'s simulated iteration on the bench's profile (with its runtime's costs: PyTorch DDP's for
    ``ddp`` unless ``torch_ddp`` is False, gradsched's executor's otherwise) and cluster.  0 where it cannot be
    planned (the estimate then uses the bound)."""
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    torch_ddp = strategy == "ddp" if torch_ddp is None else torch_ddp
    profile = with_runtime_costs(start.profile, start.probe, torch_ddp)
    try:
        plan = make_plan(strategy, profile, start.cluster, **options)
        return simulate(plan, profile, start.cluster, timeline=False).iteration_s
    except Exception:  # noqa: BLE001 - an estimate only; the bound stands in
        return 0.0


def auto_warm_up(tuner: Any, burst: Callable[[int, Callable[[], bool] | None], Any]) -> None:
    """Run-time ``auto``'s warm-up off the clock: profiling, the switch, the trials and every re-plan check that
    :attr:`~gradsched.torch.runtime.autotune.AutoTuner.tuning_iterations` schedules, in two bursts
    (``burst(steps, until)``: :func:`_burst`); the first plan sets the trials' window length (the same on every
    rank), hence a first burst to it.  The second stops early once the tuner has nothing left to decide
    (:attr:`~gradsched.torch.runtime.autotune.AutoTuner.done`, the same on every rank: settled on PyTorch's DDP,
    where no check follows; both 8-host runs settled at iteration 62 of 108 and ran the rest, about 25 s)."""
    first = tuner.config.switch_iteration + 1
    burst(first, None)
    burst(tuner.tuning_iterations - first, lambda: tuner.done)
    hold_checks(tuner, burst)


def hold_checks(tuner: Any, burst: Callable[[int, Callable[[], bool] | None], Any]) -> None:
    """No drift check in the counted rounds, which time the plan the warm-up settled on: one plan in the row
    (:meth:`~gradsched.torch.runtime.autotune.AutoTuner.hold_checks`).  A decision under way (a control window, a
    re-plan's measuring window and its plan's check: at most three windows of ``patience`` + 1 iterations) ends
    off the clock first.  runs12's ResNet-50 re-planned at iteration 128 and reverted at 134, inside its counted
    rounds (a check had measured 227 ms against 175 while other work loaded the machine): its median mixed two
    plans and a switch, -12.1% (docs/notes/2026-12-err12.md)."""
    tuner.hold_checks()
    if not tuner.done:
        burst(3 * (tuner.config.patience + 1), lambda: tuner.done)
        tuner.hold_checks()  # again: ``held_from``, where the rounds begin (the bench flags switches from there)
