"""Planners: one module per strategy, each registered by name (see registry.py).

A new strategy is one module here with one ``@register("name")`` and one import line
below.  Import order is the display order (baselines first, ``auto`` last: it
searches all the others)."""

from gradsched.planners.registry import get_planner, is_sparse, make_plan, register, strategy_names

# isort: off
from gradsched.planners import wfbp  # noqa: E402,F401
from gradsched.planners import sync  # noqa: E402,F401
from gradsched.planners import threshold  # noqa: E402,F401
from gradsched.planners import ddp  # noqa: E402,F401
from gradsched.planners import horovod  # noqa: E402,F401
from gradsched.planners import mgwfbp  # noqa: E402,F401
from gradsched.planners import optimal  # noqa: E402,F401
from gradsched.planners import bytescheduler  # noqa: E402,F401
from gradsched.planners import usbyte  # noqa: E402,F401
from gradsched.planners import topk  # noqa: E402,F401
from gradsched.planners import omgs  # noqa: E402,F401
from gradsched.planners import dear  # noqa: E402,F401
from gradsched.planners import auto  # noqa: E402,F401
# isort: on

__all__ = ["get_planner", "is_sparse", "make_plan", "register", "strategy_names"]
