"""The bench worker's rounds on one rank: they stop by the rule, and a replay's warm-up round skips its compute."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradsched.byte_scaling import scale_profile
from gradsched.constants import REPLAY_PREFIX
from gradsched.jobs.config import BenchConfig
from gradsched.jobs.rounds import RoundLoads, loaded_rounds
from gradsched.replayable import load_profile
from gradsched.torch.jobs.bench_worker import _ComputeOnly, _startup_probe, _timed_rounds
from gradsched.torch.jobs.shared_model import SharedModel


def _cfg(model: str, rounds: int, tol: float) -> BenchConfig:
    return BenchConfig(model=model, seed=0, batch_size=2, lr=0.01, entries=[], steps=1, rounds=rounds,
                       warmup_rounds=1, profile_iterations=1, net_reps=1, probe=False, probe_s=1.0,
                       resample_share=0.0, contention_history=[], timeout_s=60.0, progress=False, out_dir=".",
                       backend="gloo", threads=1, round_tol=tol, min_rounds=2)


@pytest.fixture(scope="module")
def replay(tmp_path_factory, world_of_one):
    """googlenet-k80 at half its times (a step about 200 ms: well above the host's own work under load), 1/16 of
    its bytes."""
    path = tmp_path_factory.mktemp("replay") / "replay.profile.json"
    scale_profile(load_profile("googlenet-k80").with_times(0.5), 16).save(path)
    model = f"{REPLAY_PREFIX}{path}"
    shared = SharedModel(model, 0)
    batches = [shared.spec.make_batch(2, None) for _ in range(4)]
    cfg = _cfg(model, 5, 0.0)
    runs = [(r, r) for r in (_ComputeOnly(cfg, shared), _ComputeOnly(cfg, shared))]
    return model, runs, shared.spec.loss_fn, batches


def test_the_rounds_stop_by_the_rule_and_say_so(replay):
    model, runs, loss_fn, batches = replay
    times, record = _timed_rounds(_cfg(model, 5, 0.5), runs, loss_fn, batches, None, RoundLoads())  # within 50%
    assert [len(t) for t in times] == [3, 3] and record["rounds_run"] == 3 and record["stopped_early"]
    times, record = _timed_rounds(_cfg(model, 4, 0.0), runs, loss_fn, batches, None, RoundLoads())  # every round
    assert [len(t) for t in times] == [4, 4] and not record["stopped_early"] and len(record["moves"]) == 2


def test_a_replays_warm_up_round_skips_its_compute(replay, monkeypatch):
    """Every replayed wait of the warm-up round takes none of its time, every one of the counted round all of
    it (the clock's scale at each wait: an event, not a wall-clock comparison that load could upset)."""
    from gradsched.torch.jobs import replay as replay_mod

    scales: list[float] = []
    wait_until = replay_mod._Clock.wait_until

    def recorded(clock: replay_mod._Clock, start: float, seconds: float) -> None:
        scales.append(clock.scale)
        wait_until(clock, start, seconds)

    monkeypatch.setattr(replay_mod._Clock, "wait_until", recorded)
    model, runs, loss_fn, batches = replay
    _timed_rounds(_cfg(model, 2, 0.0), runs, loss_fn, batches, None, RoundLoads())
    first = scales.index(1.0)
    assert first > 0 and set(scales[:first]) == {0.0} and set(scales[first:]) == {1.0}


def test_a_trimmed_warm_up_round_runs_its_own_steps(replay):
    """gradsched.jobs.budget: a dilated replay's warm-up round runs fewer steps than the counted ones."""
    import dataclasses

    model, runs, loss_fn, batches = replay
    cfg = dataclasses.replace(_cfg(model, 3, 0.0), steps=2, warmup_steps=1)
    times, _ = _timed_rounds(cfg, runs, loss_fn, batches, None, RoundLoads())
    assert [[len(r) for r in t] for t in times] == [[1, 2, 2]] * 2


def test_the_load_is_read_as_the_rounds_begin_and_after_each_round(replay):
    """A fake loadavg that counts its reads: one as the rounds begin, then one per round (the warm-up round's
    included), in order; the record flags the counted rounds above 6 (8 ranks on 2 cores)."""
    model, runs, loss_fn, batches = replay
    reads = iter([1.0, 2.0, 7.5, 3.0])
    loads = RoundLoads(read=lambda: next(reads))
    times, _ = _timed_rounds(_cfg(model, 3, 0.0), runs, loss_fn, batches, None, loads)
    assert [len(t) for t in times] == [3, 3] and loads.startup_end == 1.0 and loads.rounds == [2.0, 7.5, 3.0]
    record = loads.record(ranks=8, cores=2)
    assert record["loaded_above"] == 6.0 and loaded_rounds(record, warmup_rounds=1) == [1]


def test_plans_are_made_from_the_table_anchored_to_the_probe():
    """The start-up probe's all-reduce of every gradient sets the table's bandwidth term before the rows are
    planned, and the contention figures are taken against that table (as after the rounds)."""
    import json
    from types import SimpleNamespace

    from gradsched.cluster import Cluster

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    cluster = Cluster.from_dict(json.loads((root / "emulate_papers_densenet201_8h.json").read_text())[0]["cluster"])
    nbytes = 10 << 20
    measured_s = 1.3 * cluster.cost("allreduce").time_s(nbytes)
    probe = SimpleNamespace(start_reps=1, total_bytes=nbytes, samples={"allreduce_alone_s": [measured_s]},
                            measure=lambda reps: 0.0, bucket_pass_s=lambda reps: (0.0, 0.0),
                            buffer_sync_s=lambda reps, timeout_s: 0.0,
                            figures=lambda cost, phase_costs=None: {"allreduce_model_s": cost.time_s(nbytes)})
    figures, anchored = _startup_probe(probe, cluster, _cfg("mlp", 2, 0.0))  # type: ignore[arg-type]
    assert anchored.cost("allreduce").time_s(nbytes) == pytest.approx(measured_s, rel=1e-6)
    assert figures["allreduce_model_s"] == pytest.approx(measured_s, rel=1e-6) and figures["startup_anchor"] > 1.2
    assert anchored.cost("allreduce").time_s(4096) == pytest.approx(cluster.cost("allreduce").time_s(4096), rel=0.05)


@pytest.mark.parametrize("cap", [None, 0.75])
def test_torch_ddp_makes_the_first_bucket_the_bench_predicts(world_of_one, cap):
    """What ddp_first_bucket_mb assumes of the installed torch: the first bucket after DDP's rebuild."""
    import torch
    from torch import nn

    from gradsched.jobs.bench import ddp_first_bucket_mb
    from gradsched.torch.jobs.bench_worker import _EXPLICIT_CAP_NO_FIRST_BUCKET

    module = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(16)])  # 256 KiB a layer
    ddp = nn.parallel.DistributedDataParallel(module, **({} if cap is None else {"bucket_cap_mb": cap}))
    for _ in range(3):
        ddp(torch.randn(2, 256)).sum().backward()
    first = int(str(ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]).split(",")[0])
    kwargs = {} if cap is None else {"bucket_cap_mb": cap}
    assert first == int(ddp_first_bucket_mb(kwargs, _EXPLICIT_CAP_NO_FIRST_BUCKET) * (1 << 20))


