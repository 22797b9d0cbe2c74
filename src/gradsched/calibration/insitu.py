"""Measurements taken inside training -> a Profile and a Cluster (run-time ``auto``).

The tuner (:mod:`gradsched.torch.runtime.autotune`) traces a few iterations; these
functions turn the trace's events into what the planners read: a :class:`Profile` with
the medians of what was measured, and a :class:`Cluster` whose all-reduce line goes
through the operations' service times.  Pure functions of events: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.errors import InternalError
from gradsched.profile import Profile, TensorProfile
from gradsched.timeline import BACKWARD, COMM, FORWARD, UPDATE, WAIT, Event

MIN_SERVICE_S = 1e-6  # a service time below this is a completion observed late in a batch, not a measurement


def _args(e: Event) -> dict[str, Any]:
    """``e``'s arguments (none: empty)."""
    return e.args or {}


@dataclass
class StepRecord:
    """One training iteration as the tuner saw it (times on the tracer's clock)."""

    step: int
    trace_iteration: int
    start_s: float
    end_s: float | None = None
    measured: bool = True  # False: it began with a switch or a check (their cost is not the plan's)

    @property
    def duration_s(self) -> float:
        return (self.end_s or self.start_s) - self.start_s


def measured_profile(base: Profile, events: Iterable[Event], steps: list[StepRecord]) -> Profile:
    """A Profile of ``base``'s tensors with the medians of what ``steps`` measured.

    Ready times: each gradient's ready stamp minus its backward's start, median over
    the steps; layers (``base``'s) complete when their last tensor is ready, in the
    order of those medians, so :attr:`Profile.ready_s` reproduces them.  Forward: the
    wrapped forward minus the waits and updates inside it, shared out over layers in
    proportion to their backward time.  ``other_s``: the rest of the iteration that
    was neither forward, backward nor waiting for communication (loss, optimizer,
    data)."""
    if not steps:
        raise InternalError("no measured iteration to build a profile from")
    ready, fwd, bwd, other = _samples(base.num_tensors, events, steps)
    last = max(bwd)
    med = [statistics.median(r) if r else last for r in ready]  # never ready: an unused parameter, last
    layer = base.layer_of
    order, layer_bwd = _layer_backward(layer, med)
    total_bwd = sum(layer_bwd.values())
    fwd_s = statistics.median(fwd)
    first: set[int] = set()
    tensors = []
    for i, t in enumerate(base.tensors):
        lid = layer[i]
        if lid in first:
            tensors.append(TensorProfile(t.name, t.numel, t.bytes, 0.0, 0.0, lid))
            continue
        first.add(lid)
        share = layer_bwd[lid] / total_bwd if total_bwd > 0 else 1.0 / len(layer_bwd)
        tensors.append(TensorProfile(t.name, t.numel, t.bytes, fwd_s * share, layer_bwd[lid], lid))
    return Profile(base.model, tuple(tensors), tuple(order), statistics.median(other),
                   {"method": "in-situ", "iterations": len(bwd)})


def _samples(n: int, events: Iterable[Event], steps: list[StepRecord]
             ) -> tuple[list[list[float]], list[float], list[float], list[float]]:
    """Per step: each of the ``n`` tensors' ready time after its backward's start, the forward
    (less the waits and updates inside it), the backward, and the rest of the iteration."""
    backward: dict[int, list[Event]] = {s.trace_iteration: [] for s in steps}
    spans: list[Event] = []
    for e in events:
        it = (e.args or {}).get("iteration")
        if e.cat == BACKWARD and it in backward:
            backward[it].append(e)
        elif e.cat in (FORWARD, WAIT, UPDATE):
            spans.append(e)
    ready: list[list[float]] = [[] for _ in range(n)]
    fwd, bwd, other = [], [], []
    for s in steps:
        evs = backward[s.trace_iteration]
        if not evs:
            continue
        t0 = min(e.start_s for e in evs)
        end = max(e.start_s + e.dur_s for e in evs)
        for e in evs:
            ready[int(_args(e)["tensor"])].append(e.start_s + e.dur_s - t0)
        inside = [e for e in spans if s.start_s <= e.start_s < (s.end_s or end)]
        forward = [e for e in inside if e.cat == FORWARD and _args(e).get("iteration") == s.trace_iteration]
        f = sum(e.dur_s for e in forward)
        for e in inside:
            if e.cat in (WAIT, UPDATE) and any(x.start_s <= e.start_s < x.start_s + x.dur_s for x in forward):
                f -= e.dur_s
        waits = sum(e.dur_s for e in inside if e.cat == WAIT)
        fwd.append(max(f, 0.0))
        bwd.append(end - t0)
        other.append(max(s.duration_s - max(f, 0.0) - (end - t0) - waits, 0.0))
    if not bwd:
        raise InternalError("the measured iterations recorded no gradient (was tracing on?)")
    return ready, fwd, bwd, other


