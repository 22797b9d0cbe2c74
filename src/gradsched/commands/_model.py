"""``--model`` of ``profile``, ``train`` and ``bench``: a built-in name, the user's ``MODULE:FUNCTION``,
or ``replay:PROFILE`` (a profile replayed with emulated compute).

Checked here, in the command's own process, so that a factory that cannot be imported
or returns the wrong thing is one line before any worker starts, not a traceback
from every rank (the factory's contract: :mod:`gradsched.torch.jobs.factory`)."""

from __future__ import annotations

from gradsched.constants import MODEL_NAMES, REPLAY_PREFIX
from gradsched.errors import GradschedError
from gradsched.replayable import check_replayable, load_profile

BUILT_IN = MODEL_NAMES
HELP = (f"built-in model ({', '.join(BUILT_IN)}), your own, MODULE:FUNCTION: a factory returning (module, "
        "batch_fn[, loss_fn]) (docs/profiling.md, 'Your own model'), or replay:PROFILE: a profile file or "
        "bundled name replayed with emulated compute (docs/bench.md)")


def check_model(name: str, *, seed: int = 0, batch_size: int = 2) -> None:
    """Raise a one-line GradschedError unless ``name`` is a built-in model, a working factory or a
    replayable profile."""
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
    make_batch(batch_size, torch.Generator().manual_seed(seed))  # the batch function works and returns a pair
