"""A user's script that wraps a model, trains and returns exits 0, every time.

Issue: such a script once aborted at exit ("terminate called without an active
exception", SIGABRT) in 3 of 20 runs on a loaded machine; gradsched's own workers
leave with ``os._exit`` and never saw it.  What gradsched runs or holds is now
released at exit (:mod:`gradsched.torch.runtime.shutdown`); these tests check that it is, and
run the script 30 times under torchrun.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.runtime import executor as executor_module  # noqa: E402
from gradsched.torch.runtime import shutdown  # noqa: E402
from gradsched.torch.jobs.launch import free_port  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "user_loop.py"
RUNS = 30
LANES = 2  # torchrun jobs at a time


def _progress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gradsched-progress")]


def test_close_all_stops_threads_and_forgets_groups_and_hooks():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4)), "bytescheduler",
                                        plan_options={"partition_bytes": 256, "credit_bytes": 512})
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        executor = model._executor
        assert _progress_threads() and executor_module._PRIVATE_GROUPS
        shutdown.close_all()  # what the atexit handler runs
        assert not _progress_threads()
        assert not executor_module._PRIVATE_GROUPS
        assert executor._hooks == [] and all(r.works == [] for r in executor.runners)
        shutdown.close_all()  # idempotent
    finally:
        dist.destroy_process_group()


def _start_script(strategy: str, destroy: bool) -> subprocess.Popen:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
            str(SCRIPT), strategy] + ([] if destroy else ["--no-destroy"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_user_script_exits_zero_thirty_times_under_torchrun():
    """30 whole torchrun jobs, two at a time (a job's launcher imports torch while the other's workers run)."""
    cases = list(itertools.islice(itertools.cycle(itertools.product(
        ["wfbp", "mgwfbp", "bytescheduler", "usbyte", "ddp"], [True, False])), RUNS))
    failures = []
    for pair in (cases[i:i + LANES] for i in range(0, RUNS, LANES)):
        procs = [(case, _start_script(*case)) for case in pair]
        for (strategy, destroy), proc in procs:
            _, err = proc.communicate(timeout=300)
            if proc.returncode != 0 or "terminate called" in err:
                failures.append(f"{strategy} destroy={destroy}: exit {proc.returncode}: {err[-600:]}")
    assert not failures, f"{len(failures)} of {RUNS} runs failed:\n" + "\n".join(failures)
