"""Small checks shared by the file formats (profile, cluster, plan).

Each helper takes the source name (a path or '<dict>') and a dotted field path so
that the error says exactly where the problem is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gradsched.errors import FormatError


def read_json(path: str | Path) -> Any:
    """Read a JSON file, turning I/O and syntax errors into a FormatError."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FormatError(source, "<file>", f"cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(source, "<json>", f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def write_json(path: str | Path, data: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


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


def number(value: Any, source: str, field: str, *, positive: bool = False, allow_zero: bool = True) -> float:
    """A finite, non-negative number (strictly positive if ``positive``)."""
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
    return x


def integer(value: Any, source: str, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise FormatError(source, field, f"must be an integer, got {value!r}")
    if value < minimum:
        if minimum == 1:
            raise FormatError(source, field, f"must be positive, got {value}")
        raise FormatError(source, field, f"must be at least {minimum}, got {value}")
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
    for key, x in value.items():
        if key not in known:
            raise FormatError(source, f"{field}.{key}", f"unknown field; known: {', '.join(known)}")
    return {key: number(x, source, f"{field}.{key}") for key, x in value.items()}


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
