"""`usbyte`'s whole groups (`groups`, the plan run-time `auto` kept on the README's main job) train to DDP's parameters.

gloo, 2 and 3 ranks: groups contiguous in ready order, each one all-reduce by forward-order priority, the next
forward of each layer gated on its own group (with a DistributedOptimizer, whose updates run as groups arrive).
In float64: on 3 ranks a float32 sum of three gradients rounds by the order of its additions, which a plan's
layout changes, and this small BatchNorm network amplifies 1e-7 after one step to 1e-2 after four (usbyte's
default plan as much as its groups; in float64 1e-15 either way).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gradsched.planners import make_plan  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from gradsched.torch.runtime.planning import default_cluster, profile_from_module  # noqa: E402
from helpers import params_of, train  # noqa: E402

TOLERANCE = 1e-9  # float64


def _train(strategy, distributed_optimizer: bool) -> dict:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = build_model("cnn", seed=0)
    ddp = strategy == "ddp"
    model = DistributedDataParallel(spec.module, strategy, use_torch_ddp=ddp, timeout_s=60)
    inner = torch.optim.SGD(list(model.parameters()), lr=0.05, momentum=0.9)
    opt = DistributedOptimizer(inner, model) if distributed_optimizer and not ddp else inner
    train(model, opt, spec.make_batch, spec.loss_fn, rank=rank, world=world, steps=4)
    model.synchronize()
    return {"params": params_of(spec.module), "operations": None if ddp else len(model.plan.operations)}


def _job(rank: int, world: int) -> dict:
    torch.set_default_dtype(torch.float64)
    profile = profile_from_module(build_model("cnn", seed=0).module)
    ref = _train("ddp", False)["params"]
    out = {}
    for groups in (3, 0):
        plan = make_plan("usbyte", profile, default_cluster(world), groups=groups)
        for dist_opt in (False, True):
            got = _train(plan, dist_opt)
            out[f"groups={groups}/dist_opt={dist_opt}"] = {
                "diff": rel_diff(got["params"], ref), "operations": got["operations"],
                "flat": torch.cat([p.reshape(-1) for p in got["params"]])}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_whole_groups_train_to_ddps_parameters(world):
    results = spawn_local(_job, world, timeout_s=240)
    for label, r in results[0].items():
        assert r["diff"] <= TOLERANCE, (label, r["diff"])
        assert r["operations"] >= 1, label
        assert all(torch.equal(r["flat"], other[label]["flat"]) for other in results[1:]), label
    assert results[0]["groups=3/dist_opt=False"]["operations"] >= 3  # at least one all-reduce a group
