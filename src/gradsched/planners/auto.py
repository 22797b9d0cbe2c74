"""``auto``: search every applicable strategy and its options with the simulator.

Candidates are the dense strategies with a small grid of their options (DDP bucket
sizes, threshold sizes, ByteScheduler partition and credit sizes, Horovod fusion),
and, only when the user allows a density below 1, the sparse strategies at that
density.  On a two-level cluster gradsched's own dense strategies mark operations
hierarchical where the cluster predicts it cheaper (option ``hierarchical``, passed on
to them), so ``auto`` may choose plans with ``hier-allreduce`` operations.  Each
candidate is planned and simulated; the fastest predicted iteration wins (ties: fewer
operations, then candidate order).  The returned plan is the
winner's, relabelled ``auto`` with what it chose in its options.

Decoupled plans (``dear``: reduce-scatters and all-gathers) win only where the simulator
predicts them at least ``DECOUPLED_MARGIN`` (10%) faster than the best plan without them: they
issue twice the operations (each with the runtime's host time), and on the emulated testbed
they measured 9-40% slower against usbyte than the two were predicted, so a near win on paper
goes to the plan that has been measured as predicted.

Near-tied plans (option ``slack``, off by default; :data:`SLACK_TOLERANCE`, 1%, is the value
measured, planners/_slack.py): those predicted within ``slack`` of the best go to the one whose channels are least busy
before the backward ends, and ``optimal`` is tried on a few stretched channels too
(:data:`STRETCHES`): plans with fewer operations and slack for communication that runs slower during
compute than the simulator prices it (``planners/_slack.py``).  Off by default because it gives up
``auto``'s promise of the fastest prediction (up to ``slack``) and half again its planning time for
a gain not yet told from noise (Inception-v4 on 8 emulated hosts: 0.96-0.97x DDP against 0.95x)."""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np

from gradsched.cluster import Cluster
from gradsched.constants import MiB
from gradsched.errors import GradschedError
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER, SPARSE, Plan
from gradsched.planners.options import STRATEGIES, Option
from gradsched.planners import _collective as coll
from gradsched.planners._contiguous import group_floor_s
from gradsched.planners._floors import first_ready_s as _first_ready_s, plain_lines as _lines
from gradsched.planners._slack import STRETCHES, busy_in_backward_s, near
from gradsched.planners._tables import tensor_table
from gradsched.planners.registry import (byte_scaled_options, get_planner, is_sparse, planner_option_specs, register,
                                         strategy_names)
from gradsched.profile import Profile
from gradsched.sparsity import DENSITY

