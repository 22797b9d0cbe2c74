"""``mgwfbp``: MG-WFBP's greedy merge of consecutive gradients (Shi, Chu, Li; TPDS 2021).

WFBP starts each tensor's all-reduce as soon as its gradient is ready, so every
tensor pays the start-up ``alpha``.  MG-WFBP sweeps the tensors in gradient-ready
order and merges tensor ``j`` into the next one, ``j+1``, when ``j``'s all-reduce
would start less than ``alpha`` before ``j+1`` is ready, ``r[j+1] - start[j] < alpha``
(it would wait for the channel until nearly the moment ``j+1`` is ready): one
start-up is saved for less than ``alpha`` of delay.  The test is written as the
authors' code writes it, bit for bit: ``start[j] > r[j+1] - alpha`` rounds differently
where the wait equals ``alpha`` (ready at 2.0 and 2.1 ms, alpha 0.1 ms: 2.1 - 2.0 is
just under 0.1 in floats, so the authors merge, and so does gradsched).  As in the authors'
code, a merge also needs ``j``'s all-reduce
to be still running when ``j+1`` becomes ready (``r[j+1] < start[j] + T(s[j])``);
with a cost line ``T(s) >= alpha`` that is implied, with a measured table it keeps
a small, fast tensor from being held back.

The costs are the cluster's measured ones (``cost.time_s``, a table where there is
one) and ``alpha`` is the fitted line's start-up.  A merge never crosses element
sizes: the runtime keeps fp32, bf16 and fp16 gradients in separate flat buffers.

The rule as written recomputes every start time after each merge (O(L^2)).  A merge
only changes the merged group's own start and size, never an earlier group, so one
sweep that carries "when the channel frees" and the open group's size makes the
same decisions in O(L).
"""

from __future__ import annotations

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.plan import Plan
from gradsched.planners._tables import whole_ops
from gradsched.planners import _collective as coll
from gradsched.planners.registry import register
from gradsched.profile import Profile


def ready_envelope_s(profile: Profile) -> list[float]:
    """Ready time of each tensor in ready order, made non-decreasing.

    A group of consecutive tensors can start only once its latest member is ready;
    along ``profile.order`` that is the running maximum (a tensor met late in the
    order but belonging to a layer finished earlier is ready early)."""
    out: list[float] = []
    latest = 0.0
    for i in profile.order:
        latest = max(latest, profile.ready_s[i])
        out.append(latest)
    return out


def merge_groups(profile: Profile, cost: CollectiveCost) -> list[list[int]]:
    """MG-WFBP's groups of tensor indices, in ready order (see the module docstring)."""
    order = profile.order
    ready = ready_envelope_s(profile)
    alpha = cost.alpha_s
    tensors = profile.tensors
    groups: list[list[int]] = []
    current: list[int] = []
    size_bytes = 0
    channel_free_s = 0.0
    last = len(order) - 1
    for pos, i in enumerate(order):
        current.append(i)
        size_bytes += tensors[i].bytes
        start_s = max(channel_free_s, ready[pos])
        comm_s = cost.time_s(size_bytes)
        if pos < last:
            nxt = order[pos + 1]
            r_next = ready[pos + 1]
            if (tensors[nxt].element_bytes == tensors[i].element_bytes
                    and r_next - start_s < alpha and r_next < start_s + comm_s):
                continue  # merge: the open group rides along with the next tensor
        groups.append(current)
        channel_free_s = start_s + comm_s
        current, size_bytes = [], 0
    return groups


@register("mgwfbp", options=(coll.OPTION,))
def plan(profile: Profile, cluster: Cluster, hierarchical: str = "auto") -> Plan:
    coll.check_mode("mgwfbp", hierarchical, cluster)
    groups = merge_groups(profile, coll.planning_cost(cluster, hierarchical))
    ops = coll.choose_collective(whole_ops(groups, profile), profile, cluster, hierarchical)
    return Plan("mgwfbp", ops, profile.fingerprint, profile.model, coll.recorded({}, cluster, hierarchical))
