"""The strategy registry: name -> planner function, with the options each one takes.

A planner is ``plan(profile, cluster, **options) -> Plan``.  ``cluster`` is already
at the target world size.  A new strategy is one module with one ``@register``,
which declares the planner's options (:class:`~gradsched.options.Option`:
type, range, default).  The registry is the one place that checks them: whoever
calls the planner (``make_plan``, ``get_planner(name)``, the module's own ``plan``,
``auto``'s search, the command line's ``--opt``) gets typed, range-checked values
or a one-line :class:`GradschedError` naming the strategy and the option.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Protocol

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.plan import Plan
from gradsched.planners.options import Option, coerce
from gradsched.profile import Profile


class Planner(Protocol):
    def __call__(self, profile: Profile, cluster: Cluster, **options: Any) -> Plan: ...


_PLANNERS: dict[str, Planner] = {}
_OPTIONS: dict[str, dict[str, Option]] = {}
_SPARSE: set[str] = set()


def register(name: str, *, sparse: bool = False,
             options: tuple[Option, ...] = ()) -> Callable[[Callable[..., Plan]], Planner]:
    """Register a planner under ``name`` (``sparse``: it compresses gradients) with its ``options``.

    The returned function checks its keyword options (:func:`check_options`) before
    it plans, so the planner's body may trust them."""

    def deco(fn: Callable[..., Plan]) -> Planner:  # its own keyword options, checked here
        if name in _PLANNERS:
            raise ValueError(f"strategy {name!r} is registered twice")

        @functools.wraps(fn)
        def checked(profile: Profile, cluster: Cluster, **opts: Any) -> Plan:
            return fn(profile, cluster, **check_options(name, opts))

        _PLANNERS[name] = checked
        _OPTIONS[name] = {o.name: o for o in options}
        if sparse:
            _SPARSE.add(name)
        return checked

    return deco


def get_planner(name: str) -> Planner:
    try:
        return _PLANNERS[name]
    except KeyError:
        raise GradschedError(f"unknown strategy {name!r}; known: {', '.join(strategy_names())}") from None


def planner_option_specs(name: str) -> dict[str, Option]:
    """The options strategy ``name`` declares, by name."""
    get_planner(name)
    return dict(_OPTIONS[name])


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of strategy ``name``, each coerced to its declared type and range-checked.

    An option the strategy does not declare is an error listing the ones it has."""
    specs = planner_option_specs(name)
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in specs:
            known = ", ".join(o.describe() for o in specs.values()) or "none"
            raise GradschedError(f"strategy {name!r} has no option {key!r}; its options: {known}")
        out[key] = coerce(name, specs[key], value, strategy_names)
    return out


def strategy_names() -> list[str]:
    return list(_PLANNERS)


def is_sparse(name: str) -> bool:
    return name in _SPARSE


def byte_scaled_options(name: str, options: dict[str, Any], scale: int) -> dict[str, Any]:
    """``options`` of strategy ``name`` for a byte-scaled stand-in of a model (every tensor 1/``scale`` of its
    elements on links at rate / ``scale``: ``gradsched bench --scale-bytes``): each size option the strategy
    declares (:attr:`~gradsched.options.Option.size`: bytes, MiB or MB), given or at its default, divided by
    ``scale``, so that the stand-in is planned into the operations the model emulated would be, each as long.
    Integer sizes are rounded (at least 1; 0 stays 0); a default of None (the planner's own choice) stays."""
    out = dict(options)
    if scale == 1:
        return out
    for o in planner_option_specs(name).values():
        value = out.get(o.name, o.default)
        if not o.size or value is None:
            continue
        value = coerce(name, o, value, strategy_names)  # a string from the command line, checked
        out[o.name] = (max(1, round(value / scale)) if value > 0 else 0) if o.kind is int else value / scale
    return out


def make_plan(name: str, profile: Profile, cluster: Cluster, **options: Any) -> Plan:
    """Run planner ``name``; unknown or ill-typed options are an error naming the option."""
    return get_planner(name)(profile, cluster, **options)
