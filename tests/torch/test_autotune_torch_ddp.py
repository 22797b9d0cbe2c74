"""Run-time auto with PyTorch's own DDP among its candidates (issue 16, item 5).

Which plan wins is made deterministic with an injected clock: at the start of every
iteration run under a plan the test calls slow, the tracer's clock (which times the
iterations and stamps every event) jumps ahead by :data:`PENALTY_S`, far more than
any real iteration of these small models takes, even on a loaded machine.  The order
of the trials is checked from the switches the tuner records (iterations known in
advance), not from timings.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.runtime.autotune import AutoTuneConfig  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from gradsched.advise import best_ddp_bucket_mb  # noqa: E402
from gradsched.bundled import bundled_cluster  # noqa: E402
from gradsched.torch.runtime.planning import profile_from_module  # noqa: E402
from helpers import train  # noqa: E402
from gradsched.torch.runtime.torch_ddp import (TORCH_DDP, TorchDDPPool, candidate_plan, is_torch_ddp,  # noqa: E402
                                               one_bucket_mb)

PENALTY_S = 10.0  # what a slow plan's iteration takes on the injected clock, beyond its real time
OPTIONS = {"switch_iteration": 3, "trials": 2, "trial_iterations": 2, "trial_rounds": 2, "trial_window_s": 0,
           "min_gain": 0, "patience": 3, "max_replans": 1, "runoff_rounds": 0,
           "trial_share": 0}  # back to back at iterations fixed in advance (test_autotune_budget.py: within a share)
TOLERANCE = 1e-5


def slow_down(model: Any, slow: Callable[[Any], bool]) -> None:
    """Inject the clock: every iteration run under a plan for which ``slow(plan)`` holds takes PENALTY_S more."""
    delay(model, lambda plan: PENALTY_S if slow(plan) else 0.0)


def delay(model: Any, seconds: Callable[[Any], float]) -> None:
    """Inject the clock: every iteration run under ``plan`` takes ``seconds(plan)`` more."""
    tuner, tracer = model.autotuner, model._tracer
    start = tuner.on_iteration_start

    def on_iteration_start() -> None:
        tracer.epoch -= seconds(model.plan)  # the plan that ran the iteration ending now; the clock jumps ahead
        start()

    tuner.on_iteration_start = on_iteration_start


def _net() -> nn.Module:
    """2.1 MB of gradients: more than DDP's first bucket (1 MiB), so bucket sizes make different plans."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 512), nn.Linear(512, 512),
                         nn.Linear(512, 2))


def _train(model: nn.Module, rank: int, world: int, steps: int) -> None:
    """A plain torch optimizer on the wrapped model's parameters, as a DDP script has it."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    train(model, opt, _inputs, lambda out, _: out.square().mean(), rank=rank, world=world, steps=steps, sched=sched)


def _inputs(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=gen)
    return x, x  # the loss reads the output only


def _state(module: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]


# --------------------------------------------------------------------------- one rank, in this process
def _tuned(slow: Callable[[Any], bool]) -> tuple[Any, list[torch.Tensor]]:
    """Auto (PyTorch's DDP at 0.01 MiB, the user's size, and at the advised one) long enough that a check
    would come after the trials; and the same training without any wrapper (one rank: the same numbers)."""
    module = _net()
    model = DistributedDataParallel(module, "auto", plan_options=OPTIONS, bucket_cap_mb=0.01)
    slow_down(model, slow)
    _train(model, 0, 1, model.autotuner.config.tuning_iterations)
    plain = _net()
    _train(plain, 0, 1, model.autotuner.config.tuning_iterations)
    assert rel_diff(_state(module), _state(plain)) <= TOLERANCE
    return model, _state(module)


def _turns(tuner: Any) -> tuple[list[str], list[Any]]:
    """The candidates' order in the first round, and every switch of the trials."""
    trials = [s for s in tuner.switches if s.reason in ("profiled", "trial")]
    n = (len(trials) + 1) // 2
    return [s.plan_hash for s in trials[:n]], trials


