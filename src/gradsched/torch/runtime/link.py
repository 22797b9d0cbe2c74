"""The wrapper's interface to the objects that work beside it: :class:`ModelLink` and :class:`UpdateLink`.

:class:`~gradsched.torch.runtime.wrapper.DistributedDataParallel` owns the executor, the parameters in
plan order, the tracer and PyTorch's DDP where that runs.  The objects that work beside it reach these
through ``model.link`` (a :class:`ModelLink`) and nothing else of its state: the
:class:`~gradsched.torch.DistributedOptimizer`, the end-of-backward guard
(:func:`gradsched.torch.runtime.inflight.on_backward_end`) and the Lightning strategy
(:mod:`gradsched.integrations.lightning`).  In the other direction, the wrapper and its forward gate
(:mod:`gradsched.torch.runtime.gating`) see the attached optimizer as an :class:`UpdateLink`.  The
sharded optimizer (:mod:`gradsched.torch.runtime.sharded`) is built by the wrapper from the executor's
public surface and sees neither.

Like PyTorch DDP's communication hooks (a ``GradBucket`` with a few documented methods), each side
is a short list of members, typed here; tests/test_interfaces.py fails where another module reads a
private attribute of the wrapper or of the optimizer.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
from torch import nn

from gradsched.torch.runtime.trace import Tracer


class UpdateLink(Protocol):
    """The attached optimizer (:class:`~gradsched.torch.DistributedOptimizer`) as the wrapper and its
    forward gate see it: deferred updates, applied by plan index."""

    @property
    def pending(self) -> bool:
        """Updates deferred by ``step()`` (or, sharded, updated parameters still being gathered)."""

    @property
    def on_arrival(self) -> Callable[[list[nn.Parameter]], None] | None:
        """The update top-k results apply as they arrive (sparse memory ``laysa``), or None."""

    def is_due(self, tensor: int) -> bool:
        """Whether plan tensor ``tensor``'s update is deferred and not yet applied."""

    def apply(self, tensors: list[int]) -> None:
        """Wait for plan tensors ``tensors``' gradients, then apply their deferred updates."""

    def flush(self) -> None:
        """Apply every deferred update now."""


class ModelLink(Protocol):
    """The wrapper as its optimizer, the in-flight guard and integrations see it (``model.link``).

    Parameters are indexed by plan index (the profile's order), as the plan's operations are."""

    @property
    def params(self) -> Sequence[nn.Parameter]:
        """The trainable parameters, in plan-index order."""

    @property
    def names(self) -> Sequence[str]:
        """Their names, in the same order."""

    @property
    def strategy(self) -> str:
        """The running plan's strategy name (``"auto"`` under run-time auto)."""

    @property
    def overlaps_forward(self) -> bool:
        """Whether ``step()`` defers updates to the next forward (an overlapping plan, not sharded)."""

    @property
    def tracer(self) -> Tracer | None:
        """Where waits and deferred updates are recorded (None: not traced)."""

    @property
    def step_tracer(self) -> Tracer | None:
        """Where an undeferred ``step()`` is recorded (None also once run-time auto settled on PyTorch's DDP)."""

    @property
    def optimizer(self) -> UpdateLink | None:
        """The attached optimizer, if any."""

    @property
    def torch_ddp(self) -> nn.Module | None:
        """PyTorch's DDP where it runs (``plan="ddp"``, or run-time auto's candidate), for its comm hooks."""

    def attach_optimizer(self, optimizer: UpdateLink, inner: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Attach ``optimizer`` (one per model), which wraps ``inner``; return what it should step: ``inner``,
        or its sharded form under ``shard_optimizer=True``."""

    def backward_outstanding(self) -> bool:
        """Whether a backward ran on the executor since its start or the last plan switch."""

    def settle(self, tensors: list[int]) -> None:
        """Wait for plan tensors ``tensors``' operations and write their results into ``.grad``."""

    def settle_all(self) -> None:
        """Wait for every operation and write every result into ``.grad``."""

    def settle_done(self) -> list[int]:
        """Without waiting: write the results of the operations already complete into ``.grad``; return the
        plan tensors whose results were written since the last call (or since the backward began)."""

    def finish_unstepped(self) -> None:
        """Finish a backward that no ``step()`` followed (before gradients are zeroed or accumulated)."""

