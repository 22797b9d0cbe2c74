"""One model's memory per rank, whatever the number of rows a bench runs.

``gradsched bench`` trains many copies of one model on every rank: a row per strategy
and DDP bucket size, the compute-only row, the start-up probes.  Each used to hold its
own parameters, gradients, momentum and runtime buckets (about 4x the parameters'
bytes per row), so memory grew with the rows and an 8-host replay of ResNet-50 or
VGG-16 did not fit.  Here:

- **Parameters are shared.**  :class:`SharedModel` builds the model once; every copy
  (:meth:`SharedModel.copy`) is a module of its own (its own ``nn.Parameter`` objects,
  hence its own ``.grad``, hooks and wrapper) whose parameters *alias* the one set of
  storages.  Values do not matter to the bench (every row's time is the same whatever
  the weights; a replay's gradients are its weights times a number), and the rows take
  turns, so no two write them at once.  Buffers (BatchNorm statistics) are shared too.
- **Momentum is shared.**  Every copy's SGD gets the same momentum buffers
  (:meth:`SharedModel.share_momentum`): one set per rank, updated in place as SGD does.
- **A row's gradient buffers exist only while it runs.**  Between its bursts
  (:class:`RowBuffers`) the storages behind its ``.grad`` (gradsched's arenas, PyTorch
  DDP's buckets with ``gradient_as_bucket_view``, plain gradients) are shrunk to nothing
  and grown back, uninitialised, just before its next burst, off the clock: the burst's
  first step overwrites them (a runtime copies every gradient into its bucket).

So a rank holds the parameters, the momentum and one row's buckets at a time (plus the
gradient autograd hands over, one tensor at a time): about 3x the parameters' bytes
(:data:`gradsched.bench_memory.COPIES`), for any number of rows; as much while the contention
probe samples (its all-gradients buffer, its step's gradients views of it: ``PROBE_COPIES``).
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
from torch import nn

from gradsched.torch.jobs.models import ModelSpec, build_model
from gradsched.torch.runtime.memory import trim_heap  # where it lived first: importable here too


class SharedModel:
    """The one model of a rank; :meth:`copy` makes modules that share its parameters and buffers."""

    def __init__(self, name: str, seed: int) -> None:
        self.spec = build_model(name, seed=seed)
        self._params = list(self.spec.module.parameters())
        self.momentum = [torch.zeros_like(p) for p in self._params]
        self.copies = 0  # modules made so far (for tests and reports)

    def copy(self) -> nn.Module:
        """A module like the model whose parameters alias the model's (new ``nn.Parameter`` objects)."""
        source = self.spec.module
        memo: dict[int, Any] = {id(p): nn.Parameter(p.data, requires_grad=p.requires_grad) for p in self._params}
        memo.update({id(b): b for b in source.buffers()})
        self.copies += 1
        return copy.deepcopy(source, memo)

    def copy_spec(self) -> ModelSpec:
        """:meth:`copy` with the model's batch maker and loss."""
        return ModelSpec(self.spec.name, self.copy(), self.spec.make_batch, self.spec.loss_fn)

    def share_momentum(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """``optimizer`` (an SGD with momentum over ``module``, a :meth:`copy`) with the shared momentum buffers."""
        for p, buf in zip(module.parameters(), self.momentum):
            optimizer.state[p]["momentum_buffer"] = buf
        return optimizer

    def sgd(self, module: nn.Module, lr: float) -> torch.optim.Optimizer:
        """The bench's optimizer (SGD, momentum 0.9) over ``module`` with the shared momentum."""
        return self.share_momentum(torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9), module)

    @property
    def parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self._params)


class RowBuffers:
    """The storages behind one row's gradients, released between its bursts.

    :meth:`release` (after a burst, the row synchronised) drops every ``.grad`` of
    ``module`` and shrinks the storages behind them to nothing: a storage the runtime
    still holds (an arena, a bucket) then holds no memory, and a plain gradient's is
    freed.  :meth:`restore` (before the next burst) grows them back, uninitialised, and
    forgets them, so that those nobody else holds are freed at once."""

    def __init__(self, module: nn.Module, optimizer: Any = None) -> None:
        self.module, self.optimizer = module, optimizer
        self._released: list[tuple[torch.UntypedStorage, int]] = []

    def release(self) -> int:
        """Free the row's gradient storages; returns their bytes."""
        flush = getattr(self.optimizer, "flush", None)
        if flush is not None:  # a deferred update (plans that overlap the next forward) reads .grad: apply it now
            flush()
        seen: set[int] = set()
        for p in self.module.parameters():
            g = p.grad
            p.grad = None
            if g is None:
                continue
            storage = g.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                continue
            seen.add(storage.data_ptr())
            self._released.append((storage, storage.nbytes()))
        for storage, _ in self._released:
            storage.resize_(0)
        trim_heap()
        return sum(n for _, n in self._released)

    def restore(self) -> None:
        """Grow the released storages back (contents undefined: the next backward overwrites them)."""
        for storage, nbytes in self._released:
            storage.resize_(nbytes)
        self._released = []


_ROWS: "weakref.WeakKeyDictionary[Any, RowBuffers]" = weakref.WeakKeyDictionary()


def track(model: Any, module: nn.Module, optimizer: Any = None) -> None:
    """Release ``module``'s gradient storages between the bursts of ``model`` (see :func:`row_buffers`)."""
    _ROWS[model] = RowBuffers(module, optimizer)


def row_buffers(model: Any) -> RowBuffers | None:
    """The :class:`RowBuffers` of a row that :func:`track` registered, or None."""
    return _ROWS.get(model)
