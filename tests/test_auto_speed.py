"""``auto``'s faster search (shared results for equal plans, a lower bound that skips
candidates) returns exactly the plan of simulating every candidate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.constants import MiB
from gradsched.planners import make_plan
from gradsched.planners.auto import (GRID, USBYTE_MERGE_BYTES, as_auto, bytescheduler_floor_s, comm_lower_bound_s,
                                     sparse_floor_s,
                                     dear_floor_s, ranked, usbyte_floor_s)
from gradsched.sim import simulate
from gradsched.synthetic import random_case
from strategies import clusters, profiles, two_level_clusters

SETTINGS = settings(max_examples=25, deadline=None)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([1.0, 0.05]),
       st.sampled_from([1, 2]))
def test_auto_returns_the_plan_of_simulating_every_candidate(profile, cluster, density, channels):
    every = ranked(profile, cluster, density, channels)
    expected = as_auto(every[0], len(every), density)
    got = make_plan("auto", profile, cluster, density=density, channels=channels)
    assert got == expected


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from([1, 2]))
def test_lower_bound_never_exceeds_the_simulated_iteration(profile, cluster, channels):
    for r in ranked(profile, cluster, 0.05, channels):
        bound = comm_lower_bound_s(r.plan, profile, cluster, channels)
        assert bound <= simulate(r.plan, profile, cluster, channels=channels, timeline=False).iteration_s * (1 + 1e-9)
        if any(op.sparse for op in r.plan.operations):
            assert bound == 0.0


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([1, 2]))
def test_usbyte_floor_never_exceeds_the_simulated_iteration(profile, cluster, channels):
    # auto skips planning a usbyte candidate whose floor is above the best so far: the floor,
    # from the profile alone, must hold for every plan usbyte makes, every rule and merge.
    for merge_bytes in USBYTE_MERGE_BYTES:
        floor = usbyte_floor_s(profile, cluster, {"merge_bytes": merge_bytes}, channels)
        for extend in (False, True):
            plan = make_plan("usbyte", profile, cluster, merge_bytes=merge_bytes, extend=extend, unit_bytes=64 << 10)
            simulated = simulate(plan, profile, cluster, channels=channels, timeline=False).iteration_s
            assert floor <= simulated * (1 + 1e-9)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([1, 2]),
       st.sampled_from([1 << 10, 64 << 10, 1 << 20]))
def test_bytescheduler_and_dear_floors_never_exceed_the_simulated_iteration(profile, cluster, channels, partition):
    # auto skips planning a bytescheduler or dear candidate whose floor is above the best so far
    plan = make_plan("bytescheduler", profile, cluster, partition_bytes=partition)
    floor = bytescheduler_floor_s(profile, cluster, {"partition_bytes": partition}, channels)
    assert floor <= simulate(plan, profile, cluster, channels=channels, timeline=False).iteration_s * (1 + 1e-9)
    if floor > 0:  # the plan's own bound, without the plan: every block counted
        assert floor >= comm_lower_bound_s(plan, profile, cluster, channels) * (1 - 1e-9)
    for grouping in ("planned", "threshold", "nearby"):
        plan = make_plan("dear", profile, cluster, grouping=grouping)
        simulated = simulate(plan, profile, cluster, channels=channels, timeline=False).iteration_s
        assert dear_floor_s(profile, cluster, channels) <= simulated * (1 + 1e-9)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), two_level_clusters(), st.sampled_from(["auto", "always", "never"]))
def test_bytescheduler_floor_with_hierarchical_blocks(profile, cluster, hierarchical):
    opts = {"partition_bytes": 64 << 10, "hierarchical": hierarchical}
    plan = make_plan("bytescheduler", profile, cluster, **opts)
    floor = bytescheduler_floor_s(profile, cluster, opts)
    assert floor <= simulate(plan, profile, cluster, timeline=False).iteration_s * (1 + 1e-9)


def test_auto_does_not_plan_dear_where_compute_alone_keeps_it_from_winning(monkeypatch):
    # compute-bound (alpha 10 us, 0.1 ns/B, 8 workers, the benchmark's 2e12 flop/s): the best
    # plan hides its all-reduces, and dear would need to beat it by 2% with the same compute
    from gradsched import Cluster
    from gradsched.planners import registry
    from gradsched.synthetic import heldout_profile

    profile = heldout_profile(60, seed=3, flops_per_s=2e10)
    cluster = Cluster.alpha_beta(1e-5, 1e-10, 8)
    planned = []
    dear = registry._PLANNERS["dear"]
    monkeypatch.setitem(registry._PLANNERS, "dear", lambda *a, **k: planned.append(1) or dear(*a, **k))
    got = make_plan("auto", profile, cluster)
    assert got.options["predicted_iteration_s"] < profile.compute_s / (1 - 0.02)
    assert planned == [] and got == as_auto(ranked(profile, cluster)[0], len(ranked(profile, cluster)))


@pytest.mark.parametrize("seed", [619334, 586572, 586575, 619329, 886728, 886734])
def test_auto_chooses_the_plan_of_planning_every_candidate_on_random_cases(seed):
    # issue 40's grid (the benchmark's worst seeds, fewer tensors): the shortcuts (shared
    # bytescheduler blocks, the planners' own simulations reused or priced from arrays, usbyte
    # plans that cannot win not made, the floors) change no choice
    case = random_case(seed, 120)
    profile, cluster = case.profile(), case.cluster()
    every = ranked(profile, cluster, 0.01)
    assert make_plan("auto", profile, cluster, density=0.01) == as_auto(every[0], len(every), 0.01)


def test_auto_cuts_bytescheduler_blocks_once_per_partition_and_does_not_resimulate_dear(monkeypatch):
    import gradsched.sim
    from gradsched.planners import registry

    case = random_case(619334, 120)  # communication-bound: the floors skip neither bytescheduler nor dear
    profile, cluster = case.profile(), case.cluster()
    planned, simulated = [], []
    bytescheduler, simulate_ = registry._PLANNERS["bytescheduler"], gradsched.sim.simulate
    dear, dear_planned = registry._PLANNERS["dear"], []
    monkeypatch.setitem(registry._PLANNERS, "bytescheduler", lambda *a, **k: planned.append(k) or bytescheduler(*a, **k))
    monkeypatch.setitem(registry._PLANNERS, "dear", lambda *a, **k: dear_planned.append(k) or dear(*a, **k))
    monkeypatch.setattr(gradsched.sim, "simulate", lambda p, *a, **k: simulated.append(p) or simulate_(p, *a, **k))
    got = make_plan("auto", profile, cluster)
    by_auto, auto_simulated = planned[:], simulated[:]
    every = ranked(profile, cluster)
    assert got == as_auto(every[0], len(every))
    partitions = {o["partition_bytes"] for o in GRID["bytescheduler"]}
    assert by_auto and len({k["partition_bytes"] for k in by_auto}) == len(by_auto) <= len(partitions)
    assert dear_planned  # dear was planned (its groupings priced or simulated), its plan not simulated again
    assert [p for p in auto_simulated if p.strategy == "dear" and p.options.get("grouping") == "planned"] == []


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([1, 2]),
       st.sampled_from([0.001, 0.05, 0.5]))
def test_sparse_floor_never_exceeds_the_simulated_iteration(profile, cluster, channels, density):
    # auto skips planning a topk or omgs candidate whose floor (compute and selections) is above the best so far
    floor = sparse_floor_s(profile, cluster)
    assert floor >= profile.compute_s
    for name, opts in (("topk", {"per_tensor": True}), ("topk", {"per_tensor": False}), ("omgs", {}),
                       ("omgs", {"refine_plan": False})):
        plan = make_plan(name, profile, cluster, density=density, **opts)
        assert floor <= simulate(plan, profile, cluster, channels=channels, timeline=False).iteration_s * (1 + 1e-9)


def test_auto_does_not_plan_sparse_strategies_where_selection_alone_keeps_them_from_winning(monkeypatch):
    from gradsched.planners import registry

    case = random_case(586572, 120)  # compute-bound: the best dense plan is within 0.1% of the compute
    profile, cluster = case.profile(), case.cluster()
    planned = []
    for name in ("topk", "omgs"):
        planner = registry._PLANNERS[name]
        monkeypatch.setitem(registry._PLANNERS, name, lambda *a, _p=planner, _n=name, **k: planned.append(_n) or _p(*a, **k))
    got = make_plan("auto", profile, cluster, density=0.01)
    by_auto = planned[:]
    every = ranked(profile, cluster, 0.01)
    assert got == as_auto(every[0], len(every), 0.01)
    assert got.options["predicted_iteration_s"] < sparse_floor_s(profile, cluster) and by_auto == []


@pytest.mark.parametrize("seed", [586572, 619334])
def test_usbyte_builds_and_simulates_each_distinct_rule_plan_once(seed, monkeypatch):
    # a merged usbyte candidate simulates (or prices from its blocks: planners/_usbyte_eval.py) its
    # rules' plans to choose one; where rules agree (compute-bound: 586572) the same plan is neither
    # priced nor simulated again, and the choice is the one of simulating every rule's plan
    import gradsched.sim
    from gradsched.planners._usbyte_eval import BlockPricer
    from gradsched.planners.usbyte import RULES

    case = random_case(seed, 120)
    profile, cluster = case.profile(), case.cluster()
    merge = MiB
    fixed = [make_plan("usbyte", profile, cluster, merge_bytes=merge, window=w, extend=e) for w, e in RULES]
    keyed = [(simulate(p, profile, cluster, timeline=False).iteration_s, len(p.operations), k, p)
             for k, p in enumerate(fixed)]
    expected = min(keyed, key=lambda x: x[:3])[3]
    simulated = []
    simulate_ = gradsched.sim.simulate
    monkeypatch.setattr(gradsched.sim, "simulate", lambda p, *a, **k: simulated.append(p) or simulate_(p, *a, **k))
    price = BlockPricer.iteration_s

    def priced(self, *blocks):
        iteration_s = price(self, *blocks)
        if iteration_s is not None:
            simulated.append(None)
        return iteration_s

    monkeypatch.setattr(BlockPricer, "iteration_s", priced)
    got = make_plan("usbyte", profile, cluster, merge_bytes=merge)
    assert got.operations == expected.operations and got.options == expected.options
    assert len(simulated) == len({p.operations for p in fixed})


@settings(max_examples=15, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True), st.sampled_from([4 << 10, 100_003, 1 << 20]))
def test_bytescheduler_blocks_are_each_tensor_cut_front_to_back(profile, partition):
    # the fast construction (no dataclass __init__) gives the blocks made one by one
    from gradsched.cluster import Cluster
    from gradsched.plan import Operation, Slice

    plan = make_plan("bytescheduler", profile, Cluster.alpha_beta(1e-4, 1e-9, 8), partition_bytes=partition)
    expected = []
    for i in profile.order:
        t = profile.tensors[i]
        step = max(1, partition // t.element_bytes)
        expected += [Operation((Slice(i, a, min(t.numel, a + step)),), "allreduce", i) for a in range(0, t.numel, step)]
    assert list(plan.operations) == expected


def test_auto_leaves_the_cycle_collector_as_it_found_it():
    import gc

    case = random_case(7, 30)
    profile, cluster = case.profile(), case.cluster()
    assert gc.isenabled()
    make_plan("auto", profile, cluster)
    assert gc.isenabled()
    gc.disable()
    try:
        make_plan("auto", profile, cluster)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_comm_lower_bound_counts_every_slice_of_every_operation():
    # multi-slice operations (usbyte's merged units, threshold's buckets) count each slice's bytes
    from gradsched.cluster import Cluster

    case = random_case(11, 40)
    profile, cluster = case.profile(), Cluster.alpha_beta(1e-4, 1e-9, 8)
    for name, opts in (("threshold", {"mb": 4}), ("usbyte", {"merge_bytes": MiB}), ("bytescheduler", {})):
        plan = make_plan(name, profile, cluster, **opts)
        nbytes = [sum(s.numel * profile.tensors[s.tensor].element_bytes for s in op.slices) for op in plan.operations]
        assert comm_lower_bound_s(plan, profile, cluster) == float(cluster.cost("allreduce").times_s(nbytes).sum())
