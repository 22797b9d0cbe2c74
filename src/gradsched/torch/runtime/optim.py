"""DistributedOptimizer: any ``torch.optim`` optimizer, stepped per parameter subset when the
plan overlaps the update with the next forward.

With a plan that does not overlap (``overlap_forward = False``) this wrapper only
passes calls through: gradients are averaged when ``backward()`` returns, exactly as
with DDP.  With an overlapping plan (``bytescheduler``, ``usbyte``) ``backward()``
returns while operations are still in flight; :meth:`step` then only records that
an update is due, and the update of each parameter is applied just before the next
forward first reads it, wherever it is read (:mod:`gradsched.torch.runtime.gating`):
the gate waits for the operations holding the parameters of the module that owns
it, then steps the optimizer over those parameters and every other parameter whose
operations have completed by then, in one call (one ``step()`` per completed
operation at most, not one per layer: a pass over a few hundred layers cost a
``torch.optim`` call each).  Whatever the forward did not touch is updated when the wrapped
forward returns.  ``zero_grad()`` after ``step()`` is deferred the same way.

Stepping a subset: ``torch.optim`` optimizers keep per-parameter state and step
through ``param_groups``, so a call with groups that hold only the subset updates
exactly the subset, with the same arithmetic as one full step.  The
hyper-parameters (``lr`` ...) in force when :meth:`step` was called are restored for
the deferred updates, so an LR scheduler stepped right after ``step()`` acts on the
next iteration, as it would without deferral.  ``step(closure)`` works with every plan
(LBFGS, which calls its closure several times, only without overlap).

Reading or changing gradients between ``backward()`` and ``step()`` (clipping,
``GradScaler``, logging) is correct with every plan: a gradient still being reduced
waits at its first touch (:mod:`gradsched.torch.runtime.inflight`), which gives up the
overlap of that step.  ``clip_grad_norm=`` clips inside the deferred update instead,
after the last operation completes, so communication still overlaps whatever runs
between ``step()`` and the next forward (docs/runtime.md, "Between backward() and
step()").

Build LR schedulers on the inner optimizer: ``StepLR(dist_opt.optimizer, ...)`` (or use a plain
optimizer without this wrapper: the gradients are then final when ``backward()`` returns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gradsched.errors import GradschedError
from gradsched.options import Option, check_all
from gradsched.torch.runtime.inflight import clear_applied
from gradsched.torch.runtime.sharded import ShardedOptimizer
from gradsched.torch.runtime.trace import UPDATE, WAIT

if TYPE_CHECKING:
    from gradsched.torch.runtime.link import ModelLink
    from gradsched.torch.runtime.wrapper import DistributedDataParallel


CLIP_GRAD_NORM = Option("clip_grad_norm", float, None, low=0, low_open=True, optional=True,
                        doc="clip the global norm of the gradients to this before every update (None: no clipping)")
NORM_TYPE = Option("norm_type", float, 2.0, low=0, low_open=True, allow_inf=True,
                   doc="the norm clip_grad_norm bounds", why="2.0, or inf for the largest element")
OPTIONS = (CLIP_GRAD_NORM, NORM_TYPE)


class DistributedOptimizer:
    """Wraps ``optimizer`` (built over ``model.parameters()``) for ``model``."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: "DistributedDataParallel", *,
                 clip_grad_norm: float | None = None, norm_type: float = 2.0) -> None:
        """``clip_grad_norm``: clip the global norm (``norm_type``) of the optimizer's gradients to this
        before every update, as ``torch.nn.utils.clip_grad_norm_`` between backward and step would."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise GradschedError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        clip = check_all("DistributedOptimizer", OPTIONS, {"clip_grad_norm": clip_grad_norm, "norm_type": norm_type})
        link: ModelLink | None = getattr(model, "link", None)
        if link is None:
            raise GradschedError(f"expected a gradsched.torch.DistributedDataParallel, got {type(model).__name__}")
        self._link = link
        self.clip_grad_norm: float | None = clip["clip_grad_norm"]
        self.norm_type: float = clip["norm_type"]
        self.last_grad_norm: torch.Tensor | None = None  # the total norm before clipping, of the last update
        self._clip_due = False
        self._pending: set[int] = set()
        self._hparams: list[dict[str, Any]] = []
        self._zero: bool | None = None  # deferred zero_grad(set_to_none=...)
        self._where: dict[int, tuple[int, int]] = {}  # see _positions
        self._where_key: tuple[tuple[int, int], ...] | None = None
        self.optimizer = link.attach_optimizer(self, optimizer)  # sharded under shard_optimizer=True

    @property
    def on_arrival(self) -> Any:
        """The per-chunk update LaySA's sparse results apply as they arrive, or None to keep them as ``.grad``
        (clipping needs every result first)."""
        return None if self.clip_grad_norm is not None else self._step_subset

    # ------------------------------------------------------------- torch.optim surface
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    def step(self, closure: Any = None) -> Any:
        """One update; with ``closure`` (forward and backward, returns the loss), as ``torch.optim``.

        The closure runs first, here, and then the step as without one: the plan that its
        backward ran under decides (run-time ``auto`` may switch plans at that forward).
        LBFGS, which calls its closure several times per step, gets it passed through,
        under non-overlapping plans only."""
        if closure is not None and not isinstance(self.optimizer, torch.optim.LBFGS):
            with torch.enable_grad():
                loss = closure()
            self.step()
            return loss
        clear_applied(self._stepped_params())  # LaySA's results already applied: None, as the optimizer expects
        link = self._link
        if not link.overlaps_forward or not link.backward_outstanding():
            # nothing in flight to defer for (e.g. step() before the first backward): torch.optim's step as it is
            tracer = link.step_tracer
            t0 = tracer.now() if tracer is not None else 0.0
            self._clip()
            out = self.optimizer.step() if closure is None else self.optimizer.step(closure)
            if tracer is not None:
                tracer.span("update", UPDATE, t0, tensors=list(range(len(link.params))))
            return out
        if closure is not None:
            raise GradschedError(f"LBFGS evaluates its closure several times per step, which plan "
                                 f"{link.strategy!r} (overlapping the update with the next forward) cannot "
                                 "defer; use a non-overlapping plan (wfbp, mgwfbp, optimal, ...)")
        self.flush()  # a second step() without a forward in between: finish the first
        self._pending = set(range(len(link.params)))
        self._hparams = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self._zero = None
        self._clip_due = self.clip_grad_norm is not None
        self.optimizer._opt_called = True  # for LR schedulers' "step() before optimizer.step()" check
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._pending:
            self._zero = set_to_none
            return
        self._link.finish_unstepped()  # results still in flight would land in the zeroed .grad
        clear_applied(self._stepped_params())
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flush()
        self.optimizer.load_state_dict(state)

    def add_param_group(self, group: dict[str, Any]) -> None:
        self.flush()
        self.optimizer.add_param_group(group)

    # ------------------------------------------------------------- deferred updates
    @property
    def pending(self) -> bool:
        """Updates deferred, or (sharded) updated parameters still being gathered."""
        return bool(self._pending) or (self._sharded and self.optimizer.gathering)

    def is_due(self, tensor: int) -> bool:
        """Whether plan tensor ``tensor``'s update is deferred and not yet applied."""
        return tensor in self._pending

    @property
    def _sharded(self) -> bool:
        """Sharded over a decoupled plan (:class:`~gradsched.torch.runtime.sharded.ShardedOptimizer`)?"""
        return isinstance(self.optimizer, ShardedOptimizer)

    def flush(self) -> None:
        """Apply every deferred update now (before saving, evaluating or stopping)."""
        if self._pending:
            self.apply(sorted(self._pending))
        if self._sharded:
            self.optimizer.wait_all()

    def gathered_state_dict(self) -> dict[str, Any]:
        """The whole optimizer state in ``torch.optim``'s format: under ``shard_optimizer`` gathered from every
        rank (a collective: call it on all ranks); else :meth:`state_dict`.  :meth:`load_state_dict` takes
        it back, sharded or not."""
        self.flush()
        if self._sharded:
            return self.optimizer.gathered_state_dict()
        if type(self.optimizer).__name__ == "ZeroRedundancyOptimizer":
            raise GradschedError("this sharded optimizer is PyTorch's ZeroRedundancyOptimizer (a plan without "
                                 "reduce-scatters): gather its state with optimizer.consolidate_state_dict(to=0)")
        return self.optimizer.state_dict()

    def apply(self, tensors: list[int]) -> None:
        """Wait for ``tensors``' gradients, then update them (plan indices), and in the same ``step()`` every
        other deferred update whose gradients are already complete (:meth:`Executor.settle_done
        <gradsched.torch.runtime.executor.Executor.settle_done>`)."""
        if self._sharded and not self._pending:  # the gate before a layer: its parameters' all-gathers
            self.optimizer.wait_params(tensors)
            return
        todo = [i for i in tensors if i in self._pending]
        if not todo:
            return
        link = self._link
        tracer = link.tracer
        t0 = tracer.now() if tracer is not None else 0.0
        if self._clip_due:
            link.settle_all()  # the global norm needs every reduced gradient
            self._clip_due = False
            self._clip()
        else:
            link.settle(todo)
        # with them, every other pending tensor whose operations are complete by now (updating before the first
        # read is always safe): one step() per completed operation at most, not one per layer
        done = [i for i in link.settle_done() if i in self._pending]
        if done:
            todo = sorted(set(todo).union(done))
        if tracer is not None:
            t1 = tracer.now()
            if t1 - t0 > 1e-6:
                tracer.add(f"wait {link.names[todo[0]]}", WAIT, "compute", t0, t1, tensors=todo)
            t0 = t1
        params = [link.params[i] for i in todo]
        self._step_subset(params)
        if self._zero is not None:
            for p in params:
                if p.grad is None:
                    continue
                if self._zero:
                    p.grad = None
                else:
                    p.grad.zero_()
        self._pending.difference_update(todo)
        if not self._pending:
            self._zero = None
            self._hparams = []
        if tracer is not None:
            tracer.span(f"update {link.names[todo[0]]}", UPDATE, t0, tensors=todo)

    def _stepped_params(self) -> list[torch.nn.Parameter]:
        if self._sharded:  # its groups hold this rank's pieces
            return list(self.optimizer.model_params)
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _clip(self) -> None:
        if self.clip_grad_norm is None:
            return
        if self._sharded:  # the global norm of the reduced shards
            self.last_grad_norm = self.optimizer.clip_grad_norm_(self.clip_grad_norm, self.norm_type)
            return
        params = [p for p in self._stepped_params() if p.grad is not None]
        self.last_grad_norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm, self.norm_type)

    def _positions(self, own: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
        """``id(param)`` -> (group index, position in the group) of the wrapped optimizer's parameters.

        Kept between calls while the groups are the same lists of the same lengths (``add_param_group``
        or ``load_state_dict`` make new ones): an overlapping plan's deferred updates step a subset up to
        once per completed operation, and rebuilding this at each went over every parameter each time
        (with one call per layer, Inception-v4 replayed on 8 ranks of 2 cores: 299 layers x 449 tensors,
        about 20 ms of a step's CPU per rank)."""
        key = tuple((id(g["params"]), len(g["params"])) for g in own)
        if self._where_key != key:
            self._where = {id(p): (k, j) for k, g in enumerate(own) for j, p in enumerate(g["params"])}
            self._where_key = key
        return self._where

    def _find(self, own: list[dict[str, Any]], params: list[torch.nn.Parameter]) -> list[tuple[int, int]]:
        """(group, position) of each of ``params`` the optimizer holds, in the groups' order; a stale
        map (a group's list edited in place) is rebuilt, so the subset is always the groups' own."""
        where = self._positions(own)
        found = [where.get(id(p)) for p in params]
        if not all(f is not None and own[f[0]]["params"][f[1]] is p for f, p in zip(found, params)):
            self._where_key = None  # stale, or a parameter the optimizer does not hold (as before: skipped)
            where = self._positions(own)
            found = [where.get(id(p)) for p in params]
        return sorted({f for f in found if f is not None})  # a tensor listed twice (tied weights) steps once

    def _step_subset(self, params: list[torch.nn.Parameter]) -> None:
        """One ``step()`` of the wrapped optimizer over ``params`` alone, with the hyper-parameters
        in force at :meth:`step`.

        The optimizer steps through groups that hold only the subset (each a copy of its
        group, snapshot hyper-parameters on top), put in place of its own for the call:
        the arithmetic and the per-parameter state are those of a full step, and its cost
        is the subset's.  Hiding every other gradient for a full step instead cost a pass
        over every parameter per layer: on ``cnn`` (25 layers, SGD with momentum, one
        thread) the per-layer updates of a step took 2.2 ms that way and take 1.4 ms
        this way, against 0.6 ms for one fused step (what remains is ``step()``'s own
        cost per call)."""
        own = self.optimizer.param_groups
        # the deferred step's snapshot (cleared once applied); LaySA's updates on arrival step as the groups are
        snaps = self._hparams or [{}] * len(own)
        picked: dict[int, list[torch.nn.Parameter]] = {}
        for k, j in self._find(own, params):
            picked.setdefault(k, []).append(own[k]["params"][j])
        groups = [{**own[k], **snaps[k], "params": mine} for k, mine in picked.items()]
        if not groups:
            return
        self.optimizer.param_groups = groups
        try:
            self.optimizer.step()
        finally:
            self.optimizer.param_groups = own
