"""Typed, range-checked options: each planner declares its own, the registry checks them.

A planner module lists its options next to its ``plan`` function::

    OPTIONS = (Option("bucket_cap_mb", float, 25.0, low=0, doc="bucket size in MiB"),)

    @register("ddp", options=OPTIONS)
    def plan(profile, cluster, bucket_cap_mb=25.0): ...

and every call through the registry (``make_plan``, ``get_planner(name)(...)``, the
module's own ``plan``) passes the values through :func:`coerce` first: a value from
the command line (a string) or from Python is turned into the declared type and
checked against its range, or rejected with one line naming the strategy, the
option and the reason.  Nothing a planner receives is a string it did not ask for,
a NaN, an infinity or a number outside what it can use.

The same declarations check options that are not a planner's: the runtime's
``sparse_options``, the DDP comm hooks' :class:`~gradsched.torch.runtime.hooks.TopKState`,
run-time ``auto``'s settings (:data:`gradsched.tuning.config.OPTIONS`) and
``DistributedOptimizer``'s clipping (:func:`check_all`: a dict of values against a tuple of
options), and single values such as ``--density`` or ``shard_optimizer`` (:func:`check`,
with :data:`gradsched.sparsity.DENSITY`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from gradsched.errors import GradschedError

STRATEGIES = "strategies"  # kind of an option naming strategies (a comma-separated string or a list)


@dataclass(frozen=True, slots=True)
class Option:
    """One planner option: its name, type, default and allowed range.

    ``kind`` is ``float``, ``int``, ``bool``, ``str``, ``dict`` (a mapping, e.g. another strategy's options;
    copied, its content not checked here) or :data:`STRATEGIES`.  ``low``/``high`` bound numbers
    (``low_open``: the value must be above ``low``, not equal to it; ``high_open``: below ``high``);
    ``optional``: ``None`` is allowed (and means "the planner's own choice");
    ``choices``: the words a ``str`` option takes (empty: any); ``allow_inf``: a ``float``
    option may be infinite (never NaN); ``why``: said after a range error (why the bound); ``size``: a size in
    bytes (or MiB, MB) of the model's gradients, which byte scaling divides (``gradsched bench --scale-bytes``:
    :func:`gradsched.planners.registry.byte_scaled_options`)."""

    name: str
    kind: Any
    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    doc: str = ""
    choices: tuple[str, ...] = ()
    allow_inf: bool = False
    why: str = ""
    size: bool = False

    def describe(self) -> str:
        kind = self.kind if isinstance(self.kind, str) else self.kind.__name__
        lo = "" if self.low is None else ("(" if self.low_open else "[") + f"{self.low:g}"
        hi = "" if self.high is None else f"{self.high:g}" + (")" if self.high_open else "]")
        rng = f" in {lo or '(-inf'}, {hi or 'inf)'}" if (lo or hi) else ""
        one_of = f" one of {', '.join(self.choices)}" if self.choices else ""
        return f"{self.name} ({kind}{rng}{one_of}, default {self.default!r})"


def coerce(strategy: str, option: Option, value: Any, known: Callable[[], list[str]]) -> Any:
    """``value`` as ``option``'s type, in range; else a GradschedError naming ``strategy`` and the option."""
    return check(f"{strategy}: {option.name}", option, value, known)


def check_all(where: str, options: tuple[Option, ...], values: dict[str, Any], what: str = "option") -> dict[str, Any]:
    """Every option of ``options``: its value from ``values`` through :func:`check`, else its default.
    A name in ``values`` that no option declares is an error listing the known ones (one line)."""
    declared = {o.name: o for o in options}
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise GradschedError(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(sorted(declared))}")
    return {name: check(f"{where}: {name}", o, values[name]) if name in values else o.default
            for name, o in declared.items()}


def check(where: str, option: Option, value: Any, known: Callable[[], list[str]] = list) -> Any:
    """``value`` as ``option``'s type, in range (or one of its choices); else a one-line GradschedError
    starting with ``where`` (e.g. ``"--density"`` or ``"topk: density"``)."""
    if value is None:
        if option.optional:
            return None
        raise GradschedError(f"{where} needs a value ({option.describe()})")
    if option.kind is bool:
        return _boolean(where, value)
    if option.kind == STRATEGIES:
        return _strategies(where, value, known())
    if option.kind is dict:
        if not isinstance(value, dict):
            raise GradschedError(f"{where} must be a dict, got {value!r}")
        return dict(value)
    if option.kind is str:  # a word: one of its choices, if it declares them (else the planner checks)
        if option.choices and value not in option.choices:
            raise GradschedError(f"{where} must be one of {', '.join(option.choices)}, got {value!r}")
        return str(value)
    if option.kind is int:
        x: float = _integer(where, value)
    else:
        x = _real(where, value, finite=not option.allow_inf)
    _in_range(where, option, x)
    return x


def _boolean(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise GradschedError(f"{where} must be true or false, got {value!r}")


def _real(where: str, value: Any, what: str = "a number", finite: bool = True) -> float:
    if isinstance(value, bool):
        raise GradschedError(f"{where} must be {what}, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise GradschedError(f"{where} must be {what}, got {value!r}") from None
    if math.isnan(x) or (finite and math.isinf(x)):
        raise GradschedError(f"{where} must be a {'finite number' if finite else 'number, not NaN'}, got {value!r}")
    return x


def _integer(where: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    x = _real(where, value, "a whole number")
    if not x.is_integer():
        raise GradschedError(f"{where} must be a whole number, got {value!r}")
    return int(x)


def _in_range(where: str, option: Option, x: float) -> None:
    lo, hi = option.low, option.high
    why = f" ({option.why})" if option.why else ""
    if lo is not None and (x < lo or (option.low_open and x == lo)):
        bound = f"above {lo:g}" if option.low_open else f"at least {lo:g}"
        raise GradschedError(f"{where} must be {bound}{_upto(option)}{why}, got {x:g}")
    if hi is not None and (x > hi or (option.high_open and x == hi)):
        raise GradschedError(f"{where} must be {_below(option)}{why}, got {x:g}")


def _below(option: Option) -> str:
    return f"below {option.high:g}" if option.high_open else f"at most {option.high:g}"


def _upto(option: Option) -> str:
    return "" if option.high is None else f" and {_below(option)}"


def _strategies(where: str, value: Any, known: list[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        names = [s.strip() for s in value.split(",") if s.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        names = list(value)
    else:
        raise GradschedError(f"{where} must be strategy names (a comma-separated string or a list), got {value!r}")
    for name in names:
        if name not in known:
            raise GradschedError(f"{where}: unknown strategy {name!r}; known: {', '.join(known)}")
    return tuple(names)
