"""What run-time ``auto`` did and measured (torch-free records): its plan switches and checks, as it reports them,
and what each plan measured (:class:`PlanMeasurements`, rank 0's bookkeeping the decisions are made from)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gradsched.calibration.decisions import clear_wins
from gradsched.tuning.config import SAMPLES_KEPT


@dataclass(frozen=True)
class Switch:
    """One plan change: from the start of ``iteration`` on, ``plan_hash`` runs."""

    iteration: int
    strategy: str  # what ran from then on (for auto: the strategy auto chose)
    plan_hash: str
    predicted_iteration_s: float | None  # None for the initial, unplanned default
    measured_before_s: float | None  # median measured under the previous plan
    reason: str  # "initial" | "profiled" | "trial" | "fastest" | "replan" | "revert" | "control" | "back"

    def to_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "strategy": self.strategy, "plan_hash": self.plan_hash,
                "predicted_iteration_s": self.predicted_iteration_s, "measured_before_s": self.measured_before_s,
                "reason": self.reason}


@dataclass(frozen=True)
class Check:
    """One comparison of measured and expected iteration time (rank 0's measurement)."""

    iteration: int
    measured_s: float
    predicted_s: float  # the simulator's prediction for the current plan
    replan: bool  # the check re-planned or reverted
    expected_s: float | None = None  # what the measurement was compared with (see AutoTuner._expected_s)
    action: str = ""  # "keep" | "replan" | "revert" | "control" (a control plan measured next: AutoTuner._control)


@dataclass(slots=True)
class PlanMeasurements:
    """Rank 0's measurements per plan (by hash): iteration times, each trial window's median, and for a candidate
    of budgeted trials the baseline's window median before each of its windows.

    A plan's measurement is the median of its latest ``kept`` iteration times (:meth:`record`); what it measured
    before its turns in the trials is forgotten (:meth:`forget`), so that only windows taken in turn count."""

    kept: int = SAMPLES_KEPT
    samples: dict[str, list[float]] = field(default_factory=dict)  # the latest `kept` iteration times
    measured: dict[str, float] = field(default_factory=dict)  # ... their median
    rounds: dict[str, list[float]] = field(default_factory=dict)  # each trial window's median, round by round
    paired: dict[str, list[float]] = field(default_factory=dict)  # the baseline's window before each of them
    settled: dict[str, float] = field(default_factory=dict)  # each plan's measurement when the trials were decided

    def record(self, plan_hash: str, durations_s: Iterable[float]) -> None:
        """Add iteration times measured under ``plan_hash``; its measurement becomes the median of the latest."""
        samples = self.samples.setdefault(plan_hash, [])
        samples.extend(durations_s)
        del samples[:-self.kept]
        if samples:
            self.measured[plan_hash] = statistics.median(samples)

    def add_round(self, plan_hash: str, median_s: float, baseline_s: float | None = None) -> None:
        """A trial window's median; ``baseline_s``: the baseline's window before it (a candidate's, budgeted)."""
        self.rounds.setdefault(plan_hash, []).append(median_s)
        if baseline_s is not None:
            self.paired.setdefault(plan_hash, []).append(baseline_s)

    def forget(self, plan_hash: str) -> None:
        """Drop what ``plan_hash`` measured (its samples, median and rounds) before it takes its turns."""
        self.samples.pop(plan_hash, None)
        self.measured.pop(plan_hash, None)
        self.rounds.pop(plan_hash, None)

    def settle(self) -> None:
        """The trials are decided: what each plan measured in them, taking turns, is what it is compared by
        from now on (:meth:`compared`)."""
        self.settled = dict(self.measured)

    def compared(self) -> dict[str, float]:
        """Each plan's measurement as a check compares plans (:func:`gradsched.calibration.decide`): a plan that
        ran in the trials by what it measured there, one planned since (a re-plan's) by all it measured.

        Only the plan running adds iterations after the trials, each window in whatever phase the machine is
        in, with no other plan measured beside it; mixed into its median, they made it lose to plans measured
        in the trials' turns alone.  On 2 testbed hosts at load 15-20 (googlenet-k80, 1 Gbit/s) the trials
        kept usbyte (647 ms against bytescheduler's 692 ms), one slow check window (856 ms) led to a re-plan
        whose plan did not beat them, and the revert went to bytescheduler, which then ran 915 ms in the
        bench's rounds beside usbyte's 729 ms (benchmarks/results/bench_replay_googlenet_k80_2h_dear.json)."""
        return {h: self.settled.get(h, t) for h, t in self.measured.items()}

    def taken(self, candidates: Iterable[str]) -> dict[str, float]:
        """The measurement of each of ``candidates`` measured so far."""
        return {h: self.measured[h] for h in candidates if h in self.measured}

    def rounds_of(self, plans: Iterable[str]) -> dict[str, list[float]]:
        """Each plan's window medians, round by round (copies)."""
        return {h: list(self.rounds.get(h, [])) for h in plans}

    def wins(self, plan_hash: str, margin: float = 0.0) -> list[bool]:
        """Whether each of a candidate's windows measured faster than the baseline's window before it, by
        ``margin`` (:func:`~gradsched.calibration.clear_wins`)."""
        return clear_wins(self.rounds.get(plan_hash, []), self.paired.get(plan_hash, []), margin)
