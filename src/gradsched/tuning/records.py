"""What run-time ``auto`` did, as it reports it: its plan switches and its checks (torch-free records)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Switch:
    """One plan change: from the start of ``iteration`` on, ``plan_hash`` runs."""

    iteration: int
    strategy: str  # what ran from then on (for auto: the strategy auto chose)
    plan_hash: str
    predicted_iteration_s: float | None  # None for the initial, unplanned default
    measured_before_s: float | None  # median measured under the previous plan
    reason: str  # "initial" | "profiled" | "trial" | "fastest" | "replan" | "revert"

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
    replan: bool
    expected_s: float | None = None  # what the measurement was compared with (see AutoTuner._expected_s)


# --------------------------------------------------------------------------- the tuner