def test_trials_take_turns_with_pytorch_ddp_and_settle_on_it_when_it_is_fastest(world_of_one):
    model, _ = _tuned(lambda plan: not is_torch_ddp(plan))
    tuner = model.autotuner
    turn, trials = _turns(tuner)
    # each candidate runs one window (1 iteration + 1 for the switch) per round, 2 rounds, in the same order
    assert [s.iteration for s in trials] == [3 + 2 * k for k in range(len(trials))]
    assert len(trials) == 2 * len(turn) and [s.plan_hash for s in trials[len(turn):]] == turn
    ddps = {h: tuner._tried[h][1].options["bucket_cap_mb"] for h in turn if tuner._tried[h][0] == TORCH_DDP}
    # at the user's size, at the advised one and as one bucket (one candidate per set of buckets)
    sizes = (0.01, best_ddp_bucket_mb(tuner.profile, tuner.cluster), one_bucket_mb(tuner.profile))
    assert set(ddps) == {candidate_plan(tuner.profile, tuner.cluster, mb).hash for mb in sizes}
    assert len(ddps) >= 2 and max(ddps.values()) == one_bucket_mb(tuner.profile) == 3  # 2.1 MB in one bucket
    assert len(candidate_plan(tuner.profile, tuner.cluster, one_bucket_mb(tuner.profile)).operations) == 1
    assert tuner.switches[0].plan_hash in turn  # the initial plan competes too
    # DDP won: it runs now, through PyTorch's wrapper, and nothing else is kept
    assert is_torch_ddp(model.plan) and model.plan.hash in ddps and model._executor is None and model._ddp is not None
    assert tuner.switches[-1].reason in ("fastest", "trial")
    assert model._ddp_pool.constructions == len(ddps)  # built once each, reused in the second round
    assert model._ddp_pool.kept_mb == [ddps[model.plan.hash]]
    # no checks on DDP: nothing to re-plan from, no broadcasts left (a check would have come patience + 1 after)
    assert tuner.checks == [] and tuner._next_check is None and tuner.done
    # and nothing of the tuner's per-iteration bookkeeping runs any more: PyTorch's DDP alone, at DDP's cost
    settled = tuner.iteration
    _train(model, 0, 1, 3)
    assert tuner.iteration == settled and model._settled_on_torch_ddp()
    # nor does anything pile up: gradsched's optimizer records no update that nothing would trim
    events = len(model._tracer.events)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 8)).square().mean().backward()
        opt.step()
    assert len(model._tracer.events) == events


@pytest.mark.parametrize("set_to_none", [True, False])
def test_kept_ddps_hold_no_buckets_while_another_plan_runs(world_of_one, set_to_none):
    """With ``gradient_as_bucket_view`` (``gradsched bench``'s rows), a PyTorch DDP kept for the trials' later
    windows holds no buckets while another candidate runs (TorchDDPPool.park), and the numbers stay those of plain
    training.  Where ``.grad`` still shows its buckets (zeroed, not set to None) they are kept: the next backward
    adds to them."""
    module = _net()
    model = DistributedDataParallel(module, "auto", plan_options={**OPTIONS, "max_replans": 0}, bucket_cap_mb=0.01,
                                    gradient_as_bucket_view=True)
    slow_down(model, lambda plan: not is_torch_ddp(plan))
    seen: dict[float, list[Any]] = {}  # per DDP: the storages behind .grad after its latest iteration
    held: list[int] = []  # per iteration while a DDP seen earlier is not running: the bytes those DDPs hold

    def after_step(_step: int, _x: torch.Tensor) -> None:
        running = model.plan.options["bucket_cap_mb"] if is_torch_ddp(model.plan) else None
        if running is not None:  # its buckets, as .grad shows them
            seen[running] = list({s.data_ptr(): s for s in (p.grad.untyped_storage() for p in module.parameters())
                                  }.values())
        if set(seen) - {running}:
            held.append(sum(s.nbytes() for cap, storages in seen.items() if cap != running for s in storages))

    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    zero = opt.zero_grad
    opt.zero_grad = lambda set_to_none=set_to_none: zero(set_to_none=set_to_none)  # type: ignore[method-assign]
    steps = model.autotuner.config.tuning_iterations
    train(model, opt, _inputs, lambda out, _: out.square().mean(), steps=steps, after_step=after_step)
    plain = _net()
    train(plain, torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9), _inputs, lambda out, _: out.square().mean(),
          steps=steps)
    assert rel_diff(_state(module), _state(plain)) <= TOLERANCE
    assert len(seen) >= 2 and len(held) >= 4  # DDPs at 2 or 3 sizes took turns with the executor's plans
    if set_to_none:
        assert max(held) == 0, held  # was the model's 2.1 MB per DDP kept
    else:
        assert min(held) > 0  # .grad showed them: kept


