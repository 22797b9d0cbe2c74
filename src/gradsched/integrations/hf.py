"""The Hugging Face Trainer: gradsched's DDP communication hooks on the DDP it builds.

    from gradsched.integrations.hf import add_comm_hook
    from gradsched.integrations.hooks import TopKState, topk_hook

    trainer = transformers.Trainer(model, args, train_dataset=...)   # args.ddp_bucket_cap_mb sets DDP's buckets
    add_comm_hook(trainer, topk_hook, TopKState(density=0.01))
    trainer.train()

The Trainer builds PyTorch's DDP inside ``train()`` (through Accelerate), after which no
public argument reaches it: Accelerate's ``DistributedDataParallelKwargs(comm_hook=...)``
takes only PyTorch's built-in hooks.  :func:`add_comm_hook` adds a callback that
registers the hook on ``trainer.model_wrapped`` at ``on_train_begin``, which the
Trainer calls after wrapping and before the first step.  With Accelerate alone no
helper is needed: ``model = accelerator.prepare(model); model.register_comm_hook(state, hook)``.

Only what a hook can do passes this way (compression, top-k, merging DDP's buckets in
the hook); gradsched's own bucket boundaries, partitioning, priorities and overlap
with the next forward need ``gradsched.torch.DistributedDataParallel`` (or
``gradsched.integrations.lightning.GradschedStrategy``).
"""

from __future__ import annotations

from typing import Any, Callable

from torch.nn.parallel import DistributedDataParallel as TorchDDP

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from gradsched.errors import GradschedError

    raise GradschedError(f"gradsched.hf needs transformers: pip install 'gradsched[transformers]' ({exc})") from exc


class CommHookCallback(TrainerCallback):
    """Registers ``hook`` (with ``state``) on the Trainer's DDP when training begins."""

    def __init__(self, trainer: Any, hook: Callable[..., Any], state: Any = None) -> None:
        self.trainer = trainer
        self.hook = hook
        self.state = state
        self.registered_on: TorchDDP | None = None  # the DDP that holds the hook (None: one process, no DDP)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ddp = self.trainer.model_wrapped
        if isinstance(ddp, TorchDDP) and ddp is not self.registered_on:  # each train() wraps anew
            ddp.register_comm_hook(self.state, self.hook)
            self.registered_on = ddp


def add_comm_hook(trainer: Any, hook: Callable[..., Any], state: Any = None) -> CommHookCallback:
    """Have ``trainer`` (a ``transformers.Trainer``) run ``hook`` on its DDP's buckets; returns the callback."""
    callback = CommHookCallback(trainer, hook, state)
    trainer.add_callback(callback)
    return callback
