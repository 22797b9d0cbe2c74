"""The bench's rows and how they are timed (:mod:`gradsched.torch.jobs.bench_worker`, steps 4-6).

A row built, wrapped and primed (:func:`_build_entry`, :func:`prime_steps`, :func:`_fast_steps`), the
compute-only row (:class:`_ComputeOnly`), a row's plan and simulated iteration (:func:`_predict`), and the
timing: a burst of steady-state steps (:func:`_burst`) and rounds of bursts in a rotated order
(:func:`_rotated_rounds`).  The start-up's overhead probe and the rounds both time rows this way.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradsched.jobs.bench import ddp_first_bucket_mb, unmeasured_phases_excluded
from gradsched.jobs.config import BenchConfig, BenchEntry
from gradsched.jobs.startup import AutoWarmup, auto_options
from gradsched.cluster import Cluster
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.torch.jobs.fsdp2_row import Fsdp2Row
from gradsched.torch.jobs.replay import fast_forward, restart_clocks
from gradsched.torch.jobs.shared_model import SharedModel, row_buffers, track
from gradsched.torch.runtime.optim import DistributedOptimizer
from gradsched.torch.runtime.wrapper import DistributedDataParallel


def prime_steps(cfg: BenchConfig) -> int:
    """Steps a row is primed with when built: one where a warm-up round follows (its first burst runs PyTorch
    DDP's second step, where DDP rebuilds its buckets, off the count), else two.  On a dilated replay each is an
    all-reduce of every gradient on a slow link: googlenet-k80 at 50 Mbit/s, 9 s a step, 72 s for four rows."""
    return 1 if cfg.warmup_rounds > 0 else 2


def _build_entry(entry: BenchEntry, cfg: BenchConfig, profile: Profile, cluster: Cluster,
                 shared: SharedModel, prime: tuple[Any, Any] | None = None,
                 warmup: AutoWarmup | None = None, primed: int | None = None) -> tuple[Any, Any]:
    """One row: a copy of the rank's model (shared parameters and momentum, :mod:`.shared_model`), wrapped.

    Every row makes ``.grad`` a view of its buckets (PyTorch DDP's ``gradient_as_bucket_view``;
    gradsched's runtime does so wherever its plan allows), so that the buckets are all a row
    holds between its bursts, and released there; and none copies rank 0's parameters at
    start-up (``init_sync=False``: every rank built them from the same seed).  ``prime``, a loss
    function and a batch: ``primed`` steps (:func:`prime_steps` where None), off the clock, so that ``.grad``
    shows the buckets the runtime allocated at construction, released before the next row is built (run-time
    ``auto`` is not primed: its warm-up bursts count its iterations from the first).  A replay
    is primed without its compute (:func:`fast_forward`): nothing reads those steps' times.
    ``warmup``: run-time ``auto``'s, in situ or planned at start-up (:func:`auto_options`)."""
    module = shared.copy()
    primed = prime_steps(cfg) if primed is None else primed
    if entry.fsdp2:  # PyTorch's fully_shard per block: its own shards, no buckets of ours to release
        row = Fsdp2Row(module, profile, cfg.lr)
        if prime is not None:  # its lazy initialisation and first gathers off the clock, as the others' priming
            loss_fn, (x, y) = prime
            for _ in _fast_steps(module, primed):
                row.zero_grad()
                loss_fn(row(x), y).backward()
                row.step()
        return row, row
    common = {"profile": profile, "cluster": cluster, "timeout_s": cfg.timeout_s, "init_sync": False,
              "gradient_as_bucket_view": True}
    if entry.torch_ddp:
        model = DistributedDataParallel(module, "ddp", ddp_kwargs=entry.ddp_kwargs or None, **common)
    else:
        options = entry.options or None
        cap: dict[str, Any] = {}
        if entry.strategy == "auto":  # the rounds time the plan it settles on: its trials back to back, off the clock
            warmup = warmup or AutoWarmup(True, 0.0, math.inf, 0)
            options = unmeasured_phases_excluded(auto_options(options, warmup), cluster.collectives, warmup.in_situ)
            ddp_cap = _ddp_cap_mb(cfg)  # its PyTorch-DDP baseline: the bench's ddp row
            cap = {} if ddp_cap is None else {"bucket_cap_mb": ddp_cap}
        model = DistributedDataParallel(module, entry.strategy, plan_options=options, use_torch_ddp=False, **common,
                                        **cap)
    opt = DistributedOptimizer(shared.sgd(module, cfg.lr), model)
    track(model, module, opt)
    if prime is not None and getattr(model, "autotuner", None) is None:
        loss_fn, (x, y) = prime
        for _ in _fast_steps(module, primed):  # DDP rebuilds its buckets in its second step (else the warm-up round)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        model.synchronize()
        row_buffers(model).release()
    return model, opt


def _ddp_cap_mb(cfg: BenchConfig) -> float | None:
    """The ``bucket_cap_mb`` the bench's ``ddp`` row (PyTorch DDP's default buckets, byte-scaled: 25 MB / S) is
    built with, None where it is DDP's default: run-time ``auto``'s baseline in its trials is the same DDP."""
    row = next((e for e in cfg.entries if e.torch_ddp and e.label == "ddp"), None)
    cap = (row.ddp_kwargs or {}).get("bucket_cap_mb") if row is not None else None
    return None if cap is None else float(cap)


def _fast_steps(module: Any, steps: int) -> Any:
    """``range(steps)``, iterated with ``module``'s replayed compute taking no time (:func:`fast_forward`); its
    clocks restart after them (:func:`restart_clocks`): else the next timed piece hides the host's work since
    the last fast one (a dilated replay profiled right after its fast step measured VGG-16's forward at 0.5% of
    its time and put its convolutions' backward on the first layer's: predictions 27% high)."""
    with fast_forward(module):
        yield from range(steps)
    restart_clocks(module)


class _ComputeOnly:
    """The same training step with free communication: the rounds' measure of compute.

    Its own optimizer too (``zero_grad``/``step``): the step moves no gradients, but the
    ranks meet once per step, after backward, in a one-element all-reduce, as every
    synchronous step makes them.  That meeting is part of a step's compute: the step
    waits for the slower rank, and ranks that run in lock step compete for the machine
    in the same phases.  Measured on vgg, 2 local ranks: 295 ms a step synchronised
    against 265-271 ms free-running (docs/bench.md, "Rounds").

    Timed in the rounds beside the strategies (same batches, same machine phases), its
    median is the iteration with free communication; predictions and the lower bound
    are scaled to it (:func:`calibrate`), so that they do not inherit the drift of a
    profile taken minutes earlier.  The meeting's own all-reduce stays in: subtracting
    the network benchmark's time for it made every prediction worse (that benchmark's
    small all-reduces, each behind a barrier, cost more than one between ranks in lock
    step: 0.6 ms on loopback, against mlp's 1.5 ms synchronised step)."""

    label = "compute only"

    def __init__(self, cfg: BenchConfig, shared: SharedModel) -> None:
        self.module = shared.copy()
        self.optimizer = shared.sgd(self.module, cfg.lr)
        self._meet = torch.zeros(1)
        track(self, self.module)

    def __call__(self, x: Any) -> Any:
        return self.module(x)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        dist.all_reduce(self._meet)  # where a synchronous step waits for the slowest rank
        self.optimizer.step()

    def synchronize(self) -> None:
        pass


# torch 2.13's DDP gives a 1 MiB first bucket only where bucket_cap_mb is its default (its _BucketCapacityConfig)
_EXPLICIT_CAP_NO_FIRST_BUCKET = hasattr(torch.nn.parallel.distributed, "_BucketCapacityConfig")


def _predict(entry: BenchEntry, model: Any, profile: Profile, cluster: Cluster,
             planned_with: Profile) -> tuple[Plan, float]:
    """The entry's plan (DDP rows: the ``ddp`` planner as DDP would bucket) and its simulated iteration."""
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    if entry.torch_ddp:
        kw = entry.ddp_kwargs or {}
        plan = make_plan("ddp", planned_with, cluster, bucket_cap_mb=float(kw.get("bucket_cap_mb", 25.0)),
                         first_bucket_mb=ddp_first_bucket_mb(kw, _EXPLICIT_CAP_NO_FIRST_BUCKET))
    else:
        plan = model.plan
    return plan, simulate(plan, profile, cluster, timeline=False).iteration_s


def _burst(model: Any, opt: Any, spec_loss: Any, batches: list[Any], steps: int, offset: int,
           until: Callable[[], bool] | None = None) -> list[float]:
    """``steps`` steady-state training steps: seconds from each step's start to the next one's.

    One step more runs before and after the counted ones, off the clock: the first
    step after the barrier has no communication of an earlier step still in flight
    (too fast for a plan that overlaps the next forward) and the last one has no next
    forward to hide its communication behind (too slow); training is neither.  ``until``: no
    step starts once it holds (it must hold on every rank alike: run-time ``auto``'s ``done``)."""
    buffers = row_buffers(model)
    if buffers is not None:  # the row's buckets, released after its last burst (shared_model.RowBuffers)
        buffers.restore()
    dist.barrier()
    starts = []
    for k in range(steps + 2):
        if until is not None and until():
            break
        starts.append(time.perf_counter())
        x, y = batches[(offset + k) % len(batches)]
        opt.zero_grad()
        spec_loss(model(x), y).backward()
        opt.step()
    model.synchronize()
    if buffers is not None:
        buffers.release()
    starts = starts[1:]  # steps 1 .. steps: each ends where the next one starts
    return [b - a for a, b in zip(starts, starts[1:])]


def _rotated_rounds(runs: list[tuple[Any, Any]], loss_fn: Any, batches: list[Any], steps: int, rounds: int,
                    on_burst: Callable[[int, int], None] | None = None,
                    on_round: Callable[[int], None] | None = None, first: int = 0) -> torch.Tensor:
    """Seconds of every counted step, ``(len(runs), rounds * steps)``: in round ``r`` each run
    does a :func:`_burst`, in an order rotated by ``r`` so that slow phases of the machine hit
    all alike (rounds counted from ``first``, for rounds run a few at a time).  ``on_burst(r,
    i)`` after each burst, ``on_round(r)`` after each round.  A collective call: every rank
    runs it.

    A step's time is the ranks' mean.  Training (compute only too) couples the ranks, so over
    a burst every rank takes the same time, but a rank's step (zero_grad to zero_grad) need
    not line up with the others': under a plan that overlaps the next forward one rank's long
    step is another's short one, and a per-step maximum would count the long one twice."""
    times: list[list[float]] = [[] for _ in runs]
    for r in range(first, first + rounds):
        shift = r % len(runs)
        for i in list(range(len(runs)))[shift:] + list(range(len(runs)))[:shift]:
            model, opt = runs[i]
            times[i].extend(_burst(model, opt, loss_fn, batches, steps, r * steps))
            if on_burst is not None:
                on_burst(r, i)
        if on_round is not None:
            on_round(r)
    flat = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return flat / dist.get_world_size()
