"""``mgwfbp`` and ``optimal``: coverage, exactness, and hand-computed timelines."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, Profile, TensorProfile
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.planners import make_plan, strategy_names
from gradsched.planners.mgwfbp import merge_groups, ready_envelope_s
from gradsched.planners.optimal import optimal_groups
from gradsched.sim import simulate
from strategies import clusters, profiles

MS = 1e-3
MB = 1_000_000
SETTINGS = settings(max_examples=60, deadline=None)


def iteration_s(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    return simulate(plan, profile, cluster, timeline=False).iteration_s


def groups_of(plan: Plan) -> list[tuple[int, ...]]:
    return [op.tensors() for op in plan.operations]


def fp32(name: str, numel: int, backward_s: float, forward_s: float = 0.0) -> TensorProfile:
    return TensorProfile(name, numel, 4 * numel, forward_s, backward_s)


# --------------------------------------------------------------------------- coverage
@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from(["mgwfbp", "optimal"]))
def test_every_element_sent_once_and_dtypes_never_mix(profile, cluster, name):
    plan = make_plan(name, profile, cluster)
    plan.check(profile)
    for op in plan.operations:
        assert len({profile.tensors[s.tensor].element_bytes for s in op.slices}) == 1
        assert all(s.start == 0 and s.end == profile.tensors[s.tensor].numel for s in op.slices)
    # groups are contiguous runs of the ready order, in order
    assert [i for g in groups_of(plan) for i in g] == list(profile.order)


# --------------------------------------------------------------------------- mgwfbp = the rule as written
def mgwfbp_as_written(profile: Profile, cost: CollectiveCost) -> list[list[int]]:
    """The O(L^2) rule literally: after each merge, recompute every start time."""
    order = list(profile.order)
    n = len(order)
    r = ready_envelope_s(profile)
    size = [profile.tensors[i].bytes for i in order]
    elem = [profile.tensors[i].element_bytes for i in order]
    tc = [cost.time_s(s) for s in size]
    merged_into_next = [False] * n

    def starts() -> list[float]:
        out = [r[0]]
        for j in range(1, n):
            out.append(max(out[j - 1] + tc[j - 1], r[j]))
        return out

    for j in range(n - 1):
        start = starts()
        if elem[j] == elem[j + 1] and r[j + 1] - start[j] < cost.alpha_s and r[j + 1] < start[j] + tc[j]:
            size[j + 1] += size[j]
            size[j], tc[j] = 0, 0.0
            tc[j + 1] = cost.time_s(size[j + 1])
            merged_into_next[j] = True
    groups, current = [], []
    for j, i in enumerate(order):
        current.append(i)
        if not merged_into_next[j]:
            groups.append(current)
            current = []
    return groups


@SETTINGS
@given(profiles(max_layers=12, mixed_dtypes=True), clusters())
def test_mgwfbp_makes_the_same_decisions_as_the_quadratic_rule(profile, cluster):
    cost = cluster.cost("allreduce")
    assert merge_groups(profile, cost) == mgwfbp_as_written(profile, cost)


def test_mgwfbp_tie_is_the_authors_test_bit_for_bit():
    # Ready at 2.0 and 2.1 ms, alpha 0.1 ms: the second tensor's wait after the first one's
    # start is 2.1 - 2.0 ms, in floats 9.999999999999983e-05 s < alpha, so the authors'
    # `r_next - start < alpha` merges the two into one group; the algebraically equal
    # `start > r_next - alpha` (2.0 ms > 0.002 s exactly: false) would not.
    p = Profile("tie", (fp32("b", MB // 4, 0.1 * MS), fp32("a", MB // 4, 2.0 * MS)))
    c = Cluster.alpha_beta(0.1 * MS, 1e-9, 8)
    assert p.ready_s[1] == 2.0 * MS and p.ready_s[0] - p.ready_s[1] < 0.1 * MS
    assert not p.ready_s[1] > p.ready_s[0] - 0.1 * MS  # the other way of writing it: no merge
    assert merge_groups(p, c.cost("allreduce")) == [[1, 0]]
    assert groups_of(make_plan("mgwfbp", p, c)) == [(1, 0)]


# --------------------------------------------------------------------------- optimal
def brute_force_best_s(profile: Profile, cluster: Cluster) -> float:
    order = list(profile.order)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for cut, i in zip(cuts, order[1:]):
            if cut:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
        plan = Plan("brute", whole_tensor_ops(groups, profile), profile.fingerprint)
        best = min(best, iteration_s(plan, profile, cluster))
    return best


@settings(max_examples=40, deadline=None)
@given(profiles(max_layers=4), clusters())  # at most 8 tensors: 128 partitions
def test_optimal_equals_brute_force_over_all_contiguous_merges(profile, cluster):
    got = iteration_s(make_plan("optimal", profile, cluster), profile, cluster)
    assert got == pytest.approx(brute_force_best_s(profile, cluster), rel=1e-12, abs=1e-15)


@SETTINGS
@given(profiles(max_layers=4), clusters())
def test_optimal_dp_value_is_the_simulated_comm_end(profile, cluster):
    _, comm_end_s = optimal_groups(profile, cluster.cost("allreduce"))
    result = simulate(make_plan("optimal", profile, cluster), profile, cluster, timeline=False)
    assert comm_end_s == pytest.approx(result.comm_end_s, rel=1e-12)


BASELINES = ("wfbp", "sync", "threshold", "ddp", "horovod", "mgwfbp")


@SETTINGS
@given(profiles(max_layers=12), clusters())
def test_optimal_is_never_slower_than_any_contiguous_merge_strategy(profile, cluster):
    best = iteration_s(make_plan("optimal", profile, cluster), profile, cluster)
    compared = [name for name in BASELINES if name in strategy_names()]
    assert "mgwfbp" in compared and "wfbp" in compared
    variants = [(name, {}) for name in compared]
    if "threshold" in compared:
        variants += [("threshold", {"mb": mb}) for mb in (0.5, 2.0, 8.0)]
    for name, opts in variants:
        plan = make_plan(name, profile, cluster, **opts)
        assert best <= iteration_s(plan, profile, cluster) * (1 + 1e-12), (name, opts)


@SETTINGS
@given(profiles(max_layers=10), clusters(zero_alpha=True))
def test_without_start_up_cost_per_tensor_wfbp_is_optimal(profile, cluster):
    wfbp = iteration_s(make_plan("wfbp", profile, cluster), profile, cluster)
    assert iteration_s(make_plan("optimal", profile, cluster), profile, cluster) == pytest.approx(wfbp, rel=1e-12)


def test_optimal_plans_a_thousand_tensors_quickly():
    # The speed target (< 50 ms) is measured by benchmarks/planner_speed.py; here only a
    # generous bound that catches an accidental O(L^3) or a per-row Python loop.  This process's
    # CPU time, not the wall clock: another process on the core does not count.
    import time

    tensors = tuple(fp32(f"t{i}", 1000 + 37 * i, 1e-4) for i in range(1000))
    profile = Profile("wide", tensors)
    cluster = Cluster.alpha_beta(1e-3, 1e-9, 8)
    make_plan("optimal", Profile("warm", tensors[:100]), cluster)  # once per process: numba's compile or cache load
    t0 = time.process_time()
    make_plan("optimal", profile, cluster)
    assert time.process_time() - t0 < 1.0


# --------------------------------------------------------------------------- hand-computed timelines
# alpha = 5 ms, beta = 1 ms/MB.  Forward order t0 (1 MB), t1 (1 MB), t2 (6 MB); backward
# runs t2 (4 ms), t1 (4 ms), t0 (6 ms): ready at 4, 8 and 14 ms.
COUNTEREXAMPLE = Profile("counterexample", (fp32("t0", MB // 4, 6 * MS), fp32("t1", MB // 4, 4 * MS),
                                            fp32("t2", 6 * MB // 4, 4 * MS)))
CLUSTER_5MS = Cluster.alpha_beta(5 * MS, 1e-9, 2)


def test_mgwfbp_timeline_by_hand_and_greedy_is_not_optimal():
    # MG-WFBP: t2 would start at 4 > r(t1) - alpha = 3 and still be running at 8: merge.
    #   {t2, t1} starts at 8, T(7 MB) = 12 -> ends 20.  t0: is 8 > r(t0) - alpha = 9?  No: own op.
    #   t0 starts at max(20, 14) = 20, T(1 MB) = 6 -> ends 26.  Iteration 26 ms.
    # Optimal: t2 alone 4 -> 15 (T(6 MB) = 11); {t1, t0} ready 14, starts 15, T(2 MB) = 7 -> 22.
    # The greedy rule saves t1's start-up (5 ms for 4 ms of delay) but holds the big t2
    # back so that the channel is busy when t0 arrives; merging t1 with t0 instead wins.
    p, c = COUNTEREXAMPLE, CLUSTER_5MS
    mg = simulate(make_plan("mgwfbp", p, c), p, c)
    assert groups_of(make_plan("mgwfbp", p, c)) == [(2, 1), (0,)]
    assert mg.op_start_s == pytest.approx([8 * MS, 20 * MS])
    assert mg.op_end_s == pytest.approx([20 * MS, 26 * MS])
    assert mg.iteration_s == pytest.approx(26 * MS)

    opt = simulate(make_plan("optimal", p, c), p, c)
    assert groups_of(make_plan("optimal", p, c)) == [(2,), (1, 0)]
    assert opt.op_start_s == pytest.approx([4 * MS, 15 * MS])
    assert opt.op_end_s == pytest.approx([15 * MS, 22 * MS])
    assert opt.iteration_s == pytest.approx(22 * MS)


def test_mgwfbp_merges_small_tensors_that_would_wait_anyway():
    # alpha = 2 ms, beta = 1 ms/MB.  Ready order (forward t3, t2, t1, t0 reversed):
    #   t3: 4 MB ready 1 ms; t2: 0.5 MB ready 2; t1: 0.5 MB ready 3; t0: 1 MB ready 10, forward 1 ms each.
    # t3 starts 1, T = 6 -> ends 7; r(t2) - alpha = 0 < 1 and 2 < 7: merge t3 into t2?  The rule
    # merges: {t3, t2} starts at 2, T(4.5 MB) = 6.5 -> 8.5.  At t2 (merged) start 2 > r(t1) - 2 = 1
    # and 3 < 8.5: merge again: {t3, t2, t1} starts 3, T(5 MB) = 7 -> 10.  Then 3 > r(t0) - 2 = 8?
    # No: close.  t0 starts max(10, 10) = 10, T(1 MB) = 3 -> 13.  Backward ends 10, forward 4 ms:
    # iteration = max(10, 13) + 4 = 17 ms (WFBP: t3 1-7, t2 7-9.5, t1 9.5-12, t0 12-15: 19 ms).
    tensors = (fp32("t0", MB // 4, 7 * MS, 1 * MS), fp32("t1", MB // 8, 1 * MS, 1 * MS),
               fp32("t2", MB // 8, 1 * MS, 1 * MS), fp32("t3", MB, 1 * MS, 1 * MS))
    p = Profile("small", tensors)
    c = Cluster.alpha_beta(2 * MS, 1e-9, 4)
    plan = make_plan("mgwfbp", p, c)
    assert groups_of(plan) == [(3, 2, 1), (0,)]
    r = simulate(plan, p, c)
    assert r.op_start_s == pytest.approx([3 * MS, 10 * MS])
    assert r.op_end_s == pytest.approx([10 * MS, 13 * MS])
    assert r.iteration_s == pytest.approx(17 * MS)
    assert iteration_s(make_plan("wfbp", p, c), p, c) == pytest.approx(19 * MS)
    # here the greedy rule is optimal
    assert iteration_s(make_plan("optimal", p, c), p, c) == pytest.approx(17 * MS)


def test_optimal_respects_a_measured_table():
    # A table where 2 MB costs as much as 1 MB (protocol switch): merging two 1 MB tensors
    # is free, so optimal merges them although the fitted line (alpha 0) says it never pays.
    # Ready at 1 and 2 ms.  Separate: 1 -> 3, 3 -> 5.  Merged: starts 2, ends 4.
    cost = CollectiveCost(0.0, 2e-9, ((1e6, 2 * MS), (2e6, 2 * MS), (4e6, 8 * MS)))
    c = Cluster(2, {"allreduce": cost})
    p = Profile("table", (fp32("a", MB // 4, 1 * MS), fp32("b", MB // 4, 1 * MS)))
    r = simulate(make_plan("optimal", p, c), p, c)
    assert r.op_start_s == pytest.approx([2 * MS]) and r.op_end_s == pytest.approx([4 * MS])
    assert iteration_s(make_plan("wfbp", p, c), p, c) == pytest.approx(5 * MS)
