"""A user's script that wraps a model, trains and returns exits 0, every time.

Issue: such a script once aborted at exit ("terminate called without an active
exception", SIGABRT) in 3 of 20 runs on a loaded machine; gradsched's own workers
leave with ``os._exit`` and never saw it.  What gradsched runs or holds is now
released at exit (:mod:`gradsched.torch.runtime.shutdown`); these tests check that it is, and
run the script under torchrun on the runtime's two paths that hold threads or work at exit, one
ending each (2 jobs at once: bytescheduler's progress thread, left without
``destroy_process_group``; usbyte's executor operations in flight into the next forward, with
it; wfbp and mgwfbp run the same executor with nothing in flight at exit, ``"ddp"`` PyTorch's
DDP, which holds nothing of gradsched's).  Every (strategy, ending) pair of the five
strategies, 30 jobs and more, is ``python benchmarks/clean_exit.py --runs 30``.
"""

from __future__ import annotations

import os
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import clean_exit  # noqa: E402  (the benchmark's launcher: one definition of a job)

LANES = 2  # torchrun jobs at a time
# the progress thread without destroy_process_group (nothing closes it but the exit), operations in flight with it
CASES = (("bytescheduler", False), ("usbyte", True))


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


def test_the_default_wrapper_arms_the_exit_collection_before_any_executor_exists(monkeypatch):
    # run-time auto deferred on PyTorch's DDP builds no executor, whose registration was what armed close_all:
    # without it the wrapper's cycles (holding its process groups) were collected during finalisation, and a
    # drop-in script's rank aborted at exit ("terminate called without an active exception", CI)
    armed = []
    monkeypatch.setattr(shutdown, "_hooked", False)
    monkeypatch.setattr(shutdown.atexit, "register", armed.append)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4)))
        assert model.autotuner is not None and model._executor is None  # the default: deferred on DDP
        assert armed == [shutdown.close_all]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_user_script_exits_zero_under_torchrun_on_every_runtime_path_and_ending():
    """The runtime's paths that hold something at exit and both endings (with/without destroy_process_group),
    as whole torchrun jobs, both at once."""
    assert set(CASES) <= set(clean_exit.CASES) and {d for _, d in CASES} == {True, False}
    records = clean_exit.run_jobs(len(CASES), LANES, CASES)
    assert {(r["strategy"], r["destroy"]) for r in records} == set(CASES)
    failures = [f"{r['strategy']} destroy={r['destroy']}: exit {r['exit']}: {r['stderr_tail']}"
                for r in records if r["exit"] != 0 or r["aborted"]]
    assert not failures, f"{len(failures)} of {len(records)} runs failed:\n" + "\n".join(failures)
