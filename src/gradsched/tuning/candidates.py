"""Run-time ``auto``'s candidates, by name: PyTorch's own DDP among the plans, and how a reader names them.

Torch-free: a candidate is a :class:`~gradsched.plan.Plan`; the runtime
(:mod:`gradsched.torch.runtime.torch_ddp`) builds and runs PyTorch's DDP for a plan named
:data:`TORCH_DDP`.
"""

from __future__ import annotations

from gradsched.plan import Plan

TORCH_DDP = "torch-ddp"  # a candidate's strategy name: run by torch.nn.parallel.DistributedDataParallel
CANDIDATE_SIZES = 3  # the most PyTorch DDPs auto tries: the user's size, the advised one, one bucket


def is_torch_ddp(plan: Plan | None) -> bool:
    """Whether ``plan`` stands for PyTorch's own DDP (:func:`gradsched.torch.runtime.torch_ddp.candidate_plan`)."""
    return plan is not None and plan.strategy == TORCH_DDP



def label(strategy: str, plan: Plan) -> str:
    """A trial candidate as a reader names it: the strategy, and PyTorch DDP's bucket size."""
    if not is_torch_ddp(plan):
        return strategy
    cap = plan.options["bucket_cap_mb"]
    return f"{strategy} {'default' if plan.options.get('default') else f'{cap:g} MB'}"
