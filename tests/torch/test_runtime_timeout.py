"""A rank that dies, or a collective that never completes, ends in a clear error on the others, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from gradsched.torch.jobs.launch import free_port  # noqa: E402

TIMEOUT_S = 5.0

WORKER = r"""
import os, sys, time, datetime
import torch, torch.distributed as dist
from gradsched.errors import GradschedError
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model
torch.set_num_threads(1)
rank, world, fault, strategy = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
spec = build_model("mlp")
model = DistributedDataParallel(spec.module, strategy, timeout_s=TIMEOUT_S,
                                plan_options={"bytescheduler": {"partition_bytes": 8192}}.get(strategy))
opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
gen = torch.Generator().manual_seed(0)
try:
    for step in range(10):
        if step == 3:
            print(f"rank {rank}: step 3", flush=True)  # the test's clock starts here, after start-up
        if rank == 1 and step == 3:
            if fault == "die":
                os._exit(1)
            time.sleep(120)  # stall: never joins the next collective
        x, y = spec.make_batch(8, gen)
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        opt.step()
    model.synchronize()
except GradschedError as exc:
    print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(3)
print(f"rank {rank}: finished", flush=True)
""".replace("TIMEOUT_S", repr(TIMEOUT_S))


def _launch(fault: str, strategy: str, world: int = 3) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, fault, strategy], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("fault,strategy", [("die", "wfbp"), ("stall", "bytescheduler")])
def test_survivors_exit_with_a_clear_error(fault, strategy):
    procs = _launch(fault, strategy)
    survivors = [procs[0], procs[2]]
    try:
        for p in survivors:  # start-up (imports, rendezvous) takes what a loaded machine needs
            line = p.stdout.readline()
            assert line.endswith("step 3\n"), line + p.stderr.read()
        # From step 3 on: the failing collective's timeout, then the error and exit.
        deadline = time.monotonic() + 4 * TIMEOUT_S + 15
        for p in survivors:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a surviving rank hung after rank 1 {'died' if fault == 'die' else 'stalled'}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p in survivors:
        err = p.stderr.read()
        assert p.returncode == 3, err
        assert "CollectiveError" in err and "peer rank probably died" in err, err
    if fault == "stall":
        for p in survivors:
            p.stdout.close()
