"""``gradsched.torch.advise(model, batch)``: the bucket advisor on a live process group.

Profiles ``model`` where it runs (:func:`gradsched.torch.measure.profiler.profile_module`),
measures the all-reduce on the default process group
(:func:`gradsched.torch.measure.netbench.benchmark`), and returns
:func:`gradsched.advise.advise` on the two, the same on every rank::

    advice = gradsched.torch.advise(model, (x, y), loss_fn=F.cross_entropy)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=advice.ddp_bucket_cap_mb)

Every rank must call it (it issues collectives); it takes about as long as
``iterations`` training steps plus a network benchmark up to the model's gradient size."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from gradsched.advise import BUCKETS_MB, Advice
from gradsched.advise import advise as advise_offline
from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.profile import Profile
from gradsched.torch.runtime.startup import broadcast_object

MIN_NET_BYTES = 4 * 1024
ADVICE_TIMEOUT_S = 1800.0  # other ranks wait while rank 0 simulates every bucket size


def advise(model: nn.Module, batch: Any | Callable[[], Any], *, loss_fn: Callable[..., torch.Tensor] | None = None,
           iterations: int = 5, net_reps: int = 3, buckets_mb: tuple[float, ...] = BUCKETS_MB,
           contention: bool = False, print_advice: bool = False) -> Advice:
    """Profile ``model`` on ``batch`` and measure the network in place; return the advice on every rank.

    ``batch`` and ``loss_fn`` as for :func:`gradsched.torch.measure.profiler.profile_module` (an
    ``(inputs, targets)`` pair with a ``loss_fn``, else inputs whose output is summed).
    The model's weights are left as they were (the profiler's optimizer has learning rate 0).
    ``contention``: also run ``gradsched bench``'s contention probe (on a copy of the model)
    so the simulation slows compute and collectives that overlap, as they do where gloo's
    threads share CPU cores with compute (docs/simulator.md, "Contention"); not needed on
    GPUs.  ``print_advice``: rank 0 prints the table ``gradsched advise`` prints.  gradsched's best plan
    is one that runs on ``model`` (:func:`gradsched.torch.measure.outside_reads.unseen_reads`: plans
    overlapping the next forward are left out only where the first-use gate cannot see a parameter's
    read); faster plans that cannot run are listed in ``Advice.gradsched_rejected``.

    A Hugging Face model: ``batch`` a dict of its inputs with ``labels`` and no ``loss_fn``
    (the model's own loss is used), e.g. ``advise(model, tokenizer(texts, return_tensors="pt")
    | {"labels": ids})``."""
    from gradsched.advise import format_advice

    from gradsched.torch.measure.outside_reads import plan_check

    profile, cluster = measure(model, batch, loss_fn=loss_fn, iterations=iterations, net_reps=net_reps,
                               contention=contention)
    box: list[Advice | None] = [None]
    if cluster is not None:  # rank 0
        box[0] = advise_offline(profile, cluster, buckets_mb, ddp_first_bucket_mb=ddp_first_bucket_mb(),
                                plan_check=plan_check(model, batch, loss_fn))
        if print_advice:
            print(format_advice(box[0]), flush=True)
    advice = broadcast_object(box[0], 0, dist.group.WORLD, ADVICE_TIMEOUT_S, "the advice's broadcast from rank 0")
    if advice is None:  # pragma: no cover - rank 0 always has advice to send
        raise GradschedError("advise: rank 0's advice did not arrive")
    return advice


def measure(model: nn.Module, batch: Any | Callable[[], Any], *, loss_fn: Callable[..., torch.Tensor] | None = None,
            iterations: int = 5, net_reps: int = 3, contention: bool = False) -> tuple[Profile, Cluster | None]:
    """What :func:`advise` simulates: the model's profile (every rank) and the measured cluster,
    with the contention probe's figures when asked (rank 0; None elsewhere).  A collective call."""
    from gradsched.torch.measure.netbench import benchmark
    from gradsched.torch.measure.profiler import profile_module

    if not dist.is_available() or not dist.is_initialized():
        raise GradschedError("advise needs a process group: call torch.distributed.init_process_group first "
                             "(e.g. under torchrun)")
    profile = profile_module(model, batch, loss_fn=loss_fn, iterations=iterations)
    top = net_top_bytes(profile.total_bytes)
    cluster = benchmark(min_bytes=MIN_NET_BYTES, max_bytes=top, reps=net_reps, collectives=("allreduce",))
    probe = _contention_probe(model, batch, loss_fn, profile.total_bytes) if contention else None
    if dist.get_rank() != 0:
        return profile, None
    if cluster is None:  # pragma: no cover - benchmark returns the fitted cluster on rank 0
        raise GradschedError("advise: the network benchmark returned nothing on rank 0")
    if probe is not None:
        fitted = probe.figures(cluster.cost("allreduce"))["fitted"]
        cluster = dataclasses.replace(cluster, extra={**cluster.extra, "contention": fitted})
    return profile, cluster


def net_top_bytes(total_bytes: int) -> int:
    """The largest all-reduce to measure: the power of two at or above the gradients' bytes
    (at most 256 MiB), so that the measured table covers every bucket, the whole gradient
    included.  Beyond the table the simulator reads the fitted line, which at 250 Mbit/s
    priced 50 MB 30% under what the table's 32 MiB point gave per byte (docs/advise.md)."""
    return min(max(MIN_NET_BYTES * 2, 1 << max(0, total_bytes - 1).bit_length()), 256 << 20)


def ddp_first_bucket_mb() -> float | None:
    """The installed DDP's first-bucket rule, as :func:`gradsched.advise.advise` takes it: None
    where a set ``bucket_cap_mb`` caps the first bucket too (PyTorch's ``_BucketCapacityConfig``,
    or the ``bucket_bytes_cap_default`` flag before it), else 1 MiB whatever the setting."""
    import inspect

    from torch.nn.parallel import distributed as ddp_module

    if hasattr(ddp_module, "_BucketCapacityConfig"):
        return None
    try:
        source = inspect.getsource(ddp_module.DistributedDataParallel.__init__)
    except (OSError, TypeError):  # pragma: no cover - no source shipped: assume the current rule
        return None
    return None if "bucket_bytes_cap_default" in source else 1.0


class _Probed:
    """What the contention probe needs of a model: the module, a loss and a batch."""

    def __init__(self, module: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None) -> None:
        self.module = module
        self._batch = batch
        self._pair = loss_fn is not None  # (inputs, targets) with a loss, else the inputs alone
        self.loss_fn = loss_fn if loss_fn is not None else (lambda out, _: out.float().sum())

    def make_batch(self, n: int, gen: torch.Generator) -> tuple[Any, Any]:
        batch = self._batch() if callable(self._batch) else self._batch
        if self._pair:
            inputs, targets = batch
            return inputs, targets
        return batch, None


def _contention_probe(model: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None,
                      total_bytes: int) -> Any:
    """The probe's start-up measurement on a copy of ``model`` (a collective call)."""
    from gradsched.torch.measure.probe import ContentionProbe

    spec = _Probed(copy.deepcopy(model), batch, loss_fn)
    probe = ContentionProbe(spec, total_bytes, lr=0.0, seed=0, batch_size=0)
    probe.measure(probe.start_reps)
    return probe
