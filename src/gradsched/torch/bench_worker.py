"""The worker behind ``gradsched bench``: every strategy, interleaved, in one set of processes.

Launched once per benchmark (one process per rank, by ``torch.distributed.run`` on
loopback or on the testbed's hosts)::

    python -m torch.distributed.run ... -m gradsched.torch.bench_worker CONFIG.json

What one job does, in order (every rank runs the same steps, so collectives match):

1. **Profile in situ**: every rank profiles its own copy of the model at once (the
   same CPU contention between ranks as in training, no communication); rank 0's
   profile is broadcast so that every rank plans from the same one.
2. **Network**: all-reduce timed on the live group from 4 KiB up to the model's
   gradient size (rounded up to a power of two), fitted to a Cluster on rank 0 and
   broadcast.
3. **Contention probe**: forward+backward alone, an all-reduce of all gradients alone,
   and both at once; the two slowdowns of the simulator's contention model (compute
   while a collective runs, a collective while compute runs) are solved exactly from
   these four times (:func:`fit_contention`) and put into the cluster, so that the
   plans (``auto``) and the predictions account for CPU contention.
4. **Models**: one copy of the model per entry (strategy, or DDP with one
   ``bucket_cap_mb``), all from the same seed, each with its own optimizer.  gradsched
   wrappers and PyTorch DDP coexist on one process group: only one of them runs at a
   time and each waits for its own communication before the next one starts.
5. **Rounds**: in round ``r`` the entries run ``steps`` training steps each, in an
   order rotated by ``r`` so that slow phases of the machine hit all alike.  A burst
   starts behind a barrier (off the clock) and its last step ends when all its
   communication and deferred updates are done.  Rounds before ``warmup_rounds``
   are not counted (DDP rebuilds its buckets there; caches warm up).
6. **Predictions**: each entry's plan simulated with the profile and cluster of
   steps 1-2.

Rank 0 writes ``bench.json`` (see :func:`run_bench`) into ``out_dir``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from gradsched.cluster import Cluster
from gradsched.commands.bench import lower_bound_s
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.torch.models import build_model
from gradsched.torch.optim import DistributedOptimizer
from gradsched.torch.worker import run_worker
from gradsched.torch.wrapper import DistributedDataParallel

MiB = 1 << 20


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _measure_profile(cfg: dict[str, Any]) -> Profile:
    from gradsched.torch.profiler import profile_module

    spec = build_model(cfg["model"], seed=cfg["seed"])
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + 999)
    batch = spec.make_batch(cfg["batch_size"], gen)
    dist.barrier()
    prof = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=cfg["profile_iterations"],
                          warmup=1, model_name=cfg["model"])
    dist.barrier()
    return _broadcast(prof)


def _measure_cluster(total_bytes: int, cfg: dict[str, Any]) -> Cluster:
    from gradsched.torch.netbench import benchmark

    top = 1 << max(12, math.ceil(math.log2(max(total_bytes, 4096))))
    cluster = benchmark(min_bytes=4096, max_bytes=top, reps=cfg["net_reps"], warmup=1, collectives=["allreduce"])
    return _broadcast(cluster)


def _contention_probe(cfg: dict[str, Any], total_bytes: int, reps: int = 3) -> dict[str, float]:
    """Medians of compute alone, all-reduce alone, and both overlapped (see module docstring)."""
    spec = build_model(cfg["model"], seed=cfg["seed"])
    module = spec.module
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + 998)
    x, y = spec.make_batch(cfg["batch_size"], gen)
    buf = torch.ones(max(1, total_bytes // 4))

    def compute() -> None:
        module.zero_grad(set_to_none=True)
        spec.loss_fn(module(x), y).backward()

    compute()  # warm-up
    alone_c, alone_n, both_c, both_n = [], [], [], []
    done_at: list[float] = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        compute()
        alone_c.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        alone_n.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        done_at.clear()
        work = dist.all_reduce(buf, async_op=True)
        # stamped on gloo's thread the moment the all-reduce completes, even if that is
        # while compute is still running (work.wait() below would only see it after)
        work.get_future().add_done_callback(lambda _f: done_at.append(time.perf_counter()))
        compute()
        both_c.append(time.perf_counter() - t0)
        work.wait()
        while not done_at:  # the callback may run just after wait() returns
            time.sleep(1e-4)
        both_n.append(done_at[0] - t0)
    med = statistics.median
    out = torch.tensor([med(alone_c), med(alone_n), med(both_c), med(both_n)], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)  # the slowest rank's, as a collective ends with it
    c, n, bc, bn = out.tolist()
    return {"compute_alone_s": c, "allreduce_alone_s": n, "compute_overlapped_s": bc, "allreduce_overlapped_s": bn,
            "compute_slowdown": bc / c, "allreduce_slowdown": bn / n, "allreduce_bytes": total_bytes,
            "fitted": fit_contention(c, n, bc, bn)}


def fit_contention(compute_s: float, comm_s: float, compute_both_s: float, comm_both_s: float) -> dict[str, float]:
    """The simulator's two slowdowns, solved exactly from one overlapped run.

    Both start at 0; compute needs ``compute_s`` of work, the all-reduce ``comm_s``.  In
    the fluid model, while both run, compute advances at ``1/(1+kc)`` and the
    all-reduce at ``1/(1+kn)``; whichever ends first (at ``t1``) was slowed all along,
    so its factor is ``t1 / alone``; the other did ``t1 / (1+k)`` of its work by then
    and the rest at full speed, so ``1 + k = t1 / (alone - (t2 - t1))``."""
    def other(t1: float, t2: float, alone: float) -> float:
        left_alone = alone - (t2 - t1)  # work done while overlapped, at full speed
        return max(0.0, t1 / left_alone - 1.0) if left_alone > 0 else 0.0

    if comm_both_s <= compute_both_s:  # the all-reduce ended first
        kn = max(0.0, comm_both_s / comm_s - 1.0)
        kc = other(comm_both_s, compute_both_s, compute_s)
    else:
        kc = max(0.0, compute_both_s / compute_s - 1.0)
        kn = other(compute_both_s, comm_both_s, comm_s)
    return {"compute_slowdown": kc, "comm_slowdown": kn}


def _build_entry(entry: dict[str, Any], cfg: dict[str, Any], profile: Profile, cluster: Cluster) -> tuple[Any, Any]:
    spec = build_model(cfg["model"], seed=cfg["seed"])
    if entry["torch_ddp"]:
        model = DistributedDataParallel(spec.module, "ddp", profile=profile, cluster=cluster,
                                        timeout_s=cfg["timeout_s"], ddp_kwargs=entry.get("ddp_kwargs") or None)
    else:
        model = DistributedDataParallel(spec.module, entry["strategy"], profile=profile, cluster=cluster,
                                        plan_options=entry.get("options") or None, timeout_s=cfg["timeout_s"],
                                        use_torch_ddp=False)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9), model)
    return model, opt


def _predict(entry: dict[str, Any], model: Any, profile: Profile, cluster: Cluster) -> tuple[Plan, float]:
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    if entry["torch_ddp"]:
        kw = entry.get("ddp_kwargs") or {}
        plan = make_plan("ddp", profile, cluster, bucket_cap_mb=float(kw.get("bucket_cap_mb", 25.0)))
    else:
        plan = model.plan
    return plan, simulate(plan, profile, cluster, timeline=False).iteration_s


def _burst(model: Any, opt: Any, spec_loss: Any, batches: list[Any], steps: int, offset: int) -> list[float]:
    """``steps`` training steps; per-step seconds (start to next start; the last ends when all is settled)."""
    dist.barrier()
    starts = []
    for k in range(steps):
        starts.append(time.perf_counter())
        x, y = batches[(offset + k) % len(batches)]
        opt.zero_grad()
        spec_loss(model(x), y).backward()
        opt.step()
    model.synchronize()
    starts.append(time.perf_counter())
    return [b - a for a, b in zip(starts, starts[1:])]


def run_bench(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The whole job on this rank; rank 0 returns the result (``rows`` + run facts), others None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t_start = time.time()
    profile = _measure_profile(cfg)
    cluster = _measure_cluster(profile.total_bytes, cfg)
    probe = _contention_probe(cfg, profile.total_bytes) if cfg.get("probe", True) else None
    if probe is not None:
        cluster = dataclasses.replace(cluster, extra={**cluster.extra, "contention": probe["fitted"]})

    entries = cfg["entries"]
    models = []
    for entry in entries:
        models.append(_build_entry(entry, cfg, profile, cluster))
    spec = build_model(cfg["model"], seed=cfg["seed"])  # for its batch maker and loss only
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    batches = [spec.make_batch(cfg["batch_size"], gen) for _ in range(4)]
    loss_fn = spec.loss_fn
    del spec
    # Run-time ``auto`` (gradsched.torch.autotune) profiles itself under a safe default for its
    # first iterations, then switches plans: let it do so off the clock, so that the rounds
    # measure the plan it settled on (later re-plans, if any, are part of what it costs).
    for model, opt in models:
        tuner = getattr(model, "autotuner", None)
        if tuner is not None:
            cfg_t = tuner.config  # profiling, the switch and every re-plan check, all off the clock
            _burst(model, opt, loss_fn, batches,
                   cfg_t.switch_iteration + 1 + cfg_t.max_replans * (cfg_t.patience + 1), 0)

    steps, rounds, warm = cfg["steps"], cfg["rounds"], cfg["warmup_rounds"]
    bar = None
    if rank == 0 and cfg.get("progress", True):
        from tqdm import tqdm

        bar = tqdm(total=rounds * len(entries) * steps, desc=f"bench {cfg['model']} x{world}", unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    per_round: list[list[list[float]]] = [[] for _ in entries]
    for r in range(rounds):
        shift = r % len(entries)
        for i in list(range(len(entries)))[shift:] + list(range(len(entries)))[:shift]:
            if bar is not None:
                bar.set_postfix_str(f"round {r + 1}/{rounds} {entries[i]['label']}", refresh=False)
            model, opt = models[i]
            per_round[i].append(_burst(model, opt, loss_fn, batches, steps, r * steps))
            if bar is not None:
                bar.update(steps)
    if bar is not None:
        bar.close()
    dist.barrier()

    # The slowest rank's step times: an iteration is done when every rank's is.
    flat = torch.tensor([[t for rnd in per_round[i] for t in rnd] for i in range(len(entries))], dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    if rank != 0:
        return None
    times = flat.tolist()
    bound = lower_bound_s(profile, cluster)
    rows = []
    for i, entry in enumerate(entries):
        plan, predicted = _predict(entry, models[i][0], profile, cluster)
        all_steps = times[i]
        counted = all_steps[warm * steps:] or all_steps
        median = statistics.median(counted)
        row: dict[str, Any] = {
            "strategy": entry["label"], "runs": "torch DDP" if entry["torch_ddp"] else "gradsched",
            "iteration_s_median": median, "iteration_s_mean": statistics.fmean(counted),
            "predicted_iteration_s": predicted, "prediction_error": (predicted - median) / median,
            "lower_bound_s": bound["lower_bound_s"], "vs_lower_bound": median / bound["lower_bound_s"],
            "operations": len(plan.operations), "plan_hash": plan.hash,
            "step_s": [all_steps[k * steps:(k + 1) * steps] for k in range(rounds)],
            "warmup_rounds": warm}
        if entry["torch_ddp"]:
            row["bucket_cap_mb"] = (entry.get("ddp_kwargs") or {}).get("bucket_cap_mb", 25.0)
        else:
            row["plan_options"] = plan.options
        tuner = getattr(models[i][0], "autotuner", None)
        if tuner is not None:
            row["autotune"] = tuner.summary()
        rows.append(row)
    ref = next((r["iteration_s_median"] for r in rows if r["strategy"] == "ddp"), None)
    ddp_rows = [r for r in rows if r["runs"] == "torch DDP"]
    best_ddp = min(ddp_rows, key=lambda r: r["iteration_s_median"]) if ddp_rows else None
    for row in rows:
        row["speedup_vs_ddp"] = ref / row["iteration_s_median"] if ref else None
        row["speedup_vs_best_ddp"] = best_ddp["iteration_s_median"] / row["iteration_s_median"] if best_ddp else None
    return {"rows": rows, "profile": {"compute_s": profile.compute_s, "forward_s": profile.forward_s,
                                      "backward_s": profile.backward_s, "other_s": profile.other_s,
                                      "total_bytes": profile.total_bytes, "tensors": profile.num_tensors,
                                      "measured": profile.to_dict()},
            "cluster": cluster.to_dict(), "lower_bound": bound, "contention": probe,
            "best_ddp": best_ddp["strategy"] if best_ddp else None, "world_size": world,
            "backend": dist.get_backend(), "machine": f"{platform.node()} {platform.machine()}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__}", "job_s": time.time() - t_start}


def main(argv: list[str] | None = None) -> int:
    return run_worker(run_bench, "bench.json", argv)


if __name__ == "__main__":
    from gradsched.torch.shutdown import leave

    leave(main())  # skip interpreter finalisation: see gradsched.torch.shutdown
