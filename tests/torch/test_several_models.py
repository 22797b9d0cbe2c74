"""Several wrapped models in one process (a GAN's generator and discriminator) equal PyTorch DDP.

With credit-window plans (``bytescheduler``) each executor issues when a completion
frees room, at times that depend on local timing: two models on one shared group
could interleave their collectives differently on different ranks.  Each wrapped
model now issues such plans on a private group of its own.  The generator's step
also runs backward through the discriminator, whose reduced gradients are then
dropped by ``zero_grad()``: results of that backward must not land in the next one.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402

TOLERANCE = 1e-5
STEPS = 8
OPTIONS = {"bytescheduler": {"partition_bytes": 2048, "credit_bytes": 4096}, "usbyte": {"unit_bytes": 2048}}


def _nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    dis = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return gen, dis


def _wrap(module: nn.Module, strategy: str) -> Any:
    if strategy == "torch-ddp":
        return DistributedDataParallel(module, "ddp")
    return DistributedDataParallel(module, strategy, plan_options=OPTIONS.get(strategy), use_torch_ddp=False,
                                   timeout_s=60)


def _gan(strategy: str, wrap_opt: bool) -> list[torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    g_mod, d_mod = _nets()
    gen, dis = _wrap(g_mod, strategy), _wrap(d_mod, strategy)
    opts = []
    for model in (gen, dis):
        inner = torch.optim.Adam(model.parameters(), lr=1e-3)
        opts.append(DistributedOptimizer(inner, model) if wrap_opt and strategy != "torch-ddp" else inner)
    opt_g, opt_d = opts
    data = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        z = torch.randn(8 * world, 8, generator=data)[rank::world]
        real = (torch.randn(8 * world, 16, generator=data) + 1.0)[rank::world]
        # discriminator: real against generated (the generator gets no gradient here)
        opt_d.zero_grad()
        fake = gen(z).detach()
        logits = dis(torch.cat([real, fake]))
        labels = torch.cat([torch.ones(len(real), 1), torch.zeros(len(fake), 1)])
        F.binary_cross_entropy_with_logits(logits, labels).backward()
        torch.nn.utils.clip_grad_norm_(dis.parameters(), 0.5)
        opt_d.step()
        # generator: through the discriminator (whose gradients are computed, reduced, then dropped)
        opt_g.zero_grad()
        loss_g = F.binary_cross_entropy_with_logits(dis(gen(z)), torch.ones(len(z), 1))
        loss_g.backward()
        opt_g.step()
    for model in (gen, dis):
        if strategy != "torch-ddp":
            model.synchronize()
    return [p.detach().clone() for p in list(g_mod.parameters()) + list(d_mod.parameters())]


def _job(rank: int, world: int, wrap_opt: bool) -> dict:
    return {s: _gan(s, wrap_opt) for s in ("torch-ddp", "bytescheduler", "usbyte", "wfbp")}


def _all_jobs(rank: int, world: int) -> dict[str, Any]:
    """Every case of this file in one 2-rank job (one start-up instead of three)."""
    return {"wrapped": _job(rank, world, True), "plain": _job(rank, world, False), "groups": _groups(rank, world)}


@pytest.fixture(scope="module")
def jobs() -> list[dict[str, Any]]:
    return spawn_local(_all_jobs, 2, timeout_s=180)


@pytest.mark.slow
@pytest.mark.parametrize("wrap_opt", [True, False], ids=["DistributedOptimizer", "plain-optimizer"])
def test_gan_with_two_wrapped_models_matches_ddp(jobs, wrap_opt):
    results = [r["wrapped" if wrap_opt else "plain"] for r in jobs]
    ref = results[0]["torch-ddp"]
    bad = {}
    for s in results[0]:
        diff = max(rel_diff(r[s], ref) for r in results)
        same = all(torch.equal(a, b) for a, b in zip(results[0][s], results[1][s]))
        if diff > TOLERANCE or not same:
            bad[s] = (diff, same)
    assert not bad, bad


def _groups(rank: int, world: int) -> list[bool]:
    a = DistributedDataParallel(nn.Linear(64, 64), "bytescheduler", plan_options=OPTIONS["bytescheduler"])
    b = DistributedDataParallel(nn.Linear(64, 64), "bytescheduler", plan_options=OPTIONS["bytescheduler"])
    ga, gb = a._executor.group, b._executor.group
    return [ga is not gb, ga is not dist.group.WORLD, gb is not dist.group.WORLD]


@pytest.mark.slow
def test_each_credit_window_model_issues_on_its_own_group(jobs):
    assert [r["groups"] for r in jobs] == [[True, True, True]] * 2
