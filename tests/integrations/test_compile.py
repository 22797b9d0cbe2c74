"""torch.compile: a compiled model trains to DDP's parameters under dense, overlapping and sparse plans (2 CPU ranks).

Both orders: the wrapper around a compiled module, and the compiled wrapper.  Small on
purpose: compiling costs seconds per plan on a 2-core machine."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from gradsched.torch.runtime.wrapper import is_compiled  # noqa: E402

STEPS = 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def _train(rank: int, world: int, plan: str, order: str) -> list[torch.Tensor]:
    module = _model()
    options = {"unit_bytes": 2048} if plan == "usbyte" else None
    if order == "inner":  # the wrapper around a compiled module
        model = DistributedDataParallel(torch.compile(module), plan, plan_options=options)
        forward = model
    elif order == "outer":  # the compiled wrapper
        model = DistributedDataParallel(module, plan, plan_options=options)
        forward = torch.compile(model)
    else:
        model = forward = DistributedDataParallel(module, plan, plan_options=options)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(16, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        nn.functional.mse_loss(forward(x[rank::world]), y[rank::world]).backward()
        opt.step()
    model.synchronize()
    return [p.detach().clone() for p in module.parameters()]


def _cases(rank: int, world: int, cases: list[tuple[str, str]]) -> dict:
    return {f"{plan}/{order}": _train(rank, world, plan, order) for plan, order in cases}


def test_is_compiled_sees_compiled_submodules():
    plain = _model()
    assert not is_compiled(plain)
    assert is_compiled(torch.compile(_model()))
    outer = nn.Sequential(_model())
    outer[0].compile()  # compiled in place
    assert is_compiled(outer)


@pytest.mark.slow
def test_compiled_models_train_like_eager_ddp():
    cases = [("ddp", "eager"), ("topk", "eager"), ("mgwfbp", "inner"), ("usbyte", "inner"), ("usbyte", "outer"),
             ("topk", "inner")]
    ranks = spawn_local(_cases, 2, cases, timeout_s=300)
    r0 = ranks[0]
    for label in r0:
        assert all(torch.equal(a, b) for a, b in zip(r0[label], ranks[1][label])), label
    ref = r0["ddp/eager"]
    diffs = {k: rel_diff(v, ref) for k, v in r0.items() if not k.startswith("topk")}
    assert all(d < 1e-5 for d in diffs.values()), diffs  # compiled kernels round a little differently
    assert rel_diff(r0["topk/inner"], r0["topk/eager"]) < 1e-5  # top-k with error feedback, compiled
