"""The runtime's host time per operation: what the bench counts, and that the executor counts it."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.runtime.hosttime import HostTimer  # noqa: E402
from gradsched.torch.jobs.selftest import spawn_local  # noqa: E402


class FakeClock:
    """A thread CPU clock that moves only when the code under test says it computed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def compute(self, seconds: float) -> None:
        self.now += seconds


def test_only_the_outermost_call_of_a_thread_counts():
    clock = FakeClock()
    timer = HostTimer(clock=clock)
    timer.count("issue", clock.compute, 0.02)
    timer.count("retire", lambda: (clock.compute(0.02), timer.count("issue", clock.compute, 0.02)))  # a wait that issues
    assert timer.seconds == {"issue": pytest.approx(0.02), "retire": pytest.approx(0.04)}
    assert timer.per_pass() == {"issue": 0.0, "retire": 0.0}  # no backward pass counted yet
    timer.passes = 2
    assert timer.per_pass()["retire"] == pytest.approx(timer.seconds["retire"] / 2)
    timer.reset()
    assert timer.seconds == {"issue": 0.0, "retire": 0.0} and timer.passes == 0


def test_a_failing_call_still_counts_and_ends_counting():
    clock = FakeClock()
    timer = HostTimer(clock=clock)

    def fail() -> None:
        clock.compute(0.01)
        raise RuntimeError("backend error")

    with pytest.raises(RuntimeError):
        timer.count("retire", fail)
    timer.count("issue", clock.compute, 0.03)  # counting again: the failed call did not leave it "inside"
    assert timer.seconds == {"issue": pytest.approx(0.03), "retire": pytest.approx(0.01)}


def test_sleeping_is_not_host_time():
    timer = HostTimer()
    timer.count("retire", time.sleep, 0.05)  # a blocked wait costs the thread no CPU
    assert timer.seconds["retire"] < 0.02


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _count(rank: int, world: int) -> dict:
    out = {}
    for strategy in ("sync", "wfbp"):
        model = DistributedDataParallel(_mlp(), strategy, use_torch_ddp=False)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
        timer = model.host_timer()
        assert model.host_timer() is timer  # asking again keeps counting
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
        model.synchronize()
        out[strategy] = {"passes": timer.passes, "ops": len(model.plan.operations), **timer.per_pass()}
    out["ddp"] = DistributedDataParallel(_mlp(), "ddp").host_timer()
    return out


@pytest.mark.slow
def test_the_executor_counts_issue_and_retire_per_backward_pass():
    for r in spawn_local(_count, 2, timeout_s=120):
        assert r["sync"]["ops"] == 1 and r["wfbp"]["ops"] == 6
        assert r["sync"]["passes"] == r["wfbp"]["passes"] == 5
        for strategy in ("sync", "wfbp"):
            assert r[strategy]["issue"] > 0 and r[strategy]["retire"] > 0
        assert r["wfbp"]["issue"] > r["sync"]["issue"]  # six backend calls against one
        assert r["ddp"] is None  # PyTorch's DDP: nothing of ours to count
