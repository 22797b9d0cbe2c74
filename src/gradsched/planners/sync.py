"""``sync``: SyncEASGD, one all-reduce of every gradient after backward (per dtype)."""

from __future__ import annotations

from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.planners._tables import whole_ops
from gradsched.planners.registry import register
from gradsched.profile import Profile


@register("sync")
def plan(profile: Profile, cluster: Cluster) -> Plan:
    by_dtype: dict[int, list[int]] = {}
    for i in profile.order:
        by_dtype.setdefault(profile.tensors[i].element_bytes, []).append(i)
    return Plan("sync", whole_ops(by_dtype.values(), profile), profile.fingerprint, profile.model)
