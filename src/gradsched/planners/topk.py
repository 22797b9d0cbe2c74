"""``topk``: layer-wise top-k sparsification, one top-k all-gather per layer.

Each layer's gradients (all its tensors of one element size together) go as one
``topk-allgather`` operation that sends the ``k = ceil(density * numel)`` (:func:`gradsched.sparsity.k_of`)
largest-magnitude entries with their int32 indices; what is not sent stays in a
residual for the next iteration (error feedback, in the runtime).  Layer-wise top-k pipelines well with
backward but pays a start-up and a selection per layer: ``omgs`` merges layers
where that pays.  The default density 0.001 is OMGS-SGD's.

Granularity (``per_tensor``): the authors' code selects each parameter tensor on its
own; gradsched's unit is the layer.  A selection costs ``c * n * log2(n)``, more than
linear, so selecting a layer's tensors one by one is cheaper, and the first one's
all-gather starts sooner, at the price of a start-up per tensor.  Left out, both are
planned and the one with the shorter simulated iteration kept (ties: per layer), so the
plan is never predicted slower than the authors' granularity or the layer's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from gradsched.cluster import Cluster
from gradsched.plan import SPARSE, Operation, Plan, Slice, whole_tensor_ops
from gradsched.planners._tables import tensor_table
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile
from gradsched.sparsity import DENSITY

DEFAULT_DENSITY = 0.001


def layers_in_ready_order(profile: Profile) -> list[list[int]]:
    """Tensor indices grouped by layer, layers in the order their backward ends."""
    return [list(layer) for layer in profile.layer_table.ready]


def tensors_in_ready_order(profile: Profile) -> list[list[int]]:
    """Each tensor on its own (the authors' granularity), layers in the order their backward
    ends, a layer's tensors in its own order."""
    return [[i] for layer in profile.layer_table.ready for i in layer]


def units_in_ready_order(profile: Profile, per_tensor: bool) -> list[list[int]]:
    """What a sparse planner groups: the layers, or each tensor on its own."""
    return tensors_in_ready_order(profile) if per_tensor else layers_in_ready_order(profile)


def choose_granularity(build: Callable[[bool], tuple[Plan, float | None]], profile: Profile, cluster: Cluster,
                       per_tensor: bool | None) -> Plan:
    """``build(per_tensor)``'s plan: for the one asked, or, left out (None), for both (the layer
    first) the one with the shorter simulated iteration (ties: per layer).  ``build`` returns the
    plan and its simulated iteration where it knows it (else None: simulated here).  Per tensor
    is not tried where no layer has two tensors (the same plan)."""
    if per_tensor is not None:
        return build(per_tensor)[0]
    if all(len(layer) == 1 for layer in profile.layer_table.ready):
        return build(False)[0]
    from gradsched.sim import simulate  # the simulator imports planners' types only

    tried: list[tuple[float, Plan]] = []
    for choice in (False, True):
        plan_, t = build(choice)
        tried.append((simulate(plan_, profile, cluster, timeline=False).iteration_s if t is None else t, plan_))
    return min(tried, key=lambda tp: tp[0])[1]  # ties: the first (per layer)


def split_by_element_size(groups: list[list[int]], profile: Profile) -> list[list[int]]:
    """Each group's tensors split by element size, as the runtime needs (one operation, one
    dtype): each part keeps the group's order, and the parts go in the order their last
    tensors become ready, so none waits behind a later one in issue order.  Groups of one
    element size are returned as they are."""
    table = tensor_table(profile)
    if table.one_size:
        return list(groups)
    size = table.element_bytes
    out: list[list[int]] = []
    position: dict[int, int] | None = None
    for group in groups:
        parts: dict[int, list[int]] = {}
        for t in group:
            parts.setdefault(size[t], []).append(t)
        if len(parts) == 1:
            out.append(group)
            continue
        if position is None:
            position = {t: k for k, t in enumerate(profile.order)}
        out += sorted(parts.values(), key=lambda part: max(position[t] for t in part))
    return out


def sparse_ops(groups: list[list[int]], profile: Profile, density: float,
               whole: list[Slice] | None = None) -> tuple[Operation, ...]:
    """One top-k all-gather per group and element size (:func:`split_by_element_size`)."""
    return whole_tensor_ops(split_by_element_size(groups, profile), profile, collective=SPARSE, density=density,
                            whole=whole)


PER_TENSOR = Option("per_tensor", bool, None, optional=True,
                    doc="select each tensor on its own (the authors' granularity) or each layer; "
                        "left out: chosen by simulation")
OPTIONS = (replace(DENSITY, default=DEFAULT_DENSITY), PER_TENSOR)


@register("topk", sparse=True, options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, density: float = DEFAULT_DENSITY, per_tensor: bool | None = None) -> Plan:
    def build(choice: bool) -> tuple[Plan, None]:
        ops = sparse_ops(units_in_ready_order(profile, choice), profile, density)
        return Plan("topk", ops, profile.fingerprint, profile.model, {"density": density, "per_tensor": choice}), None

    return choose_granularity(build, profile, cluster, per_tensor)
