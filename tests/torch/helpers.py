"""Shared helpers of the runtime tests: one training loop, and a virtual clock.

``train`` is the loop the runtime tests share (several files had their own copy): every
rank draws the same global batch from a seeded generator and keeps its shard, so that
one rank's run and N ranks' runs see the same data and can be compared number for number.

``VirtualTime`` replaces a module's ``time`` so that what a test asserts about time is
decided by events (work done, sleeps, blocking) instead of the wall clock of a shared,
loaded machine.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

Batch = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def _backward(loss: torch.Tensor) -> torch.Tensor:
    loss.backward()
    return loss


def train(model: Callable[[torch.Tensor], Any], opt: Any, make_batch: Batch, loss_fn: Callable[[Any, torch.Tensor], Any],
          *, rank: int = 0, world: int = 1, steps: int = 5, batch: int = 8, seed: int = 1, sched: Any = None,
          after_step: Callable[[int, torch.Tensor], None] | None = None,
          backward: Callable[[Any], torch.Tensor] = _backward) -> list[float]:
    """``steps`` iterations of ``model`` (a module, or a compiled one) under ``opt``: each rank draws the global
    batch (``batch`` rows a rank, from a generator seeded ``seed``) and keeps its shard; ``sched`` (an LR scheduler)
    steps after the optimizer, ``after_step(step, x)`` runs after it (an evaluation forward, a checkpoint).
    ``backward(loss_fn's result)`` runs the backward pass(es) and returns the loss to record (default: one
    ``loss.backward()``; several losses, several backward passes). Returns the losses."""
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        x, y = make_batch(batch * world, gen)
        opt.zero_grad()
        loss = backward(loss_fn(model(x[rank::world]), y[rank::world]))
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
        if after_step is not None:
            after_step(step, x[rank::world])
    return losses


def preload_dynamo() -> None:
    """Let the fork server of ``spawn_local``/``start_ranks`` import ``torch._dynamo`` once, for every rank.

    PyTorch's ``DistributedDataParallel.__init__`` imports ``torch._dynamo`` on first use: 2.5 s of CPU
    per rank on this project's machines, paid by every spawned rank that builds a DDP (the reference
    runs, plan ``ddp``, run-time auto's DDP candidate), about a third of a typical spawn test.  The
    import starts no thread, so the fork server stays safe to fork.  Called by the conftests, before any
    test starts the server (its preload list is read when it starts)."""
    from gradsched.torch.jobs import selftest

    if "torch._dynamo" not in selftest.PRELOAD:
        selftest.PRELOAD.append("torch._dynamo")


def params_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """A copy of ``module``'s parameters (to compare runs after training)."""
    return [p.detach().clone() for p in module.parameters()]


class VirtualTime:
    """A stand-in for the ``time`` module: wall and thread-CPU clocks that move only when told.

    ``sleep(s)`` and :meth:`block` move the wall clock (the thread is off the CPU);
    :meth:`work` moves both (the thread computes); :meth:`preempt` moves the wall clock
    and :meth:`run_queue_s` (a core taken away while the thread wanted to run: it waits in
    the run queue).  Install it with ``monkeypatch.setattr(module, "time", VirtualTime())``,
    or :meth:`install` (which also replaces a module's ``run_queue_s``)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.wall_s, self.cpu_s, self.queued_s = start_s, 0.0, 0.0

    def install(self, monkeypatch: Any, module: Any) -> "VirtualTime":
        """This clock as ``module``'s ``time`` and, where it reads one, its ``run_queue_s``."""
        monkeypatch.setattr(module, "time", self)
        if hasattr(module, "run_queue_s"):
            monkeypatch.setattr(module, "run_queue_s", self.run_queue_s)
        return self

    def run_queue_s(self) -> float:
        """Seconds the thread waited for a core (:func:`gradsched.torch.jobs.replay.run_queue_s`)."""
        return self.queued_s

    def perf_counter(self) -> float:
        return self.wall_s

    monotonic = perf_counter

    def thread_time(self) -> float:
        return self.cpu_s

    process_time = thread_time

    def sleep(self, seconds: float) -> None:
        self.wall_s += max(0.0, seconds)

    def work(self, seconds: float) -> None:
        self.wall_s += seconds
        self.cpu_s += seconds

    def block(self, seconds: float) -> None:
        self.wall_s += seconds

    def preempt(self, seconds: float) -> None:
        self.wall_s += seconds
        self.queued_s += seconds
