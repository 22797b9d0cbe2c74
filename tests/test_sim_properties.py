"""Property tests of the simulator and of the plans every strategy makes (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradsched.planners import is_sparse, make_plan, strategy_names
from gradsched.sim import simulate
from gradsched.timeline import Timeline

from strategies import clusters, profiles

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-9


def plan_for(name, profile, cluster):
    return make_plan(name, profile, cluster, **({"density": 0.05} if is_sparse(name) else {}))


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from(strategy_names()))
def test_every_plan_covers_every_element_once(profile, cluster, name):
    plan = plan_for(name, profile, cluster)
    plan.check(profile)  # raises on a miss, an overlap or an overrun


@SETTINGS
@given(profiles(max_layers=10, with_update=True), clusters(), st.sampled_from(strategy_names()),
       st.sampled_from([1, 2]))
def test_iteration_is_bounded_below_by_compute_and_by_transfers(profile, cluster, name, channels):
    plan = plan_for(name, profile, cluster)
    r = simulate(plan, profile, cluster, channels=channels)
    assert r.iteration_s >= r.compute_s - TOL
    assert r.iteration_s >= r.comm_s / channels - TOL
    assert r.exposed_comm_s >= 0
    # every operation starts after its gradients are ready and lasts its cost
    ready = plan.op_ready_s(profile)
    for j in range(len(plan.operations)):
        if not plan.operations[j].sparse:
            assert r.op_start_s[j] >= ready[j] - TOL
    # on one channel, no two operations overlap in time
    if channels == 1:
        spans = sorted(zip(r.op_start_s, r.op_end_s))
        assert all(a_end <= b_start + TOL for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


@SETTINGS
@given(profiles(max_layers=8), clusters())
def test_timeline_matches_result_and_round_trips_as_chrome_trace(profile, cluster):
    plan = make_plan("bytescheduler", profile, cluster)
    r = simulate(plan, profile, cluster)
    tl = r.timeline
    assert tl.end_s == pytest.approx(r.iteration_s, abs=1e-12) or tl.end_s <= r.iteration_s + TOL
    assert len(tl.by_cat("comm")) == len(plan.operations)
    trace = json.loads(json.dumps(tl.to_chrome_trace()))
    back = Timeline.from_chrome_trace(trace)
    assert sorted((e.name, e.track) for e in back.events) == sorted((e.name, e.track) for e in tl.events)
    compute = sorted((e.start_s, e.end_s) for e in tl.events if e.track == "compute")
    assert all(a[1] <= b[0] + TOL for a, b in zip(compute, compute[1:])), "compute stream events overlap"


@SETTINGS
@given(profiles(max_layers=8), clusters())
def test_simulation_cost_does_not_depend_on_world_size(profile, cluster):
    # the same plan at 8 and 1,024 ranks: the same operations, closed-form costs
    plan = make_plan("wfbp", profile, cluster)
    small = simulate(plan, profile, cluster.at_world_size(8))
    large = simulate(plan, profile, cluster.at_world_size(1024))
    assert len(small.timeline.by_cat("comm")) == len(large.timeline.by_cat("comm")) == len(plan.operations)
    assert large.comm_s >= small.comm_s - TOL  # a bigger ring never costs less


@SETTINGS
@given(profiles(max_layers=8), clusters())
def test_auto_is_never_slower_than_any_dense_strategy(profile, cluster):
    """... except a decoupled plan (dear) within the margin auto asks of it (planners/auto.py)."""
    from gradsched.planners.auto import DECOUPLED_MARGIN

    best = simulate(make_plan("auto", profile, cluster), profile, cluster, timeline=False).iteration_s
    for name in strategy_names():
        if name == "auto" or is_sparse(name):
            continue
        plan = make_plan(name, profile, cluster)
        other = simulate(plan, profile, cluster, timeline=False).iteration_s
        if any(op.two_phase for op in plan.operations):
            other /= 1 - DECOUPLED_MARGIN
        assert best <= other * (1 + 1e-12) + TOL, name


def test_auto_uses_sparse_strategies_only_when_allowed():
    from gradsched import Cluster
    from gradsched.synthetic import synthetic_profile

    profile = synthetic_profile(40)
    slow = Cluster.alpha_beta(1e-3, 1e-7, 16)  # a slow network: sparsity pays
    dense = make_plan("auto", profile, slow)
    assert all(not op.sparse for op in dense.operations) and not is_sparse(dense.options["chose"])
    sparse = make_plan("auto", profile, slow, density=0.01)
    assert is_sparse(sparse.options["chose"]) and all(op.density == 0.01 for op in sparse.operations if op.sparse)
    assert simulate(sparse, profile, slow).iteration_s < simulate(dense, profile, slow).iteration_s


@SETTINGS
@given(profiles(max_layers=8), clusters(), st.sampled_from(["wfbp", "mgwfbp", "optimal", "ddp", "sync"]),
       st.floats(0, 2), st.floats(0, 2))
def test_contention_never_speeds_up_a_fifo_plan(profile, cluster, name, kc, kn):
    from dataclasses import replace

    plan = make_plan(name, profile, cluster)
    plain = simulate(plan, profile, cluster, timeline=False)
    slowed = replace(cluster, extra={**cluster.extra, "contention": {"compute_slowdown": kc, "comm_slowdown": kn}})
    r = simulate(plan, profile, slowed, timeline=False)
    assert r.iteration_s >= plain.iteration_s - 1e-9
    # slowed down by at most the larger factor
    assert r.iteration_s <= plain.iteration_s * (1 + max(kc, kn)) + 1e-9


@SETTINGS
@given(profiles(max_layers=8, with_update=True), clusters(), st.floats(0, 1e-9), st.floats(0, 1e-9))
def test_bucket_costs_keep_layers_and_add_a_pass_per_byte(profile, cluster, per_byte, back_per_byte):
    """Bucket copies lengthen each layer by its bytes times the rate and change nothing else."""
    got = profile.with_bucket_costs(per_byte, back_per_byte)
    assert got.layer_of == profile.layer_of and got.order == profile.order and got.fingerprint == profile.fingerprint
    assert got.backward_s == pytest.approx(profile.backward_s + per_byte * profile.total_bytes, abs=TOL)
    assert got.update_s == pytest.approx(profile.update_s + back_per_byte * profile.total_bytes, abs=TOL)
    assert got.forward_s == profile.forward_s and got.other_s == profile.other_s
    # the whole cost of what is ready by then, and nothing later, delays each gradient
    ready, later = profile.ready_s, got.ready_s
    for i in range(profile.num_tensors):
        rank = _ready_rank(profile, i)
        before = sum(t.bytes for j, t in enumerate(profile.tensors) if _ready_rank(profile, j) <= rank)
        assert later[i] == pytest.approx(ready[i] + per_byte * before, rel=1e-9, abs=TOL)
    # one all-reduce after backward: the iteration grows by exactly both passes over all bytes
    sync = make_plan("sync", profile, cluster)
    grown = simulate(sync, got, cluster, timeline=False).iteration_s - simulate(sync, profile, cluster,
                                                                                timeline=False).iteration_s
    assert grown == pytest.approx((per_byte + back_per_byte) * profile.total_bytes, rel=1e-6, abs=TOL)


def _ready_rank(profile, i):
    """Position of tensor ``i``'s layer in the backward (ready) order."""
    layers = []
    for j in profile.order:
        if profile.layer_of[j] not in layers:
            layers.append(profile.layer_of[j])
    return layers.index(profile.layer_of[i])


