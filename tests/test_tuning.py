"""Run-time auto's torch-free decisions (gradsched.tuning): when profiling starts, the configuration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradsched.calibration.budget import MAX_REST
from gradsched.errors import GradschedError
from gradsched.tuning import AutoTuneConfig, profiling_cost_s, profiling_rest


@given(share=st.floats(0.001, 0.5), elapsed_s=st.floats(0, 1000), base_s=st.floats(1e-4, 2),
       iterations=st.integers(2, 20), planning_s=st.floats(0, 5))
def test_profiling_waits_exactly_until_its_cost_fits_the_share(share, elapsed_s, base_s, iterations, planning_s):
    """After the rest, profiling's expected cost is within ``share`` of the time trained by its end; two
    iterations less (one: rounding) and it would not be."""
    cost = profiling_cost_s(base_s, iterations, planning_s)
    rest = profiling_rest(elapsed_s, base_s, share, cost, iterations)

    def fits(n: int) -> bool:
        return cost <= share * (elapsed_s + (n + iterations) * base_s) * (1 + 1e-9) + 1e-12

    assert 0 <= rest <= MAX_REST and (fits(rest) or rest == MAX_REST)
    assert rest <= 1 or not fits(rest - 2)


def test_profiling_costs_more_for_slower_iterations_and_starts_at_once_without_a_budget():
    assert profiling_cost_s(0.2, 5) > profiling_cost_s(0.1, 5) > profiling_cost_s(0.1, 5, planning_s=0)
    assert profiling_rest(0.0, 0.1, 0.0, 10.0, 5) == 0  # no budget: profile now, as without defer
    assert profiling_rest(0.0, 0.0, 0.01, 10.0, 5) == 0  # nothing measured: now
    # a longer job (more time trained) waits less: the same cost fits sooner
    assert profiling_rest(50.0, 0.1, 0.01, 1.0, 5) < profiling_rest(5.0, 0.1, 0.01, 1.0, 5)


def test_a_100_step_job_of_short_iterations_never_profiles_with_the_defaults():
    cfg = AutoTuneConfig.from_options({})
    base_s = 0.1  # 100 steps: 10 s
    rest = profiling_rest(cfg.switch_iteration * base_s, base_s, cfg.trial_share,
                          profiling_cost_s(base_s, cfg.switch_iteration), cfg.switch_iteration)
    assert cfg.deferred and cfg.switch_iteration + rest > 100


def test_the_configuration_is_torch_free_and_defer_is_checked():
    assert AutoTuneConfig.from_options({"defer": "no"}).defer is False
    with pytest.raises(GradschedError, match="defer"):
        AutoTuneConfig.from_options({"defer": 3})


def test_run_time_auto_takes_every_option_its_planner_declares():
    """The auto planner declares ``hierarchical``; run-time auto refused it as unknown."""
    from gradsched.planners.registry import planner_option_specs
    from gradsched.tuning.config import PLANNER_KEYS

    assert set(PLANNER_KEYS) | {"density"} == set(planner_option_specs("auto"))
    for name, option in planner_option_specs("auto").items():
        AutoTuneConfig.from_options({name: option.default})  # each one taken
    cfg = AutoTuneConfig.from_options({"hierarchical": "never", "channels": "2"})
    assert cfg.planner_options == {"hierarchical": "never", "channels": 2}
    with pytest.raises(GradschedError, match="hierarchical must be one of auto, never, always"):
        AutoTuneConfig.from_options({"hierarchical": "sometimes"})


def test_hierarchical_always_needs_a_given_cluster_with_a_topology():
    from gradsched.bundled import bundled_cluster
    from gradsched.cluster import Cluster, CollectiveCost

    cfg = AutoTuneConfig.from_options({"hierarchical": "always"})
    with pytest.raises(GradschedError, match="hierarchical=always needs a cluster with a topology"):
        cfg.check_cluster(None)  # run-time auto's own fit has one level
    with pytest.raises(GradschedError, match="topology"):
        cfg.check_cluster(bundled_cluster(world_size=4))
    cfg.check_cluster(Cluster.two_level(CollectiveCost(1e-5, 1e-10), CollectiveCost(1e-4, 1e-9), 2, 2))
    AutoTuneConfig.from_options({"hierarchical": "never"}).check_cluster(None)  # nothing to refuse
    AutoTuneConfig.from_options({"hierarchical": "always", "adaptive": False}).check_cluster(None)  # planned once


# --------------------------------------------------------------------------- the rules, on synthetic records
def _plan(strategy: str, overlap: bool = False, **options):
    from types import SimpleNamespace

    return SimpleNamespace(strategy=strategy, overlap_forward=overlap, options=options)


def _ranked(predicted_s: float, strategy: str, overlap: bool = False):
    from gradsched.planners.auto import Ranked

    return Ranked(predicted_s, strategy, _plan(strategy, overlap))


def test_checks_every_patience_until_the_cap_and_once_more_after_the_last_replan():
    """The schedule the two-rank test saw (switch at 3, patience 4, every check re-plans, cap 2): checks at
    8 and 18, re-plans at 13 and 23, one last check at 28 that may only keep or revert; then none."""
    from gradsched.tuning.rules import capped, next_check, replan_at

    cfg = AutoTuneConfig.from_options({"switch_iteration": 3, "patience": 4, "max_replans": 2, "trials": 1})
    checks, replans_at, replans = [], [], 0
    at = next_check(cfg.switch_iteration, cfg, replans, after_replan=False, on_torch_ddp=False)
    while at is not None and at < 100:
        checks.append(at)
        action, _ = capped(("replan", None), replans, cfg.max_replans)
        if action == "keep":
            at = next_check(at, cfg, replans, after_replan=False, on_torch_ddp=False)
            continue
        replans += 1
        replans_at.append(replan_at(at, cfg))
        at = next_check(replans_at[-1], cfg, replans, after_replan=True, on_torch_ddp=False)
    assert checks == [8, 18, 28] and replans_at == [13, 23] and replans == cfg.max_replans
    assert capped(("revert", "h"), 5, 2) == ("revert", "h")  # past the cap a check may still revert
    assert next_check(8, cfg, 0, after_replan=False, on_torch_ddp=True) is None  # on PyTorch's DDP: no checks


def test_without_a_distributed_optimizer_overlapping_plans_are_not_candidates():
    from gradsched.tuning.rules import runnable

    cands = [_ranked(1.0, "usbyte", overlap=True), _ranked(1.1, "wfbp"), _ranked(1.2, "bytescheduler", overlap=True)]
    assert [r.strategy for r in runnable(cands, has_optimizer=False)] == ["wfbp"]
    assert runnable(cands, has_optimizer=True) == cands
    only_overlapping = [cands[0], cands[2]]
    assert runnable(only_overlapping, has_optimizer=False) == only_overlapping  # nothing else: all stay


def test_trial_candidates_one_per_strategy_the_users_best_plan_and_ddp_without_pytorchs():
    from gradsched.tuning.rules import trial_candidates

    results = [_ranked(1.0, "usbyte"), _ranked(1.01, "usbyte"), _ranked(1.1, "wfbp"), _ranked(1.2, "mgwfbp"),
               _ranked(1.3, "sync")]
    offline = [_ranked(0.9, "bytescheduler"), _ranked(0.95, "dear")]

    def defaults(strategy: str):
        return _ranked(2.0, strategy)

    cfg = AutoTuneConfig.from_options({"trials": 3})
    got = trial_candidates(results, cfg, defaults, offline)
    assert [(r.strategy, r.predicted_s) for r in got] == [("usbyte", 2.0), ("wfbp", 1.1), ("mgwfbp", 1.2),
                                                          ("bytescheduler", 0.9)]
    no_torch = AutoTuneConfig.from_options({"trials": 2, "torch_ddp": False})
    got = trial_candidates(results, no_torch, defaults, None)
    assert [(r.strategy, r.predicted_s) for r in got] == [("usbyte", 2.0), ("wfbp", 1.1), ("ddp", 2.0)]


def test_the_baseline_is_the_latest_pytorch_ddp_at_the_users_size_and_resized_ones_are_the_others():
    from gradsched.tuning.rules import baseline_of, resized_of

    tried = {"start": ("torch-ddp", _plan("torch-ddp", bucket_cap_mb=25.0)),
             "init": ("ddp", _plan("ddp", bucket_cap_mb=25.0)),
             "one": ("torch-ddp", _plan("torch-ddp", bucket_cap_mb=3.0)),
             "planned": ("torch-ddp", _plan("torch-ddp", bucket_cap_mb=25.0)),
             "usb": ("usbyte", _plan("usbyte"))}
    assert baseline_of(tried, 25.0) == "planned"  # deferred: the one planned from the measured profile
    assert baseline_of({k: tried[k] for k in ("init", "usb")}, 25.0) == "init"  # DDP's buckets on the executor
    assert baseline_of({"usb": tried["usb"]}, 25.0) is None
    taken = {"one": 1.0, "usb": 1.0, "planned": 1.0}
    assert resized_of(tried, "planned", taken) == {"one"}
    assert resized_of(tried, "init", taken) == set()  # the executor's DDP buckets: no resized PyTorch DDP


def test_the_next_window_a_rest_first_when_the_budget_needs_one_a_runoff_when_the_rounds_were_close():
    from gradsched.tuning.rules import next_window

    cfg = AutoTuneConfig.from_options({"runoff_rounds": 2, "runoff_margin": 0.05})
    # a candidate next: its window, or first a rest of the baseline as long as the budget says (at least a window)
    got = next_window(["a", "base", "b"], "base", {}, False, cfg, 4, lambda: 0)
    assert (got["kind"], got["plan"], got["iterations"], got["turns"]) == ("window", "a", 4, ["base", "b"])
    got = next_window(["a", "base", "b"], "base", {}, False, cfg, 4, lambda: 2)
    assert (got["kind"], got["plan"], got["iterations"], got["turns"]) == ("rest", "base", 4, ["a", "base", "b"])
    assert next_window(["a"], "base", {}, False, cfg, 4, lambda: 50)["iterations"] == 50
    # the baseline next: no rest asked for (it is what a rest runs)
    assert next_window(["base", "a"], "base", {}, False, cfg, 4, lambda: 1 / 0)["plan"] == "base"
    # only the baseline left, the rounds close: a run-off, the baseline first, runoff_rounds turns each
    close = {"base": 1.0, "a": 0.98, "b": 1.5}
    got = next_window(["base"], "base", close, False, cfg, 4, lambda: 0)
    assert got["runoff"] == ["base", "a"] and (got["plan"], got["turns"]) == ("base", ["a", "base", "a"])
    # ... not twice, and nothing close: the end (the caller decides what stays)
    assert next_window(["base"], "base", close, True, cfg, 4, lambda: 0)["kind"] == "end"
    assert next_window([], "base", {"base": 1.0, "b": 1.5}, False, cfg, 4, lambda: 0)["kind"] == "end"


# --------------------------------------------------------------------------- switches priced in the budget
def test_profiling_is_priced_with_its_two_switches():
    from gradsched.calibration.budget import SWITCH_ITERATIONS
    from gradsched.tuning.schedule import PROFILE_SLOWDOWN

    # onto the executor and back to the baseline: SWITCH_ITERATIONS baseline iterations each
    assert profiling_cost_s(0.1, 5, 0.25) == pytest.approx(5 * 0.1 * PROFILE_SLOWDOWN + 0.25 + 2 * SWITCH_ITERATIONS * 0.1)


def test_a_switch_back_to_the_baseline_is_spent_never_a_credit():
    from gradsched.calibration import TrialBudget

    budget = TrialBudget(0.01, start_s=0.0)
    assert budget.count_switch(0.13 + 0.18, 2, 0.03) == pytest.approx(0.25)  # DDP's first iterations after mgwfbp
    assert budget.count_switch(0.02 + 0.03, 2, 0.03) == 0  # faster: no credit
    assert budget.spent_s(0.03) == pytest.approx(0.25)


def test_a_window_is_expected_to_cost_what_the_windows_cost_their_warm_up_and_switch_back_included():
    from gradsched.calibration import TrialBudget
    from gradsched.calibration.budget import FIRST_SLOWDOWN, SWITCH_ITERATIONS

    base_s, n = 0.03, 9
    budget = TrialBudget(0.01, start_s=0.0)
    # before any: the first slowdown, a switch in and a switch back
    assert budget.window_cost_s(base_s, n) == pytest.approx(n * base_s * FIRST_SLOWDOWN
                                                           + 2 * SWITCH_ITERATIONS * base_s)
    # mgwfbp's window: 0.99 + 0.60 + 0.34 s in its first three iterations, then at the baseline's pace
    budget.windows.append((0.99 + 0.60 + 0.34 + (n - 3) * base_s, n))
    budget.count_switch(0.13 + 0.18, 2, base_s)
    # the next is expected to cost as much (a median of per-iteration slowdowns said 0.2 of the baseline)
    assert budget.window_cost_s(base_s, n) == pytest.approx(0.99 + 0.60 + 0.34 - 3 * base_s + 0.25)
    spent, expected = budget.spent_s(base_s), budget.window_cost_s(base_s, n)
    rest = budget.rest_before(100.0, base_s, n)  # 100 s trained: a window of ~2.2 s more fits only later
    assert (spent + expected) / 0.01 == pytest.approx(100.0 + (rest + n) * base_s, abs=base_s)


@given(share=st.floats(0.002, 0.2), base_s=st.floats(1e-3, 1), warm_up=st.floats(0, 20), slow=st.floats(0, 2),
       back=st.floats(0, 10), before=st.floats(0, 50), n=st.integers(2, 64))
def test_the_trials_cost_stays_within_the_share_of_the_time_trained_at_every_point(share, base_s, warm_up, slow,
                                                                                   back, before, n):
    """Windows whose first iteration costs ``warm_up`` baseline iterations more and the rest ``slow`` more, each
    followed by a switch back costing ``back`` iterations: once one window is measured, each later one starts
    only where it and its switch back fit, so at every window's end and every switch back the cost so far is
    within ``share`` of the time trained (the first window is an estimate: up to its error more)."""
    from gradsched.calibration import TrialBudget

    profiling_s = before * base_s  # profiling's extra time, started where it fitted
    now = profiling_s / share
    budget = TrialBudget(share, start_s=0.0, before_s=profiling_s, before_iterations=0)
    window_s = n * base_s * (1 + slow) + warm_up * base_s
    for k in range(4):
        rest = budget.rest_before(now, base_s, n)
        now += rest * base_s + window_s
        budget.windows.append((window_s, n))
        error = 0.0 if k else window_s + back * base_s  # the first window's cost was a prior's guess
        assert budget.spent_s(base_s) <= share * now * (1 + 1e-9) + error + 1e-9
        now += 2 * base_s + back * base_s
        budget.count_switch(base_s * (2 + back), 2, base_s)
        assert budget.spent_s(base_s) <= share * now * (1 + 1e-9) + error + 1e-9


# --------------------------------------------------------------------------- what each plan measured
def test_a_plans_measurement_is_the_median_of_its_latest_samples_and_forgotten_before_its_turns():
    from gradsched.tuning import PlanMeasurements

    m = PlanMeasurements(kept=3)
    m.record("a", [5.0, 1.0])
    m.record("a", [2.0, 3.0])  # the oldest (5.0) falls out
    assert m.samples["a"] == [1.0, 2.0, 3.0] and m.measured["a"] == 2.0
    m.record("b", [])
    assert m.taken(["a", "b", "c"]) == {"a": 2.0}  # nothing measured: not taken
    m.add_round("a", 2.0)
    m.forget("a")
    assert m.taken(["a"]) == {} and m.rounds_of(["a"]) == {"a": []}


def test_a_candidates_windows_win_or_lose_against_the_baselines_window_before_each():
    from gradsched.tuning import PlanMeasurements

    m = PlanMeasurements()
    m.add_round("base", 1.0)  # the baseline's own windows are not paired
    m.add_round("a", 0.9, baseline_s=1.0)
    m.add_round("a", 1.1, baseline_s=1.05)
    assert m.wins("a") == [True, False] and m.wins("base") == [] and "base" not in m.paired
    rounds = m.rounds_of(["a"])
    rounds["a"].append(0.0)  # a copy: the record is unchanged
    assert m.rounds["a"] == [0.9, 1.1]


def test_a_revert_goes_to_the_plan_that_measured_fastest_in_the_trials_not_one_a_slow_window_made_look_faster():
    """The trials keep ``winner`` (faster than ``other`` taking turns with it); after them only the plan running
    adds iterations, in whatever phase the machine is in.  One slow window of the winner, then a re-plan's plan
    that does not beat what the trials measured: the revert goes back to the winner, whose trial windows
    still say it is faster; ``other``, measured in the trials only, is not favoured by the winner's bad luck
    (as on the testbed: benchmarks/results/bench_replay_googlenet_k80_2h_dear.json)."""
    from gradsched.calibration import decide
    from gradsched.tuning import PlanMeasurements

    m = PlanMeasurements()
    for winner_s, other_s in [(0.62, 0.64), (0.64, 0.69), (0.65, 0.70)]:  # three rounds of four iterations each
        m.record("winner", [winner_s] * 4)
        m.record("other", [other_s] * 4)
    m.settle()  # the trials are decided
    m.record("winner", [0.86] * 16)  # slow windows after the trials (a check's, then the re-plan's)
    m.record("replanned", [0.75] * 10)  # the re-plan's plan, checked in the same slow phase
    assert m.measured["winner"] > m.measured["other"]  # all the winner ran, slow phase included
    assert m.compared() == {"winner": 0.64, "other": 0.69, "replanned": 0.75}
    assert decide("replanned", 0.75, 0.64, m.compared(), 0.15, must_gain=0.03) == ("revert", "winner")
    # a plan that ran in the trials is judged by them at a check too: one slow window re-plans, it does not revert
    assert decide("winner", 0.86, 0.64, m.compared(), 0.15) == ("replan", None)


def test_capped_candidates_shorten_the_schedule_and_one_is_refused():
    """``candidates``: the trials' windows are scheduled for at most that many plans (a replay's short warm-up)."""
    full = AutoTuneConfig.from_options({"trial_share": 0})
    capped = AutoTuneConfig.from_options({"trial_share": 0, "candidates": 5})
    per_window = full.trial_rounds * (full.trial_window + 1)
    assert full.tuning_iterations - capped.tuning_iterations == 4 * per_window  # 9 candidates scheduled, then 5
    assert AutoTuneConfig.from_options({"candidates": 20}).tuning_iterations == AutoTuneConfig().tuning_iterations
    with pytest.raises(GradschedError, match="candidates must be 0"):
        AutoTuneConfig.from_options({"candidates": 1})


def test_a_drift_the_control_plan_shares_is_the_machines_one_it_does_not_is_the_plans():
    """runs12's ResNet-50: a check measured 227 ms against 175 expected (x1.30) while other work loaded the machine.
    A control plan off its own measurement alike (x1.2-1.45: within 15%) makes it the machine's; one that ran as
    measured (x1.0) makes it the plan's own."""
    from gradsched.tuning.rules import shared_drift

    assert shared_drift(0.227, 0.175, 0.240, 0.200, 0.15)  # x1.30 against x1.20
    assert shared_drift(0.227, 0.175, 0.290, 0.200, 0.15)  # x1.30 against x1.45
    assert not shared_drift(0.227, 0.175, 0.200, 0.200, 0.15)  # the control ran as before: the plan's own
    assert not shared_drift(0.227, 0.175, 0.320, 0.200, 0.15)  # the control slowed far more: not alike either
    assert not shared_drift(0.227, 0.175, 0.200, 0.0, 0.15)  # nothing to compare the control with


def test_the_control_is_the_fastest_other_plan_the_trials_measured_on_gradscheds_executor():
    from gradsched.tuning.rules import control_of

    tried = {"cur": ("usbyte", _plan("usbyte")), "wf": ("wfbp", _plan("wfbp")), "bs": ("bytescheduler", _plan("bs")),
             "torch": ("torch-ddp", _plan("torch-ddp", bucket_cap_mb=25.0))}
    settled = {"cur": 0.17, "wf": 0.21, "bs": 0.19, "torch": 0.18}  # what each measured in the trials' turns
    assert control_of(settled, "cur", tried) == "bs"  # PyTorch's DDP (released once the trials end) is not one
    assert control_of({"cur": 0.17, "torch": 0.18}, "cur", tried) is None
    assert control_of({}, "cur", tried) is None  # no trials: none
