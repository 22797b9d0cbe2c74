"""``wfbp``: wait-free back-propagation, one all-reduce per tensor as soon as it is ready."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import Operation, Plan, Slice
from gradsched.planners import _collective as coll
from gradsched.planners.registry import register
from gradsched.profile import Profile


@register("wfbp", options=(coll.OPTION,))
def plan(profile: Profile, cluster: Cluster, hierarchical: str = "auto") -> Plan:
    coll.check_mode("wfbp", hierarchical, cluster)
    tensors, order = profile.tensors, profile.order
    kinds = coll.collectives_for([tensors[t].numel * tensors[t].element_bytes for t in order], cluster, hierarchical)
    ops = tuple(Operation((Slice(t, 0, tensors[t].numel),), kind, j) for j, (t, kind) in enumerate(zip(order, kinds)))
    return Plan("wfbp", ops, profile.fingerprint, profile.model, coll.recorded({}, cluster, hierarchical))
