"""Run-time ``auto``'s trials within a budget: what they cost so far, when the next window fits, who is out.

The trials measure plans that may be slower than what the user would run anyway (the
baseline: PyTorch's DDP at the user's bucket size).  On real CPU compute they ended on
PyTorch's DDP every time, after 60-140 iterations of slower plans, so a short job ran
entirely inside them.  Here what they cost is counted against the time trained so far:
a candidate's window runs only while the trials' cost, the window's expected cost
included, stays within ``share`` of the time since the first iteration; until then the
baseline runs (a *rest*, which costs nothing: it is what the job would run without
``auto``).  A job of any length then pays at most about ``share`` of its time for the
trials, on top of what profiling and planning cost before them (counted too).

Switches are priced: a plan's first iterations after a switch cost far more than its
steady ones (over loopback, mgwfbp's first three 0.99, 0.60 and 0.34 s, PyTorch's DDP's
after it 0.13, 0.18 and 0.07 s, against 0.03-0.07 s steady), and a job that ends soon
after a window never earns that back.  So the extra time of the baseline's first
iterations after a candidate (:meth:`TrialBudget.count_switch`) is counted as spent, and
a window's expected cost is what the windows so far cost on average, their switches in
and back included (:meth:`TrialBudget.window_cost_s`), or before any, the slowdown of
:data:`FIRST_SLOWDOWN` and :data:`SWITCH_ITERATIONS` baseline iterations per switch.
What is spent then stays within ``share`` of the time trained at every point, up to the
error of one estimate.

Torch-free plain functions of times, used by rank 0 of
:class:`gradsched.torch.runtime.autotune.AutoTuner`, which broadcasts what they decide.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

FIRST_SLOWDOWN = 0.2  # a candidate window's expected cost per baseline iteration before any was measured
MIN_SLOWDOWN = 0.05  # ... and at least this once some were (a window may measure faster by chance)
MAX_REST = 1_000_000  # iterations of one rest at most
SWITCH_ITERATIONS = 3  # a switch's expected extra time, in baseline iterations, before one was measured
SWITCH_BACK_ITERATIONS = 2  # the baseline's iterations after a candidate counted for the switch back


@dataclass(slots=True)
class TrialBudget:
    """Rank 0's account of what the trials cost, against the time trained since ``start_s``."""

    share: float  # the trials may cost this share of the time trained so far
    start_s: float  # when the first iteration started
    before_s: float = 0.0  # from the start to the first trial window: profiling, planning, the broadcast
    before_iterations: int = 0  # ... and how many iterations that was
    windows: list[tuple[float, int]] = field(default_factory=list)  # each candidate window: (seconds, iterations)
    switches: list[float] = field(default_factory=list)  # each switch back to the baseline: its extra seconds

    def spent_s(self, baseline_s: float) -> float:
        """What the trials cost so far beyond running the baseline (``baseline_s`` per iteration) throughout:
        the time before them and every candidate window, less as many baseline iterations, each at least 0.
        No credit for what measured faster: over loopback at load 25 a baseline window measured in a slow
        phase made the profiling look free, and three candidate windows ran inside a 100-step job."""
        before = max(0.0, self.before_s - self.before_iterations * baseline_s)
        return before + sum(max(0.0, seconds - n * baseline_s) for seconds, n in self.windows) + sum(self.switches)

    def count_switch(self, seconds: float, iterations: int, baseline_s: float) -> float:
        """Count a switch back to the baseline as spent: the extra time of its first ``iterations`` (``seconds``
        from the switch, the switching one included) over as many at ``baseline_s``, at least 0; return it."""
        extra = max(0.0, seconds - iterations * baseline_s) if baseline_s > 0 else 0.0
        self.switches.append(extra)
        return extra

    def window_cost_s(self, baseline_s: float, iterations: int) -> float:
        """Expected cost of the next candidate window of ``iterations`` (the switching one included), the switch
        back to the baseline after it included.

        Measured: the mean extra time of the windows so far, each scaled to ``iterations`` (at least
        :data:`MIN_SLOWDOWN` of the baseline), plus the mean switch back.  Before any window: the slowdown
        :data:`FIRST_SLOWDOWN` and :data:`SWITCH_ITERATIONS` baseline iterations for the switch in, and the
        switches back measured so far (after profiling), or as many iterations for it.  A mean, not a median:
        the warm-ups are few and long, and each one is spent."""
        if not baseline_s > 0:
            return 0.0
        back = statistics.fmean(self.switches) if self.switches else SWITCH_ITERATIONS * baseline_s
        floor = iterations * baseline_s * MIN_SLOWDOWN
        sized = [max(0.0, seconds - n * baseline_s) * iterations / n for seconds, n in self.windows if n > 0]
        if not sized:
            return iterations * baseline_s * FIRST_SLOWDOWN + SWITCH_ITERATIONS * baseline_s + back
        return max(floor, statistics.fmean(sized)) + back

    def rest_before(self, now_s: float, baseline_s: float, iterations: int) -> int:
        """Baseline iterations to run before a candidate window of ``iterations`` fits the budget (0: it fits now).

        It fits when the cost so far plus its expected cost (:meth:`window_cost_s`, switches included) is at most
        ``share`` of the time trained by its end; a rest adds baseline iterations (time, no cost) until it does."""
        if not baseline_s > 0:
            return 0
        expected = self.window_cost_s(baseline_s, iterations)
        short_s = (self.spent_s(baseline_s) + expected) / self.share - (now_s - self.start_s) - iterations * baseline_s
        return 0 if short_s <= 0 else min(MAX_REST, math.ceil(short_s / baseline_s))


def out_of_the_running(wins: Sequence[bool], rounds: int, resized: bool = False) -> bool:
    """Whether a trial candidate can no longer be kept (:func:`gradsched.calibration.fastest`'s rule), from its
    windows so far against the baseline's (``wins``: for a plan the baseline at another bucket size,
    ``resized``, faster at all; for any other, faster by ``min_gain``, :func:`gradsched.calibration.clear_wins`),
    of ``rounds`` in all: both must win most rounds, so a candidate is out once winning all the rest would not
    make a majority.  Its later windows would be spent for nothing."""
    del resized  # kept for callers: one rule for both, what counts as a win differs (the caller's ``wins``)
    losses = len(wins) - sum(bool(w) for w in wins)
    return 2 * (rounds - losses) <= rounds
