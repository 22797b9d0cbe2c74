"""The worker behind ``gradsched bench``: every strategy, interleaved, in one set of processes.

Launched once per benchmark (one process per rank, by ``torch.distributed.run`` on
loopback or on the testbed's hosts)::

    python -m torch.distributed.run ... -m gradsched.torch.jobs.bench_worker CONFIG.json

What one job does, in order (every rank runs the same steps, so collectives match):

1. **Profile in situ**: every rank profiles its own copy of the model at once (the
   same CPU contention between ranks as in training, no communication); rank 0's
   profile is broadcast so that every rank plans from the same one.
2. **Network**: all-reduce timed on the live group from 4 KiB up to twice the
   model's gradient size (rounded up to a power of two), and reduce-scatter and all-gather
   where a row runs them (:func:`network_collectives`), fitted to a Cluster on rank 0
   and broadcast.
3. **Contention probe**: a training step alone and while a queue of all-reduces of
   all gradients keeps communication busy; one such all-reduce alone and while
   steps run back to back; a burst of small all-reduces alone and with compute
   busy; a copy of all gradients and a division of them, as a runtime's hooks do; the
   broadcast of the model's buffers that precedes every forward.
   :mod:`gradsched.torch.measure.probe` turns these into the simulator's contention
   figures (compute slowdown, communication slowdown, latency per operation), put
   into the cluster, so that the plans (``auto``) and the predictions account for
   CPU contention.  Then each runtime's own overhead per step, beyond what the
   simulator accounts for, on its simplest plan, and gradsched's host time per
   operation (:class:`_RuntimeOverheads`).
4. **Models**: one copy of the model per entry (strategy, or DDP with one
   ``bucket_cap_mb``), all from the same seed, each with its own optimizer.  gradsched
   wrappers and PyTorch DDP coexist on one process group: only one of them runs at a
   time and each waits for its own communication before the next one starts.
5. **Rounds**: in round ``r`` the entries run ``steps`` training steps each, in an
   order rotated by ``r`` so that slow phases of the machine hit all alike.  One more
   entry runs the same steps without moving gradients (:class:`_ComputeOnly`).  A burst
   starts behind a barrier (off the clock) and times steady-state steps only (see
   :func:`_burst`).  Rounds before ``warmup_rounds`` are not counted (DDP rebuilds
   its buckets there; caches warm up).  Between rounds, the contention probe and the
   network's latency-bound sizes are sampled again, within ``resample_share`` of the
   rounds' time (:class:`_Resampling`).
6. **Predictions**: each entry's plan simulated with the cluster of steps 2-3 (each
   figure the median over the start-up measurement and the samples between rounds) and
   the profile of step 1 scaled to the compute-only entry's median (the profile gives
   which layer costs what; the rounds give how long a step's compute takes now), plus
   the runtimes' own costs that the probe measured (:func:`with_runtime_costs`).
   Plans are made before the rounds, from the profile scaled to the probe's compute.

Rank 0 writes ``bench.json`` (see :func:`run_bench`) into ``out_dir``.

Where each step lives (imports run one way: worker -> autowarmup -> startup -> overheads/network -> rows):

- :mod:`gradsched.torch.jobs.bench_startup`: steps 1-3 in order (:func:`_start`), the profile (step 1) and
  what the start-up measured (:class:`_Start`);
- :mod:`gradsched.torch.jobs.bench_network`: the network table (step 2);
- :mod:`gradsched.torch.jobs.bench_overheads`: the contention probe's start-up figures, the runtimes' overhead
  probe and the samples between rounds (step 3);
- :mod:`gradsched.torch.jobs.bench_rows`: a row built and primed, the compute-only row, a row's prediction,
  bursts and rotated rounds (steps 4-6 and the overhead probe time rows with them);
- :mod:`gradsched.torch.jobs.bench_autowarmup`: run-time ``auto``'s warm-up, decided and run (step 4);
- here: the rows built (step 4), the budget fitted after start-up, the timed rounds (step 5), the result
  (step 6) and :func:`main`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from gradsched.constants import REPLAY_PREFIX
from gradsched.calibration import calibrate, lower_bound_s, phase_costs, runtime_name, this_machine, with_runtime_costs
from gradsched.jobs.bench import anchored_to_probe, probe_alone_s, with_phase_ratios, with_stream_cost
from gradsched.jobs.config import BenchConfig, BenchEntry
from gradsched.jobs.results import BenchResult, BenchRow, pooled_contention
from gradsched.jobs.rounds import RoundLoads, StoppingRule
from gradsched.jobs.startup import AUTO_WARMUP_PHASE, AutoWarmup
from gradsched.jobs.results import Contention as ProbeFigures  # the probe's figures
from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.torch.jobs.bench_autowarmup import _auto_warmup, auto_warm_up
from gradsched.torch.jobs.bench_network import _broadcast
from gradsched.torch.jobs.bench_overheads import _Resampling, _with_contention
from gradsched.torch.jobs.bench_rows import _build_entry, _burst, _ComputeOnly, _predict, _rotated_rounds
from gradsched.torch.jobs.bench_startup import _start, _Start
# moved out of this module, importable from here as before (tests import some of them from here)
from gradsched.torch.jobs.bench_network import QUEUE_DEPTH as QUEUE_DEPTH, network_collectives as network_collectives
from gradsched.torch.jobs.bench_overheads import (OVERHEAD_BUDGET_S as OVERHEAD_BUDGET_S, OVERHEAD_REPS as OVERHEAD_REPS,
                                                  _startup_probe as _startup_probe, update_call_s as update_call_s)
from gradsched.torch.jobs.bench_rows import (_EXPLICIT_CAP_NO_FIRST_BUCKET as _EXPLICIT_CAP_NO_FIRST_BUCKET,
                                             _ddp_cap_mb as _ddp_cap_mb, _fast_steps as _fast_steps,
                                             prime_steps as prime_steps)
from gradsched.torch.jobs.phases import Phases
from gradsched.torch.jobs.replay import fast_forward, restart_clocks
from gradsched.torch.jobs.shared_model import SharedModel
from gradsched.torch.jobs.worker import run_worker


def _build_rows(cfg: BenchConfig, start: _Start, shared: SharedModel, loss_fn: Any,
                batches: list[Any]) -> tuple[list[tuple[Any, Any]], float]:
    """Step 4: one row at a time, built, primed or warmed up, its buckets released before the next is built;
    the compute-only step last.  Returns the runs and the seconds of run-time ``auto``'s warm-up among them
    (its own phase, not start-up; in situ where it fits :data:`gradsched.jobs.startup.AUTO_WARMUP_S`, else
    ``auto`` is planned at start-up)."""
    runs, warmup_s = [], 0.0
    for entry in cfg.entries:
        warmup = start.auto_warmups.get(entry.label) or _auto_warmup(entry, cfg, start)  # decided with the budget
        if warmup is not None:
            start.auto_warmups[entry.label] = warmup
        model, opt = _build_entry(entry, cfg, with_runtime_costs(start.profile, start.probe, entry.torch_ddp),
                                  start.cluster, shared, (loss_fn, batches[0]), warmup)
        runs.append((model, opt))
        # Run-time ``auto`` (gradsched.torch.runtime.autotune) profiles itself under a safe default for its
        # first iterations, then switches plans: let it do so off the clock, so that the rounds
        # measure the plan it settled on; its drift checks are then held (bench_autowarmup.hold_checks):
        # a row is one plan's timing.
        tuner = getattr(model, "autotuner", None)
        if tuner is not None:
            t0 = time.perf_counter()
            auto_warm_up(tuner, lambda steps, until: _burst(model, opt, loss_fn, batches, steps, 0, until))
            warmup_s += time.perf_counter() - t0
    reference = _ComputeOnly(cfg, shared)
    runs.append((reference, reference))  # timed last in every round's rotation of the entries
    return runs, warmup_s


def _budget_after_startup(cfg: BenchConfig, start: _Start, phases: Phases) -> tuple[BenchConfig, Any]:
    """The bench fitted to its 15-minute budget again (:func:`gradsched.jobs.budget.after_startup`) with what the
    start-up measured: its phases so far, run-time ``auto``'s warm-up where it runs in situ (decided here, as
    :func:`_build_rows` builds it), and the probe's step and all-reduce of every gradient alone.  Where a budget
    applies (``cfg.budget``: a replay on the testbed); rank 0 decides, every rank follows.  Returns the config
    the rows and rounds run and the :class:`~gradsched.jobs.budget.Trim` (None: no budget)."""
    from gradsched.jobs import budget

    if not cfg.budget:
        return cfg, None
    for entry in cfg.entries:
        warmup = _auto_warmup(entry, cfg, start)
        if warmup is not None:
            start.auto_warmups[entry.label] = warmup
    probe, total = start.probe or {}, start.profile.total_bytes
    measured = budget.Measured(
        startup_s=sum(r["s"] for r in phases.records),
        warmup_s=sum(w.estimated_s for w in start.auto_warmups.values() if w.in_situ),
        compute_s=float(probe.get("compute_alone_s", start.profile.compute_s)),
        allreduce_s=float(probe.get("allreduce_alone_s", start.cluster.cost("allreduce").time_s(total))))
    out = budget.after_startup(cfg.entries, total, measured, budget.Given.from_dict(cfg.budget), steps=cfg.steps,
                               warmup_steps=cfg.warmup_steps, rounds=cfg.rounds, warmup_rounds=cfg.warmup_rounds,
                               min_rounds=cfg.min_rounds, share=cfg.resample_share) if dist.get_rank() == 0 else None
    out = _broadcast(out)
    if dist.get_rank() == 0:
        for line in budget.Given.from_dict(cfg.budget).lines(out):
            print(f"[bench] {line}", file=sys.stderr, flush=True)
    return dataclasses.replace(cfg, entries=out.entries, steps=out.steps, warmup_steps=out.warmup_steps,
                               rounds=out.rounds), out


def _timed_rounds(cfg: BenchConfig, runs: list[tuple[Any, Any]], loss_fn: Any, batches: list[Any],
                  samplers: _Resampling | None, loads: RoundLoads) -> tuple[list[list[list[float]]], dict[str, Any]]:
    """Step 5: every run's step times, per round, until ``--rounds`` or the stopping rule
    (:class:`gradsched.jobs.rounds.StoppingRule`, the same decision on every rank); and the rule's record.
    Rank 0 reads the machine's load as the rounds begin and after each (``loads``).
    A replay's warm-up rounds skip their compute (:func:`_warm_up_round`).  Rank 0 shows a progress bar."""
    labels = [e.label for e in cfg.entries] + [_ComputeOnly.label]
    bar = None
    if dist.get_rank() == 0 and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.rounds * len(runs) * cfg.steps, desc=f"bench {cfg.label or cfg.model} x{dist.get_world_size()}",
                   unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_burst(r: int, i: int) -> None:
        if bar is not None:
            bar.set_postfix_str(f"round {r + 1}/{cfg.rounds} {labels[i]}", refresh=False)
            bar.update(cfg.steps)

    rule = StoppingRule(cfg.round_tol, cfg.min_rounds, cfg.warmup_rounds)
    times: list[list[list[float]]] = [[] for _ in runs]
    if samplers is not None:
        samplers.start()
    root = dist.get_rank() == 0
    if root:
        loads.at_startup_end()
    for r in range(cfg.rounds):
        steps = cfg.warmup_steps or cfg.steps if r < cfg.warmup_rounds else cfg.steps  # fewer: gradsched.jobs.budget
        with _warm_up_round(runs, r < cfg.warmup_rounds and cfg.model.startswith(REPLAY_PREFIX)):
            step_s = _rotated_rounds(runs, loss_fn, batches, steps, 1, on_burst,
                                     samplers.after_round if samplers is not None else None, first=r)
        for run_times, new in zip(times, step_s.tolist()):
            run_times.append(new)
        if root:
            loads.after_round()
        settled = torch.tensor([1 if rule.settled(times) else 0])
        dist.broadcast(settled, 0)  # rank 0's decision: every rank stops at the same round
        if settled.item():
            break
    if bar is not None:
        bar.close()
    return times, rule.record(times, cfg.rounds)


