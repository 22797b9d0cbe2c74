"""The ``hier-allreduce`` operation kind: a dense all-reduce run over the two levels of a cluster.

Per piece (one per dtype), on the groups of :mod:`gradsched.torch.runtime.nodes`:

1. **reduce** (sum) inside each node to its leader (the node's first rank);
2. **all-reduce** (sum) among the leaders, across nodes;
3. **broadcast** inside each node from its leader.

Averaged as the dense operation (each rank divides its gradient by the world size
first), so the result is the dense all-reduce's, up to the order of the additions.
A level with one rank is left out (one rank per node: the leaders' all-reduce alone).

The steps run one after the other without blocking the caller:

- **NCCL**: all steps are issued at once; between two, ``work.wait()`` makes the
  current stream wait for the first (no host block), so the stream orders them.
- **gloo** (CPU tensors; gloo has no reduce for CUDA tensors): a step is issued by the
  completion callback of the one before, on the backend's thread.  Collectives on a
  group must be issued in the same order on every rank, and completions can come in
  any order, so a :class:`Sequencer` (one per executor) issues each group's steps in
  the order the operations were issued: an operation's broadcast waits until those
  of the operations issued before it have gone.

To the executor the operation is one :class:`~gradsched.torch.runtime.ops.OpRunner`:
``is_done()`` turns true when the last step completes, ``on_complete`` is called
then, and ``wait()`` raises :class:`~gradsched.torch.runtime.ops.CollectiveError` on a
failed step or after its timeout, as the dense operation does.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradsched.errors import GradschedError, InternalError
from gradsched.plan import HIER, Operation
from gradsched.torch.runtime.groups import uses_nccl
from gradsched.torch.runtime.layout import Piece
from gradsched.torch.runtime.nodes import NodeGroups
from gradsched.torch.runtime.ops import OP_KINDS, CollectiveError, wait_all

REDUCE, ALLREDUCE, BROADCAST = "reduce", "all-reduce", "broadcast"


class Sequencer:
    """Issues each group's later steps in the order their operations were issued (gloo).

    One per executor.  Its lock is its own (never the executor's): completion callbacks
    take it on the backend's threads, and a rank blocked in ``wait()`` holds the
    executor's.  Re-entrant: a step that is complete at once runs its callback inline."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.queues: dict[str, deque[HierAllReduce]] = {}

    def enqueue(self, runner: "HierAllReduce", steps: list[str]) -> None:
        with self.lock:
            for step in steps:
                self.queues.setdefault(step, deque()).append(runner)

    def pump(self, step: str) -> None:
        """Issue ``step`` for every operation at the head of its queue whose step before is done."""
        with self.lock:
            queue = self.queues.get(step)
            while queue and queue[0].ready_for(step):
                queue.popleft().issue_step(step)


class HierAllReduce:
    """One ``hier-allreduce`` operation (module docstring); the executor's :class:`OpRunner`."""

    def __init__(self, index: int, op: Operation, pieces: tuple[Piece, ...], arenas: dict[str, torch.Tensor],
                 group: dist.ProcessGroup, world_size: int, rank: int,
                 on_complete: Callable[[int], None] | None = None, *, nodes: NodeGroups | None = None,
                 sequencer: Sequencer | None = None, **_context: object) -> None:
        if nodes is None or sequencer is None:
            raise InternalError(f"operation {index} (hier-allreduce) was built without its node groups")
        self.index = index
        self.buffers = [arenas[p.dtype][p.start:p.end] for p in pieces]
        self.nbytes = sum(b.numel() * b.element_size() for b in self.buffers)
        self.group = group  # not used: the steps run on the node groups
        self.world_size = world_size
        self.rank = rank
        self.on_complete = on_complete
        self.works: list[dist.Work] = []  # the current step's collectives
        self.layout = nodes.layout
        self.sequencer = sequencer
        self.steps: list[tuple[str, dist.ProcessGroup]] = [
            (name, pg) for name, pg in ((REDUCE, nodes.reduce), (ALLREDUCE, nodes.leaders), (BROADCAST, nodes.broadcast))
            if pg is not None]
        device = self.buffers[0].device if self.buffers else torch.device("cpu")
        self.host_wait = not (self.steps and uses_nccl(self.steps[0][1], device))
        if self.host_wait and device.type != "cpu" and self.steps:
            raise GradschedError(f"operation {index} (hier-allreduce) holds {device.type} tensors on gloo, which "
                                 "reduces CPU tensors only; run the process group on NCCL for GPU tensors "
                                 "(e.g. init_process_group('cpu:gloo,cuda:nccl'))")
        self.cond = threading.Condition(sequencer.lock)  # gloo: signalled when the last step completes or fails
        self.completed = 0  # steps completed (gloo)
        self.finished = True
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ OpRunner protocol
    def issue(self) -> None:
        for buf in self.buffers:
            buf.div_(self.world_size)
        if not self.host_wait:
            self._issue_stream_ordered()
            return
        with self.sequencer.lock:
            self.completed, self.finished, self.error = 0, False, None
            self.sequencer.enqueue(self, [name for name, _ in self.steps[1:]])
            if not self.steps:
                self._finish()
                return
            self.issue_step(self.steps[0][0])

    def is_done(self) -> bool:
        if self.host_wait:
            return self.finished
        return all(w.is_completed() for w in self.works)

    def wait(self, timeout_s: float) -> None:
        what = f"hier-allreduce of operation {self.index} ({self.nbytes} bytes)"
        if not self.host_wait:
            wait_all(self.works, host_wait=False, timeout_s=timeout_s, rank=self.rank, what=what)
            self.works = []
            return
        with self.cond:
            if not self.cond.wait_for(lambda: self.finished, timeout=timeout_s):
                step = self.steps[self.completed][0] if self.completed < len(self.steps) else "?"
                raise CollectiveError(f"rank {self.rank}: {what} did not complete within {timeout_s:g} s (waiting "
                                      f"for its {step} step): a peer rank probably died, stalled or ran a different "
                                      "number of steps")
            error, self.error = self.error, None
            self.works = []
        if error is not None:
            first = str(error).splitlines()[0] if str(error) else ""
            raise CollectiveError(f"rank {self.rank}: {what} failed: a peer rank probably died, stalled or ran a "
                                  f"different number of steps ({type(error).__name__}: {first})") from error

    # ------------------------------------------------------------------ steps
    def _start(self, step: str, pg: dist.ProcessGroup) -> list[dist.Work]:
        leader = self.layout.leader
        if step == REDUCE:
            return [dist.reduce(b, dst=leader, op=dist.ReduceOp.SUM, group=pg, async_op=True) for b in self.buffers]
        if step == ALLREDUCE:
            return [dist.all_reduce(b, op=dist.ReduceOp.SUM, group=pg, async_op=True) for b in self.buffers]
        return [dist.broadcast(b, src=leader, group=pg, async_op=True) for b in self.buffers]

    def _issue_stream_ordered(self) -> None:
        """NCCL: every step now, each made to wait for the one before on the current stream."""
        works: list[dist.Work] = []
        for k, (step, pg) in enumerate(self.steps):
            if k:
                for w in works:
                    w.wait()  # the current stream waits; the next step's stream waits for it
            works = self._start(step, pg)
        self.works = works
        if self.on_complete is not None and works:
            works[-1].get_future().add_done_callback(lambda _f: self.on_complete(self.index))

    def ready_for(self, step: str) -> bool:
        """Gloo, under the sequencer's lock: is ``step`` next and the step before it complete?"""
        return not self.finished and self.completed < len(self.steps) and self.steps[self.completed][0] == step

    def issue_step(self, step: str) -> None:
        """Gloo, under the sequencer's lock: start ``step``; its completion starts the next one."""
        pg = dict(self.steps)[step]
        try:
            self.works = self._start(step, pg)
        except Exception as exc:  # e.g. the group was destroyed: fail this operation, not the backend thread
            self._fail(exc)
            return
        futures = [w.get_future() for w in self.works]
        done = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)
        done.add_done_callback(lambda _f, fs=futures: self._step_done(fs))

    def _step_done(self, futures: list[Any]) -> None:
        """Completion callback of a step (backend thread, or inline): record it, start what it frees."""
        with self.sequencer.lock:
            if self.finished:
                return
            try:
                for f in futures:
                    f.value()  # raises the step's error
            except Exception as exc:
                self._fail(exc)
                return
            self.completed += 1
            if self.completed == len(self.steps):
                self._finish()
            else:
                self.sequencer.pump(self.steps[self.completed][0])

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self._finish()

    def _finish(self) -> None:
        self.finished = True
        self.cond.notify_all()
        if self.on_complete is not None:
            self.on_complete(self.index)


OP_KINDS[HIER] = HierAllReduce
