"""Two-level clusters (issue 21 items 1-2): the topology field, the two-level cost formulas,
the simulator's hier-allreduce, and the planners' ``hierarchical`` option.

Hand cases follow docs/cost-model.md, "Two-level clusters": per-link a_i = 5 us, b_i = 0.1 ns/B
inside a node of 4 ranks, a_e = 50 us, b_e = 1 ns/B between 2 nodes."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.cli import main
from gradsched.cluster import Cluster, CollectiveCost, Topology
from gradsched.costs import cheaper, combine
from gradsched.errors import FormatError, GradschedError
from gradsched.plan import DENSE, HIER, Plan, whole_tensor_ops
from gradsched.planners import make_plan
from gradsched.planners._collective import choose_collective, collectives_for, dense_collectives, planning_cost
from gradsched.sim import simulate
from gradsched.synthetic import synthetic_profile
from strategies import profiles, two_level_clusters

A_I, B_I, A_E, B_E = 5e-6, 1e-10, 5e-5, 1e-9


def ring_line(a: float, b: float, p: int) -> CollectiveCost:
    """A ring all-reduce over ``p`` ranks on links of latency ``a`` and inverse bandwidth ``b``."""
    return CollectiveCost(2 * (p - 1) * a, 2 * (p - 1) / p * b) if p > 1 else CollectiveCost(0.0, 0.0)


def hand_cluster(algorithm: str = "ring", top: CollectiveCost | None = None) -> Cluster:
    """2 nodes x 4 ranks: intra line (30 us, 0.15 ns/B), inter line (100 us, 1 ns/B)."""
    data = {"format": "gradsched.cluster/1", "world_size": 8, "backend": "nccl",
            "collectives": {"allreduce": (top or CollectiveCost(8e-4, 2e-9)).to_dict()},
            "topology": {"nodes": 2, "ranks_per_node": 4, "algorithm": algorithm,
                         "intra": {"collectives": {"allreduce": ring_line(A_I, B_I, 4).to_dict()}},
                         "inter": {"collectives": {"allreduce": ring_line(A_E, B_E, 2).to_dict()}}}}
    return Cluster.from_dict(data)


def line(c: CollectiveCost) -> tuple[float, float]:
    return c.alpha_s, c.beta_s_per_byte


# ------------------------------------------------------------------ hand cases
def test_hand_levels_read_from_the_file():
    topo = hand_cluster().topology
    assert line(topo.intra_allreduce()) == pytest.approx((3e-5, 1.5e-10))
    assert line(topo.inter_allreduce()) == pytest.approx((1e-4, 1e-9))


def test_hand_flat_ring_is_limited_by_the_inter_node_link():
    # 8 ranks: 14 steps of s/8 bytes, each at the inter-node link (a_e, b_e)
    assert line(hand_cluster().topology.flat_ring()) == pytest.approx((14 * A_E, 14 / 8 * B_E))
    assert hand_cluster().topology.flat_ring().time_s(1e6) == pytest.approx(7e-4 + 1.75e-3)


def test_hand_hierarchical_is_intra_reduce_plus_inter_allreduce_plus_intra_broadcast():
    hier = hand_cluster().cost(HIER)
    # reduce (half of 30 us + 0.15 ns/B) + inter (100 us + 1 ns/B) + broadcast (the other half)
    assert line(hier) == pytest.approx((1.3e-4, 1.15e-9))
    assert hier.time_s(1e6) == pytest.approx(1.28e-3)


def test_measured_reduce_and_broadcast_replace_the_half_rule():
    data = hand_cluster().to_dict()
    data["topology"]["intra"]["collectives"].update(reduce={"alpha_s": 2e-5, "beta_s_per_byte": 1e-10},
                                                    broadcast={"alpha_s": 4e-5, "beta_s_per_byte": 2e-10})
    cluster = Cluster.from_dict(data)
    # measured reduce (20 us + 0.1 ns/B) + inter (100 us + 1 ns/B) + measured broadcast (40 us + 0.2 ns/B)
    assert line(cluster.cost(HIER)) == pytest.approx((1.6e-4, 1.3e-9))
    # at 8 ranks per node each step moves as the intra all-reduce does: alpha x 7/3, beta x (7/8)/(3/4)
    at8 = cluster.topology.at(2, 8)
    assert line(at8.node_step("reduce")[1]) == pytest.approx((2e-5 * 7 / 3, 1e-10 * (7 / 8) / (3 / 4)))
    assert line(cluster.topology.node_step("broadcast", 8)[1]) == line(at8.node_step("broadcast")[1])
    again = Cluster.from_dict(json.loads(json.dumps(cluster.to_dict())))
    assert again.topology == cluster.topology


def test_hand_tree_uses_log2_nodes_between_nodes():
    topo = hand_cluster("tree").topology
    assert line(topo.tree()) == pytest.approx((1.3e-4, 1.15e-9))  # at the measured 2 nodes: intra + inter
    at8 = topo.at(8, 4)
    assert line(at8.inter_allreduce()) == pytest.approx((1e-4 * 3, 1e-9))  # log2 8 / log2 2 = 3, beta kept
    assert line(at8.plain_allreduce()) == pytest.approx((3e-5 + 3e-4, 1.5e-10 + 1e-9))


def test_measured_top_level_stays_and_moves_by_the_formula_ratio():
    cluster = hand_cluster()
    assert line(cluster.cost("allreduce")) == (8e-4, 2e-9)  # measured, not modelled
    big = cluster.at_topology(4, 4)
    # flat ring at 2x4: (14 a_e, 14/8 b_e); at 4x4: (30 a_e, 30/16 b_e)
    assert line(big.cost("allreduce")) == pytest.approx((8e-4 * 30 / 14, 2e-9 * (30 / 16) / (14 / 8)))
    assert big.world_size == 16 and (big.topology.nodes, big.topology.ranks_per_node) == (4, 4)
    assert line(big.cost(HIER)) == pytest.approx((3e-5 + 3e-4, 1.5e-10 + 1e-9 * (3 / 4) / (1 / 2)))
    assert big.at_world_size(16) is big and cluster.at_world_size(16) == big  # world size: nodes of 4 kept


def test_two_level_constructor_models_the_top_level():
    c = Cluster.two_level(ring_line(A_I, B_I, 8), ring_line(A_E, B_E, 128), 128, 8)
    assert c.world_size == 1024
    assert line(c.cost("allreduce")) == pytest.approx((2 * 1023 * A_E, 2 * 1023 / 1024 * B_E))
    hier = Cluster.two_level(ring_line(A_I, B_I, 8), ring_line(A_E, B_E, 128), 128, 8, algorithm="hierarchical")
    assert line(hier.cost("allreduce")) == pytest.approx(line(hier.cost(HIER)))


def test_hier_needs_a_topology():
    with pytest.raises(GradschedError, match="no topology"):
        Cluster.alpha_beta(1e-4, 1e-9, 8).cost(HIER)


def test_tables_are_summed_at_the_union_of_their_sizes():
    intra = CollectiveCost(3e-5, 1.5e-10, ((1e3, 4e-5), (1e5, 6e-5)))
    inter = CollectiveCost(1e-4, 1e-9, ((4e3, 2e-4), (1e6, 1.2e-3)))
    c = Cluster.two_level(intra, inter, 2, 4)
    hier = c.cost(HIER)
    assert [x for x, _ in hier.points] == [1e3, 4e3, 1e5, 1e6]
    for s in (1e3, 4e3, 1e5, 1e6, 5e6):
        assert hier.time_s(s) == pytest.approx(intra.time_s(s) + inter.time_s(s))
    assert line(hier) == pytest.approx((1.3e-4, 1.15e-9))


def test_round_trip_and_old_files_unchanged():
    cluster = hand_cluster()
    again = Cluster.from_dict(json.loads(json.dumps(cluster.to_dict())))
    assert again.topology == cluster.topology and again.to_dict() == cluster.to_dict()
    flat = {"format": "gradsched.cluster/1", "world_size": 4, "backend": "gloo",
            "collectives": {"allreduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9}}}
    assert Cluster.from_dict(flat).to_dict() == flat and Cluster.from_dict(flat).topology is None


def test_a_one_rank_level_may_be_left_out():
    data = {"nodes": 4, "ranks_per_node": 1, "inter": {"collectives": {"allreduce": {"alpha_s": 1e-4,
                                                                                       "beta_s_per_byte": 1e-9}}}}
    topo = Topology.from_dict(data, "<t>", 4)
    assert topo.intra is None and line(topo.hier_allreduce()) == (1e-4, 1e-9)


@pytest.mark.parametrize("edit,field", [
    (lambda t: t.update(nodes=0), "topology.nodes"),
    (lambda t: t.update(nodes=3), "topology"),
    (lambda t: t.update(algorithm="butterfly"), "topology.algorithm"),
    (lambda t: t.update(ranks_per_nod=4), "topology.ranks_per_nod"),
    (lambda t: t.pop("inter"), "topology.inter"),
    (lambda t: t["intra"]["collectives"]["allreduce"].update(alpha_s=-1), "topology.intra.collectives.allreduce.alpha_s"),
    (lambda t: t["inter"].update(points={"allreduce": [[1, 1]]}), "topology.inter.points.allreduce"),
    (lambda t: t["inter"].update(collectives={"allgather": {"alpha_s": 0, "beta_s_per_byte": 0}}),
     "topology.inter.collectives.allreduce"),
    (lambda t: t["intra"].update(point={}), "topology.intra.point"),
    (lambda t: t["inter"]["collectives"].update(reduce={"alpha_s": 0, "beta_s_per_byte": 0}),
     "topology.inter.collectives.reduce"),  # measured inside a node only
    (lambda t: t["intra"]["collectives"].update(scatter={"alpha_s": 0, "beta_s_per_byte": 0}),
     "topology.intra.collectives.scatter"),
])
def test_bad_topology_is_a_format_error_naming_the_field(edit, field):
    data = hand_cluster().to_dict()
    edit(data["topology"])
    with pytest.raises(FormatError) as exc:
        Cluster.from_dict(data, "c.json")
    assert exc.value.field == field, str(exc.value)


# ------------------------------------------------------------------ properties
links = st.tuples(st.floats(1e-7, 1e-3), st.floats(1e-12, 1e-8), st.floats(1e-7, 1e-3), st.floats(1e-12, 1e-8))
sizes = st.floats(1.0, 1e9)


def model(a_i, b_i, a_e, b_e, n, m, algorithm="ring") -> Cluster:
    intra = ring_line(a_i, b_i, m) if m > 1 else None
    inter = ring_line(a_e, b_e, n) if n > 1 else None
    return Cluster.two_level(intra, inter, n, m, algorithm=algorithm)


@settings(max_examples=200, deadline=None)
@given(links, st.integers(1, 256), st.integers(1, 16), sizes)
def test_hierarchical_never_below_its_parts(link, n, m, s):
    topo = model(*link, n, m).topology
    hier = topo.hier_allreduce().time_s(s)
    assert hier >= topo.inter_allreduce().time_s(s) * (1 - 1e-12)
    assert hier >= topo.intra_allreduce().time_s(s) * (1 - 1e-12)  # its reduce and broadcast
    assert hier == pytest.approx(topo.inter_allreduce().time_s(s) + topo.intra_allreduce().time_s(s))


@settings(max_examples=200, deadline=None)
@given(links, st.integers(2, 256), st.integers(2, 16), sizes)
def test_flat_ring_of_one_level_is_that_levels_ring(link, n, m, s):
    a_i, b_i, a_e, b_e = link
    one_node = model(*link, 1, m).topology.flat_ring()
    assert one_node.time_s(s) == pytest.approx(ring_line(a_i, b_i, m).time_s(s))
    one_rank_each = model(*link, n, 1).topology.flat_ring()
    assert one_rank_each.time_s(s) == pytest.approx(ring_line(a_e, b_e, n).time_s(s))
    both = model(*link, n, m).topology.flat_ring()  # no faster than either level's ring over all ranks
    assert both.time_s(s) >= max(ring_line(a_i, b_i, n * m).time_s(s), ring_line(a_e, b_e, n * m).time_s(s)) * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(links, st.integers(1, 256), st.integers(1, 16), sizes, sizes, st.sampled_from(["ring", "hierarchical", "tree"]))
def test_costs_are_monotone_in_bytes(link, n, m, s1, s2, algorithm):
    c = model(*link, n, m, algorithm)
    lo, hi = sorted((s1, s2))
    for cost in (c.cost("allreduce"), c.cost(HIER), planning_cost(c)):
        assert cost.time_s(lo) <= cost.time_s(hi) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(links, st.integers(2, 256), st.integers(2, 16), sizes)
def test_planning_cost_is_the_cheaper_of_the_two(link, n, m, s):
    c = model(*link, n, m)
    env = planning_cost(c)
    want = min(c.cost("allreduce").time_s(s), c.cost(HIER).time_s(s))
    assert env.time_s(s) == pytest.approx(want, rel=1e-9)


def test_cheaper_returns_a_dominating_cost_itself_and_combines_tables():
    a, b = CollectiveCost(1e-4, 1e-9), CollectiveCost(2e-4, 2e-9)
    assert cheaper(a, b) is a and cheaper(b, a) is a
    crossing = cheaper(CollectiveCost(1e-3, 1e-10), CollectiveCost(1e-5, 1e-9))
    assert crossing.time_s(1e3) == pytest.approx(1e-5 + 1e-6) and crossing.time_s(1e8) == pytest.approx(1e-3 + 1e-2)
    assert combine([(0.5, CollectiveCost(2.0, 4.0))]).time_s(1.0) == 3.0


# ------------------------------------------------------------------ simulator and planners
def two_level_cluster() -> Cluster:
    """128 x 8: hierarchical wins operations below about 10 MB (latency), the flat ring larger ones
    (links inside a node as slow per byte as between nodes, so that both regimes show)."""
    return Cluster.two_level(ring_line(2e-6, 1e-9, 8), ring_line(1e-5, 1e-9, 128), 128, 8)


def test_simulator_costs_hier_operations_by_their_collective():
    profile = synthetic_profile(20)
    cluster = two_level_cluster()
    ops = whole_tensor_ops([[t] for t in profile.order], profile)
    plain = Plan("x", ops, profile.fingerprint, profile.model)
    hier = Plan("x", tuple(op.__class__(op.slices, HIER, op.priority) for op in ops), profile.fingerprint,
                profile.model)
    a, b = simulate(plain, profile, cluster), simulate(hier, profile, cluster)
    elem = [t.element_bytes for t in profile.tensors]
    for j, op in enumerate(ops):
        nb = sum(s.numel * elem[s.tensor] for s in op.slices)
        assert b.op_end_s[j] - b.op_start_s[j] == pytest.approx(cluster.cost(HIER).time_s(nb))
        assert a.op_end_s[j] - a.op_start_s[j] == pytest.approx(cluster.cost("allreduce").time_s(nb))
    with pytest.raises(GradschedError, match="hier-allreduce.*no topology"):
        simulate(hier, profile, Cluster.alpha_beta(1e-4, 1e-9, 1024))


def test_choose_collective_marks_only_where_cheaper():
    profile = synthetic_profile(50)
    cluster = two_level_cluster()
    ops = choose_collective(whole_tensor_ops([[t] for t in profile.order], profile), profile, cluster)
    plain, hier = cluster.cost("allreduce"), cluster.cost(HIER)
    elem = [t.element_bytes for t in profile.tensors]
    kinds = set()
    for op in ops:
        nb = sum(s.numel * elem[s.tensor] for s in op.slices)
        assert (op.collective == HIER) == (hier.time_s(nb) < plain.time_s(nb))
        kinds.add(op.collective)
    assert kinds == {DENSE, HIER}  # this cluster and profile have both regimes
    assert make_plan("wfbp", profile, cluster).operations == ops  # wfbp picks as it builds: the same choice


@pytest.mark.parametrize("mode", ["auto", "never", "always"])
def test_dense_collectives_are_those_an_operation_may_run_as(mode):
    """What auto's floors and usbyte's block pricer cost: every collective collectives_for gives, and no other."""
    sizes = [2.0 ** k for k in range(40)]  # 1 B to 512 GiB: both regimes of two_level_cluster()
    for cluster in (Cluster.alpha_beta(1e-4, 1e-9, 1024), two_level_cluster()):
        if mode == "always" and cluster.topology is None:
            continue  # an error (check_mode)
        assert set(collectives_for(sizes, cluster, mode)) == set(dense_collectives(cluster, mode))


@pytest.mark.parametrize("strategy", ["wfbp", "threshold", "mgwfbp", "optimal", "bytescheduler", "usbyte", "auto"])
def test_own_planners_take_the_hierarchical_option(strategy):
    profile = synthetic_profile(40)
    cluster = two_level_cluster()
    never = make_plan(strategy, profile, cluster, hierarchical="never")
    always = make_plan(strategy, profile, cluster, hierarchical="always")
    auto = make_plan(strategy, profile, cluster)
    assert all(op.collective == DENSE for op in never.operations)
    if strategy != "auto":
        assert all(op.collective == HIER for op in always.operations)
    t = {k: simulate(p, profile, cluster, timeline=False).iteration_s for k, p in
         (("never", never), ("always", always), ("auto", auto))}
    if strategy in ("wfbp", "threshold", "optimal", "auto"):  # same groups, each op the cheaper; or searched
        assert t["auto"] <= min(t["never"], t["always"]) * (1 + 1e-9)
    with pytest.raises(GradschedError, match="hierarchical"):
        make_plan(strategy, profile, cluster, hierarchical="sometimes")
    with pytest.raises(GradschedError, match="topology"):
        make_plan(strategy, profile, Cluster.alpha_beta(1e-4, 1e-9, 8), hierarchical="always")


@pytest.mark.parametrize("strategy", ["ddp", "horovod", "sync"])
def test_tool_mimics_run_plain_allreduces(strategy):
    plan = make_plan(strategy, synthetic_profile(40), two_level_cluster())
    assert all(op.collective == DENSE for op in plan.operations)


def test_flat_cluster_plans_unchanged():
    profile = synthetic_profile(40)
    flat = Cluster.alpha_beta(1e-4, 1e-9, 8)
    for strategy in ("wfbp", "mgwfbp", "optimal", "bytescheduler"):
        plan = make_plan(strategy, profile, flat)
        assert "hierarchical" not in plan.options and all(op.collective == DENSE for op in plan.operations)


def test_cli_plans_for_nodes_and_ranks_per_node(tmp_path, capsys):
    path = tmp_path / "c.json"
    hand_cluster().save(path)
    out = tmp_path / "plan.json"
    assert main(["plan", "--strategy", "optimal", "--cluster", str(path), "--nodes", "16", "--ranks-per-node", "4",
                 "-o", str(out)]) == 0
    assert "64 workers (16 nodes x 4)" in capsys.readouterr().out
    assert main(["simulate", "--cluster", str(path), "--nodes", "16", "--ranks-per-node", "4", "--strategy",
                 "wfbp,ddp", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["workers"], r["nodes"], r["ranks_per_node"]) for r in rows] == [(64, 16, 4)] * 2
    assert rows[1]["hier_operations"] == 0 and rows[0]["hier_operations"] > 0


@pytest.mark.parametrize("argv,words", [
    (["--nodes", "4"], ["--nodes and --ranks-per-node"]),
    (["--nodes", "4", "--ranks-per-node", "2", "--workers", "9"], ["--workers 9", "= 8"]),
    (["--nodes", "4", "--ranks-per-node", "2", "--alpha", "1e-4", "--beta", "1e-9"], ["topology", "--workers 8"]),
    (["--workers", "6"], ["nodes of 4", "6"]),
])
def test_cli_node_flags_refuse_what_does_not_fit(tmp_path, capsys, argv, words):
    path = tmp_path / "c.json"
    hand_cluster().save(path)
    extra = [] if "--alpha" in argv else ["--cluster", str(path)]
    assert main(["simulate", "--strategy", "wfbp", *extra, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_hier_plan_on_a_flat_cluster_is_a_clear_error(tmp_path, capsys):
    profile = synthetic_profile(10)
    plan = make_plan("wfbp", profile, two_level_cluster(), hierarchical="always")
    (tmp_path / "p.json").write_text(json.dumps(profile.to_dict()))
    plan.save(tmp_path / "plan.json")
    assert main(["simulate", "--profile", str(tmp_path / "p.json"), "--plan", str(tmp_path / "plan.json"),
                 "--alpha", "1e-4", "--beta", "1e-9"]) == 2
    err = capsys.readouterr().err
    assert "hier-allreduce" in err and "topology" in err


# ------------------------------------------------------------------ planners on random two-level clusters
PLANNER_SETTINGS = settings(max_examples=30, deadline=None)


@PLANNER_SETTINGS
@given(profiles(max_layers=4), two_level_clusters())  # at most 8 tensors: 128 partitions
def test_optimal_equals_brute_force_with_each_operation_the_cheaper_collective(profile, cluster):
    from itertools import product

    got = simulate(make_plan("optimal", profile, cluster), profile, cluster, timeline=False).iteration_s
    order = profile.order
    best = math.inf
    for cuts in product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for cut, i in zip(cuts, order[1:]):
            if cut or profile.tensors[i].element_bytes != profile.tensors[current[-1]].element_bytes:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
        ops = choose_collective(whole_tensor_ops(groups, profile), profile, cluster)
        plan = Plan("brute", ops, profile.fingerprint)
        best = min(best, simulate(plan, profile, cluster, timeline=False).iteration_s)
    assert got == pytest.approx(best, rel=1e-9, abs=1e-15)


@PLANNER_SETTINGS
@given(profiles(max_layers=8), two_level_clusters())
def test_usbyte_replays_its_model_with_hierarchical_blocks(profile, cluster):
    from gradsched.planners.usbyte import predict

    plan, schedule, _ = predict(profile, cluster, unit_bytes=128 << 10)
    result = simulate(plan, profile, cluster, timeline=False)
    assert result.iteration_s == pytest.approx(schedule.iteration_s, rel=1e-12)


@PLANNER_SETTINGS
@given(profiles(max_layers=8, mixed_dtypes=True), two_level_clusters(), st.sampled_from([1, 2]))
def test_auto_on_two_levels_is_the_best_simulated_candidate(profile, cluster, channels):
    from gradsched.planners.auto import as_auto, comm_lower_bound_s, ranked

    every = ranked(profile, cluster, 1.0, channels)
    assert make_plan("auto", profile, cluster, channels=channels) == as_auto(every[0], len(every))
    for r in every:
        bound = comm_lower_bound_s(r.plan, profile, cluster, channels)
        assert bound <= simulate(r.plan, profile, cluster, channels=channels, timeline=False).iteration_s * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(two_level_clusters(), sizes, sizes)
def test_with_tables_costs_stay_monotone_and_above_their_parts(cluster, s1, s2):
    topo = cluster.topology
    lo, hi = sorted((s1, s2))
    for cost in (cluster.cost("allreduce"), cluster.cost(HIER), planning_cost(cluster)):
        assert cost.time_s(lo) <= cost.time_s(hi) * (1 + 1e-12)
    for s in (lo, hi):
        hier = cluster.cost(HIER).time_s(s)
        assert hier >= topo.inter_allreduce().time_s(s) * (1 - 1e-12)
        assert hier >= topo.intra_allreduce().time_s(s) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(profiles(max_layers=8, with_update=True), two_level_clusters(),
       st.sampled_from(["wfbp", "mgwfbp", "optimal", "usbyte", "bytescheduler", "sync"]))
def test_no_plan_on_two_levels_beats_the_lower_bound(profile, cluster, name):
    """The bench's lower bound takes the cheaper of the flat and the hierarchical all-reduce at
    every size, so plans of hier-allreduce operations (measured 0.77x a flat-only bound) stay above it."""
    from gradsched.calibration import lower_bound_s

    bound = lower_bound_s(profile, cluster)["lower_bound_s"]
    r = simulate(make_plan(name, profile, cluster), profile, cluster, timeline=False)
    assert r.iteration_s >= bound * (1 - 1e-9) - 1e-12
