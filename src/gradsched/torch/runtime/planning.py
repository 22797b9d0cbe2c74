"""From a module and a strategy name to a Plan and the order its operations are issued.

Parameter order (the plan's tensor indices): index ``i`` is the ``i``-th parameter of
``module.parameters()`` that requires grad, in registration order (shared parameters
once, as ``parameters()`` yields them).  :func:`trainable_parameters` is the one
place that defines it; the profiler and the runtime both use it.

Issue order: gloo and NCCL match collectives across ranks by the order they are
called, so every rank must issue the plan's operations in one agreed order.  A
``fifo`` plan is issued in list order.  A ``priority`` plan's order is fixed at start-up
by replaying the plan's own rule (lowest priority among the ready operations, within
the credit window) on the profile's ready times with the simulator; at run time an
operation is issued when it is next in that order, its gradients are ready and the
credit window has room.  The order is identical on every rank because it depends
only on the plan, the profile and the cluster, which all ranks check they share.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.profile import Profile, TensorProfile

# A cheap stand-in for a measured profile: backward time proportional to a layer's
# parameter count (about 1 GFLOP/s per parameter-pass), so that planners that look at
# times see the usual shape: big layers take longer.
_EST_S_PER_PARAM = 2e-9
_EST_LAYER_S = 20e-6


def trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every parameter that requires grad, in plan-index order."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def in_profile_order(named: list[tuple[str, nn.Parameter]], profile: Profile) -> list[tuple[str, nn.Parameter]]:
    """``named`` reordered as ``profile`` lists its tensors (plans index tensors in that order).

    A measured profile lists tensors in forward order, which need not be the module's
    registration order (Hugging Face's BERT uses its token-type embedding before the
    position embedding); the names must be the same set."""
    by_name = dict(named)
    names = [t.name for t in profile.tensors]
    if sorted(names) != sorted(by_name):
        missing = sorted(set(by_name) - set(names))[:3]
        extra = sorted(set(names) - set(by_name))[:3]
        raise GradschedError(f"the profile (model {profile.model!r}) does not describe this module's trainable "
                             f"parameters (not in the profile: {missing}; not in the module: {extra}); profile "
                             "this module")
    return [(n, by_name[n]) for n in names]


def profile_from_module(module: nn.Module, model: str = "", order: list[str] | None = None) -> Profile:
    """A Profile estimated from parameter shapes alone (no timing runs).

    Sizes are exact; each module that owns parameters is one layer, ready in reverse
    registration order; times are a rough estimate.  Use a measured profile
    (``gradsched profile``) where the plan's quality matters.  ``order``: the tensors'
    names in the order to list them (default: registration order)."""
    owner: dict[int, int] = {}
    for layer_id, (_, mod) in enumerate(module.named_modules()):
        for p in mod.parameters(recurse=False):
            owner.setdefault(id(p), layer_id)
    params = trainable_parameters(module)
    if order is not None:
        by_name = dict(params)
        params = [(n, by_name[n]) for n in order]
    if not params:
        raise GradschedError("the module has no parameter that requires grad: nothing to synchronise")
    layer_numel: dict[int, int] = {}
    for _, p in params:
        layer_numel[owner[id(p)]] = layer_numel.get(owner[id(p)], 0) + p.numel()
    seen: set[int] = set()
    tensors = []
    for name, p in params:
        lid = owner[id(p)]
        first = lid not in seen
        seen.add(lid)
        t_s = _EST_LAYER_S + _EST_S_PER_PARAM * layer_numel[lid] if first else 0.0
        tensors.append(TensorProfile(name, p.numel(), p.numel() * p.element_size(), t_s / 2 if first else 0.0,
                                     t_s, layer=lid))
    return Profile(model or type(module).__name__, tuple(tensors))


def default_cluster(world_size: int) -> Cluster:
    """Loopback-like costs, used only when the caller gives no measured cluster."""
    return Cluster.alpha_beta(1e-4, 1e-9, world_size)


def resolve_plan(plan: str | Plan, profile: Profile, cluster: Cluster, options: dict[str, Any] | None = None) -> Plan:
    """A Plan from a strategy name or a Plan, checked element for element against ``profile``."""
    if isinstance(plan, str):
        from gradsched.planners import make_plan

        plan = make_plan(plan, profile, cluster, **(options or {}))
    elif options:
        raise GradschedError("plan options apply to a strategy name, not to a ready Plan")
    if not isinstance(plan, Plan):
        raise GradschedError(f"plan must be a strategy name or a gradsched.Plan, got {type(plan).__name__}")
    plan.check(profile, f"plan {plan.strategy!r}")
    return plan


def issue_order(plan: Plan, profile: Profile, cluster: Cluster) -> list[int]:
    """The order in which every rank issues the plan's operations (module docstring)."""
    n = len(plan.operations)
    if plan.scheduling == "fifo":
        return list(range(n))
    from gradsched.sim import simulate

    start = simulate(plan, profile, cluster, timeline=False).op_start_s
    return sorted(range(n), key=lambda j: (start[j], plan.operations[j].priority, j))


def dtype_key(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
