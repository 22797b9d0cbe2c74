"""``threshold``: fixed-size buckets in ready order (option ``mb``, the bucket size in MiB)."""

from __future__ import annotations

import itertools

from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.planners._tables import whole_ops
from gradsched.constants import MiB
from gradsched.planners._buckets import buckets_by_size
from gradsched.planners import _collective as coll
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile


OPTIONS = (Option("mb", float, 25.0, low=0, low_open=True, high=1e9, doc="bucket size in MiB", size=True),
           coll.OPTION)


@register("threshold", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, mb: float = 25.0, hierarchical: str = "auto") -> Plan:
    coll.check_mode("threshold", hierarchical, cluster)
    groups = buckets_by_size(profile, itertools.repeat(mb * MiB))
    ops = coll.choose_collective(whole_ops(groups, profile), profile, cluster, hierarchical)
    return Plan("threshold", ops, profile.fingerprint, profile.model, coll.recorded({"mb": mb}, cluster, hierarchical))
