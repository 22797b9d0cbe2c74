"""``dear``: DeAR's decoupled all-reduce (Zhang, Shi, Chu et al., ICDCS 2023).

Each merged group's all-reduce is split in two: a ``reduce-scatter`` issued as soon as
the group's gradients are complete during backward, and an ``all-gather`` that must be
done before the group's first layer runs its next forward (gated there, as DeAR's
pre-forward hook waits for it).  The all-gathers thus overlap the next forward as the
reduce-scatters overlap backward, which pays where one all-reduce of all gradients takes
as long as backward or longer.

Groups (``grouping``):

- ``threshold`` (DeAR's default): layers in forward order, packed while a group stays
  within ``threshold_mb`` (25 MB, fp32 bytes as the authors count them);
- ``nearby``: every ``nearby_layers`` layers in forward order (DeAR without a threshold);
- ``planned`` (default): the fastest, on the simulator, of the groupings the merge rules of
  ``mgwfbp`` and ``optimal`` give when asked of the reduce-scatter's cost and of the
  two-phase cost (reduce-scatter plus all-gather), DeAR's threshold rule at 1-256 MB (the
  range its Bayesian search tunes), the nearby-layers rule (4 layers, and 1) and, where the runtime sends a group from
  a size on as a ring (gloo beyond two ranks, :attr:`~gradsched.cluster.Cluster.ring_min_bytes`), groups of at least
  1-8 times that size (:func:`at_least_groups`: the ring's half the all-reduce against the all-to-alls' up to twice
  it), each in list order (fifo) and
  with US-Byte-style priorities over both phases (:func:`prioritized`): the plan keeps
  ``scheduling: priority`` only where the simulator predicts it faster.

Groups never mix element sizes (one flat buffer per group and dtype).  Reduce-scatters go
in the order their groups become ready, all-gathers after them in forward order; each
layer's update runs right before its forward (``overlap_forward``), after its gather.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Callable

import numpy as np

from gradsched.cluster import Cluster
from gradsched.costs import NO_RING_BYTES
from gradsched.errors import GradschedError
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER, Operation, Plan, Slice, whole_slices
from gradsched.planners import _collective as coll
from gradsched.planners._tables import tensor_table
from gradsched.planners.mgwfbp import merge_groups
from gradsched.planners.optimal import optimal_groups
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.planners.topk import split_by_element_size
from gradsched.profile import Profile

GROUPINGS = ("planned", "threshold", "nearby")
DEFAULT_THRESHOLD_MB = 25.0  # DeAR's default (dear_pytorch: 25 MB of fp32 gradients)
DEFAULT_NEARBY_LAYERS = 4  # DeAR's grouping when no threshold is set
SEARCH_THRESHOLDS_MB = (1.0, 4.0, 16.0, 25.0, 64.0, 256.0)  # the range DeAR's Bayesian search tunes in
# groups of at least these multiples of the ring threshold (at 8 emulated hosts, runs10's profiles with rings priced:
# BERT-Base's dear 834 -> 806 ms at 2x, BERT-Large's 2170 -> 2153 at 6x; VGG-16 and ResNet-50 kept their grouping;
# benchmarks/dear_rings.py)
RING_MULTIPLES = (1, 2, 3, 4, 6, 8)

OPTIONS = (
    Option("grouping", str, "planned", doc="planned (simulator), threshold (DeAR's rule) or nearby (every N layers)"),
    Option("threshold_mb", float, DEFAULT_THRESHOLD_MB, low=0, low_open=True,
           doc="grouping=threshold: a group stays within this many MB (10^6 bytes)", size=True),
    Option("nearby_layers", int, DEFAULT_NEARBY_LAYERS, low=1, doc="grouping=nearby: layers per group"),
)


def layers_forward(profile: Profile) -> list[list[int]]:
    """Each layer's tensors (index order), layers in forward order."""
    return [list(ts) for ts in profile.layer_table.forward]


def threshold_groups(profile: Profile, threshold_bytes: float) -> list[list[int]]:
    """DeAR's rule: layers in forward order, a layer joins the open group while the group stays
    within ``threshold_bytes`` (a layer larger than that is a group of its own)."""
    return _forward_groups(profile, lambda size, nbytes: size + nbytes <= threshold_bytes)


def _forward_groups(profile: Profile, joins: Callable[[int, int], bool]) -> list[list[int]]:
    """Layers in forward order, each joining the open group where ``joins(group's bytes, layer's bytes)``, else
    opening the next."""
    groups: list[list[int]] = []
    size = 0
    for layer, nbytes in zip(profile.layer_table.forward, _layer_bytes(profile)):
        if groups and joins(size, nbytes):
            groups[-1] += layer
            size += nbytes
        else:
            groups.append(list(layer))
            size = nbytes
    return groups


