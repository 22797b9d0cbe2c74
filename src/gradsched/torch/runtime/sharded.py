"""Sharded optimizer state (ZeRO-1): ``DistributedDataParallel(..., shard_optimizer=True)``.

Each rank keeps the optimizer state (Adam's two moments, momentum buffers) of about 1/p of
the parameters and steps only those; the updated parameters then go to every rank.  Over most
plans this is PyTorch's :class:`torch.distributed.optim.ZeroRedundancyOptimizer`, built from the
optimizer the user wrapped in :class:`~gradsched.torch.DistributedOptimizer` (its class, its
parameter groups and their hyper-parameters) on the model's process group: it partitions
whole parameters over the ranks (greedily by size), steps the local partition with the
user's optimizer class and broadcasts each updated parameter from its owner.

Over any plan but one of reduce-scatters alone: the gradients are averaged as the plan says and
are final when ``backward()`` returns; ``step()`` then steps the shard and broadcasts,
synchronously, as DeepSpeed's ZeRO-1 gathers parameters in its ``step()`` (ANCHORS.md).  So a
plan that overlaps the update with the next forward gives up that overlap.  Its checkpoint is
``ZeroRedundancyOptimizer.consolidate_state_dict``.

Over a plan of reduce-scatters (``dear``), :class:`ShardedOptimizer` instead: the reduce-scatter's
shard is what each rank steps (no gradient is gathered), and the updated parameters are
all-gathered, in forward order, each layer's next forward waiting for its own group's gather
(Megatron's distributed optimizer does the same with its buckets).  The partition is the
reduce-scatter's: element ranges of each group's flat piece, so any parameter may be split
between ranks (elementwise optimizers: SGD, Adam, AdamW, ...; one that reads a whole tensor at
once would see pieces).  Clipping by the global norm (one all-reduce of a number), FSDP's
``ShardedGradScaler`` (it all-reduces the inf check), per-rank and gathered checkpoints
(docs/runtime.md).  Build LR schedulers on ``dist_opt.optimizer`` in both cases.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from gradsched.errors import GradschedError, InternalError
from gradsched.options import Option
from gradsched.torch.runtime.decoupled import DecoupledAllReduce, all_gather_single
from gradsched.torch.runtime.ops import wait_all

if TYPE_CHECKING:
    from gradsched.torch.runtime.executor import Executor


SHARD_OPTIMIZER = Option("shard_optimizer", bool, False, doc="shard the optimizer state over the ranks (ZeRO-1)")


def shard(optimizer: torch.optim.Optimizer, group: dist.ProcessGroup) -> ZeroRedundancyOptimizer:
    """``optimizer`` (not yet stepped) as a ZeroRedundancyOptimizer on ``group``: same class, parameter groups
    and hyper-parameters; each rank holds the state of its partition only."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer
    if any(len(s) for s in optimizer.state.values()):
        raise GradschedError("shard_optimizer: the optimizer has already stepped (it holds state); wrap it in "
                             "DistributedOptimizer before the first step")
    groups = optimizer.param_groups
    first = groups[0]
    # the constructor's own arguments: a group holds more (AdamW's decoupled_weight_decay)
    takes = inspect.signature(type(optimizer).__init__).parameters
    kwargs = {k: v for k, v in first.items() if k != "params" and k in takes}
    sharded = ZeroRedundancyOptimizer(first["params"], optimizer_class=type(optimizer), process_group=group,
                                      parameters_as_bucket_view=False, **kwargs)
    for g in groups[1:]:
        sharded.add_param_group(dict(g))
    return sharded


