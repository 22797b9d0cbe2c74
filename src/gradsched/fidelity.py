"""Fidelity: a measured timeline against the simulator's prediction of the same plan.

Both timelines use the same events (see :mod:`gradsched.timeline`): communication
operations named ``opJ`` with ``args.op = J``; measured events also carry
``args.iteration``.  Each measured iteration is aligned at its backward start (the
simulator's t = 0), the first one (warm-up) is dropped, and per-operation start and
duration and per-iteration time are compared with the prediction by their medians.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from gradsched.errors import GradschedError
from gradsched.timeline import BACKWARD, COMM, Event, Timeline


@dataclass
class OpError:
    op: int
    predicted_start_s: float
    measured_start_s: float
    predicted_dur_s: float
    measured_dur_s: float

    @property
    def dur_error(self) -> float:
        """Relative error of the predicted duration (positive: predicted too long)."""
        return (self.predicted_dur_s - self.measured_dur_s) / self.measured_dur_s if self.measured_dur_s else 0.0


@dataclass
class FidelityReport:
    predicted_iteration_s: float
    measured_iteration_s: float  # median over measured iterations (warm-up dropped)
    measured_iterations: list[float] = field(default_factory=list)
    ops: list[OpError] = field(default_factory=list)

    @property
    def iteration_error(self) -> float:
        """Relative error of the predicted iteration time (positive: predicted too slow)."""
        return (self.predicted_iteration_s - self.measured_iteration_s) / self.measured_iteration_s

    @property
    def median_abs_op_dur_error(self) -> float:
        return statistics.median(abs(o.dur_error) for o in self.ops) if self.ops else 0.0

    @property
    def median_abs_op_end_error_s(self) -> float:
        if not self.ops:
            return 0.0
        return statistics.median(abs((o.predicted_start_s + o.predicted_dur_s) - (o.measured_start_s + o.measured_dur_s))
                                 for o in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {"predicted_iteration_s": self.predicted_iteration_s, "measured_iteration_s": self.measured_iteration_s,
                "iteration_error": self.iteration_error, "measured_iterations": self.measured_iterations,
                "median_abs_op_duration_error": self.median_abs_op_dur_error,
                "median_abs_op_end_error_s": self.median_abs_op_end_error_s,
                "operations": [{"op": o.op, "predicted_start_s": o.predicted_start_s, "measured_start_s": o.measured_start_s,
                                "predicted_dur_s": o.predicted_dur_s, "measured_dur_s": o.measured_dur_s,
                                "dur_error": o.dur_error} for o in self.ops]}


def measured_iterations(measured: Timeline, rank: int = 0) -> dict[int, list[Event]]:
    """Events of ``rank`` by iteration, each shifted so its backward starts at 0."""
    by_iter: dict[int, list[Event]] = {}
    for e in measured.events:
        if e.rank != rank or not e.args or "iteration" not in e.args:
            continue
        by_iter.setdefault(int(e.args["iteration"]), []).append(e)
    if not by_iter:
        raise GradschedError(f"the measured trace has no events of rank {rank} with an iteration number")
    out = {}
    for k, events in sorted(by_iter.items()):
        backward = [e.start_s for e in events if e.cat == BACKWARD]
        if not backward:
            continue
        t0 = min(backward)
        out[k] = [Event(e.name, e.cat, e.track, e.start_s - t0, e.dur_s, e.rank, e.args) for e in events]
    return out


def compare(measured: Timeline, predicted: Timeline, predicted_iteration_s: float, *, rank: int = 0,
            skip: int = 1) -> FidelityReport:
    """Compare per operation and per iteration (dropping the first ``skip`` iterations)."""
    iters = measured_iterations(measured, rank)
    keys = sorted(iters)[skip:] if len(iters) > skip else sorted(iters)
    starts = {k: min(e.start_s for e in measured.events if e.rank == rank and e.args and e.args.get("iteration") == k
                     and e.cat == BACKWARD) for k in iters}
    durations = [starts[b] - starts[a] for a, b in zip(sorted(starts), sorted(starts)[1:]) if a in keys]
    if not durations:
        raise GradschedError("the measured trace needs at least two traced iterations to measure an iteration time")
    pred_ops = {int(e.args["op"]): e for e in predicted.events if e.cat == COMM and e.args and "op" in e.args}
    meas_ops: dict[int, list[Event]] = {}
    for k in keys:
        for e in iters[k]:
            if e.cat == COMM and e.args and "op" in e.args:
                meas_ops.setdefault(int(e.args["op"]), []).append(e)
    ops = []
    for j in sorted(set(pred_ops) & set(meas_ops)):
        p, ms = pred_ops[j], meas_ops[j]
        ops.append(OpError(j, p.start_s, statistics.median(e.start_s for e in ms), p.dur_s,
                           statistics.median(e.dur_s for e in ms)))
    return FidelityReport(predicted_iteration_s, statistics.median(durations), durations, ops)


def aligned_iteration(measured: Timeline, rank: int = 0, iteration: int | None = None) -> Timeline:
    """One measured iteration of ``rank`` (default: the median-length one), backward at t = 0."""
    iters = measured_iterations(measured, rank)
    keys = sorted(iters)
    k = iteration if iteration is not None else keys[len(keys) // 2]
    if k not in iters:
        raise GradschedError(f"the measured trace has no iteration {k} (it has {keys[0]}..{keys[-1]})")
    return Timeline(events=iters[k], meta={"label": f"measured r{rank} it{k}"})
