"""When a bench's rounds stop: at ``--rounds``, or earlier once a stated rule on the medians holds.

Torch-free; read by the bench's worker (:mod:`gradsched.torch.jobs.bench_worker`) after every round.
A dilated replay's round takes minutes (googlenet-k80 at dilation 20, seven rows: about 4.5), so the
rounds, not the start-up, set how long a default bench takes.  The rule: after at least
``min_counted`` counted rounds, stop once the last round moved no row's median (over every counted
step so far) by more than ``tol`` of it.  Replayed on the step times of 33 earlier bench files at
``tol`` 1% (``docs/bench.md``), it kept every row's median within 1.6% and every speed-up over DDP
within 1.1% of what all the rounds gave.  ``tol`` 0 runs every round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

ROUND_TOL = 0.01  # --round-tol's default: a round that moves no row's median by more than 1% ends the rounds
MIN_COUNTED_ROUNDS = 2  # --min-rounds' default: counted rounds before the rule may stop them


def _pooled(rounds: list[list[float]]) -> float:
    return statistics.median([s for steps in rounds for s in steps])


@dataclass(frozen=True)
class StoppingRule:
    """Stop the rounds once the last one moved no row's median by more than ``tol`` (after ``min_counted``)."""

    tol: float  # 0: never early
    min_counted: int
    warmup: int  # rounds not counted

    def moves(self, times: list[list[list[float]]]) -> list[float]:
        """After each counted round from the second, the largest relative move of any row's median
        (``times``: per row, per round, per step)."""
        rounds = min(len(t) for t in times)
        return [max(abs(_pooled(t[self.warmup:r]) / _pooled(t[self.warmup:r - 1]) - 1) for t in times)
                for r in range(self.warmup + 2, rounds + 1)]

    def settled(self, times: list[list[list[float]]]) -> bool:
        """Whether the rounds so far (``times``: per row, per round, per step) may end the rounds."""
        counted = min(len(t) for t in times) - self.warmup
        if self.tol <= 0 or counted < max(self.min_counted, 2):
            return False
        return self.moves(times)[-1] <= self.tol

    def record(self, times: list[list[list[float]]], max_rounds: int) -> dict[str, Any]:
        """What the JSON says of the rule and how the rounds ended."""
        run = min(len(t) for t in times)
        return {"rule": "stop once the last counted round moved no row's median by more than tol of it, "
                        "after min_counted counted rounds (tol 0: every round)",
                "tol": self.tol, "min_counted": self.min_counted, "max_rounds": max_rounds, "rounds_run": run,
                "moves": self.moves(times), "stopped_early": run < max_rounds}