USBYTE_MERGE_BYTES = (0, MiB // 4, MiB, 4 * MiB)
# a two-phase plan must be predicted this much faster than the others to be chosen: with both phases in pieces on gloo
# (2 testbed hosts, 1 Gbit/s) dear measured 9-40% slower against usbyte than predicted (GoogLeNet-K80 -2.6% against
# +7.3%; BERT-Base -6.9% against +2.0%, -38.2% against +1.4%), never faster than usbyte
# (docs/notes/2026-12-decoupled.md, "Round 8"); 2% until then
DECOUPLED_MARGIN = 0.10
# a two-phase plan predicted more than this under the lower bound is ranked without its queued gain
# (under_bound_checked_s): the bound and the simulator price a group alike, so only rounding separates one at it
BOUND_TOLERANCE = 1e-6
# Options tried per strategy; strategies not listed are tried with their defaults.
GRID: dict[str, list[dict[str, Any]]] = {
    "ddp": [{"bucket_cap_mb": mb} for mb in (1, 5, 25, 100)],
    "threshold": [{"mb": mb} for mb in (0.25, 1, 4, 16, 64)],
    "horovod": [{"fusion_mb": mb} for mb in (16, 64, 128)],
    # Credit of at least two blocks: a one-block window measured much slower than the
    # simulator predicts (vgg, 2 ranks, 1 MiB blocks: 453 ms against 298 ms with two
    # blocks, before the executor's progress thread; 353-418 ms after it, on a loaded
    # machine), so it is not offered until it measures as predicted.
    "bytescheduler": [{"partition_bytes": p * MiB, "credit_bytes": c * p * MiB}
                      for p in (1, 4, 16) for c in (2, 4)],
    # the paper's layers, and small layers merged first (at run time the default is measured beside the choice);
    # then whole groups contiguous in ready order, by forward-order priority, count and cuts chosen on the simulator
    # (planners/_contiguous.py: ResNet-50 at 8 emulated hosts 0.185 s against 0.196 s without it)
    "usbyte": [{"merge_bytes": b} for b in USBYTE_MERGE_BYTES] + [{"groups": 0}],
}


def candidates(density: float = 1.0, exclude: tuple[str, ...] = (), hierarchical: str = "auto", slack: float = 0.0,
               byte_scale: int = 1) -> Iterator[tuple[str, dict[str, Any]]]:
    """(strategy, options) pairs that ``auto`` tries (``hierarchical`` goes to every strategy
    that takes it; ``auto``, its default, is left out of their options; with ``slack`` above 0,
    ``optimal`` on each of :data:`STRETCHES` too).  ``byte_scale`` S above 1: the profile is a byte-scaled
    stand-in (``gradsched bench --scale-bytes S``), and every candidate's sizes, the grid's and the
    strategies' defaults, are divided by S (:func:`~gradsched.planners.registry.byte_scaled_options`), so
    that it tries the plans it would try for the model emulated."""
    if not 0 < density <= 1:
        raise GradschedError(f"auto: density must be in (0, 1], got {density}")
    for name in strategy_names():
        if name == "auto" or name in exclude:
            continue
        if is_sparse(name):
            if density < 1:
                yield name, {"density": density}
            continue
        extra = {"hierarchical": hierarchical} if hierarchical != "auto" and takes_hierarchical(name) else {}
        grid = GRID.get(name, [{}])
        if name == "optimal" and slack > 0:
            grid = [{}] + [{"stretch": f} for f in STRETCHES]
        for opts in grid:
            yield name, byte_scaled_options(name, {**opts, **extra}, byte_scale)


def takes_hierarchical(name: str) -> bool:
    return "hierarchical" in planner_option_specs(name)


@dataclass(frozen=True)
class Ranked:
    """One candidate of the search: its plan (the strategy's own) and predicted iteration."""

    predicted_s: float
    strategy: str
    plan: Plan


def ranked(profile: Profile, cluster: Cluster, density: float = 1.0, channels: int = 1,
           exclude: tuple[str, ...] = (), hierarchical: str = "auto", slack: float = 0.0,
           byte_scale: int = 1) -> list[Ranked]:
    """Every candidate, simulated, fastest predicted first (ties: fewer operations, then candidate order),
    except that the first is the near-tied one (within ``slack``) least busy before the backward ends."""
    from gradsched.sim import simulate  # the simulator imports planners' types only

    keyed = []
    lower: list[float] = []  # the lower bound, once a decoupled candidate needs it (under_bound_checked_s)
    for k, (name, opts) in enumerate(candidates(density, tuple(exclude), hierarchical, slack, byte_scale)):
        candidate = get_planner(name)(profile, cluster, **opts)
        result = simulate(candidate, profile, cluster, channels=channels, timeline=False)
        busy = busy_in_backward_s(result.op_start_s, result.op_end_s, result.backward_end_s)
        predicted_s = under_bound_checked_s(candidate, result.iteration_s, profile, cluster, channels, lower)
        keyed.append(((ranking_s(candidate, predicted_s), len(candidate.operations), k), busy,
                      Ranked(predicted_s, name, candidate)))
    keyed.sort(key=lambda x: x[0])
    if slack > 0 and keyed:
        tied = near([r.predicted_s for _, _, r in keyed], [key[0] for key, _, _ in keyed], slack)
        pick = min(tied, key=lambda i: (keyed[i][1], keyed[i][0]))
        keyed.insert(0, keyed.pop(pick))
    return [r for _, _, r in keyed]


def as_auto(choice: Ranked, tried: int, density: float = 1.0) -> Plan:
    """``choice``'s plan relabelled ``auto``, with what was chosen in its options."""
    options = {"chose": choice.strategy, "chosen_options": choice.plan.options, "candidates": tried,
               "predicted_iteration_s": choice.predicted_s, "density": density}
    return replace(choice.plan, strategy="auto", options=options)


def best(profile: Profile, cluster: Cluster, density: float = 1.0, channels: int = 1,
         exclude: tuple[str, ...] = (), hierarchical: str = "auto",
         slack: float = 0.0, byte_scale: int = 1) -> tuple[Ranked, int]:
    """``ranked(...)[0]`` and how many candidates there were, simulating fewer of them.

    The same winner, found faster: a candidate whose plan equals one already simulated
    gets that result (``threshold`` at 1 MB is ``ddp`` at 1 MB; ``mgwfbp`` often merges
    everything like ``sync``; ``usbyte`` and ``dear`` simulated their plan to choose it),
    ``bytescheduler``'s blocks are cut once per partition size (the credit window changes
    nothing else), and a dense candidate whose operations alone, back to back,
    take longer than the best iteration so far (by more than ``slack``) cannot win and is not
    simulated (the simulator waits for every operation before the iteration ends; see
    :func:`comm_lower_bound_s`); a ``usbyte`` candidate whose layers' all-reduces alone
    cannot beat the best so far is not even planned (:func:`usbyte_floor_s`: its search
    is most of ``auto``'s time).  Among those within ``slack`` of the best, :func:`_least_busy`."""
    from gradsched.sim import simulate  # the simulator imports planners' types only

    top_s: float | None = None  # the best ranking so far
    kept: list[tuple[tuple[float, int, int], Ranked]] = []  # every candidate within slack of the best so far
    busy: dict[int, float] = {}  # seconds busy before the backward ends, of the candidates simulated here
    seen = _Seen()
    made: dict[tuple, Plan] = {}
    lower: list[float] = []  # the lower bound, once a decoupled candidate needs it (under_bound_checked_s)
    count = 0
    widen = (1 + max(slack, 0.0)) * (1 + 1e-9)
    for k, (name, opts) in _strong_first(list(candidates(density, tuple(exclude), hierarchical, slack, byte_scale))):
        count += 1
        bound = math.inf if top_s is None else top_s * widen
        if top_s is not None and _floor_ranked_s(name, profile, cluster, opts, channels) > bound:
            continue  # slower than the best so far whatever its blocks, groups and priorities: not planned
        candidate, by_planner = _planned(name, opts, profile, cluster, made, bound if channels == 1 else math.inf)
        if candidate is None:
            continue  # usbyte's chosen plan, priced, is slower than the best so far: not made
        predicted_s = seen.get(candidate)
        if predicted_s is None and channels == 1 and by_planner is not None:
            predicted_s = seen.put(candidate, by_planner)
        if predicted_s is None:
            if comm_lower_bound_s(candidate, profile, cluster, channels) > bound:
                continue  # slower than the best so far whatever its schedule
            result = simulate(candidate, profile, cluster, channels=channels, timeline=False)
            predicted_s = seen.put(candidate, result.iteration_s)
            busy[k] = busy_in_backward_s(result.op_start_s, result.op_end_s, result.backward_end_s)
        predicted_s = under_bound_checked_s(candidate, predicted_s, profile, cluster, channels, lower)
        rank_key = (ranking_s(candidate, predicted_s), len(candidate.operations), k)
        if rank_key[0] <= bound:
            kept.append((rank_key, Ranked(predicted_s, name, candidate)))
        top_s = rank_key[0] if top_s is None else min(top_s, rank_key[0])
    if not kept:
        raise GradschedError("auto: every strategy was excluded; leave at least one out of --exclude")
    return _least_busy(kept, busy, profile, cluster, channels, slack), count


def _least_busy(kept: list[tuple[tuple[float, int, int], Ranked]], known: dict[int, float], profile: Profile,
                cluster: Cluster, channels: int, slack: float) -> Ranked:
    """The best-ranked of ``kept`` (slack 0), else of those near-tied with it (``_slack.near``) the one
    whose channels are least busy before the backward ends (then the best-ranked); ``known``: the busy
    seconds of candidates already simulated, by candidate number (the others are simulated here)."""
    from gradsched.sim import simulate  # the simulator imports planners' types only

    kept = sorted(kept, key=lambda x: x[0])
    if slack <= 0:
        return kept[0][1]
    busy: dict[int, float] = {}
    for i in near([r.predicted_s for _, r in kept], [key[0] for key, _ in kept], slack):
        k = kept[i][0][2]
        if k not in known:
            res = simulate(kept[i][1].plan, profile, cluster, channels=channels, timeline=False)
            known[k] = busy_in_backward_s(res.op_start_s, res.op_end_s, res.backward_end_s)
        busy[i] = known[k]
    return kept[min(busy, key=lambda i: (busy[i], kept[i][0]))][1]


class _Seen:
    """Predicted iterations of the plans simulated so far, found by equal operations, scheduling,
    forward overlap and credit window.  Not a dict keyed by the operations: hashing thousands of
    frozen dataclasses per look-up was a third of ``auto``'s bookkeeping; plans are bucketed by
    what is cheap to hash and compared (identity first) within a bucket."""

    def __init__(self) -> None:
        self._by: dict[tuple, list[tuple[tuple, float]]] = {}

    @staticmethod
    def _key(p: Plan) -> tuple:
        return len(p.operations), p.scheduling, p.overlap_forward, p.credit_bytes

    def get(self, p: Plan) -> float | None:
        for ops, predicted_s in self._by.get(self._key(p), ()):
            if ops is p.operations or ops == p.operations:
                return predicted_s
        return None

    def put(self, p: Plan, predicted_s: float) -> float:
        self._by.setdefault(self._key(p), []).append((p.operations, predicted_s))
        return predicted_s


def _planned(name: str, opts: dict[str, Any], profile: Profile, cluster: Cluster, made: dict[tuple, Plan],
             beat_s: float = math.inf) -> tuple[Plan | None, float | None]:
    """Candidate ``name``'s plan with ``opts``, and its iteration on one channel where its planner
    simulated that very plan to choose it (``usbyte``'s rule, ``dear``'s planned grouping: the same
    operations, scheduling and window), else None.  A ``bytescheduler`` plan differing from one in
    ``made`` only in its credit window is that plan with the window changed (its blocks depend on
    the partition alone: cutting them again is most of its planning).  A ``usbyte`` plan whose
    own simulation (one channel) is above ``beat_s`` is not made: (None, its iteration)."""
    if name == "usbyte":
        from gradsched.planners.usbyte import plan_and_simulated

        return plan_and_simulated(profile, cluster, beat_s, **opts)
    if name != "bytescheduler" or opts.get("credit_bytes") is None:
        plan_ = get_planner(name)(profile, cluster, **opts)
        planned = name == "dear" and plan_.options.get("grouping") == "planned"
        return plan_, plan_.options.get("predicted_iteration_s") if planned else None
    key = tuple(sorted((k, v) for k, v in opts.items() if k != "credit_bytes"))
    same = made.get(key)
    if same is None:
        made[key] = same = get_planner(name)(profile, cluster, **opts)
        return same, None
    credit = opts["credit_bytes"]
    return replace(same, credit_bytes=credit, options={**same.options, "credit_bytes": credit}), None


FIRST = ("mgwfbp", "optimal")  # tried first by best(): usually near the winner, so the floors skip more


def _strong_first(tried: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, tuple[str, dict[str, Any]]]]:
    """``tried`` numbered in candidate order, :data:`FIRST`, ``usbyte``'s paper layers and its whole groups
    (``groups=0``) moved to the front (the order of trying changes nothing but what is skipped: the ranking keeps
    the numbers)."""
    numbered = list(enumerate(tried))
    early = [c for c in numbered if c[1][0] in FIRST or (c[1][0] == "usbyte" and not c[1][1].get("merge_bytes"))]
    return early + [c for c in numbered if c not in early]