def _layer_backward(layer: tuple[int, ...], med: list[float]) -> tuple[list[int], dict[int, float]]:
    """The tensors' ready order (by median ready time) and each layer's backward time: from the
    previous layer's end to when its last tensor is ready."""
    n = len(med)
    order = sorted(range(n), key=lambda i: (med[i], i))
    layer_end: dict[int, float] = {}
    for i in range(n):
        layer_end[layer[i]] = max(layer_end.get(layer[i], 0.0), med[i])
    clock = 0.0
    layer_bwd: dict[int, float] = {}
    for i in order:
        lid = layer[i]
        if lid in layer_bwd:
            continue
        end_s = max(clock, layer_end[lid])
        layer_bwd[lid] = end_s - clock
        clock = end_s
    return order, layer_bwd

IssueTimes = dict[int, dict[int, float]]  # step -> operation -> issue time (tracer clock)


def issue_times(events: Iterable[Event], steps: list[StepRecord]) -> IssueTimes:
    """When this rank issued each operation of ``steps`` (what the other ranks send rank 0)."""
    step_of = {s.trace_iteration: s.step for s in steps}
    out: IssueTimes = {}
    for e in events:
        it = (e.args or {}).get("iteration")
        if e.cat == COMM and it in step_of:
            out.setdefault(step_of[it], {})[int(_args(e)["op"])] = e.start_s
    return out


def service_points(events: Iterable[Event], steps: list[StepRecord],
                   peers: list[IssueTimes] | None = None) -> list[tuple[int, float]]:
    """``(bytes, seconds)`` of every traced operation of ``steps``: its completion minus
    the later of its start and the previous operation's completion (one channel, in
    order).  An all-reduce starts when the *last* rank issues it, so with ``peers``
    (every rank's :func:`issue_times`) the start is the latest issue: a rank that
    runs behind is skew, not network time."""
    step_of = {s.trace_iteration: s.step for s in steps}
    per_iter: dict[int, list[Event]] = {}
    for e in events:
        if e.cat == COMM and e.args and e.args.get("iteration") in step_of:
            per_iter.setdefault(e.args["iteration"], []).append(e)
    out = []
    for it, evs in per_iter.items():
        prev_end = float("-inf")
        for e in sorted(evs, key=lambda e: e.start_s):
            start = e.start_s
            for peer in peers or ():
                start = max(start, peer.get(step_of[it], {}).get(int(_args(e)["op"]), start))
            end = e.start_s + e.dur_s
            service_s = end - max(start, prev_end)
            if service_s > MIN_SERVICE_S:  # else it finished right behind the one before: no information
                out.append((int(_args(e)["bytes"]), service_s))
            prev_end = max(prev_end, end)
    return out


def fit_cluster(points: dict[int, Iterable[float]], world_size: int, backend: str) -> Cluster:
    """An alpha-beta all-reduce line through the median time of each size (no table: in-situ
    medians are too noisy to interpolate between)."""
    medians = [(b, statistics.median(ts)) for b, ts in sorted(points.items()) if b > 0 and list(ts)]
    if len(medians) < 2:
        raise InternalError("fewer than two operation sizes were measured; nothing to fit a line to")
    return Cluster(world_size, {"allreduce": CollectiveCost.fit(medians, keep_table=False)}, backend,
                   extra={"method": "in-situ"})
