"""``usbyte``: gap-filling blocks, searched priorities, and a plan the simulator replays."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster, GradschedError, Profile, TensorProfile
from gradsched.planners import make_plan
from gradsched.bundled import bundled_profile
from gradsched.planners.usbyte import merged_layers, predict
from gradsched.sim import simulate
from gradsched.synthetic import random_case
from strategies import clusters, profiles

MS = 1e-3
MB = 1_000_000
SETTINGS = settings(max_examples=60, deadline=None)


def fp32(name: str, mbytes: float, backward_ms: float, forward_ms: float) -> TensorProfile:
    numel = int(mbytes * MB) // 4
    return TensorProfile(name, numel, 4 * numel, forward_ms * MS, backward_ms * MS)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from([0, 4096, 1 << 20]))
def test_every_element_sent_once_and_blocks_never_mix_dtypes(profile, cluster, merge_bytes):
    plan = make_plan("usbyte", profile, cluster, unit_bytes=64 << 10, merge_bytes=merge_bytes)
    plan.check(profile)
    assert plan.scheduling == "priority" and plan.overlap_forward and plan.credit_bytes is None
    groups = merged_layers(profile, plan.options["merge_bytes"])
    for op in plan.operations:
        assert len({profile.tensors[s.tensor].element_bytes for s in op.slices}) == 1
        assert len({groups[s.tensor] for s in op.slices}) == 1  # one layer, or one group of merged layers


@SETTINGS
@given(profiles(max_layers=12), st.integers(0, 1 << 22))
def test_merged_layers_are_consecutive_in_ready_order_and_big_enough(profile, merge_bytes):
    groups = merged_layers(profile, merge_bytes)
    if merge_bytes == 0:
        assert groups == profile.layer_of
        return
    in_order = [groups[i] for i in profile.order]
    assert in_order == sorted(in_order)  # consecutive in the ready order, numbered as met
    assert all(profile.layer_of[i] != profile.layer_of[j] or groups[i] == groups[j]
               for i in range(profile.num_tensors) for j in range(profile.num_tensors))  # a layer is never split
    size: dict[int, int] = {}
    for i, g in enumerate(groups):
        size[g] = size.get(g, 0) + profile.tensors[i].bytes
    last = in_order[-1]
    assert all(b >= merge_bytes for g, b in size.items() if g != last)


def test_merging_googlenets_small_layers_saves_start_ups():
    # GoogLeNet's 64 layers (K80 times, bundled) on an 8-rank ring whose every operation
    # starts up in 4 ms: the paper's layers (the default) send 65 operations, most of them small.
    profile = bundled_profile("googlenet-k80")
    cluster = Cluster.alpha_beta(4e-3, 2 * 7 / 8 / (1e9 / 8), 8)  # 1 Gbit/s links
    paper = make_plan("usbyte", profile, cluster)
    merged = make_plan("usbyte", profile, cluster, merge_bytes=1 << 20)
    assert paper.options["merge_bytes"] == 0 and merged.options["merge_bytes"] == 1 << 20
    assert len(merged.operations) < len(paper.operations) / 2
    t_paper = simulate(paper, profile, cluster, timeline=False).iteration_s
    t_merged = simulate(merged, profile, cluster, timeline=False).iteration_s
    assert t_merged < 0.95 * t_paper
    merged.check(profile)
    chosen = make_plan("auto", profile, cluster)  # auto searches the merges beside the paper's layers
    assert simulate(chosen, profile, cluster, timeline=False).iteration_s <= t_merged * (1 + 1e-9)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters())
def test_simulator_replays_the_modelled_schedule_exactly(profile, cluster):
    # The plan is only US-Byte if priority scheduling reproduces the gap-filling blocks
    # at the times the planner sized them for.
    plan, schedule, _ = predict(profile, cluster, unit_bytes=128 << 10)
    result = simulate(plan, profile, cluster, timeline=False)
    assert result.op_start_s == pytest.approx([b[3] for b in schedule.blocks], rel=1e-12, abs=1e-15)
    assert result.op_end_s == pytest.approx([b[4] for b in schedule.blocks], rel=1e-12, abs=1e-15)
    assert result.iteration_s == pytest.approx(schedule.iteration_s, rel=1e-12)


@SETTINGS
@given(profiles(max_layers=10), clusters())
def test_priority_search_never_makes_the_simulated_iteration_longer(profile, cluster):
    front_first = simulate(make_plan("usbyte", profile, cluster, max_evaluations=1), profile, cluster,
                           timeline=False).iteration_s
    searched = simulate(make_plan("usbyte", profile, cluster, max_evaluations=50), profile, cluster,
                        timeline=False).iteration_s
    assert searched <= front_first * (1 + 1e-12)


@SETTINGS
@given(profiles(min_layers=4, max_layers=10), clusters())
def test_search_stays_within_its_evaluation_budget(profile, cluster):
    for budget in (1, 2, 3):
        _, _, evaluations = predict(profile, cluster, max_evaluations=budget, extend=False, window="block")
        assert 1 <= evaluations <= budget
        _, _, evaluations = predict(profile, cluster, max_evaluations=budget)  # four rules, each within budget
        assert 4 <= evaluations <= 4 * budget


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 1 << 30), st.integers(30, 300))
def test_default_search_within_0_2_percent_of_the_full_search_on_the_random_grid(seed, num_tensors):
    # Issue 40's grid (gradsched.synthetic.random_case: 40 B - 80 MB tensors, alpha 1e-5..5e-3 s,
    # beta 1e-10..1e-8 s/B, 8-1,024 workers); the full search: no cap, every try (patience 0).
    case = random_case(seed, num_tensors)
    profile, cluster = case.profile(), case.cluster()
    plan, schedule, _ = predict(profile, cluster)
    full_plan, full, _ = predict(profile, cluster, patience=0)
    assert plan.options["max_evaluations"] is None and full_plan.options["patience"] == 0
    assert schedule.iteration_s <= full.iteration_s * 1.002, case.label()
    plan.check(profile)  # every element sent exactly once


@pytest.mark.parametrize("seed, merge_bytes", [(886722, 1 << 20), (619350, 4 << 20)])
def test_default_search_within_0_2_percent_of_the_full_search_on_merged_layers(seed, merge_bytes):
    # Issue 40 item 2 with a non-default option: merged layers make a short walk (250-320 units), where
    # a cluster of gains came after a dry spell of 34-44 tries, each replaying 40-70% of phase 1.
    # Patience counted in tries skipped all of them once 24 had not gained: 0.29% and 3.4% slower than
    # the full search.  Now a try is skipped only where it replays more than patience / dry spell of it.
    case = random_case(seed, 1000)
    profile, cluster = case.profile(), case.cluster()
    _, schedule, _ = predict(profile, cluster, merge_bytes=merge_bytes)
    _, full, _ = predict(profile, cluster, merge_bytes=merge_bytes, patience=0)
    assert schedule.iteration_s <= full.iteration_s * 1.002, case.label()


def test_gap_filling_blocks_and_front_first_phase_two_by_hand():
    # alpha = 1 ms, beta = 1 ms/MB, unit = 1 MB.  Layers (forward order):
    #   L0: 4 MB, backward 2 ms, forward 1 ms;  L1: 2 MB, 3 ms, 1 ms;  L2: 3 MB, 1 ms, 1 ms.
    # Backward L2, L1, L0: ready at 1, 4, 6 ms.  Front-first: L0 before L1 before L2.
    # Phase 1:  t=1  L2 ready, next gradient at 4: gap 3 < T(3 MB) = 4, so
    #                ceil((3 - 1) / 1) = 2 units: L2[0:2 MB] 1 -> 4.
    #           t=4  L1 ready (and preferred), next at 6: gap 2 < T(2 MB) = 3: 1 unit,
    #                L1[0:1 MB] 4 -> 6.
    # Phase 2 (t=6, all ready), input first: L0 4 MB 6 -> 11, L1 rest 11 -> 13, L2 rest 13 -> 15.
    # Next forward from 6: L0 waits to 11, runs 11-12; L1 waits to 13, 13-14; L2 15-16.
    profile = Profile("hand", (fp32("L0", 4, 2, 1), fp32("L1", 2, 3, 1), fp32("L2", 3, 1, 1)))
    cluster = Cluster.alpha_beta(1 * MS, 1e-9, 2)
    plan = make_plan("usbyte", profile, cluster, unit_bytes=MB, max_evaluations=1)
    quarter = MB // 4  # fp32 elements in 1 MB
    assert [(s.tensor, s.start, s.end) for op in plan.operations for s in op.slices] == [
        (2, 0, 2 * quarter), (1, 0, quarter), (0, 0, 4 * quarter), (1, quarter, 2 * quarter),
        (2, 2 * quarter, 3 * quarter)]
    assert [op.priority for op in plan.operations] == [2, 1, 0, 1, 2]
    r = simulate(plan, profile, cluster)
    assert r.op_start_s == pytest.approx([1 * MS, 4 * MS, 6 * MS, 11 * MS, 13 * MS])
    assert r.op_end_s == pytest.approx([4 * MS, 6 * MS, 11 * MS, 13 * MS, 15 * MS])
    assert r.iteration_s == pytest.approx(16 * MS)
    # the search tries promoting L2 over L1 and L1 over L0; neither shortens the iteration
    assert simulate(make_plan("usbyte", profile, cluster, unit_bytes=MB), profile, cluster).iteration_s == \
        pytest.approx(16 * MS)


def test_priority_search_promotes_an_output_layer_by_hand():
    # alpha = 2 ms, beta = 1 ms/MB, unit = 1 MB.  Layers (forward order):
    #   l0: 1 MB, backward 2 ms, forward 1 ms;  l1: 2 MB, 2 ms, 0;  l2: 2 MB, 1 ms, 2 ms.
    # Ready l2 at 1, l1 at 3, l0 at 5.
    # Front-first: t=1 gap 2 (not < alpha, < T(2 MB) = 4): ceil(0) -> at least 1 unit: l2 1 MB 1-4;
    #   t=4 l1 wins, gap 1 < alpha: 1 unit 4-7; phase 2: l0 7-10, l1 10-13, l2 13-16;
    #   forward from 5: l0 10-11, l1 13-13, l2 16-18: 18 ms.
    # l1 became ready (3) while l2's first block was on the wire (1-4): try l2 ahead of l1:
    #   l2 1-4, l2 rest 4-7 (gap 1 < alpha: 1 unit = all of it); phase 2: l0 7-10, l1 10-14;
    #   forward: l0 10-11, l1 14-14, l2 (done at 7) 14-16: 16 ms.  Kept.
    profile = Profile("promote", (fp32("l0", 1, 2, 1), fp32("l1", 2, 2, 0), fp32("l2", 2, 1, 2)))
    cluster = Cluster.alpha_beta(2 * MS, 1e-9, 2)
    front = simulate(make_plan("usbyte", profile, cluster, unit_bytes=MB, max_evaluations=1), profile, cluster)
    assert front.op_start_s == pytest.approx([1 * MS, 4 * MS, 7 * MS, 10 * MS, 13 * MS])
    assert front.iteration_s == pytest.approx(18 * MS)
    plan, _, evaluations = predict(profile, cluster, unit_bytes=MB, extend=False, window="block")
    assert evaluations == 2
    assert [op.tensors() for op in plan.operations] == [(2,), (2,), (0,), (1,)]
    assert [op.priority for op in plan.operations] == [1, 1, 0, 2]
    r = simulate(plan, profile, cluster)
    assert r.op_start_s == pytest.approx([1 * MS, 4 * MS, 7 * MS, 10 * MS])
    assert r.op_end_s == pytest.approx([4 * MS, 7 * MS, 10 * MS, 14 * MS])
    assert r.iteration_s == pytest.approx(16 * MS)


@pytest.mark.parametrize("opts", [{"unit_bytes": 0}, {"unit_bytes": 1.5}, {"max_evaluations": 0}, {"patience": -1}])
def test_bad_options_are_user_errors(opts):
    profile = Profile("p", (fp32("a", 1, 1, 1),))
    with pytest.raises(GradschedError, match="usbyte"):
        make_plan("usbyte", profile, Cluster.alpha_beta(1e-3, 1e-9, 2), **opts)


def test_plan_and_simulated_returns_the_iteration_it_simulated_with_its_plan():
    # auto reuses the iteration usbyte simulated to choose its rule: returned with the plan (no
    # module-level record of the last plan), None where the model chose alone (then simulate it)
    from gradsched.planners import usbyte

    case = random_case(11, 200)
    profile, cluster = case.profile(), case.cluster()
    merged, merged_s = usbyte.plan_and_simulated(profile, cluster, merge_bytes=1 << 20)
    assert merged_s == simulate(merged, profile, cluster, timeline=False).iteration_s
    assert merged == make_plan("usbyte", profile, cluster, merge_bytes=1 << 20)
    plain, plain_s = usbyte.plan_and_simulated(profile, cluster)  # the model is exact: not simulated
    assert plain_s is None and plain == make_plan("usbyte", profile, cluster)
    with pytest.raises(GradschedError, match="merge_bytes"):
        usbyte.plan_and_simulated(profile, cluster, merge_bytes=-1)  # checked as make_plan checks
    with pytest.warns(DeprecationWarning, match="plan_and_simulated"):
        assert usbyte.simulated_s(merged) is None
