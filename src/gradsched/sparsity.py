"""Top-k's ``k``: how many elements one rank sends of a ``topk-allgather`` operation.

One definition, read by the planners (``topk``, ``omgs``), the simulator, the runtime's
sparse operations and PyTorch DDP's comm hooks, so that a plan, its simulation and its
run send the same number of elements::

    k = min(numel, max(1, ceil(density * numel)))

rounded up (a density never sends less than it says), at least one element, never
more than the tensor holds.  A product within floating-point noise of an integer
counts as that integer (``0.07 * 100`` is 7, not 8).
"""

from __future__ import annotations

import math

from gradsched.options import Option

INDEX_BYTES = 4
"""Bytes of one index on the wire (int32), sent beside each selected value."""

_NOISE = 1e-12  # relative: far above a float product's rounding error, far below one element


def k_of(density: float, numel: int) -> int:
    """Elements sent per rank of ``numel`` at ``density`` (in (0, 1]): ``ceil(density * numel)``,
    at least 1 and at most ``numel``."""
    x = density * numel
    return min(numel, max(1, math.ceil(x - _NOISE * max(1.0, x))))


def sent_bytes(density: float, numel: int, element_bytes: int) -> int:
    """Bytes one rank contributes to the all-gather: ``k`` values and ``k`` int32 indices."""
    return k_of(density, numel) * (element_bytes + INDEX_BYTES)


DENSITY = Option("density", float, 0.001, low=0, low_open=True, high=1,
                 doc="fraction of gradient elements each rank sends (top-k)")
"""The density's declaration: in (0, 1]; each user sets its own default (``dataclasses.replace``)."""
