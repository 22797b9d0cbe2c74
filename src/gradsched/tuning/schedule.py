"""When run-time ``auto`` starts profiling: once the trials' budget pays for it (ski rental).

Profiling (``switch_iteration`` iterations on gradsched's executor with every operation
stamped), the start-up probes and planning cost 0.3-0.5 s on a loaded machine whatever
the job's length: 3-6% of a 100-step job.  With ``defer`` (the default where the trials are
budgeted and PyTorch's DDP is a candidate) ``auto`` starts on the baseline instead, PyTorch's
DDP at the user's bucket size, which costs nothing beyond what the user would run anyway,
and begins profiling only once its expected cost fits within ``share`` of the time trained
by its end: a short job runs DDP throughout, a long one pays about ``share`` for everything.
What profiling really cost is then counted against the trials' budget
(:class:`gradsched.calibration.TrialBudget`).

Plain functions of times; rank 0 of :class:`gradsched.torch.runtime.autotune.AutoTuner`
applies them and broadcasts the iteration they name.
"""

from __future__ import annotations

import math

from gradsched.calibration.budget import MAX_REST, SWITCH_ITERATIONS

PROFILE_SLOWDOWN = 0.5  # an iteration traced on the executor, over the baseline's (gpt2 over loopback: +20-90%)
PLANNING_S = 0.25  # planning, probes and the switches, before any was measured (0.05 s quiet, 0.3-0.5 s loaded)


def profiling_cost_s(baseline_s: float, iterations: int, planning_s: float = PLANNING_S) -> float:
    """Expected cost of profiling beyond running the baseline: ``iterations`` slower iterations, planning, and
    two switches (onto gradsched's executor and back to the baseline), :data:`SWITCH_ITERATIONS` baseline
    iterations each: a plan's first iterations cost several steady ones (:mod:`gradsched.calibration.budget`)."""
    base_s = max(0.0, baseline_s)
    return iterations * base_s * PROFILE_SLOWDOWN + planning_s + 2 * SWITCH_ITERATIONS * base_s


def profiling_rest(elapsed_s: float, baseline_s: float, share: float, cost_s: float, iterations: int) -> int:
    """Baseline iterations to run before profiling of ``iterations`` iterations and ``cost_s`` fits (0: now).

    It fits when ``cost_s`` is at most ``share`` of the time trained by its end: ``elapsed_s`` so far, the
    rest and the profiling iterations at ``baseline_s`` each.  No budget (``share`` 0) or no time measured:
    profile now, as without ``defer``."""
    if not share > 0 or not baseline_s > 0:
        return 0
    short_s = cost_s / share - elapsed_s - iterations * baseline_s
    return 0 if short_s <= 0 else min(MAX_REST, math.ceil(short_s / baseline_s))
