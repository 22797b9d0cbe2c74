"""Equivalence check: every dense strategy's final parameters against real DDP's.

Run by the test suite (gloo, 2 and 3 ranks) and by ``benchmarks/gpu_check.py`` (NCCL):

    python -m gradsched.torch.jobs.selftest --world 2 [--backend gloo|nccl] [--steps 20] [--json out.json]

Each rank trains the same seeded model on its own shard of the same synthetic data,
once per (strategy, optimizer), and compares with a run under
``torch.nn.parallel.DistributedDataParallel``.  Reported per case: the largest
difference to DDP relative to each tensor's largest magnitude (:func:`rel_diff`), and
whether every rank ended with bit-identical parameters.

Why its ranks do not start through :mod:`gradsched.jobs.launch` (the launcher of ``bench``,
``train`` and ``netbench``): that launcher starts ``python -m MODULE CONFIG.json`` under
``torch.distributed.run``, fresh interpreters that each import torch and read a JSON config.  What starts ranks here,
:func:`start_ranks` / :func:`spawn_local`, is the multi-process harness of the test suite
(about 30 test files and several benchmarks): it runs any module-level function with
pickled arguments and returns each rank's ``torch.save``-able result, from a fork server
that imported torch once.  Through the launcher each call would need a config format per
function and pay the imports per call: 2 ranks joining a gloo group and leaving took 14.7 s
a call through the launcher (median of 3, 12.9-21.9 s) against 0.15 s through the warm fork
server (6.6 s its first start), on the 2-core machine at load 6-7 (6 Dec 2026), over
and the suite, which must fit in 10 minutes, calls it from about 45 places (more with
parametrised tests).
Nothing of the launcher's policy is missing for that use: ranks are local (no testbed, so
no prefix rule), one compute thread each (set in the rank), and a failing rank stops the
others and is raised here (``torch.multiprocessing``'s join); a hung collective ends at
the process group's timeout.  The self-test's command line (:func:`main`) runs on the same
harness so that it checks exactly what the suite checks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

from gradsched.jobs.launch import free_port

# Options that make small test models exercise partitioned blocks and several buckets.
SMALL_MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "threshold": {"mb": 0.02},
    "ddp": {"bucket_cap_mb": 0.05, "first_bucket_mb": 0.01},
    "bytescheduler": {"partition_bytes": 8192, "credit_bytes": 32768},
    "usbyte": {"unit_bytes": 4096, "merge_bytes": 16384},  # blocks of merged layers
}


def dense_strategies() -> list[str]:
    from gradsched.planners import is_sparse, strategy_names

    return [s for s in strategy_names() if not is_sparse(s)]


def rel_diff(a: "Any", b: "Any") -> float:
    """Largest element difference, relative to the reference tensor's largest magnitude."""

    worst = 0.0
    for x, y in zip(a, b):
        scale = max(float(y.abs().max()), 1e-12)
        worst = max(worst, float((x.double() - y.double()).abs().max()) / scale)
    return worst


def train(model_name: str, strategy: Any, optimizer: str, steps: int, *, seed: int, batch_size: int,
          device: Any, use_torch_ddp: bool, options: dict[str, Any] | None, timeout_s: float = 60.0,
          accumulate: int = 1, wrap: dict[str, Any] | None = None, dtype: str = "float32") -> list[Any]:
    """Train ``steps`` steps on this rank; return the final parameters (CPU copies).

    ``strategy`` is a strategy name or a Plan; ``wrap``: more arguments for the wrapper
    (``process_group``, ``ranks_per_node`` ...); ``dtype``: of the parameters and float inputs."""
    import torch
    import torch.distributed as dist

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    spec = build_model(model_name, seed=seed + (rank if strategy == "local" else 0))
    float_dtype = getattr(torch, dtype)
    module = spec.module.to(device, float_dtype)
    if strategy == "local":  # no communication at all: the negative control of the check
        model = _Local(module)
    else:
        model = DistributedDataParallel(module, strategy, plan_options=options, use_torch_ddp=use_torch_ddp,
                                        timeout_s=timeout_s, **(wrap or {}))
    params = model.parameters()
    inner = (torch.optim.SGD(params, lr=0.05, momentum=0.9) if optimizer == "sgd"
             else torch.optim.Adam(params, lr=1e-3))
    opt = DistributedOptimizer(inner, model) if strategy != "local" else inner
    sched = torch.optim.lr_scheduler.StepLR(inner, step_size=7, gamma=0.5)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            # every rank draws the global batch and keeps its own shard: same data as one big batch
            x, y = spec.make_batch(batch_size * world, gen)
            x, y = x[rank::world].to(device), y[rank::world].to(device)
            x = x.to(float_dtype) if x.is_floating_point() else x
            if micro < accumulate - 1:
                with model.no_sync():
                    spec.loss_fn(model(x), y).backward()
            else:
                spec.loss_fn(model(x), y).backward()
        opt.step()
        sched.step()
    model.synchronize()
    return [p.detach().cpu().clone() for p in module.parameters()]


