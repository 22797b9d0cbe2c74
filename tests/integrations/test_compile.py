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
from helpers import params_of, train  # noqa: E402

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
    train(forward, opt, _batch, nn.functional.mse_loss, rank=rank, world=world, steps=STEPS, batch=16 // world)
    model.synchronize()
    return params_of(module)


def _batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


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


class _Net(nn.Module):
    """A user's own module class: dynamo compiles its forward (it leaves torch's own containers' code to eager)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


AUTO_QUICK = {"switch_iteration": 2, "trial_iterations": 2, "trial_rounds": 2, "trial_window_s": 0,
              "runoff_rounds": 0, "trial_share": 0}  # every trial window back to back: it settles within the test


def _graphs_per_step(rank: int, world: int, plan: str | None, steps: int) -> dict:
    """Train the compiled wrapper; dynamo's count of compiled graphs after every step, and whether any frame
    was compiled again once the plan stopped changing (``error_on_recompile`` raises if it was)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = DistributedDataParallel(_Net(), plan, plan_options=AUTO_QUICK if plan in (None, "auto") else None)
    forward = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    graphs, settled_at = [], None
    for step in range(steps):
        settled = model.autotuner is None or model.autotuner.done
        if settled and settled_at is None:
            settled_at = step
            torch._dynamo.config.error_on_recompile = True  # from here on a recompile fails the step
        x = torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(forward(x[rank::world]), x[rank::world].sum(dim=1, keepdim=True)).backward()
        opt.step()
        graphs.append(counters["stats"]["unique_graphs"])
    switches = [(s.iteration, s.strategy) for s in model.autotuner.switches] if model.autotuner else []
    return {"graphs": graphs, "settled_at": settled_at, "switches": switches}


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["wfbp", None])
def test_compiled_wrapper_compiles_once(plan):
    """torch.compile(wrapper): the module is compiled, the wrapper's bookkeeping is not; once the plan stops
    changing (at once for a named plan, after run-time auto's trials for the default) nothing is compiled again.
    Traced, the wrapper's forward guarded on the tracer's iteration counter and recompiled every step."""
    r0 = spawn_local(_graphs_per_step, 2, plan, 40, timeout_s=300)[0]
    assert r0["settled_at"] is not None and r0["settled_at"] < 30, r0
    graphs = r0["graphs"]
    assert graphs[0] >= 1, graphs  # the module itself was compiled
    assert graphs[-1] == graphs[r0["settled_at"]], r0  # no new graph after the plan settled
    assert graphs[-1] <= 4, r0  # a few graphs at most (the module's, and its pieces), not one per step