def test_the_users_unset_bucket_size_runs_as_pytorchs_default_and_a_given_one_caps_the_first_bucket(world_of_one):
    """The candidate for the user's size is the DDP the user's script builds: without ``bucket_cap_mb``
    PyTorch's first bucket is 1 MiB; a size given (the advised one, one bucket) caps the first bucket too."""
    module = _net()
    pool = TorchDDPPool(module, dist.group.WORLD, {}, False, False)
    default, given = pool.get(25.0, default=True), pool.get(5.0)
    assert default.bucket_bytes_cap_default and default.bucket_bytes_cap == 25 * 2**20
    assert not given.bucket_bytes_cap_default and given.bucket_bytes_cap == 5 * 2**20
    profile, cluster = profile_from_module(module), bundled_cluster()
    buckets = [4 * op.numel() for op in candidate_plan(profile, cluster, 25.0, default=True).operations]
    assert len(buckets) == 2 and buckets[0] < 1.01 * 2**20 < sum(buckets)  # about 1 MiB first, then the rest
    assert len(candidate_plan(profile, cluster, 25.0).operations) == 1  # given: the first bucket holds 25 MiB too


def test_capped_trials_keep_the_plan_chosen_the_baseline_and_the_fastest_predicted(world_of_one):
    """A replay's short warm-up (``candidates``, gradsched.jobs.startup.SHORT_WARMUP) started on DDP's buckets at
    the user's size (``initial="ddp"``, gradsched.jobs.startup.replay_start): profiling runs them on the executor
    (every gradient's ready time stamped), then only ``candidates`` plans take turns: the plan chosen, PyTorch's
    DDP at the user's size and the others predicted fastest; the numbers stay those of plain training."""
    module = _net()
    cap = {"bucket_cap_mb": 0.01, "first_bucket_mb": 0.01}
    opts = {**OPTIONS, "max_replans": 0, "candidates": 3, "initial": "ddp", "initial_options": cap}
    model = DistributedDataParallel(module, "auto", plan_options=opts, bucket_cap_mb=0.01)
    tuner = model.autotuner
    assert tuner.switches[0].strategy == "ddp" and not is_torch_ddp(model.plan) and model._executor is not None
    slow_down(model, lambda plan: not is_torch_ddp(plan))
    _train(model, 0, 1, tuner.config.tuning_iterations)
    plain = _net()
    _train(plain, 0, 1, tuner.config.tuning_iterations)
    assert rel_diff(_state(module), _state(plain)) <= TOLERANCE
    assert tuner.profile is not None and tuner.profile.extra["method"] == "in-situ"  # profiled under DDP's buckets
    turn, _ = _turns(tuner)
    baseline = candidate_plan(tuner.profile, tuner.cluster, 0.01).hash
    assert len(turn) == 3 and turn[0] == next(s for s in tuner.switches if s.reason == "profiled").plan_hash
    assert baseline in turn and tuner.trials_done and is_torch_ddp(model.plan)
    left_out = [h for h in tuner._tried if h not in turn and tuner._tried[h][3] is not None]
    third = next(h for h in turn if h not in (turn[0], baseline))
    assert left_out and all(tuner._tried[third][3] <= tuner._tried[h][3] for h in left_out)