class _Local:
    """A stand-in for the wrapper that trains each rank alone."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __call__(self, *args: Any) -> Any:
        return self.module(*args)

    def parameters(self) -> Any:
        return self.module.parameters()

    def no_sync(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def synchronize(self) -> None:
        pass


def _worker(rank: int, world: int, port: int, backend: str, cases: list[tuple[str, str, str]], steps: int,
            model_name: str, out: str, device_type: str = "cpu", dtype: str = "float32") -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cpu")
    if backend == "nccl" or device_type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    results: dict[str, CaseResult] = {}
    refs: dict[str, list[Any]] = {}
    for opt_name in sorted({c[1] for c in cases}):
        refs[opt_name] = train(model_name, "ddp", opt_name, steps, seed=0, batch_size=8, device=device,
                               use_torch_ddp=True, options=None, dtype=dtype)
    for strategy, opt_name, label in cases:
        final = train(model_name, strategy, opt_name, steps, seed=0, batch_size=8, device=device,
                      use_torch_ddp=False, options=SMALL_MODEL_OPTIONS.get(strategy), dtype=dtype)
        flat = torch.cat([p.reshape(-1).double() for p in final])
        everyone = [torch.empty_like(flat) for _ in range(world)] if backend != "nccl" else None
        if backend == "nccl":
            everyone = [torch.empty_like(flat.to(device)) for _ in range(world)]
            dist.all_gather(everyone, flat.to(device))
            everyone = [t.cpu() for t in everyone]
        else:
            dist.all_gather(everyone, flat)
        same = all(torch.equal(everyone[0], t) for t in everyone)
        results[label] = {"strategy": strategy, "optimizer": opt_name, "rel_diff_vs_ddp": rel_diff(final, refs[opt_name]),
                          "identical_across_ranks": same}
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    from gradsched.torch.runtime.shutdown import leave

    leave(0)  # see gradsched.torch.runtime.shutdown: a finished worker must not die in finalisation


def _entry(rank: int, fn: Any, world: int, port: int, backend: str, args: tuple, outdir: str,
           timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(outdir) / f"{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    from gradsched.torch.runtime.shutdown import leave

    leave(0)  # only after success: an exception above propagates to start_ranks as usual


# What every rank imports before it runs: loaded once by the fork server, not once per rank.
PRELOAD = ["torch", "torch.distributed", "gradsched.torch"]


def start_ranks(fn: Any, world: int, *args: Any) -> None:
    """Run ``fn(rank, *args)`` on ``world`` new processes and wait for them (``torch.multiprocessing``).

    The processes come from a fork server that has imported :data:`PRELOAD` once and
    computed nothing (so no thread pool is forked): a rank starts in a fraction of a second
    instead of the 2-3 s a fresh interpreter takes to import torch.  The server is
    Python's (``multiprocessing``'s "forkserver"), started on first use with the
    environment of that moment; an error in any rank is raised here, as ``mp.spawn`` does."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=world, join=True, start_method="forkserver")


def spawn_local(fn: Any, world: int, *args: Any, backend: str = "gloo", timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh processes joined on loopback; return every rank's result.

    ``fn`` must be importable (a module-level function); its result must be ``torch.save``-able."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        start_ranks(_entry, world, fn, world, free_port(), backend, args, tmp, timeout_s)
        return [torch.load(Path(tmp) / f"{r}.pt", weights_only=False) for r in range(world)]


class CaseResult(TypedDict):
    """One (strategy, optimizer) of the check, as rank 0 writes it (``result.json``) and :func:`run` returns it."""

    strategy: str
    optimizer: str
    rel_diff_vs_ddp: float  # rel_diff of the final parameters against PyTorch DDP's
    identical_across_ranks: bool


def run(world: int, *, backend: str = "gloo", strategies: list[str] | None = None,
        optimizers: tuple[str, ...] = ("sgd", "adam"), steps: int = 20, model: str = "mlp",
        device: str = "cpu", dtype: str = "float32") -> dict[str, CaseResult]:
    """Spawn ``world`` ranks on loopback and return rank 0's per-case results.

    ``dtype``: the parameters'.  Sums over three or more ranks round differently in each
    bucket layout, and Adam, which divides by the gradient's own scale, turns the last-bit
    differences of nearly cancelling gradients into 2.5e-5 of the weights within 20 steps;
    in float64 the layouts' rounding stays far below any tolerance."""
    strategies = strategies or dense_strategies()
    cases = [(s, o, f"{s}/{o}") for s in strategies for o in optimizers]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        start_ranks(_worker, world, world, free_port(), backend, cases, steps, model, out, device, dtype)
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="gloo can reduce CUDA tensors too")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    results = run(args.world, backend=args.backend, steps=args.steps, model=args.model, device=args.device)
    ok = True
    for label, r in results.items():
        good = r["rel_diff_vs_ddp"] <= args.tolerance and r["identical_across_ranks"]
        ok &= good
        print(f"{label:24s} rel diff vs DDP {r['rel_diff_vs_ddp']:.2e}  same on all ranks: "
              f"{r['identical_across_ranks']}  {'ok' if good else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
