"""What ``gradsched train`` hands its workers, typed (torch-free: the command line builds it).

The workers read the same JSON as before (``config.json`` in the run's folder):
:meth:`TrainConfig.to_dict` writes it, :meth:`TrainConfig.from_dict` reads it back, so a
field is named once, here, and a misspelt one fails where it is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gradsched.errors import InternalError


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One ``gradsched train`` run, as every rank reads it."""

    model: str  # a built-in model (gradsched.constants.MODEL_NAMES) or the user's MODULE:FUNCTION
    strategy: str  # planned at start-up, unless plan_path is given
    steps: int
    batch_size: int  # per rank
    optimizer: str  # "sgd" | "adam"
    lr: float
    seed: int
    timeout_s: float  # a collective that takes longer fails the run
    out_dir: str  # where rank 0 writes result.json
    warmup: int = 0  # steps left out of the timing figures
    plan_path: str | None = None  # run this plan file instead of planning `strategy`
    profile_path: str | None = None  # plan with this measured profile ...
    cluster_path: str | None = None  # ... and this cluster
    plan_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    sparse_options: dict[str, Any] | None = None
    no_torch_ddp: bool = False  # run "ddp" on gradsched's executor instead of PyTorch's DDP
    backend: str | None = None  # None: nccl with GPUs, else gloo
    threads: int = 1  # compute threads per rank
    save_params: str | None = None  # rank 0 saves the trained parameters here
    trace_path: str | None = None  # rank 0 writes the merged Chrome trace here

    def to_dict(self) -> dict[str, Any]:
        """The JSON the workers read."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Back from :meth:`to_dict` (written by ``gradsched train`` itself: a mismatch is a bug)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InternalError(f"train config: unknown field(s) {', '.join(unknown)}")
        return cls(**data)