def ranking_s(candidate: Plan, predicted_s: float) -> float:
    """What ``candidate`` is ranked by: its predicted iteration, stretched by the margin a decoupled
    plan must beat (:data:`DECOUPLED_MARGIN`)."""
    if any(op.two_phase for op in candidate.operations):
        return predicted_s / (1.0 - DECOUPLED_MARGIN)
    return predicted_s


def under_bound_checked_s(candidate: Plan, predicted_s: float, profile: Profile, cluster: Cluster, channels: int,
                          lower: list[float]) -> float:
    """``predicted_s``, or, for a decoupled ``candidate`` predicted under the lower bound, its prediction with the
    phases one at a time (the cluster's ``queued`` rules left out).

    The bound (:func:`~gradsched.calibration.bounds.lower_bound_s` of the same profile and cluster, ``gradsched
    bench``'s ``lower_bound_s``) prices every group alone at the cheapest of the all-reduce and the two phases; what
    takes a two-phase plan under it is the queued gain, measured at one size and 1 against 4 operations: a
    prediction under the bound is evidence that gain is misapplied, so the plan is ranked without it (runs11:
    BERT-Large's ``dear``, 101 groups under 1 MiB, predicted 1.603 s under the bound 1.972, measured 2.651 s; one
    at a time 2.936 s).  The bound is computed once (kept in ``lower``); tolerance :data:`BOUND_TOLERANCE`."""
    if "queued" not in cluster.extra or not any(op.two_phase for op in candidate.operations):
        return predicted_s
    if not lower:
        from gradsched.calibration.bounds import lower_bound_s  # bounds imports planners' cost helpers only

        lower.append(float(lower_bound_s(profile, cluster)["lower_bound_s"]))
    if predicted_s >= lower[0] * (1.0 - BOUND_TOLERANCE):
        return predicted_s
    from gradsched.sim import simulate  # the simulator imports planners' types only

    alone = replace(cluster, extra={k: x for k, x in cluster.extra.items() if k != "queued"})
    return max(predicted_s, simulate(candidate, profile, alone, channels=channels, timeline=False).iteration_s)


