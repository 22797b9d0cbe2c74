"""Operation kinds: how one plan operation is issued and completed on a process group.

The executor knows operations only through this small protocol, so a new kind (the
sparse ``topk-allgather``, the two-level ``hier-allreduce``) is one class registered in :data:`OP_KINDS`:

- ``issue()``: start the collective(s) asynchronously; the operation's arena pieces
  already hold this rank's gradient elements.
- ``is_done()``: non-blocking completion test (used for the credit window; see :func:`works_done`).
- ``wait(timeout_s)``: block until done (gloo) or make the current stream wait (NCCL);
  afterwards the arena pieces hold the averaged gradient.  A failure or a timeout
  raises :class:`CollectiveError`, never a silent hang.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from gradsched.errors import GradschedError
from gradsched.plan import DENSE, Operation
from gradsched.torch.runtime.groups import uses_nccl
from gradsched.torch.runtime.layout import Piece
from gradsched.torch.runtime.shutdown import note_collective_failure


class CollectiveError(GradschedError):
    """A collective failed or did not finish in time: a peer rank died, stalled or diverged.

    Making one records the failure (:func:`gradsched.torch.runtime.shutdown.note_collective_failure`):
    the process then exits within a few seconds of finalising, whatever the process group's timeout."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        note_collective_failure()


class OpRunner(Protocol):
    index: int
    nbytes: int
    group: dist.ProcessGroup  # read at issue
    on_complete: Callable[[int], None] | None  # read at issue: called on the backend's thread when done
    works: list[dist.Work]  # the collectives in flight (empty when none)

    def issue(self) -> None: ...

    def is_done(self) -> bool: ...

    def wait(self, timeout_s: float) -> None: ...


class DenseAllReduce:
    """One all-reduce per piece (one per dtype), averaged like DDP: divide by world size, then sum."""

    def __init__(self, index: int, op: Operation, pieces: tuple[Piece, ...], arenas: dict[str, torch.Tensor],
                 group: dist.ProcessGroup, world_size: int, rank: int,
                 on_complete: Callable[[int], None] | None = None, **_context: object) -> None:
        self.index = index
        self.buffers = [arenas[p.dtype][p.start:p.end] for p in pieces]
        self.nbytes = sum(b.numel() * b.element_size() for b in self.buffers)
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.on_complete = on_complete
        self.works: list[dist.Work] = []
        # NCCL: wait() makes the current CUDA stream wait for the collective (no host
        # block); its own watchdog enforces the process group's timeout.  gloo: block
        # the host, bounded by our timeout.
        self.host_wait = not uses_nccl(group, self.buffers[0].device) if self.buffers else True

    def issue(self) -> None:
        self.works = []
        for buf in self.buffers:
            buf.div_(self.world_size)
            self.works.append(dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group, async_op=True))
        if self.on_complete is not None and self.works:
            # Runs on the backend's thread when the last collective completes: the
            # measured end of the operation (tracing only).
            self.works[-1].get_future().add_done_callback(lambda _f: self.on_complete(self.index))

    def is_done(self) -> bool:
        return works_done(self.works, self.host_wait)

    def wait(self, timeout_s: float) -> None:
        wait_all(self.works, host_wait=self.host_wait, timeout_s=timeout_s, rank=self.rank,
                 what=f"all-reduce of operation {self.index} ({self.nbytes} bytes)")
        self.works = []


def works_done(works: list[dist.Work], host_wait: bool) -> bool:
    """Non-blocking: have ``works`` completed (or failed)?

    gloo (``host_wait``): the future, not ``Work.is_completed()``, which turns true a
    moment *after* the future's callbacks run: a progress thread woken by a callback
    would find the operation not yet complete and sleep on.  NCCL: the future
    completes at enqueue, so only ``is_completed()`` (the CUDA event) tells."""
    if host_wait:
        return all(w.get_future().done() for w in works)
    return all(w.is_completed() for w in works)


def wait_all(works: list[dist.Work], *, host_wait: bool, timeout_s: float, rank: int, what: str) -> None:
    """Wait for ``works``; a failure or a timeout becomes a :class:`CollectiveError` naming ``what``.

    gloo: block the host, bounded by ``timeout_s``.  NCCL: make the current stream wait
    (no host block); NCCL's own watchdog enforces the process group's timeout."""
    for w in works:
        try:
            if host_wait:
                w.wait(timeout=timedelta(seconds=timeout_s))
            else:
                w.wait()
        except Exception as exc:  # backend errors have no common public type
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise CollectiveError(
                f"rank {rank}: {what} failed or did not complete within {timeout_s:g} s: a peer rank probably died, "
                f"stalled or ran a different number of steps ({type(exc).__name__}: {first})") from exc


# Added when imported (the executor imports both): gradsched.torch.runtime.sparse the sparse kind
# ("topk-allgather": TopkAllGather), gradsched.torch.runtime.hier the two-level one ("hier-allreduce": HierAllReduce).
OP_KINDS: dict[str, type] = {DENSE: DenseAllReduce}


def make_runner(index: int, op: Operation, pieces: tuple[Piece, ...], arenas: dict[str, torch.Tensor],
                group: dist.ProcessGroup, world_size: int, rank: int,
                on_complete: Callable[[int], None] | None = None, **context: object) -> OpRunner:
    """The runner for ``op``'s collective kind; an unknown kind is a clear error.

    ``context`` (the executor's memory ledger, sparse options, step counter) goes to
    every kind; a kind takes what it needs."""
    kind = OP_KINDS.get(op.collective)
    if kind is None:
        raise GradschedError(f"operation {index} uses collective {op.collective!r}, which the runtime does not "
                             f"execute yet (it runs: {', '.join(OP_KINDS)}); choose a dense strategy")
    return kind(index, op, pieces, arenas, group, world_size, rank, on_complete, **context)
