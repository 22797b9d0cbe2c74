"""PyTorch DDP's constructor arguments, read with DDP's meaning for gradsched's wrapper.

``gradsched.torch.DistributedDataParallel(module, device_ids=[rank], ...)`` accepts what
``torch.nn.parallel.DistributedDataParallel`` accepts, so a script changes only its
import.  :func:`resolve` turns the arguments into :class:`DDPArgs`; what gradsched
cannot honour raises a :class:`~gradsched.errors.GradschedError` that says so.

When no plan is named the wrapper runs :data:`DEFAULT_STRATEGY`: run-time ``auto``
(docs/autotune.md) with PyTorch's own DDP among its candidates, at the user's
``bucket_cap_mb`` (PyTorch's default if not given), at the advised size and as one
bucket, and DDP kept unless a plan measured at least ``min_gain`` (3%) faster in
interleaved trials, and no re-plans after
them (``max_replans=0``: the winner stays, measured).  It starts on PyTorch's DDP at the
user's bucket size and profiles on DDP's bucket rule run by gradsched's executor
(:data:`DEFAULT_OPTIONS`: traced, to profile the model in place) only once the trials'
budget pays for it (:mod:`gradsched.tuning.schedule`: a short job runs DDP throughout).
After the trials it runs DDP or something measured faster; what profiling and the trials
cost stays within about ``trial_share`` (1%) of the time trained.  The earlier default, DDP's
buckets on the executor alone, ran 0.93x PyTorch DDP's time on a quiet machine but 1.08-1.12x
under load (``benchmarks/results/dropin_default_cnn.json``, docs/runtime.md); the default's own figures are in docs/autotune.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gradsched.errors import GradschedError
from gradsched.options import check
from gradsched.planners.ddp import BUCKET_CAP_MB

DEFAULT_STRATEGY = "auto"  # run-time auto, PyTorch's DDP among its candidates (module docstring)
# Profile under DDP's bucket rule on the executor; keep the trials' winner (no re-plans after them: a re-plan
# runs a plan nobody measured, and on cnn at load 5 two of them ended 1.25x DDP's time, dropin_default.py)
DEFAULT_OPTIONS: dict[str, Any] = {"initial": "ddp", "max_replans": 0}

# DDP arguments that gradsched has no counterpart for: accepted only at their defaults.
_UNSUPPORTED = {"delay_all_reduce_named_params": None, "param_to_hook_all_reduce": None, "mixed_precision": None,
                "skip_all_reduce_unused_params": False, "bucket_cap_mb_list": None}
# Every DDP argument beside module, process_group, find_unused_parameters and broadcast_buffers, at DDP's default.
# dim and output_device only matter for multi-device modules (DDP no longer replicates); check_reduction
# is a no-op in DDP; gradient_as_bucket_view and batched_grad_copy change memory, not results (gradsched
# makes .grad a view of its buckets wherever the plan allows).
DDP_DEFAULTS: dict[str, Any] = {"device_ids": None, "output_device": None, "dim": 0, "init_sync": True,
                                "bucket_cap_mb": None, "check_reduction": False, "gradient_as_bucket_view": False,
                                "static_graph": False, "device_mesh": None, "forward_sync_buffers": None,
                                "batched_grad_copy": False, **_UNSUPPORTED}


@dataclass(frozen=True, slots=True, kw_only=True)
class DDPArgs:
    """DDP's arguments as the wrapper uses them."""

    group: Any  # the data-parallel process group (process_group, device_mesh's, or the world)
    input_device: torch.device | None  # device_ids[0]: forward's inputs are moved there, as DDP does
    find_unused: bool  # find_unused_parameters, or static_graph (DDP then tolerates unused parameters)
    forward_sync_buffers: bool  # broadcast rank 0's buffers before every forward
    init_sync: bool  # copy rank 0's parameters (and buffers) at start-up
    init_sync_buffers: bool  # DDP's broadcast_buffers=False also leaves buffers out of the start-up copy
    bucket_cap_mb: float | None
    torch_ddp_kwargs: dict[str, Any] = field(default_factory=dict)  # what plan="ddp" hands to PyTorch's DDP


def split_positional(plan: Any, device_ids: Any) -> tuple[Any, Any]:
    """DDP's second positional argument is ``device_ids``: ``DDP(model, [rank])`` keeps working."""
    if isinstance(plan, (list, tuple)):
        if device_ids is not None:
            raise GradschedError("device_ids given twice (as the second argument and by name); give it once")
        return None, list(plan)
    return plan, device_ids