@pytest.mark.parametrize("plain, forwards", [(True, 2), (False, 1)])
def test_a_replay_profiled_after_its_fast_steps_keeps_its_forward_and_backward(tmp_path, plain, forwards):
    """The bench profiles a dilated replay over one iteration right after a fast (compute-free) step: the clocks
    restart after the fast steps, else the profile lost its forward (VGG-16: 0.5% of it) to the backward.  And
    with no unhooked reference iteration (``plain_reference=False``, a dilated replay: each costs a step of
    start-up), the hooked one is the whole iteration's measure."""
    import torch

    from gradsched.torch.jobs.bench_worker import _fast_steps
    from gradsched.torch.jobs.models import build_model
    from gradsched.torch.measure.profiler import profile_module

    vgg16 = Path(__file__).parents[2] / "benchmarks" / "profiles" / "vgg16-b64-10tflops.profile.json"
    given = scale_profile(load_profile(str(vgg16)).with_times(0.5), 64)  # a step about 0.3 s, 8.6 MB
    given.save(tmp_path / "p.profile.json")
    spec = build_model(f"{REPLAY_PREFIX}{tmp_path / 'p.profile.json'}")
    batch = spec.make_batch(2, torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(spec.module.parameters(), lr=0.01, momentum=0.9)
    for _ in _fast_steps(spec.module, 1):
        opt.zero_grad()
        spec.loss_fn(spec.module(batch[0]), batch[1]).backward()
        opt.step()
    calls: list[int] = []
    spec.module.register_forward_hook(lambda *_: calls.append(1))
    prof = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=1, warmup=0, model_name="p",
                          optimizer=opt, plain_reference=plain)
    assert len(calls) == forwards
    # lower bounds only: under load the host's work adds time (the rounds' compute-only row sets the scale)
    assert prof.forward_s > 0.6 * given.forward_s and prof.backward_s > 0.8 * given.backward_s
    assert prof.extra["iteration_s"] > 0.8 * given.compute_s and prof.compute_s > 0.8 * given.compute_s


