"""An independent oracle of the ``usbyte`` planner: the planner as it was before its speed-ups
(commit 5863394), kept verbatim.  It shares no code with ``gradsched.planners.usbyte`` (only the
formats and the simulator's ``EPS_S``): every try is modelled from the start by one plain loop,
without the fast model's resumed tries, closed-form phase 2, bisection, numpy tables or
compiled kernel, so an error in those shows up as a different plan.
tests/test_usbyte_rules.py checks that the fast planner with ``extend=False, window="block"``,
``patience=0`` and a cap returns exactly this plan.  Not a strategy (nothing registers it).

The planner's model and the simulator are not one code: the search models a hundred or more
schedules per plan, each resumed where a promotion changes it and priced in closed form,
where one run of the simulator's general loop costs about as much as planning does; they
are tested equal instead (tests/test_usbyte_rules.py: any priority order's modelled blocks
replay in the simulator to 1e-12)."""

from __future__ import annotations

import bisect
import heapq
import math
import numbers
from dataclasses import dataclass

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.errors import GradschedError
from gradsched.plan import Operation, Plan, Slice
from gradsched.profile import Profile
from gradsched.sim.engine import EPS_S  # the simulator's simultaneity: the plan must replay exactly

DEFAULT_UNIT_BYTES = 4 << 20
DEFAULT_MAX_EVALUATIONS = 24


@dataclass(frozen=True)
class _Layer:
    """One layer's tensors of one element size: the unit US-Byte schedules."""

    tensors: tuple[int, ...]  # forward order
    numel: int
    element_bytes: int
    ready_s: float
    layer: int  # profile layer id (for next-forward gating)
    forward_rank: int  # position of its first tensor in forward order


@dataclass
class Schedule:
    """What the model predicts for one priority order."""

    iteration_s: float
    blocks: list[tuple[int, int, int, float, float]]  # (layer unit, first element, end element, start_s, end_s)


