"""``horovod``: Horovod's tensor fusion, replayed on the cost model.

Horovod's background thread wakes every ``cycle_ms``, fuses every gradient that
became ready (up to ``fusion_mb``) into one all-reduce, and runs it before the next
cycle; gradients that become ready meanwhile wait for the next fusion.  The grouping
therefore depends on how long each fused all-reduce takes, so the planner replays
that loop with the cluster's cost model and records the groups it forms."""

from __future__ import annotations

import math

from gradsched.cluster import Cluster
from gradsched.constants import MiB
from gradsched.plan import Plan
from gradsched.planners._tables import tensor_table, whole_ops
from gradsched.planners.options import Option
from gradsched.planners.registry import register
from gradsched.profile import Profile


OPTIONS = (
    Option("fusion_mb", float, 128.0, low=0, low_open=True, high=1e9, doc="fusion buffer size in MiB", size=True),
    # below a microsecond the cycle is no longer a time Horovod's thread can keep (and
    # cycle_ms / 1e3 may round to 0)
    Option("cycle_ms", float, 1.0, low=1e-3, high=1e6, doc="background thread's cycle in milliseconds"),
)


@register("horovod", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, fusion_mb: float = 128.0, cycle_ms: float = 1.0) -> Plan:
    cap, cycle = fusion_mb * MiB, cycle_ms / 1e3
    cost = cluster.cost("allreduce")
    ready = profile.ready_s
    order = list(profile.order)
    table = tensor_table(profile)
    elem, nbytes = table.element_bytes, table.nbytes
    groups: list[list[int]] = []
    k, t = 0, 0.0
    while k < len(order):
        # the first cycle tick at which something is ready and the thread is idle
        t = max(t, math.ceil(ready[order[k]] / cycle - 1e-9) * cycle)
        by_dtype: dict[int, tuple[list[int], int]] = {}
        while k < len(order) and ready[order[k]] <= t + 1e-12:
            i = order[k]
            eb = elem[i]
            members, size = by_dtype.get(eb, ([], 0))
            if members and size + nbytes[i] > cap:
                groups.append(members)
                members, size = [], 0
            by_dtype[eb] = (members + [i], size + nbytes[i])
            k += 1
        for members, size in by_dtype.values():
            groups.append(members)
            t += cost.time_s(size)
    return Plan("horovod", whole_ops(groups, profile), profile.fingerprint, profile.model,
                {"fusion_mb": fusion_mb, "cycle_ms": cycle_ms})
