"""``plan="ddp"``: PyTorch's DDP with gradsched's failure contract (a :class:`CollectiveError` after ``timeout_s``).

PyTorch's DDP waits for its all-reduces inside its reducer, bounded by the process
group's timeout, and a dead or frozen peer surfaces as a bare ``RuntimeError`` from
gloo (``Connection reset by peer``, ``Operation timed out``) out of ``backward()``.
An exception raised in a future's callback does not help: the reducer wraps it in a
``RuntimeError`` too.  What keeps its type is an exception raised by the
communication hook itself, which autograd re-raises from ``backward()`` as it is.

So :class:`DeadlineHook` is DDP's default all-reduce (divide each bucket by the
world size, sum: the same arithmetic) that also remembers the bucket's work; at the
last bucket of a backward it waits for the backward's collectives with
``timeout_s`` and turns a failure into a ``CollectiveError``.  The last bucket is
the one DDP finishes last (it rebuilds its buckets in ready order after the first
iteration), where DDP's own reducer would wait for them a moment later anyway, so
the overlap of communication with the rest of backward is kept.  CUDA buckets (NCCL)
are left to NCCL's watchdog: waiting there does not block the host.  On the CPU the
futures handed to DDP are completed there too, with no Python callback per bucket on
gloo's thread (``.then``, as PyTorch's own Python all-reduce hook has it): gpt2 over
loopback, 2 ranks, paired step medians against plain DDP +0.4-2.1% in wall time, the
callback's version +2.1-3.5% in the same run (load 5-17, docs/notes/2026-12-autotune.md).

:func:`translate` does the same for the collectives of DDP's forward (buffer
broadcasts, its bucket rebuild), raised by PyTorch as ``torch.distributed.DistError``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gradsched.torch.runtime.ops import CollectiveError

# How gloo's failures read when PyTorch raises them as a plain RuntimeError
GLOO_FAILURES = ("gloo/transport", "Connection reset by peer", "Connection closed by peer", "Operation timed out")


class DeadlineHook:
    """The hook's state: the group, ``timeout_s`` and the works of the backward in progress, with the futures
    handed to DDP for their buckets."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.works: list[dist.Work] = []
        self.pending: list[tuple[torch.futures.Future, torch.Tensor]] = []  # each bucket's future and buffer

    def wait_all(self) -> None:
        """Wait for the backward's all-reduces (``timeout_s`` each), then complete each bucket's future."""
        works, self.works = self.works, []
        pending, self.pending = self.pending, []
        for w in works:
            try:
                w.wait(timeout=timedelta(seconds=self.timeout_s))
            except Exception as exc:  # gloo's errors have no common public type
                raise collective_error(self.rank, "PyTorch DDP's gradient all-reduce", self.timeout_s, exc) from exc
        for fut, buf in pending:
            fut.set_result(buf)


def deadline_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects any annotation but its own types
    """DDP's all-reduce of ``bucket``; at the last bucket, wait for the backward's with a deadline (module doc).

    On the CPU each bucket's future is completed here, at the last bucket, once every all-reduce is done
    (DDP reads them only after the last one, at the end of backward): no Python callback per bucket on the
    backend's thread, as ``work.get_future().then(...)`` would run (it took the GIL from the training thread)."""
    buf = bucket.buffer()
    buf.div_(state.world)
    work = dist.all_reduce(buf, group=state.group, async_op=True)
    if buf.device.type != "cpu":
        return work.get_future().then(lambda fut: fut.value()[0])
    fut = torch.futures.Future()
    state.works.append(work)
    state.pending.append((fut, buf))
    if bucket.is_last():
        state.wait_all()
    return fut


def collective_error(rank: int, what: str, timeout_s: float, exc: BaseException) -> CollectiveError:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return CollectiveError(f"rank {rank}: {what} failed or did not complete within {timeout_s:g} s: a peer rank "
                           f"probably died, stalled or ran a different number of steps ({type(exc).__name__}: {first})")


def is_backend_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's failure (a dead or frozen peer), not an error of the model's code."""
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in GLOO_FAILURES)


def install(ddp: Any, group: dist.ProcessGroup, timeout_s: float) -> None:
    """Give ``ddp`` (PyTorch's DDP) the deadline hook before its first forward, unless a hook of the user's
    is there (the Lightning strategy's ``ddp_comm_hook``) or its arguments need DDP's built-in one
    (``mixed_precision`` casts there)."""
    if not ddp._comm_hooks and getattr(ddp, "mixed_precision", None) is None:
        ddp.register_comm_hook(DeadlineHook(group, timeout_s), deadline_hook)