def resolve(module: nn.Module, ddp: dict[str, Any], *, process_group: Any, find_unused_parameters: bool,
            broadcast_buffers: bool | None) -> DDPArgs:
    """Check and normalise DDP's arguments (``ddp``: the ones given beside the three named here)."""
    unknown = sorted(set(ddp) - set(DDP_DEFAULTS))
    if unknown:
        raise TypeError(f"DistributedDataParallel() got an unexpected keyword argument {unknown[0]!r}")
    for name, default in _UNSUPPORTED.items():
        if ddp.get(name, default) != default:
            raise GradschedError(f"{name} is not supported by gradsched's DistributedDataParallel; remove it, or "
                                 "run PyTorch's DDP (plan='ddp')")
    group = _group(process_group, ddp.get("device_mesh"))
    forward_sync = ddp.get("forward_sync_buffers")
    if forward_sync is None:
        forward_sync = True if broadcast_buffers is None else bool(broadcast_buffers)
        init_buffers = forward_sync
    else:
        init_buffers = True
    cap = ddp.get("bucket_cap_mb")
    if cap is not None:  # as the ddp planner declares it: MiB, above 0, finite
        cap = ddp["bucket_cap_mb"] = check("bucket_cap_mb", BUCKET_CAP_MB, cap)
    torch_kwargs = {k: v for k, v in ddp.items() if v is not None and (DDP_DEFAULTS[k] is None or v != DDP_DEFAULTS[k])}
    if broadcast_buffers is not None:
        torch_kwargs["broadcast_buffers"] = broadcast_buffers
    return DDPArgs(group=group, input_device=_input_device(module, ddp.get("device_ids"), ddp.get("output_device")),
                   find_unused=bool(find_unused_parameters or ddp.get("static_graph")),
                   forward_sync_buffers=forward_sync, init_sync=bool(ddp.get("init_sync", True)),
                   init_sync_buffers=init_buffers, bucket_cap_mb=None if cap is None else float(cap),
                   torch_ddp_kwargs=torch_kwargs)


def _group(process_group: Any, device_mesh: Any) -> Any:
    if device_mesh is not None:
        if process_group is not None:
            raise GradschedError("give process_group or device_mesh, not both (as DDP)")
        if device_mesh.ndim != 1:
            raise GradschedError(f"device_mesh must be 1-D for data parallelism, got {device_mesh.ndim} dimensions; "
                                 "pass its data-parallel slice, e.g. mesh['dp']")
        return device_mesh.get_group(mesh_dim=0)
    if process_group is None:
        return dist.group.WORLD
    if process_group is dist.GroupMember.NON_GROUP_MEMBER or dist.get_rank(process_group) < 0:
        raise GradschedError(f"rank {dist.get_rank()} is not a member of the process_group it wraps the model "
                             "for; wrap the model only on that group's members")
    return process_group


def _input_device(module: nn.Module, device_ids: Any, output_device: Any) -> torch.device | None:
    """DDP's rule: ``device_ids`` is ``None`` or one device, the module's; CPU modules take none."""
    devices = {p.device for p in module.parameters()}
    if not device_ids:
        if output_device is not None and devices <= {torch.device("cpu")}:
            raise GradschedError("output_device applies to single-device GPU modules only (as in DDP); remove it")
        return None
    if len(device_ids) != 1:
        raise GradschedError(f"device_ids must name one device (one process per device, as DDP requires), got "
                             f"{list(device_ids)}")
    if len(devices) != 1 or next(iter(devices)).type == "cpu":
        raise GradschedError(f"device_ids applies to a module on one accelerator (as in DDP); this module's "
                             f"parameters are on {sorted(map(str, devices))}: move it there first, or pass no "
                             "device_ids")
    here = next(iter(devices))
    wanted = torch.device(device_ids[0]) if not isinstance(device_ids[0], int) else torch.device(here.type,
                                                                                                  device_ids[0])
    if wanted != here:
        raise GradschedError(f"device_ids={list(device_ids)} but the module is on {here}; move it with "
                             f"module.to({str(wanted)!r}) before wrapping")
    return here


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj``'s tensors on ``device`` (through lists, tuples, named tuples and dicts), as DDP moves inputs."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(x, device) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return type(obj)({k: to_device(v, device) for k, v in obj.items()})
    return obj


def plan_choice(plan: Any, plan_options: dict[str, Any] | None, use_torch_ddp: bool,
                bucket_cap_mb: float | None) -> tuple[Any, dict[str, Any] | None, bool]:
    """``(plan, plan_options, use_torch_ddp)`` with the default and ``bucket_cap_mb`` applied."""
    if plan is None:
        initial = {"initial_options": {"bucket_cap_mb": bucket_cap_mb}} if bucket_cap_mb is not None else {}
        return DEFAULT_STRATEGY, {**DEFAULT_OPTIONS, **initial, **(plan_options or {})}, False
    if bucket_cap_mb is not None:
        if isinstance(plan, str) and plan == "auto":
            return plan, plan_options, use_torch_ddp  # the size of auto's PyTorch-DDP candidate (the wrapper's)
        if not (isinstance(plan, str) and plan == "ddp"):
            name = plan if isinstance(plan, str) else getattr(plan, "strategy", "?")
            raise GradschedError(f"bucket_cap_mb sets DDP's bucket size: it applies to the default plan, to 'auto' "
                                 f"(its PyTorch-DDP candidate) and to plan='ddp', not to {name!r}; remove it, or give "
                                 "that strategy's own plan_options")
        if not use_torch_ddp:
            plan_options = _with_cap(plan_options, bucket_cap_mb)
    return plan, plan_options, use_torch_ddp


def _with_cap(options: dict[str, Any] | None, bucket_cap_mb: float | None) -> dict[str, Any] | None:
    if bucket_cap_mb is None:
        return options
    return {**(options or {}), "bucket_cap_mb": bucket_cap_mb}
