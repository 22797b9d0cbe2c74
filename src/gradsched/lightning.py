"""A kept old path of :mod:`gradsched.integrations.lightning` (``from gradsched.lightning import GradschedStrategy``
keeps working, and registers the strategy name as before)."""

from gradsched.integrations.lightning import (  # noqa: F401 - re-exported
    SPARSE_CHECKPOINT_KEY,
    GradschedStrategy,
)

__all__ = ["SPARSE_CHECKPOINT_KEY", "GradschedStrategy"]
