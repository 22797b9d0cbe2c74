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


def _stored(name: str) -> dict:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / f"emulate_papers_{name}.json"
    return json.loads(path.read_text())


def _startup_medians(first: dict) -> tuple[float, float]:
    """The contention probe's step alone and all-reduce of every gradient alone at start-up, wall seconds."""
    import statistics

    c, k = first["contention"], first["dilate"]
    n = c["startup_reps"]
    return (statistics.median(c["samples"]["compute_alone_s"][:n]) * k,
            statistics.median(c["samples"]["allreduce_alone_s"][:n]) * k)


def _rounds_run(first: dict) -> int:
    return first["stopping"]["rounds_run"]


def test_the_fit_after_start_up_sees_what_the_papers_berts_cost_and_cuts_them_to_the_target() -> None:
    """BERT-Base and BERT-Large on 8 emulated hosts ran 1067 s and 1206 s: the fit before the launch (the model's
    step, the 2-minute start-up, no warm-up, no samples) put them at 316 s (nothing cut) and 849 s (4 rounds).
    Fitted again with what their start-up measured, the same runs come within 15% of what they took, and the
    fit cuts them to the target."""
    from pathlib import Path

    from gradsched.jobs.config import BenchEntry
    from gradsched.jobs.startup import AUTO_WARMUP_PHASE
    from gradsched.profile import Profile

    for name, profile_file in (("bert_base_8h_start_on_ddp", "bert-base-b64-10tflops.profile.json"),
                               ("bert_large_8h", "bert-large-b32-10tflops.profile.json")):
        rows = _stored(name)
        first = rows[0]
        phases = {p["phase"]: p["s"] for p in first["phases"]}
        took_s = sum(phases.values()) + budget.OUTSIDE_JOB_S
        auto = next(r for r in rows if r["strategy"] == "auto")["auto_warmup"]
        compute_s, allreduce_s = _startup_medians(first)
        measured = budget.Measured(phases["profiling"] + phases["network table"] + phases["probe"],
                                   auto["estimated_s"] if auto["mode"].startswith("run-time") else 0.0,
                                   compute_s, allreduce_s)
        labels = [r["strategy"] for r in rows]
        ran = [BenchEntry(label=lb, strategy="ddp" if lb.startswith("ddp") else lb, torch_ddp=lb.startswith("ddp"))
               for lb in labels]
        given = budget.Given(steps=False, buckets=False, rounds=True)  # the rounds as they ran: its estimate
        as_ran = budget.after_startup(ran, first["profile"]["total_bytes"], measured, given, steps=3, warmup_steps=0,
                                      rounds=_rounds_run(first), warmup_rounds=1, min_rounds=_rounds_run(first) - 1,
                                      share=0.25)
        assert 0.85 * took_s < as_ran.before_s < 1.15 * took_s, (name, as_ran.before_s, took_s)
        given_profile = Profile.load(Path(__file__).resolve().parents[1] / "benchmarks" / "profiles" / profile_file)
        model_step_s = budget.step_estimate_s(given_profile.compute_s, given_profile.total_bytes, first["hosts"],
                                              10e9, first["dilate"])  # 10 Gbit/s emulated, as they ran
        before = budget.estimate_s(len(labels), 3, 3, 1, _rounds_run(first) - 1, model_step_s)
        assert before < 0.75 * took_s  # the fit before the launch
        fitted = budget.after_startup(ran, first["profile"]["total_bytes"], measured,
                                      budget.Given(steps=False, buckets=False, rounds=False), steps=3,
                                      warmup_steps=0, rounds=6, warmup_rounds=1, min_rounds=2, share=0.25)
        assert fitted.after_s <= budget.BENCH_TARGET_S and fitted.rounds < _rounds_run(first)
        assert phases[AUTO_WARMUP_PHASE] == 0.0 or measured.warmup_s > 0


