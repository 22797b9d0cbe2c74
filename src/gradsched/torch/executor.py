"""The plan executor: gradients into buckets, collectives in the agreed order, results back.

One executor per wrapped model.  Per backward pass:

1. A post-accumulate-grad hook per parameter (public autograd API) marks the
   tensor ready: its gradient is already in the bucket if ``.grad`` is a view into
   the arena, otherwise it is copied there.  The first hook of a backward queues
   :meth:`Executor.finalize` to run when the autograd engine finishes the pass.
2. :meth:`Executor.progress` issues operations strictly in the issue order (see
   :mod:`gradsched.torch.planning`): the next one goes as soon as all its tensors are
   ready and, with a credit window, the bytes in flight leave room for it.  Progress
   is made at every gradient-ready hook, at the end of backward and whenever a
   caller waits; no extra thread is needed.
3. :meth:`Executor.finalize` marks parameters that got no gradient (with
   ``find_unused_parameters``) as ready with zeros and, unless the plan overlaps with
   the next forward, waits for every operation and writes the averaged gradients
   back.  With ``overlap_forward`` the operations stay in flight; the optimizer
   wrapper waits for each parameter's operations just before the parameter is
   needed (:meth:`Executor.settle`).

A parameter unused on every rank keeps its ``.grad`` unchanged (``None`` stays
``None``), as in DDP, so optimizers skip it.

Sparse (``topk-allgather``) operations run in :mod:`gradsched.torch.sparse`; in its
default ``laysa`` memory mode their tensors' gradients are added into the residual
(their piece of the flat buffer) and released, and the dense result is delivered one
chunk of whole tensors at a time: each chunk updates its weights through
:attr:`Executor.mirror` (set by ``DistributedOptimizer``) and is freed.  Every
buffer goes through :attr:`Executor.ledger` (:mod:`gradsched.torch.memory`).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.torch.layout import build_layout
from gradsched.torch.memory import MemoryLedger, storage_bytes
from gradsched.torch.ops import CollectiveError, OpRunner, make_runner
from gradsched.torch.planning import dtype_key
from gradsched.torch.sparse import SparseOptions, TopkAllGather
from gradsched.torch.trace import UPDATE, WAIT, Tracer

PENDING, ISSUED, DONE = 0, 1, 2


class Executor:
    """Runs ``plan`` for ``params`` (plan-index order) on ``group``."""

    def __init__(self, params: list[nn.Parameter], names: list[str], plan: Plan, order: list[int],
                 group: dist.ProcessGroup, ctrl_group: dist.ProcessGroup, *, timeout_s: float,
                 find_unused_parameters: bool, tracer: Tracer | None,
                 sparse_options: SparseOptions | dict | None = None) -> None:
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
        self.chunk_numel = max(p.numel() for p in params)  # a LaySA result chunk never exceeds the largest tensor
        self.kept: dict[str, torch.Tensor] = {}  # LaySA results left as .grad (no mirror update): freed next backward
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
        on_complete = self._traced_completion if tracer is not None else None
        self.runners: list[OpRunner] = [
            make_runner(j, op, self.layout.op_pieces[j], self.arenas, group, self.world_size, self.rank, on_complete,
                        ledger=self.ledger, options=self.sparse_options, step_of=lambda: self.sparse_step)
            for j, op in enumerate(plan.operations)]
        self.enabled = True  # False inside no_sync()
        self.in_backward = False
        self.on_backward_end: Callable[[], None] | None = None  # set by the wrapper (overlap plans)
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(params)]
        self._reset()
        self.settled = True  # no operation of a past backward outstanding

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
        out.update(self.kept)
        return out

    def sparse_state(self) -> dict[str, torch.Tensor]:
        """Residuals and the step counter (empty for dense plans): what a resumed run needs to continue exactly."""
        out: dict[str, torch.Tensor] = {}
        for j, r in enumerate(self.runners):
            if isinstance(r, TopkAllGather):
                out[f"residual.op{j}"] = r.residual_tensor().detach().clone()
        if out:
            out["step"] = torch.tensor(self.sparse_step, dtype=torch.int64)
        return out

    def load_sparse_state(self, state: dict[str, torch.Tensor]) -> None:
        mine = self.sparse_state()
        if set(state) != set(mine):
            raise GradschedError(f"sparse state has keys {sorted(state)}, this plan needs {sorted(mine)}: the "
                                 "checkpoint was saved under another plan; load it with the same strategy and options")
        for j, r in enumerate(self.runners):
            if isinstance(r, TopkAllGather):
                saved = state[f"residual.op{j}"]
                if saved.shape != r.residual_tensor().shape:
                    raise GradschedError(f"residual of operation {j} has shape {tuple(saved.shape)}, expected "
                                         f"{tuple(r.residual_tensor().shape)}: checkpoint from another plan")
                r.residual_tensor().copy_(saved)
        self.sparse_step = int(state["step"])

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        n_ops = len(self.runners)
        self.tensor_ready = [False] * len(self.params)
        self.locally_unused: set[int] = set()
        self.globally_unused: set[int] = set()
        self.op_missing = [len(t) for t in self.layout.op_tensors]
        self.op_state = [PENDING] * n_ops
        self.tensor_ops_left = [len(ops) for ops in self.layout.tensor_ops]
        self.written = [False] * len(self.params)
        self.next_pos = 0
        self.inflight: deque[int] = deque()
        self.inflight_bytes = 0

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ------------------------------------------------------------------ hooks
    def _make_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if not self.enabled:
                return
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
            self.progress()

        return hook

    def _begin_backward(self) -> None:
        if not self.settled:
            self.settle_all()  # a backward without the forward gating in between: finish the old one first
        for name in self.kept:  # last step's results the optimizer has used by now
            self.ledger.free(name)
        self.kept.clear()
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
    def progress(self) -> None:
        """Retire completed operations and issue every operation the order and credit allow."""
        while self.inflight and self.runners[self.inflight[0]].is_done():
            self._retire(self.inflight.popleft())
        while self.next_pos < len(self.order):
            j = self.order[self.next_pos]
            if self.op_missing[j] > 0:
                return
            r = self.runners[j]
            if self.credit_bytes is not None and self.inflight and self.inflight_bytes + r.nbytes > self.credit_bytes:
                return
            if self.tracer is not None:
                self.tracer.op_issued(j)
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

    def _traced_completion(self, j: int) -> None:
        assert self.tracer is not None
        self.tracer.op_completed(j, self.runners[j].nbytes)

    def _drain(self, j: int) -> None:
        """Block until operation ``j`` is done, issuing what the credit window frees on the way."""
        while self.op_state[j] != DONE:
            if self.inflight:
                self._retire(self.inflight.popleft())
            self.progress()
            if self.op_state[j] == PENDING and not self.inflight:
                raise GradschedError(f"internal: operation {j} can never be issued (its gradients are not ready)")

    # ------------------------------------------------------------------ end of backward
    def finalize(self) -> None:
        """End of the backward pass (autograd engine callback)."""
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
        self.progress()
        if self.on_backward_end is None:
            wait_start = self.tracer.now() if self.tracer is not None else 0.0
            self.settle_all()
            if self.tracer is not None:
                self.tracer.span("wait for communication", WAIT, wait_start)
        else:
            self.on_backward_end()
        self.sparse_step += 1

    def _agree_on_unused(self) -> None:
        device = self.params[0].device if dist.get_backend(self.ctrl_group) == "nccl" else torch.device("cpu")
        used = torch.tensor([0 if i in self.locally_unused else 1 for i in range(len(self.params))],
                            dtype=torch.int32, device=device)
        work = dist.all_reduce(used, group=self.ctrl_group, async_op=True)
        try:
            work.wait(timeout=_td(self.timeout_s))
        except Exception as exc:
            raise CollectiveError(f"rank {self.rank}: exchange of used-parameter flags failed or timed out after "
                                  f"{self.timeout_s:g} s: a peer rank probably died ({exc})") from exc
        self.globally_unused = {i for i, c in enumerate(used.tolist()) if c == 0}

    # ------------------------------------------------------------------ results
    def settle(self, tensors: list[int]) -> None:
        """Make sure the averaged gradients of ``tensors`` are in their ``.grad``."""
        for i in tensors:
            if self.written[i]:
                continue
            for j in self.layout.tensor_ops[i]:
                self._complete(j)

    def settle_all(self) -> None:
        for j in self.order:
            self._complete(j)
        self.settled = True

    def _complete(self, j: int) -> None:
        if self.op_state[j] == DONE and all(self.written[t] for t in self.layout.op_tensors[j]):
            return
        self._drain(j)
        if self.laysa and self.plan.operations[j].sparse:
            self._deliver(j)
            return
        for t in self.layout.op_tensors[j]:
            if self.written[t]:
                continue
            if all(self.op_state[k] == DONE for k in self.layout.tensor_ops[t]):
                self._write_back(t)

    def _deliver(self, j: int) -> None:
        """LaySA: rebuild sparse operation ``j``'s result chunk by chunk; update each chunk's weights and free it."""
        base = self.layout.op_pieces[j][0].start
        slots = sorted(self.layout.op_slots[j], key=lambda s: s.arena_start)
        groups: list[list[tuple[int, int, int]]] = []  # chunks of (tensor, lo, hi) in piece coordinates
        size = 0
        for s in slots:
            lo, hi = s.arena_start - base, s.arena_start - base + s.end - s.start
            if not groups or size + hi - lo > self.chunk_numel:
                groups.append([])
                size = 0
            groups[-1].append((s.tensor, lo, hi))
            size += hi - lo
        chunks = [(g[0][1], g[-1][2]) for g in groups]
        keep = self.mirror is None
        for c, (lo, _hi, flat, name) in enumerate(self.runners[j].results(chunks, keep)):  # run to exhaustion
            g = groups[c]
            params = []
            for t, a, b in g:
                self.written[t] = True
                if t in self.globally_unused:
                    continue  # no rank computed it: .grad stays as it was, like DDP
                p = self.params[t]
                p.grad = flat[a - lo:b - lo].view_as(p)
                params.append(p)
            if keep:
                if name is not None:
                    self.kept[name] = flat
                continue
            if params:
                t0 = self.tracer.now() if self.tracer is not None else 0.0
                self.mirror(params)
                if self.tracer is not None:
                    self.tracer.span(f"update {self.names[g[0][0]]}", UPDATE, t0, tensors=[t for t, _, _ in g])
            for p in params:
                p.grad = None  # updated from the aggregated result: the dense gradient is not kept
            if name is not None:
                self.ledger.free(name)
        self.op_state[j] = DONE

    def _write_back(self, i: int) -> None:
        self.written[i] = True
        if i in self.globally_unused:
            return  # no rank computed it: leave .grad as it was (None stays None), like DDP
        p = self.params[i]
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


def _td(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)
