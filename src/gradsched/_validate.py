"""Small checks shared by the file formats (profile, cluster, plan).

Each helper takes the source name (a path or '<dict>') and a dotted field path so
that the error says exactly where the problem is.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

from gradsched import _files
from gradsched.errors import FormatError
from gradsched.options import Option, check

# Bounds that keep every sum and product the planners and the simulator form finite and
# exact (docs/formats.md, "Limits"): a time of a billion seconds or a tensor of 2**53
# bytes is a typo, not a measurement.
MAX_SECONDS = 1e9
MAX_BYTES = 2**53  # integers up to this are exact in a float64
MAX_WORLD_SIZE = 2**24
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: a collective timeout beyond it (or inf, NaN) is a typo
MISSPELLING_CUTOFF = 0.8  # difflib ratio at or above which an unknown field is taken for a known one misspelt


def read_json(path: str | Path, *, max_bytes: int | None = None) -> Any:
    """Read a JSON file (a regular file, size- and depth-limited: :mod:`gradsched._files`); every
    problem, from a missing file to a named pipe or a UTF-16 export, is a FormatError."""
    return _files.read_json(path, max_bytes=max_bytes or _files.MAX_INPUT_BYTES)


def write_json(path: str | Path, data: Any) -> None:
    _files.write_text(path, json.dumps(data, indent=1) + "\n")


TIMEOUT_S = Option("timeout_s", float, 300.0, low=0, low_open=True, high=MAX_TIMEOUT_S,
                   doc="seconds a collective may take before it is an error",
                   why="seconds, a week at most: inf waited for ever, then blamed a dead peer")
"""The collective timeout's declaration: the runtime's ``timeout_s`` and ``--timeout-s`` of bench and train."""


def timeout_s(value: Any, name: str = "timeout_s") -> float:
    """A timeout in seconds as :data:`TIMEOUT_S` declares it (finite, above 0, a week at most); else a
    one-line GradschedError naming ``name``."""
    return float(check(name, TIMEOUT_S, value))


def require(obj: Any, key: str, source: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise FormatError(source, where or "<root>", "must be a JSON object")
    if key not in obj:
        raise FormatError(source, _join(where, key), "missing field")
    return obj[key]


def check_format(obj: Any, expected: str, source: str) -> None:
    value = require(obj, "format", source, "")
    if value != expected:
        raise FormatError(source, "format", f"unknown format version {value!r}; expected {expected!r}")


def number(value: Any, source: str, field: str, *, positive: bool = False, allow_zero: bool = True,
           maximum: float | None = None) -> float:
    """A finite, non-negative number (strictly positive if ``positive``), at most ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FormatError(source, field, f"must be a number, got {value!r}")
    x = float(value)
    if math.isnan(x):
        raise FormatError(source, field, "is NaN")
    if math.isinf(x):
        raise FormatError(source, field, "is infinite")
    if x < 0:
        raise FormatError(source, field, f"is negative ({x})")
    if (positive or not allow_zero) and x == 0:
        raise FormatError(source, field, "must be greater than zero")
    if maximum is not None and x > maximum:
        raise FormatError(source, field, f"is {x:g}, above the largest this field takes ({maximum:g})")
    return x


def integer(value: Any, source: str, field: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise FormatError(source, field, f"must be an integer, got {value!r}")
    if value < minimum:
        if minimum == 1:
            raise FormatError(source, field, f"must be positive, got {value}")
        raise FormatError(source, field, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise FormatError(source, field, f"is {value:g}, above the largest this field takes ({maximum:g})")
    return value


def string(value: Any, source: str, field: str) -> str:
    if not isinstance(value, str):
        raise FormatError(source, field, f"must be a string, got {value!r}")
    return value


def array(value: Any, source: str, field: str) -> list:
    if not isinstance(value, list):
        raise FormatError(source, field, "must be a JSON list")
    return value


def numbers(value: Any, source: str, field: str, known: tuple[str, ...]) -> dict[str, float]:
    """A JSON object of optional numbers (finite, non-negative), each named in ``known``."""
    if not isinstance(value, dict):
        raise FormatError(source, field, f"must be a JSON object with some of {', '.join(known)}")
    for key in value:
        if key not in known:
            raise FormatError(source, f"{field}.{key}", f"unknown field; known: {', '.join(known)}")
    return {key: number(x, source, f"{field}.{key}") for key, x in value.items()}


def check_fields(obj: dict, known: tuple[str, ...] | set[str], source: str, where: str) -> None:
    """Reject a field of ``obj`` that is not in ``known`` but spelled like one (a misspelling).

    The rule (docs/formats.md, "Unknown fields"): a field gradsched does not know is kept
    as it is (tools add their own, e.g. ``source``), unless its name is within
    ``MISSPELLING_CUTOFF`` of a known one (``contension``, ``other``): then it is almost
    certainly a misspelt field whose value would be silently ignored."""
    for key in obj:
        if key in known or not isinstance(key, str):
            continue
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=MISSPELLING_CUTOFF)
        if close:
            raise FormatError(source, _join(where, key), f"unknown field; did you mean {close[0]!r}? (a field "
                                                         "spelled like a known one is taken for a misspelling)")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
