"""``optimal``: the exact best merge of consecutive gradients, by dynamic programming.

Among all plans that cut the gradient-ready order into contiguous groups of whole
tensors, each group one all-reduce issued first-in first-out, this finds one with
the earliest end of communication, hence (without next-forward overlap) the
shortest iteration ``max(backward_end + other, comm_end) + forward``.

Let ``f(i)`` be the earliest time the first ``i`` tensors (in ready order) can all be
reduced.  The last group is some ``k+1..i``; it starts when the channel frees and
its last member is ready, so

    f(i) = min over k < i of  max(f(k), r(i)) + T(bytes of tensors k+1..i)

with ``r`` the running maximum of ready times (exact: ``f(k)`` already exceeds the
ready time of every tensor before ``k``).  Each row is one numpy expression over all
``k`` (``cost.times_s``), so 1,000 tensors take O(L^2) arithmetic in O(L) Python
steps.  Any cost curve works, measured tables included: nothing assumes linearity.

Groups never mix element sizes (fp32, bf16, fp16 live in separate flat buffers in
the runtime), so ``k`` ranges only over the run of equal element size that ends at
``i``; tensors of one layer (same ready time) merge like any others.  Ties go to the
larger last group (fewer operations).

MG-WFBP's greedy rule reaches this optimum often but not always (docs/strategies.md
has a three-tensor counterexample).

Option ``stretch`` (default 1): plan for a channel that many times slower than the cluster's (every
operation's cost multiplied by it); the plan is still simulated on the cluster as measured.  A
stretched channel makes start-ups dearer against the backward's gaps, so the plan has fewer
operations and more slack: ``auto`` tries a few stretches as candidates (``planners/_slack.py``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.costs import CheaperOf, combine
from gradsched.planners.options import Option
from gradsched.plan import Plan
from gradsched.planners._tables import whole_ops
from gradsched.planners.mgwfbp import ready_envelope_s
from gradsched.planners import _collective as coll
from gradsched.planners.registry import register
from gradsched.profile import Profile


def optimal_groups(profile: Profile, cost: CollectiveCost) -> tuple[list[list[int]], float]:
    """The best contiguous groups (tensor indices in ready order) and their comm end (s)."""
    order = profile.order
    n = len(order)
    ready = np.asarray(ready_envelope_s(profile))
    sizes = np.array([profile.tensors[i].bytes for i in order], dtype=np.int64)
    prefix = np.concatenate(([0], np.cumsum(sizes))).astype(float)
    elem = [profile.tensors[i].element_bytes for i in order]
    f = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    dp = _compiled_dp() if type(cost) is CollectiveCost and cost.points is None and n >= MIN_COMPILED else None
    if dp is not None:
        dp(ready.astype(float), prefix, np.array(elem, dtype=np.int64), cost.alpha_s, cost.beta_s_per_byte, f, cut)
        return _groups(order, cut), float(f[n])
    run_start = 0
    for i in range(1, n + 1):
        if i > 1 and elem[i - 1] != elem[i - 2]:
            run_start = i - 1
        cand = np.maximum(f[run_start:i], ready[i - 1]) + cost.times_s(prefix[i] - prefix[run_start:i])
        k = int(np.argmin(cand))
        f[i] = cand[k]
        cut[i] = run_start + k
    return _groups(order, cut), float(f[n])


def _groups(order: tuple[int, ...], cut: np.ndarray) -> list[list[int]]:
    """The groups the cuts make, in ready order (``cut[i]``: where the group ending before ``i`` starts)."""
    groups: list[list[int]] = []
    i = len(order)
    while i > 0:
        k = int(cut[i])
        groups.append([order[j] for j in range(k, i)])
        i = k
    groups.reverse()
    return groups


MIN_COMPILED = 64  # fewer tensors: the numpy loop takes less than calling the compiled one


def _compiled_dp() -> Callable[..., None] | None:
    from gradsched.sim import _kernel  # numba, where installed (gradsched[fast])

    return _kernel.compiled(line_dp)


def line_dp(ready: np.ndarray, prefix: np.ndarray, elem: np.ndarray, alpha: float, beta: float, f: np.ndarray,
            cut: np.ndarray) -> None:
    """:func:`optimal_groups`' recurrence for a plain line (``alpha + beta * bytes``, 0 bytes free), the same
    floats compared in the same order (the first of equal candidates wins, as ``argmin``), compiled by
    :func:`gradsched.sim._kernel.compiled`: fills ``f`` and ``cut``."""
    run_start = 0
    for i in range(1, ready.shape[0] + 1):
        if i > 1 and elem[i - 1] != elem[i - 2]:
            run_start = i - 1
        best, at = np.inf, run_start
        for k in range(run_start, i):
            size = prefix[i] - prefix[k]
            c = max(f[k], ready[i - 1]) + (0.0 if size <= 0 else alpha + beta * size)
            if c < best:
                best, at = c, k
        f[i] = best
        cut[i] = at


def stretched(cost: CollectiveCost, factor: float) -> CollectiveCost:
    """``cost`` with every time multiplied by ``factor`` (``cost`` itself at 1)."""
    if factor == 1:
        return cost
    if isinstance(cost, CheaperOf) and cost.first is not None and cost.second is not None:
        return CheaperOf(cost.alpha_s * factor, cost.beta_s_per_byte * factor,
                         first=stretched(cost.first, factor), second=stretched(cost.second, factor))
    return combine([(factor, cost)])


STRETCH = Option("stretch", float, 1.0, low=1.0, high=100.0,
                 doc="plan for a channel this many times slower (fewer operations, more slack)")


@register("optimal", options=(coll.OPTION, STRETCH))
def plan(profile: Profile, cluster: Cluster, hierarchical: str = "auto", stretch: float = 1.0) -> Plan:
    coll.check_mode("optimal", hierarchical, cluster)
    groups, _ = optimal_groups(profile, stretched(coll.planning_cost(cluster, hierarchical), stretch))
    ops = coll.choose_collective(whole_ops(groups, profile), profile, cluster, hierarchical)
    options = {} if stretch == 1 else {"stretch": stretch}
    return Plan("optimal", ops, profile.fingerprint, profile.model, coll.recorded(options, cluster, hierarchical))
