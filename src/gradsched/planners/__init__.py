"""Planners: one module per strategy, each registered by name (see registry.py)."""

from gradsched.planners.registry import get_planner, is_sparse, make_plan, register, strategy_names

# One import per strategy module; importing registers it.  Order is the display order.
from gradsched.planners import wfbp  # noqa: E402,F401  isort: skip
from gradsched.planners import mgwfbp, optimal, usbyte, topk, omgs  # noqa: E402,F401  isort: skip
from gradsched.planners import sync, threshold, ddp, horovod, bytescheduler  # noqa: E402,F401  isort: skip
from gradsched.planners import auto  # noqa: E402,F401  isort: skip  (keep last: it searches the others)

__all__ = ["get_planner", "is_sparse", "make_plan", "register", "strategy_names"]