@contextlib.contextmanager
def _warm_up_round(runs: list[tuple[Any, Any]], skip_compute: bool) -> Iterator[None]:
    """A replay's warm-up round (``skip_compute``): its rows' replayed compute takes no time
    (:func:`fast_forward`: nothing reads those steps' times, DDP's buckets and the caches warm up all the
    same), but a row that tunes itself at run time (in-situ ``auto``, whose tuner reads them); every clock
    restarts after it.  Else as it is."""
    if not skip_compute:
        yield
        return
    modules = [getattr(model, "module", model) for model, _ in runs if getattr(model, "autotuner", None) is None]
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(fast_forward(module))
        yield
    for module in modules:
        restart_clocks(module)


def _pooled(start: _Start, cfg: BenchConfig) -> tuple[ProbeFigures | None, Cluster]:
    """Rank 0, after the rounds: the probe's figures and the cluster from the medians over every sample,
    start-up and between rounds (the predictions use them; the all-reduce's anchor their least where ranks
    outnumber cores: ``probe_alone_s``), pooled with earlier jobs' figures."""
    probe, samplers = start.probe, start.samplers
    if samplers is None or probe is None:
        return probe, start.cluster
    assert start.network is not None and start.contention is not None and start.overheads is not None
    network = start.network.pooled()
    alone_s = probe_alone_s(start.contention.samples["allreduce_alone_s"], network.world_size, os.cpu_count() or 1)
    pooled, anchor = anchored_to_probe(network, start.contention.total_bytes, alone_s)
    pooled = with_phase_ratios(with_stream_cost(pooled, start.contention.total_bytes, alone_s, os.cpu_count() or 1))
    probe = {**probe, **start.contention.figures(pooled.cost("allreduce"), phase_costs(pooled)),
             "allreduce_anchor": anchor,
             "startup_fitted": probe["fitted"],
             "startup_runtime_overhead_s": probe["runtime_overhead_s"], "startup_op_host": probe["op_host"],
             "op_host": start.overheads.op_host(), "op_host_samples": start.overheads.host,
             "resamples": samplers.taken[1], "resample_s": samplers.spent_s,  # the contention probe's samples
             "resamples_each": dict(zip(("network", "contention", "overheads"), samplers.taken))}
    if start.history:  # what the predictions use; this job's own beside it, for later jobs to pool
        probe.update(own_fitted=probe["fitted"], history=start.history,
                     fitted=pooled_contention(probe["fitted"], cfg.contention_history, cfg.dilate))
    cluster = _with_contention(pooled, probe["fitted"])
    probe["runtime_overhead_s"] = start.overheads.figures(start.profile, cluster, probe)
    return probe, cluster


