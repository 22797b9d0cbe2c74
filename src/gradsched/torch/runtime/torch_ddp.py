"""PyTorch's own DDP as one of run-time ``auto``'s candidates.

``auto`` (:mod:`gradsched.torch.runtime.autotune`) measures plans by running them; to
never lose to what a user could pick by hand, it also runs
``torch.nn.parallel.DistributedDataParallel`` itself, at the user's ``bucket_cap_mb``
(PyTorch's default when not given: 25 MiB after a 1 MiB first bucket), at the size the
advisor predicts fastest (:func:`gradsched.advise.best_ddp_bucket_mb`) and as one
bucket (:func:`one_bucket_mb`): the end of the range where per-operation costs the
simulator does not see (each bucket's copies and launches) count most, as over loopback,
where one bucket measured fastest for cnn, vgg and bert (docs/notes/2026-12-bench-runs.md, "Real compute").

A candidate is a :class:`~gradsched.plan.Plan` like any other, so the tuner's
bookkeeping (plan hashes, predictions, broadcasts) is unchanged: the ``ddp`` planner's
buckets at that size (what the simulator predicts; PyTorch rebuilds its buckets in
ready order after the first iteration, the sizes stay) under the strategy name
:data:`TORCH_DDP`, which tells the wrapper to hand forward and backward to PyTorch's
DDP instead of gradsched's executor.

Switching in and out keeps the numbers: the wrapper switches only at an iteration
boundary decided on every rank alike, after finishing outstanding work; the
parameters are then equal on every rank, so a DDP built mid-training skips its
start-up broadcast (``init_sync=False``); its buffers are broadcast before every
forward as the user's DDP arguments say (DDP's own ``broadcast_buffers``), the same
broadcast the executor's forward makes.  The optimizer is not touched.

A DDP's construction is collective (it checks parameter shapes across ranks) and
allocates its buckets, so :class:`TorchDDPPool` builds one per bucket size and keeps it
for the trials' later windows; while another candidate runs, a kept DDP's autograd
hooks return at once (its reducer expects no gradients unless its own forward ran), and
the tuner drops the ones not running once the trials are decided.  With
``gradient_as_bucket_view=True`` a kept DDP's buckets hold no memory while another plan
runs (:meth:`TorchDDPPool.park`): each DDP's bucket storages are seen behind ``.grad`` at
the end of a backward, shrunk to nothing when the plan switches away and grown back
(contents undefined: its next backward overwrites them) when it runs again, so that the
trials hold one set of buckets at a time, not one per DDP kept (googlenet-k80's warm-up
in ``gradsched bench``: 0.87 GB a rank where 0.66 GB was allowed).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from gradsched.advise import DDP_DEFAULT_FIRST_MB, ddp_plan
from gradsched.cluster import Cluster
from gradsched.constants import MiB
from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.tuning.candidates import CANDIDATE_SIZES, TORCH_DDP, is_torch_ddp

# the candidates' names live in the torch-free core (gradsched.tuning.candidates); they stay importable here
__all__ = ["CANDIDATE_SIZES", "TORCH_DDP", "TorchDDPPool", "after_backward", "candidate_plan", "is_torch_ddp",
           "one_bucket_mb", "reduce_every_backward"]



def candidate_plan(profile: Profile, cluster: Cluster, bucket_cap_mb: float, *, default: bool = False) -> Plan:
    """PyTorch's DDP at ``bucket_cap_mb`` as a plan: :func:`gradsched.advise.ddp_plan`'s buckets, named
    :data:`TORCH_DDP`.  ``default``: DDP built without ``bucket_cap_mb`` (its first bucket
    :data:`~gradsched.advise.DDP_DEFAULT_FIRST_MB`); otherwise the cap is given, and caps the first bucket too."""
    cap = float(bucket_cap_mb)
    plan = ddp_plan(profile, cluster, cap, DDP_DEFAULT_FIRST_MB if default else None)
    return replace(plan, strategy=TORCH_DDP, options={"bucket_cap_mb": cap, "default": default})


def one_bucket_mb(profile: Profile) -> float:
    """A ``bucket_cap_mb`` that puts every gradient of ``profile`` in one bucket (whole MiB)."""
    return float(max(1, -(-profile.total_bytes // MiB)))


class TorchDDPPool:
    """PyTorch DDP wrappers of one module, one per bucket size, built when first asked for.

    ``kwargs``: the user's DDP arguments (``device_ids``, ``static_graph`` ...), given to every
    DDP built here; ``bucket_cap_mb`` is each one's own; ``sync_buffers``: rank 0's buffers
    before every forward (DDP's ``broadcast_buffers``, as the wrapper read it)."""

    def __init__(self, module: nn.Module, group: Any, kwargs: dict[str, Any], find_unused_parameters: bool,
                 sync_buffers: bool) -> None:
        self._module = module
        self._group = group
        # bucket_cap_mb is each one's own; sync_buffers is what broadcast_buffers / forward_sync_buffers said
        self._kwargs = {k: v for k, v in kwargs.items() if k not in (
            "device_mesh", "bucket_cap_mb", "init_sync", "broadcast_buffers", "forward_sync_buffers")}
        self._kwargs["forward_sync_buffers"] = sync_buffers
        self._find_unused = find_unused_parameters
        self._built: dict[float, nn.Module] = {}
        self.constructions = 0  # DDPs built so far (a test checks that windows reuse them)
        # gradient_as_bucket_view: .grad shows each DDP's buckets, which park() releases while another plan runs
        self._bucket_view = bool(kwargs.get("gradient_as_bucket_view", False))
        self._buckets: dict[float, tuple[bool, list[torch.UntypedStorage]]] = {}  # per DDP: rebuilt?, its buckets
        self._parked: dict[float, list[tuple[torch.UntypedStorage, int]]] = {}  # per DDP: released buckets, bytes

    def get(self, bucket_cap_mb: float, default: bool = False) -> nn.Module:
        """The DDP at ``bucket_cap_mb`` (built now, collectively, if it is not kept): call on every rank alike.

        ``default``: built as the user's own ``DistributedDataParallel(model)`` is, without a
        ``bucket_cap_mb`` (:func:`candidate_plan`)."""
        cap = float(bucket_cap_mb)
        if cap not in self._built:
            from torch.nn.parallel import DistributedDataParallel as TorchDDP

            # the parameters are equal on every rank (a switch happens after a finished step): no start-up copy
            self._built[cap] = TorchDDP(self._module, process_group=self._group, bucket_cap_mb=None if default else cap,
                                        init_sync=False, find_unused_parameters=self._find_unused, **self._kwargs)
            self.constructions += 1
        for storage, nbytes in self._parked.pop(cap, []):  # its buckets back before it runs
            storage.resize_(nbytes)
        return self._built[cap]

    def release(self, keep: float | None = None) -> None:
        """Drop every DDP but the one at ``keep`` (its reducer's hooks and buckets go with it)."""
        self._built = {cap: ddp for cap, ddp in self._built.items() if cap == keep}
        self._buckets = {cap: seen for cap, seen in self._buckets.items() if cap == keep}
        self._parked = {cap: parked for cap, parked in self._parked.items() if cap == keep}

    def wants_buckets(self, bucket_cap_mb: float) -> bool:
        """Whether the DDP at ``bucket_cap_mb`` has buckets :meth:`note_buckets` has not seen yet: none seen, or
        seen before DDP rebuilt them in ready order (its second iteration).  Never without
        ``gradient_as_bucket_view`` (``.grad`` then is a copy, not the buckets)."""
        ddp = self._built.get(float(bucket_cap_mb))
        if not self._bucket_view or ddp is None:
            return False
        seen = self._buckets.get(float(bucket_cap_mb))
        return seen is None or (not seen[0] and bool(getattr(ddp, "_has_rebuilt_buckets", False)))

    def note_buckets(self, bucket_cap_mb: float, params: list[nn.Parameter]) -> None:
        """At the end of a backward of the DDP at ``bucket_cap_mb``: its buckets are the storages behind
        ``params``' ``.grad`` (views of them, ``gradient_as_bucket_view``)."""
        cap = float(bucket_cap_mb)
        ddp = self._built.get(cap)
        if ddp is None:
            return
        storages: dict[int, torch.UntypedStorage] = {}
        for p in params:
            g = p.grad
            if g is not None and g.layout == torch.strided:
                storage = g.untyped_storage()
                storages.setdefault(storage.data_ptr(), storage)
        self._buckets[cap] = (bool(getattr(ddp, "_has_rebuilt_buckets", False)), list(storages.values()))

    @contextlib.contextmanager
    def rebuilding(self, bucket_cap_mb: float, params: list[nn.Parameter]) -> Iterator[None]:
        """Around a forward of the DDP at ``bucket_cap_mb``: where DDP may rebuild its buckets in ready order
        there (once, early on: :meth:`wants_buckets`), the ones it replaces are shrunk to nothing first, so
        that both sets never exist at once; grown back where it did not rebuild (contents undefined: the next
        backward overwrites them).  Not where a ``.grad`` of ``params`` still shows them (:meth:`park`)."""
        cap = float(bucket_cap_mb)
        ddp, seen = self._built.get(cap), self._buckets.get(cap)
        if ddp is None or seen is None or seen[0] or getattr(ddp, "_has_rebuilt_buckets", True):
            yield
            return
        shrunk = _shrink(seen[1], params)
        try:
            yield
        finally:
            if not getattr(ddp, "_has_rebuilt_buckets", False):
                for storage, nbytes in shrunk:
                    storage.resize_(nbytes)

    def park(self, bucket_cap_mb: float, params: list[nn.Parameter]) -> int:
        """The DDP at ``bucket_cap_mb`` stops running (another plan runs next): shrink its buckets to nothing
        until :meth:`get` hands it out again; returns the bytes released.  Not where a ``.grad`` of ``params``
        still shows them (gradients accumulated under ``no_sync``, or zeroed rather than set to None): the next
        backward adds to those."""
        cap = float(bucket_cap_mb)
        seen = self._buckets.pop(cap, None)
        if seen is None or cap in self._parked:
            return 0
        self._parked[cap] = _shrink(seen[1], params)
        return sum(n for _, n in self._parked[cap])

    @property
    def kept_mb(self) -> list[float]:
        return sorted(self._built)


def _shrink(storages: list[torch.UntypedStorage], params: list[nn.Parameter]) -> list[tuple[torch.UntypedStorage, int]]:
    """``storages`` (a DDP's buckets) shrunk to nothing, with the bytes each had; none where a ``.grad`` of
    ``params`` is a view of one of them (its contents are still needed)."""
    live = {p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None and p.grad.layout == torch.strided}
    held = [s for s in storages if s.nbytes() > 0]
    if any(s.data_ptr() in live for s in held):
        return []
    shrunk = [(s, s.nbytes()) for s in held]
    for s in held:
        s.resize_(0)
    return shrunk


def reduce_every_backward(ddp: nn.Module, out: Any, find_unused: bool) -> None:
    """Make PyTorch's DDP average every backward through ``out``'s graph, not only the first.

    DDP arms its reducer in its forward and disarms it when a backward ends, so a second
    backward before the next forward (``l1.backward(retain_graph=True); l2.backward()``)
    leaves that backward's gradients local: ranks drift apart, silently.  Run-time
    ``auto`` runs DDP where the user asked for no DDP semantics, and gradsched's executor
    averages every backward (docs/runtime.md, "several backward() per step"), so auto's
    DDP candidates are made to do the same: a hook on each output's ``grad_fn`` (run
    before anything else of that backward) re-arms the reducer at the start of every
    later backward, as DDP's own forward does (its buckets rebuilt in ready order first,
    if due, then ``prepare_for_backward``: the reducer's own methods, torch pinned).  Outputs are held
    weakly (a strong reference from their own graph would keep it alive).

    Cheap, as it runs on every step of a job that starts on PyTorch's DDP (deferred run-time auto): one
    hook per distinct ``grad_fn`` (one for a tensor output, no pytree walk), and a backward is told from
    the next by autograd's graph-task id (no end-of-backward callback)."""
    if not (torch.is_grad_enabled() and ddp.require_backward_grad_sync):
        return
    if isinstance(out, torch.Tensor):
        tensors = [out] if out.grad_fn is not None else []
    else:
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    if not tensors:
        return
    refs = [weakref.ref(t) for t in tensors] if find_unused else []
    first = [-1, 0]  # graph-task id of the backward that ran first through this graph (-1: none yet), passes

    def before(_grads: Any) -> None:
        task = _current_graph_task_id()
        if first[0] == -1:  # the first backward: DDP's forward armed the reducer for it
            first[0] = task
            return
        if task == first[0] or task == first[1]:  # another output of a backward already seen
            return
        first[1] = task
        if ddp.require_backward_grad_sync:
            _rearm(ddp, refs, find_unused)

    if len(tensors) == 1:
        tensors[0].grad_fn.register_prehook(before)
        return
    seen: set[int] = set()
    for t in tensors:
        fn = t.grad_fn
        if id(fn) not in seen:
            seen.add(id(fn))
            fn.register_prehook(before)


def after_backward(out: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` at the end of the next backward through ``out``'s graph (autograd's final callbacks,
    queued as that backward reaches ``out``: before DDP's own, after every gradient hook)."""
    first = out if isinstance(out, torch.Tensor) else next(
        (t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
    if first is None or first.grad_fn is None:
        return
    first.grad_fn.register_prehook(lambda _grads: torch.autograd.Variable._execution_engine.queue_callback(callback))


_current_graph_task_id = torch._C._current_graph_task_id  # the running backward's id (torch pinned)


def _rearm(ddp: nn.Module, refs: list[weakref.ref[torch.Tensor]], find_unused: bool) -> None:
    """The reducer armed for a later backward through one forward, as DDP's forward arms it."""
    alive = [t for t in (r() for r in refs) if t is not None]
    if find_unused and not alive:
        raise GradschedError("a second backward() through one forward under PyTorch's DDP (run-time auto's "
                             "candidate) with find_unused_parameters=True, after the forward's outputs were "
                             "freed: keep the output alive until the last backward, or sum the losses and "
                             "call backward() once")
    if ddp.reducer._rebuild_buckets():  # as DDP's forward does first (the first iteration's order is in)
        ddp._has_rebuilt_buckets = True
    ddp.reducer.prepare_for_backward(alive)
