"""PyTorch's own DDP as one of run-time ``auto``'s candidates.

``auto`` (:mod:`gradsched.torch.runtime.autotune`) measures plans by running them; to
never lose to what a user could pick by hand, it also runs
``torch.nn.parallel.DistributedDataParallel`` itself, at the user's ``bucket_cap_mb``
(PyTorch's default when not given: 25 MiB after a 1 MiB first bucket), at the size the
advisor predicts fastest (:func:`gradsched.advise.best_ddp_bucket_mb`) and as one
bucket (:func:`one_bucket_mb`): the end of the range where per-operation costs the
simulator does not see (each bucket's copies and launches) count most, as over loopback,
where one bucket measured fastest for cnn, vgg and bert (docs/bench.md, "Real compute").

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
the tuner drops the ones not running once the trials are decided.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from gradsched.advise import DDP_DEFAULT_FIRST_MB, ddp_plan
from gradsched.cluster import Cluster
from gradsched.constants import MiB
from gradsched.plan import Plan
from gradsched.profile import Profile

TORCH_DDP = "torch-ddp"  # a candidate's strategy name: run by torch.nn.parallel.DistributedDataParallel
CANDIDATE_SIZES = 3  # the most PyTorch DDPs auto tries: the user's size, the advised one, one bucket


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


def is_torch_ddp(plan: Plan | None) -> bool:
    """Whether ``plan`` stands for PyTorch's own DDP (:func:`candidate_plan`)."""
    return plan is not None and plan.strategy == TORCH_DDP


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
        return self._built[cap]

    def release(self, keep: float | None = None) -> None:
        """Drop every DDP but the one at ``keep`` (its reducer's hooks and buckets go with it)."""
        self._built = {cap: ddp for cap, ddp in self._built.items() if cap == keep}

    @property
    def kept_mb(self) -> list[float]:
        return sorted(self._built)