@pytest.mark.parametrize("warmup_rounds, primed", [(1, 1), (0, 2)])
def test_a_row_is_primed_with_one_step_where_the_warm_up_round_follows(replay, monkeypatch, warmup_rounds, primed):
    """Priming makes ``.grad`` the row's buckets, to release them; PyTorch DDP rebuilds its buckets in its second
    step, which the warm-up round's first (uncounted) step runs where there is one.  A dilated replay's priming
    step is an all-reduce of every gradient on a slow link (9 s for googlenet-k80 at 50 Mbit/s)."""
    import dataclasses

    from gradsched.cluster import Cluster, CollectiveCost
    from gradsched.jobs.config import BenchEntry
    from gradsched.torch.jobs import bench_rows
    from gradsched.torch.jobs import replay as replay_mod
    from gradsched.torch.measure.profiler import profile_module

    model, _, loss_fn, batches = replay
    steps: list[int] = []
    fast = bench_rows._fast_steps

    def counted(module, n):
        steps.append(n)
        return fast(module, n)

    monkeypatch.setattr(bench_rows, "_fast_steps", counted)  # called where _build_entry lives
    shared = SharedModel(model, 0)
    with replay_mod.fast_forward(shared.spec.module):  # its parameters' names and sizes: times do not matter
        profile = profile_module(shared.spec.module, batches[0], loss_fn=loss_fn, iterations=1, warmup=0)
    cluster = Cluster(1, {"allreduce": CollectiveCost(1e-4, 1e-9)}, backend="gloo")
    cfg = dataclasses.replace(_cfg(model, 3, 0.0), warmup_rounds=warmup_rounds)
    row, _ = bench_rows._build_entry(BenchEntry(label="ddp", strategy="ddp", torch_ddp=True), cfg, profile,
                                     cluster, shared, (loss_fn, batches[0]))
    assert steps == [primed]
    assert all(p.grad is None for p in row.module.parameters())  # its buckets released after the priming