def test_bucket_costs_cannot_be_negative():
    from gradsched import Profile, TensorProfile

    prof = Profile("toy", (TensorProfile("w", 10, 40, 0.001, 0.002),))
    with pytest.raises(ValueError):
        prof.with_bucket_costs(-1e-9)


@SETTINGS
@given(profiles(max_layers=8, with_update=True), clusters())
def test_contention_bound_without_contention_is_the_plain_bound(profile, cluster):
    from gradsched.calibration import lower_bound_s

    b = lower_bound_s(profile, cluster)
    assert b["contention_bound_s"] == pytest.approx(b["lower_bound_s"], rel=1e-9, abs=TOL)


@SETTINGS
@given(profiles(max_layers=8, with_update=True), clusters(), st.sampled_from(["wfbp", "mgwfbp", "optimal", "ddp",
                                                                              "sync", "usbyte", "bytescheduler"]),
       st.floats(0, 2), st.floats(0, 2))
def test_no_simulated_plan_beats_the_contention_bound(profile, cluster, name, kc, kn):
    """The bound assumes the simulator's own fluid model of contention, so no plan it simulates is faster."""
    from dataclasses import replace

    from gradsched.calibration import lower_bound_s

    slowed = replace(cluster, extra={**cluster.extra, "contention": {"compute_slowdown": kc, "comm_slowdown": kn}})
    bound = lower_bound_s(profile, slowed)
    assert bound["contention_bound_s"] >= bound["lower_bound_s"] - TOL
    r = simulate(make_plan(name, profile, slowed), profile, slowed, timeline=False)
    assert r.iteration_s >= bound["contention_bound_s"] * (1 - 1e-9) - TOL


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True))
def test_layer_table_is_the_profiles_layers_in_both_orders(profile):
    # The simulator walks this table on every simulation (derived once per profile): each layer's
    # tensors together, layers in the order their backward ends and in forward order.
    table = profile.layer_table
    assert [i for layer in table.ready for i in layer] == sorted(profile.order, key=lambda i: (
        min(profile.order.index(j) for j in range(profile.num_tensors) if profile.layer_of[j] == profile.layer_of[i]),
        profile.order.index(i)))
    assert [i for layer in table.forward for i in layer] == sorted(range(profile.num_tensors), key=lambda i: (
        min(j for j in range(profile.num_tensors) if profile.layer_of[j] == profile.layer_of[i]), i))
    for layers in (table.ready, table.forward):
        assert all(len({profile.layer_of[i] for i in layer}) == 1 for layer in layers)
        assert len({profile.layer_of[layer[0]] for layer in layers}) == len(layers)
    for k, layer in enumerate(table.ready):
        assert table.position[profile.layer_of[layer[0]]] == k
        assert table.backward_s[k] == pytest.approx(sum(profile.tensors[i].backward_s for i in layer))
        assert all(profile.ready_s[i] == pytest.approx(sum(table.backward_s[:k + 1])) for i in layer)
    assert sum(table.forward_s) == pytest.approx(profile.forward_s)
    assert sum(table.update_s) == pytest.approx(profile.update_s)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from(strategy_names()))
def test_no_operation_mixes_element_sizes(profile, cluster, name):
    # The runtime's operations hold one dtype (a sparse one refuses more): a plan gradsched makes
    # itself must never mix them, whatever layers it merges.
    plan = plan_for(name, profile, cluster)
    for op in plan.operations:
        assert len({profile.tensors[s.tensor].element_bytes for s in op.slices}) == 1
