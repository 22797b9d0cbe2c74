"""``threshold``: fixed-size buckets in ready order (option ``mb``, the bucket size in MiB)."""

from __future__ import annotations

import itertools

from gradsched.cluster import Cluster
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.constants import MiB
from gradsched.planners._buckets import buckets_by_size
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile


OPTIONS = (Option("mb", float, 25.0, low=0, low_open=True, high=1e9, doc="bucket size in MiB"),)


@register("threshold", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, mb: float = 25.0) -> Plan:
    groups = buckets_by_size(profile, itertools.repeat(mb * MiB))
    return Plan("threshold", whole_tensor_ops(groups, profile), profile.fingerprint, profile.model, {"mb": mb})
