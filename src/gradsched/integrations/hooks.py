"""Communication hooks for PyTorch's own DDP (``register_comm_hook``): what of gradsched's
schedule can live inside a DDP that a framework built (Lightning, Accelerate, the HF Trainer).

    from gradsched.integrations.hooks import TopKState, topk_hook, fp16_wrapper
    ddp.register_comm_hook(TopKState(density=0.01), topk_hook)                 # per-bucket top-k
    ddp.register_comm_hook(TopKState(density=0.01, merge_bytes=2**22), merged_topk_hook)   # OMGS-style
    ddp.register_comm_hook(None, fp16_hook)                                     # fp16 all-reduce
    ddp.register_comm_hook(state, fp16_wrapper(topk_hook))                      # wrappers compose

A hook is ``hook(state, bucket) -> Future[Tensor]``: DDP hands it each bucket's flat
gradient buffer (this rank's sum) when the bucket is ready, and waits for the future,
which must hold the bucket's average over ranks, before the optimizer steps.

- :func:`topk_hook`: each bucket keeps its ``density`` fraction of largest entries of
  (gradient + residual); the rest is the new residual (error feedback), added to the
  next iteration's gradient, so nothing is lost, only delayed.  Values and indices are
  all-gathered (int32 indices) and averaged.
- :func:`merged_topk_hook`: OMGS-SGD's idea within DDP's buckets: consecutive buckets
  are held back until they hold ``merge_bytes`` (or the last bucket arrives), then one
  top-k over their concatenation and one all-gather serve them all: fewer, larger
  messages, and the top-k is taken over more of the model.
- :func:`fp16_wrapper` / :func:`bf16_wrapper` around any hook (:func:`fp16_hook` and
  :func:`bf16_hook` around a plain all-reduce): the bucket travels in half precision.

What cannot pass through a hook: the bucket boundaries (DDP's ``bucket_cap_mb`` sets
them; gradsched's planners cannot), partitioning a tensor across operations, priority
scheduling and overlapping the update with the next forward.  Those need
``gradsched.torch.DistributedDataParallel``.  Hook states checkpoint like PowerSGD's:
``torch.save(state)`` / ``pickle`` keep everything but the process group, which is the
default group again after loading (:meth:`TopKState.__setstate__`).
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.
from dataclasses import replace
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradsched.errors import GradschedError
from gradsched.options import Option, check_all
from gradsched.sparsity import DENSITY, k_of
from gradsched.torch.runtime.sparse import topk_indices

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future]

__all__ = ["Hook", "TopKState", "allreduce_hook", "bf16_hook", "bf16_wrapper", "dtype_name", "fp16_hook", "fp16_wrapper",
           "merged_topk_hook", "register_hook", "topk_hook"]  # also what the old paths re-export


# --------------------------------------------------------------------------- dense and half precision
def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The average of ``bucket`` over ranks by one all-reduce (what DDP does without a hook).

    ``state`` may be ``None`` (world) or a process group, or hold one as ``process_group``."""
    group = _group_of(state)
    buf = bucket.buffer()
    buf.div_(dist.get_world_size(group))
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _compress_wrapper(hook: Hook, dtype: torch.dtype) -> Hook:
    def wrapped(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        full = bucket.buffer()
        bucket.set_buffer(full.to(dtype))
        fut = hook(state, bucket)

        def decompress(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            full.copy_(f.value())  # the bucket's own buffer, in its own dtype, is what DDP reads back
            return full

        return fut.then(decompress)

    wrapped.__name__ = f"{dtype_name(dtype)}_wrapper({getattr(hook, '__name__', 'hook')})"
    return wrapped


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "").replace("float16", "fp16").replace("bfloat16", "bf16")


def fp16_wrapper(hook: Hook) -> Hook:
    """``hook`` with the bucket cast to float16 before it and back after (half the bytes)."""
    return _compress_wrapper(hook, torch.float16)


def bf16_wrapper(hook: Hook) -> Hook:
    """``hook`` with the bucket cast to bfloat16 before it and back after (fp32's range, half the bytes)."""
    return _compress_wrapper(hook, torch.bfloat16)


fp16_hook = fp16_wrapper(allreduce_hook)
bf16_hook = bf16_wrapper(allreduce_hook)


# --------------------------------------------------------------------------- top-k with error feedback
TOPK_OPTIONS = (
    replace(DENSITY, default=0.01),
    Option("warmup_steps", int, 1, low=1, doc="iterations all-reduced densely first",
           why="DDP rebuilds its buckets after the first iteration; residuals are kept per bucket"),
    Option("error_feedback", bool, True, doc="keep what was not sent and add it to the next gradient"),
    Option("merge_bytes", float, 4 * 2**20, low=0, low_open=True, allow_inf=True,
           doc="merged_topk_hook: bytes of consecutive buckets per top-k (inf: the whole model)"),
)
""":class:`TopKState`'s tunables as :class:`~gradsched.options.Option` declarations (their checks)."""


class TopKState:
    """State of :func:`topk_hook` and :func:`merged_topk_hook` (one per DDP model).

    Args:
        process_group: default: the world (also after loading a checkpoint).
        density: fraction of each bucket's (or merged group's) entries sent, in (0, 1]
            (``k = ceil(density * numel)``, :func:`gradsched.sparsity.k_of`, as the planners and the runtime).
        warmup_steps: iterations all-reduced densely first (at least 1: DDP rebuilds its
            buckets after the first iteration, and residuals are kept per bucket).
        error_feedback: keep what was not sent and add it to the next gradient.
        merge_bytes: :func:`merged_topk_hook` only: hold consecutive buckets back until
            they hold this many bytes (``float("inf")``: one top-k over the whole model).
    """

    __slots__ = ("process_group", "density", "warmup_steps", "error_feedback", "merge_bytes",  # tunables
                 "iteration", "residuals", "_held",  # internal state
                 "sent_elements", "dense_elements")  # statistics

    def __init__(self, process_group: dist.ProcessGroup | None = None, *, density: float = 0.01,
                 warmup_steps: int = 1, error_feedback: bool = True, merge_bytes: float = 4 * 2**20) -> None:
        opts = check_all("TopKState", TOPK_OPTIONS, {"density": density, "warmup_steps": warmup_steps,
                                                     "error_feedback": error_feedback, "merge_bytes": merge_bytes})
        self.process_group = process_group
        self.density: float = opts["density"]
        self.warmup_steps: int = opts["warmup_steps"]
        self.error_feedback: bool = opts["error_feedback"]
        self.merge_bytes: float = opts["merge_bytes"]
        self.iteration = 0
        self.residuals: dict[int, torch.Tensor] = {}  # bucket index -> what was not sent yet
        self._held: list[tuple[int, torch.Tensor, torch.futures.Future[torch.Tensor]]] = []
        self.sent_elements = 0
        self.dense_elements = 0

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the process group (not picklable) and buckets in flight."""
        return {k: getattr(self, k) for k in self.__slots__ if k not in ("process_group", "_held")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        missing = {k for k in self.__slots__ if k not in ("process_group", "_held")} - set(state)
        if missing:
            raise GradschedError(f"not a TopKState checkpoint (missing {sorted(missing)}); save one with "
                                 "torch.save(state) or pickle")
        for k, v in state.items():
            setattr(self, k, v)
        self.process_group = None  # the default group, as PowerSGD's state after loading
        self._held = []

    def compress(self, index: int, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``density`` largest entries of ``flat`` + the residual of bucket ``index``: (values,
        indices); with error feedback the rest becomes the residual.  ``flat`` is not changed."""
        acc = flat.clone()
        residual = self.residuals.get(index)
        if residual is not None:
            if residual.numel() != flat.numel():
                raise GradschedError(f"bucket {index} holds {flat.numel()} elements but its residual "
                                     f"{residual.numel()}: this state belongs to another model or bucket_cap_mb; "
                                     "build a new TopKState")
            acc.add_(residual.to(acc.dtype))
        k = k_of(self.density, acc.numel())
        indices = topk_indices(acc, k)  # in pieces: temporaries bounded by SELECT_CHUNK, not by the bucket
        values = acc[indices]
        if self.error_feedback:
            acc[indices] = 0
            self.residuals[index] = acc
        self.sent_elements += k
        self.dense_elements += acc.numel()
        return values, indices


def _group_of(state: Any) -> Any:
    if state is None or isinstance(state, dist.ProcessGroup):
        return state
    return getattr(state, "process_group", None)


def _sparse_allreduce(state: TopKState, index: int, flat: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """Compress ``flat`` (residual ``index``), all-gather values and indices, average into ``flat``."""
    group = state.process_group
    world = dist.get_world_size(group)
    values, indices = state.compress(index, flat)
    if flat.numel() <= torch.iinfo(torch.int32).max:
        indices = indices.to(torch.int32)  # half the index bytes
    all_values = values.new_empty(world * values.numel())
    all_indices = indices.new_empty(world * indices.numel())
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in newer PyTorch
    fv = gather(all_values, values, group=group, async_op=True).get_future()
    fi = gather(all_indices, indices, group=group, async_op=True).get_future()

    def decode(_: Any) -> torch.Tensor:
        flat.zero_()
        flat.index_add_(0, all_indices, all_values)
        return flat.div_(world)

    return torch.futures.collect_all([fv, fi]).then(decode)


def _next_iteration(state: TopKState, bucket: dist.GradBucket) -> bool:
    """Whether this bucket is still in warm-up; counts iterations at each last bucket."""
    warm = state.iteration < state.warmup_steps
    if bucket.is_last():
        state.iteration += 1
    return warm


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k with error feedback per DDP bucket (dense all-reduce during warm-up)."""
    if _next_iteration(state, bucket):
        return allreduce_hook(state, bucket)
    return _sparse_allreduce(state, bucket.index(), bucket.buffer())


def merged_topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """OMGS-style top-k: consecutive buckets merged until ``merge_bytes``, one top-k and
    all-gather for the group.  A held bucket's future completes with its group's."""
    if _next_iteration(state, bucket):
        return allreduce_hook(state, bucket)
    buf = bucket.buffer()
    mine: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    state._held.append((bucket.index(), buf, mine))
    held_bytes = sum(b.numel() * b.element_size() for _, b, _ in state._held)
    if held_bytes >= state.merge_bytes or bucket.is_last():
        _flush_merged(state)
    return mine


def _flush_merged(state: TopKState) -> None:
    held, state._held = state._held, []
    if len({b.dtype for _, b, _ in held}) > 1:
        raise GradschedError("merged top-k over buckets of different dtypes; keep one dtype per model or use topk_hook")
    flat = torch.cat([b for _, b, _ in held])
    # one residual per merged group, kept under its first bucket's index (groups are the same every iteration)
    done = _sparse_allreduce(state, held[0][0], flat)

    def scatter(f: torch.futures.Future[torch.Tensor]) -> None:
        try:
            out = f.value()
        except Exception as exc:  # a failed collective fails every held bucket: DDP must not wait forever
            for _, _, fut in held:
                fut.set_exception(exc)
            return
        offset = 0
        for _, b, fut in held:
            b.copy_(out[offset:offset + b.numel()])
            offset += b.numel()
            fut.set_result(b)

    done.then(scatter)


def register_hook(model: Any, state: Any, hook: Hook) -> Any:
    """``model.register_comm_hook(state, hook)`` on what a framework prepared (Accelerate's
    ``accelerator.prepare(model)``); returns the DDP it registered on, or None with one process.

    With one process Accelerate returns the bare module (no DDP, nothing to communicate):
    nothing is registered, and a warning says so, since ``accelerate launch --cpu
    --num_processes 2`` starts one process.  With several ranks launched (``WORLD_SIZE`` > 1)
    and no DDP, every rank would train alone: that is an error that says how to start
    Accelerate's distributed mode on CPUs."""
    import logging
    import os

    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    if isinstance(model, TorchDDP):
        model.register_comm_hook(state, hook)
        return model
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        raise GradschedError(
            f"{world} processes were launched but the model is a {type(model).__name__}, not PyTorch's "
            "DistributedDataParallel: Accelerate did not start distributed training, so each process would train "
            "alone. On CPUs create Accelerator(cpu=True) (or set ACCELERATE_USE_CPU=1) under `accelerate launch "
            "--multi_gpu --num_processes N` or torchrun (docs/integrations.md)")
    logging.getLogger(__name__).warning(
        "one process, no DDP: the communication hook is not registered (nothing to communicate). `accelerate "
        "launch --cpu` starts one process whatever --num_processes says; see docs/integrations.md for a CPU launch")
    return None