def test_the_progress_bar_names_the_model_as_the_user_gave_it(replay, capsys):
    """A replay's workers build ``replay:/tmp/gradsched-bench-.../replay.profile.json``; the bar says the name given."""
    import dataclasses

    from gradsched.jobs.config import BenchEntry

    model, runs, loss_fn, batches = replay
    cfg = dataclasses.replace(_cfg(model, 2, 0.0), progress=True, label="googlenet-k80",
                              entries=[BenchEntry(label="a", strategy="sync", torch_ddp=False)])  # and compute only
    _timed_rounds(cfg, runs, loss_fn, batches, None, RoundLoads())
    err = capsys.readouterr().err
    assert "bench googlenet-k80 x1" in err and "replay.profile.json" not in err


def test_a_scaled_replays_auto_profiles_under_and_measures_against_the_ddp_rows_buckets(replay):
    """Run-time auto on a byte-scaled replay (gradsched.jobs.startup.replay_start): its profiling runs DDP's buckets at
    the ``ddp`` row's size (25/S MB) on the executor, not ``wfbp``, and its PyTorch-DDP baseline is that DDP."""
    import dataclasses

    from gradsched.cluster import Cluster, CollectiveCost
    from gradsched.jobs.config import BenchEntry
    from gradsched.jobs.startup import AutoWarmup, replay_start
    from gradsched.torch.jobs import bench_worker
    from gradsched.torch.jobs import replay as replay_mod
    from gradsched.torch.measure.profiler import profile_module

    model, _, loss_fn, batches = replay
    ddp = BenchEntry(label="ddp", strategy="ddp", torch_ddp=True, ddp_kwargs={"bucket_cap_mb": 25.0 / 16})
    auto = BenchEntry(label="auto", strategy="auto", torch_ddp=False, options={"max_replans": 2})
    cfg = dataclasses.replace(_cfg(model, 3, 0.0), entries=[ddp, auto])
    assert bench_worker._ddp_cap_mb(cfg) == 25.0 / 16
    assert bench_worker._ddp_cap_mb(dataclasses.replace(cfg, entries=[auto])) is None  # DDP's default
    shared = SharedModel(model, 0)
    with replay_mod.fast_forward(shared.spec.module):
        profile = profile_module(shared.spec.module, batches[0], loss_fn=loss_fn, iterations=1, warmup=0)
    cluster = Cluster(1, {"allreduce": CollectiveCost(1e-4, 1e-9)}, backend="gloo")
    warmup = AutoWarmup(True, 100.0, 300.0, 108, start=replay_start(auto.options, 25.0 / 16))
    row, _ = bench_worker._build_entry(auto, cfg, profile, cluster, shared, None, warmup)
    tuner = row.autotuner
    assert tuner.switches[0].strategy == "ddp" and row.plan.strategy == "ddp"
    assert row.plan.options["bucket_cap_mb"] == 25.0 / 16 == row.plan.options["first_bucket_mb"]
    assert row._ddp_cap_mb == 25.0 / 16 and row._ddp_cap_given


class _Counted:
    """A run whose steps are counted (its forward calls), for the warm-up's tests."""

    def __init__(self, run: _ComputeOnly) -> None:
        self.run, self.steps = run, 0

    def __call__(self, x):
        self.steps += 1
        return self.run(x)

    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize("done_at", [7, None])
def test_autos_warm_up_stops_once_the_tuner_has_nothing_left_to_decide(replay, done_at):
    """Run-time auto's warm-up runs its whole schedule (two bursts: to the first plan, then the rest) unless the
    tuner has nothing left to decide before (settled on PyTorch's DDP: no check follows); then no more steps."""
    from types import SimpleNamespace

    from gradsched.torch.jobs.bench_worker import _burst, auto_warm_up
    from gradsched.torch.jobs.replay import fast_forward

    _, runs, loss_fn, batches = replay
    run = runs[0][0]
    counted = _Counted(run)

    class Tuner:  # AutoTuner as the warm-up reads it
        config, tuning_iterations = SimpleNamespace(switch_iteration=2, patience=3), 12
        done = property(lambda _: done_at is not None and counted.steps >= done_at)
        held = 0

        def hold_checks(self) -> None:
            self.held += 1

    tuner = Tuner()
    with fast_forward(run.module):
        auto_warm_up(tuner, lambda steps, until: _burst(counted, run, loss_fn, batches, steps, 0, until))
    # 3 + 2, then 9 + 2, then (not done: a decision under way) at most 3 windows of patience + 1, + 2
    assert counted.steps == (done_at if done_at is not None else 12 + 4 + 12 + 2)
    assert tuner.held == (1 if done_at is not None else 2)  # held; again where the rounds begin if it went on