def _layer_bytes(profile: Profile) -> list[int]:
    """Each layer's bytes, layers in forward order (whole numbers: the same sums as one by one)."""
    forward = profile.layer_table.forward
    ptr = np.zeros(len(forward) + 1, dtype=np.int64)
    np.cumsum([len(ts) for ts in forward], out=ptr[1:])
    if not len(forward) or int(ptr[-1]) == 0 or any(len(ts) == 0 for ts in forward):
        return [sum(tensor_table(profile).nbytes[t] for t in ts) for ts in forward]
    flat = np.fromiter(itertools.chain.from_iterable(forward), dtype=np.int64, count=int(ptr[-1]))
    return np.add.reduceat(np.array(tensor_table(profile).nbytes, dtype=np.int64)[flat], ptr[:-1]).tolist()


def at_least_groups(profile: Profile, least_bytes: float) -> list[list[int]]:
    """Layers in forward order, a group closed once it holds at least ``least_bytes`` (the last may hold less): DeAR's
    threshold rule turned around, so that each group but the last reaches the size from which the runtime sends
    it as a ring."""
    return _forward_groups(profile, lambda size, _nbytes: size < least_bytes)


def nearby_groups(profile: Profile, layers: int) -> list[list[int]]:
    """Every ``layers`` layers in forward order, one group."""
    fwd = layers_forward(profile)
    return [[t for layer in fwd[k:k + layers] for t in layer] for k in range(0, len(fwd), layers)]


def two_phase_ops(groups: list[list[int]], profile: Profile, whole: list[Slice] | None = None) -> tuple[Operation, ...]:
    """A reduce-scatter per group (and element size) in the order the groups become ready, then
    their all-gathers in forward order, each gated on its group's first layer.  ``whole``: each
    tensor's whole slice (:func:`gradsched.plan.whole_slices`), made once where many plans are."""
    by_ready = ready_parts(groups, profile)
    whole = whole if whole is not None else whole_slices(profile)
    rs = [Operation(tuple(whole[t] for t in g), REDUCE_SCATTER, j) for j, g in enumerate(by_ready)]
    by_forward = sorted(rs, key=lambda op: min(s.tensor for s in op.slices))
    ag = [Operation(op.slices, ALL_GATHER, len(rs) + k) for k, op in enumerate(by_forward)]
    return tuple(rs + ag)


def ready_parts(groups: list[list[int]], profile: Profile, position: dict[int, int] | None = None) -> list[list[int]]:
    """``groups`` split by element size, each sorted, in the order they become ready (``position``: each
    tensor's place in ``profile.order``, made once where many groupings are split)."""
    parts = [sorted(g) for g in split_by_element_size(groups, profile)]
    sizes = np.array([len(g) for g in parts], dtype=np.int64)
    if position is not None or not len(parts) or sizes.min() == 0:
        place = position if position is not None else {t: k for k, t in enumerate(profile.order)}
        return sorted(parts, key=lambda g: max(place[t] for t in g))
    flat = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64, count=int(sizes.sum()))
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    last = np.maximum.reduceat(tensor_table(profile).position[flat], starts)  # each part's last ready tensor
    return [parts[k] for k in np.argsort(last, kind="stable").tolist()]  # stable: as sorted() orders ties


def candidate_groupings(profile: Profile, cluster: Cluster) -> list[tuple[str, list[list[int]]]]:
    """The groupings ``planned`` chooses among, each with its name (see the module docstring)."""
    rs_cost = cluster.operation_cost(REDUCE_SCATTER)
    both = coll.two_phase_cost(cluster)
    out = [("mgwfbp(reduce-scatter)", merge_groups(profile, rs_cost)),
           ("mgwfbp(two-phase)", merge_groups(profile, both)),
           ("optimal(reduce-scatter)", optimal_groups(profile, rs_cost)[0]),
           ("optimal(two-phase)", optimal_groups(profile, both)[0]),
           (f"nearby({DEFAULT_NEARBY_LAYERS})", nearby_groups(profile, DEFAULT_NEARBY_LAYERS)),
           ("nearby(1)", nearby_groups(profile, 1))]  # per layer: where priorities pay most
    out += [(f"threshold({mb:g} MB)", threshold_groups(profile, mb * 1e6)) for mb in SEARCH_THRESHOLDS_MB]
    least = cluster.ring_min_bytes
    if cluster.ring_phase_ratio("reducescatter") is not None and least < NO_RING_BYTES:  # rings run
        out += [(f"at least({k}x {least / 2**20:g} MiB)", at_least_groups(profile, k * least)) for k in RING_MULTIPLES]
    return out


