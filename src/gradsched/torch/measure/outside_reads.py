"""Which plans run on a model: parameters read outside their own module's forward.

A plan that overlaps the optimizer step with the next forward (``Plan.overlap_forward``,
with :class:`gradsched.torch.DistributedOptimizer`) holds each module's forward until
that module's parameters are updated: the gate is the module's forward pre-hook.  A
parameter that is read without its module's forward running (``nn.MultiheadAttention``
reads ``out_proj.weight`` in ``F.multi_head_attention_forward``; a parent's function
that uses a child's weight) passes no gate, and autograd fails mid-training
(issue 38 item 1).  :func:`outside_reads` finds such parameters by running one forward
and backward; :func:`plan_check` turns them into the ``plan_check`` of
:func:`gradsched.advise.advise`, so the advisor recommends only plans that run.

This is the hook for the runtime's own wrap-time check: once the runtime refuses (or
handles) such parameters when it wraps a model, :func:`plan_check` should ask it
instead of this test, so that advice and run time agree by construction."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from gradsched.advise import PlanCheck
from gradsched.errors import GradschedError
from gradsched.plan import Plan


def outside_reads(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None = None) -> list[str]:
    """Names of trainable parameters that get a gradient from ``batch`` although no module owning
    them ran its forward (the batch and ``loss_fn`` as :func:`gradsched.torch.advise` takes them).

    Gradients are computed with ``torch.autograd.grad``: the parameters' ``.grad`` is left alone."""
    from gradsched.torch.measure.profiler import _call, _to, model_loss

    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(module)
    ran: set[int] = set()
    handles = [m.register_forward_pre_hook(lambda mod, _args: ran.add(id(mod))) for m in model.modules()]
    try:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        data = _to(batch() if callable(batch) else batch, device)
        check_batch(data, loss_fn)
        inputs, targets = (data, None) if loss_fn is None else data
        out = _call(model, inputs)
    finally:
        for h in handles:
            h.remove()
    loss = model_loss(out) if loss_fn is None else loss_fn(out, targets)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return [n for (n, p), g in zip(named, grads)
            if g is not None and not any(id(m) in ran for m in owners.get(id(p), []))]


def plan_check(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None = None) -> PlanCheck:
    """``plan_check`` for :func:`gradsched.advise.advise`: a plan that overlaps the step with the next
    forward is refused on a model with parameters read outside their module (named in the reason)."""
    outside = outside_reads(model, batch, loss_fn)

    def check(plan: Plan) -> str | None:
        if not (plan.overlap_forward and outside):
            return None
        more = f" and {len(outside) - 1} more are" if len(outside) > 1 else " is"
        return (f"it steps the optimizer during the next forward, and {outside[0]}{more} read outside their "
                "module's forward")

    return check


def check_batch(batch: Any, loss_fn: Any) -> None:
    """A one-line error for a batch that cannot go with ``loss_fn`` (an (inputs, targets) pair is needed)."""
    if loss_fn is not None and not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise GradschedError("with a loss_fn the batch must be an (inputs, targets) pair, "
                             f"got {type(batch).__name__}")