def comm_lower_bound_s(plan_: Plan, profile: Profile, cluster: Cluster, channels: int = 1) -> float:
    """Seconds the simulated iteration of a dense plan cannot beat: its all-reduces (or reduce-scatters
    and all-gathers) back to back, spread over ``channels`` (each channel runs its operations one after another, each
    at least its cost; contention only stretches them), 0 for a plan with sparse operations."""
    elem = tensor_table(profile).element_bytes
    by_collective: dict[str, list[int]] = {}  # each collective's operations' bytes, in plan order
    for op in plan_.operations:
        if op.collective == SPARSE:
            return 0.0
        slices = op.slices
        if len(slices) == 1:
            (s,) = slices
            nbytes = (s.end - s.start) * elem[s.tensor]
        else:
            nbytes = sum((s.end - s.start) * elem[s.tensor] for s in slices)
        by_collective.setdefault(op.collective, []).append(nbytes)
    total = 0.0
    for collective in sorted(by_collective):  # a fixed order: same sum on every rank
        total += float(cluster.operation_cost(collective).times_s(by_collective[collective]).sum())
    return total / channels


def _floor_ranked_s(name: str, profile: Profile, cluster: Cluster, opts: dict[str, Any], channels: int) -> float:
    """What candidate ``name`` with ``opts`` cannot beat in :func:`ranking_s`, from the profile alone
    (0 where no floor is known): its plans' all-reduces (reduce-scatters and all-gathers) back to
    back from the first ready gradient (:func:`usbyte_floor_s`, :func:`bytescheduler_floor_s`,
    :func:`dear_floor_s`), or the compute with every tensor's top-k selection (:func:`sparse_floor_s`)."""
    if name == "usbyte" and opts.get("groups") is not None:
        return group_floor_s(profile, cluster, 1, opts.get("hierarchical", "auto"), channels)
    if name == "usbyte":
        return usbyte_floor_s(profile, cluster, opts, channels)
    if name == "bytescheduler":
        return bytescheduler_floor_s(profile, cluster, opts, channels)
    if name == "dear":
        return dear_floor_s(profile, cluster, channels) / (1.0 - DECOUPLED_MARGIN)
    if name in SELECTING:
        return sparse_floor_s(profile, cluster)
    return 0.0


