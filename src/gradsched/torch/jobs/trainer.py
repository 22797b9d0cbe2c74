"""The worker behind ``gradsched train``: one rank of a data-parallel run on a built-in model.

Launched by PyTorch's own launcher, one process per rank::

    python -m torch.distributed.run --nproc-per-node 2 -m gradsched.torch.jobs.trainer CONFIG.json

``CONFIG.json`` holds the run's settings (written by ``gradsched train``).  Each rank
trains on its own synthetic batches (generator seeded by ``seed`` and the rank), so a
run is reproducible and equal across strategies.  Rank 0 writes ``result.json`` (and
the parameters and merged trace when asked) into ``out_dir``.

Iteration time is measured from one step's start to the next one's (the last step
ends after all communication and updates are done), so work a plan overlaps with the
next forward is counted where it happens.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gradsched.cluster import Cluster
from gradsched.jobs.config import PROGRESS_PREFIX, TrainConfig
from gradsched.jobs.results import TrainResult
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.torch.jobs.models import build_model
from gradsched.torch.runtime.optim import DistributedOptimizer
from gradsched.torch.jobs.worker import run_worker
from gradsched.torch.runtime.wrapper import DistributedDataParallel


def train(cfg: TrainConfig) -> TrainResult:
    """Run the configured training on this rank (process group already initialised): set up, train,
    report, as a training script reads top to bottom."""
    if not isinstance(cfg, TrainConfig):  # the raw JSON, as before
        cfg = TrainConfig.from_dict(cfg)
    device = _device()
    spec = build_model(cfg.model, seed=cfg.seed)
    module = spec.module.to(device)
    model = _wrapped(cfg, module)
    inner = (torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9) if cfg.optimizer == "sgd"
             else torch.optim.Adam(model.parameters(), lr=cfg.lr))
    losses, iteration_s = _loop(cfg, spec, model, DistributedOptimizer(inner, model), device)
    result = _result(cfg, model, module, losses, iteration_s, device)
    _extras(cfg, model, module, iteration_s, result)
    return result


def _device() -> torch.device:
    """This rank's device: its GPU under NCCL (``LOCAL_RANK``), else the CPU."""
    if dist.get_backend() != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _wrapped(cfg: TrainConfig, module: torch.nn.Module) -> DistributedDataParallel:
    """``module`` in gradsched's wrapper: the plan file, or the strategy planned from the given profile and cluster."""
    plan: str | Plan = Plan.load(cfg.plan_path) if cfg.plan_path else cfg.strategy
    profile = Profile.load(cfg.profile_path) if cfg.profile_path else None
    cluster = Cluster.load(cfg.cluster_path) if cfg.cluster_path else None
    return DistributedDataParallel(module, plan, profile=profile, cluster=cluster,
                                   plan_options=cfg.plan_options or None, timeout_s=cfg.timeout_s,
                                   trace=bool(cfg.trace_path), use_torch_ddp=not cfg.no_torch_ddp,
                                   sparse_options=cfg.sparse_options)


