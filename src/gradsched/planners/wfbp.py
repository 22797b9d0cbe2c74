"""``wfbp``: wait-free back-propagation, one all-reduce per tensor as soon as it is ready."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.planners import _collective as coll
from gradsched.planners.registry import register
from gradsched.profile import Profile


@register("wfbp", options=(coll.OPTION,))
def plan(profile: Profile, cluster: Cluster, hierarchical: str = "auto") -> Plan:
    coll.check_mode("wfbp", hierarchical, cluster)
    ops = coll.choose_collective(whole_tensor_ops([[t] for t in profile.order], profile), profile, cluster, hierarchical)
    return Plan("wfbp", ops, profile.fingerprint, profile.model, coll.recorded({}, cluster, hierarchical))