SELECTING = ("topk", "omgs")  # sparse planners whose operations are whole tensors, every one a top-k


def sparse_floor_s(profile: Profile, cluster: Cluster) -> float:
    """Seconds no ``topk`` or ``omgs`` plan can beat, from the profile alone: the compute stream runs
    the forward, backward, update and other time and each operation's top-k selection
    (``Cluster.selection_s``: c n log2 n, so a group's selection is at least its tensors' apart),
    one after another, whatever the communication."""
    return profile.compute_s + sum(cluster.selection_s(t.numel) for t in profile.tensors)


def bytescheduler_floor_s(profile: Profile, cluster: Cluster, opts: dict[str, Any], channels: int = 1) -> float:
    """Seconds no ``bytescheduler`` plan with ``opts`` can beat, without making it: its blocks (every
    tensor cut into ``partition_bytes``), each the cheaper collective it may be, back to back
    from the first ready gradient over ``channels`` (:func:`comm_lower_bound_s` of the plan, and
    no block starts before a gradient is ready); 0 where a cost is a measured table."""
    costs = [cluster.cost(c) for c in coll.dense_collectives(cluster, opts.get("hierarchical", "auto"))]
    if not _lines(costs):
        return 0.0
    numel = np.array([t.numel for t in profile.tensors], dtype=np.int64)
    elem = np.array([t.element_bytes for t in profile.tensors], dtype=np.int64)
    step = np.maximum(1, opts.get("partition_bytes", 4 << 20) // elem)
    sizes = np.concatenate([step * elem, (numel % step) * elem])  # each tensor's whole blocks, then its rest
    counts = np.concatenate([numel // step, (numel % step > 0).astype(np.int64)])
    times = np.minimum.reduce([c.times_s(sizes) for c in costs])
    return _first_ready_s(profile) + float((times * counts).sum()) / channels


def dear_floor_s(profile: Profile, cluster: Cluster, channels: int = 1) -> float:
    """Seconds no ``dear`` plan can beat, from the profile alone: the compute (no plan's iteration
    is shorter than its forward, backward, update and other time), or every byte reduce-scattered
    and all-gathered, at least one start-up each per element size (a line's cost of a sum is at
    most the sum of its costs: grouping can only add start-ups), from the first ready gradient
    over ``channels`` (not where a cost is a measured table), whichever is longer.  Where the
    best plan so far hides its communication, the compute alone keeps ``dear`` from winning by
    its margin (:data:`DECOUPLED_MARGIN`)."""
    costs = [cluster.operation_cost(REDUCE_SCATTER), cluster.operation_cost(ALL_GATHER)]
    if not _lines(costs):
        return profile.compute_s
    nbytes: dict[int, int] = {}
    for t in profile.tensors:
        nbytes[t.element_bytes] = nbytes.get(t.element_bytes, 0) + t.bytes
    sizes = list(nbytes.values())
    total = sum(float(c.times_s(sizes).sum()) for c in costs)
    return max(profile.compute_s, _first_ready_s(profile) + total / channels)


def usbyte_floor_s(profile: Profile, cluster: Cluster, opts: dict[str, Any], channels: int = 1) -> float:
    """Seconds no ``usbyte`` plan with ``opts`` can beat, from the profile alone: each of its
    layers (groups, with ``merge_bytes``) of one element size goes as one or more all-reduces,
    at least the cost of one of its bytes (a start-up and a slope of 0 or more: splitting only
    adds start-ups), none before the first gradient is ready, spread over ``channels``; each
    operation the cheaper of the plain and the hierarchical all-reduce where it may be either.
    0 where a cost is a measured table (not known to be subadditive)."""
    from gradsched.planners.usbyte import merged_layers  # only here: auto imports every planner lazily

    costs = [cluster.cost(c) for c in coll.dense_collectives(cluster, opts.get("hierarchical", "auto"))]
    if any(c.points is not None or c.alpha_s < 0 or c.beta_s_per_byte < 0 for c in costs):
        return 0.0
    group = merged_layers(profile, opts.get("merge_bytes", 0))
    nbytes: dict[tuple[int, int], int] = {}
    for g, t in zip(group, profile.tensors):
        nbytes[(g, t.element_bytes)] = nbytes.get((g, t.element_bytes), 0) + t.bytes
    sizes = list(nbytes.values())
    total = float(np.minimum.reduce([c.times_s(sizes) for c in costs]).sum())
    return _first_ready_s(profile) + total / channels


OPTIONS = (
    replace(DENSITY, default=1.0, doc="below 1: sparse strategies are candidates too"),
    Option("channels", int, 1, low=1, high=1024, doc="parallel communication channels simulated"),
    Option("exclude", STRATEGIES, (), doc="strategies not tried"),
    coll.OPTION,
    Option("slack", float, 0.0, low=0.0, high=1.0,
           doc="plans predicted within this fraction of the best go to the one least busy during the backward"),
    Option("byte_scale", int, 1, low=1, high=4096,
           doc="the profile is a byte-scaled stand-in (gradsched bench --scale-bytes S): every candidate's sizes "
               "divided by S"),
)


@register("auto", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, density: float = 1.0, channels: int = 1,
         exclude: tuple[str, ...] = (), hierarchical: str = "auto", slack: float = 0.0, byte_scale: int = 1) -> Plan:
    coll.check_mode("auto", hierarchical, cluster)
    with _no_cycle_collection():
        choice, tried = best(profile, cluster, density, channels, exclude, hierarchical, slack, byte_scale)
    return as_auto(choice, tried, density)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off for the search (back on after, if it was on): the candidates' plans
    are tens of thousands of small objects, freed by reference counting as each loses; the collector's
    passes over them, triggered by those allocations, were a fifth of ``auto``'s worst case."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
