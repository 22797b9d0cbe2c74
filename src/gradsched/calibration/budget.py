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


@dataclass(slots=True)
class TrialBudget:
    """Rank 0's account of what the trials cost, against the time trained since ``start_s``."""

    share: float  # the trials may cost this share of the time trained so far
    start_s: float  # when the first iteration started
    before_s: float = 0.0  # from the start to the first trial window: profiling, planning, the broadcast
    before_iterations: int = 0  # ... and how many iterations that was
    windows: list[tuple[float, int]] = field(default_factory=list)  # each candidate window: (seconds, iterations)

    def spent_s(self, baseline_s: float) -> float:
        """What the trials cost so far beyond running the baseline (``baseline_s`` per iteration) throughout:
        the time before them and every candidate window, less as many baseline iterations, each at least 0.
        No credit for what measured faster: over loopback at load 25 a baseline window measured in a slow
        phase made the profiling look free, and three candidate windows ran inside a 100-step job."""
        before = max(0.0, self.before_s - self.before_iterations * baseline_s)
        return before + sum(max(0.0, seconds - n * baseline_s) for seconds, n in self.windows)

    def slowdown(self, baseline_s: float) -> float:
        """Expected extra time of a candidate iteration over the baseline's, as a fraction of it: the median of
        the windows so far (at least :data:`MIN_SLOWDOWN`), :data:`FIRST_SLOWDOWN` before any."""
        if not self.windows or not baseline_s > 0:
            return FIRST_SLOWDOWN
        return max(MIN_SLOWDOWN, statistics.median(s / (n * baseline_s) - 1 for s, n in self.windows if n > 0))

    def rest_before(self, now_s: float, baseline_s: float, iterations: int) -> int:
        """Baseline iterations to run before a candidate window of ``iterations`` fits the budget (0: it fits now).

        It fits when the cost so far plus its expected cost is at most ``share`` of the time trained by its end;
        a rest adds baseline iterations (time, no cost) until it does."""
        if not baseline_s > 0:
            return 0
        expected = iterations * baseline_s * self.slowdown(baseline_s)
        short_s = (self.spent_s(baseline_s) + expected) / self.share - (now_s - self.start_s) - iterations * baseline_s
        return 0 if short_s <= 0 else min(MAX_REST, math.ceil(short_s / baseline_s))


def out_of_the_running(wins: Sequence[bool], rounds: int, resized: bool) -> bool:
    """Whether a trial candidate can no longer be kept (:func:`gradsched.calibration.fastest`'s rule), from its
    windows so far against the baseline's (``wins``), of ``rounds`` in all: a plan must beat the baseline in
    every round, so one lost is out; the baseline at another bucket size (``resized``) in most of them, so it
    is out once winning all the rest would not make a majority.  Its later windows would be spent for nothing."""
    losses = len(wins) - sum(bool(w) for w in wins)
    if resized:
        return 2 * (rounds - losses) <= rounds
    return losses > 0
