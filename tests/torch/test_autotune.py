"""strategy="auto" at run time: profile in situ, switch on every rank at once, re-plan; DDP's numbers throughout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch.runtime.autotune import MAX_TRIAL_WINDOW, AutoTuneConfig  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from helpers import params_of, train  # noqa: E402

TOLERANCE = 1e-5
STEPS = 30


# --------------------------------------------------------------------------- options (no processes)
def test_options_split_between_tuner_and_planner():
    cfg = AutoTuneConfig.from_options({"switch_iteration": 3, "patience": 4, "exclude": "sync", "channels": 1})
    assert (cfg.switch_iteration, cfg.patience) == (3, 4)
    assert cfg.planner_options == {"exclude": ("sync",), "channels": 1}
    assert AutoTuneConfig.from_options(None).initial == "wfbp"
    static = AutoTuneConfig.from_options({"adaptive": False, "density": 0.01})  # planned once: sparse allowed
    assert static.planner_options == {"density": 0.01}
    implied = AutoTuneConfig.from_options({"density": 0.01})  # a density below 1 implies planning once
    assert implied.planner_options == {"density": 0.01} and not implied.adaptive


def test_trial_windows_split_each_plans_iterations_over_the_rounds():
    cfg = AutoTuneConfig.from_options({"trial_iterations": 10, "trial_rounds": 3})
    assert cfg.trial_window == 4  # rounded up: no plan measured less than asked
    one = AutoTuneConfig.from_options({"trial_iterations": 10, "trial_rounds": 1})
    assert one.trial_window == 10


def test_trial_windows_last_trial_window_s_where_iterations_are_short():
    cfg = AutoTuneConfig.from_options({"trial_iterations": 12, "trial_rounds": 3, "trial_window_s": 0.3})
    assert cfg.window_for(1.0) == cfg.window_for(0.075) == 4  # long iterations: trial_iterations decide
    assert cfg.window_for(0.03) == 10 and cfg.window_for(1e-4) == MAX_TRIAL_WINDOW  # short ones: the time
    assert cfg.window_for(0.0) == 4  # nothing measured: the iterations asked for
    off = AutoTuneConfig.from_options({"trial_window_s": 0})
    assert off.window_for(1e-4) == off.trial_window
    assert cfg.tuning_iterations_for(10) > cfg.tuning_iterations == cfg.tuning_iterations_for(4)


@pytest.mark.parametrize("options, words", [
    ({"switch_iterations": 3}, "unknown option"),
    ({"density": 0.01, "adaptive": True}, "drop adaptive=true"),
    ({"switch_iteration": 1}, "switch_iteration"),
    ({"initial": "auto"}, "concrete"),
    ({"initial": "nope"}, "unknown strategy"),
    ({"replan_threshold": 0}, "replan_threshold"),
    ({"patience": 0}, "patience"),
    ({"trial_rounds": 0}, "trial_rounds"),
    ({"trial_window_s": -1}, "trial_window_s"),
    ({"runoff_rounds": -1}, "runoff_rounds"),
    ({"runoff_margin": 1.5}, "runoff_margin"),
    ({"resize_min_gain": True}, "resize_min_gain"),
    ({"trial_window_s": float("inf")}, "trial_window_s"),
])
def test_bad_options_say_what_is_wrong(options, words):
    with pytest.raises(GradschedError, match=words):
        AutoTuneConfig.from_options(options)


# --------------------------------------------------------------------------- 2 gloo ranks
def test_auto_plans_with_the_measured_cluster_when_given_for_its_world_size():
    """The user's measured cluster (netbench's table, every size timed in a stream; its two levels too)
    wins over the in-situ line; one measured for another world size does not apply."""
    from types import SimpleNamespace

    from gradsched.cluster import Cluster, CollectiveCost
    from gradsched.torch.runtime.autotune import AutoTuner

    measured = Cluster.two_level(CollectiveCost(3e-5, 1e-10), CollectiveCost(1e-4, 1e-9), 2, 2)
    tuner = SimpleNamespace(_offline=(None, measured), _model=SimpleNamespace(world=4))
    assert AutoTuner._fit(tuner, [], [], None) is measured
    earlier = Cluster.alpha_beta(2e-4, 2e-9, world_size=8)  # no events, no probes: the previous fit stays
    other = SimpleNamespace(_offline=(None, measured), _model=SimpleNamespace(world=8), _points={}, _probes=[],
                            cluster=earlier)
    assert AutoTuner._fit(other, [], [], None) is earlier


def _offline(module):
    """A profile and cluster as a user might pass them (sizes from the module, a slow network)."""
    from gradsched.cluster import Cluster
    from gradsched.torch.runtime.planning import profile_from_module

    return profile_from_module(module), Cluster.alpha_beta(2e-3, 1e-7, 2)


def _train(rank: int, world: int, strategy: str, optimizer: str, options: dict | None, wrap_optimizer: bool = True,
           offline: bool = False):
    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    spec = build_model("mlp", seed=0)
    given = dict(zip(("profile", "cluster"), _offline(spec.module))) if offline else {}
    model = DistributedDataParallel(spec.module, strategy, plan_options=options, timeout_s=60, **given)
    inner = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
             else torch.optim.Adam(model.parameters(), lr=1e-3))
    opt = DistributedOptimizer(inner, model) if wrap_optimizer else inner
    sched = torch.optim.lr_scheduler.StepLR(inner, step_size=7, gamma=0.5)

    def evaluate(step: int, x: torch.Tensor) -> None:
        if step == 9:
            with torch.no_grad():  # an evaluation forward is not an iteration: it must not shift the switch
                model(x)

    train(model, opt, spec.make_batch, spec.loss_fn, rank=rank, world=world, steps=STEPS, sched=sched,
          after_step=evaluate)
    model.synchronize()
    params = params_of(spec.module)
    tuner = model.autotuner
    if tuner is None:
        return {"params": params}
    from gradsched.planners.auto import as_auto

    from gradsched.torch.runtime.torch_ddp import candidate_plan

    # PyTorch's DDP at its default size (not planned: deferred, the plan it started on)
    torch_ddp_plan = candidate_plan(tuner.profile, tuner.cluster, 25.0) if tuner.profile else model.plan
    offline_hash = None
    if offline:
        from gradsched.planners.auto import ranked

        off_profile, off_cluster = _offline(spec.module)
        offline_hash = as_auto(ranked(off_profile, off_cluster)[0], 1).hash
    return {"params": params, "switches": [(s.iteration, s.plan_hash, s.strategy, s.reason) for s in tuner.switches],
            "predicted": tuner.predicted_iteration_s, "plan_hash": model.plan.hash,
            "measured_by_plan": dict(tuner.measurements.measured), "rejected": list(tuner.rejected),
            "torch_ddp_hash": torch_ddp_plan.hash, "offline_hash": offline_hash,
            "plan_overlaps": model.plan.overlap_forward, "checks": [c.iteration for c in tuner.checks],
            "completions": tuner._tracer.completions, "measuring": tuner._next_replan is not None,
            "expected": tuner.summary()["expected_iteration_s"], "trial_decision": tuner.trial_decision}


CASES = {
    "auto/sgd": ("sgd", {"switch_iteration": 3, "patience": 4, "defer": False}, True),
    "auto/adam": ("adam", {"switch_iteration": 3, "patience": 4, "defer": False}, True),
    # the three best predicted plans (and the first one's strategy with its default options), PyTorch's DDP
    # (at 25 MB and the advised size) and the initial one take turns twice, 1 iteration each (+1 for the switch),
    # then the fastest measured stays; on this small model many strategies plan the same single bucket
    # (one plan is measured once), so the search is left with three strategies whose plans always differ
    "trials/sgd": ("sgd", {"switch_iteration": 3, "trials": 3, "trial_iterations": 2, "trial_rounds": 2,
                           "trial_window_s": 0, "min_gain": 0, "max_replans": 0, "runoff_rounds": 0,
                           "trial_share": 0, "exclude": ["sync", "ddp", "threshold", "horovod", "mgwfbp", "optimal"]}, True),
    # given a profile and cluster (slow network: another best plan), their best plan is measured too
    # one round of windows, so that the trials end within STEPS (three rounds of 4-5 candidates did not)
    "trials-offline/sgd": ("sgd", {"switch_iteration": 3, "trials": 2, "trial_iterations": 2, "trial_rounds": 1,
                                   "trial_window_s": 0, "max_replans": 0, "trial_share": 0,
                                   "runoff_rounds": 0}, True),  # no run-off: close plans measured again ran past STEPS
    # every check is off by more than 1e-9: checks at 3+4+1 = 8 and 18, each followed by a measuring
    # window and a re-plan at 13 and 23 (or a revert at the check itself), then stop (cap) but for one
    # check of the last re-plan's plan (at 28)
    "replan/sgd": ("sgd", {"switch_iteration": 3, "patience": 4, "replan_threshold": 1e-9, "max_replans": 2,
                           "trials": 1}, True),
    "replan/adam": ("adam", {"switch_iteration": 3, "patience": 4, "replan_threshold": 1e-9, "max_replans": 2,
                             "trials": 1}, True),
    # start on a plan that overlaps the update with the next forward: switching must finish it first
    "overlap-start/adam": ("adam", {"switch_iteration": 4, "initial": "bytescheduler",
                                    "initial_options": {"partition_bytes": 8192, "credit_bytes": 32768},
                                    "max_replans": 0, "defer": False}, True),
    # a plain torch optimizer: auto must not pick a plan that needs DistributedOptimizer
    "plain-optimizer/sgd": ("sgd", {"switch_iteration": 3, "max_replans": 0, "defer": False}, False),
    # the default's way (deferred): a short job runs PyTorch's DDP throughout, no profiling (its cost fits 1% later)
    "deferred/sgd": ("sgd", {"switch_iteration": 3}, True),
}


def _job(rank: int, world: int) -> dict:
    out = {f"ddp/{o}": _train(rank, world, "ddp", o, None) for o in ("sgd", "adam")}
    for label, (opt, options, wrap) in CASES.items():
        out[label] = _train(rank, world, "auto", opt, options, wrap, offline="offline" in label)
    return out


@pytest.fixture(scope="module")
def results():
    return spawn_local(_job, 2, timeout_s=60)


@pytest.mark.slow
@pytest.mark.parametrize("label", list(CASES))
def test_auto_trains_to_ddps_parameters_on_every_rank(results, label):
    opt = CASES[label][0]
    for rank in (0, 1):
        assert rel_diff(results[rank][label]["params"], results[rank][f"ddp/{opt}"]["params"]) <= TOLERANCE
    assert all(torch.equal(a, b) for a, b in zip(results[0][label]["params"], results[1][label]["params"]))


@pytest.mark.slow
@pytest.mark.parametrize("label", list(CASES))
def test_every_rank_switches_at_the_same_iteration_to_the_same_plan(results, label):
    a, b = results[0][label], results[1][label]
    assert a["switches"] == b["switches"]
    if "deferred" in label:  # still on the baseline, PyTorch's DDP, at the end of a short job
        assert [s[2:] for s in a["switches"]] == [("torch-ddp", "initial")] and a["predicted"] is None
        return
    assert a["predicted"] == b["predicted"] and a["predicted"] > 0
    first = a["switches"][1]
    assert first[0] == CASES[label][1]["switch_iteration"] and first[3] == "profiled"


@pytest.mark.slow
def test_replans_when_measured_time_is_off_and_stops_at_the_cap(results):
    r = results[0]["replan/sgd"]
    sw, checks = r["switches"], r["checks"]
    assert [s[0] for s in sw[:2]] == [0, 3] and [s[3] for s in sw[:2]] == ["initial", "profiled"]
    # with a zero threshold every check acts: go back to a plan that measured faster, at the check, or
    # re-plan from a window of `patience` (4) iterations measured in full after it
    assert len(sw) >= 4
    for check, s in zip(checks, sw[2:4]):
        assert (s[3], s[0]) in {("revert", check), ("replan", check + 5)}
    assert checks[0] == 8 and checks[1] == sw[2][0] + 5
    if sw[3][3] == "replan":  # the last re-plan's plan (no trial measured it) is checked once more, at the cap
        assert len(checks) == 3 and checks[2] == sw[3][0] + 5
        # it may only go back to a plan measured faster (it beat none by min_gain: back) or stay; no re-plan
        assert len(sw) == 4 or (len(sw) == 5 and (sw[4][3], sw[4][0]) == ("revert", checks[2]))
    else:
        assert len(checks) == 2 and len(sw) == 4  # none after the cap: no more broadcasts
    assert results[1]["replan/sgd"]["checks"] == []  # rank 0 measures and decides
    # every completion is stamped only while measuring for a plan: off once the last re-plan is made
    assert r["completions"] is False and r["measuring"] is False
    # where a check near the end opened a re-plan's measuring window, it is still on (timing decides which)
    auto = results[0]["auto/sgd"]
    assert auto["completions"] is auto["measuring"]


@pytest.mark.slow
def test_trials_measure_the_best_predicted_plans_and_keep_the_fastest(results):
    r = results[0]["trials/sgd"]
    sw = r["switches"]
    # profiled at 3, then a trial window every 1 + 1 iterations: the candidates take turns twice (the
    # first plan's first window is the profiled switch); the last switch (if any) goes to the fastest
    trials = [s for s in sw if s[3] == "trial"]
    # candidates: the first plan, its strategy's default options, two runners-up, PyTorch's DDP at 25 MB and
    # at the advised size, the initial plan; one plan under two names is measured once
    n = (len(trials) + 1) // 2
    assert 4 <= n <= 7 and len(trials) == 2 * n - 1
    assert [s[0] for s in sw[1:2 + len(trials)]] == [3 + 2 * k for k in range(len(trials) + 1)]
    turn = [s[1] for s in sw[1:1 + n]]
    assert len(set(turn)) == n and [s[1] for s in sw[1 + n:1 + 2 * n]] == turn  # each once a turn, twice
    # gradsched's plans first (the first plan, its defaults, runners-up: those predicted under twice the fastest,
    # PREDICTED_FAR_SLOWER), then PyTorch's DDP at its sizes
    names = [s[2] for s in sw[1:1 + n]]
    first_ddp = names.index("torch-ddp") if "torch-ddp" in names else n
    assert first_ddp >= 2 and set(names[:first_ddp]) <= {"wfbp", "bytescheduler", "usbyte", "dear"}  # dear: issue 36
    assert r["torch_ddp_hash"] in turn
    assert sw[0][1] in turn  # what users would run otherwise and the safe default that ran first
    measured = r["measured_by_plan"]
    assert {s[1] for s in sw} <= set(measured)  # every plan that ran was measured (initial included)
    # the fastest (min_gain 0), unless it lost a round to PyTorch's DDP (one window median a plan a round)
    from gradsched.calibration import fastest

    d = r["trial_decision"]
    assert d["measured"] == measured and all(len(v) == 2 for v in d["rounds"].values())
    assert r["plan_hash"] == d["kept"] == fastest(measured, d["baseline"], 0.0, d["rounds"], d["resized"], 0.01)
    # the baseline, or a plan faster than it (not always the fastest: that one may lose most rounds)
    assert d["kept"] == d["baseline"] or measured[d["kept"]] <= measured[d["baseline"]]
    # later checks would look for drift from what the winner measured, not from the simulator's figure
    assert r["expected"] == measured[r["plan_hash"]]
    winner = next(s[2] for s in sw if s[1] == r["plan_hash"])
    assert winner not in r["rejected"] and set(r["rejected"]) == {s[2] for s in sw} - {winner}
    assert sw[-1][3] in ("fastest", "trial", "profiled")
    assert results[1]["trials/sgd"]["plan_hash"] == r["plan_hash"]


@pytest.mark.slow
def test_trials_include_the_best_plan_for_a_given_profile_and_cluster(results):
    r = results[0]["trials-offline/sgd"]
    assert r["offline_hash"] in {s[1] for s in r["switches"]}  # run (or the same plan ran under another name)
    if any(s[3] == "trial" for s in r["switches"]):  # none when every candidate plans the same buckets
        from gradsched.calibration import fastest

        # the fastest as measured when the trials ended (later checks add samples to the winner's
        # median), unless PyTorch's DDP (what the user would run otherwise) is within min_gain (3%) of it
        d = r["trial_decision"]
        assert d["baseline"] == r["torch_ddp_hash"] and d["baseline"] in d["measured"]
        assert d["kept"] == fastest(d["measured"], d["baseline"], 0.03, d["rounds"], d["resized"], 0.01)
        assert r["plan_hash"] == d["kept"] or r["switches"][-1][3] in ("replan", "revert")
        # the record says what each plan was planned on: the given profile's best (OFFLINE_TRIALS = 1) alone "given"
        # (unless the measured profile planned it too), the plan profiling ran "start-up", the others "measured"
        assert {h for h, on in d["planned_on"].items() if on == "given"} <= {r["offline_hash"]}
        assert list(d["planned_on"].values()).count("start-up") <= 1
        assert set(d["operations"]) == set(d["measured"]) and all(n >= 1 for n in d["operations"].values())
    assert results[1]["trials-offline/sgd"]["switches"] == r["switches"]


@pytest.mark.slow
def test_without_distributed_optimizer_auto_never_picks_an_overlapping_plan(results):
    assert results[0]["plain-optimizer/sgd"]["plan_overlaps"] is False
    assert results[0]["overlap-start/adam"]["switches"][0][2] == "bytescheduler"