def test_short_iterations_get_longer_trial_windows_on_rank_0s_word(world_of_one):
    """trial_window_s: the first plan sets the windows' length from the iteration time it measured."""
    module = _net()
    # On the injected clock every iteration takes 10 s more than its real time (a few ms here, more under
    # load): 200 s of window make about 20 iterations (above 14 while a real step takes under 4 s: a loaded
    # machine's stalls stay far below the injected time)
    model = DistributedDataParallel(module, "auto", plan_options={**OPTIONS, "trial_window_s": 200.0})
    tuner = model.autotuner
    delay(model, lambda plan: 10.0)
    _train(model, 0, 1, OPTIONS["switch_iteration"] + 1)
    profiled = tuner.switches[1]
    assert profiled.reason == "profiled"
    window = tuner.config.window_for(profiled.measured_before_s)
    assert 10.0 <= profiled.measured_before_s < 200.0 / 14  # the injected 10 s, and the step's real time
    assert tuner.trial_window == window > tuner.config.trial_window  # 10 s a step: 200 s take more
    _train(model, 0, 1, tuner.tuning_iterations - OPTIONS["switch_iteration"] - 1)
    trials = [s.iteration for s in tuner.switches if s.reason == "trial"]
    assert trials and all(b - a == window + 1 for a, b in zip([profiled.iteration, *trials], trials))
    assert tuner.trials_done
    # every iteration of every window counts, however long the window (they were cut to the last 12 once)
    assert window > 14
    kept = tuner.trial_decision["kept"]
    assert all(len(samples) == OPTIONS["trial_rounds"] * window
               for h, samples in tuner.measurements.samples.items() if h != kept)


@pytest.mark.parametrize("resize_min_gain, kept", [(0.01, "one bucket"), (0.03, "user's")])
def test_ddp_at_another_bucket_size_replaces_the_users_when_it_beats_it_by_the_smaller_gain(world_of_one,
                                                                                            resize_min_gain, kept):
    """One bucket 2% faster than the user's DDP in every round: kept under resize_min_gain 1% (nothing but the
    buckets differs), not under 3%; gradsched's plans, much slower, are never kept.  The two are within
    runoff_margin of each other: after the rounds, they alone take runoff_rounds more turns."""
    module = _net()
    options = {**OPTIONS, "min_gain": 0.03, "resize_min_gain": resize_min_gain, "runoff_rounds": 2}
    model = DistributedDataParallel(module, "auto", plan_options=options, bucket_cap_mb=0.01)
    one = one_bucket_mb(profile_from_module(module))  # 3 MiB: 2.1 MB of gradients

    def seconds(plan: Any) -> float:
        if not is_torch_ddp(plan):
            return 2 * PENALTY_S
        return {0.01: PENALTY_S, one: 0.98 * PENALTY_S}.get(plan.options["bucket_cap_mb"], 1.5 * PENALTY_S)

    delay(model, seconds)
    _train(model, 0, 1, model.autotuner.config.tuning_iterations)
    assert is_torch_ddp(model.plan) and model.autotuner.trials_done
    assert model.plan.options["bucket_cap_mb"] == (one if kept == "one bucket" else 0.01)
    tuner = model.autotuner
    decision = tuner.trial_decision
    assert decision["plans"][decision["kept"]] == f"{TORCH_DDP} {model.plan.options['bucket_cap_mb']:g} MB"
    # the run-off: one bucket (the fastest) and the user's DDP (the baseline), in turns, two more rounds
    runoff = decision["runoff"]
    assert [decision["plans"][h] for h in runoff] == [f"{TORCH_DDP} {one:g} MB", f"{TORCH_DDP} 0.01 MB"]
    trials = [s.plan_hash for s in tuner.switches if s.reason == "trial"]
    assert trials[-4:] == runoff * 2 and runoff[1] == decision["baseline"] and runoff[0] in decision["resized"]
    rounds = decision["rounds"]
    assert len(rounds[runoff[0]]) == len(rounds[runoff[1]]) == OPTIONS["trial_rounds"] + 2
    assert all(len(r) == OPTIONS["trial_rounds"] for h, r in rounds.items() if h not in runoff)


