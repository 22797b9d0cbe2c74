"""The bench's ``fsdp2`` row: PyTorch FSDP2 (``fully_shard``) as a user writes it, timed beside the plans.

``fully_shard`` on each child of the model that owns parameters (a block: a ``features`` stack, a
layer of a transformer's list is one level deeper and is not split further here), then on the root,
with ``reshard_after_forward=False`` (parameters stay gathered from forward to backward: what
``gradsched advise --fsdp`` simulates) on a 1-D device mesh over the bench's ranks (CPU and gloo
here; a GPU model gets a CUDA mesh).  Its optimizer is the bench's (SGD, momentum 0.9) over the
sharded parameters, stepped by every rank on its shard.  Its prediction is the same grouping
simulated as a decoupled plan (:func:`gradsched.advise_fsdp.blocks_plan`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gradsched.advise_fsdp import blocks_plan
from gradsched.profile import Profile


class Fsdp2Row:
    """One bench row run by FSDP2: called, stepped and synchronised as the bench's other rows."""

    label = "fsdp2"

    def __init__(self, module: nn.Module, profile: Profile, lr: float) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        device = next(module.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        blocks = [name for name, child in module.named_children()
                  if any(p.requires_grad for p in child.parameters())]
        for name in blocks:
            fully_shard(module.get_submodule(name), mesh=mesh, reshard_after_forward=False)
        fully_shard(module, mesh=mesh, reshard_after_forward=False)
        self.module = module
        self.optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
        self.plan = blocks_plan(profile, blocks)

    def __call__(self, x: Any) -> Any:
        return self.module(x)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.optimizer.step()

    def synchronize(self) -> None:
        """Nothing outstanding: FSDP2 waits for its reduce-scatters in backward and gathers in forward."""
