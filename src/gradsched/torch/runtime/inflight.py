"""Gradients still being reduced after ``backward()``: the end of backward, and a guard that waits.

With a plan that overlaps communication with the next forward (``bytescheduler``,
``usbyte``, what run-time ``auto`` may switch to), ``backward()`` can return while
operations are in flight.  What happens then depends on who will use the gradients:

* **No DistributedOptimizer attached** (a plain ``torch.optim`` optimizer, or none):
  the end of backward waits for every operation, as DDP does.  The gradients are
  final when ``backward()`` returns, so plain optimizers, LR schedulers built on
  them, clipping, ``GradScaler`` and logging just work; the plan keeps its blocks,
  priorities and credit window inside backward, not the overlap with the forward.
* **A DistributedOptimizer attached**: operations stay in flight.  Every parameter
  whose reduced gradient is not yet in ``.grad`` gets an :class:`InFlightGrad` as
  ``.grad``: the same memory, as a tensor subclass whose ``__torch_function__``
  finishes the executor's communication before any torch operation reads or
  changes it (``clip_grad_norm_``, ``GradScaler.unscale_``, ``p.grad.norm()``,
  in-place edits).  So the plain form of every pattern is correct, by waiting at
  the first touch; a loop that touches no gradient between ``backward()`` and
  ``step()`` keeps all the overlap.  When an operation's result is written back,
  ``.grad`` becomes the plain tensor again, so optimizers never pay the subclass's
  dispatch.

C++ code (autograd's accumulation) does not see ``__torch_function__``: the runtime
therefore finishes a backward's communication before the next forward or
``zero_grad()`` whenever no update is pending (the wrapper and the optimizer do), and
before the next backward accumulates anything (a second ``backward()`` per step: the
executor's ``_before_accumulate`` hook).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from gradsched.errors import GradschedError
from gradsched.torch.runtime.link import ModelLink
from gradsched.torch.runtime.trace import WAIT

# The executor imports this module (to unwrap guards), so it is typed here by what is used:
# ``settled``, ``settle_all()``, ``tracer``, ``params``, ``written``, ``views``, ``globally_unused``.
Executor = Any


class InFlightGrad(torch.Tensor):
    """A gradient whose reduction may still be in flight: any torch operation on it waits first."""

    _gs_owner: "weakref.ReferenceType[Any]"
    _gs_plain: torch.Tensor

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for leaf in tree_leaves((args, kwargs)):
            if type(leaf) is InFlightGrad:
                ex = leaf._gs_owner()
                if ex is not None and not ex.settled:
                    wait_all(ex, "wait: gradients read before step()")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


APPLIED = ("this parameter's top-k result was applied to its weights as it arrived (sparse memory mode 'laysa' "
           "with a DistributedOptimizer), so its gradient is gone after backward(); to read or change gradients "
           "between backward() and step() use DistributedOptimizer(..., clip_grad_norm=...), "
           "sparse_options={'memory': 'naive'}, or a plain torch.optim optimizer")


class AppliedGrad(torch.Tensor):
    """``.grad`` of a parameter LaySA already updated from its top-k result: any use is an error.

    Left as ``None`` the gradient would be skipped silently by ``clip_grad_norm_`` and
    ``GradScaler``, a wrong step nobody sees; this stand-in (one element, expanded:
    no memory) raises a :class:`~gradsched.errors.GradschedError` instead.  The
    optimizer wrapper and the next forward put ``None`` back."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise GradschedError(APPLIED)


SECOND_BACKWARD = ("a second backward() through one forward (l1.backward(retain_graph=True); l2.backward()) under "
                   "a top-k plan with sparse memory mode 'laysa' and a DistributedOptimizer: the first backward "
                   "already applied its top-k results to the weights, which the second one's graph still needs; "
                   "sum the losses and call backward() once, or use sparse_options={'memory': 'naive'}, "
                   "DistributedOptimizer(..., clip_grad_norm=...) or a plain torch.optim optimizer")


def refuse_second_backward(ex: Executor, out: Any) -> None:
    """Under LaySA with a DistributedOptimizer (results update their weights during backward): a second
    backward through ``out``'s graph raises :data:`SECOND_BACKWARD`, not autograd's "modified by an
    inplace operation" (a hook on each output's ``grad_fn``, run before anything of that backward)."""
    owner = weakref.ref(ex)
    at = ex.sparse_step

    def before(_grads: Any) -> None:
        now = owner()
        if now is not None and now.sparse_step != at:
            raise GradschedError(SECOND_BACKWARD)

    seen: set[int] = set()
    for leaf in tree_leaves(out):
        fn = leaf.grad_fn if isinstance(leaf, torch.Tensor) else None
        if fn is not None and id(fn) not in seen:
            seen.add(id(fn))
            fn.register_prehook(before)


def applied(p: torch.Tensor) -> torch.Tensor:
    """The :class:`AppliedGrad` stand-in for ``p.grad``."""
    return torch.zeros((), dtype=p.dtype, device=p.device).expand_as(p).as_subclass(AppliedGrad)


def clear_applied(params: Any) -> None:
    """``None`` back in place of every :class:`AppliedGrad` (before the optimizer or autograd sees them)."""
    for p in params:
        if type(p.grad) is AppliedGrad:
            p.grad = None


def guard(ex: Executor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` (same memory) as an :class:`InFlightGrad` owned by ``ex``."""
    g = grad.as_subclass(InFlightGrad)
    g._gs_owner = weakref.ref(ex)
    g._gs_plain = grad
    return g


def unwrap(p: torch.Tensor) -> None:
    """Give ``p`` its plain gradient back (before the runtime writes into it)."""
    g = p.grad
    if type(g) is InFlightGrad:
        p.grad = g._gs_plain


def wait_all(ex: Executor, label: str = "wait for communication") -> None:
    """Finish all of ``ex``'s communication and write every result back (traced as a wait)."""
    tracer = ex.tracer
    t0 = tracer.now() if tracer is not None else 0.0
    ex.settle_all()
    if tracer is not None and tracer.now() - t0 > 1e-6:
        tracer.span(label, WAIT, t0)


def guard_unwritten(ex: Executor) -> None:
    """After backward with operations in flight: every parameter whose result is not written gets a guard.

    A parameter no rank used keeps its ``.grad`` as it was (``None`` stays ``None``),
    as DDP; one used only on other ranks has no local gradient yet: it gets zeros now
    (the reduced values are written into them), so ``clip_grad_norm_`` counts it."""
    for i, p in enumerate(ex.params):
        if ex.written[i] or i in ex.globally_unused:
            continue
        if p.grad is None:
            view = ex.views[i]
            p.grad = view if view is not None else torch.zeros_like(p)
        if type(p.grad) is not InFlightGrad:
            p.grad = guard(ex, p.grad)


def on_backward_end(link: ModelLink, ex: Executor) -> bool:
    """Executor ``ex``'s end-of-backward callback for overlapping plans (see the module docstring), bound to
    its wrapper's ``link``.

    Returns True when operations are left in flight (a DistributedOptimizer defers the
    update), False when the executor must wait for them now (plain optimizers)."""
    if link.optimizer is None:
        return False
    guard_unwritten(ex)
    return True
