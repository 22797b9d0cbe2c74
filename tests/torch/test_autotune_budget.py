"""Run-time auto's trials within a budget (issue 38, item 3): cheap where PyTorch's DDP is clearly best.

The rules are plain functions (:mod:`gradsched.calibration.budget`), tested on numbers; the
tuner is tested on one rank in this process with the clock injected as in
``test_autotune_torch_ddp.py`` (an iteration under a plan the test calls slow takes that much
longer on the tracer's clock), so which plan wins, and what the trials cost, is deterministic.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradsched.calibration import TrialBudget, fastest, out_of_the_running
from gradsched.calibration.budget import MAX_REST, MIN_SLOWDOWN, SWITCH_ITERATIONS
from gradsched.errors import GradschedError

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.torch import DistributedDataParallel  # noqa: E402
from gradsched.torch.runtime.autotune import (PREDICTED_FAR_SLOWER, AutoTuneConfig, not_clearly_slower,  # noqa: E402
                                               trial_options)
from gradsched.torch.runtime.torch_ddp import TORCH_DDP, is_torch_ddp  # noqa: E402

from tests.torch.test_autotune_torch_ddp import _inputs, _net, _train, delay  # noqa: E402

BUDGETED = {"switch_iteration": 3, "trials": 2, "trial_iterations": 2, "trial_rounds": 2, "trial_window_s": 0,
            "min_gain": 0, "max_replans": 0, "runoff_rounds": 0,
            "defer": False}  # profiling from iteration 0 (the deferred start: the tests at the end)


# --------------------------------------------------------------------------- the rules, on numbers
def test_the_cost_is_time_beyond_the_baseline_never_a_credit():
    budget = TrialBudget(0.1, start_s=0.0, before_s=1.0, before_iterations=5, windows=[(1.2, 10), (0.9, 10)])
    assert budget.spent_s(0.1) == pytest.approx((1.0 - 0.5) + (1.2 - 1.0))  # the faster window counts 0
    assert TrialBudget(0.1, start_s=0.0, before_s=0.1, before_iterations=5).spent_s(0.1) == 0
    # the next window's expected cost: the mean of what they cost (+0.2 s, 0), at least MIN_SLOWDOWN, and a switch
    # back of SWITCH_ITERATIONS baseline iterations before one was measured
    assert budget.window_cost_s(0.1, 10) == pytest.approx(max(0.1, 10 * 0.1 * MIN_SLOWDOWN) + SWITCH_ITERATIONS * 0.1)


@given(share=st.floats(0.005, 0.5), before_s=st.floats(0, 10), base_s=st.floats(1e-3, 1), now_s=st.floats(0, 100),
       window=st.integers(1, 64), slow=st.floats(0, 3))
def test_a_rest_is_exactly_as_long_as_the_budget_needs(share, before_s, base_s, now_s, window, slow):
    """After the rest the next window fits (its expected cost included); two iterations less (one: rounding)
    and it would not."""
    budget = TrialBudget(share, start_s=0.0, before_s=before_s, before_iterations=2,
                         windows=[(window * base_s * (1 + slow), window)])
    rest = budget.rest_before(now_s, base_s, window)
    expected = budget.window_cost_s(base_s, window)

    def fits(n: int) -> bool:
        return budget.spent_s(base_s) + expected <= share * (now_s + (n + window) * base_s) * (1 + 1e-9) + 1e-12

    assert 0 <= rest <= MAX_REST and (fits(rest) or rest == MAX_REST)
    assert rest <= 1 or not fits(rest - 2)


def test_a_plan_is_out_once_it_cannot_win_most_rounds():
    assert not out_of_the_running([True], 3, resized=False)
    assert not out_of_the_running([True, False], 3, resized=False)  # one round lost: 2 of 3 may still be won
    assert out_of_the_running([False, False], 3, resized=False)
    assert not out_of_the_running([False], 3, resized=True)  # 2 of the 3 may still be won
    assert out_of_the_running([False, False], 3, resized=True)
    assert out_of_the_running([False], 2, resized=True)  # 1 of 2 is no majority


def test_fastest_compares_each_window_with_the_baselines_window_before_it():
    measured = {"base": 1.0, "x": 0.8}
    rounds = {"base": [1.0, 0.5], "x": [0.8, 0.8]}  # round by round x lost the second
    assert fastest(measured, "base", 0.03, rounds) == "base"
    # paired with the baseline's window just before each of its own (1.0 and 0.9): x won both
    assert fastest(measured, "base", 0.03, rounds, paired={"x": [1.0, 0.9]}) == "x"


def test_candidates_predicted_clearly_slower_are_not_tried_ddps_buckets_are():
    from gradsched.planners.auto import Ranked

    best = Ranked(1.0, "usbyte", None)
    trials = [Ranked(1.1, "wfbp", None), Ranked(1.5, "sync", None), Ranked(2.0, TORCH_DDP, None),
              Ranked(3.0, "ddp", None)]
    assert [r.strategy for r in not_clearly_slower(best, trials)] == ["wfbp", TORCH_DDP, "ddp"]
    # back to back (no budget) only a plan predicted at twice the fastest or more is left out
    far = trials + [Ranked(2.1, "usbyte", None)]
    assert [r.strategy for r in not_clearly_slower(best, far, PREDICTED_FAR_SLOWER)] == ["wfbp", "sync", TORCH_DDP,
                                                                                        "ddp"]


def test_trials_off_is_no_trials_and_no_replans_unless_asked():
    off = AutoTuneConfig.from_options({"trials": "off"})
    assert off.trials == 0 and off.max_replans == 0
    assert AutoTuneConfig.from_options({"trials": "OFF", "max_replans": 2}).max_replans == 2
    assert AutoTuneConfig.from_options({"trials": False}).trials == 0
    assert AutoTuneConfig.from_options({"trials": "4"}).trials == 4
    with pytest.raises(GradschedError, match="off"):
        AutoTuneConfig.from_options({"trials": "sometimes"})


# --------------------------------------------------------------------------- the tuner, one rank
MAX_STEPS = 300


def _budgeted(slow_s, options: dict):
    """Auto with the budgeted trials, trained until they are decided; ``slow_s(plan, tuner)``: what an
    iteration under ``plan`` takes more on the tracer's clock."""
    model = DistributedDataParallel(_net(), "auto", plan_options={**BUDGETED, **options}, bucket_cap_mb=0.01)
    delay(model, lambda plan: slow_s(plan, model.autotuner))
    for _ in range(MAX_STEPS // 10):
        _train(model, 0, 1, 10)
        if model.autotuner.trials_done:
            break
    assert model.autotuner.trials_done
    return model


def _profiling(tuner) -> bool:
    return tuner.iteration <= tuner.config.switch_iteration


def test_when_pytorch_ddp_wins_every_window_the_trials_end_after_one_round(world_of_one):
    # every iteration 0.5 s, 1 s under a plan other than PyTorch's DDP: the trials fit a share of 0.99 without rests
    model = _budgeted(lambda plan, t: 0.5 if is_torch_ddp(plan) or _profiling(t) else 1.0, {"trial_share": 0.99})
    tuner = model.autotuner
    trials = [s for s in tuner.switches if s.reason in ("profiled", "trial")]
    base = tuner.trial_decision["baseline"]
    assert trials[0].plan_hash == base and trials[0].reason == "profiled"  # the baseline runs first
    # each plan other than PyTorch's DDP ran one window, lost it and was dropped: no second round (DDP at other
    # bucket sizes runs as fast as the baseline here: it may win a round by chance, and take another)
    others = [s.plan_hash for s in trials if not is_torch_ddp(tuner._tried[s.plan_hash][1])]
    assert len(others) == len(set(others)) >= 2 and set(others) <= set(tuner.trial_decision["dropped"])
    # PyTorch's DDP stays (at the user's bucket size, or another that measured as fast: they differ in noise here)
    assert is_torch_ddp(model.plan) and model.plan.hash == tuner.trial_decision["kept"] and tuner.done
    fixed = AutoTuneConfig.from_options({**BUDGETED, "trial_share": 0}).tuning_iterations_for(tuner.trial_window)
    assert tuner.settled_at is not None and tuner.settled_at < fixed  # sooner than every round back to back
    assert tuner.summary()["settled_at"] == tuner.settled_at


def test_a_candidate_window_waits_until_the_trials_fit_their_share(world_of_one):
    """Profiling cost ~27 s more than 3 baseline iterations of ~1 s: at a share of 0.5 the first other
    candidate waits until about 54 s have passed, a rest of the baseline in between."""
    def slow_s(plan, tuner) -> float:
        return 1.0 if is_torch_ddp(plan) and not _profiling(tuner) else 10.0

    model = _budgeted(slow_s, {"trial_share": 0.5})
    tuner = model.autotuner
    sw = [s for s in tuner.switches if s.reason in ("profiled", "trial")]
    assert is_torch_ddp(tuner._tried[sw[0].plan_hash][1])
    first_other = next(s for s in sw if not is_torch_ddp(tuner._tried[s.plan_hash][1]))
    waited = first_other.iteration - sw[0].iteration  # the baseline's window, then its rest
    assert waited > 2 * (tuner.trial_window + 1)
    # what the trials cost stays within the share of the time trained, but for the last window's own cost
    spent, elapsed = tuner.trial_decision["cost_s"], tuner._tracer.now() - tuner._start_s
    base_s = tuner.trial_decision["measured"][tuner.trial_decision["baseline"]]
    assert spent <= 0.5 * elapsed + (tuner.trial_window + 1) * (10.0 + base_s)
    assert is_torch_ddp(model.plan)  # PyTorch's DDP stays (at the user's bucket size or another as fast)


def test_the_trial_record_keeps_each_plans_planner_options(world_of_one):
    """Each measured plan's options in the record beside its label: two candidates of one strategy (grouped and
    ungrouped ``usbyte``) share a label, and are told apart by these."""
    model = _budgeted(lambda plan, t: 0.5 if is_torch_ddp(plan) or _profiling(t) else 1.0, {"trial_share": 0.99})
    tuner = model.autotuner
    decision = tuner.trial_decision
    assert set(decision["options"]) == set(decision["measured"]) == set(decision["plans"])
    for h, options in decision["options"].items():
        plan = tuner._tried[h][1]
        assert options == trial_options(plan) and "chose" not in options and "predicted_iteration_s" not in options
        if is_torch_ddp(plan):
            assert options["bucket_cap_mb"] == plan.options["bucket_cap_mb"]
    labels = [decision["plans"][h] for h in decision["options"]]
    for label in set(labels):  # the same label, different plans: their options differ
        same = [json.dumps(decision["options"][h], sort_keys=True) for h in decision["options"]
                if decision["plans"][h] == label]
        assert len(same) == len(set(same))
    assert tuner.summary()["trial_decision"]["options"] == decision["options"]
    # what each was planned on, and its operations: the plan profiling ran (not deferred: the first) at start-up, the
    # others on the measured profile (no profile given)
    assert set(decision["planned_on"]) == set(decision["operations"]) == set(decision["measured"])
    for h, on in decision["planned_on"].items():
        assert on == ("start-up" if h == tuner.switches[0].plan_hash else "measured")
        assert decision["operations"][h] == len(tuner._tried[h][1].operations)


def test_planned_on_keeps_a_plans_first_origin():
    """The chosen plan and the trials in the order they join the turns: a plan reached again (one of the given
    profile's best plans that the measured profile planned too) is measured once, under its first origin."""
    from gradsched.torch.runtime.autotune import planned_on

    assert planned_on("a", [("b", False), ("c", True), ("a", True), ("c", False)]) == {
        "a": "measured", "b": "measured", "c": "given"}
    assert planned_on("a", []) == {"a": "measured"}


def test_trial_options_are_the_planners_own_and_an_auto_plans_chosen_ones():
    from gradsched.cluster import Cluster
    from gradsched.costs import CollectiveCost
    from gradsched.planners import make_plan
    from gradsched.planners.auto import Ranked, as_auto
    from gradsched.profile import Profile, TensorProfile

    profile = Profile("m", tuple(TensorProfile(f"t{i}", 1000 * (i + 1), 4000 * (i + 1), 1e-3, 2e-3)
                                 for i in range(6)))
    cluster = Cluster(4, {"allreduce": CollectiveCost(1e-4, 1e-9)})
    grouped = make_plan("usbyte", profile, cluster, groups=0)
    units = make_plan("usbyte", profile, cluster, unit_bytes=8192)
    assert trial_options(grouped) == grouped.options and trial_options(grouped)["groups"] == 0
    assert trial_options(grouped) != trial_options(units)
    chosen = as_auto(Ranked(0.1, "usbyte", grouped), tried=3)
    assert trial_options(chosen) == grouped.options  # not auto's record of its choice


def test_a_clearly_faster_plan_is_still_found_and_kept(world_of_one):
    def slow_s(plan, tuner) -> float:
        return 0.5 if is_torch_ddp(plan) or plan.strategy == "wfbp" else 0.0

    model = _budgeted(slow_s, {"trial_share": 0.99})
    tuner = model.autotuner
    kept = tuner.trial_decision["kept"]
    assert kept != tuner.trial_decision["baseline"] and not is_torch_ddp(model.plan) and model.plan.hash == kept
    assert len(tuner.trial_decision["rounds"][kept]) == BUDGETED["trial_rounds"]  # it won every round
    assert tuner.settled_at is not None


def test_trials_off_plans_once_and_settles_at_the_switch(world_of_one):
    model = DistributedDataParallel(_net(), "auto", plan_options={"switch_iteration": 3, "trials": "off"})
    _train(model, 0, 1, 8)
    tuner = model.autotuner
    assert [s.reason for s in tuner.switches] == ["initial", "profiled"]
    assert tuner.settled_at == 3 and tuner.done and tuner.trial_decision is None


# --------------------------------------------------------------------------- deferred: on DDP until profiling pays
DEFERRED = {**BUDGETED, "defer": True}


def _deferred(seconds, options: dict, steps: int):
    """Auto deferred (the default's way), ``steps`` iterations; ``seconds(plan)``: what one takes more."""
    model = DistributedDataParallel(_net(), "auto", plan_options={**DEFERRED, **options}, bucket_cap_mb=0.01)
    delay(model, seconds)
    _train(model, 0, 1, steps)
    return model


def test_a_short_job_runs_pytorch_ddp_throughout_and_pays_no_profiling(world_of_one):
    # 1 s an iteration: profiling's expected cost (planning alone 0.25 s) fits 1% only after ~25 s
    model = _deferred(lambda plan: 1.0, {"trial_share": 0.01}, 20)
    tuner = model.autotuner
    base = tuner.switches[0]
    assert [s.reason for s in tuner.switches] == ["initial"] and base.strategy == TORCH_DDP
    plan = tuner._tried[base.plan_hash][1]
    assert is_torch_ddp(model.plan) and plan.options["bucket_cap_mb"] == 0.01  # at the user's bucket size
    assert model._ddp is not None and model._executor is None  # no executor ran, nothing was traced
    assert tuner._probes == [] and tuner._profiled_at is None and tuner.settled_at is None
    assert tuner._profile_from > 20 and not tuner.done  # it is still counting towards profiling
    assert tuner.summary()["profiling_from"] == tuner._profile_from


def test_profiling_starts_once_its_expected_cost_fits_the_share_then_trials_follow(world_of_one):
    from gradsched.tuning.schedule import profiling_cost_s

    share = 0.1
    model = _deferred(lambda plan: 1.0 if is_torch_ddp(plan) else 2.0, {"trial_share": share}, 120)
    tuner = model.autotuner
    profiling = next(s for s in tuner.switches if s.reason == "profiling")
    profiled = next(s for s in tuner.switches if s.reason == "profiled")
    start, n = profiling.iteration, tuner.config.switch_iteration
    assert profiled.iteration == start + n and tuner._profiled_at == profiled.iteration
    assert tuner._tried[profiling.plan_hash][0] == "wfbp"  # the initial plan profiles, on the executor
    # the baseline's iterations took ~1 s: at `start` profiling fitted the share of the time trained by its end,
    # an iteration earlier it would not have
    cost = profiling_cost_s(1.0, n)
    assert cost <= share * (start + n) * 1.01 and cost > share * (start - 1 + n) * 0.99
    # what it really cost counts against the trials: only its own iterations, not the baseline's before it
    assert tuner._budget.before_iterations == n
    for _ in range(MAX_STEPS // 10):
        if tuner.trials_done:
            break
        _train(model, 0, 1, 10)
    assert tuner.trials_done and is_torch_ddp(model.plan) and tuner.settled_at is not None


def test_the_baseline_builds_no_executor_until_profiling_starts(world_of_one, monkeypatch):
    """Deferred, PyTorch's DDP alone runs the baseline: gradsched's executor (its hooks, buckets and threads) is
    built at the iteration profiling starts, not at wrapping (where it was built and closed at once)."""
    import gradsched.torch.runtime.wrapper as wrapper_module

    built: list[int] = []  # the tuner's iteration count at each executor's construction

    class Counted(wrapper_module.Executor):  # type: ignore[misc,name-defined]
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(tuner.iteration if tuner is not None else -1)

    monkeypatch.setattr(wrapper_module, "Executor", Counted)
    tuner = None
    model = DistributedDataParallel(_net(), "auto", plan_options={**DEFERRED, "trial_share": 0.1}, bucket_cap_mb=0.01)
    assert built == [] and model._executor is None and is_torch_ddp(model.plan)
    tuner = model.autotuner
    assert tuner.before_profiling
    delay(model, lambda plan: 1.0 if is_torch_ddp(plan) else 2.0)
    _train(model, 0, 1, 120)
    profiling = next(s for s in tuner.switches if s.reason == "profiling")
    assert profiling.iteration > 3 and not tuner.before_profiling
    assert built[0] == profiling.iteration + 1  # built in that iteration's start (the count already moved on)


def test_deferred_is_the_default_only_where_trials_are_budgeted_with_pytorch_ddp():
    assert AutoTuneConfig.from_options({}).deferred
    for off in ({"defer": "false"}, {"trials": "off"}, {"trials": 1}, {"trial_share": 0}, {"torch_ddp": False}):
        assert not AutoTuneConfig.from_options(off).deferred, off
    with pytest.raises(GradschedError, match="defer"):
        AutoTuneConfig.from_options({"defer": "maybe"})


def test_a_baseline_window_in_a_slow_phase_does_not_make_the_candidates_windows_free(world_of_one):
    """The baseline ran 1 s an iteration for the whole rest before profiling but 3 s in its trial windows (a slow
    phase of the machine), the candidates 2 s: counted against 3 s they would cost nothing and run back to back;
    counted against the rest's 1 s, what the trials cost stays within the share but for one window."""
    share = 0.1

    def seconds(plan) -> float:
        tuner = model.autotuner
        if is_torch_ddp(plan):
            return 1.0 if tuner._profiled_at is None else 3.0
        return 2.0

    model = DistributedDataParallel(_net(), "auto", plan_options={**DEFERRED, "trial_share": share},
                                    bucket_cap_mb=0.01)
    delay(model, seconds)
    tuner = model.autotuner
    for _ in range(MAX_STEPS // 10):
        _train(model, 0, 1, 10)
        if tuner.trials_done:
            break
    budget, window = tuner._budget, tuner.trial_window + 1
    assert budget is not None and len(budget.windows) >= 2 and tuner._rest_s == pytest.approx(1.0, abs=0.2)
    elapsed = tuner._tracer.now() - tuner._start_s
    assert budget.spent_s(1.0) <= share * elapsed + window * 2.0


def test_the_baseline_started_on_takes_its_turns_when_planned_again_with_the_same_buckets(world_of_one):
    """mlp in one bucket: PyTorch's DDP planned from the measured profile is the very plan the job started on;
    it runs first in the trials, is measured there as the baseline, and stays where the others are slower."""
    from gradsched.torch.jobs.models import build_model

    module = build_model("mlp", seed=0).module
    model = DistributedDataParallel(module, "auto", plan_options={**DEFERRED, "trial_share": 0.5})
    delay(model, lambda plan: 1.0 if is_torch_ddp(plan) else 2.0)
    tuner = model.autotuner
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(MAX_STEPS):
        opt.zero_grad()
        model(torch.randn(4, 64)).square().mean().backward()
        opt.step()
        if tuner.trials_done:
            break
    start = tuner.switches[0].plan_hash
    profiled = next(s for s in tuner.switches if s.reason == "profiled")
    decision = tuner.trial_decision
    assert decision["baseline"] == start and profiled.plan_hash == start  # the same buckets, one plan
    assert start in decision["measured"] and decision["kept"] == start and model.plan.hash == start
    assert tuner._tried[start][3] is not None  # planned again: now with a prediction


def test_a_switch_back_to_the_baseline_is_counted_against_the_trials(world_of_one):
    """Every switch costs 3 s more in the first iteration of the plan switched to (a warm-up; the baseline's steady
    iterations 1 s): the baseline's first iterations after a candidate are counted as spent, and the trials stay
    within the share of the time trained, but for one window and its switches."""
    share, last = 0.1, {"hash": None}

    def seconds(plan) -> float:
        warm_up = 3.0 if last["hash"] not in (None, plan.hash) else 0.0
        last["hash"] = plan.hash
        return (1.0 if is_torch_ddp(plan) else 1.2) + warm_up

    model = DistributedDataParallel(_net(), "auto", plan_options={**DEFERRED, "trial_share": share},
                                    bucket_cap_mb=0.01)
    delay(model, seconds)
    tuner = model.autotuner
    for _ in range(MAX_STEPS // 5):
        _train(model, 0, 1, 10)
        if tuner.trials_done:
            break
    budget = tuner._budget
    assert tuner.trials_done and budget is not None and budget.windows
    # back from profiling and from each candidate's window: 3 s each, beyond the baseline's iterations
    assert len(budget.switches) >= len(budget.windows) and budget.switches[0] == pytest.approx(3.0, abs=0.3)
    assert tuner.trial_decision["switches_s"] == budget.switches
    elapsed = tuner._tracer.now() - tuner._start_s
    window = (tuner.trial_window + 1) * 1.2 + 2 * 3.0
    assert budget.spent_s(1.0) <= share * elapsed + window


def _gradsched_calls(step: Callable[[], None]) -> tuple[set[tuple[str, str]], set[str]]:
    """(file, function) of every gradsched function ``step`` calls, and the names of the builtins it calls."""
    import os
    import sys

    import gradsched

    root = os.path.dirname(gradsched.__file__)
    calls: set[tuple[str, str]] = set()
    builtins: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls.add((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
        elif event == "c_call":
            builtins.add(getattr(arg, "__name__", ""))

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls, builtins


def test_a_deferred_step_is_a_thin_pass_through_to_pytorch_ddp(world_of_one):
    """Deferred on the baseline, a step is PyTorch's DDP behind a counter, the tuner's clock and one re-arm hook:
    none of the full forward's bookkeeping (its dynamo-guarded halves, a pytree walk of the output), and no
    end-of-backward callback (a backward is told from the next by autograd's graph-task id)."""
    model = DistributedDataParallel(_net(), plan_options={**DEFERRED, "trial_share": 1e-9})
    tuner = model.autotuner
    _train(model, 0, 1, 8)  # past the iteration at which profiling is scheduled (never, at this share)
    assert tuner.before_profiling and model._executor is None
    x = _inputs(8, torch.Generator().manual_seed(0))[0]

    def step() -> None:
        model(x).square().mean().backward()

    before = tuner.iteration
    calls, builtins = _gradsched_calls(step)
    assert tuner.iteration == before + 1  # the iteration boundary is still counted
    assert {f for file, f in calls if file == "wrapper.py"} == {"forward", "_baseline_forward", "_compiling"}
    assert {f for file, f in calls if file == "torch_ddp.py"} == {"reduce_every_backward", "before"}
    assert "queue_callback" not in builtins and "tree_leaves" not in {f for _, f in calls}


def test_the_re_arm_hook_counts_backwards_not_outputs(world_of_one, monkeypatch):
    """A forward with two outputs, three backward() through both: the reducer is re-armed once for each backward
    after the first (never for the first, which DDP's forward armed, nor once per output)."""
    import gradsched.torch.runtime.torch_ddp as torch_ddp

    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1), nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.body(x)
            return self.a(h), self.b(h)

    armed: list[int] = []
    real = torch_ddp._rearm
    monkeypatch.setattr(torch_ddp, "_rearm", lambda *a: (armed.append(1), real(*a))[1])
    model = DistributedDataParallel(TwoHeads(), plan_options={**DEFERRED, "trial_share": 1e-9})
    assert model.autotuner.before_profiling
    a, b = model(torch.randn(4, 8))
    for k in range(3):
        (a.sum() + b.sum()).backward(retain_graph=k < 2)
        assert len(armed) == k