def state_bytes(optimizer: Any) -> int:
    """Bytes of optimizer state this rank holds (a ZeroRedundancyOptimizer's: its partition's)."""
    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(t.numel() * t.element_size() for s in inner.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


# --------------------------------------------------------------------------- fed from the reduce-scatter
@dataclass(frozen=True)
class ShardPiece:
    """Elements ``[start, end)`` of plan tensor ``tensor``: this rank's part of operation ``op``'s shard,
    at ``at`` in that operation's shard buffer, stepped in optimizer group ``group``."""

    op: int
    tensor: int
    start: int
    end: int
    at: int
    group: int


def decoupled_runners(executor: Executor) -> list[DecoupledAllReduce]:
    """``executor``'s runners, each a decoupled all-reduce (the plans a :class:`ShardedOptimizer` runs over)."""
    runners = [r for r in executor.runners if isinstance(r, DecoupledAllReduce)]
    if len(runners) != len(executor.runners):
        raise InternalError("a sharded optimizer steps reduce-scatters' shards: every operation must be one")
    return runners


def shard_pieces(executor: Executor, owner_group: dict[int, int]) -> list[ShardPiece]:
    """This rank's pieces of every decoupled operation of ``executor`` (``owner_group``: id of a parameter ->
    its optimizer group; parameters in no group are left out: their elements are gathered, never stepped)."""
    out = []
    for j, runner in enumerate(decoupled_runners(executor)):
        m = runner.shard.numel()
        lo, hi = runner.rank * m, (runner.rank + 1) * m  # this rank's region, relative to the piece
        base = executor.layout.op_pieces[j][0].start
        for s in executor.layout.op_slots[j]:
            a, b = s.arena_start - base, s.arena_start - base + s.end - s.start
            first, last = max(a, lo), min(b, hi)
            group = owner_group.get(id(executor.params[s.tensor]))
            if first < last and group is not None:
                out.append(ShardPiece(j, s.tensor, s.start + first - a, s.start + last - a, first - lo, group))
    return out


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 over a decoupled (``dear``) plan: each rank steps the shard its reduce-scatters leave it and
    all-gathers the updated parameters (module docstring of :mod:`gradsched.torch.runtime.sharded`, below).

    ``param_groups`` are the inner optimizer's (an LR scheduler built on this object changes the lr the
    shards step with); their ``params`` are this rank's pieces, views into the model's parameters, with
    ``.grad`` views into the reduced shards, so ``ShardedGradScaler`` (FSDP's) unscales and checks what is
    stepped."""

    def __init__(self, optimizer: torch.optim.Optimizer, executor: Executor, group: dist.ProcessGroup) -> None:
        if any(len(s) for s in optimizer.state.values()):
            raise GradschedError("shard_optimizer: the optimizer has already stepped (it holds state); wrap it in "
                                 "DistributedOptimizer before the first step")
        owner = {id(p): g for g, grp in enumerate(optimizer.param_groups) for p in grp["params"]}
        self.model_params = [p for grp in optimizer.param_groups for p in grp["params"]]
        self._outer_groups = [{"params": list(grp["params"])} for grp in optimizer.param_groups]
        self._outer_group_of = [g for g, grp in enumerate(optimizer.param_groups) for _ in grp["params"]]
        by_id = {id(p): i for i, p in enumerate(self.model_params)}
        self._model_index = {t: by_id[id(p)] for t, p in enumerate(executor.params) if id(p) in by_id}
        self._executor = executor
        self._group = group
        self._runners = decoupled_runners(executor)
        self.pieces = shard_pieces(executor, owner)
        views = []
        for pc in self.pieces:
            w = executor.params[pc.tensor].detach().view(-1)[pc.start:pc.end]
            w.grad = self._runners[pc.op].shard[pc.at:pc.at + pc.end - pc.start]
            views.append(w)
        inner_groups = [{k: v for k, v in grp.items() if k != "params"} for grp in optimizer.param_groups]
        for hp in inner_groups:
            hp["params"] = []
        if not self.pieces:
            raise GradschedError(f"shard_optimizer: rank {executor.rank} holds no element of the optimizer's "
                                 "parameters (fewer elements than ranks); train without shard_optimizer")
        self._inner = sorted(zip(self.pieces, views), key=lambda x: x[0].group)  # the inner optimizer's order
        for pc, w in self._inner:
            inner_groups[pc.group]["params"].append(w)
        takes = inspect.signature(type(optimizer).__init__).parameters
        kwargs = {k: v for k, v in optimizer.defaults.items() if k in takes}
        self.optim = type(optimizer)(inner_groups, **kwargs)
        super().__init__([torch.empty(0)], {})  # the base's hooks and bookkeeping; groups and state: the inner's
        self._sealed = True
        self._alias()
        self.defaults = self.optim.defaults
        self._forward_order = sorted(range(len(self._runners)), key=lambda j: self._runners[j].first_tensor)
        self._gathers: dict[int, list[Any]] = {}  # operation -> its parameter all-gather in flight
        for r in self._runners:
            r.keep_shard = True

    # ------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Step this rank's shard, then start the all-gathers of the updated parameters, in forward order
        (:meth:`wait_params` waits for each before its layer's forward)."""
        if closure is not None:
            raise GradschedError("shard_optimizer: pass the closure to DistributedOptimizer.step, which runs it "
                                 "first")
        self.wait_all()  # a second step() without a forward in between: the first one's gathers first
        if not any(r.fresh for r in self._runners):
            return None  # no backward since the last step: no gradient, no update (torch.optim skips None grads)
        self.optim.step()
        for w in (w for grp in self.optim.param_groups for w in grp["params"]):
            w.grad.copy_(w)  # the shard buffer now carries the updated parameters (the gradient is spent)
        for j in self._forward_order:
            r = self._runners[j]
            r.fresh = False
            self._gathers[j] = r.start_all_gather()
        return None

    @property
    def gathering(self) -> bool:
        return bool(self._gathers)

    @torch.no_grad()
    def wait_params(self, tensors: list[int]) -> None:
        """The updated parameters of plan tensors ``tensors`` in place (their operations' gathers waited)."""
        ops = sorted({j for t in tensors for j in self._executor.layout.tensor_ops[t] if j in self._gathers},
                     key=self._forward_order.index)
        for j in ops:
            self._finish_gather(j)

    def wait_all(self) -> None:
        for j in [j for j in self._forward_order if j in self._gathers]:
            self._finish_gather(j)

    def _finish_gather(self, j: int) -> None:
        r = self._runners[j]
        works = self._gathers.pop(j)
        wait_all(works, host_wait=not r.nccl, timeout_s=self._executor.timeout_s, rank=r.rank,
                 what=f"parameter all-gather of operation {j} ({r.nbytes} bytes)")
        base = self._executor.layout.op_pieces[j][0].start
        with torch.no_grad():
            for s in self._executor.layout.op_slots[j]:
                p = self._executor.params[s.tensor]
                if s.tensor in self._model_index:  # a parameter the optimizer steps
                    a = s.arena_start - base
                    p.view(-1)[s.start:s.end].copy_(r.full[a:a + s.end - s.start])
            r.piece.zero_()  # the gradient buffer held parameters: a gradient again (zero) for the next backward

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The model's gradients (the pieces' ``.grad`` are the shard buffers and stay).  ``set_to_none`` (the
        default) lets the parameter gathers run on into the next forward; zeroing in place waits for them
        (a gradient may be a view into the buffer a gather writes)."""
        if not set_to_none:
            self.wait_all()
        for p in self.model_params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_sealed", False):
            raise GradschedError("shard_optimizer: add parameter groups before wrapping the optimizer")
        super().add_param_group(param_group)

    # ------------------------------------------------------------- clipping
    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over every rank's shards: the global norm of the averaged
        gradients (one all-reduce of a number), every shard scaled by the same factor; returns the norm."""
        grads = [w.grad for grp in self.optim.param_groups for w in grp["params"]]
        device = grads[0].device if grads else torch.device("cpu")
        if math.isinf(norm_type):
            local = torch.stack([g.abs().max() for g in grads if g.numel()] or [torch.zeros((), device=device)]).max()
            op = dist.ReduceOp.MAX
        else:
            local = sum((torch.linalg.vector_norm(g, norm_type) ** norm_type for g in grads),
                        torch.zeros((), device=device))
            op = dist.ReduceOp.SUM
        total = local.to(torch.float32).to(device).reshape(1)
        dist.all_reduce(total, op=op, group=self._group)
        norm = total[0] if math.isinf(norm_type) else total[0] ** (1.0 / norm_type)
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return norm

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard (no collective): the inner optimizer's state_dict and which pieces it holds;
        :meth:`load_state_dict` takes it back on the same rank of the same world and plan."""
        sd = self.optim.state_dict()
        sd[SHARD_KEY] = {"world": self._runners[0].world_size, "rank": self._runners[0].rank,
                         "pieces": [[pc.tensor, pc.start, pc.end] for pc, _ in self._inner]}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A per-rank :meth:`state_dict` or a gathered one (:meth:`gathered_state_dict`, or a plain
        ``torch.optim`` state_dict of the same optimizer over the same parameters)."""
        self.wait_all()
        meta = state_dict.get(SHARD_KEY)
        if meta is None:
            self.optim.load_state_dict(self._sliced(state_dict))
            self._alias()
            return
        mine = [[pc.tensor, pc.start, pc.end] for pc, _ in self._inner]
        if [list(x) for x in meta["pieces"]] != mine:
            raise GradschedError(f"shard_optimizer: this per-rank checkpoint holds rank {meta['rank']} of "
                                 f"{meta['world']}'s pieces, not this rank's ({self._runners[0].rank} of "
                                 f"{self._runners[0].world_size}, this plan): resume from a gathered checkpoint "
                                 "(DistributedOptimizer.gathered_state_dict)")
        self.optim.load_state_dict({k: v for k, v in state_dict.items() if k != SHARD_KEY})
        self._alias()

    def _alias(self) -> None:
        """Groups and state are the inner optimizer's (its load_state_dict makes new ones)."""
        self.param_groups = self.optim.param_groups
        self.state = self.optim.state

    def _sliced(self, full: dict[str, Any]) -> dict[str, Any]:
        """A gathered state_dict cut to this rank's pieces, in the inner optimizer's format."""
        groups = full["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self._outer_groups]:
            raise GradschedError("shard_optimizer: the checkpoint's parameter groups do not match this optimizer's "
                                 f"({[len(g['params']) for g in groups]} parameters per group)")
        saved = {int(k): v for k, v in full["state"].items()}
        state: dict[int, dict[str, Any]] = {}
        params: list[list[int]] = [[] for _ in groups]
        for k, (pc, _) in enumerate(self._inner):
            i = self._model_index[pc.tensor]
            p = self.model_params[i]
            if i in saved:
                state[k] = {key: (v.reshape(-1)[pc.start:pc.end].clone()
                                  if _elementwise(key, v, p.numel()) and v.shape == p.shape
                                  else v.clone() if isinstance(v, torch.Tensor) else v)  # step counts in place
                            for key, v in saved[i].items()}
            params[pc.group].append(k)
        return {"state": state, "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": ps}
                                                 for g, ps in zip(groups, params)]}

    @torch.no_grad()
    def gathered_state_dict(self) -> dict[str, Any]:
        """The whole optimizer's state on every rank (a collective: call it on all of them), in ``torch.optim``'s
        format for the unsharded optimizer over the model's parameters: a plain optimizer loads it too."""
        self.wait_all()
        local_meta: dict[int, dict[str, Any]] = {}
        vectors: dict[str, torch.dtype] = {}
        for pc, w in self._inner:
            for key, v in self.optim.state.get(w, {}).items():
                if _elementwise(key, v, w.numel()) and v.dim() == 1:
                    vectors[key] = v.dtype
                else:
                    local_meta.setdefault(self._model_index[pc.tensor], {})[key] = v
        everyone: list[Any] = [None] * self._runners[0].world_size
        dist.all_gather_object(everyone, (local_meta, vectors), group=self._group)
        state: dict[int, dict[str, Any]] = {}
        for meta, vecs in everyone:
            vectors.update(vecs)
            for i, entries in meta.items():
                state.setdefault(i, {}).update(entries)
        for key, dtype in sorted(vectors.items()):
            self._gather_key(key, dtype, state)
        groups = []
        for g, grp in enumerate(self.optim.param_groups):
            params = [i for i, p in enumerate(self.model_params) if self._outer_group_of[i] == g]
            groups.append({**{k: v for k, v in grp.items() if k != "params"}, "params": params})
        return {"state": state, "param_groups": groups}

    def _gather_key(self, key: str, dtype: torch.dtype, state: dict[int, dict[str, Any]]) -> None:
        """State ``key`` of every piece, all-gathered operation by operation into whole-parameter tensors."""
        for j, r in enumerate(self._runners):
            shard = torch.zeros(r.shard.numel(), dtype=dtype, device=r.shard.device)
            for pc, w in self._inner:
                if pc.op == j and key in self.optim.state.get(w, {}):
                    shard[pc.at:pc.at + pc.end - pc.start].copy_(self.optim.state[w][key])
            full = torch.zeros(r.full.numel(), dtype=dtype, device=r.full.device)
            all_gather_single(full, shard, group=self._group)
            base = self._executor.layout.op_pieces[j][0].start
            for s in self._executor.layout.op_slots[j]:
                i = self._model_index.get(s.tensor)
                if i is None:
                    continue
                p = self.model_params[i]
                out = state.setdefault(i, {}).setdefault(key, torch.zeros(p.shape, dtype=dtype, device=p.device))
                a = s.arena_start - base
                out.view(-1)[s.start:s.end].copy_(full[a:a + s.end - s.start])


SHARD_KEY = "gradsched_shard"


def _elementwise(key: str, value: Any, numel: int) -> bool:
    """Is optimizer state ``value`` one number per parameter element (Adam's moments, a momentum buffer)?
    (``step`` is one number per parameter, whatever its shape.)"""
    return key != "step" and isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == numel