def _counted(rounds: list[list[float]], warm: int) -> list[float]:
    """Every counted step's seconds (all of them where no round is counted)."""
    return [s for steps in (rounds[warm:] or rounds) for s in steps]


def _row(entry: BenchEntry, run: tuple[Any, Any], rounds: list[list[float]], cfg: BenchConfig,
         predicted: tuple[Plan, float], bound: dict[str, float], warmup: AutoWarmup | None = None) -> BenchRow:
    """One entry's figures (the speed-ups are added once every row is known); ``rounds``: per round, per step."""
    plan, predicted_s = predicted
    warm = cfg.warmup_rounds
    counted = _counted(rounds, warm)
    median = statistics.median(counted)
    row: BenchRow = {
        "strategy": entry.label,
        "runs": "torch FSDP2" if entry.fsdp2 else runtime_name(entry.torch_ddp),
        "iteration_s_median": median, "iteration_s_mean": statistics.fmean(counted),
        "predicted_iteration_s": predicted_s, "prediction_error": (predicted_s - median) / median,
        "lower_bound_s": bound["lower_bound_s"], "vs_lower_bound": median / bound["lower_bound_s"],
        "contention_bound_s": bound["contention_bound_s"],
        "vs_contention_bound": median / bound["contention_bound_s"],
        "operations": len(plan.operations), "plan_hash": plan.hash,
        "step_s": rounds, "warmup_rounds": warm}
    if entry.torch_ddp:
        row["bucket_cap_mb"] = (entry.ddp_kwargs or {}).get("bucket_cap_mb", 25.0)
    else:
        row["plan_options"] = plan.options  # type: ignore[typeddict-item]
    tuner = getattr(run[0], "autotuner", None)
    if tuner is not None:
        row["autotune"] = tuner.summary()  # type: ignore[typeddict-item]
    if warmup is not None:
        row["auto_warmup"] = warmup.to_dict()  # type: ignore[typeddict-item]
    return row


