"""Train a small convolutional classifier data-parallel with gradsched, as a user's own script would.

One process per GPU (or per host on CPUs), launched by torchrun.  On one machine:

    torchrun --standalone --nproc-per-node 2 examples/train.py

On two hosts (run the same line on each; HOST0 is the first host's address, both
reach it on port 29500; --rdzv-id is any name both share):

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \
        --rdzv-id demo examples/train.py --steps 200 --checkpoint ckpt.pt

On a GPU cluster, 2 nodes of 8 GPUs with NCCL (init_process_group() below picks
"cpu:gloo,cuda:nccl" by itself when CUDA is there):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \
        --rdzv-id demo examples/train.py --steps 2000 --batch-size 64 --checkpoint /shared/ckpt.pt

Stop it at any time and start the same command again: it resumes from --checkpoint
(model, optimizer, LR schedule, step, and under a top-k plan every rank's residuals)
and ends with exactly the parameters of an uninterrupted run; the checkpoint carries a
checksum, and a damaged one is refused.  A rank that dies or freezes makes the others
fail with gradsched.torch.CollectiveError within --timeout seconds.
--reference trains with PyTorch's own DistributedDataParallel
instead, for comparison (tests/torch/test_example_torchrun.py compares the two).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import gradsched.torch as gt

# ----------------------------------------------------------------------------- settings
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--steps", type=int, default=100, help="optimizer steps in all (a resumed run counts on)")
ap.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (one-cycle schedule)")
ap.add_argument("--plan", default=None, help="a gradsched strategy (mgwfbp, auto, ...); default: gradsched's "
                "default, run-time auto with PyTorch's DDP among its candidates")
ap.add_argument("--checkpoint", default=None, help="save here every --save-every steps; resume from it if present")
ap.add_argument("--save-every", type=int, default=20)
ap.add_argument("--stop-after", type=int, default=None, help="leave after this step, as if interrupted (tests)")
ap.add_argument("--out", default=None, help="write the final parameters and buffers here (rank 0)")
ap.add_argument("--reference", action="store_true", help="train with torch.nn.parallel.DistributedDataParallel")
ap.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may take before the run fails "
                "(a dead or frozen rank); the process group's timeout too, so that exit is never held longer")
args = ap.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
log = logging.getLogger("train")

# ----------------------------------------------------------------------------- processes
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
# torchrun's environment says where; no backend named: gloo on CPU, NCCL on GPU.  The timeout bounds how long
# PyTorch's own collectives (and the exit after a failure) may wait: gloo's default is 30 minutes.
dist.init_process_group(timeout=timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
if torch.cuda.is_available():
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
say = log.info if rank == 0 else (lambda *a: None)  # only rank 0 talks
say("%d ranks, device %s, backend %s", world, device.type, dist.get_backend_config())


# ----------------------------------------------------------------------------- data
def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step ``step``'s global batch: 16x16 RGB images and a class each.

    Drawn from a generator seeded by the step, so every rank sees a different shard of
    the same global batch, and a resumed run sees the batches the lost steps would
    have seen.  Replace with your DataLoader and a DistributedSampler."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(args.batch_size * world, 3, 16, 16, generator=gen)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long() + 2 * (x[:, 1].mean(dim=(1, 2)) > 0).long()  # 4 learnable classes
    return x[rank::world].to(device), y[rank::world].to(device)


# ----------------------------------------------------------------------------- model
class Net(nn.Module):
    """Two conv blocks with BatchNorm (buffers: rank 0's are broadcast before each forward) and a head."""

    def __init__(self, width: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(2 * width, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


torch.manual_seed(0)  # the same initial weights everywhere (the wrapper copies rank 0's anyway)
module = Net().to(device)
say("model: %.2f M parameters, %.1f MB of gradients per step",
    sum(p.numel() for p in module.parameters()) / 1e6,
    sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6)
if args.reference:
    model = nn.parallel.DistributedDataParallel(module, device_ids=[local_rank] if device.type == "cuda" else None)
else:
    model = gt.DistributedDataParallel(module, args.plan, device_ids=[local_rank] if device.type == "cuda" else None,
                                       timeout_s=args.timeout)
    if model.plan is None:  # --plan ddp: PyTorch's DDP behind gradsched's wrapper
        say("gradsched plan: PyTorch's DDP")
    else:  # the default is run-time auto: it starts on PyTorch's DDP and measures other plans once that pays
        say("gradsched plan: strategy %s, %d collective operations per step, hash %s", model.strategy,
            len(model.plan.operations), model.plan.hash)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps)

# ----------------------------------------------------------------------------- resume
step = 0
if args.checkpoint and os.path.exists(args.checkpoint):
    # every rank reads rank 0's file: hosts without a shared disk need it copied first; a damaged file is refused
    state = gt.load_checkpoint(args.checkpoint, map_location=device)
    model.module.load_state_dict(state["model"])
    if state["sparse"]:  # top-k plans: each rank takes its own residuals (what its steps left unsent)
        model.load_sparse_state_dict(state["sparse"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    step = state["step"]
    say("resumed from %s at step %d", args.checkpoint, step)


def save(path: str) -> None:
    """Rank 0 writes model, optimizer, schedule and step, with a checksum (atomically: a crash leaves the old file)."""
    sparse = {}
    if isinstance(model, gt.DistributedDataParallel):
        model.synchronize()  # an overlapping plan may still be reducing or updating
        # Top-k plans (topk, omgs): every rank's residuals, gathered (a collective: every rank calls it;
        # empty for dense plans).  model.module.state_dict() alone drops them: a resumed run then diverges.
        sparse = model.sparse_state_dict()
    if rank == 0:
        state = {"model": model.module.state_dict(), "sparse": sparse, "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "step": step}
        gt.save_checkpoint(state, path)
    dist.barrier()  # nobody resumes from a half-written file


# ----------------------------------------------------------------------------- training
model.train()
t0, seen = time.perf_counter(), 0
while step < args.steps:
    x, y = batch(step)
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()  # gradients averaged over the ranks, as with DDP
    optimizer.step()
    scheduler.step()
    step += 1
    seen += 1
    if step % 10 == 0 or step == args.steps:
        dt = (time.perf_counter() - t0) / seen
        say("step %d/%d  loss %.4f  lr %.2e  %.1f ms/step", step, args.steps, loss.item(),
            scheduler.get_last_lr()[0], dt * 1e3)
    if args.checkpoint and (step % args.save_every == 0 or step == args.steps or step == args.stop_after):
        save(args.checkpoint)
    if args.stop_after is not None and step >= args.stop_after:
        say("stopping after step %d, as asked", step)
        break

if getattr(model, "autotuner", None) is not None:  # auto (the default): what it tried and kept
    for s in model.autotuner.switches:
        say("auto: from step %d on: %s (%s)", s.iteration, s.strategy, s.reason)
if args.out and rank == 0:
    torch.save({k: v.detach().cpu() for k, v in model.module.state_dict().items()}, args.out)
dist.destroy_process_group()
