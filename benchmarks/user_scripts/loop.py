"""A user's own training loop, with gradsched or with stock PyTorch DDP (benchmarks/user_scripts.py runs it).

    torchrun --nproc-per-node 2 benchmarks/user_scripts/loop.py --model cnn --mode gradsched --out g.pt
    torchrun --nproc-per-node 2 benchmarks/user_scripts/loop.py --model cnn --mode torch --out t.pt

Models, written as a user would: ``cnn`` (residual blocks with BatchNorm), ``transformer``
(``nn.TransformerEncoder`` classifier, so ``nn.MultiheadAttention``), ``tied_lm`` (a small
language model whose output projection is its embedding).  AdamW, 1 compute thread per
rank, dropout off (the two modes then see the same arithmetic).  ``--mode gradsched``:
``gradsched.torch.DistributedDataParallel(module, --plan)`` and ``DistributedOptimizer``,
as docs/runtime.md shows; ``--mode torch``: ``torch.nn.parallel.DistributedDataParallel``.
Rank 0 saves the final parameters, each step's time and the plan that ran."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--model", choices=["cnn", "transformer", "tied_lm"], required=True)
ap.add_argument("--mode", choices=["gradsched", "torch"], required=True)
ap.add_argument("--plan", default=None, help="gradsched's plan (default: the drop-in's default, run-time auto)")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--out", required=True)
args = ap.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class TiedLM(nn.Module):
    """Embedding, a two-layer MLP per position, and an output projection tied to the embedding."""

    def __init__(self, vocab: int = 512, d: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # weight tying, as GPT-2 does

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return self.head(self.norm(h + self.mlp(h)))


def build() -> tuple[nn.Module, object]:
    """The module and a function (step -> this rank's (inputs, targets))."""
    torch.manual_seed(0)
    if args.model == "cnn":
        module = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), Block(32), Block(32),
                               nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        shape, classes = (3, 16, 16), 10
    elif args.model == "transformer":
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        module = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Flatten(),
                               nn.Linear(16 * 64, 10))
        shape, classes = (16, 64), 10
    else:
        module, shape, classes = TiedLM(), None, 512

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 + step)
        n = args.batch_size * world
        if shape is None:
            ids = torch.randint(0, classes, (n, 17), generator=gen)
            x, y = ids[:, :-1], ids[:, 1:]
        else:
            x = torch.randn(n, *shape, generator=gen)
            y = torch.randint(0, classes, (n,), generator=gen)
        return x[rank::world], y[rank::world]

    return module, batch


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, -2) if out.dim() > 2 else out, y.flatten())


module, batch = build()
plan_name = "torch DDP"
if args.mode == "torch":
    model = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
else:
    import gradsched.torch as gt

    model = gt.DistributedDataParallel(module, args.plan)
    optimizer = gt.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)
    plan_name = model.strategy if args.plan else f"default ({model.strategy})"
step_s = []
for step in range(args.steps):
    x, y = batch(step)
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss_of(model(x), y).backward()
    optimizer.step()
    step_s.append(time.perf_counter() - t0)
if args.mode == "gradsched":
    model.synchronize()  # an overlapping plan may still be updating
    tuner = getattr(model, "autotuner", None)
    if tuner is not None:
        plan_name += f", settled on {tuner.switches[-1].strategy}"
if rank == 0:
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    torch.save({"params": params, "step_s": step_s, "plan": plan_name}, args.out)
dist.destroy_process_group()
