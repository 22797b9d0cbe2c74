"""``topk``: layer-wise top-k sparsification, one top-k all-gather per layer.

Each layer's gradients (all its tensors of one element size together) go as one
``topk-allgather`` operation that sends the ``k = ceil(density * numel)``
largest-magnitude entries with their int32 indices; what is not sent stays in a
residual for the next iteration (error feedback, in the runtime).  Layer-wise top-k pipelines well with
backward but pays a start-up and a selection per layer: ``omgs`` merges layers
where that pays.  The default density 0.001 is OMGS-SGD's.
"""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import SPARSE, Operation, Plan, Slice, whole_tensor_ops
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile

DEFAULT_DENSITY = 0.001


def layers_in_ready_order(profile: Profile) -> list[list[int]]:
    """Tensor indices grouped by layer, layers in the order their backward ends."""
    return [list(layer) for layer in profile.layer_table.ready]


def split_by_element_size(groups: list[list[int]], profile: Profile) -> list[list[int]]:
    """Each group's tensors split by element size, as the runtime needs (one operation, one
    dtype): each part keeps the group's order, and the parts go in the order their last
    tensors become ready, so none waits behind a later one in issue order.  Groups of one
    element size are returned as they are."""
    size = [t.element_bytes for t in profile.tensors]
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


OPTIONS = (Option("density", float, DEFAULT_DENSITY, low=0, low_open=True, high=1,
                  doc="fraction of each gradient's elements sent"),)


@register("topk", sparse=True, options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, density: float = DEFAULT_DENSITY) -> Plan:
    return Plan("topk", sparse_ops(layers_in_ready_order(profile), profile, density), profile.fingerprint, profile.model, {"density": density})
