"""``--model`` of ``profile``, ``train`` and ``bench``: a built-in name, the user's ``MODULE:FUNCTION``,
or ``replay:PROFILE`` (a profile replayed with emulated compute).

Checked here, in the command's own process, so that a factory that cannot be imported
or returns the wrong thing is one line before any worker starts, not a traceback
from every rank (the factory's contract: :mod:`gradsched.torch.jobs.factory`)."""

from __future__ import annotations

from typing import Any, Callable

from gradsched.constants import MODEL_NAMES, REPLAY_PREFIX
from gradsched.errors import GradschedError
from gradsched.procfs import proc_bytes
from gradsched.replayable import check_replayable, load_profile

BUILT_IN = MODEL_NAMES
MAX_BATCH_SIZE = 2**20  # samples per rank: a million is already far past any CPU run; a billion is a typo
MEMORY_SHARE = 0.5  # a batch may take at most this share of the memory available now
HELP = (f"built-in model ({', '.join(BUILT_IN)}), your own, MODULE:FUNCTION: a factory returning (module, "
        "batch_fn[, loss_fn]) (docs/profiling.md, 'Your own model'), or replay:PROFILE: a profile file or "
        "bundled name replayed with emulated compute (docs/bench.md)")


def check_model(name: str, *, seed: int = 0, batch_size: int = 2) -> None:
    """Raise a one-line GradschedError unless ``name`` is a built-in model, a working factory or a
    replayable profile, and ``batch_size`` a batch it can make."""
    check_batch_size(batch_size)
    if name.startswith(REPLAY_PREFIX):
        check_replayable(load_profile(name.removeprefix(REPLAY_PREFIX)))
        return
    if ":" not in name:
        if name not in BUILT_IN:
            raise GradschedError(f"unknown model {name!r}; known: {', '.join(BUILT_IN)}, or MODULE:FUNCTION for "
                                 "your own (docs/profiling.md)")
        if name in ("gpt2", "bert"):
            import importlib.util

            if importlib.util.find_spec("transformers") is None:
                raise GradschedError(f"model {name} needs the transformers package: pip install transformers")
        return
    import torch

    from gradsched.torch.jobs.factory import build_from_factory

    _, make_batch, _ = build_from_factory(name, seed)
    check_batch_memory(make_batch, batch_size)
    make_batch(batch_size, torch.Generator().manual_seed(seed))  # the batch function works and returns a pair


def check_batch_size(batch_size: int, flag: str = "--batch-size") -> int:
    """``batch_size`` if it is a whole number from 1 to :data:`MAX_BATCH_SIZE`, else a one-line error."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise GradschedError(f"{flag} must be at least 1 and at most {MAX_BATCH_SIZE:,} samples, got {batch_size}")
    return batch_size


def check_batch_memory(make_batch: Callable[..., Any], batch_size: int, flag: str = "--batch-size") -> None:
    """Refuse a batch whose tensors would take more than :data:`MEMORY_SHARE` of the memory available
    now (estimated from a batch of one sample), before it is made."""
    import torch

    one = _tensor_bytes(make_batch(1, torch.Generator().manual_seed(0)))
    available = _available_bytes()
    if available is not None and one * batch_size > MEMORY_SHARE * available:
        raise GradschedError(f"{flag} {batch_size:,}: one batch would take about {one * batch_size / 2**30:,.1f} GiB "
                             f"({one:,} bytes a sample), more than half the {available / 2**30:.1f} GiB available; "
                             f"give at most {int(MEMORY_SHARE * available // max(one, 1)):,}")


def _tensor_bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(x) for x in obj.values())
    return 0


def _available_bytes() -> int | None:
    """Memory available to new allocations (MemAvailable), or None where it cannot be read."""
    return proc_bytes("/proc/meminfo", "MemAvailable")
