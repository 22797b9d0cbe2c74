"""Planner options: the declarations live in :mod:`gradsched.options` (one way of checking
options for planners, the runtime, the comm hooks and the command line); this path stays
for the planners' imports and for users' code."""

from gradsched.options import STRATEGIES, Option, check, check_all, coerce

__all__ = ["STRATEGIES", "Option", "check", "check_all", "coerce"]