class _Model:
    """US-Byte's phase 1 + phase 2 for a given priority order, and the iteration it gives."""

    def __init__(self, profile: Profile, cost: CollectiveCost, unit_bytes: int) -> None:
        self.profile = profile
        self.cost = cost
        ready = profile.ready_s
        key_of: dict[tuple[int, int], list[int]] = {}
        for i in profile.order:
            key_of.setdefault((profile.layer_of[i], profile.tensors[i].element_bytes), []).append(i)
        units = []
        for (lid, eb), members in key_of.items():
            members.sort()
            units.append(_Layer(tuple(members), sum(profile.tensors[i].numel for i in members), eb,
                                max(ready[i] for i in members), lid, members[0]))
        self.units = units  # in order of first appearance in the ready order
        self.by_ready = sorted(range(len(units)), key=lambda u: (units[u].ready_s, u))
        self.unit_elems = [max(1, unit_bytes // u.element_bytes) for u in units]
        self.ready_sorted = [units[u].ready_s for u in self.by_ready]
        self.elem = [u.element_bytes for u in units]
        self.backward_end_s = max(ready)
        # next-forward gating: layers in forward order with their forward and update time
        fwd: dict[int, list[float]] = {}
        for t, lid in zip(profile.tensors, profile.layer_of):
            acc = fwd.setdefault(lid, [0.0, 0.0])
            acc[0] += t.forward_s
            acc[1] += t.update_s
        self.forward_layers = [(lid, f, upd) for lid, (f, upd) in fwd.items()]
        self.alpha_s = cost.alpha_s
        self.beta_s = cost.beta_s_per_byte
        self.table = ([float(x) for x, _ in cost.points], [float(y) for _, y in cost.points]) if cost.points else None

    def time_s(self, nbytes: int) -> float:
        """``cost.time_s`` bit for bit, without numpy's per-call overhead (the search calls it
        once per block per evaluation): the simulator must see exactly the modelled times."""
        if nbytes <= 0:
            return 0.0
        if self.table is not None:
            xs, ys = self.table
            if xs[0] <= nbytes <= xs[-1]:
                return float(_interp(nbytes, xs, ys) * self.cost._table_scale(nbytes))
        return self.alpha_s + self.beta_s * nbytes

    def run(self, rank: list[int]) -> Schedule:
        """Model the schedule where unit ``u`` has priority number ``rank[u]`` (lower first).

        The clock moves like the simulator's (to the next ready time or the moment the
        channel frees, events within ``EPS_S`` simultaneous), so that priority
        scheduling of the emitted plan replays these blocks exactly."""
        by_ready, ready, elem, unit_elems = self.by_ready, self.ready_sorted, self.elem, self.unit_elems
        n = len(by_ready)
        left = [u.numel for u in self.units]
        sent = [0] * n
        alpha, beta, time_s = self.alpha_s, self.beta_s, self.time_s
        push, pop = heapq.heappush, heapq.heappop
        heap: list[tuple[int, int]] = []
        blocks: list[tuple[int, int, int, float, float]] = []
        nxt = 0
        t = 0.0
        free = 0.0  # when the channel finishes its current block
        while True:
            while nxt < n and ready[nxt] <= t + EPS_S:
                u = by_ready[nxt]
                push(heap, (rank[u], u))
                nxt += 1
            if heap and free <= t + EPS_S:
                start = t if t > free else free
                u = heap[0][1]
                eb = elem[u]
                rest = left[u]
                if nxt < n:  # phase 1: fill the gap before the next gradient is ready
                    gap = ready[nxt] - start
                    unit = unit_elems[u]
                    if gap < alpha:
                        elems = unit
                    elif beta > 0 and gap < time_s(rest * eb):
                        elems = max(1, math.ceil((gap - alpha) / (beta * unit * eb))) * unit
                    else:
                        elems = rest
                    if elems > rest:
                        elems = rest
                else:  # phase 2: everything left, highest priority first
                    elems = rest
                free = start + time_s(elems * eb)
                done = sent[u]
                blocks.append((u, done, done + elems, start, free))
                sent[u] = done + elems
                left[u] = rest - elems
                if rest == elems:
                    pop(heap)
                continue
            if not heap and nxt == n:
                break
            # advance to the next moment something can change
            t_next = ready[nxt] if nxt < n else free
            if free > t and free < t_next:
                t_next = free
            t = t_next
        return Schedule(self.iteration_s(blocks), blocks)

    def iteration_s(self, blocks: list[tuple[int, int, int, float, float]]) -> float:
        done: dict[int, float] = {}
        for u, _, _, _, end in blocks:
            lid = self.units[u].layer
            if end > done.get(lid, 0.0):
                done[lid] = end
        t = self.backward_end_s + self.profile.other_s
        for lid, fwd, upd in self.forward_layers:
            t = max(t, done.get(lid, 0.0)) + upd + fwd
        return t


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """``np.interp`` for one ``x`` inside ``[xs[0], xs[-1]]``, with numpy's arithmetic."""
    if x == xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x) - 1
    if x == xs[j]:
        return ys[j]
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return slope * (x - xs[j]) + ys[j]


def _first_blocks(schedule: Schedule) -> dict[int, tuple[int, int, int, float, float]]:
    first: dict[int, tuple[int, int, int, float, float]] = {}
    for b in schedule.blocks:
        first.setdefault(b[0], b)
    return first


def search_priorities(model: _Model, max_evaluations: int) -> tuple[list[int], Schedule, int]:
    """Front-first priorities improved by US-Byte's promotion search; returns (rank, schedule, evaluations)."""
    units = model.units
    n = len(units)
    order = sorted(range(n), key=lambda u: (units[u].forward_rank, units[u].element_bytes))
    rank = [0] * n
    for r, u in enumerate(order):
        rank[u] = r
    best = model.run(rank)
    evaluations = 1
    first = _first_blocks(best)
    ready = model.ready_sorted
    for u in sorted(range(n), key=lambda u: rank[u], reverse=True):  # output layer first
        if evaluations >= max_evaluations:
            break
        _, lo, hi, start_s, end_s = first[u]
        if hi - lo >= units[u].numel:
            continue  # sent whole in one block: nothing to keep going
        window = model.by_ready[bisect.bisect_right(ready, start_s):bisect.bisect_right(ready, end_s)]
        rivals = [v for v in window if rank[v] < rank[u]]
        if not rivals:
            continue
        target = min(rank[v] for v in rivals)
        trial_order = [v for v in order if v != u]
        trial_order.insert(target, u)
        trial_rank = [0] * n
        for r, v in enumerate(trial_order):
            trial_rank[v] = r
        trial = model.run(trial_rank)
        evaluations += 1
        if trial.iteration_s < best.iteration_s * (1 - 1e-12):
            best, rank, order = trial, trial_rank, trial_order
            first = _first_blocks(best)
    return rank, best, evaluations


def build_plan(model: _Model, rank: list[int], schedule: Schedule, options: dict) -> Plan:
    profile = model.profile
    ops = []
    for u, lo, hi, _, _ in schedule.blocks:
        slices = []
        offset = 0
        for i in model.units[u].tensors:
            numel = profile.tensors[i].numel
            a, b = max(lo, offset), min(hi, offset + numel)
            if a < b:
                slices.append(Slice(i, a - offset, b - offset))
            offset += numel
        ops.append(Operation(tuple(slices), priority=rank[u]))
    return Plan("usbyte", tuple(ops), profile.fingerprint, profile.model, options,
                scheduling="priority", overlap_forward=True)


def predict(profile: Profile, cluster: Cluster, unit_bytes: int = DEFAULT_UNIT_BYTES,
            max_evaluations: int = DEFAULT_MAX_EVALUATIONS) -> tuple[Plan, Schedule, int]:
    """The US-Byte plan, the schedule its model predicts, and how many schedules it modelled."""
    if not (isinstance(unit_bytes, numbers.Integral) and unit_bytes > 0):
        raise GradschedError(f"usbyte: unit_bytes must be a positive whole number of bytes, got {unit_bytes!r}")
    if not (isinstance(max_evaluations, numbers.Integral) and max_evaluations >= 1):
        raise GradschedError(f"usbyte: max_evaluations must be at least 1 (1 = front-first, no search), "
                             f"got {max_evaluations!r}")
    unit_bytes, max_evaluations = int(unit_bytes), int(max_evaluations)
    model = _Model(profile, cluster.cost("allreduce"), unit_bytes)
    rank, schedule, evaluations = search_priorities(model, max_evaluations)
    plan_ = build_plan(model, rank, schedule, {"unit_bytes": unit_bytes, "max_evaluations": max_evaluations})
    return plan_, schedule, evaluations
