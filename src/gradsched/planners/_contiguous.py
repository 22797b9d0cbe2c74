"""``usbyte``'s option ``groups``: whole groups contiguous in ready order, by forward-order priority.

US-Byte's ordering (each operation's priority its place in forward order, ``scheduling="priority"``, the next
forward of a layer waiting only for the operations that hold its gradients) with MG-WFBP's and ``optimal``'s kind
of grouping (tensors cut, in the order their gradients become ready, into contiguous groups, each sent whole as
one all-reduce).  No planner made these before: ``optimal`` and ``mgwfbp`` group contiguously but issue first-in
first-out without the next forward's gating; ``usbyte`` gates and prioritizes but cuts layers into blocks sized to
the backward's gaps.  On the papers' models at 8 emulated hosts they predict faster than both (ResNet-50:
12 groups, 0.185 s against 0.196 s for ``auto``'s best before; docs/notes/2026-12-plan8-headroom.md, "fwd10").

``groups=k`` cuts the ready order into ``k`` groups of about equal bytes (:func:`equal_byte_cuts`).
``groups=0`` chooses on the simulator: the best of :data:`GROUP_COUNTS` equal-byte groups (in increasing count,
stopping once :data:`PAST_BEST` counts in a row were slower than the best, or the floor of more groups is above
it: :func:`group_floor_s`), then a short local
search over the cuts (:func:`refine`, at most :data:`MOVES` more simulations), each cut moved toward either
neighbour by a half to a sixteenth of its distance to it, the move kept when the simulated iteration gets shorter.

A group never mixes element sizes (the runtime keeps each in its own flat buffer): a group with several is sent
as one operation per element size, all at the group's priority.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from gradsched.cluster import Cluster
from gradsched.plan import Operation, Plan
from gradsched.planners import _collective as coll
from gradsched.planners._floors import first_ready_s, plain_lines
from gradsched.planners._tables import tensor_table
from gradsched.planners._usbyte_eval import BlockPricer
from gradsched.profile import Profile

GROUP_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # equal-byte group counts tried by groups=0
MOVES = 24  # simulations of the local search after the counts (groups=0)
STEP_DIVISORS = (2, 4, 8, 16)  # a cut moves by its gap to a neighbour divided by these, coarse first
PAST_BEST = 2  # counts in a row slower than the best so far after which groups=0 tries no more


def equal_byte_cuts(profile: Profile, k: int) -> tuple[int, ...]:
    """Where ``k`` groups of about equal bytes start in the ready order (positions 1 to n-1, increasing): group
    ``j`` ends at the first tensor whose running total of bytes reaches ``j / k`` of all (fewer groups where one
    tensor holds more than a group's share)."""
    table = tensor_table(profile)
    order = np.asarray(profile.order, dtype=np.int64)
    cum = np.cumsum(np.asarray(table.nbytes, dtype=np.int64)[order])
    n = len(order)
    if n == 0 or k <= 1:
        return ()
    targets = cum[-1] * np.arange(1, k, dtype=np.int64) / k
    ends = np.searchsorted(cum, targets, side="left") + 1  # the group ends after the tensor reaching its share
    return tuple(int(c) for c in np.unique(ends) if 0 < c < n)


def grouped_operations(profile: Profile, cuts: tuple[int, ...], cluster: Cluster,
                       hierarchical: str = "auto") -> tuple[Operation, ...]:
    """The ready order cut at ``cuts`` into groups, each one operation per element size, in ready order, each the
    priority of its group's place in forward order (the group holding the earliest layer first), each the dense
    collective ``hierarchical`` gives its bytes on ``cluster``."""
    table = tensor_table(profile)
    order = profile.order
    edges = (0, *cuts, len(order))
    groups = [sorted(order[a:b]) for a, b in zip(edges, edges[1:]) if b > a]
    rank = {g: r for r, g in enumerate(sorted(range(len(groups)), key=lambda g: groups[g][0]))}
    parts: list[tuple[list[int], int]] = []
    for g, members in enumerate(groups):
        by_size: dict[int, list[int]] = {}
        for t in members:
            by_size.setdefault(table.element_bytes[t], []).append(t)
        parts.extend((ts, rank[g]) for ts in by_size.values())
    nbytes = [sum(table.nbytes[t] for t in ts) for ts, _ in parts]
    kinds = coll.collectives_for(nbytes, cluster, hierarchical)
    return tuple(Operation(tuple(table.whole[t] for t in ts), kind, r) for (ts, r), kind in zip(parts, kinds))


def grouped_plan(profile: Profile, cuts: tuple[int, ...], cluster: Cluster, options: dict[str, Any],
                 hierarchical: str = "auto") -> Plan:
    """The ``usbyte`` plan of the groups ``cuts`` make (:func:`grouped_operations`), by priority, overlapping the
    next forward."""
    ops = grouped_operations(profile, cuts, cluster, hierarchical)
    return Plan("usbyte", ops, profile.fingerprint, profile.model, coll.recorded(options, cluster, hierarchical),
                scheduling="priority", overlap_forward=True)


def group_floor_s(profile: Profile, cluster: Cluster, groups: int, hierarchical: str = "auto",
                  channels: int = 1) -> float:
    """Seconds no plan of at least ``groups`` operations (all-reduces, plain or hierarchical) can beat: that many
    of the least start-up and every byte once at the least cost per byte, back to back from the first ready
    gradient, spread over ``channels`` (0 where a cost is not a plain line: a measured table)."""
    costs = [cluster.operation_cost(c) for c in coll.dense_collectives(cluster, hierarchical)]
    if not plain_lines(costs):
        return 0.0
    total = sum(tensor_table(profile).nbytes)
    alpha_s, beta_s = min(c.alpha_s for c in costs), min(c.beta_s_per_byte for c in costs)
    return first_ready_s(profile) + (groups * alpha_s + beta_s * total) / channels


def choose(profile: Profile, cluster: Cluster, options: dict[str, Any], hierarchical: str = "auto",
           beat_s: float = math.inf) -> tuple[Plan | None, float]:
    """``groups=0``: the best plan of :data:`GROUP_COUNTS` equal-byte groups refined by :func:`refine`, and its
    simulated iteration (one channel, no timeline).  A count whose :func:`group_floor_s` is above the best so far
    (or ``beat_s``) is not simulated; where none beats ``beat_s``: (None, the best iteration found, or inf)."""
    from gradsched.sim import simulate  # the simulator imports planners' types only

    price = pricer(profile, cluster, hierarchical)

    def simulated(cuts: tuple[int, ...]) -> float:
        priced = None if price is None else price(cuts)
        if priced is not None:
            return priced
        plan_ = grouped_plan(profile, cuts, cluster, options, hierarchical)
        return simulate(plan_, profile, cluster, timeline=False).iteration_s

    best: tuple[float, int, tuple[int, ...]] | None = None  # (iteration, groups, cuts): ties to fewer groups
    seen: set[tuple[int, ...]] = set()
    worse = 0  # counts in a row simulated slower than the best so far
    for k in GROUP_COUNTS:
        cuts = equal_byte_cuts(profile, k)
        if cuts in seen:
            continue
        seen.add(cuts)
        top = beat_s if best is None else min(beat_s, best[0])
        if group_floor_s(profile, cluster, len(cuts) + 1, hierarchical) > top * (1 + 1e-9):
            break  # more groups only add start-ups to the floor
        key = (simulated(cuts), len(cuts), cuts)
        if best is None or key < best:
            best, worse = key, 0
        else:
            worse += 1
            if worse == PAST_BEST:
                break
    if best is None:
        return None, math.inf
    cuts, iteration_s = refine(best[2], best[0], len(profile.order), simulated)
    if iteration_s > beat_s:
        return None, iteration_s
    return grouped_plan(profile, cuts, cluster, options, hierarchical), iteration_s


def pricer(profile: Profile, cluster: Cluster,
           hierarchical: str = "auto") -> Callable[[tuple[int, ...]], float | None] | None:
    """Where every tensor has one element size: a function of the cuts giving the simulated iteration (one channel,
    no timeline) of :func:`grouped_plan`'s plan without making it, from the simulator's compiled pass
    (:class:`~gradsched.planners._usbyte_eval.BlockPricer`, the tensors in ready order as its units and each group
    one block spanning them: the same operations in the same order, bytes, priorities and completing layers), None
    where that pass does not apply (the function too: then :func:`choose` simulates the plan).  About 8x faster
    than simulating (1,000 tensors: 0.45 against 3.5 ms)."""
    if not tensor_table(profile).one_size:
        return None
    order = np.asarray(profile.order, dtype=np.int64)
    n = len(order)
    blocks = BlockPricer(profile, cluster, np.arange(n + 1, dtype=np.int64), order, hierarchical)
    if blocks.run is None:
        return None
    cum = np.concatenate(([0], np.cumsum(np.array([t.numel for t in profile.tensors], dtype=np.int64)[order])))

    def price(cuts: tuple[int, ...]) -> float | None:
        lo, hi = np.array((0, *cuts), dtype=np.int64), np.array((*cuts, n), dtype=np.int64)
        rank = np.zeros(n, dtype=np.int64)  # each group's first unit: its place in forward order
        rank[lo] = np.argsort(np.argsort(np.minimum.reduceat(order, lo), kind="stable"), kind="stable")
        return blocks.iteration_s(lo, np.zeros(len(lo), dtype=np.int64), cum[hi] - cum[lo], rank)

    return price


def refine(cuts: tuple[int, ...], iteration_s: float, n: int, simulated: Callable[[tuple[int, ...]], float],
           moves: int = MOVES) -> tuple[tuple[int, ...], float]:
    """A short local search from ``cuts`` (``iteration_s``: theirs), at most ``moves`` simulations: each cut in
    turn moved toward its left and then its right neighbour (or the ends, 0 and ``n``) by half the distance, a
    quarter, ... (:data:`STEP_DIVISORS`), the first move that shortens the iteration kept; repeated while moves are
    left and one was kept."""
    left = moves
    improved = True
    while improved and left > 0:
        improved = False
        for i in range(len(cuts)):
            for d in _steps(cuts, i, n):
                if left <= 0:
                    return cuts, iteration_s
                trial = tuple(sorted({*cuts[:i], cuts[i] + d, *cuts[i + 1:]}))
                left -= 1
                s = simulated(trial)
                if s < iteration_s:
                    cuts, iteration_s, improved = trial, s, True
                    break
            if left <= 0:
                break
    return cuts, iteration_s


def _steps(cuts: tuple[int, ...], i: int, n: int) -> list[int]:
    """Moves of cut ``i``: toward the left neighbour by half the gap, then toward the right one, then quarters,
    eighths and sixteenths (whole tensors, at least one; none that would reach a neighbour)."""
    lo = cuts[i - 1] if i > 0 else 0
    hi = cuts[i + 1] if i + 1 < len(cuts) else n
    out: list[int] = []
    for div in STEP_DIVISORS:
        for d in (-((cuts[i] - lo) // div), (hi - cuts[i]) // div):
            if d and lo < cuts[i] + d < hi and d not in out:
                out.append(d)
    return out
