"""DistributedOptimizer's deferred update, one subset at a time, is one full step (no process group needed)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.torch.runtime.optim import DistributedOptimizer  # noqa: E402


class _Overlapping:
    """What DistributedOptimizer needs of the wrapper's link to defer updates: an overlapping plan, no tracer."""

    overlaps_forward = True
    tracer = None

    def __init__(self, module: nn.Module) -> None:
        self.params = list(module.parameters())
        self.link = self

    def attach_optimizer(self, optimizer: DistributedOptimizer, inner: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return inner

    def backward_outstanding(self) -> bool:
        return True  # the gradients were computed: step() defers the update


def _model_and_grads() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    model(torch.randn(3, 6)).square().sum().backward()
    return model


@pytest.mark.parametrize("make", [
    lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
    lambda groups: torch.optim.Adam(groups, lr=0.01),
], ids=["sgd", "adam"])
def test_layer_by_layer_updates_equal_one_step_with_the_hyperparameters_of_step(make):
    ref, mine = _model_and_grads(), _model_and_grads()

    def groups(m: nn.Module) -> list[dict]:  # two groups with their own learning rates
        return [{"params": list(m[0].parameters()) + list(m[4].parameters())},
                {"params": list(m[2].parameters()), "lr": 0.05}]

    ref_opt, inner = make(groups(ref)), make(groups(mine))
    opt = DistributedOptimizer(inner, _Overlapping(mine))
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
    for _ in range(3):
        ref_opt.step()
        ref_sched.step()
        opt.step()  # deferred: records the hyper-parameters in force now
        sched.step()  # acts on the next step only, as without deferral
        before = [g for g in inner.param_groups]
        for layer in (0, 2, 4):  # the forward's order: each layer's update just before it runs
            opt._step_subset(list(mine[layer].parameters()))
        opt._pending.clear()  # what apply() does after updating: the step is done
        assert inner.param_groups == before and all(a is b for a, b in zip(inner.param_groups, before))
    for a, b in zip(ref.parameters(), mine.parameters()):
        assert torch.equal(a, b)
    assert [g["lr"] for g in inner.param_groups] == [g["lr"] for g in ref_opt.param_groups]
    assert copy.deepcopy(inner.state_dict())["state"].keys() == ref_opt.state_dict()["state"].keys()


class _CountingList(list):
    """A parameter list that counts how often it is walked whole."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        _CountingList.walks += 1
        return super().__iter__()


def test_each_layers_update_costs_its_own_parameters_not_every_parameter():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(40)])
    model(torch.randn(1, 2)).sum().backward()
    ref = copy.deepcopy(model)
    for a, b in zip(ref.parameters(), model.parameters()):
        a.grad = b.grad.clone()
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inner.param_groups[0]["params"] = _CountingList(inner.param_groups[0]["params"])
    opt = DistributedOptimizer(inner, _Overlapping(model))
    opt.step()
    _CountingList.walks = 0
    for layer in model:  # the next forward's per-layer updates
        opt._step_subset(list(layer.parameters()))
    assert _CountingList.walks <= 1  # once to index the group, not once per layer (40 before)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters()))
    inner.param_groups[0]["params"][0] = nn.Parameter(torch.zeros(2, 2))  # edited in place: found again
    fresh = inner.param_groups[0]["params"][0]
    fresh.grad = torch.ones(2, 2)
    opt._step_subset([fresh])
    assert torch.equal(fresh, torch.full((2, 2), -0.1))


def test_a_tensor_listed_twice_in_a_layers_update_steps_once():
    """A tied weight reached from two places of one layer's list is updated once, as by the full step."""
    model = nn.Linear(2, 2)
    model(torch.randn(1, 2)).sum().backward()
    ref = copy.deepcopy(model)
    ref.weight.grad, ref.bias.grad = model.weight.grad.clone(), model.bias.grad.clone()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), _Overlapping(model))
    opt.step()
    opt._step_subset([model.weight, model.bias, model.weight])
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    assert torch.equal(model.weight, ref.weight) and torch.equal(model.bias, ref.bias)