def test_the_overhead_probe_on_a_replay_counts_each_runtimes_communication() -> None:
    """BERT-Base on 8 emulated hosts: the runtimes' overhead probe counted each run's step at the probe's compute
    alone (a rotation 13 s), kept its floor of 2 rotations and took about 150 s of the probe's 172 s; counted at
    each runtime's simulated step, with its warm-up rotation and priming, the estimate comes within 25% of that,
    and the floor is left to the samples between the rounds."""
    from gradsched.byte_scaling import scale_profile
    from gradsched.calibration import calibrate
    from gradsched.cluster import Cluster
    from gradsched.jobs.startup import FULL_FLOOR_S, overhead_probe_s, probe_floor, runtime_steps_s
    from gradsched.profile import Profile
    from pathlib import Path

    first = _stored("bert_base_8h_start_on_ddp")[0]
    compute_s, allreduce_s = _startup_medians(first)
    given = Profile.load(Path(__file__).resolve().parents[1] / "benchmarks" / "profiles"
                         / "bert-base-b64-10tflops.profile.json")
    profile = scale_profile(calibrate(given, compute_s), first["scale_bytes"])
    steps = runtime_steps_s(profile, Cluster.from_dict(first["cluster"]), first["contention"],
                            [("sync", False), ("ddp", True), ("wfbp", False)])
    rotation_s, setup_s = overhead_probe_s(compute_s, steps, 2)
    probe_s = next(p["s"] for p in first["phases"] if p["phase"] == "probe")
    contention_s = first["contention"]["startup_reps"] * (3 * compute_s + 2 * allreduce_s)  # probe_reps' count
    took_s = probe_s - contention_s
    assert 2 * (4 * 4 * compute_s) <= FULL_FLOOR_S  # before: the floor kept
    assert 0.75 * took_s < setup_s + 2 * rotation_s < 1.25 * took_s
    assert probe_floor(2, rotation_s, least=0) == 0


def test_the_network_table_keeps_its_budget_at_8_hosts() -> None:
    """At 8 emulated hosts a 4 KiB all-reduce took 15-30 ms, and the table timed 64 of them a repetition at each
    of its six latency-bound sizes (timed whatever the budget): 31-44 s against 20 s.  With the run capped to
    what fits TABLE_RUN_S, the same sizes fit the budget."""
    from gradsched.net_extend import TABLE_BUDGET_S, table_run, table_s

    for name in ("bert_base_8h_start_on_ddp", "bert_large_8h", "inception_v4_8h_stream", "vgg16_8h"):
        first = _stored(name)[0]
        cluster = first["cluster"]
        points = [(float(b), float(t)) for b, t in
                  cluster.get("startup_measured_points", cluster["measured_points"])["allreduce"]]
        took_s = next(p["s"] for p in first["phases"] if p["phase"] == "network table")
        assert took_s > TABLE_BUDGET_S and 0.75 * took_s < table_s(points, 3) < 1.15 * took_s, name
        assert table_s(points, 3, table_run(points[0][1])) <= TABLE_BUDGET_S, name


def test_the_command_reports_the_workers_fit_with_the_one_before_the_launch() -> None:
    """What the rounds ran is the workers' fit after start-up (their ``trimmed``): the command's rounds, steps and
    lines follow it, with its own fit before the launch kept as ``before_launch`` where that one cut."""
    import argparse

    from gradsched.commands.bench import DEFAULT_STEPS, _fitted

    before = _trim(20.0)  # the fit before the launch cut steps and rows
    after = _trim(4.0)  # the workers' cut only the rounds
    args = argparse.Namespace(rounds=before.rounds)
    result = {"trimmed": {**after.to_dict(), "at": "start-up"}}
    out, steps = _fitted(args, result, before, DEFAULT_STEPS)  # type: ignore[arg-type]
    assert out is not None and (steps, args.rounds) == (after.steps, after.rounds)
    assert result["trimmed"]["before_launch"] == before.to_dict()
    assert out.lines(DEFAULT_BUCKETS, 3) == after.lines(DEFAULT_BUCKETS, 3)
    assert _fitted(args, {}, before, 2) == (before, 2)  # no fit after start-up (loopback): as before