def test_a_faster_plan_replaces_pytorch_ddp_and_its_wrappers_are_dropped(world_of_one):
    model, _ = _tuned(is_torch_ddp)
    tuner = model.autotuner
    turn, _ = _turns(tuner)
    assert any(tuner._tried[h][0] == TORCH_DDP for h in turn)
    assert not is_torch_ddp(model.plan) and model._ddp is None and model._executor is not None
    assert model._ddp_pool.kept_mb == [] and TORCH_DDP in tuner.rejected


# --------------------------------------------------------------------------- two ranks
def _job(rank: int, world: int) -> dict:
    steps = AutoTuneConfig.from_options(OPTIONS).tuning_iterations
    reference = _net()
    _train(torch.nn.parallel.DistributedDataParallel(reference), rank, world, steps)
    module = _net()
    # the plans take turns (PyTorch's DDP into and out of), then DDP wins: ranks switch on rank 0's word
    model = DistributedDataParallel(module, plan_options=OPTIONS)  # the drop-in's default: auto
    slow_down(model, lambda plan: not is_torch_ddp(plan))
    _train(model, rank, world, steps)
    return {"reference": _state(reference), "state": _state(module), "torch_ddp": is_torch_ddp(model.plan),
            "params": [p.detach().clone() for p in module.parameters()],
            "switches": [(s.iteration, s.plan_hash, s.strategy) for s in model.autotuner.switches]}


@pytest.mark.slow
def test_switching_into_and_out_of_pytorch_ddp_keeps_ddps_numbers_on_every_rank():
    a, b = spawn_local(_job, 2, timeout_s=60)
    assert a["switches"] == b["switches"] and a["torch_ddp"] and b["torch_ddp"]
    ran = [s[2] for s in a["switches"]]
    assert ran[0] == "ddp"  # the default profiles under DDP's buckets on the executor
    first = ran.index(TORCH_DDP)
    assert any(r != TORCH_DDP for r in ran[first + 1:])  # out of PyTorch's DDP, and back in at the end
    for r in (a, b):  # parameters and BatchNorm statistics (rank 0's before every forward, either way) as DDP's
        assert rel_diff(r["state"], r["reference"]) <= TOLERANCE
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))  # buffers: each rank's last batch


def test_a_byte_scaled_stand_in_tries_the_advisors_ddp_sizes_divided(world_of_one):
    """``byte_scale`` S (``gradsched bench --scale-bytes S``: the model is 1/S of the one emulated): the PyTorch DDP
    advised for the trials is the advisor's pick among its bucket sizes / S, as it would be for the model emulated."""
    from gradsched.advise import BUCKETS_MB

    module = _net()
    model = DistributedDataParallel(module, "auto", plan_options={**OPTIONS, "byte_scale": 16}, bucket_cap_mb=0.01)
    profile, cluster = profile_from_module(module), bundled_cluster()
    caps = [r.plan.options["bucket_cap_mb"] for r in model.autotuner._torch_ddp_trials(profile, cluster)]
    advised = best_ddp_bucket_mb(profile, cluster, tuple(mb / 16 for mb in BUCKETS_MB))
    assert caps[:2] == [0.01, advised] and advised * 16 in BUCKETS_MB and advised not in BUCKETS_MB
