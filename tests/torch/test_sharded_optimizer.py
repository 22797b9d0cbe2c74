"""Sharded optimizer state (issue 36, item 3): ``shard_optimizer=True`` trains to DDP's parameters and
holds about 1/p of Adam's state per rank (gloo, 2 ranks), over all-reduce plans (PyTorch's
ZeroRedundancyOptimizer) and over dear (the reduce-scatters' shards: test_sharded_step.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model  # noqa: E402
from helpers import params_of, train  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from gradsched.torch.runtime.sharded import shard, state_bytes  # noqa: E402

TOLERANCE = 1e-5
STEPS = 8


def _train(strategy, optimizer: str, shard_optimizer: bool, clip: float | None = None) -> dict:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = build_model("mlp", seed=0)
    ddp = strategy == "ddp" and not shard_optimizer
    model = DistributedDataParallel(spec.module, strategy, use_torch_ddp=ddp, timeout_s=30,
                                    shard_optimizer=shard_optimizer)
    params = list(model.parameters())
    inner = (torch.optim.SGD(params, lr=0.05, momentum=0.9) if optimizer == "sgd"
             else torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01))
    opt = DistributedOptimizer(inner, model, clip_grad_norm=clip)
    sched = torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=3, gamma=0.5)
    train(model, opt, spec.make_batch, spec.loss_fn, rank=rank, world=world, steps=STEPS, sched=sched)
    model.synchronize()
    return {"params": params_of(spec.module), "state_bytes": state_bytes(opt.optimizer),
            "sharded": type(opt.optimizer).__name__}


def _job(rank: int, world: int) -> dict:
    out = {}
    for optimizer, clip in (("sgd", None), ("adamw", None), ("adamw", 0.5)):
        ref = _train("ddp", optimizer, False, clip)
        for strategy in ("dear", "wfbp", "usbyte"):
            got = _train(strategy, optimizer, True, clip)
            out[f"{strategy}/{optimizer}/{clip}"] = {
                "diff": rel_diff(got["params"], ref["params"]), "sharded": got["sharded"],
                "state_ratio": got["state_bytes"] / ref["state_bytes"],
                "flat": torch.cat([p.reshape(-1) for p in got["params"]])}
    return out


@pytest.mark.slow
def test_sharded_optimizer_matches_ddp_and_holds_a_share_of_the_state():
    results = spawn_local(_job, 2, timeout_s=180)
    for label, r in results[0].items():
        assert r["diff"] <= TOLERANCE, (label, r["diff"])
        # a plan of reduce-scatters steps their shards (test_sharded_step.py); others use PyTorch's ZeRO
        expected = "ShardedOptimizer" if label.startswith("dear/") else "ZeroRedundancyOptimizer"
        assert r["sharded"] == expected, label
        assert torch.equal(r["flat"], results[1][label]["flat"]), label
        if label.split("/")[1] == "adamw":  # both ranks hold some state, together all of it
            assert 0 < r["state_ratio"] < 1, (label, r["state_ratio"])
            # (ShardedOptimizer: a parameter split between the ranks has a step count on each, 4 bytes more)
            assert r["state_ratio"] + results[1][label]["state_ratio"] == pytest.approx(1.0, abs=1e-3), label


def test_an_optimizer_that_already_stepped_is_refused():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(3)
    opt.step()
    with pytest.raises(GradschedError, match="already stepped"):
        shard(opt, None)
