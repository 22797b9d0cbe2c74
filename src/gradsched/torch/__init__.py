"""gradsched.torch: the PyTorch runtime (imports torch; the planning core does not).

``DistributedDataParallel`` takes DDP's place and executes any dense gradsched plan;
``DistributedOptimizer`` wraps a ``torch.optim`` optimizer so that plans overlapping
the update with the next forward can step it per parameter subset.  See docs/runtime.md.
``hooks``: communication hooks for PyTorch's own DDP (:mod:`gradsched.integrations.hooks`,
docs/integrations.md), importable as ``gradsched.torch.hooks`` too.  ``save_checkpoint`` /
``load_checkpoint``: checkpoint files with a checksum verified on load (``gradsched.torch.runtime.checkpoint``).

A lazy facade: each name is imported from its module on first use (PEP 562), so that
importing one module of the package (``gradsched.torch.runtime.layout``) does not
execute the rest of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names are, for type checkers and readers (and the layering test's graph)
    from gradsched.torch import hooks
    from gradsched.torch.jobs.models import MODEL_NAMES, ModelSpec, build_model
    from gradsched.torch.measure.advisor import advise
    from gradsched.torch.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from gradsched.torch.runtime.ops import CollectiveError
    from gradsched.torch.runtime.optim import DistributedOptimizer
    from gradsched.torch.runtime.planning import profile_from_module, trainable_parameters
    from gradsched.torch.runtime.wrapper import DistributedDataParallel

# public name -> the module that defines it ("hooks" is a module itself)
_EXPORTS = {
    "MODEL_NAMES": "gradsched.torch.jobs.models", "ModelSpec": "gradsched.torch.jobs.models",
    "build_model": "gradsched.torch.jobs.models",
    "advise": "gradsched.torch.measure.advisor",
    "CheckpointError": "gradsched.torch.runtime.checkpoint", "load_checkpoint": "gradsched.torch.runtime.checkpoint",
    "save_checkpoint": "gradsched.torch.runtime.checkpoint",
    "CollectiveError": "gradsched.torch.runtime.ops",
    "DistributedOptimizer": "gradsched.torch.runtime.optim",
    "profile_from_module": "gradsched.torch.runtime.planning",
    "trainable_parameters": "gradsched.torch.runtime.planning",
    "DistributedDataParallel": "gradsched.torch.runtime.wrapper",
    "hooks": "gradsched.torch.hooks",
}

__all__ = ["CheckpointError", "CollectiveError", "DistributedDataParallel", "DistributedOptimizer", "MODEL_NAMES",
           "ModelSpec", "advise", "build_model", "hooks", "load_checkpoint", "profile_from_module", "save_checkpoint",
           "trainable_parameters"]  # = _EXPORTS' names (tests/integrations/test_layout.py)


def __getattr__(name: str) -> Any:
    """Import a public name on first use (then it is a plain attribute of the package)."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if name == "hooks" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
