"""Host cost of plans that overlap the update with the next forward, on 8 gloo ranks, compute skipped.

    python benchmarks/overlap_host_cost.py [--profile benchmarks/profiles/inception-v4-b64-10tflops.profile.json]
        [--scale 16] [--world 8] [--steps 5] [--rounds 2]

A replay of ``--profile`` at byte scale ``--scale`` (its compute skipped, as in a bench's warm-up
round), ranks on loopback, no shaping.  ``dear`` is planned once (for an 8-rank cluster at 10 Gbit/s,
dilation 2.5) and run as planned, and its reduce-scatter groups run as plain all-reduces with and
without ``overlap_forward``: the same operations, so the difference is the overlap's host work (the
per-layer optimizer steps of ``DistributedOptimizer`` in the next forward, the first-use gate).
Prints the median step (slowest rank) and the CPU per rank (all threads) per phase;
docs/notes/2026-12-bench-runs.md ("Why auto's plans run slow on 8 emulated hosts", and "Grouped updates")
has the figures; ``benchmarks/results/overlap_host_cost.log`` the runs before and after the grouping.
Each step starts with a barrier: operations an overlapping plan leaves in flight run on during it, off
the clock, which flatters the overlap rows when communication dominates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROWS = ["torch-ddp", "groups", "groups-overlap", "dear"]


def build(name: str, prof: Any, cluster: Any, plan: Any, scale: int) -> tuple[Any, Any]:
    import gradsched.torch as gt
    from gradsched.plan import DENSE, REDUCE_SCATTER, Plan
    from gradsched.torch.jobs.replay import ReplayModel
    from gradsched.torch.runtime.optim import DistributedOptimizer

    m = ReplayModel(prof)
    if name == "torch-ddp":
        w = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=25 / scale)
        return w, torch.optim.SGD(w.parameters(), lr=1e-3, momentum=0.9)
    if name.startswith("groups"):
        ops = tuple(replace(o, collective=DENSE, gate=None) for o in plan.operations if o.collective == REDUCE_SCATTER)
        plan = Plan("custom", ops, plan.profile_fingerprint, plan.model, overlap_forward="-overlap" in name)
    w = gt.DistributedDataParallel(m, plan, profile=prof, cluster=cluster, init_sync=False)
    opt = DistributedOptimizer(torch.optim.SGD(w.parameters(), lr=1e-3, momentum=0.9), w)
    return w, opt


def timed_steps(m: Any, opt: Any, steps: int) -> dict[str, list[float]]:
    from gradsched.torch.jobs.replay import fast_forward

    out: dict[str, list[float]] = {"wall": [], "fwd": [], "bwd": [], "opt": [], "cpu": []}
    x = torch.ones(4, 8)
    with fast_forward(m):
        for s in range(steps + 2):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            y = m(x)
            c1 = time.process_time()
            y.sum().backward()
            c2 = time.process_time()
            opt.step()
            t3, c3 = time.perf_counter(), time.process_time()
            if s >= 2:
                for k, v in (("wall", t3 - t0), ("fwd", c1 - c0), ("bwd", c2 - c1), ("opt", c3 - c2), ("cpu", c3 - c0)):
                    out[k].append(v)
    return out


def worker(rank: int, world: int, args: argparse.Namespace, prof: Any, cluster: Any, plan: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = {c: build(c, prof, cluster, plan, args.scale) for c in ROWS}
    res: dict[str, dict[str, list[float]]] = {c: {} for c in ROWS}
    for _ in range(args.rounds):
        for c, (m, opt) in rows.items():
            for k, v in timed_steps(m, opt, args.steps).items():
                res[c].setdefault(k, []).extend(v)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, res)
    if rank == 0:
        print(f"{len(prof.tensors)} tensors, {len(rows['groups'][0].plan.operations)} groups, {world} ranks")
        for c in ROWS:
            step = [max(a[c]["wall"][i] for a in everyone) for i in range(len(res[c]["wall"]))]
            cpu = {k: 1e3 * statistics.mean(statistics.mean(a[c][k]) for a in everyone)
                   for k in ("fwd", "bwd", "opt", "cpu")}
            print(f"{c:20s} step {1e3 * statistics.median(step):7.1f} ms  CPU/rank fwd {cpu['fwd']:5.1f} "
                  f"bwd {cpu['bwd']:5.1f} opt {cpu['opt']:5.1f} all {cpu['cpu']:5.1f} ms", flush=True)
    dist.destroy_process_group()


def main() -> None:
    from gradsched.byte_scaling import scale_profile
    from gradsched.cluster import Cluster
    from gradsched.profile import Profile
    from gradsched.torch.jobs.replay import ReplayModel
    from gradsched.torch.runtime.planning import resolve_plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="benchmarks/profiles/inception-v4-b64-10tflops.profile.json")
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=29733)
    args = ap.parse_args()
    prof = scale_profile(Profile.load(args.profile), args.scale)
    names = [n for n, _ in ReplayModel(prof).named_parameters()]  # the replay's names, for the wrapper's check
    prof = replace(prof, tensors=tuple(replace(t, name=n) for t, n in zip(prof.tensors, names)))
    cluster = Cluster.alpha_beta(2e-3, 8 / 10e9 * args.scale * 2.5, args.world)
    plan = resolve_plan("dear", prof, cluster, None)
    mp.spawn(worker, args=(args.world, args, prof, cluster, plan), nprocs=args.world)


if __name__ == "__main__":
    main()
