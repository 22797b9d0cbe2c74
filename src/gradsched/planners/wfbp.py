"""``wfbp``: wait-free back-propagation, one all-reduce per tensor as soon as it is ready."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.planners.registry import register
from gradsched.profile import Profile


@register("wfbp")
def plan(profile: Profile, cluster: Cluster) -> Plan:
    return Plan("wfbp", whole_tensor_ops([[t] for t in profile.order], profile),
                profile.fingerprint, profile.model)
