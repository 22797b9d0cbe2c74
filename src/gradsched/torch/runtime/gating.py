"""Deferred updates applied before each parameter's first use in the next forward, wherever it is read.

With an overlapping plan and a :class:`~gradsched.torch.runtime.optim.DistributedOptimizer`,
``step()`` only records that an update is due; each parameter is updated (in place)
just before the next forward first reads it.  An update after the first read would
change a tensor autograd saved for backward ("modified by an inplace operation"), so
"first read" must be exact for any module structure:

* a **forward pre-hook** on every module that owns parameters applies the update of
  that module's own parameters when it is called (the common case, and a forward of
  a submodule called without the wrapper);
* while updates are pending, the wrapped forward runs under :class:`FirstUse`, a
  ``TorchFunctionMode``: every torch function or tensor method that receives a
  parameter with a pending update (or a tensor attribute aliasing one, found at wrap
  time) applies its update first.  This covers parameters read outside their own
  module's ``forward``: ``nn.MultiheadAttention``'s ``out_proj.weight`` (read by
  ``F.multi_head_attention_forward``, so ``nn.Transformer*``), a parent reading a
  child's parameter, tied weights, a parameter used twice.

Updating earlier than the first read is always safe (nothing of the new forward has
been saved for it yet), so each trigger applies its owning module's whole group, as
the pre-hook would: the same number of optimizer calls as per-module gating.  The
mode costs one Python call per torch operation of a forward that has pending
updates, and nothing once they are applied (it returns at once) or on a forward
without pending updates (it is not entered).

Not seen by either: a parameter's memory read without a torch function (a C++
extension given ``data_ptr()``), or through a view made before the forward that is
held somewhere other than a module attribute.  docs/runtime.md lists them.  The
second is caught: the first forward with pending updates also checks each operation's
tensors against the parameters' memory, and at a read of a parameter whose update is
still due every deferred update is applied before the read runs, and from then on before
each forward (one warning names the parameter and the remedy): the plan runs correctly
without its overlap, instead of training on stale weights, and run-time ``auto`` then
measures it as it is.  The advisor asks
the same question before a plan is recommended
(:func:`gradsched.torch.measure.outside_reads.unseen_reads`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.overrides import _get_current_function_mode as _current_mode
from torch.overrides import _pop_mode, _push_mode
from torch.utils._pytree import tree_flatten

from gradsched.torch.runtime.link import UpdateLink

log = logging.getLogger(__name__)

# The attached optimizer: ``pending``, ``is_due(i)``, ``apply(list)``, ``flush()``.
Optimizer = UpdateLink


class ForwardGate:
    """The gating of one executor's plan: pre-hooks now, :meth:`first_use` around each forward."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter], optimizer: Callable[[], Optimizer | None]) -> None:
        """``params``: in plan-index order; ``optimizer()``: the attached DistributedOptimizer or None."""
        self._optimizer = optimizer
        self.applying = False  # the optimizer's own reads of parameters (inside apply) trigger nothing
        self.mode: FirstUse | None = None  # the FirstUse of the forward running now
        index = {id(p): i for i, p in enumerate(params)}
        groups: dict[int, list[int]] = {}  # plan index -> the group its first use applies
        self._hooks: list[Any] = []
        for mod in module.modules():
            own = [index[id(p)] for p in mod.parameters(recurse=False) if id(p) in index]
            if not own:
                continue
            self._hooks.append(mod.register_forward_pre_hook(self._pre_hook(own)))
            for i in own:
                groups.setdefault(i, own)  # a tied parameter: its first owner's group
        self._group_of: dict[int, list[int]] = {id(p): groups[i] for i, p in enumerate(params) if i in groups}
        for p in params:  # owned by no module in this tree (a parameter handed in from outside): itself
            self._group_of.setdefault(id(p), [index[id(p)]])
        for alias, i in _aliases(module, index).items():
            self._group_of[alias] = self._group_of[id(params[i])]
        self._params = params
        self.memory: ParameterMemory | None = None  # made at the checked forward: where the parameters are then
        self._names = {index[id(p)]: n for n, p in module.named_parameters() if id(p) in index}
        self._checks_left = 1  # overlapped forwards still to check for reads the gate cannot see
        self.unseen: str | None = None  # the parameter a read the gate cannot see was found on: no overlap since

    def _pre_hook(self, tensors: list[int]) -> Callable[[nn.Module, Any], None]:
        def hook(_mod: nn.Module, _inputs: Any) -> None:
            opt = self._optimizer()
            if opt is not None and opt.pending:
                self.apply(opt, tensors)

        return hook

    def apply(self, opt: Optimizer, tensors: list[int]) -> None:
        """``opt.apply(tensors)``, outside :class:`FirstUse` (:meth:`_outside_mode`)."""
        if self.applying:
            return
        self.applying = True
        try:
            with self._outside_mode():
                opt.apply(tensors)
        finally:
            self.applying = False

    @contextlib.contextmanager
    def _outside_mode(self) -> Iterator[None]:
        """Leave this gate's :class:`FirstUse` for the duration of an update, where it is the innermost mode
        (a forward pre-hook; inside its own ``__torch_function__`` it is off already): the optimizer's own
        torch operations then cost no Python call each (about 8,500 a step on Inception-v4's 299 layers).
        Only this mode is left: tensor subclasses (DTensor) and other modes dispatch as before, which
        ``DisableTorchFunction`` would not let them.  Under a mode of someone else's, the mode stays on and
        ``applying`` lets every operation through.  Once no update is pending it is not entered again for
        the rest of the forward (the grouped updates usually apply them all at the first layer)."""
        mode = self.mode
        if mode is None or _current_mode() is not mode:
            yield
            return
        _pop_mode()
        try:
            yield
        finally:
            opt = self._optimizer()
            if opt is not None and opt.pending:
                _push_mode(mode)
            else:  # every update applied: the rest of the forward runs without the mode, at no cost
                mode.left = True

    @contextlib.contextmanager
    def first_use(self) -> Iterator[None]:
        """Run a forward with every pending update applied at its parameter's first read."""
        opt = self._optimizer()
        if opt is None or not opt.pending:
            yield
            return
        if self.unseen is not None:  # this model reads a parameter where the gate cannot see: all updates first
            self.flush(opt)
            yield
            return
        check = self._checks_left > 0
        self._checks_left -= check
        if check:
            self.memory = ParameterMemory(self._params)
        mode = FirstUse(self, opt, check)
        outer, self.mode = self.mode, mode
        _push_mode(mode)
        try:
            yield
        finally:
            self.mode = outer
            if not mode.left:
                _pop_mode()

    def stop_checking(self) -> None:
        """No check for reads the gate cannot see (:meth:`unseen_read`) from now on."""
        self._checks_left = 0

    def unseen_read(self, opt: Optimizer, t: torch.Tensor) -> None:
        """Raise if ``t`` (neither a parameter nor a known alias) reads the memory of a parameter still due."""
        due = [i for i in self.memory.overlapping(t) if opt.is_due(i)] if self.memory is not None else []
        if not due:
            return
        self.unseen = self._names.get(due[0], f"parameter {due[0]}")
        log.warning("%s is read through a tensor that shares its memory (a view or alias kept outside the module's "
                    "attributes) before its deferred update: every deferred update is now applied before the "
                    "forward, so this plan no longer overlaps the update with the next forward; for the overlap, "
                    "make the view in the forward or keep it as a module attribute", self.unseen)
        self.flush(opt)  # before the read runs: it sees the updated values, as without the overlap

    def flush(self, opt: Optimizer) -> None:
        """Every deferred update now (``opt.flush()``), during which :class:`FirstUse` lets every operation through."""
        if self.applying:
            return
        self.applying = True
        try:
            with self._outside_mode():
                opt.flush()
        finally:
            self.applying = False

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


