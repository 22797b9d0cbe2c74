"""``topk`` and ``omgs``: coverage, merge decisions and hand-computed sparse timelines."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, GradschedError, Profile, TensorProfile
from gradsched.planners import is_sparse, make_plan
from gradsched.planners.omgs import sweep
from gradsched.planners.topk import split_by_element_size
from gradsched.plan import SPARSE
from gradsched.sim import simulate
from strategies import clusters, profiles

MS = 1e-3
SETTINGS = settings(max_examples=60, deadline=None)

# All-gather: 1 ms start-up, 1 ms per KB (per rank); top-k selection 1e-7 * n * log2(n) s.
SPARSE_CLUSTER = Cluster(2, {"allreduce": CollectiveCost(1e-3, 1e-9), "allgather": CollectiveCost(1e-3, 1e-6)},
                         extra={"topk_selection_s_per_nlogn": 1e-7})
DENSITY = 1 / 128  # 1024 elements -> k = 8 -> 8 * (4 + 4) = 64 bytes per rank


def layer(name: str, numel: int, backward_ms: float) -> TensorProfile:
    return TensorProfile(name, numel, 4 * numel, 0.0, backward_ms * MS)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from(["topk", "omgs"]),
       st.sampled_from([0.001, 0.01, 1.0]), st.sampled_from([None, False, True]))
def test_every_element_sent_once_as_sparse_ops_of_whole_layers_or_tensors(profile, cluster, name, density,
                                                                          per_tensor):
    plan = make_plan(name, profile, cluster, density=density, per_tensor=per_tensor)
    plan.check(profile)
    assert is_sparse(name)
    assert all(op.collective == SPARSE and op.density == density for op in plan.operations)
    assert per_tensor is None or plan.options["per_tensor"] is per_tensor
    assert all(s.start == 0 and s.end == profile.tensors[s.tensor].numel for op in plan.operations for s in op.slices)
    if plan.options["per_tensor"]:  # the authors' granularity: a tensor is never split
        if name == "topk":
            assert all(len(op.slices) == 1 for op in plan.operations)
        return

    def part(t: int) -> tuple[int, int]:  # a layer's tensors of one element size: never split
        return profile.layer_of[t], profile.tensors[t].element_bytes

    seen_layers = [part(s.tensor) for op in plan.operations for s in op.slices]
    layers_per_op = [{part(s.tensor) for s in op.slices} for op in plan.operations]
    assert sum(len(x) for x in layers_per_op) == len(set(seen_layers))  # a layer's part never spans two ops
    if name == "topk":
        assert all(len(x) == 1 for x in layers_per_op)


@SETTINGS
@given(profiles(max_layers=8, mixed_dtypes=True), clusters(), st.sampled_from(["topk", "omgs"]),
       st.sampled_from([0.001, 0.05]))
def test_chosen_granularity_never_simulates_slower_than_the_authors_or_the_layers(profile, cluster, name, density):
    def iteration_s(**opts) -> float:
        plan = make_plan(name, profile, cluster, density=density, **opts)
        return simulate(plan, profile, cluster, timeline=False).iteration_s

    chosen = iteration_s()
    assert chosen <= iteration_s(per_tensor=True) * (1 + 1e-12)  # the authors' per-tensor granularity
    assert chosen <= iteration_s(per_tensor=False) * (1 + 1e-12)


def test_topk_selects_a_layers_tensors_separately_where_cheaper_by_hand():
    # One layer of two 1024-element tensors (backward 0.5 ms each, so the layer's ends at 1 ms).
    # Per layer: select 2048 elements 1 -> 3.2528 (ts = 1e-7 * 2048 * 11 = 2.2528 ms), all-gather
    #   k = 16 (1 + 128 * 1e-3 = 1.128 ms): 3.2528 -> 4.3808 ms.
    # Per tensor: select one 1 -> 2.024, its all-gather (k = 8: 1.064 ms) 2.024 -> 3.088; select
    #   the other 2.024 -> 3.048, its all-gather waits for the channel: 3.088 -> 4.152 ms.
    # n log n selection makes two halves cheaper than the whole: per tensor wins by 0.2288 ms.
    p = Profile("one-layer", (TensorProfile("w", 1024, 4096, 0.0, 0.5 * MS, 0),
                              TensorProfile("b", 1024, 4096, 0.0, 0.5 * MS, 0)))
    per_layer = simulate(make_plan("topk", p, SPARSE_CLUSTER, density=DENSITY, per_tensor=False), p, SPARSE_CLUSTER)
    assert per_layer.iteration_s == pytest.approx(4.3808 * MS)
    plan = make_plan("topk", p, SPARSE_CLUSTER, density=DENSITY)
    assert plan.options["per_tensor"] is True and len(plan.operations) == 2
    r = simulate(plan, p, SPARSE_CLUSTER)
    assert r.op_start_s == pytest.approx([2.024 * MS, 3.088 * MS])
    assert r.op_end_s == pytest.approx([3.088 * MS, 4.152 * MS])
    assert r.iteration_s == pytest.approx(4.152 * MS)
    omgs = make_plan("omgs", p, SPARSE_CLUSTER, density=DENSITY)  # merging the two costs more than it saves
    assert simulate(omgs, p, SPARSE_CLUSTER).iteration_s == pytest.approx(4.152 * MS)


@SETTINGS
@given(profiles(max_layers=10))
def test_omgs_merges_everything_when_merging_costs_nothing(profile):
    # No backward time and no selection cost: the wait is never positive, the saving is
    # one start-up: one operation.
    free_compute = Profile(profile.model, tuple(TensorProfile(t.name, t.numel, t.bytes, 0.0, 0.0, t.layer)
                                                for t in profile.tensors), profile.ready_order)
    cluster = Cluster(2, {"allreduce": CollectiveCost(1e-3, 1e-9)}, extra={"topk_selection_s_per_nlogn": 0.0})
    assert len(make_plan("omgs", free_compute, cluster, refine_plan=False).operations) == 1


def test_topk_timeline_by_hand():
    # Ready order B, A (1024 elements each, backward 1 ms each).  ts(1024) = 1e-7 * 1024 * 10
    # = 1.024 ms; tag(k = 8) = 1 + 64 * 1e-3 = 1.064 ms.
    # compute: bwd B 0-1, select B 1-2.024, bwd A 2.024-3.024, select A 3.024-4.048.
    # comm:    B 2.024-3.088, A 4.048-5.112.  Iteration = 5.112 ms (no forward, no other).
    p = Profile("two", (layer("A", 1024, 1), layer("B", 1024, 1)))
    plan = make_plan("topk", p, SPARSE_CLUSTER, density=DENSITY)
    assert [op.tensors() for op in plan.operations] == [(1,), (0,)]
    r = simulate(plan, p, SPARSE_CLUSTER)
    assert r.op_start_s == pytest.approx([2.024 * MS, 4.048 * MS])
    assert r.op_end_s == pytest.approx([3.088 * MS, 5.112 * MS])
    assert r.backward_end_s == pytest.approx(4.048 * MS)
    assert r.iteration_s == pytest.approx(5.112 * MS)


def test_omgs_merge_rule_and_timeline_by_hand():
    # Ready order A (1024, bwd 1 ms), B (1024, bwd 0.1 ms), C (1024, bwd 2 ms).
    # ts(1024) = 1.024, ts(2048) = 1e-7 * 2048 * 11 = 2.2528, ts(3072) = 3.55890 ms;
    # tag(8) = 1.064, tag(16) = 1.128, tag(24) = 1.192 ms: every merge saves exactly 1 ms.
    # {A} + B: wait = 0.1 + 2.2528 - 1.024 - 1.024 - slack 0 = 0.3048 < 1: merge.
    # {A,B} + C: wait = 2 + 3.5589 - 2.2528 - 1.024 - 0 = 2.2821 >= 1: keep apart.
    # Timeline: bwd A 0-1, bwd B 1-1.1, select AB 1.1-3.3528, comm AB 3.3528-4.4808,
    #           bwd C 3.3528-5.3528, select C 5.3528-6.3768, comm C 6.3768-7.4408.
    p = Profile("three", (layer("C", 1024, 2), layer("B", 1024, 0.1), layer("A", 1024, 1)))
    plan = make_plan("omgs", p, SPARSE_CLUSTER, density=DENSITY, refine_plan=False)  # the paper's rule alone
    assert [op.tensors() for op in plan.operations] == [(2, 1), (0,)]
    r = simulate(plan, p, SPARSE_CLUSTER)
    assert r.op_start_s == pytest.approx([3.3528 * MS, 6.3768 * MS])
    assert r.op_end_s == pytest.approx([4.4808 * MS, 7.4408 * MS])
    assert r.iteration_s == pytest.approx(7.4408 * MS)
    assert math.isclose(SPARSE_CLUSTER.selection_s(3072), 1e-7 * 3072 * math.log2(3072))


@pytest.mark.parametrize("name", ["topk", "omgs"])
@pytest.mark.parametrize("density", [0, -0.1, 1.5, "dense"])
def test_bad_density_is_a_user_error(name, density):
    p = Profile("p", (layer("A", 10, 1),))
    with pytest.raises(GradschedError, match=f"{name}: density"):
        make_plan(name, p, SPARSE_CLUSTER, density=density)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from([0.001, 0.05]))
def test_omgs_decides_on_the_simulators_timeline(profile, cluster, density):
    # The slack in the merge rule is read off a running timeline; it must be the one
    # the simulator predicts for the groups already closed.  A group of two element sizes
    # runs as two operations (the runtime's rule), which the paper's rule does not model.
    groups, ends_s = sweep(profile, cluster, density)
    plan = make_plan("omgs", profile, cluster, density=density, refine_plan=False, per_tensor=False)
    split = split_by_element_size(groups, profile)
    assert [[s.tensor for s in op.slices] for op in plan.operations] == split
    if split == groups:
        result = simulate(plan, profile, cluster, timeline=False)
        assert result.op_end_s == pytest.approx(ends_s, rel=1e-9, abs=1e-15)


def test_omgs_refined_on_the_timeline_never_loses_to_topk():
    # The three-layer example above: the paper's rule merges A and B and loses to
    # layer-wise topk (7.44 vs 7.24 ms); the refined default keeps the better plan.
    p = Profile("three", (layer("C", 1024, 2), layer("B", 1024, 0.1), layer("A", 1024, 1)))
    t = {name: simulate(make_plan(name, p, SPARSE_CLUSTER, density=DENSITY, **extra), p, SPARSE_CLUSTER).iteration_s
         for name, extra in (("topk", {}), ("omgs", {}))}
    rule = simulate(make_plan("omgs", p, SPARSE_CLUSTER, density=DENSITY, refine_plan=False), p,
                    SPARSE_CLUSTER).iteration_s
    assert rule > t["topk"] and t["omgs"] <= t["topk"] * (1 + 1e-12)


@SETTINGS
@given(profiles(max_layers=10), clusters(), st.sampled_from([0.001, 0.05]))
def test_omgs_is_predicted_no_slower_than_topk_or_one_topk(profile, cluster, density):
    from gradsched.plan import Operation, Plan, Slice

    whole = Plan("whole", (Operation(tuple(Slice(i, 0, profile.tensors[i].numel) for i in profile.order), SPARSE, 0,
                                     density),), profile.fingerprint)
    t = simulate(make_plan("omgs", profile, cluster, density=density), profile, cluster, timeline=False).iteration_s
    for other in (make_plan("topk", profile, cluster, density=density), whole):
        assert t <= simulate(other, profile, cluster, timeline=False).iteration_s * (1 + 1e-9)


def test_groups_split_by_element_size_in_the_order_they_become_ready():
    # Ready order a, b, c, d: one merged group [a, b, c] of fp32, fp16, fp32 and [d]. The fp16
    # part is ready with b, the fp32 part only with c: it goes first, so nothing in issue order
    # waits behind a later part; a group of one element size stays as it is.
    tensors = (TensorProfile("a", 10, 40, MS, MS), TensorProfile("b", 10, 20, MS, MS),
               TensorProfile("c", 10, 40, MS, MS), TensorProfile("d", 10, 40, MS, MS))
    profile = Profile("p", tensors, ready_order=(0, 1, 2, 3))
    assert split_by_element_size([[0, 1, 2], [3]], profile) == [[1], [0, 2], [3]]
    assert split_by_element_size([[2, 3]], profile) == [[2, 3]]
