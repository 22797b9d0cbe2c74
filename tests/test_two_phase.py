"""Decoupled all-reduce (issue 36): reduce-scatter / all-gather operations, their costs, the
simulator on hand-made timelines of the two phases, plan checks and the ``dear`` planner.

The common case of test_sim_timelines.py: tensors t0, t1, t2 (forward order) of 400, 400 and
800 bytes, each its own layer with forward 0.1 s; backward 0.3, 0.2, 0.1 s, so gradients are
ready at t2: 0.1, t1: 0.3, t0: 0.6.  All-reduce alpha 0.1 s, beta 1 ms/byte at 2 ranks, so
a reduce-scatter or all-gather of n bytes (n/2 per rank) costs 0.05 + 0.0005 n:
RS/AG(400) = 0.25, RS/AG(1200) = 0.65.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, Profile, TensorProfile
from gradsched.calibration import lower_bound_s
from gradsched.errors import FormatError
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER, Operation, Plan, Slice
from gradsched.planners import make_plan
from gradsched.planners.auto import DECOUPLED_MARGIN
from gradsched.planners.dear import nearby_groups, prioritized, threshold_groups, two_phase_ops
from gradsched.sim import simulate

from strategies import clusters, profiles

TOL = 1e-9


def whole(profile, *tensors):
    return tuple(Slice(t, 0, profile.tensors[t].numel) for t in tensors)


def two_phase(profile, *, priorities=(0, 1, 2, 3), gate=None, overlap=True, scheduling="fifo"):
    """RS(t2, t1), RS(t0), AG(t0), AG(t2, t1) (the last gated on ``gate``)."""
    ops = (Operation(whole(profile, 2, 1), REDUCE_SCATTER, priorities[0]),
           Operation(whole(profile, 0), REDUCE_SCATTER, priorities[1]),
           Operation(whole(profile, 0), ALL_GATHER, priorities[2]),
           Operation(whole(profile, 2, 1), ALL_GATHER, priorities[3], gate=gate))
    return Plan("hand", ops, profile.fingerprint, profile.model, scheduling=scheduling, overlap_forward=overlap)


# ------------------------------------------------------------------ costs
def test_reduce_scatter_and_all_gather_are_half_an_all_reduce_each(case):
    _, cluster = case
    rs, ag = cluster.operation_cost(REDUCE_SCATTER), cluster.operation_cost(ALL_GATHER)
    assert rs.time_s(1200) == pytest.approx(0.65) and ag.time_s(400) == pytest.approx(0.25)
    assert rs.time_s(1200) + ag.time_s(1200) == pytest.approx(cluster.cost("allreduce").time_s(1200))


def test_a_measured_reduce_scatter_table_is_read_per_rank_and_extrapolated_by_the_ring():
    data = {"format": "gradsched.cluster/1", "world_size": 4,
            "collectives": {"allreduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
                            "reducescatter": {"alpha_s": 2e-3, "beta_s_per_byte": 4e-9}},
            "points": {"reducescatter": [[1000, 0.003], [2000, 0.005]]}}
    cluster = Cluster.from_dict(data)
    rs = cluster.operation_cost(REDUCE_SCATTER)
    assert rs.time_s(4 * 1500) == pytest.approx(0.004)  # 1500 bytes per rank: inside the table
    assert rs.time_s(4 * 10_000) == pytest.approx(2e-3 + 4e-9 * 10_000)  # beyond it: the line
    at8 = cluster.at_world_size(8).cost("reducescatter")
    assert at8.alpha_s == pytest.approx(2e-3 * 7 / 3) and at8.beta_s_per_byte == pytest.approx(4e-9 * 7 / 3)
    assert Cluster.from_dict(cluster.to_dict()).cost("reducescatter") == cluster.cost("reducescatter")


# ------------------------------------------------------------------ simulator, hand-made timelines
def test_fifo_two_phases(case):
    # RS(t2,t1) 0.3-0.95, RS(t0) 0.95-1.2, AG(t0) 1.2-1.45, AG(t2,t1) 1.45-2.1;
    # forward t0 waits for AG(t0): 1.45-1.55; t1 waits for AG(t2,t1): 2.1-2.2; t2 2.2-2.3
    profile, cluster = case
    plan = two_phase(profile)
    plan.check(profile)
    r = simulate(plan, profile, cluster)
    assert r.op_start_s == pytest.approx([0.3, 0.95, 1.2, 1.45])
    assert r.op_end_s == pytest.approx([0.95, 1.2, 1.45, 2.1])
    assert r.iteration_s == pytest.approx(2.3)
    assert r.peak_extra_bytes == 1600  # both flat buffers live until their all-gathers end
    forward = {e.name: (e.start_s, e.end_s) for e in r.timeline.events if e.cat == "forward"}
    assert forward["t0"] == pytest.approx((1.45, 1.55)) and forward["t1"] == pytest.approx((2.1, 2.2))


def test_priority_lets_an_all_gather_overtake_a_reduce_scatter(case):
    # AG(t2,t1) has the highest priority: unlocked at 0.95 when its RS ends, it goes before RS(t0):
    # RS 0.3-0.95, AG(t2,t1) 0.95-1.6, RS(t0) 1.6-1.85, AG(t0) 1.85-2.1; forward 2.1-2.4
    profile, cluster = case
    r = simulate(two_phase(profile, priorities=(0, 1, 2, -1), scheduling="priority"), profile, cluster)
    assert r.op_start_s == pytest.approx([0.3, 1.6, 1.85, 0.95])
    assert r.op_end_s == pytest.approx([0.95, 1.85, 2.1, 1.6])
    assert r.iteration_s == pytest.approx(2.4)


def test_a_gate_on_an_earlier_layer_holds_that_forward(case):
    # AG(t2,t1) gated on t0: t0's forward waits until 2.1, then t0, t1, t2 run 2.1-2.4
    profile, cluster = case
    plan = two_phase(profile, gate=0)
    plan.check(profile)
    r = simulate(plan, profile, cluster)
    assert r.op_end_s == pytest.approx([0.95, 1.2, 1.45, 2.1])
    assert r.iteration_s == pytest.approx(2.4)


def test_without_forward_overlap_every_gather_ends_before_the_step(case):
    # ZeRO's synchronous gather: the step waits for everything (2.1), then the forward 2.1-2.4
    profile, cluster = case
    r = simulate(two_phase(profile, overlap=False), profile, cluster)
    assert r.iteration_s == pytest.approx(2.4)


def test_gathers_start_at_the_runtimes_first_wait_after_backward(case):
    # The runtime starts all-gathers where it first waits after backward (decoupled.retire_alone): with
    # forward overlap, the first forward layer's gate, after other_s.  One group RS(t0,t1,t2) 0.6-1.45;
    # other_s 1 s: 0.6-1.6, so AG 1.6-2.45 (not 1.45-2.3), forward 2.45-2.75 (not 2.3-2.6).
    profile, cluster = case
    profile = dataclasses.replace(profile, other_s=1.0)
    ops = (Operation(whole(profile, 0, 1, 2), REDUCE_SCATTER, 0), Operation(whole(profile, 0, 1, 2), ALL_GATHER, 1))
    plan = Plan("hand", ops, profile.fingerprint, profile.model, overlap_forward=True)
    r = simulate(plan, profile, cluster)
    assert r.op_start_s == pytest.approx([0.6, 1.6]) and r.op_end_s == pytest.approx([1.45, 2.45])
    assert r.iteration_s == pytest.approx(2.75)
    # without forward overlap the runtime gathers at the end of backward: AG 1.45-2.3, other 2.3-3.3, forward 3.6
    r = simulate(dataclasses.replace(plan, overlap_forward=False), profile, cluster)
    assert r.op_start_s == pytest.approx([0.6, 1.45]) and r.iteration_s == pytest.approx(3.6)


def test_a_prioritised_gather_waits_for_the_first_wait_too(case):
    # other_s 0.5: backward ends 0.6, the forward's first gate at 1.1.  AG(t2,t1) (priority -1) is unlocked when
    # its RS ends (0.95) but not started before 1.1, so RS(t0) goes first: 0.95-1.2, AG(t2,t1) 1.2-1.85,
    # AG(t0) 1.85-2.1; forward 2.1-2.4
    profile, cluster = case
    profile = dataclasses.replace(profile, other_s=0.5)
    r = simulate(two_phase(profile, priorities=(0, 1, 2, -1), scheduling="priority"), profile, cluster)
    assert r.op_start_s == pytest.approx([0.3, 0.95, 1.85, 1.2])
    assert r.iteration_s == pytest.approx(2.4)


# ------------------------------------------------------------------ plan checks
def test_a_two_phase_plan_round_trips(case, tmp_path):
    profile, _ = case
    plan = two_phase(profile, gate=0)
    plan.save(tmp_path / "p.json")
    again = Plan.load(tmp_path / "p.json", profile)
    assert again == plan and again.hash == plan.hash and again.gathers() == {2: 1, 3: 0}


@pytest.mark.parametrize("edit,words", [
    (lambda ops: ops[1:], "all-gather without its reduce-scatter"),
    (lambda ops: ops[:3], "reduce-scatter without its all-gather"),
    (lambda ops: [ops[0], ops[3], ops[1], ops[2]][::-1], "all-gather without its reduce-scatter"),
    (lambda ops: ops[:3] + [Operation(ops[3].slices, ALL_GATHER, 3, gate=7)], "no such layer"),
    (lambda ops: ops[:2] + [Operation(ops[2].slices, ALL_GATHER, 2, gate=2)] + ops[3:], "un-gathered"),
])
def test_bad_two_phase_plans_name_the_cause(case, edit, words):
    profile, _ = case
    good = two_phase(profile)
    bad = Plan("hand", tuple(edit(list(good.operations))), profile.fingerprint, overlap_forward=True)
    with pytest.raises(FormatError, match=words):
        bad.check(profile)


def test_only_all_gathers_are_gated(case):
    profile, _ = case
    data = two_phase(profile).to_dict()
    data["operations"][0]["gate"] = 0
    with pytest.raises(FormatError, match="only all-gather operations are gated"):
        Plan.from_dict(data)


# ------------------------------------------------------------------ dear
def test_dear_rules_group_layers_in_forward_order(case):
    profile, _ = case
    assert threshold_groups(profile, 800) == [[0, 1], [2]]  # 400 + 400 fits; 800 more would not
    assert threshold_groups(profile, 100) == [[0], [1], [2]]  # a layer larger than the threshold: alone
    assert nearby_groups(profile, 2) == [[0, 1], [2]]


def test_dear_options_give_dears_groupings(case):
    profile, cluster = case
    plan = make_plan("dear", profile, cluster, grouping="threshold", threshold_mb=800e-6)
    rs = [op.tensors() for op in plan.operations if op.collective == REDUCE_SCATTER]
    ag = [op.tensors() for op in plan.operations if op.collective == ALL_GATHER]
    assert rs == [(2,), (0, 1)]  # in the order they become ready
    assert ag == [(0, 1), (2,)]  # in forward order
    assert plan.overlap_forward


def test_dear_planned_is_the_fastest_of_its_candidates(case):
    profile, cluster = case
    best = simulate(make_plan("dear", profile, cluster), profile, cluster).iteration_s
    for grouping, opts in (("threshold", {"threshold_mb": 1e-6}), ("threshold", {"threshold_mb": 1}),
                           ("nearby", {"nearby_layers": 2})):
        other = make_plan("dear", profile, cluster, grouping=grouping, **opts)
        assert best <= simulate(other, profile, cluster).iteration_s + TOL


def test_dear_on_the_common_case_and_auto_leaves_it_within_the_margin(case):
    # RS(t2) 0.1-0.55, RS(t0,t1) 0.6-1.05, AG(t0,t1) 1.05-1.5, AG(t2) 1.5-1.95; forward t0 1.5-1.6,
    # t1 1.6-1.7, t2 waits for its AG: 1.95-2.05.  The best all-reduce plan takes 2.2
    # (test_sim_timelines.py::test_auto_picks_the_fastest_candidate): dear is 6.8% faster, within the
    # 10% a two-phase plan must win by (it measured 9-40% slower against usbyte than predicted).
    profile, cluster = case
    plan = make_plan("dear", profile, cluster)
    assert [(op.collective, op.tensors()) for op in plan.operations] == [
        (REDUCE_SCATTER, (2,)), (REDUCE_SCATTER, (0, 1)), (ALL_GATHER, (0, 1)), (ALL_GATHER, (2,))]
    r = simulate(plan, profile, cluster)
    assert r.op_start_s == pytest.approx([0.1, 0.6, 1.05, 1.5]) and r.op_end_s == pytest.approx([0.55, 1.05, 1.5, 1.95])
    assert r.iteration_s == pytest.approx(2.05)
    assert DECOUPLED_MARGIN == pytest.approx(0.10)
    chosen = make_plan("auto", profile, cluster)
    assert chosen.options["chose"] != "dear" and chosen.options["predicted_iteration_s"] == pytest.approx(2.2)


def test_auto_takes_dear_only_past_its_margin():
    # a long forward to hide the all-gathers behind and a network as slow as backward: dear pays
    tensors = tuple(TensorProfile(f"l{i}", 1_000_000, 4_000_000, 0.02, 0.01) for i in range(8))
    profile = Profile("slow-net", tensors)
    # each phase measured at 2.5 ns per rank byte (as a cluster file's "reducescatter" and "allgather" entries):
    # the two phases move an all-reduce's bytes over 8 ranks at 0.44x its time, so dear wins by more than its margin
    phase = CollectiveCost(5e-4, 2.5e-9)
    slow = dataclasses.replace(Cluster.alpha_beta(1e-3, 5e-9, 8),
                               collectives={"allreduce": CollectiveCost(1e-3, 5e-9), "reducescatter": phase,
                                            "allgather": phase})
    chosen = make_plan("auto", profile, slow)
    dear = simulate(make_plan("dear", profile, slow), profile, slow).iteration_s
    others = min(simulate(make_plan(s, profile, slow), profile, slow).iteration_s
                 for s in ("wfbp", "mgwfbp", "optimal", "usbyte", "ddp", "bytescheduler"))
    assert dear < others * (1 - DECOUPLED_MARGIN)
    assert chosen.options["chose"] == "dear"
    fast = Cluster.alpha_beta(1e-5, 1e-11, 8)  # communication is free: nothing to gain, dear not taken
    assert make_plan("auto", profile, fast).options["chose"] != "dear"


def _four(first_forward_s: float) -> Profile:
    return Profile("four", tuple(TensorProfile(f"t{i}", 1000, 4000, first_forward_s if i == 0 else 0.1, 0.1)
                                 for i in range(4)))


def test_priorities_let_the_first_layers_phases_overtake_and_are_kept_only_where_they_pay():
    cluster = Cluster.alpha_beta(0.1, 1e-4, 2)  # each phase of a layer 0.1 s: communication-bound
    slow_first = _four(1.0)  # the first layer's forward is long: the sooner it starts, the more it hides
    fifo = two_phase_ops(nearby_groups(slow_first, 1), slow_first)
    by_priority = prioritized(fifo)
    # RS(t3) runs when t0's gradient arrives; RS(t0) then AG(t0) overtake the queued RS(t2), RS(t1)
    assert [op.priority for op in by_priority] == [3, 2, 1, 0, 0, 1, 2, 3]
    t_fifo = simulate(Plan("d", fifo, slow_first.fingerprint, overlap_forward=True), slow_first, cluster)
    t_prio = simulate(Plan("d", by_priority, slow_first.fingerprint, scheduling="priority", overlap_forward=True),
                      slow_first, cluster)
    assert t_prio.iteration_s < t_fifo.iteration_s - 0.2
    plan = make_plan("dear", slow_first, cluster)
    assert plan.scheduling == "priority" and plan.options["planned_grouping"] == "nearby(1)"
    assert plan.options["predicted_iteration_s"] == pytest.approx(t_prio.iteration_s)
    even = _four(0.1)  # nothing for an early start to hide: priorities do not pay, the plan stays fifo
    assert make_plan("dear", even, cluster).scheduling == "fifo"


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(),
       st.sampled_from([{}, {"grouping": "threshold", "threshold_mb": 1.0}, {"grouping": "nearby", "nearby_layers": 3},
                        {"grouping": "threshold", "threshold_mb": 1e-6}]))
def test_each_element_is_reduce_scattered_and_gathered_exactly_once(profile, cluster, options):
    plan = make_plan("dear", profile, cluster, **options)
    plan.check(profile)
    for kind in (REDUCE_SCATTER, ALL_GATHER):
        spans: list[list[tuple[int, int]]] = [[] for _ in profile.tensors]
        for op in plan.operations:
            if op.collective == kind:
                assert len({profile.tensors[s.tensor].element_bytes for s in op.slices}) == 1  # one dtype
                for s in op.slices:
                    spans[s.tensor].append((s.start, s.end))
        for t, parts in enumerate(spans):  # sorted, the spans tile [0, numel) without gap or overlap
            ends = [0] + [e for _, e in sorted(parts)]
            assert [a for a, _ in sorted(parts)] == ends[:-1] and ends[-1] == profile.tensors[t].numel, kind
    assert all(op.collective in (REDUCE_SCATTER, ALL_GATHER) for op in plan.operations)
    both = (plan, dataclasses.replace(plan, operations=prioritized(plan.operations), scheduling="priority"))
    for variant in both:  # as planned, and with priorities over both phases
        r = simulate(variant, profile, cluster)
        for ag, rs in variant.gathers().items():  # an all-gather starts once its reduce-scatter is done
            assert r.op_start_s[ag] >= r.op_end_s[rs] - TOL
        assert r.iteration_s >= lower_bound_s(profile, cluster)["lower_bound_s"] * (1 - 1e-9) - TOL


@SETTINGS
@given(profiles(max_layers=6, max_numel=20_000), clusters())
def test_two_phase_cost_needs_no_all_reduce_figure_beyond_its_own(profile, cluster):
    """A cluster that measured its own reduce-scatter and all-gather plans and simulates with them."""
    ar = cluster.cost("allreduce")
    measured = Cluster(cluster.world_size, {"allreduce": ar, "reducescatter": CollectiveCost(ar.alpha_s, 1e-9),
                                            "allgather": CollectiveCost(ar.alpha_s, 1e-9)})
    plan = make_plan("dear", profile, measured)
    assert simulate(plan, profile, measured).iteration_s >= profile.compute_s - TOL


def test_simulate_command_prints_dear_and_writes_its_trace(tmp_path, capsys):
    from gradsched.cli import main

    trace = tmp_path / "t.json"
    assert main(["simulate", "--workers", "8", "--strategy", "dear,auto", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "dear" in out and trace.exists()


# ------------------------------------------------------------------ contention: a two-phase collective's own slowdown
def _slowed(cluster, **figures):
    from gradsched.cluster import Contention

    return dataclasses.replace(cluster, contention=Contention(**figures))


def test_a_reduce_scatter_overlapping_compute_is_stretched_by_its_own_figure(case):
    # RS(t2,t1) from 0.3 beside t0's backward (0.3-0.6) at half speed: 0.15 of its 0.65 s there, the rest
    # 0.6-1.1; RS(t0) 1.1-1.35, AG(t0) 1.35-1.6, AG(t2,t1) beside t0's forward (1.6-1.7): unslowed, 1.6-2.25;
    # forward t1, t2 2.25-2.45.  With the all-gather's own figure too: 0.05 s of it in t0's forward, to 2.3.
    profile, cluster = case
    r = simulate(two_phase(profile), profile, _slowed(cluster, reducescatter_comm_slowdown=1.0))
    assert r.op_start_s == pytest.approx([0.3, 1.1, 1.35, 1.6])
    assert r.op_end_s == pytest.approx([1.1, 1.35, 1.6, 2.25])
    assert r.iteration_s == pytest.approx(2.45)
    both = simulate(two_phase(profile), profile,
                    _slowed(cluster, reducescatter_comm_slowdown=1.0, allgather_comm_slowdown=1.0))
    assert both.op_end_s[3] == pytest.approx(2.3) and both.iteration_s == pytest.approx(2.5)
    # the all-reduce's figure alone slows both phases alike (what a cluster without their own figures means)
    shared = simulate(two_phase(profile), profile, _slowed(cluster, comm_slowdown=1.0))
    assert shared.op_end_s == pytest.approx(both.op_end_s)
    # an all-reduce keeps comm_slowdown whatever the two phases' own figures
    ddp = make_plan("ddp", profile, cluster)
    assert simulate(ddp, profile, _slowed(cluster, comm_slowdown=0.5, reducescatter_comm_slowdown=3.0,
                                          allgather_comm_slowdown=0.0)).iteration_s == \
        simulate(ddp, profile, _slowed(cluster, comm_slowdown=0.5)).iteration_s


@given(data=st.data())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_cluster_without_the_phases_figures_predicts_as_before(data):
    """Absent, a two-phase collective's own slowdown is the all-reduce's: the same times to the last bit, and a
    cluster file without them reads and writes as before."""
    from gradsched.cluster import Contention

    profile, cluster = data.draw(profiles()), data.draw(clusters())
    kc, kn = data.draw(st.floats(0.0, 2.0)), data.draw(st.floats(0.0, 2.0))
    plan = make_plan("dear", profile, cluster)
    old = _slowed(cluster, compute_slowdown=kc, comm_slowdown=kn, busy_latency_s=1e-4)
    same = _slowed(cluster, compute_slowdown=kc, comm_slowdown=kn, busy_latency_s=1e-4,
                   reducescatter_comm_slowdown=kn, allgather_comm_slowdown=kn)
    a, b = simulate(plan, profile, old), simulate(plan, profile, same)
    assert (a.iteration_s, a.op_end_s) == (b.iteration_s, b.op_end_s)
    assert old.contention is not None and set(old.contention.to_dict()) == {
        "compute_slowdown", "comm_slowdown", "busy_latency_s", "op_latency_s"}
    assert Contention.from_dict(same.contention.to_dict()) == same.contention  # type: ignore[union-attr]


def test_a_phase_figure_must_be_a_non_negative_number():
    from gradsched.cluster import Contention
    from gradsched.errors import GradschedError

    with pytest.raises(GradschedError, match="allgather_comm_slowdown"):
        Contention(allgather_comm_slowdown=-1.0)
    with pytest.raises(FormatError, match="reducescatter_comm_slowdwn"):
        Contention.from_dict({"reducescatter_comm_slowdwn": 1.0})


def test_a_phase_of_its_own_slowdown_is_priced_by_the_simulator_and_bounded_by_the_least(case, monkeypatch):
    # dear's compiled pricer does not dilate: a cluster whose only contention is a phase's own figure falls back to
    # the simulator (planners/_dear_eval.py), and the lower bound takes the least slowdown any operation has
    from gradsched.calibration import lower_bound_s
    from gradsched.planners import _dear_eval
    from gradsched.sim import _kernel

    profile, cluster = case
    monkeypatch.setattr(_dear_eval, "MIN_TENSORS", 1)
    compiled = _dear_eval.TwoPhasePricer(profile, _slowed(cluster, op_latency_s=1e-3)).run
    assert (compiled is not None) == _kernel.enabled()  # no dilation: the compiled pass where numba is there
    assert _dear_eval.TwoPhasePricer(profile, _slowed(cluster, reducescatter_comm_slowdown=1.0)).run is None
    base = _slowed(cluster, compute_slowdown=1.0, comm_slowdown=1.0)
    lower = _slowed(cluster, compute_slowdown=1.0, comm_slowdown=1.0, allgather_comm_slowdown=0.0)
    assert lower_bound_s(profile, lower)["contention_bound_s"] < lower_bound_s(profile, base)["contention_bound_s"]
    assert lower_bound_s(profile, lower)["contention_bound_s"] == \
        lower_bound_s(profile, _slowed(cluster, compute_slowdown=1.0))["contention_bound_s"]


def test_auto_ranks_a_decoupled_plan_predicted_under_the_bound_without_its_queued_gain(monkeypatch):
    # communication-bound: 8 layers of 4 MB, little compute; each phase alone costs a little under half the
    # all-reduce, and a queued rule (2 slots, 2x) halves dear's prediction, under the lower bound, which prices
    # every group alone: auto ranks dear as priced one at a time, and so keeps a plan without the phases
    import gradsched.planners.auto as auto

    profile = Profile("net-bound", tuple(TensorProfile(f"l{i}", 1_000_000, 4_000_000, 0.0002, 0.0001)
                                         for i in range(8)))
    phase = CollectiveCost(5e-4, 1.8e-8)
    alone = dataclasses.replace(Cluster.alpha_beta(1e-3, 5e-9, 8), collectives={
        "allreduce": CollectiveCost(1e-3, 5e-9), "reducescatter": phase, "allgather": phase})
    gains = {"slots": 2, "speedup": 2.0}
    queued = dataclasses.replace(alone, extra={"queued": {"reducescatter": gains, "allgather": gains}})
    bound = lower_bound_s(profile, queued)["lower_bound_s"]
    dear = make_plan("dear", profile, queued)
    predicted = simulate(dear, profile, queued).iteration_s
    one_at_a_time = simulate(dear, profile, alone).iteration_s
    assert predicted < 0.6 * bound < bound < one_at_a_time
    assert auto.under_bound_checked_s(dear, predicted, profile, queued, 1, []) == pytest.approx(one_at_a_time)
    assert auto.under_bound_checked_s(dear, 1.0, profile, queued, 1, []) == 1.0  # over the bound: as predicted
    assert auto.under_bound_checked_s(dear, predicted, profile, alone, 1, []) == predicted  # no queued rule
    chosen = make_plan("auto", profile, queued)
    assert chosen.options["chose"] != "dear" and chosen.options["predicted_iteration_s"] >= bound
    monkeypatch.setattr(auto, "under_bound_checked_s", lambda plan, predicted_s, *rest: predicted_s)
    assert make_plan("auto", profile, queued).options["chose"] == "dear"  # what the check changes
