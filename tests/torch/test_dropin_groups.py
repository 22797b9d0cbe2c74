"""Process groups and the start-up check (issue 17, items 2 and 4).

- 4 ranks as 2 data-parallel groups of 2 (as with tensor x data parallelism): each
  group, wrapped with ``process_group=``, trains to PyTorch DDP's parameters on that
  group, the two groups stay apart, and a collective ``new_group`` afterwards still works
  (the wrapper's side groups did not put the ranks' group counters apart).
- Ranks configured differently get one clear GradschedError naming the setting, on
  every rank, instead of a hang; a rank that never arrives gives a CollectiveError
  after ``timeout_s``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from helpers import train  # noqa: E402
from gradsched.torch.jobs.selftest import free_port, rel_diff, spawn_local  # noqa: E402

TOLERANCE = 1e-5
GROUP_PLANS = [None, "bytescheduler", "dear"]  # the default (DDP buckets), a plan with a progress thread (private group)
# and a two-phase one (side groups for its gathers and, on gloo, its reduce-scatters, with worker threads of their own)


def _net(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).to(dtype)


def _batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 12, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def _train(module: nn.Module, model: nn.Module, rank_in_group: int, data_seed: int, steps: int = 5) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if isinstance(model, DistributedDataParallel):  # overlapping plans step through it
        opt = DistributedOptimizer(opt, model)
    train(model, opt, _batch, nn.functional.cross_entropy, rank=rank_in_group, world=2, steps=steps, batch=4,
          seed=data_seed)
    if hasattr(model, "synchronize"):
        model.synchronize()
    return {k: t.detach().clone() for k, t in module.state_dict().items()}


def _params(state: dict) -> list:
    """The parameters (buffers such as BatchNorm's running statistics differ between ranks, as in DDP)."""
    return [t for k, t in state.items() if k.endswith(("weight", "bias"))]


def _subgroups(rank: int, world: int) -> dict:
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group, in order
    mine, index = groups[rank // 2], rank // 2
    out: dict = {"group": index}
    ref = _net()
    out["ddp"] = _train(ref, torch.nn.parallel.DistributedDataParallel(ref, process_group=mine), rank % 2, index)
    for plan in GROUP_PLANS:
        module = _net()
        opts = {"bytescheduler": {"partition_bytes": 256, "credit_bytes": 512}}.get(plan or "")
        model = DistributedDataParallel(module, plan, process_group=mine, plan_options=opts, timeout_s=30)
        out[f"gs/{plan}"] = _train(module, model, rank % 2, index)
    after = dist.new_group([0, 1, 2, 3])  # collective group creation still lines up on every rank
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=after)
    out["after"] = float(t.item())
    return out


@pytest.fixture(scope="module")
def subgroups():
    return spawn_local(_subgroups, 4, timeout_s=90)


@pytest.mark.slow
@pytest.mark.parametrize("plan", GROUP_PLANS)
def test_each_subgroup_matches_ddp_on_that_group(subgroups, plan):
    for r in subgroups:
        assert r[f"gs/{plan}"].keys() == r["ddp"].keys()
        assert rel_diff(list(r[f"gs/{plan}"].values()), list(r["ddp"].values())) <= TOLERANCE
    for a, b in ((0, 1), (2, 3)):  # the members of a group agree exactly
        assert all(torch.equal(x, y) for x, y in zip(_params(subgroups[a][f"gs/{plan}"]),
                                                       _params(subgroups[b][f"gs/{plan}"])))
    # the two groups trained on different data and were not mixed: they differ
    assert rel_diff(_params(subgroups[0][f"gs/{plan}"]), _params(subgroups[2][f"gs/{plan}"])) > 1e-3


@pytest.mark.slow
def test_collective_group_creation_still_works_after_wrapping_on_subgroups(subgroups):
    assert [r["after"] for r in subgroups] == [6.0] * 4


# --------------------------------------------------------------------------- mismatches
MISMATCHES = {
    # name: (kwargs for rank 0, kwargs for rank 1, what the error must say)
    "find_unused": ({}, {"find_unused_parameters": True}, "ranks disagree on find_unused_parameters"),
    "static_graph": ({}, {"static_graph": True}, "ranks disagree on find_unused_parameters"),
    "broadcast_buffers": ({}, {"broadcast_buffers": False}, "ranks disagree on broadcast_buffers"),
    "init_sync": ({}, {"init_sync": False}, "ranks disagree on init_sync"),
    "dtype": ({}, {"dtype": torch.float64}, "ranks disagree on the parameters' names, shapes and dtypes"),
    "plan": ({"plan": "wfbp"}, {"plan": "sync"}, "ranks hold different plans"),
    # the default is auto with options of its own (DEFAULT_OPTIONS): those differ first
    "plan_default": ({}, {"plan": "mgwfbp"}, "ranks disagree on plan options"),
    "auto_options": ({"plan": "auto"}, {"plan": "auto", "plan_options": {"switch_iteration": 7}},
                     "ranks disagree on plan options"),
    "torch_ddp_args": ({"plan": "ddp"}, {"plan": "ddp", "bucket_cap_mb": 5}, "ranks hold different plans"),
}


def _error(fn) -> str:
    try:
        fn()
    except GradschedError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _mismatches(rank: int, world: int) -> dict:
    out = {}
    for name, (kw0, kw1) in ((n, m[:2]) for n, m in MISMATCHES.items()):
        kw = dict(kw0 if rank == 0 else kw1)
        module = _net(kw.pop("dtype", torch.float32))
        plan = kw.pop("plan", None)
        out[name] = _error(lambda: DistributedDataParallel(module, plan, timeout_s=20, **kw))
    module = _net()  # and the group is still usable afterwards: the check left no collective behind
    _train(module, DistributedDataParallel(module), rank, 0, steps=2)
    out["after"] = "ok"
    return out


@pytest.fixture(scope="module")
def mismatches():
    return spawn_local(_mismatches, 2, timeout_s=60)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_mismatched_settings_fail_on_every_rank_with_the_setting_named(mismatches, name):
    for r in mismatches:
        assert r[name].startswith(f"GradschedError: {MISMATCHES[name][2]}"), r[name]
        assert "rank 0:" in r[name] and "rank 1:" in r[name]
    assert all(r["after"] == "ok" for r in mismatches)


WORKER = r"""
import os, sys, time, datetime
import torch, torch.distributed as dist
from gradsched.errors import GradschedError
from gradsched.torch import DistributedDataParallel
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
if rank == 1:
    time.sleep(300)  # never reaches the wrapper (the test kills it)
    os._exit(0)
print("wrapping", flush=True)
try:
    DistributedDataParallel(torch.nn.Linear(4, 2), sys.argv[1], timeout_s=3)
except GradschedError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(3)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["wfbp", "auto"])
def test_a_rank_that_never_arrives_gives_a_collective_error_after_timeout_s(plan):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, plan], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    try:
        # event-based: from the moment rank 0 starts wrapping (imports can take long on a loaded machine)
        assert procs[0].stdout.readline().strip() == "wrapping", procs[0].stderr.read()
        procs[0].wait(timeout=30)  # 3 s of timeout_s, with room for a loaded machine
        assert procs[1].poll() is None, "rank 0 should fail while rank 1 is still away (not after it exits)"
    except subprocess.TimeoutExpired:
        pytest.fail("rank 0 hung at start-up although its timeout_s is 3 s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    err = procs[0].stderr.read()
    assert procs[0].returncode == 3, err
    assert "CollectiveError" in err and "start-up consistency check" in err and "after 3 s" in err, err


def test_process_group_of_which_this_rank_is_not_a_member_is_refused(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(GradschedError, match="not a member"):
            DistributedDataParallel(nn.Linear(2, 2), process_group=dist.GroupMember.NON_GROUP_MEMBER)
    finally:
        dist.destroy_process_group()
