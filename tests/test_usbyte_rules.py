"""``usbyte``'s speed-up keeps its plans; the paper's rules (block extension, the whole-layer
promotion window) keep every element accounted for; the rule chosen by simulation is
never slower than either rule alone."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, GradschedError, Profile, TensorProfile
from gradsched.planners import make_plan
from gradsched.planners.usbyte import RULES, _busy_until, _busy_until_spread, _Model, predict
from gradsched.sim import simulate
from strategies import clusters, profiles, two_level_clusters

MS = 1e-3
SETTINGS = settings(max_examples=60, deadline=None)


GOLDEN = json.loads((Path(__file__).parent / "data" / "usbyte_golden.json").read_text())


def _operations_sha256(plan) -> str:
    return hashlib.sha256(json.dumps([op.to_dict() for op in plan.operations], sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("case", range(len(GOLDEN["cases"])))
def test_fast_planner_returns_the_plans_of_the_planner_before_its_speed_ups(case):
    # tests/data/usbyte_golden.json: the plans of the planner before its speed-up (what it says), with
    # gradsched's own rules pinned and the search as it was then: a cap, every try within it (patience 0).
    entry = GOLDEN["cases"][case]
    profile, cluster = Profile.from_dict(entry["profile"]), Cluster.from_dict(entry["cluster"])
    for old in entry["plans"]:
        new, schedule, evals = predict(profile, cluster, old["unit_bytes"], old["max_evaluations"], extend=False,
                                       window="block", patience=0)
        assert (_operations_sha256(new), len(new.operations)) == (old["operations_sha256"], old["operations"])
        assert (new.scheduling, new.overlap_forward) == (old["scheduling"], old["overlap_forward"])
        assert schedule.iteration_s == pytest.approx(old["iteration_s"], rel=1e-12)
        assert evals == old["evaluations"]


@SETTINGS
@given(profiles(max_layers=12, mixed_dtypes=True), clusters())
def test_every_rule_covers_each_element_exactly_once(profile, cluster):
    for window, extend in RULES:
        plan = make_plan("usbyte", profile, cluster, unit_bytes=64 << 10, extend=extend, window=window)
        plan.check(profile)  # every element of every tensor in exactly one slice
        covered = [0] * profile.num_tensors
        for op in plan.operations:
            assert len({profile.layer_of[s.tensor] for s in op.slices}) == 1
            for s in op.slices:
                covered[s.tensor] += s.end - s.start
        assert covered == [t.numel for t in profile.tensors]


@SETTINGS
@given(profiles(max_layers=12, mixed_dtypes=True, with_update=True), clusters())
def test_every_rule_replays_exactly_in_the_simulator(profile, cluster):
    for window, extend in RULES:
        plan, schedule, _ = predict(profile, cluster, 128 << 10, extend=extend, window=window)
        result = simulate(plan, profile, cluster, timeline=False)
        assert result.op_start_s == pytest.approx([b[3] for b in schedule.blocks], rel=1e-12, abs=1e-15)
        assert result.op_end_s == pytest.approx([b[4] for b in schedule.blocks], rel=1e-12, abs=1e-15)
        assert result.iteration_s == pytest.approx(schedule.iteration_s, rel=1e-12)


@SETTINGS
@given(profiles(max_layers=12), clusters())
def test_chosen_rule_never_simulates_slower_than_either_rule_alone(profile, cluster):
    def simulated(**opts):
        plan = make_plan("usbyte", profile, cluster, unit_bytes=128 << 10, **opts)
        return simulate(plan, profile, cluster, timeline=False).iteration_s, plan

    chosen, plan = simulated()
    assert (plan.options["window"], plan.options["extend"]) in RULES
    for window, extend in RULES:
        assert chosen <= simulated(extend=extend, window=window)[0] * (1 + 1e-12)
    for extend in (False, True):  # one option pinned: the other is still chosen
        pinned, pinned_plan = simulated(extend=extend)
        assert pinned_plan.options["extend"] is extend
        assert pinned <= min(simulated(extend=extend, window=w)[0] for w in ("block", "layer")) * (1 + 1e-12)


def test_block_extension_merges_across_a_lower_priority_ready_event_by_hand():
    # alpha = 1 ms, beta = 1 ms/MB, unit = 1 MB.  Layers X, Y, Z in forward order (X first: highest
    # priority front-first); backward Z 1 ms, Y 2 ms, X 3 ms: ready Z 1, Y 3, X 6.  Z 8 MB, Y 0.5 MB, X 1 MB.
    # Front-first: t=1 Z alone, gap 2 -> ceil(1) = 1 unit, Z 1-3.  t=3 Y ready and ahead of Z: gap 3
    #   >= T(0.5 MB) = 1.5: all of Y 3-4.5.  t=4.5 Z, gap 1.5 -> 1 unit 4.5-6.5.  Phase 2: X 6.5-8.5,
    #   Z 6 MB 8.5-15.5.
    mb = 250_000
    profile = Profile("ext2", (TensorProfile("X", mb, 4 * mb, 1 * MS, 3 * MS),
                               TensorProfile("Y", mb // 2, 2 * mb, 1 * MS, 2 * MS),
                               TensorProfile("Z", 8 * mb, 32 * mb, 1 * MS, 1 * MS)))
    cluster = Cluster.alpha_beta(1 * MS, 1e-9, 2)
    _, plain, _ = predict(profile, cluster, 1_000_000, 1, extend=False, window="block")
    # units in order of first readiness: 0 = Z, 1 = Y, 2 = X
    assert [b[0] for b in plain.blocks] == [0, 1, 0, 2, 0]
    assert [(b[3] / MS, b[4] / MS) for b in plain.blocks] == [
        pytest.approx(x) for x in [(1.0, 3.0), (3.0, 4.5), (4.5, 6.5), (6.5, 8.5), (8.5, 15.5)]]
    # Z ahead of Y (as the promotion search tries): t=3 Z again, gap 3 -> ceil(2) = 2 units, 3-6:
    # two back-to-back blocks of Z.  Extension sends them as one message from 1 ms sized to the
    # gap up to 6 ms: ceil((5 - 1) / 1) = 4 units, 1-6 ms (one start-up instead of two).
    rank = [1, 2, 0]  # Z, Y, X
    model = _Model(profile, cluster.cost("allreduce"), 1_000_000)
    blocks_plain = model.run(rank, extend=False).blocks
    blocks_ext = model.run(rank, extend=True).blocks
    assert [b[0] for b in blocks_plain[:2]] == [0, 0]
    assert [(b[3] / MS, b[4] / MS) for b in blocks_plain[:2]] == [pytest.approx((1.0, 3.0)), pytest.approx((3.0, 6.0))]
    u, lo, hi, start_s, end_s = blocks_ext[0]
    assert (u, lo, hi) == (0, 0, 4 * mb) and (start_s / MS, end_s / MS) == pytest.approx((1.0, 6.0))
    assert blocks_ext[1][0] != 0 or blocks_ext[1][3] > blocks_ext[0][4]  # not back to back again


@pytest.mark.parametrize("opts", [{"extend": "maybe"}, {"window": "paper"}, {"window": 3}])
def test_bad_rule_options_are_user_errors(opts):
    profile = Profile("p", (TensorProfile("a", 10, 40, MS, MS),))
    with pytest.raises(GradschedError, match="usbyte"):
        make_plan("usbyte", profile, Cluster.alpha_beta(1e-3, 1e-9, 2), **opts)


def test_no_extension_that_would_end_before_it_was_decided():
    # A measured table up to 128 KiB lies above the line beyond it: one element more than the
    # table's last size is faster than the unit itself.  Extending the first 128 KiB block by
    # that element would end the message before the moment the extension is decided (the first
    # block's end): the model must not go back in time, so no merge, and the simulator
    # replays the plan exactly.  (Found by test_chosen_rule_never_simulates_slower_...)
    times = {0: 4 * MS, 4: 0.79 * MS, 9: 4 * MS, 10: 4 * MS}
    tensors = [TensorProfile("l0.t0", 1, 4, 0.0, 4 * MS, 0), TensorProfile("l0.t1", 1, 4, 0.0, 0.0, 0),
               TensorProfile("l1.t0", 32769, 131076, 0.0, 0.0, 1)]
    tensors += [TensorProfile(f"l{k}.t0", 1, 4, 4 * MS if k == 4 else 0.0, times.get(k, 0.0), k) for k in range(2, 12)]
    profile = Profile("table-edge", tuple(tensors), (12, 4, 2, 9, 8, 7, 6, 5, 11, 3, 10, 0, 1))
    cost = CollectiveCost(1.2754e-3, 1.1492e-9, ((1024.0, 1.2766e-3), (131072.0, 2.7014e-3)))
    cluster = Cluster(2, {"allreduce": cost})
    for window, extend in RULES:
        plan, schedule, _ = predict(profile, cluster, 128 << 10, extend=extend, window=window)
        result = simulate(plan, profile, cluster, timeline=False)
        assert result.iteration_s == pytest.approx(schedule.iteration_s, rel=1e-12)
        assert all(b[4] >= b[3] for b in schedule.blocks)


EPS = 1e-12  # the simulator's simultaneity (gradsched.sim.engine.EPS_S)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([1.5 * EPS, 3 * EPS, 1e-6, 1e-3, 0.25]), min_size=1, max_size=12), st.data())
def test_bisected_busy_clock_is_the_loops(gaps, data):
    # The planner's clock while the channel is busy, found by bisection where every ready time
    # is its own step, must be the stepping loop's to the bit (the simulator replays it).
    ready = list(itertools.accumulate([0.01] + gaps))
    nxt = data.draw(st.integers(0, len(ready) - 1))
    t = ready[nxt - 1] if nxt else 0.0
    free = data.draw(st.sampled_from(ready)) + data.draw(st.sampled_from([-2 * EPS, -EPS, -EPS / 2, 0.0, EPS / 2,
                                                                          EPS, 1e-4, 1.0]))
    ready_eps = [r + EPS for r in ready]
    assume(all(b > a for a, b in zip(ready_eps, ready[1:])))  # the planner's own test for when it bisects
    assume(ready[nxt] > t + EPS and free > t + EPS)
    assert _busy_until_spread(ready, ready_eps, nxt, free) == _busy_until(ready, nxt, t, free)


@SETTINGS
@given(profiles(max_layers=12, mixed_dtypes=True, with_update=True), clusters(), st.booleans())
def test_dry_runs_price_the_iteration_the_complete_schedule_has(profile, cluster, extend):
    # The search's trials price phase 2 and the next forward in closed form; the schedule they
    # leave pending, once played, is the full run's, with the same iteration up to rounding.
    model = _Model(profile, cluster.cost("allreduce"), 64 << 10)
    rank = list(range(len(model.units)))[::-1]
    dry, full = model.run(rank, extend, dry=True), model.run(rank, extend)
    assert dry.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    assert model.complete(dry).blocks == full.blocks


@SETTINGS
@given(profiles(max_layers=12, mixed_dtypes=True, with_update=True), st.one_of(clusters(), two_level_clusters()),
       st.booleans(), st.randoms(use_true_random=False))
def test_the_model_is_the_simulator_for_any_priority_order(profile, cluster, extend, rng):
    # The planner's model and the simulator are two codes: the search models a hundred or more schedules
    # per plan, each resumed where a promotion changes it and priced in closed form, where one run of the
    # simulator's general loop costs about as much as planning does. So they are tested equal instead:
    # for ANY priority order, not only the searched ones, with one cost line or the cheaper of
    # the plain and the hierarchical all-reduce, the modelled blocks replay in the simulator at
    # the same times, with the same iteration.
    from gradsched.planners import _collective as coll
    from gradsched.planners.usbyte import build_plan

    cost = coll.planning_cost(cluster, "auto")
    both = cost is not cluster.cost("allreduce")
    model = _Model(profile, cost, 64 << 10, (cluster.cost("allreduce"), cluster.cost("hier-allreduce")) if both else None)
    rank = list(range(len(model.numel)))
    rng.shuffle(rank)
    schedule = model.run(rank, extend)
    plan = build_plan(model, rank, schedule, {}, cluster, "auto")
    plan.check(profile)
    result = simulate(plan, profile, cluster, timeline=False)
    assert result.op_start_s == pytest.approx([b[3] for b in schedule.blocks], rel=1e-12, abs=1e-15)
    assert result.op_end_s == pytest.approx([b[4] for b in schedule.blocks], rel=1e-12, abs=1e-15)
    assert result.iteration_s == pytest.approx(schedule.iteration_s, rel=1e-12)
