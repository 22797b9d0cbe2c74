"""DistributedOptimizer.step(closure): the same update as backward() then step(), under every kind of plan."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402


def _train(rank: int, world: int, plan: str, use_closure: bool, optimizer: str = "sgd") -> list[torch.Tensor]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = DistributedDataParallel(module, plan, plan_options={"unit_bytes": 256} if plan == "usbyte" else None)
    inner = (torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3) if optimizer == "lbfgs"
             else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    opt = DistributedOptimizer(inner, model)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(8, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        x, y = x[rank::world], y[rank::world]

        def closure():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        if use_closure:
            loss = opt.step(closure)
            assert isinstance(loss, torch.Tensor)
        else:
            closure()
            opt.step()
    model.synchronize()
    return [p.detach().clone() for p in module.parameters()]


def _cases(rank: int, world: int) -> dict:
    out = {f"{plan}/{c}": _train(rank, world, plan, c) for plan in ("wfbp", "usbyte") for c in (False, True)}
    out["lbfgs/ddp"] = _train(rank, world, "ddp", True, "lbfgs")
    out["lbfgs/mgwfbp"] = _train(rank, world, "mgwfbp", True, "lbfgs")
    try:
        _train(rank, world, "usbyte", True, "lbfgs")
        out["lbfgs/usbyte"] = "no error"
    except GradschedError as exc:
        out["lbfgs/usbyte"] = str(exc)
    return out


@pytest.mark.slow
def test_closure_steps_match_backward_then_step():
    r0, r1 = spawn_local(_cases, 2, timeout_s=120)
    for plan in ("wfbp", "usbyte"):
        assert rel_diff(r0[f"{plan}/True"], r0[f"{plan}/False"]) == 0.0, plan
        assert all(torch.equal(a, b) for a, b in zip(r0[f"{plan}/True"], r1[f"{plan}/True"]))
    assert rel_diff(r0["wfbp/True"], r0["usbyte/True"]) < 1e-6
    # LBFGS re-evaluates the closure: fine without overlap (matches PyTorch's DDP), refused with it
    assert rel_diff(r0["lbfgs/mgwfbp"], r0["lbfgs/ddp"]) < 1e-5
    assert rel_diff(r0["lbfgs/mgwfbp"], r0["wfbp/True"]) > 1e-3
    assert "LBFGS evaluates its closure several times" in r0["lbfgs/usbyte"]
