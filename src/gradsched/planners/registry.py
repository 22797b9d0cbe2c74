"""The strategy registry: name -> planner function.

A planner is ``plan(profile, cluster, **options) -> Plan``.  ``cluster`` is already
at the target world size.  A new strategy is one module with one ``@register``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.profile import Profile


class Planner(Protocol):
    def __call__(self, profile: Profile, cluster: Cluster, **options: Any) -> Plan: ...


_PLANNERS: dict[str, Planner] = {}
_SPARSE: set[str] = set()


def register(name: str, *, sparse: bool = False) -> Callable[[Planner], Planner]:
    """Register a planner under ``name`` (``sparse``: it compresses gradients)."""

    def deco(fn: Planner) -> Planner:
        if name in _PLANNERS:
            raise ValueError(f"strategy {name!r} is registered twice")
        _PLANNERS[name] = fn
        if sparse:
            _SPARSE.add(name)
        return fn

    return deco


def get_planner(name: str) -> Planner:
    try:
        return _PLANNERS[name]
    except KeyError:
        raise GradschedError(f"unknown strategy {name!r}; known: {', '.join(strategy_names())}") from None


def strategy_names() -> list[str]:
    return list(_PLANNERS)


def is_sparse(name: str) -> bool:
    return name in _SPARSE


def make_plan(name: str, profile: Profile, cluster: Cluster, **options: Any) -> Plan:
    """Run planner ``name``; unknown options are an error that lists the planner's own."""
    planner = get_planner(name)
    try:
        return planner(profile, cluster, **options)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise GradschedError(f"strategy {name!r}: {exc}") from None
        raise
