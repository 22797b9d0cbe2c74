"""``GradschedStrategy``: any gradsched plan as a PyTorch Lightning strategy.

    import lightning as L
    from gradsched.integrations.lightning import GradschedStrategy

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=GradschedStrategy("auto"))
    trainer.fit(model)                      # or "mgwfbp", "usbyte", a Plan, "ddp" (PyTorch's DDP)

It is Lightning's own ``DDPStrategy`` (processes, launch, ``barrier``, ``reduce``,
samplers, precision plugins, checkpoint I/O all unchanged) with one difference: the
LightningModule is wrapped by :class:`gradsched.torch.DistributedDataParallel`, and
the optimizer by :class:`gradsched.torch.DistributedOptimizer`, instead of PyTorch's DDP.
What Lightning does around the step keeps working:

- closures: Lightning steps with ``optimizer.step(closure)``; the closure runs forward
  and backward, as ``torch.optim`` expects;
- ``accumulate_grad_batches``: Lightning's ``block_backward_sync`` maps to the
  wrapper's ``no_sync()``;
- ``gradient_clip_val``, AMP's gradient scaler and ``on_before_optimizer_step`` hooks
  need final gradients between backward and step: under plans that overlap the update
  with the next forward (``bytescheduler``, ``usbyte``) the strategy finishes the
  communication first in those cases (correct, at the cost of that overlap);
- checkpoints: deferred updates are applied before the weights are saved or the
  strategy tears down, so a checkpoint holds the weights the next step starts from;
  under top-k plans (``topk``, ``omgs``) the checkpoint also holds every rank's
  residuals (gathered when Lightning saves, on every rank), and ``fit(ckpt_path=...)``
  gives each rank its own back, so a resumed run continues as if never stopped.

``GradschedStrategy("ddp", ddp_comm_hook=..., ddp_comm_state=...)`` runs PyTorch's DDP
with a communication hook (``gradsched.integrations.hooks``) on any device; Lightning's own
``DDPStrategy`` registers hooks on CUDA only.  Lightning's other keyword arguments
(``process_group_backend``, ``timeout``, ``start_method``, ``cluster_environment`` ...)
pass through; PyTorch-DDP keywords such as ``bucket_cap_mb`` apply to ``"ddp"`` only.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from gradsched.errors import GradschedError

    raise GradschedError("gradsched.lightning needs PyTorch Lightning: pip install 'gradsched[lightning]' "
                         f"(or pip install lightning) ({exc})") from exc

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.torch import DistributedDataParallel, DistributedOptimizer

_WRAPPER_FLAGS = ("find_unused_parameters", "broadcast_buffers")  # DDP's flags the wrapper takes too
SPARSE_CHECKPOINT_KEY = "gradsched_sparse_state"  # the checkpoint's key for every rank's top-k residuals


class GradschedStrategy(DDPStrategy):
    """Lightning's DDP strategy with a gradsched plan.

    Args:
        plan: a strategy name (``"auto"``, ``"mgwfbp"``, ... ``"ddp"`` for PyTorch's own DDP) or a Plan.
        profile, cluster, plan_options, sparse_options, timeout_s, trace, use_torch_ddp, ranks_per_node: as for
            :class:`gradsched.torch.DistributedDataParallel`.
        **kwargs: Lightning's ``DDPStrategy`` arguments; ``find_unused_parameters`` and
            ``broadcast_buffers`` apply to every plan, other PyTorch-DDP keywords to ``"ddp"`` only.
    """

    strategy_name = "gradsched"

    def __init__(self, plan: str | Plan = "auto", *, profile: Profile | None = None, cluster: Cluster | None = None,
                 plan_options: dict[str, Any] | None = None, sparse_options: Any = None,
                 timeout_s: float | None = None, trace: bool = False, use_torch_ddp: bool = True,
                 ranks_per_node: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self._sparse_state: dict[str, Any] | None = None  # a checkpoint's residuals, loaded once the model is wrapped
        self._wrapper_kwargs: dict[str, Any] = {"profile": profile, "cluster": cluster, "plan_options": plan_options,
                                                "sparse_options": sparse_options, "trace": trace,
                                                "use_torch_ddp": use_torch_ddp}
        if ranks_per_node is not None:
            self._wrapper_kwargs["ranks_per_node"] = ranks_per_node
        if timeout_s is not None:
            self._wrapper_kwargs["timeout_s"] = timeout_s
        elif isinstance(self._timeout, timedelta):
            self._wrapper_kwargs["timeout_s"] = self._timeout.total_seconds()  # Lightning's, for the collectives too
        torch_ddp = plan == "ddp" and use_torch_ddp
        extra = sorted(set(self._ddp_kwargs) - set(_WRAPPER_FLAGS))
        if extra and not torch_ddp:
            raise GradschedError(f"{', '.join(extra)}: PyTorch DDP options, which apply to plan='ddp' only; "
                                 f"plan {plan if isinstance(plan, str) else plan.strategy!r} sets its own buckets "
                                 "(tune it with plan_options)")
        if self._ddp_comm_hook is not None and not torch_ddp:
            raise GradschedError("ddp_comm_hook runs inside PyTorch's DDP: use GradschedStrategy('ddp', "
                                 "ddp_comm_hook=...), or a gradsched plan without a hook")

    # ------------------------------------------------------------------ wrapping
    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        flags = {k: v for k, v in self._ddp_kwargs.items() if k in _WRAPPER_FLAGS}
        rest = {k: v for k, v in self._ddp_kwargs.items() if k not in _WRAPPER_FLAGS}
        ids = self.determine_ddp_device_ids()
        if ids is not None:
            rest.setdefault("device_ids", ids)
        return DistributedDataParallel(model, self.plan, ddp_kwargs=rest, **flags, **self._wrapper_kwargs)

    def configure_ddp(self) -> None:
        assert isinstance(self.model, pl.LightningModule)
        self.model = self._setup_model(self.model)
        if self._sparse_state:
            self.model.load_sparse_state_dict(self._sparse_state)
            self._sparse_state = None
        torch_ddp = self.model.link.torch_ddp
        if torch_ddp is not None and self._ddp_comm_hook is not None:
            hook = self._ddp_comm_hook
            if self._ddp_comm_wrapper is not None:
                hook = self._ddp_comm_wrapper(hook)  # as Lightning's DDPStrategy composes them
            torch_ddp.register_comm_hook(self._ddp_comm_state, hook)

    def setup_optimizers(self, trainer: "pl.Trainer") -> None:
        super().setup_optimizers(trainer)
        wrapper = self._wrapper()
        if wrapper is None:  # not fitting: nothing steps
            return
        if len(self.optimizers) == 1:
            self.optimizers = [DistributedOptimizer(self.optimizers[0], wrapper)]
        elif wrapper.overlaps_forward:
            raise GradschedError(f"plan {wrapper.strategy!r} overlaps the update with the next forward, which works "
                                 f"with one optimizer per model; this module has {len(self.optimizers)}: use a "
                                 "non-overlapping plan (wfbp, mgwfbp, optimal, ...)")

    def _wrapper(self) -> DistributedDataParallel | None:
        return self.model if isinstance(self.model, DistributedDataParallel) else None

    @contextlib.contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Gradient accumulation: no communication inside (Lightning calls it on all but the last micro-batch)."""
        wrapper = self._wrapper()
        if wrapper is None:
            yield
            return
        with wrapper.no_sync():
            yield

    # ------------------------------------------------------------------ around the step
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any],
                       model: "pl.LightningModule | torch.nn.Module | None" = None, **kwargs: Any) -> Any:
        wrapper = self._wrapper()
        if wrapper is not None:
            inner = closure

            def closure() -> Any:  # backward, then finish the communication before clipping or hooks look
                out = inner()
                # asked after the backward: run-time auto may have switched plans at its forward
                if wrapper.overlaps_forward and self._needs_final_gradients():
                    wrapper.synchronize()
                return out

        return super().optimizer_step(optimizer, closure, model, **kwargs)

    def _needs_final_gradients(self) -> bool:
        """Whether anything reads or changes gradients between backward and step."""
        trainer = getattr(self.lightning_module, "_trainer", None)
        if trainer is None:
            return True
        if trainer.gradient_clip_val or getattr(self.precision_plugin, "scaler", None) is not None:
            return True
        module = self.lightning_module
        if any(is_overridden(h, module) for h in ("on_before_optimizer_step", "configure_gradient_clipping")):
            return True
        return any(is_overridden("on_before_optimizer_step", cb, Callback) for cb in trainer.callbacks)

    # ------------------------------------------------------------------ saving and stopping
    def lightning_module_state_dict(self) -> dict[str, Any]:
        wrapper = self._wrapper()
        if wrapper is not None:
            wrapper.synchronize()  # deferred updates first: the checkpoint holds the weights the next step uses
        return super().lightning_module_state_dict()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Lightning calls it on every rank (rank 0 writes): top-k residuals are gathered here."""
        wrapper = self._wrapper()
        sparse = wrapper.sparse_state_dict() if wrapper is not None else {}
        if sparse:
            checkpoint = {**checkpoint, SPARSE_CHECKPOINT_KEY: sparse}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        """Before the model is wrapped (DDP's strategies restore it first): the residuals wait for
        :meth:`configure_ddp`."""
        self._sparse_state = checkpoint.get(SPARSE_CHECKPOINT_KEY)
        super().load_model_state_dict(checkpoint, strict=strict)

    def teardown(self) -> None:
        wrapper = self._wrapper()
        if wrapper is not None:
            wrapper.synchronize()
            self.model = self.lightning_module
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("gradsched", cls, description="gradsched's run-time auto plan (DDP's processes)",
                                   override=True)


GradschedStrategy.register_strategies(StrategyRegistry)  # Trainer(strategy="gradsched") after this import
