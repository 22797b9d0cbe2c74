"""Deferred updates under an overlapping plan: one ``step()`` per completed operation, not per layer, and no
first-use dispatch of the update's own torch operations (issue 35; docs/runtime.md, "Overlap with the next
forward").  No process group: a stand-in link plays the executor's completion of operations."""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gradsched.torch.runtime.gating import FirstUse, ForwardGate  # noqa: E402
from gradsched.torch.runtime.optim import DistributedOptimizer  # noqa: E402

LAYERS = 6
# the plan's operations in issue order (backward: the last layers' first); each holds two layers' tensors
OPS = [[8, 9, 10, 11], [4, 5, 6, 7], [0, 1, 2, 3]]
WRONG = 100.0  # what a .grad holds until its operation's result is written: stepping it early is caught


class _Link:
    """The executor as DistributedOptimizer sees it: each ``.grad`` holds a wrong value until the operation
    holding it completes (its averaged result written); operations complete in issue order when waited for
    (``in_order``) or alone (a decoupled all-reduce), and ``done_early`` ones complete in the background."""

    overlaps_forward = True
    tracer = None

    def __init__(self, model: nn.Module, grads: list[torch.Tensor], in_order: bool, done_early: set[int]) -> None:
        self.params = list(model.parameters())
        self.link = self
        self._grads = grads
        self._in_order = in_order
        self._done_early = done_early
        self._written: set[int] = set()
        self._fresh: list[int] = []
        for p in self.params:
            p.grad = torch.full_like(p, WRONG)

    def attach_optimizer(self, optimizer: DistributedOptimizer, inner: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return inner

    def backward_outstanding(self) -> bool:
        return True

    def _complete(self, op: int) -> None:
        for t in OPS[op]:
            if t not in self._written:
                self.params[t].grad = self._grads[t].clone()
                self._written.add(t)
                self._fresh.append(t)

    def settle(self, tensors: list[int]) -> None:
        for t in tensors:
            op = next(k for k, ts in enumerate(OPS) if t in ts)
            for k in (range(op + 1) if self._in_order else [op]):
                self._complete(k)

    def settle_all(self) -> None:
        for k in range(len(OPS)):
            self._complete(k)

    def settle_done(self) -> list[int]:
        for k in self._done_early:
            self._complete(k)
        out, self._fresh = self._fresh, []
        return out


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(LAYERS)])


def _grads(model: nn.Module) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(p.shape, generator=gen) for p in model.parameters()]


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd-momentum-wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def _run(make: Callable[[Any], torch.optim.Optimizer], in_order: bool, done_early: set[int],
         clip: float | None = None, steps: int = 2) -> tuple[nn.Module, nn.Module, list[int]]:
    """``steps`` deferred steps, each applied layer by layer in forward order as the gate does; the model,
    a reference stepped once per step with the final gradients, and the optimizer calls per step.  The
    wrapped optimizer's groups and state end as the reference's."""
    ref, mine = _model(), _model()
    ref_opt, inner = make(ref.parameters()), make(mine.parameters())
    calls: list[int] = []
    inner.register_step_pre_hook(lambda *_: calls.__setitem__(-1, calls[-1] + 1))
    groups = inner.param_groups
    for _ in range(steps):
        grads = _grads(ref)
        for p, g in zip(ref.parameters(), grads):
            p.grad = g.clone()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(ref.parameters()), clip)
        ref_opt.step()
        link = _Link(mine, grads, in_order, done_early)
        opt = DistributedOptimizer(inner, link, clip_grad_norm=clip)  # type: ignore[arg-type]
        opt.step()
        calls.append(0)
        for layer in range(LAYERS):  # the next forward: each layer's gate
            opt.apply([2 * layer, 2 * layer + 1])
        assert not opt.pending
    assert inner.param_groups is groups and [len(g["params"]) for g in groups] == [2 * LAYERS]
    ours, theirs = inner.state_dict(), ref_opt.state_dict()
    assert ours["param_groups"] == theirs["param_groups"] and ours["state"].keys() == theirs["state"].keys()
    return ref, mine, calls


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_operations_completing_in_issue_order_update_in_one_step_equal_to_the_full_step(name):
    """The first layer's operation is the last issued: waiting for it completes every operation, so the
    whole update is one call (one per layer, 6, before), equal to the full step."""
    ref, mine, calls = _run(OPTIMIZERS[name], in_order=True, done_early=set())
    assert calls == [1, 1]
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), mine.parameters()))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_operations_retired_alone_update_once_per_operation_and_never_before_their_results(name):
    """Retired one at a time (decoupled all-reduces): one call per operation, each with its own tensors only
    (a tensor stepped before its result is written would step the wrong gradient and differ)."""
    ref, mine, calls = _run(OPTIMIZERS[name], in_order=False, done_early=set())
    assert calls == [len(OPS)] * 2
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), mine.parameters()))


