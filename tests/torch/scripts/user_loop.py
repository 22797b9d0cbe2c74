"""A user's training script, as written for PyTorch DDP with only the wrapper changed.

    torchrun --nproc-per-node 2 user_loop.py STRATEGY [--no-destroy]

It trains, returns from ``main`` and lets Python finalise (no ``os._exit``); with
``--no-destroy`` it also leaves ``destroy_process_group()`` out, as many scripts do.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn

import gradsched.torch as gt


def main() -> None:
    strategy = sys.argv[1]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    options = {"partition_bytes": 4096, "credit_bytes": 8192} if strategy == "bytescheduler" else None  # a progress thread
    ddp = gt.DistributedDataParallel(model, strategy, plan_options=options)
    opt = gt.DistributedOptimizer(torch.optim.SGD(ddp.parameters(), lr=0.1), ddp)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(10):
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    if "--no-destroy" not in sys.argv:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
