"""The plan executor: gradients into buckets, collectives in the agreed order, results back.

One executor per wrapped model.  Per backward pass:

1. A post-accumulate-grad hook per parameter (public autograd API) marks the
   tensor ready: its gradient is already in the bucket if ``.grad`` is a view into
   the arena, otherwise it is copied there.  The first hook of a backward queues
   :meth:`Executor.finalize` to run when the autograd engine finishes the pass.
2. :meth:`Executor.progress` issues operations strictly in the issue order (see
   :mod:`gradsched.torch.runtime.planning`): the next one goes as soon as all its tensors are
   ready and, with a credit window, the bytes in flight leave room for it.  Progress
   is made at every gradient-ready hook, at the end of backward and whenever a
   caller waits.  With a credit window that is not enough: a block that completes
   while the model computes (a long layer) would leave the channel idle until the
   next hook.  So plans whose ``credit_bytes`` can hold an operation back (a window
   smaller than all the plan moves) get a progress thread (see :class:`_Wake`): each
   operation's completion wakes it and it calls ``progress``, issuing the next block
   at once, as the simulator assumes.
3. :meth:`Executor.finalize` marks parameters that got no gradient (with
   ``find_unused_parameters``) as ready with zeros and, unless the plan overlaps with
   the next forward, waits for every operation and writes the averaged gradients
   back.  With ``overlap_forward`` the operations stay in flight; the optimizer
   wrapper waits for each parameter's operations just before the parameter is
   needed (:meth:`Executor.settle`).

A parameter unused on every rank keeps its ``.grad`` unchanged (``None`` stays
``None``), as in DDP, so optimizers skip it.

Sparse (``topk-allgather``) operations run in :mod:`gradsched.torch.runtime.sparse`; in its
default ``laysa`` memory mode their tensors' gradients are added into the residual
(their piece of the flat buffer) and released, and the dense result is delivered one
chunk of whole tensors at a time by :class:`~gradsched.torch.runtime.sparse.LaysaDelivery`:
each chunk updates its weights through :attr:`Executor.mirror` (set by
``DistributedOptimizer``) and is freed.  Every buffer goes through
:attr:`Executor.ledger` (:mod:`gradsched.torch.runtime.memory`).

Two-level (``hier-allreduce``) operations run in :mod:`gradsched.torch.runtime.hier` on
node groups that the executor makes once per owner (:mod:`gradsched.torch.runtime.nodes`,
``ranks_per_node``); to the issue order, the credit window and the trace they are one
operation each, like a dense one.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from gradsched.errors import GradschedError, InternalError
from gradsched.plan import REDUCE_SCATTER, Plan
from gradsched.torch.runtime.decoupled import DecoupledAllReduce, retire_alone
from gradsched.torch.runtime.groups import gloo_thread_group, side_group, uses_nccl
from gradsched.torch.runtime.hier import Sequencer
from gradsched.torch.runtime.hosttime import HostTimer
from gradsched.torch.runtime.inflight import unwrap
from gradsched.torch.runtime.layout import build_layout
from gradsched.torch.runtime.memory import MemoryLedger, storage_bytes
from gradsched.torch.runtime.nodes import NodeGroups, node_groups, uses_nodes
from gradsched.torch.runtime.ops import CollectiveError, OpRunner, make_runner, wait_all
from gradsched.torch.runtime.planning import dtype_key
from gradsched.torch.runtime.shutdown import close_at_exit, collective_failed, release_at_exit
from gradsched.torch.runtime.sparse import LaysaDelivery, SparseOptions, TopkAllGather, check_replicas
from gradsched.torch.runtime.trace import WAIT, Tracer

PENDING, ISSUED, DONE = 0, 1, 2
NCCL_POLL_S = 0.001  # NCCL futures complete at enqueue, not at the end: the progress thread polls is_completed()
IDLE_CHECK_S = 1.0  # an idle progress thread checks this often whether its executor is gone (no leak)
CLOSE_WAIT_S = 30.0  # closing waits at most this long for each operation in flight (peers may be gone)

_PRIVATE_GROUPS: "weakref.WeakKeyDictionary[object, dict[int | None, dist.ProcessGroup]]" = weakref.WeakKeyDictionary()
OVERLAP_THREADS_ENV = "GRADSCHED_OVERLAP_GLOO_THREADS"


def private_group(group: dist.ProcessGroup, timeout_s: float, owner: object,
                  gloo_threads: int | None = None) -> dist.ProcessGroup:
    """``owner``'s private copy of ``group`` (a collective: every rank of ``group`` calls it at the same point).

    Plans whose issue times depend on timing (a credit window: a completion frees
    room) issue on a group of their own: another collective on the user's group (a
    logged loss all-reduce between steps), or another wrapped model's operations (a
    GAN's generator and discriminator, a teacher and a student), could otherwise
    interleave with them in a different order on different ranks.  One per ``owner``
    (the wrapped model; made when its first such plan starts) and ``gloo_threads``
    (gloo's worker threads: :func:`gradsched.torch.runtime.groups.gloo_thread_group`), held here, not by the
    owner, so that it is never held into finalisation (gradsched.torch.runtime.shutdown).
    Entered by ``group``'s members only (:func:`gradsched.torch.runtime.groups.side_group`)."""
    release_at_exit(_PRIVATE_GROUPS.clear)
    mine = _PRIVATE_GROUPS.setdefault(owner, {})
    if gloo_threads not in mine:
        mine[gloo_threads] = (side_group(group, timeout_s) if gloo_threads is None
                              else gloo_thread_group(group, timeout_s, gloo_threads))
    return mine[gloo_threads]


def overlap_gloo_threads() -> int | None:
    """gloo worker threads of the private group a plan that overlaps the next forward issues on
    (``$GRADSCHED_OVERLAP_GLOO_THREADS``); None (unset, the default): the user's group, as every fifo plan.

    An experiment switch: gloo's two threads finish queued operations in pairs, which could delay the
    operation the next forward waits for first; one thread did not help (DenseNet-201's ``usbyte`` with
    ``groups=0`` at 8 emulated hosts, back to back: 762 ms a step against 755 on the user's group,
    docs/notes/2026-12-q12.md), so it stays off."""
    value = os.environ.get(OVERLAP_THREADS_ENV, "").strip()
    return int(value) if value else None


class _Wake:
    """What the progress thread sleeps on: set by completion callbacks (backend threads), never blocking them.

    Its lock is its own, not the executor's: a callback only flips a flag and
    notifies, so it can never wait for a thread that is blocked in ``work.wait()``."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.signalled = False
        self.stopped = False

    def notify(self) -> None:
        with self.cond:
            self.signalled = True
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def wait(self, timeout_s: float) -> bool:
        """True when signalled (consumed) or stopped; False on timeout."""
        with self.cond:
            self.cond.wait_for(lambda: self.signalled or self.stopped, timeout=timeout_s)
            hit = self.signalled or self.stopped
            self.signalled = False
            return hit


def _progress_loop(ref: "weakref.ReferenceType[Executor]", wake: _Wake, stream: object, poll_s: float | None) -> None:
    """Body of the progress thread: on every wake-up, ``progress`` under the executor's lock.

    Holds the executor only weakly between wake-ups, so an executor dropped without
    ``close()`` is still freed (the thread then ends)."""
    import contextlib

    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with ctx:  # NCCL: issue on the main thread's stream, as the hooks do
        while not wake.stopped:
            ex = ref()
            timeout_s = poll_s if (poll_s is not None and ex is not None and ex._waiting_on_credit()) else IDLE_CHECK_S
            del ex
            wake.wait(timeout_s)
            if wake.stopped:
                return
            ex = ref()
            if ex is None:
                return
            if not ex._progress_from_thread():
                return
            del ex


class Executor:
    """Runs ``plan`` for ``params`` (plan-index order) on ``group``."""

    def __init__(self, params: list[nn.Parameter], names: list[str], plan: Plan, order: list[int],
                 group: dist.ProcessGroup, ctrl_group: dist.ProcessGroup, *, timeout_s: float,
                 find_unused_parameters: bool, tracer: Tracer | None,
                 sparse_options: SparseOptions | dict | None = None, progress_thread: bool = True,
                 private_owner: object | None = None, ranks_per_node: int = 1) -> None:
        # long function: declares the executor's whole state in one place, grouped by role
        self.params = params
        self.names = names
        self.plan = plan
        self.order = order
        self.group = group
        self.ctrl_group = ctrl_group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.timeout_s = timeout_s
        self.find_unused = find_unused_parameters
        self.tracer = tracer
        self.credit_bytes = plan.credit_bytes
        self.layout = build_layout(plan, [dtype_key(p.dtype) for p in params], [p.numel() for p in params],
                                   [p.is_contiguous() for p in params])
        self.ledger = MemoryLedger()
        self.sparse_options = SparseOptions.of(sparse_options)
        self.sparse_step = 0  # synchronised backward passes so far (dense warm-up; saved with the residuals)
        self.mirror: Callable[[list[nn.Parameter]], None] | None = None  # per-chunk update (DistributedOptimizer)
        self.sparse_tensor = [False] * len(params)
        sparse_ops = [j for j, op in enumerate(plan.operations) if op.sparse]
        for j in sparse_ops:
            for t in self.layout.op_tensors[j]:
                self.sparse_tensor[t] = True
        self.laysa = bool(sparse_ops) and self.sparse_options.memory == "laysa"
        if sparse_ops:
            self._check_sparse_plan(sparse_ops)
        self.delivery = LaysaDelivery(params, names, self.layout, self.ledger, tracer) if self.laysa else None
        device = params[0].device
        dtypes = {dtype_key(p.dtype): p.dtype for p in params}
        self.arenas = {dt: self.ledger.alloc(f"arena/{dt}", torch.zeros(n, dtype=dtypes[dt], device=device))
                       for dt, n in self.layout.arena_numel.items()}
        self.views: list[torch.Tensor | None] = []
        for i, (p, start) in enumerate(zip(params, self.layout.view_start)):
            if self.laysa and self.sparse_tensor[i]:
                start = None  # the piece is the residual: gradients are added into it, never aliased
            arena = self.arenas[dtype_key(p.dtype)] if start is not None else None
            self.views.append(arena[start:start + p.numel()].view_as(p) if arena is not None else None)
        self.tensor_slots = [[] for _ in params]
        for slots in self.layout.op_slots:
            for s in slots:
                self.tensor_slots[s.tensor].append(s)
        owner = self if private_owner is None else private_owner
        # hier-allreduce operations: the node groups (made once per owner, on every rank) and their sequencer
        self.nodes: NodeGroups | None = (node_groups(group, ranks_per_node, timeout_s, owner) if uses_nodes(plan)
                                         else None)
        self.decoupled = any(op.collective == REDUCE_SCATTER for op in plan.operations)  # decoupled all-reduces
        sequencer = Sequencer()
        self.runners: list[OpRunner] = [
            make_runner(j, op, self.layout.op_pieces[j], self.arenas, group, self.world_size, self.rank, None,
                        ledger=self.ledger, options=self.sparse_options, step_of=lambda: self.sparse_step,
                        nodes=self.nodes, sequencer=sequencer)
            for j, op in enumerate(plan.operations)]
        if self.credit_bytes is not None and self.credit_bytes >= sum(r.nbytes for r in self.runners):
            # A window that holds everything the plan moves never holds an operation back.
            # Without it there is no progress thread to wake, and each wake-up takes the GIL
            # from the model's thread: on cnn (2 local ranks, 1.2 MB of gradients under an
            # 8 MB window) bytescheduler's step took 97 ms with the thread woken at every
            # completion, against 77 ms for usbyte's operations without one.
            self.credit_bytes = None
        # Progress thread: only a credit window holds back operations whose gradients are
        # ready; without one (fifo, no credit) everything goes at its hook and the backend
        # queues it.  Everything that reads or changes the issue state holds self._lock.
        self._lock = threading.RLock()
        self._thread_error: BaseException | None = None
        self._wake: _Wake | None = None
        self._thread: threading.Thread | None = None
        if self.credit_bytes is not None:  # issue times depend on completions: a group of its own
            self.group = private_group(group, timeout_s, owner)
        elif plan.overlap_forward and overlap_gloo_threads() is not None:
            self.group = private_group(group, timeout_s, owner, overlap_gloo_threads())
        if self.group is not group:
            group = self.group
            for r in self.runners:
                r.group = group
        if progress_thread and self.credit_bytes is not None:
            self._wake = _Wake()
        self.enabled = True  # False inside no_sync()
        self.in_backward = False
        # set by the wrapper (overlap plans): True when it leaves operations in flight (gradsched.torch.runtime.inflight)
        self.on_backward_end: Callable[[Executor], bool] | None = None
        self.host_timer: HostTimer | None = None  # counts host time per operation when set (gradsched bench)
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(params)]
        if plan.overlap_forward:  # operations may be in flight when a backward starts: see _before_accumulate
            self._hooks += [p.register_hook(self._before_accumulate) for p in params]
        self._reset()
        self.settled = True  # no operation of a past backward outstanding
        if self._wake is not None:
            self._start_thread(device)
        close_at_exit(self)

    def _check_sparse_plan(self, sparse_ops: list[int]) -> None:
        if self.plan.overlap_forward:
            raise GradschedError(f"plan {self.plan.strategy!r} overlaps with the next forward and has top-k "
                                 "operations; the runtime runs sparse operations only in non-overlapping plans")
        for j in sparse_ops:
            for s in self.layout.op_slots[j]:
                if self.layout.tensor_ops[s.tensor] != (j,) or s.start != 0 or s.end != self.params[s.tensor].numel():
                    raise GradschedError(f"operation {j} (topk-allgather) holds part of tensor {self.names[s.tensor]}; "
                                         "sparse operations must hold whole tensors, each in one operation "
                                         "(plan with topk or omgs)")

    # ------------------------------------------------------------------ memory and sparse state
    def held_buffers(self) -> dict[str, torch.Tensor]:
        """Every buffer the executor holds now, by ledger name (the ledger's live bytes are their storage)."""
        out: dict[str, torch.Tensor] = {f"arena/{dt}": a for dt, a in self.arenas.items()}
        for r in self.runners:
            if isinstance(r, TopkAllGather):
                out.update(r.held)
        if self.delivery is not None:
            out.update(self.delivery.kept)
        return out

    def sparse_state(self) -> dict[str, torch.Tensor]:
        """This rank's residuals and the step counter (empty for dense plans), tagged with the rank that saved
        them and the world size: what a resumed run on this rank needs to continue exactly."""
        out: dict[str, torch.Tensor] = {}
        for j, r in enumerate(self.runners):
            if isinstance(r, TopkAllGather):
                out[f"residual.op{j}"] = r.residual_tensor().detach().clone()
        if out:
            out["step"] = torch.tensor(self.sparse_step, dtype=torch.int64)
            out["rank"] = torch.tensor(self.rank, dtype=torch.int64)
            out["world_size"] = torch.tensor(self.world_size, dtype=torch.int64)
        return out

    def gathered_sparse_state(self) -> dict[str, torch.Tensor]:
        """Every rank's residuals as one ``[world_size, n]`` tensor per operation (``rank`` -1): a
        collective on every rank, after :meth:`settle_all`.  Loaded on any rank, it restores that rank's row."""
        out = self.sparse_state()
        for key in [k for k in out if k.startswith("residual.")]:
            mine = out[key]
            rows = [torch.empty_like(mine) for _ in range(self.world_size)]
            work = dist.all_gather(rows, mine, group=self.ctrl_group, async_op=True)
            wait_all([work], host_wait=True, timeout_s=self.timeout_s, rank=self.rank,
                     what=f"gathering the residuals ({key})")
            out[key] = torch.stack(rows)
        if out:
            out["rank"] = torch.tensor(-1, dtype=torch.int64)
        return out

    def load_sparse_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`sparse_state` (saved by this rank) or :meth:`gathered_sparse_state` (any rank's file).

        Another rank's own residuals are refused: loading them here would drop this rank's
        and count that rank's twice."""
        mine = self.sparse_state()
        need = {k for k in mine if k.startswith("residual.")} | {"step"}
        given = {k for k in state if k.startswith("residual.")} | ({"step"} & set(state))
        if given != need:
            raise GradschedError(f"sparse state has keys {sorted(state)}, this plan needs {sorted(mine)}: the "
                                 "checkpoint was saved under another plan; load it with the same strategy and options")
        saver = int(state["rank"]) if "rank" in state else 0  # untagged (older gradsched): rank 0's, the usual saver
        world = int(state["world_size"]) if "world_size" in state else self.world_size
        if world != self.world_size:
            raise GradschedError(f"the checkpoint holds residuals of {world} rank(s), this run has {self.world_size}: "
                                 "resume on as many ranks, or drop its '_gradsched_sparse.*' keys and load with "
                                 "strict=False to start with empty residuals")
        if saver >= 0 and saver != self.rank:
            raise GradschedError(f"the checkpoint holds rank {saver}'s residuals only, loaded on rank {self.rank}: "
                                 "save with model.gathered_state_dict() on every rank (a collective; rank 0 writes "
                                 "the file) to keep every rank's residuals, or save and load one file per rank")
        for j, r in enumerate(self.runners):
            if isinstance(r, TopkAllGather):
                saved = state[f"residual.op{j}"]
                if saver < 0 and saved.dim() == 2:
                    saved = saved[self.rank]
                if saved.shape != r.residual_tensor().shape:
                    raise GradschedError(f"residual of operation {j} has shape {tuple(saved.shape)}, expected "
                                         f"{tuple(r.residual_tensor().shape)}: checkpoint from another plan")
                r.residual_tensor().copy_(saved)
        self.sparse_step = int(state["step"])

    # ------------------------------------------------------------------ state
    def _start_thread(self, device: torch.device) -> None:
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        poll_s = NCCL_POLL_S if uses_nccl(self.group, device) else None
        assert self._wake is not None
        self._thread = threading.Thread(target=_progress_loop, args=(weakref.ref(self), self._wake, stream, poll_s),
                                        name=f"gradsched-progress-rank{self.rank}", daemon=True)
        self._thread.start()

    def stop_progress_thread(self) -> None:
        """Stop the progress thread (if any); progress is then made only by the caller's thread, as without credit."""
        if self._wake is not None:
            self._wake.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)
        self._thread = None

    def _progress_from_thread(self) -> bool:
        """One round of the progress thread; False when it must end (a failure, kept for the main thread)."""
        with self._lock:
            if self._thread_error is not None:
                return False
            try:
                self.progress(dense_only=True)
            except BaseException as exc:  # raised again on the main thread at its next entry
                self._thread_error = exc
                return False
        return True

    def _waiting_on_credit(self) -> bool:
        """Is an operation with ready gradients held back by the credit window? (racy read: only a poll hint)"""
        pos = self.next_pos
        return bool(self.inflight) and pos < len(self.order) and self.op_missing[self.order[pos]] == 0

    def _check_thread(self) -> None:
        if self._thread_error is not None:
            exc, self._thread_error = self._thread_error, None
            raise exc

    def _reset(self) -> None:
        with self._lock:
            self._reset_locked()

    def _reset_locked(self) -> None:
        n_ops = len(self.runners)
        self.tensor_ready = [False] * len(self.params)
        self.locally_unused: set[int] = set()
        self.globally_unused: set[int] = set()
        self.op_missing = [len(t) for t in self.layout.op_tensors]
        self.op_state = [PENDING] * n_ops
        self.tensor_ops_left = [len(ops) for ops in self.layout.tensor_ops]
        self.written = [False] * len(self.params)
        self.fresh: list[int] = []  # tensors written since the last settle_done() (or this backward's start)
        self.retired: list[int] = []  # operations retired since the last settle_done(), results maybe unwritten
        self.next_pos = 0
        self.inflight: deque[int] = deque()
        self.inflight_bytes = 0

    def unfinished_bytes(self) -> tuple[int, int]:
        """(bytes of the plan's operations not complete: not issued, or issued and running; bytes the plan
        moves) for the last backward: what is left to overlap the next forward when ``step()`` returns."""
        with self._lock:
            total = sum(r.nbytes for r in self.runners)
            left = sum(r.nbytes for j, r in enumerate(self.runners)
                       if self.op_state[j] == PENDING or (self.op_state[j] != DONE and not r.is_done()))
        return left, total

    @property
    def hooked(self) -> bool:
        """Whether its gradient hooks are on the parameters (until :meth:`close`)."""
        return bool(self._hooks)

    def close(self) -> None:
        """Stop the progress thread, remove the hooks, let the collectives in flight finish, forget them.

        The executor is not used again (a plan switch builds a new one).  Called at
        interpreter exit too (:mod:`gradsched.torch.runtime.shutdown`): a collective that
        completed during finalisation would run its completion callback on a backend
        thread that can no longer take the GIL, which aborts the process, so every
        operation in flight is waited for here (bounded: a peer may be gone), unless a collective
        already failed: then none will complete, and the exit watchdog bounds finalisation."""
        self.stop_progress_thread()
        with self._lock:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            for j in ([] if collective_failed() else self.inflight):
                try:
                    self.runners[j].wait(min(self.timeout_s, CLOSE_WAIT_S))
                except GradschedError:
                    pass  # a peer is gone or the group destroyed: nothing left to wait for
            for r in self.runners:
                r.on_complete = None
                r.works = []
            self.inflight.clear()

    # ------------------------------------------------------------------ hooks
    def _make_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if not self.enabled:
                return
            with self._lock:
                self._check_thread()
                if not self.in_backward:
                    self._begin_backward()
                if self.tensor_ready[i]:
                    raise GradschedError(f"parameter {self.names[i]} received a gradient twice in one backward pass; "
                                         "gradsched (like DDP) supports one gradient per parameter per backward "
                                         "(reentrant checkpointing or double backward need DDP's static_graph)")
                self._place_grad(i)
                if self.tracer is not None:
                    self.tracer.grad_ready(i, self.names[i])
                self._mark_ready(i)
                if self._may_issue():
                    self.progress()

        return hook

    def _may_issue(self) -> bool:
        """Whether a hook's ``progress`` can issue anything: with a credit window a completion may have freed
        room, without one only the next operation in the issue order having all its gradients can.

        Skipping the others leaves operations that completed in flight until the next issue, the end of
        backward or a wait retires them, as the simulator's channel does not care when the host notices: on
        BERT-Base's 154 tensors in 13 buckets it spares 141 of 154 hooks the issue loop and a lock
        (docs/notes/2026-12-runtime-overhead.md)."""
        if self.credit_bytes is not None:
            return True
        pos = self.next_pos
        return pos < len(self.order) and self.op_missing[self.order[pos]] == 0

    def _before_accumulate(self, grad: torch.Tensor) -> None:
        """Tensor hook (runs before autograd adds ``grad`` into ``.grad``): a backward that starts while the
        last one's operations are in flight (a second ``backward()`` before the next forward:
        ``l1.backward(retain_graph=True); l2.backward()``) finishes them first.

        Autograd accumulates into ``.grad`` in C++, which sees no guard: into a bucket still
        being all-reduced it would race with the collective (parameters 33-72% off, issue 39).
        Finished first, ``.grad`` holds the averaged gradient, the new local one is added to
        it, and this backward's operations average the sum again: the average of the summed
        gradients, what one backward of the summed losses gives."""
        if not self.settled and not self.in_backward:
            self.settle_all()

    def _begin_backward(self) -> None:
        if not self.settled:
            self.settle_all()  # a backward without the forward gating in between: finish the old one first
        every = self.sparse_options.check_every
        if any(self.sparse_tensor) and every and self.sparse_step and self.sparse_step % every == 0:
            check_replicas(self.params, self.ctrl_group, step=self.sparse_step, rank=self.rank,
                           timeout_s=self.timeout_s)  # last step's updates are done: ranks must agree
        if self.delivery is not None:
            self.delivery.release_kept()  # last step's results the optimizer has used by now
        self._reset()
        self.in_backward = True
        self.settled = False
        if self.tracer is not None:
            self.tracer.backward_started()
        # The only way to run code when the autograd engine finishes a pass (DDP and
        # FSDP do the same): queue a callback from inside the backward.
        torch.autograd.Variable._execution_engine.queue_callback(self.finalize)

    def _place_grad(self, i: int) -> None:
        """Put tensor ``i``'s local gradient (zeros if it has none) into its bucket slots."""
        p = self.params[i]
        g = p.grad
        view = self.views[i]
        if g is not None and (view is None or g.data_ptr() != view.data_ptr()):
            self.ledger.transient(storage_bytes(g))  # autograd's fresh gradient, alive until released below
        if self.laysa and self.sparse_tensor[i]:
            if g is not None:
                (s,) = self.tensor_slots[i]
                self.arenas[s.dtype][s.arena_start:s.arena_start + s.end - s.start].add_(g.reshape(-1))
                p.grad = None  # now part of the compensated gradient (residual + gradient)
            return
        if view is not None:
            if g is None:
                view.zero_()  # unused here; .grad is assigned only if some rank used it
            elif g.data_ptr() != view.data_ptr():
                view.copy_(g)
                p.grad = view
            return
        flat = g.reshape(-1) if g is not None else None
        for s in self.tensor_slots[i]:
            dst = self.arenas[s.dtype][s.arena_start:s.arena_start + s.end - s.start]
            if flat is None:
                dst.zero_()
            else:
                dst.copy_(flat[s.start:s.end])

    def _mark_ready(self, i: int) -> None:
        self.tensor_ready[i] = True
        for j in self.layout.tensor_ops[i]:
            self.op_missing[j] -= 1

    # ------------------------------------------------------------------ issuing
    def _host(self, kind: str, fn: Callable[..., None], *args: object) -> None:
        """``fn(*args)``, counted as host time of ``kind`` if a :class:`HostTimer` is set."""
        if self.host_timer is None:
            fn(*args)
        else:
            self.host_timer.count(kind, fn, *args)

    def progress(self, dense_only: bool = False) -> None:
        """Retire completed operations and issue every operation the order and credit allow.

        The order is ``self.order`` alone, whoever calls (a hook, a waiter or the
        progress thread, one at a time under ``self._lock``), so every rank issues the
        same sequence.  ``dense_only`` (the progress thread) stops at a sparse
        operation: its issue compresses and allocates LaySA buffers, and its retirement
        rebuilds results, which stay on the main thread with the rest of that state."""
        self._host("issue", self._progress_under_lock, dense_only)

    def _progress_under_lock(self, dense_only: bool) -> None:
        with self._lock:
            self._progress_locked(dense_only)

    def _progress_locked(self, dense_only: bool) -> None:
        sparse = self.plan.operations
        while self.inflight and self.runners[self.inflight[0]].is_done():
            if dense_only and sparse[self.inflight[0]].sparse:
                return
            self._retire(self.inflight.popleft())
        while self.next_pos < len(self.order):
            j = self.order[self.next_pos]
            if self.op_missing[j] > 0 or (dense_only and sparse[j].sparse):
                return
            r = self.runners[j]
            if self.credit_bytes is not None and self.inflight and self.inflight_bytes + r.nbytes > self.credit_bytes:
                return
            if self.tracer is not None:
                self.tracer.op_issued(j, self.plan.operations[j].collective)
            # a completion callback only where something needs it: it takes the GIL from the model
            stamp = self.tracer is not None and self.tracer.completions
            r.on_complete = self._on_complete if stamp or self._wake is not None else None
            r.issue()
            self.op_state[j] = ISSUED
            self.inflight.append(j)
            self.inflight_bytes += r.nbytes
            self.next_pos += 1

    def _retire(self, j: int) -> None:
        self.runners[j].wait(self.timeout_s)
        if self.tracer is not None:
            self.tracer.op_completed(j, self.runners[j].nbytes)
        self.op_state[j] = DONE
        self.inflight_bytes -= self.runners[j].nbytes
        self.retired.append(j)

    def _on_complete(self, j: int) -> None:
        """Runs on the backend's thread when operation ``j`` completes: record it, wake the progress thread.

        Never blocks and never takes the executor's lock (its holder may be blocked in
        ``work.wait()`` for this very operation)."""
        if self.tracer is not None:
            self.tracer.op_completed(j, self.runners[j].nbytes)
        if self._wake is not None:
            self._wake.notify()

    def _drain(self, j: int) -> None:
        """Block until operation ``j`` is done, issuing what the credit window frees on the way.

        Holds the lock while blocked in ``wait()`` on the oldest operation in flight:
        that operation is already issued here, so its completion needs only the peers,
        never this rank's progress thread, and the caller issues what it frees."""
        with self._lock:
            self._check_thread()
            self._drain_locked(j)

    def _drain_locked(self, j: int) -> None:
        if self.decoupled and retire_alone(self, j):  # gathered in forward order, retired alone
            self.inflight.remove(j)
            self._retire(j)
            return
        while self.op_state[j] != DONE:
            if self.inflight:
                self._retire(self.inflight.popleft())
            self.progress()
            if self.op_state[j] == PENDING and not self.inflight:
                raise InternalError(f"operation {j} can never be issued (its gradients are not ready)")

    # ------------------------------------------------------------------ end of backward
    def finalize(self) -> None:
        """End of the backward pass (autograd engine callback)."""
        with self._lock:
            self._check_thread()
            self._finalize_locked()

    def _finalize_locked(self) -> None:
        self.in_backward = False
        missing = [i for i, r in enumerate(self.tensor_ready) if not r]
        if missing:
            if not self.find_unused:
                names = ", ".join(self.names[i] for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
                raise GradschedError(f"{len(missing)} parameter(s) got no gradient in this backward pass ({names}); "
                                     "pass find_unused_parameters=True, or freeze them (requires_grad=False) "
                                     "before wrapping")
            for i in missing:
                self._place_grad(i)
                self._mark_ready(i)
            self.locally_unused = set(missing)
        if self.find_unused:
            self._agree_on_unused()
            self._hold_back_unused_residuals()
        self.progress()
        if self.on_backward_end is None or not self.on_backward_end(self):
            wait_start = self.tracer.now() if self.tracer is not None else 0.0
            self.settle_all()
            if self.tracer is not None:
                self.tracer.span("wait for communication", WAIT, wait_start)
        self.sparse_step += 1
        if self.host_timer is not None:
            self.host_timer.passes += 1

    def _agree_on_unused(self) -> None:
        here = self.params[0].device
        device = here if uses_nccl(self.ctrl_group, here) else torch.device("cpu")
        used = torch.tensor([0 if i in self.locally_unused else 1 for i in range(len(self.params))],
                            dtype=torch.int32, device=device)
        work = dist.all_reduce(used, group=self.ctrl_group, async_op=True)
        try:
            work.wait(timeout=_td(self.timeout_s))
        except Exception as exc:
            raise CollectiveError(f"rank {self.rank}: exchange of used-parameter flags failed or timed out after "
                                  f"{self.timeout_s:g} s: a peer rank probably died ({exc})") from exc
        self.globally_unused = {i for i, c in enumerate(used.tolist()) if c == 0}

    def _hold_back_unused_residuals(self) -> None:
        """Tell each sparse operation which of its tensors no rank used: their residuals stay for later."""
        for j, r in enumerate(self.runners):
            if isinstance(r, TopkAllGather):
                base = self.layout.op_pieces[j][0].start
                r.keep = [(s.arena_start - base, s.arena_start - base + s.end - s.start)
                          for s in self.layout.op_slots[j] if s.tensor in self.globally_unused]

    # ------------------------------------------------------------------ results
    def settle(self, tensors: list[int]) -> None:
        """Make sure the averaged gradients of ``tensors`` are in their ``.grad``."""
        self._host("retire", self._settle, tensors)

    def _settle(self, tensors: list[int]) -> None:
        with self._lock:
            for i in tensors:
                if self.written[i]:
                    continue
                for j in self.layout.tensor_ops[i]:
                    self._complete(j)

    def settle_all(self) -> None:
        self._host("retire", self._settle_all)

    def _settle_all(self) -> None:
        with self._lock:
            for j in self.order:
                self._complete(j)
            self.settled = True

    def settle_done(self) -> list[int]:
        """Without waiting: retire the operations already complete, write their results into ``.grad``, and
        return every tensor whose result was written since the last call (by this, :meth:`settle` or
        :meth:`settle_all`) or since this backward began.

        An overlapping plan's optimizer updates these together with the tensors a layer's gate waited for
        (:meth:`DistributedOptimizer.apply <gradsched.torch.runtime.optim.DistributedOptimizer.apply>`): one
        ``step()`` per completed operation at most, not one per layer."""
        out: list[int] = []
        self._host("retire", self._settle_done, out)
        return out

    def _settle_done(self, out: list[int]) -> None:
        with self._lock:
            self._check_thread()
            self._progress_locked(False)  # retires the completed prefix of the issue order, issues what it frees
            if self.decoupled:  # gathered in forward order: retired alone once their gather is done
                for j in [k for k in self.inflight if isinstance(self.runners[k], DecoupledAllReduce)
                          and self.runners[k].is_done()]:
                    self.inflight.remove(j)
                    self._retire(j)
            sparse = self.delivery is not None
            for j in self.retired:
                if sparse and self.plan.operations[j].sparse:
                    continue  # delivered by _complete, as it waits
                for t in self.layout.op_tensors[j]:
                    if not self.written[t] and all(self.op_state[k] == DONE for k in self.layout.tensor_ops[t]):
                        self._write_back(t)
            self.retired.clear()
            out.extend(self.fresh)
            self.fresh.clear()

    def _complete(self, j: int) -> None:
        if self.op_state[j] == DONE and all(self.written[t] for t in self.layout.op_tensors[j]):
            return
        self._drain(j)
        if self.delivery is not None and self.plan.operations[j].sparse:
            runner = self.runners[j]
            assert isinstance(runner, TopkAllGather)
            self.delivery.deliver(j, runner, self.mirror, self.written, self.globally_unused)
            self.op_state[j] = DONE
            return
        for t in self.layout.op_tensors[j]:
            if self.written[t]:
                continue
            if all(self.op_state[k] == DONE for k in self.layout.tensor_ops[t]):
                self._write_back(t)

    def _write_back(self, i: int) -> None:
        self.written[i] = True
        self.fresh.append(i)
        if i in self.globally_unused:
            return  # no rank computed it: leave .grad as it was (None stays None), like DDP
        p = self.params[i]
        unwrap(p)  # a guard that waited for this (gradsched.torch.runtime.inflight): the plain tensor again
        view = self.views[i]
        if view is not None:
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view
            return
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        flat = g.view(-1) if g.is_contiguous() else g.reshape(-1).clone()
        for s in self.tensor_slots[i]:
            flat[s.start:s.end].copy_(self.arenas[s.dtype][s.arena_start:s.arena_start + s.end - s.start])
        if not g.is_contiguous():
            g.copy_(flat.view(g.shape))


def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