def test_autos_warm_up_ends_a_decision_under_way_then_holds_the_checks(replay):
    """A control window or re-plan under way when the warm-up's schedule ends runs to its end off the clock, no
    further: the rounds then time one plan (bench_autowarmup.hold_checks)."""
    from types import SimpleNamespace

    from gradsched.torch.jobs.bench_worker import _burst, auto_warm_up
    from gradsched.torch.jobs.replay import fast_forward

    _, runs, loss_fn, batches = replay
    run = runs[0][0]
    counted = _Counted(run)

    class Tuner:
        config, tuning_iterations = SimpleNamespace(switch_iteration=2, patience=3), 12
        held_at: list[int] = []
        done = property(lambda _: bool(Tuner.held_at) and counted.steps >= 16 + 3)  # ends 3 steps into the hold

        def hold_checks(self) -> None:
            Tuner.held_at.append(counted.steps)

    with fast_forward(run.module):
        auto_warm_up(Tuner(), lambda steps, until: _burst(counted, run, loss_fn, batches, steps, 0, until))
    assert Tuner.held_at == [16, 19] and counted.steps == 19


def test_the_workers_fit_the_budget_again_after_start_up(world_of_one):
    """A replay on the testbed (``budget`` in its config): once start-up has measured a step (BERT-Large's on 8
    emulated hosts: 1.4 s alone, an all-reduce of every gradient 5.3 s), the workers cut what the user left at
    its default to fit 15 minutes, and the rows and rounds run the cut config; without a budget, nothing."""
    import dataclasses
    from types import SimpleNamespace

    from gradsched.cluster import Cluster
    from gradsched.commands.bench import DEFAULT_BUCKETS, entries
    from gradsched.jobs.budget import BENCH_TARGET_S, Given
    from gradsched.profile import Profile
    from gradsched.torch.jobs.bench_worker import _budget_after_startup

    import json

    root = Path(__file__).resolve().parents[2] / "benchmarks"
    first = json.loads((root / "results" / "emulate_papers_bert_large_8h.json").read_text())[0]
    profile = scale_profile(Profile.load(root / "profiles" / "bert-large-b32-10tflops.profile.json"), 16)
    start = SimpleNamespace(profile=profile, cluster=Cluster.from_dict(first["cluster"]), auto_warmups={},
                            probe={"compute_alone_s": 1.41, "allreduce_alone_s": 5.31})
    phases = SimpleNamespace(records=[{"phase": "profiling", "s": 14.0}, {"phase": "network table", "s": 35.0},
                                      {"phase": "probe", "s": 32.0}])
    rows = entries("ddp", DEFAULT_BUCKETS)
    cfg = dataclasses.replace(_cfg("mlp", 6, 0.01), entries=rows, steps=3,
                              budget=Given(steps=False, buckets=False, rounds=False).to_dict())
    fitted, trim = _budget_after_startup(cfg, start, phases)  # type: ignore[arg-type]
    assert trim is not None and trim.cut and trim.after_s <= BENCH_TARGET_S
    assert (fitted.rounds, fitted.steps, [e.label for e in fitted.entries]) == (
        trim.rounds, trim.steps, [e.label for e in trim.entries])
    assert fitted.rounds < 6 or len(fitted.entries) < len(rows)
    assert _budget_after_startup(dataclasses.replace(cfg, budget={}), start, phases) == (  # type: ignore[arg-type]
        dataclasses.replace(cfg, budget={}), None)
