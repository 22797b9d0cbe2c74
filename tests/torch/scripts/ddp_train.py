"""A plain PyTorch DDP training script, as users write them (the drop-in test runs it twice).

    torchrun --nproc-per-node 2 ddp_train.py OUT.pt

tests/torch/test_dropin.py runs it as it is and with only the DDP import line changed
to gradsched's, and compares the parameters and buffers each run saves.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

torch.set_num_threads(1)
dist.init_process_group()  # no backend named: PyTorch picks (gloo on CPU, "cpu:gloo,cuda:nccl" with GPUs)
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(16, 10),
).to(device)
model = DDP(
    model,
    device_ids=[local_rank] if device.type == "cuda" else None,
    output_device=local_rank if device.type == "cuda" else None,
    broadcast_buffers=True,
    bucket_cap_mb=25,
    find_unused_parameters=False,
    gradient_as_bucket_view=True,
)

data = TensorDataset(torch.randn(256, 3, 16, 16, generator=torch.Generator().manual_seed(1)),
                     torch.randint(0, 10, (256,), generator=torch.Generator().manual_seed(2)))
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
loader = DataLoader(data, batch_size=16, sampler=sampler)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
epochs = 2
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=epochs * len(loader))

for epoch in range(epochs):
    sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    if rank == 0:
        print(f"epoch {epoch} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}", flush=True)

if rank == 0:
    torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, sys.argv[1])
dist.destroy_process_group()
