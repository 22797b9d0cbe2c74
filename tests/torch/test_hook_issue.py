"""A gradient hook issues an operation the moment its last gradient is in, though hooks that can issue
nothing skip the issue loop (``Executor._may_issue``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.timeline import BACKWARD, COMM  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.jobs.selftest import spawn_local  # noqa: E402


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 4))


def _trace(rank: int, world: int) -> dict:
    model = DistributedDataParallel(_mlp(), "threshold", plan_options={"mb": 0.01}, use_torch_ddp=False, trace=True)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(8, 32, generator=gen)).sum().backward()
        opt.step()
    model.synchronize()
    events = [(e.cat, e.start_s, e.end_s, dict(e.args or {})) for e in model.timeline().events
              if e.cat in (BACKWARD, COMM)]
    ops = [sorted({s.tensor for s in op.slices}) for op in model.plan.operations]
    return {"events": events, "ops": ops, "grads": [p.grad.clone() for p in model.parameters()]}


@pytest.mark.slow
def test_each_operation_is_issued_in_the_hook_of_its_last_gradient():
    results = spawn_local(_trace, 2, timeout_s=120)
    for r in results:
        ops = r["ops"]
        assert 1 < len(ops) < sum(len(t) for t in ops)  # buckets of several tensors: most hooks issue nothing
        for it in range(1, 4):
            ready = {e[3]["tensor"]: e[2] for e in r["events"] if e[0] == BACKWARD and e[3]["iteration"] == it}
            issued = {e[3]["op"]: e[1] for e in r["events"] if e[0] == COMM and e[3]["iteration"] == it}
            assert sorted(issued) == list(range(len(ops)))
            later = sorted(ready.values())
            for j, tensors in enumerate(ops):
                last = max(ready[t] for t in tensors)
                nxt = next((t for t in later if t > last), float("inf"))
                assert last <= issued[j] < nxt  # in that hook, before the next gradient's
    for a, b in zip(results[0]["grads"], results[1]["grads"]):
        assert torch.equal(a, b)  # averaged: every rank holds the same gradient
