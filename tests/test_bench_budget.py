"""A default replay's rounds cut to fit the bench's wall-time target (gradsched.jobs.budget)."""

from __future__ import annotations

from gradsched.commands.bench import DEFAULT_BUCKETS, entries
from gradsched.jobs import budget
from gradsched.jobs.results import BenchJsonRow, undeclared

MB = 1 << 20
GRADIENTS = 53 * MB  # googlenet-k80's 53.5 MB: ddp-100mb is one bucket, as ddp-all


def _trim(step_s: float, **kw: object) -> budget.Trim:
    args = {"steps": None, "buckets_given": False, "warmup_rounds": 1, "min_rounds": 2, **kw}
    return budget.trim(entries("ddp,auto", DEFAULT_BUCKETS), GRADIENTS, step_s, **args)  # type: ignore[arg-type]


def test_step_estimate_follows_dilation_and_rate() -> None:
    one = budget.step_estimate_s(0.4, GRADIENTS, 2, 1e9, 1)
    assert budget.step_estimate_s(0.4, GRADIENTS, 2, 1e9, 20) == 20 * one
    assert budget.step_estimate_s(0.4, GRADIENTS, 2, 2e9, 1) < one


def test_a_bench_that_fits_is_not_cut() -> None:
    out = _trim(0.6)
    assert [e.label for e in out.entries] == [e.label for e in entries("ddp,auto", DEFAULT_BUCKETS)]
    assert (out.steps, out.warmup_steps, out.rounds, out.dropped, out.lines(DEFAULT_BUCKETS, 3)) == (3, 0, 6, [], [])


def test_only_the_rounds_are_cut_where_only_the_most_rounds_would_not_fit() -> None:
    out = _trim(4.0)  # the least rounds fit, all six do not
    assert budget.estimate_s(6, 3, 3, 1, 5, 4.0) > budget.BENCH_TARGET_S >= out.after_s
    assert (len(out.entries), out.steps, out.dropped, out.rounds_cut) == (6, 3, [], True)
    assert 3 <= out.rounds < 6 and budget.estimate_s(6, 3, 3, 1, out.rounds - 1, 4.0) <= budget.BENCH_TARGET_S
    assert "(--rounds 6)" in "\n".join(out.lines(DEFAULT_BUCKETS, 3))


def test_dilated_default_is_cut_to_the_target_duplicates_and_largest_first() -> None:
    step_s = budget.step_estimate_s(0.39, GRADIENTS, 2, 1e9, 20)
    out = _trim(step_s)
    assert out.before_s > budget.BENCH_TARGET_S >= out.after_s
    labels = [e.label for e in out.entries]
    assert labels[:2] == ["ddp", "auto"] and "ddp-1mb" in labels
    assert out.dropped[0] == "ddp-100mb" and out.duplicates == ["ddp-100mb"]  # the same job as ddp-all
    assert out.dropped[1:] == ["ddp-all"]  # then the largest cap first, only as many as the target needs
    assert (out.steps, out.warmup_steps) == (budget.TRIMMED_STEPS, budget.TRIMMED_WARMUP_STEPS)
    assert out.after_s == budget.estimate_s(len(labels), 2, 1, 1, 2, step_s)
    text = "\n".join(out.lines(DEFAULT_BUCKETS, 3))
    assert "ddp-all (--ddp-buckets 1,5,25,100,all runs them)" in text and "--steps 3" in text
    assert undeclared({"trimmed": out.to_dict()}, BenchJsonRow) == []  # the JSON's record has declared units


def test_what_the_user_gave_is_kept() -> None:
    out = _trim(20.0, steps=3, buckets_given=True)
    assert (len(out.entries), out.steps, out.warmup_steps, out.dropped) == (6, 3, 0, [])
    assert _trim(20.0, rounds=6).rounds == 6
    assert out.after_s > budget.BENCH_TARGET_S


def test_auto_warmup_estimate_counts_its_initial_plan_and_the_trials_speed() -> None:
    """DenseNet-201 on 8 emulated hosts: run-time auto's warm-up took 588 s against 162 s estimated from the
    lower bound alone (wfbp, its initial plan, pays a per-message latency per tensor: 604 of them)."""
    import json
    from pathlib import Path

    from gradsched.byte_scaling import scale_profile
    from gradsched.calibration import calibrate, lower_bound_s
    from gradsched.cluster import Cluster
    from gradsched.jobs.startup import AUTO_WARMUP_PHASE, initial_iterations, warmup_estimate_s
    from gradsched.planners import make_plan
    from gradsched.profile import Profile
    from gradsched.sim import simulate
    from gradsched.tuning.config import AutoTuneConfig

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    rows = json.loads((root / "results" / "emulate_papers_densenet201_8h.json").read_text())
    auto, first = next(r for r in rows if r["strategy"] == "auto"), rows[0]
    took_s = next(p["s"] for p in first["phases"] if p["phase"] == AUTO_WARMUP_PHASE)
    cluster = Cluster.from_dict(first["cluster"])  # run seconds, as the bench's workers plan
    given = Profile.load(root / "profiles" / "densenet201-b32-10tflops.profile.json")
    profile = scale_profile(calibrate(given, first["compute_only"]["iteration_s_median"] * first["dilate"]),
                            first["scale_bytes"])
    bound_s = lower_bound_s(profile, cluster)["lower_bound_s"]
    config = AutoTuneConfig.from_options({"trial_share": 0, "max_replans": 2})
    window = config.window_for(bound_s)
    iterations = config.tuning_iterations_for(window)
    assert iterations == auto["auto_warmup"]["iterations"]
    initial_s, ddp_s = (simulate(make_plan(s, profile, cluster), profile, cluster, timeline=False).iteration_s
                        for s in ("wfbp", "ddp"))
    first_n = initial_iterations(config.switch_iteration, config.trial_rounds, window, True)
    estimate = warmup_estimate_s(iterations, first_n, initial_s, ddp_s, bound_s)
    assert iterations * bound_s < 0.4 * took_s  # the old estimate
    assert 0.7 * took_s < estimate < 1.3 * took_s


