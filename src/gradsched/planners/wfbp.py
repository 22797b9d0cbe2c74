"""``wfbp``: wait-free back-propagation, one all-reduce per tensor as soon as it is ready.

``layerwise=true``: one all-reduce per layer instead (a layer's tensors, e.g. its weight
and bias, as one message, sent when the layer's backward ends), as B-Caffe ran WFBP in
the MG-WFBP paper's experiments (its logs reduce a layer's bias with its weight)."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.planners.topk import layers_in_ready_order
from gradsched.profile import Profile

OPTIONS = (Option("layerwise", bool, False, doc="one all-reduce per layer (its tensors together), not per tensor"),)


def _layer_groups(profile: Profile) -> list[list[int]]:
    """Each layer's tensors in ready order, split by element size (an operation never mixes them)."""
    groups: list[list[int]] = []
    for layer in layers_in_ready_order(profile):
        by_size: dict[int, list[int]] = {}
        for t in layer:
            by_size.setdefault(profile.tensors[t].element_bytes, []).append(t)
        groups += by_size.values()
    return groups


@register("wfbp", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, layerwise: bool = False) -> Plan:
    groups = _layer_groups(profile) if layerwise else [[t] for t in profile.order]
    return Plan("wfbp", whole_tensor_ops(groups, profile), profile.fingerprint, profile.model,
                {"layerwise": True} if layerwise else {})