def _with_speedups(rows: list[BenchRow]) -> str | None:
    """Each row's speed-up over PyTorch DDP's default and its best bucket size; returns the best's name."""
    ref = next((r["iteration_s_median"] for r in rows if r["strategy"] == "ddp"), None)
    ddp_rows = [r for r in rows if r["runs"] == "torch DDP"]
    best = min(ddp_rows, key=lambda r: r["iteration_s_median"]) if ddp_rows else None
    for row in rows:
        row["speedup_vs_ddp"] = ref / row["iteration_s_median"] if ref else None
        row["speedup_vs_best_ddp"] = best["iteration_s_median"] / row["iteration_s_median"] if best else None
    return best["strategy"] if best else None


def _result(cfg: BenchConfig, start: _Start, runs: list[tuple[Any, Any]], times: list[list[list[float]]],
            phases: Phases) -> BenchResult:
    """Step 6, rank 0: predictions, the bound and every row, in run seconds (the command converts)."""
    probe, cluster = _pooled(start, cfg)
    ref_steps = times[-1]
    compute_only_s = statistics.median(_counted(ref_steps, cfg.warmup_rounds))
    planned_with = start.profile
    profile = calibrate(planned_with, compute_only_s)  # predictions and the bound: the compute of the rounds
    bound = lower_bound_s(profile, cluster)
    rows = [_row(entry, runs[i], times[i], cfg,
                 _predict(entry, runs[i][0], with_runtime_costs(profile, probe, entry.torch_ddp), cluster,
                          planned_with), bound, start.auto_warmups.get(entry.label))
            for i, entry in enumerate(cfg.entries)]
    best_ddp = _with_speedups(rows)
    return {"rows": rows, "profile": {"compute_s": profile.compute_s, "forward_s": profile.forward_s,
                                      "backward_s": profile.backward_s, "other_s": profile.other_s,
                                      "total_bytes": profile.total_bytes, "tensors": profile.num_tensors,
                                      "hooked_compute_s": start.hooked.compute_s,
                                      "planned_compute_s": planned_with.compute_s, "measured": profile.to_dict()},
            "compute_only": {"iteration_s_median": compute_only_s,
                             "step_s": ref_steps},
            "cluster": cluster.to_dict(), "lower_bound": bound, "contention": probe,  # type: ignore[typeddict-item]
            "best_ddp": best_ddp, "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "machine": f"{this_machine()}, torch {torch.__version__}",
            "peak_rss_bytes": phases.records[-1]["peak_rss_bytes"], "phases": phases.records,
            "job_s": 0.0}


