"""Which plans run on a model: parameters the first-use gate cannot see.

A plan that overlaps the optimizer step with the next forward (``Plan.overlap_forward``,
with :class:`gradsched.torch.DistributedOptimizer`) updates each parameter in place just
before the next forward first reads it (:mod:`gradsched.torch.runtime.gating`): a forward
pre-hook of the module owning it, or any torch function receiving it (or a module
attribute aliasing its memory).  That covers ``nn.MultiheadAttention``'s ``out_proj``
(read in ``F.multi_head_attention_forward``), ``nn.Transformer*``, tied weights, a
parameter used twice and a parent reading its child's weight.  What it cannot see fails
mid-training ("modified by an inplace operation") or reads stale weights:

* a parameter's memory read while its update is still due: a view or alias made before
  the forward and held anywhere but a module attribute (a list, a closure);
* a parameter that gets a gradient although no torch function of the forward received it
  (a C++ extension given ``data_ptr()``).

:func:`unseen_reads` finds them by running one forward with the runtime's own gate
(:class:`~gradsched.torch.runtime.gating.ForwardGate`) in front of a stand-in optimizer
that only records which updates were applied, and one backward; :func:`plan_check` turns
them into the ``plan_check`` of :func:`gradsched.advise.advise`, so the advisor
recommends only plans that run, by the same rules the runtime applies.
:func:`outside_reads` (parameters read outside their own module's forward, which the
gate now handles) is kept as a diagnostic."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from gradsched.advise import PlanCheck
from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.torch.measure.profiler import _call, _to, model_loss
from gradsched.torch.runtime.gating import ForwardGate, ParameterMemory

REMEDY = ("use a plan that does not overlap the next forward (e.g. plan_options={'exclude': [...]} or mgwfbp), "
          "or read the parameter through a torch function or a module attribute")


def outside_reads(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None = None) -> list[str]:
    """Names of trainable parameters that get a gradient from ``batch`` although no module owning
    them ran its forward (the batch and ``loss_fn`` as :func:`gradsched.torch.advise` takes them).
    The first-use gate handles them; a diagnostic, not a refusal.

    Gradients are computed with ``torch.autograd.grad``: the parameters' ``.grad`` is left alone."""
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(module)
    ran: set[int] = set()
    handles = [m.register_forward_pre_hook(lambda mod, _args: ran.add(id(mod))) for m in model.modules()]
    inputs, targets = _inputs(model, batch, loss_fn)
    try:
        out = _call(model, inputs)
    finally:
        for h in handles:
            h.remove()
    loss = model_loss(out) if loss_fn is None else loss_fn(out, targets)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return [n for (n, p), g in zip(named, grads)
            if g is not None and not any(id(m) in ran for m in owners.get(id(p), []))]


def unseen_reads(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None = None) -> list[str]:
    """Names of trainable parameters an overlapping plan cannot update before their first read on ``batch``:
    read (their memory) while their update was still due, or given a gradient without the gate applying
    their update in the forward.  Parameters, buffers, ``.grad`` and the random state are left as they were."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    recorder = _Recorder(len(params))
    gate = ForwardGate(model, params, lambda: recorder)
    gate.stop_checking()  # the gate's own check raises at the first unseen read; here each is recorded
    watch = _StaleReads(params, recorder)
    inputs, targets = _inputs(model, batch, loss_fn)
    try:
        with _kept_state(model):
            with watch, gate.first_use():  # the wrapper's forward; what it leaves due is applied after it
                out = _call(model, inputs)
            in_forward = set(recorder.applied)
            loss = model_loss(out) if loss_fn is None else loss_fn(out, targets)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        gate.remove()
    bad = watch.stale | {i for i, g in enumerate(grads) if g is not None and i not in in_forward}
    return [named[i][0] for i in sorted(bad)]


def plan_check(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None = None) -> PlanCheck:
    """``plan_check`` for :func:`gradsched.advise.advise`: a plan that overlaps the step with the next
    forward is refused on a model with parameters the first-use gate cannot see (:func:`unseen_reads`,
    named in the reason with the remedy); every other plan runs."""
    unseen = unseen_reads(model, batch, loss_fn)

    def check(plan: Plan) -> str | None:
        if not (plan.overlap_forward and unseen):
            return None
        more = f" and {len(unseen) - 1} more are" if len(unseen) > 1 else " is"
        return (f"it steps the optimizer during the next forward, and {unseen[0]}{more} read where the "
                f"first-use gate cannot see it ({REMEDY})")

    return check


class _Recorder:
    """A stand-in for the DistributedOptimizer the gate drives (an :class:`~gradsched.torch.runtime.link.UpdateLink`):
    every update due, ``apply`` only records."""

    def __init__(self, n: int) -> None:
        self._pending: set[int] = set(range(n))
        self.applied: set[int] = set()

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    on_arrival = None

    def is_due(self, tensor: int) -> bool:
        return tensor in self._pending

    def apply(self, tensors: list[int]) -> None:
        self.applied.update(tensors)
        self._pending.difference_update(tensors)

    def flush(self) -> None:
        self.apply(sorted(self._pending))


class _StaleReads(TorchFunctionMode):
    """Outside the gate's own mode (entered first), so it sees each operation after the gate has had its
    chance to apply updates: indices of parameters whose memory an operation reads while still due."""

    def __init__(self, params: list[nn.Parameter], recorder: _Recorder) -> None:
        super().__init__()
        self._recorder = recorder
        self._index = {id(p): i for i, p in enumerate(params)}
        self._memory = ParameterMemory(params)
        self.stale: set[int] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._recorder.pending:
            for v in tree_flatten((args, kwargs))[0]:
                if isinstance(v, torch.Tensor):
                    own = self._index.get(id(v))
                    # a parameter itself: its own update; any other tensor (a view, an alias): the parameters
                    # whose elements it reads
                    read = self._memory.overlapping(v) if own is None else (own,)
                    self.stale.update(i for i in read if self._recorder.is_due(i))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _kept_state(model: nn.Module) -> Iterator[None]:
    """Buffers (BatchNorm's running statistics) and the random state as they were after the block."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def _inputs(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None) -> tuple[Any, Any]:
    """``batch`` (as :func:`gradsched.torch.advise` takes it) on the model's device: (inputs, targets)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    data = _to(batch() if callable(batch) else batch, device)
    check_batch(data, loss_fn)
    return (data, None) if loss_fn is None else data


def check_batch(batch: Any, loss_fn: Any) -> None:
    """A one-line error for a batch that cannot go with ``loss_fn`` (an (inputs, targets) pair is needed)."""
    if loss_fn is not None and not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise GradschedError("with a loss_fn the batch must be an (inputs, targets) pair, "
                             f"got {type(batch).__name__}")
