"""A LightningModule fitted with gradsched's strategy or Lightning's own DDP (benchmarks/user_scripts.py runs it).

    torchrun --nproc-per-node 2 benchmarks/user_scripts/lightning_fit.py --mode gradsched --out g.pt
    torchrun --nproc-per-node 2 benchmarks/user_scripts/lightning_fit.py --mode torch --out t.pt

``--mode gradsched``: ``L.Trainer(strategy=GradschedStrategy(--plan))`` (default plan:
run-time ``auto``); ``--mode torch``: ``strategy="ddp"``.  A small CNN, SGD with momentum,
gradient clipping at 1.0, 2 CPU processes under torchrun (Lightning reads its environment).
Rank 0 saves the final parameters and each step's time."""

from __future__ import annotations

import argparse
import os
import time
import warnings

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--mode", choices=["gradsched", "torch"], required=True)
ap.add_argument("--plan", default="auto")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--out", required=True)
args = ap.parse_args()
torch.set_num_threads(1)
warnings.filterwarnings("ignore")  # Lightning's advice about num_workers and the like


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        self.step_s: list[float] = []
        self._t0 = 0.0

    def training_step(self, batch, _index):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_batch_start(self, *_):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, *_):
        self.step_s.append(time.perf_counter() - self._t0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


gen = torch.Generator().manual_seed(1)
world = int(os.environ.get("WORLD_SIZE", "1"))
x = torch.randn(args.batch_size * world * args.steps, 3, 16, 16, generator=gen)
y = torch.randint(0, 10, (len(x),), generator=gen)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=args.batch_size)
torch.manual_seed(0)
model = Net()
if args.mode == "gradsched":
    from gradsched.integrations.lightning import GradschedStrategy

    strategy, plan_name = GradschedStrategy(args.plan), f"GradschedStrategy({args.plan!r})"
else:
    strategy, plan_name = "ddp", "Lightning ddp"
trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=args.steps, max_epochs=1,
                    gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, use_distributed_sampler=True)
trainer.fit(model, data)
if trainer.global_rank == 0:
    torch.save({"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "step_s": model.step_s,
                "plan": plan_name}, args.out)