def test_an_operation_complete_in_the_background_joins_the_next_update():
    """The last layers' operation completed by itself: it goes with the first layer's update."""
    ref, mine, calls = _run(OPTIMIZERS["sgd-momentum-wd"], in_order=False, done_early={0})
    assert calls == [len(OPS) - 1] * 2
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), mine.parameters()))


def test_clipping_waits_for_every_result_and_updates_once():
    ref, mine, calls = _run(OPTIMIZERS["adamw"], in_order=False, done_early=set(), clip=0.5)
    assert calls == [1, 1]
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(ref.parameters(), mine.parameters()))


# --------------------------------------------------------------------------- the gate's own apply
class _Counting(FirstUse):
    calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        _Counting.calls += 1
        return super().__torch_function__(func, types, args, kwargs)


class _Ops:
    """An optimizer whose update runs ``n`` torch operations per call (as torch.optim's step does)."""

    def __init__(self, n: int, all_at_once: bool = False) -> None:
        self.n = n
        self.all_at_once = all_at_once  # the first call applies every update
        self.pending = True
        self.subclass_calls = 0

    def is_due(self, tensor: int) -> bool:
        return self.pending

    def apply(self, tensors: list[int]) -> None:
        x = _Tracked(torch.zeros(2)) if self.n else torch.zeros(2)
        for _ in range(self.n):
            x = x + 1
        self.subclass_calls += bool(self.n)
        self.pending = not self.all_at_once

    def flush(self) -> None:
        self.pending = False


class _Tracked(torch.Tensor):
    """A tensor subclass with its own ``__torch_function__`` (as DTensor): must keep dispatching."""

    seen = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        _Tracked.seen += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def _forward_calls(n: int, monkeypatch: pytest.MonkeyPatch, all_at_once: bool = False) -> tuple[int, int]:
    import gradsched.torch.runtime.gating as gating

    monkeypatch.setattr(gating, "FirstUse", _Counting)
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2))
    opt = _Ops(n, all_at_once)
    gate = ForwardGate(model, list(model.parameters()), lambda: opt)  # type: ignore[arg-type,return-value]
    x = torch.ones(1, 2)
    _Counting.calls = _Tracked.seen = 0
    with gate.first_use():
        model(x)
    gate.remove()
    return _Counting.calls, _Tracked.seen


def test_the_gates_own_update_runs_outside_the_first_use_mode(monkeypatch):
    """The pre-hooks' updates (2 layers x 50 operations) add no call of the mode (100 before), while a
    tensor subclass's own ``__torch_function__`` still runs for each of them (no DisableTorchFunction)."""
    bare, _ = _forward_calls(0, monkeypatch)
    busy, seen = _forward_calls(50, monkeypatch)
    assert bare > 0 and busy == bare
    assert seen >= 2 * 50


def test_the_mode_is_left_for_the_rest_of_the_forward_once_no_update_is_pending(monkeypatch):
    """The first layer's update applied every one: the forward's own operations no longer go through it."""
    bare, _ = _forward_calls(0, monkeypatch)
    done, _ = _forward_calls(50, monkeypatch, all_at_once=True)
    assert bare > 0 and done == 0
