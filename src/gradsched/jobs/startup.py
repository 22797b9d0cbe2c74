"""How long a bench's start-up may take, and what it leaves out to stay within it.

Torch-free rules read by the bench's worker (:mod:`gradsched.torch.jobs.bench_worker`).
Start-up is everything before the counted rounds but run-time ``auto``'s warm-up: profiling,
the network table, the start-up probes and building the rows.  ``auto``'s warm-up is its own
phase, part of what ``auto`` costs (its trials are what run-time ``auto`` is), with its own
budget, :data:`AUTO_WARMUP_S`.  A dilated replay
(``gradsched bench --replay P --dilate K``) runs every step K times slower, so a start-up
counted in steps grows with K; these rules count it in wall seconds instead:

- **Probes' floors** (:func:`probe_floor`): a start-up probe keeps its fewest repetitions
  only where they fit :data:`FULL_FLOOR_S`; otherwise one (the contention probe) or none
  (the runtimes' overhead probe).  Both are sampled again between the rounds and the
  predictions use the medians over every sample; a dilated replay's runtime overheads
  are host time, which weighs K times less against its dilated steps.
- **Run-time auto's warm-up** (:func:`auto_warmup`): ``auto`` tunes itself in situ
  (profiling, switch, trials, re-plan checks: ``tuning_iterations``, docs/autotune.md),
  several hundred iterations; on a replay it profiles under DDP's buckets (:func:`replay_start`).
  On a replay, it does so off the clock only where those
  iterations' estimated wall time fits :data:`AUTO_WARMUP_S` (whatever the start-up took:
  googlenet-k80 at dilation 1, about 2 minutes, runs in situ; at dilation 20, some 40 minutes,
  does not); otherwise ``auto`` is planned
  once at start-up from the profile and cluster the bench measured (``adaptive=false``,
  as every other gradsched row is), and the bench says so.  ``--opt auto.adaptive=true``
  keeps the warm-up in situ whatever it costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

STARTUP_TARGET_S = 120.0  # a replay's start-up: at most about this long in wall seconds, at any dilation
AUTO_WARMUP_S = 300.0  # run-time auto's warm-up on a replay: in situ where it fits this many wall seconds
AUTO_WARMUP_PHASE = "auto warm-up"  # its phase in the bench's JSON (seconds 0 where auto was planned at start-up)
FULL_FLOOR_S = 30.0  # a start-up probe keeps its floor of repetitions only where they take at most this long
# run-time auto's short warm-up, where its full one would not fit AUTO_WARMUP_S (a replay whose steps take seconds):
# trial windows of 2 measured iterations (3 rounds: a median of 6 per candidate; a replay's compute is waited out,
# its steps vary little), 2 run-off rounds, checks over 5 iterations, and 5 candidates (the plan chosen, PyTorch
# DDP at the bench's bucket size, the 3 others predicted fastest) where up to 9 take turns: 108 iterations where
# the full one runs 281
SHORT_WARMUP: dict[str, Any] = {"trial_iterations": 6, "runoff_rounds": 2, "patience": 5, "candidates": 5}


def probe_floor(floor: int, per_rep_s: float, least: int, within_s: float = FULL_FLOOR_S) -> int:
    """The fewest repetitions a start-up probe runs: ``floor``, or ``least`` where ``floor`` repetitions of
    ``per_rep_s`` each would take more than ``within_s`` (a dilated replay's steps take seconds)."""
    if not math.isfinite(per_rep_s) or floor * per_rep_s > within_s:
        return min(floor, least)
    return floor


@dataclass(frozen=True)
class AutoWarmup:
    """Whether run-time ``auto`` warms up in situ (off the clock) or is planned at start-up, and why."""

    in_situ: bool
    estimated_s: float  # its warm-up's wall time: warmup_estimate_s
    budget_s: float  # its own budget, AUTO_WARMUP_S (inf: the user set adaptive)
    iterations: int
    shortened: dict[str, Any] = field(default_factory=dict)  # SHORT_WARMUP where the short warm-up runs
    start: dict[str, Any] = field(default_factory=dict)  # replay_start: the plan its profiling runs, where set

    def to_dict(self) -> dict[str, Any]:
        return {"mode": "run-time (warm-up off the clock)" if self.in_situ else "planned at start-up",
                "estimated_s": self.estimated_s, "iterations": self.iterations,
                "budget_s": self.budget_s if math.isfinite(self.budget_s) else None,  # None: adaptive given
                **({"shortened": self.shortened} if self.shortened else {}),
                **({"start": self.start} if self.start else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AutoWarmup":
        return cls(d.get("mode") != "planned at start-up", float(d.get("estimated_s", 0.0)),
                   math.inf if d.get("budget_s") is None else float(d["budget_s"]), int(d.get("iterations", 0)),
                   dict(d.get("shortened") or {}), dict(d.get("start") or {}))

    def describe(self) -> str:
        """One line for the bench's output (wall seconds)."""
        if self.in_situ and self.shortened:
            return (f"auto tuned at run time, a short warm-up ({self.iterations} iterations, about "
                    f"{self.estimated_s:.0f} s: {', '.join(f'{k}={v}' for k, v in self.shortened.items())}) off "
                    f"the clock; its full one would not fit its {self.budget_s:.0f} s budget")
        if self.in_situ:
            return f"auto tuned at run time, its warm-up ({self.iterations} iterations) off the clock"
        if not math.isfinite(self.budget_s):
            return "auto planned at start-up from the bench's profile and cluster (adaptive=false, as asked)"
        return (f"auto planned at start-up from the bench's profile and cluster: its run-time warm-up "
                f"({self.iterations} iterations, about {self.estimated_s:.0f} s of wall time) would not fit its "
                f"{max(0.0, self.budget_s):.0f} s budget; --opt auto.adaptive=true tunes it at run time")


def warmup_estimate_s(iterations: int, initial_iterations: int, initial_s: float, typical_s: float,
                      bound_s: float) -> float:
    """Wall seconds of run-time ``auto``'s warm-up of ``iterations``: ``initial_iterations`` of them (profiling
    under its initial plan, ``wfbp`` or on a replay DDP's buckets (:func:`replay_start`), and that plan's trial
    windows) at ``initial_s`` each, the others at
    ``typical_s`` (PyTorch DDP's default buckets: the trials' baseline, which most candidates run near), none
    below ``bound_s`` (the lower bound, what the estimate was before).  The bound alone left out that the
    trials run at a plan's speed, not the bound's, and that ``wfbp`` pays a per-message latency per tensor:
    DenseNet-201 on 8 hosts (about 600 tensors) ran ``wfbp`` at 11x the bound, and its warm-up took 588 s
    against 162 s estimated (docs/notes/2026-12-bench-runs.md)."""
    first = min(initial_iterations, iterations)
    return first * max(initial_s, bound_s) + (iterations - first) * max(typical_s, bound_s)


def initial_iterations(switch_iteration: int, trial_rounds: int, window: int, trials: bool) -> int:
    """Iterations run-time ``auto`` runs its initial plan in its warm-up: the profiling ones (to the switch, and
    the warm-up step before) and, where it tries plans, one window per trial round (each window with its first
    iteration, uncounted: ``tuning_iterations_for``)."""
    return switch_iteration + 1 + (trial_rounds * (window + 1) if trials else 0)


def auto_warmup(iterations: int, iteration_s: float, options: dict[str, Any] | None, replay: bool,
                budget_s: float = AUTO_WARMUP_S) -> AutoWarmup:
    """What run-time ``auto`` does in a bench: warm up in situ unless the model is replayed, its ``iterations``
    of about ``iteration_s`` each on average (:func:`warmup_estimate_s` / ``iterations``) exceed ``budget_s``
    (its own, whatever the start-up took), and the user
    did not set ``adaptive`` (given: as given)."""
    estimated = iterations * max(iteration_s, 0.0)
    if options and "adaptive" in options:
        return AutoWarmup(str(options["adaptive"]).strip().lower() not in ("false", "0", "no", "off"),
                          estimated, math.inf, iterations)
    return AutoWarmup(not replay or estimated <= budget_s, estimated, budget_s, iterations)


def may_shorten(options: dict[str, Any] | None) -> bool:
    """Whether run-time ``auto``'s warm-up may be shortened (:data:`SHORT_WARMUP`) where its full one would not
    fit: unless the user set ``adaptive`` or any of the settings it changes."""
    return not set(options or {}) & {"adaptive", *SHORT_WARMUP}


def shorter(full: AutoWarmup, short: AutoWarmup) -> AutoWarmup:
    """The warm-up a replay's ``auto`` runs: its ``full`` one where it runs in situ; else the ``short`` one where
    that fits (recorded with :data:`SHORT_WARMUP`); else ``full`` (planned at start-up)."""
    if full.in_situ or not short.in_situ:
        return full
    return AutoWarmup(True, short.estimated_s, short.budget_s, short.iterations, dict(SHORT_WARMUP))


def replay_start(options: dict[str, Any] | None, ddp_cap_mb: float | None) -> dict[str, Any]:
    """The plan run-time ``auto`` profiles under on a replay: DDP's buckets on gradsched's executor, as the bench's
    ``ddp`` row makes them (``ddp_cap_mb``: its ``bucket_cap_mb``, which caps DDP's first bucket too; None: DDP's
    default), instead of ``wfbp``, whose message per tensor ran 2-15 s an iteration on 8 emulated hosts
    (Inception-v4, 449 tensors; DenseNet-201, 604) where DDP's buckets run near the trials' baseline.  Profiling
    needs no more: the executor stamps every gradient's ready time whatever its buckets, and the bench gives
    ``auto`` the cluster it measured.  Empty where the user set ``initial`` or ``initial_options``."""
    if set(options or {}) & {"initial", "initial_options"}:
        return {}
    caps = {} if ddp_cap_mb is None else {"bucket_cap_mb": ddp_cap_mb, "first_bucket_mb": ddp_cap_mb}
    return {"initial": "ddp", "initial_options": caps}


def auto_options(options: dict[str, Any] | None, warmup: AutoWarmup) -> dict[str, Any]:
    """``auto``'s plan options in the bench: its trials back to back (``trial_share=0``: the rounds time the
    plan it settles on), the plan it profiles under (:func:`replay_start`) and the short warm-up's settings where
    it runs that, and, where it is planned at start-up, ``adaptive=false``."""
    out = {"trial_share": 0, **(warmup.start if warmup.in_situ else {}), **warmup.shortened, **(options or {})}
    if not warmup.in_situ:
        out.setdefault("adaptive", False)
    return out


def overhead_probe_s(compute_s: float, runs_s: list[float], steps: int) -> tuple[float, float]:
    """The runtimes' overhead probe on a replay, in wall seconds: one rotation (the compute-only run at
    ``compute_s`` and each runtime's run at its step, ``runs_s``, each ``steps`` + 2 steps) and what precedes
    the first rotation (each runtime's row primed with one step, and the warm-up rotation, whose compute is
    skipped: at most a rotation).  Each runtime's step is its plan's simulated iteration
    (:func:`runtime_steps_s`), which moves every gradient, not the compute alone (BERT-Base on 8 emulated hosts:
    a rotation of about 42 s, not 13)."""
    rotation_s = (steps + 2) * (compute_s + sum(max(s, compute_s) for s in runs_s))
    return rotation_s, sum(runs_s) + rotation_s


def runtime_steps_s(profile: Any, cluster: Any, probe: dict[str, Any], runs: list[tuple[str, bool]]) -> list[float]:
    """Each of ``runs`` (a strategy, and whether PyTorch DDP runs it) simulated on ``profile`` (a
    :class:`~gradsched.profile.Profile`) with its runtime's costs from ``probe`` and ``cluster``: its iteration
    in the profile's seconds; where it cannot be planned, the compute and an all-reduce of every gradient."""
    from gradsched.calibration import with_runtime_costs
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    out = []
    for strategy, torch_ddp in runs:
        costed = with_runtime_costs(profile, probe, torch_ddp)
        try:
            out.append(simulate(make_plan(strategy, costed, cluster), costed, cluster, timeline=False).iteration_s)
        except Exception:  # noqa: BLE001 - an estimate only
            out.append(profile.compute_s + cluster.cost("allreduce").time_s(profile.total_bytes))
    return out
