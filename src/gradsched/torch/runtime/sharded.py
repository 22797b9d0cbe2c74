"""Sharded optimizer state (ZeRO-1): ``DistributedDataParallel(..., shard_optimizer=True)``.

Each rank keeps the optimizer state (Adam's two moments, momentum buffers) of about 1/p of
the parameters and steps only those; the updated parameters then go to every rank.  This
is PyTorch's :class:`torch.distributed.optim.ZeroRedundancyOptimizer`, built from the
optimizer the user wrapped in :class:`~gradsched.torch.DistributedOptimizer` (its class, its
parameter groups and their hyper-parameters) on the model's process group: it partitions
whole parameters over the ranks (greedily by size), steps the local partition with the
user's optimizer class and broadcasts each updated parameter from its owner.

How it runs with a plan: the gradients are averaged as the plan says (a ``dear`` plan's
reduce-scatters and all-gathers included) and are final when ``backward()`` returns (the
executor waits at the end of backward, as for a plain optimizer); ``step()`` then steps the
shard and broadcasts, synchronously, as DeepSpeed's ZeRO-1 gathers parameters in its
``step()`` (ANCHORS.md).  So a plan that overlaps the update with the next forward gives up
that overlap under a sharded optimizer.  Build LR schedulers on ``dist_opt.optimizer`` (the
sharded optimizer), as for any wrapped optimizer.  Not done yet: a sharded checkpoint
(``ZeroRedundancyOptimizer.consolidate_state_dict`` is PyTorch's way) and stepping the
shard straight from a reduce-scatter's shard, without gathering gradients first.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from gradsched.errors import GradschedError


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