class FirstUse(TorchFunctionMode):
    """Applies a parameter's pending update before any torch function reads it.

    ``waiting`` (a copy per forward of the gate's map) loses a tensor's entry at its
    first read: later reads of it cost a dictionary miss, not an optimizer call."""

    def __init__(self, gate: ForwardGate, optimizer: Optimizer, check: bool = False) -> None:
        """``check``: also raise on a read the gate cannot see (:meth:`ForwardGate.unseen_read`)."""
        super().__init__()
        self._gate = gate
        self._opt = optimizer
        self._waiting = dict(gate._group_of)
        self._check = check
        self.left = False  # popped for good once every update was applied (ForwardGate._outside_mode)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._waiting and not self._gate.applying and self._opt.pending:
            self._apply_read(args)
            if kwargs:
                self._apply_read(kwargs.values())
            if self._check:
                for v in tree_flatten((args, kwargs))[0]:
                    if isinstance(v, torch.Tensor) and id(v) not in self._gate._group_of:
                        self._gate.unseen_read(self._opt, v)
        return func(*args, **kwargs)

    def _apply_read(self, values: Any) -> None:
        for v in values:
            if isinstance(v, torch.Tensor):
                self._read(v)
            elif isinstance(v, (list, tuple)):  # torch.cat([...]), foreach lists, a packed weight list
                for w in v:
                    if isinstance(w, torch.Tensor):
                        self._read(w)

    def _read(self, t: torch.Tensor) -> None:
        group = self._waiting.pop(id(t), None)
        if group is not None:
            self._gate.apply(self._opt, group)


class ParameterMemory:
    """Which parameters' elements a tensor reads: by storage and byte range, so that parameters that are
    views of one flat buffer are told apart."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self._ranges: dict[int, list[tuple[int, int, int]]] = {}  # storage address -> (start, end, index)
        for i, p in enumerate(params):
            span = _span(p)
            if span is not None:
                self._ranges.setdefault(span[0], []).append((span[1], span[2], i))

    def overlapping(self, t: torch.Tensor) -> list[int]:
        """Indices (into ``params``) of the parameters whose memory ``t`` reads."""
        span = _span(t) if self._ranges else None
        if span is None:
            return []
        ptr, start, end = span
        return [i for s, e, i in self._ranges.get(ptr, ()) if s < end and start < e]


def _span(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, one past the last byte) that ``t`` can read; None without memory."""
    if t.numel() == 0 or t.device.type == "meta" or t.is_nested or t.is_sparse:
        return None
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # a tensor subclass without storage (fake, functional)
        return None
    size = t.element_size()
    start = t.storage_offset() * size
    last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return ptr, start, start + (last + 1) * size


def _aliases(module: nn.Module, index: dict[int, int]) -> dict[int, int]:
    """Tensor attributes of modules (not parameters or buffers) that share a parameter's memory:
    ``id(tensor)`` -> plan index (a view kept at construction, e.g. ``self.w_t = self.weight.t()``)."""
    by_storage: dict[int, int] = {}
    for mod in module.modules():
        for p in mod.parameters(recurse=False):
            if id(p) in index and p.numel() > 0 and p.device.type != "meta":
                by_storage[p.untyped_storage().data_ptr()] = index[id(p)]
    out: dict[int, int] = {}
    if not by_storage:
        return out
    for mod in module.modules():
        for value in vars(mod).values():
            if (isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and id(value) not in index
                    and value.numel() > 0 and value.device.type != "meta"):
                i = by_storage.get(value.untyped_storage().data_ptr())
                if i is not None:
                    out[id(value)] = i
    return out