def largest_group_bytes(profile: Profile) -> int:
    """The bytes of the largest group of DeAR's default grouping (its 25 MB threshold) and of its nearby-layers
    rule: the size the bench's reduce-scatter and all-gather tables reach (docs/bench.md, "Network table").
    The candidates that merge more (thresholds of 64 and 256 MB, merged groups) go on at that size's rate."""
    nbytes = tensor_table(profile).nbytes
    groups = threshold_groups(profile, DEFAULT_THRESHOLD_MB * 1e6) + nearby_groups(profile, DEFAULT_NEARBY_LAYERS)
    return max((sum(nbytes[t] for t in g) for g in groups), default=0)


def prioritized(ops: tuple[Operation, ...]) -> tuple[Operation, ...]:
    """US-Byte's rule over both phases: each group's reduce-scatter and all-gather get the group's place in
    forward order as priority (lowest first), so that among the ready operations the first layers' (whose
    gathers the next forward waits for first) go first: their reduce-scatter, ready last in backward,
    overtakes the later groups' queued ones, and their all-gather follows it at once."""
    firsts = sorted({min(s.tensor for s in op.slices) for op in ops})
    place = {t: k for k, t in enumerate(firsts)}
    return tuple(replace(op, priority=place[min(s.tensor for s in op.slices)]) for op in ops)


def planned(profile: Profile, cluster: Cluster) -> tuple[tuple[Operation, ...], str, float, str]:
    """The candidate grouping and scheduling (fifo, or :func:`prioritized`) the simulator predicts fastest: its
    operations, name, iteration (s) and scheduling.  Ties go to fifo, then fewer operations, then candidate
    order.  Each candidate is priced by the simulator's compiled pass without making its plan where that
    applies (:class:`~gradsched.planners._dear_eval.TwoPhasePricer`: the same iteration), else simulated."""
    from gradsched.planners._dear_eval import TwoPhasePricer

    pricer = TwoPhasePricer(profile, cluster)
    best: tuple[tuple[float, int, int, int], list[list[int]], str, str, float] | None = None
    seen: set[tuple[tuple[int, ...], ...]] = set()
    whole = tensor_table(profile).whole
    for k, (name, groups) in enumerate(candidate_groupings(profile, cluster)):
        parts = ready_parts(groups, profile)
        key = tuple(tuple(g) for g in parts)  # the same parts make the same plan
        if key in seen:
            continue
        seen.add(key)
        for v, scheduling in enumerate(("fifo", "priority")):
            iteration_s = pricer.iteration_s(parts, v == 1)
            if iteration_s is None:
                iteration_s = _simulated_s(two_phase_ops(groups, profile, whole), scheduling, profile, cluster)
            rank = (round(iteration_s, 12), v, 2 * len(parts), k)  # a reduce-scatter and an all-gather per part
            if best is None or rank < best[0]:
                best = (rank, groups, name, scheduling, iteration_s)
    if best is None:
        raise GradschedError("dear: the profile has no tensors to group")
    _, groups, name, scheduling, iteration_s = best
    ops = two_phase_ops(groups, profile, whole)
    return (prioritized(ops) if scheduling == "priority" else ops), name, iteration_s, scheduling  # the iteration
    # as simulated: auto reuses it as its prediction


def _simulated_s(fifo: tuple[Operation, ...], scheduling: str, profile: Profile, cluster: Cluster) -> float:
    """The simulated iteration of the two-phase plan of ``fifo`` with ``scheduling``."""
    from gradsched.sim import simulate  # the simulator imports planners' types only

    ops = prioritized(fifo) if scheduling == "priority" else fifo
    trial = Plan("dear", ops, profile.fingerprint, profile.model, scheduling=scheduling, overlap_forward=True)
    return simulate(trial, profile, cluster, timeline=False).iteration_s


@register("dear", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, grouping: str = "planned", threshold_mb: float = DEFAULT_THRESHOLD_MB,
         nearby_layers: int = DEFAULT_NEARBY_LAYERS) -> Plan:
    options: dict = {"grouping": grouping}
    if grouping == "threshold":
        ops = two_phase_ops(threshold_groups(profile, threshold_mb * 1e6), profile)
        options["threshold_mb"] = threshold_mb
    elif grouping == "nearby":
        ops = two_phase_ops(nearby_groups(profile, nearby_layers), profile)
        options["nearby_layers"] = nearby_layers
    elif grouping == "planned":
        ops, chose, predicted_s, scheduling = planned(profile, cluster)
        options.update(planned_grouping=chose, predicted_iteration_s=predicted_s)
        return Plan("dear", ops, profile.fingerprint, profile.model, options, scheduling=scheduling,
                    overlap_forward=True)
    else:
        raise GradschedError(f"dear: grouping must be one of {', '.join(GROUPINGS)}, got {grouping!r}")
    return Plan("dear", ops, profile.fingerprint, profile.model, options, overlap_forward=True)