def run_bench(cfg: BenchConfig) -> BenchResult | None:
    """The whole job on this rank (``cfg``: the config.json ``gradsched bench`` wrote); rank 0
    returns the result in run seconds, the others None."""
    if not isinstance(cfg, BenchConfig):  # the raw JSON, as before
        cfg = BenchConfig.from_dict(cfg)
    t_start = time.time()
    phases = Phases()
    shared = SharedModel(cfg.model, cfg.seed)  # the rank's one model: every row shares its parameters
    start = _start(cfg, shared, phases)
    cfg, trimmed = _budget_after_startup(cfg, start, phases)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + dist.get_rank())
    batches = [shared.spec.make_batch(cfg.batch_size, gen) for _ in range(4)]
    runs, warmup_s = _build_rows(cfg, start, shared, shared.spec.loss_fn, batches)
    if start.auto_warmups:  # the same on every rank (a collective): auto's rows are everyone's
        phases.end_apart("rows (built, primed)", AUTO_WARMUP_PHASE, warmup_s)
    else:
        phases.end("rows (built, primed)")
    loads = RoundLoads()
    times, stopping = _timed_rounds(cfg, runs, shared.spec.loss_fn, batches, start.samplers, loads)
    phases.end("rounds")  # its peak RSS is the largest rank's over the whole job: what check_memory allows for
    if dist.get_rank() != 0:
        return None
    result = _result(cfg, start, runs, times, phases)
    result["stopping"] = stopping  # type: ignore[typeddict-item]
    result["load"] = loads.record(dist.get_world_size(), os.cpu_count() or 1)  # type: ignore[typeddict-item]
    if trimmed is not None:  # what the rows and rounds ran, fitted after start-up
        result["trimmed"] = {**trimmed.to_dict(), "at": "start-up"}  # type: ignore[typeddict-item]
    result["job_s"] = time.time() - t_start
    return result


def main(argv: list[str] | None = None) -> int:
    return run_worker(BenchConfig.from_dict, run_bench, "bench.json", argv)


if __name__ == "__main__":
    from gradsched.torch.runtime.shutdown import leave

    leave(main())  # skip interpreter finalisation: see gradsched.torch.runtime.shutdown
