"""``wfbp``: wait-free back-propagation, one all-reduce per tensor as soon as it is ready.

``layerwise=true``: one all-reduce per layer instead (a layer's tensors, e.g. its weight
and bias, as one message, sent when the layer's backward ends), as B-Caffe ran WFBP in
the MG-WFBP paper's experiments (its logs reduce a layer's bias with its weight)."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import Operation, Plan, Slice
from gradsched.planners import _collective as coll
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.planners.topk import layers_in_ready_order, split_by_element_size
from gradsched.profile import Profile

OPTIONS = (Option("layerwise", bool, False, doc="one all-reduce per layer (its tensors together), not per tensor"),
           coll.OPTION)


@register("wfbp", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, layerwise: bool = False, hierarchical: str = "auto") -> Plan:
    coll.check_mode("wfbp", hierarchical, cluster)
    tensors = profile.tensors
    groups = (split_by_element_size(layers_in_ready_order(profile), profile) if layerwise
              else [[t] for t in profile.order])
    kinds = coll.collectives_for([sum(tensors[t].numel * tensors[t].element_bytes for t in g) for g in groups],
                                 cluster, hierarchical)
    ops = tuple(Operation(tuple(Slice(t, 0, tensors[t].numel) for t in g), kind, j)
                for j, (g, kind) in enumerate(zip(groups, kinds)))
    return Plan("wfbp", ops, profile.fingerprint, profile.model,
                coll.recorded({"layerwise": True} if layerwise else {}, cluster, hierarchical))
