"""A kept old path of :mod:`gradsched.integrations.hf` (``from gradsched.hf import add_comm_hook``)."""

from gradsched.integrations.hf import (  # noqa: F401 - re-exported
    CommHookCallback,
    add_comm_hook,
)

__all__ = ["CommHookCallback", "add_comm_hook"]