def _warmups(name: str, profile_file: str):
    """The full and the short warm-up's estimate for one of the papers' models on 8 emulated hosts, as the bench's
    workers make it (its JSON's cluster and compute-only step, run seconds): profiling under DDP's buckets at the
    bench's ``ddp`` row's size (:func:`gradsched.jobs.startup.replay_start`), the trials' baseline that DDP."""
    import json
    from pathlib import Path

    from gradsched.byte_scaling import scale_profile
    from gradsched.calibration import calibrate, lower_bound_s
    from gradsched.cluster import Cluster
    from gradsched.jobs.startup import SHORT_WARMUP, auto_warmup, initial_iterations, replay_start, warmup_estimate_s
    from gradsched.planners import make_plan
    from gradsched.profile import Profile
    from gradsched.sim import simulate
    from gradsched.tuning.config import AutoTuneConfig

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    first = json.loads((root / "results" / f"emulate_papers_{name}_8h.json").read_text())[0]
    cluster = Cluster.from_dict(first["cluster"])
    profile = scale_profile(calibrate(Profile.load(root / "profiles" / profile_file),
                                      first["compute_only"]["iteration_s_median"] * first["dilate"]),
                            first["scale_bytes"])
    bound_s = lower_bound_s(profile, cluster)["lower_bound_s"]
    start = replay_start({"max_replans": 2}, 25.0 / first["scale_bytes"])
    assert start["initial"] == "ddp"
    ddp_s = simulate(make_plan("ddp", profile, cluster, **start["initial_options"]), profile, cluster,
                     timeline=False).iteration_s
    out = []
    for extra in ({}, SHORT_WARMUP):
        config = AutoTuneConfig.from_options({"trial_share": 0, "max_replans": 2, **start, **extra})
        window = config.window_for(bound_s)
        n = config.tuning_iterations_for(window)
        first_n = initial_iterations(config.switch_iteration, config.trial_rounds, window, True)
        out.append(auto_warmup(n, warmup_estimate_s(n, first_n, ddp_s, ddp_s, bound_s) / n, None, replay=True))
    return out


def test_a_short_warm_up_fits_where_the_full_one_does_not() -> None:
    """ResNet-50 on 8 emulated hosts: run-time auto's warm-up (281 iterations) did not fit its 300 s, so auto was
    planned at start-up and ran 0.93x DDP, where in situ it had run 1.16x; the short one (windows of 2 iterations,
    2 run-off rounds, checks over 5, 5 candidates) fits, estimated the same way."""
    from gradsched.jobs.startup import AUTO_WARMUP_S, SHORT_WARMUP, auto_options, shorter

    full, short = _warmups("resnet50", "resnet50-b64-10tflops.profile.json")
    assert full.iterations == 281 and not full.in_situ
    assert short.iterations == 108 and short.estimated_s <= AUTO_WARMUP_S
    chosen = shorter(full, short)
    assert chosen.in_situ and chosen.shortened == SHORT_WARMUP and chosen.estimated_s == short.estimated_s
    assert auto_options({"max_replans": 2}, chosen) == {"trial_share": 0, **SHORT_WARMUP, "max_replans": 2}
    assert "short warm-up" in chosen.describe() and "108 iterations" in chosen.describe()


def test_started_on_ddps_buckets_the_short_warm_up_fits_every_papers_model_but_bert_large() -> None:
    """Before, profiling ran ``wfbp`` (Inception-v4: 449 messages, some 15 s an iteration) and 9 candidates took
    turns: VGG-16, Inception-v4 and BERT-Base's short warm-ups (369-381 s) did not fit AUTO_WARMUP_S."""
    from gradsched.jobs.startup import AUTO_WARMUP_S

    fits = {}
    for name, profile in (("vgg16", "vgg16-b64-10tflops"), ("inception_v4", "inception-v4-b64-10tflops"),
                          ("bert_base", "bert-base-b64-10tflops"), ("bert_large", "bert-large-b32-10tflops")):
        full, short = _warmups(name, f"{profile}.profile.json")
        assert short.estimated_s < 0.6 * full.estimated_s
        fits[name] = short.estimated_s <= AUTO_WARMUP_S
    assert fits == {"vgg16": True, "inception_v4": True, "bert_base": True, "bert_large": False}


def test_a_replay_starts_on_the_bench_ddp_buckets_unless_the_user_chose_its_initial_plan() -> None:
    from gradsched.jobs.startup import AutoWarmup, auto_options, replay_start

    start = replay_start(None, 25.0 / 16)
    assert start == {"initial": "ddp", "initial_options": {"bucket_cap_mb": 1.5625, "first_bucket_mb": 1.5625}}
    assert replay_start({"max_replans": 2}, None) == {"initial": "ddp", "initial_options": {}}  # DDP's default
    assert replay_start({"initial": "wfbp"}, 1.0) == {} == replay_start({"initial_options": {"bucket_cap_mb": 4}}, 1)
    in_situ = AutoWarmup(True, 100.0, 300.0, 108, start=start)
    assert auto_options({"initial": "wfbp"}, in_situ)["initial"] == "wfbp"  # what the user set stays
    assert auto_options(None, in_situ)["initial_options"] == start["initial_options"]
    assert AutoWarmup.from_dict(in_situ.to_dict()) == in_situ
    assert "initial" not in auto_options(None, AutoWarmup(False, 900.0, 300.0, 281, start=start))  # planned
