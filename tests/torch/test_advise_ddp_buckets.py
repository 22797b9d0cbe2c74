"""The advisor simulates the buckets PyTorch DDP really builds: for each ``bucket_cap_mb`` (and
left unset) the bytes of each bucket its comm hook receives after the rebuild, in order, are
those of :func:`gradsched.advise.ddp_plan` on the model's profile under the installed DDP's
first-bucket rule (:func:`gradsched.torch.measure.advisor.ddp_first_bucket_mb`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from gradsched.torch.jobs.launch import free_port  # noqa: E402

WORKER = r"""
import json, sys
import torch, torch.distributed as dist
from gradsched import Cluster
from gradsched.advise import DDP_DEFAULT_FIRST_MB, DDP_DEFAULT_MB, ddp_plan
from gradsched.torch import build_model
from gradsched.torch.measure.advisor import ddp_first_bucket_mb
from gradsched.torch.measure.profiler import profile_module
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)

def hook(seen, bucket):
    buf = bucket.buffer()
    seen.append(buf.numel() * buf.element_size())
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut

out = []
cluster = Cluster.alpha_beta(1e-5, 1e-9, 2)
for name in sys.argv[1:]:
    spec = build_model(name)
    x, y = spec.make_batch(2, torch.Generator().manual_seed(0))
    profile = profile_module(spec.module, (x, y), loss_fn=spec.loss_fn, iterations=1, warmup=0)
    for cap in (None, 1, 2, 25, 50):
        ddp = torch.nn.parallel.DistributedDataParallel(build_model(name).module, bucket_cap_mb=cap)
        seen = []
        ddp.register_comm_hook(seen, hook)
        for _ in range(3):  # the buckets are rebuilt in ready order after the first step
            seen.clear()
            spec.loss_fn(ddp(x), y).backward()
        plan = (ddp_plan(profile, cluster, DDP_DEFAULT_MB, DDP_DEFAULT_FIRST_MB) if cap is None
                else ddp_plan(profile, cluster, cap, ddp_first_bucket_mb()))
        planned = [sum(profile.tensors[i].bytes for i in op.tensors()) for op in plan.operations]
        out.append({"model": name, "cap": cap, "real": seen, "planned": planned})
print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def test_planned_buckets_are_ddps_own():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", WORKER, "vgg", "cnn"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for row in rows:
        assert row["real"] == row["planned"], row
    vgg = {row["cap"]: len(row["real"]) for row in rows if row["model"] == "vgg"}
    assert vgg[None] == 3 and vgg[25] == 2  # a set 25 MiB cap is not DDP's default: its first bucket is 25 MiB
