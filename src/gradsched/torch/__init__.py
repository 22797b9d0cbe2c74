"""gradsched.torch: the PyTorch runtime (imports torch; the planning core does not).

``DistributedDataParallel`` takes DDP's place and executes any dense gradsched plan;
``DistributedOptimizer`` wraps a ``torch.optim`` optimizer so that plans overlapping
the update with the next forward can step it per parameter subset.  See docs/runtime.md.
``hooks`` (``gradsched.torch.runtime.hooks``): communication hooks for PyTorch's own DDP
(docs/integrations.md), importable as ``gradsched.torch.hooks`` too.  ``save_checkpoint`` /
``load_checkpoint``: checkpoint files with a checksum verified on load (``gradsched.torch.runtime.checkpoint``).
"""

import sys

from gradsched.torch.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from gradsched.torch.jobs.models import MODEL_NAMES, ModelSpec, build_model
from gradsched.torch.runtime import hooks
from gradsched.torch.runtime.ops import CollectiveError
from gradsched.torch.runtime.optim import DistributedOptimizer
from gradsched.torch.runtime.planning import profile_from_module, trainable_parameters
from gradsched.torch.runtime.wrapper import DistributedDataParallel
from gradsched.torch.measure.advisor import advise

sys.modules[f"{__name__}.hooks"] = hooks  # the public path (`from gradsched.torch.hooks import fp16_hook`)

__all__ = ["MODEL_NAMES", "advise", "CheckpointError", "CollectiveError", "DistributedDataParallel",
           "DistributedOptimizer", "ModelSpec",
           "build_model", "hooks", "load_checkpoint", "profile_from_module", "save_checkpoint",
           "trainable_parameters"]