def _loop(cfg: TrainConfig, spec: Any, model: DistributedDataParallel, opt: DistributedOptimizer,
          device: torch.device) -> tuple[list[float], list[float]]:
    """``cfg.steps`` steps on batches made before the clock starts: this rank's losses and every step's seconds."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + dist.get_rank())
    batches = [spec.make_batch(cfg.batch_size, gen) for _ in range(min(cfg.steps, 8))]  # data off the clock
    losses: list[float] = []
    starts: list[float] = []
    progress = Progress(cfg.steps, starts)
    dist.barrier()
    for step in range(cfg.steps):
        starts.append(time.perf_counter())
        x, y = batches[step % len(batches)]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad()
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if dist.get_rank() == 0 and cfg.progress:
            progress.step(step, losses[-1])
    model.synchronize()
    if device.type == "cuda":
        torch.cuda.synchronize()
    starts.append(time.perf_counter())
    return losses, [b - a for a, b in zip(starts, starts[1:])]


def _result(cfg: TrainConfig, model: DistributedDataParallel, module: torch.nn.Module, losses: list[float],
            iteration_s: list[float], device: torch.device) -> TrainResult:
    """What every run reports (gradsched.jobs.results.TrainResult): the ranks' mean losses, the timed steps."""
    world = dist.get_world_size()
    mean_losses = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(mean_losses)
    mean_losses = (mean_losses / world).tolist()
    timed = iteration_s[cfg.warmup:] or iteration_s
    plan = model.plan
    return {"strategy": model.strategy, "model": cfg.model, "nproc": world, "backend": dist.get_backend(),
            "steps": cfg.steps, "batch_size": cfg.batch_size, "optimizer": cfg.optimizer,
            "iteration_s_median": statistics.median(timed), "iteration_s_mean": statistics.fmean(timed),
            "iteration_s": iteration_s, "warmup_steps": min(cfg.warmup, len(iteration_s)),
            "loss_first": mean_losses[0], "loss_last": mean_losses[-1], "losses": mean_losses,
            "params": sum(p.numel() for p in module.parameters()), "torch_ddp": plan is None,
            "operations": len(plan.operations) if plan is not None else None,
            "plan_hash": plan.hash if plan is not None else None,
            "peak_extra_bytes": _peak_extra_bytes(model, device),
            "density": (plan.operations[0].density if plan is not None and plan.operations
                        and plan.operations[0].sparse else None)}


def _peak_extra_bytes(model: DistributedDataParallel, device: torch.device) -> int | None:
    """The runtime's peak extra memory, the largest of any rank (their buffers can differ only by timing)."""
    stats = model.memory_stats()
    if stats is None:
        return None
    peak = torch.tensor([stats["peak_bytes"]], dtype=torch.int64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return int(peak.item())


def _extras(cfg: TrainConfig, model: DistributedDataParallel, module: torch.nn.Module, iteration_s: list[float],
            result: TrainResult) -> None:
    """Into ``result``: run-time auto's choice against what ran after its last switch, the trace, the saved
    parameters (each when there is one)."""
    rank = dist.get_rank()
    if model.autotuner is not None:
        tuner = model.autotuner
        last = tuner.switches[-1].iteration
        after = iteration_s[last + 1:] or iteration_s[last:]
        result["predicted_iteration_s"] = tuner.predicted_iteration_s
        result["measured_iteration_s_after_switch"] = statistics.median(after) if after else None
        result["autotune"] = tuner.summary()
    if cfg.trace_path:
        tl = model.gather_timeline()
        if rank == 0:
            tl.meta.update({"model": cfg.model, "world_size": dist.get_world_size()})
            tl.save_chrome_trace(cfg.trace_path)
            result["trace"] = cfg.trace_path
    if rank == 0 and cfg.save_params:
        Path(cfg.save_params).parent.mkdir(parents=True, exist_ok=True)
        torch.save({n: p.detach().cpu().clone() for n, p in module.named_parameters()}, cfg.save_params)
        result["saved_params"] = cfg.save_params


class Progress:
    """Rank 0's progress lines (:data:`PROGRESS_PREFIX`), streamed by ``gradsched train``: the first
    step, then one at most every ``every_s`` seconds, and the last."""

    def __init__(self, steps: int, starts: list[float], every_s: float = 2.0) -> None:
        self.steps, self.starts, self.every_s = steps, starts, every_s
        self.last_s = float("-inf")

    def step(self, step: int, loss: float) -> None:
        now = time.perf_counter()
        if step not in (0, self.steps - 1) and now - self.last_s < self.every_s:
            return
        self.last_s = now
        ms = (now - self.starts[0]) / (step + 1) * 1e3
        print(f"{PROGRESS_PREFIX}step {step + 1}/{self.steps}, loss {loss:.4f} (rank 0), {ms:.1f} ms/step so far",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    return run_worker(TrainConfig.from_dict, train, "result.json", argv)


if __name__ == "__main__":
    from gradsched.torch.runtime.shutdown import leave

    leave(main())  # skip interpreter finalisation: see gradsched.torch.runtime.shutdown
