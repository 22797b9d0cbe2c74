"""What one collective costs: a line, optionally a measured table (``CollectiveCost``).

Each collective has an alpha-beta line ``T(s) = alpha + beta * s`` fitted by least
squares to measured ``(bytes, seconds)`` points, and optionally the measured table
itself.  Inside the table's range the table wins, interpolated piecewise-linearly,
because real curves have protocol switches that no single line fits (B-Caffe's
OSU measurements jump 4x between 8 and 12 KiB).  Outside it, the line.

Also here: extrapolating a cost to another number of ranks (ring or tree formulas,
docs/cost-model.md), what the two phases cost where not timed (ratios over the all-reduce: the
all-to-alls' and, from the runtime's ring threshold, whose home this is, the ring's), the
arithmetic the two-level model needs (a weighted sum of costs, the cheaper of two costs at every
size, a step between two lines), and reading a ``collectives``/``points`` pair from a file (the
top level of gradsched.cluster/1 and each level of its topology share it).  Torch-free and
format-free: gradsched.cluster and gradsched.topology build on it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from gradsched import _validate as v
from gradsched.errors import FormatError, GradschedError, InternalError

COLLECTIVES = ("allreduce", "allgather", "reducescatter")
PER_RANK = ("allgather", "reducescatter")  # sized by each rank's part (the whole buffer is world_size times it)
NODE_STEPS = ("reduce", "broadcast")  # measured inside a node only: the hierarchical all-reduce's first and last steps


class _Table:
    """The measured table's arrays, which :class:`CollectiveCost` sets in ``__post_init__`` where it has
    one: declared on a plain base class so that they are attributes for the type checker, not fields
    (not compared, hashed, printed or serialised)."""

    _xs: np.ndarray  # bytes, sorted
    _ys: np.ndarray  # seconds
    _first: float  # what the smallest size costs


@dataclass(frozen=True)
class CollectiveCost(_Table):
    """Cost of one collective at one world size: a line, optionally a measured table."""

    alpha_s: float
    beta_s_per_byte: float
    points: tuple[tuple[float, float], ...] | None = None  # sorted by bytes
    # The line of the world size the table was measured at; set when this cost was
    # extrapolated to another size: table values are then scaled by line / table_line.
    table_line: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.points is not None:
            object.__setattr__(self, "_xs", np.array([p[0] for p in self.points], dtype=float))
            object.__setattr__(self, "_ys", np.array([p[1] for p in self.points], dtype=float))
            # what the table's smallest size costs: below it the line never costs more
            object.__setattr__(self, "_first", float(self._ys[0] * self._table_scale(self._xs[0])))

    def time_s(self, nbytes: float) -> float:
        """Seconds to run the collective on ``nbytes`` (0 bytes cost nothing): the table within its
        sizes, the line beyond them; below the table's smallest size the line, but never more than
        that size costs (a fitted line can lie above the table's first point)."""
        if nbytes <= 0:
            return 0.0
        line = self.alpha_s + self.beta_s_per_byte * nbytes
        if self.points is None or nbytes > self._xs[-1]:
            return line
        if nbytes >= self._xs[0]:
            return float(np.interp(nbytes, self._xs, self._ys) * self._table_scale(nbytes))
        return min(line, self._first)

    def times_s(self, nbytes: np.ndarray | Sequence[float]) -> np.ndarray:
        """Vectorised :meth:`time_s`."""
        s = np.asarray(nbytes, dtype=float)
        out = self.alpha_s + self.beta_s_per_byte * s
        if self.points is not None:
            inside = (s >= self._xs[0]) & (s <= self._xs[-1])
            out = np.where(inside, np.interp(s, self._xs, self._ys) * self._table_scale(s), out)
            out = np.where(s < self._xs[0], np.minimum(out, self._first), out)
        return np.where(s <= 0, 0.0, out)

    def _table_scale(self, nbytes: Any) -> Any:
        if self.table_line is None:
            return 1.0
        a0, b0 = self.table_line
        before = a0 + b0 * nbytes
        return np.where(before > 0, (self.alpha_s + self.beta_s_per_byte * nbytes) / np.maximum(before, 1e-300), 1.0)

    @classmethod
    def fit(cls, points: Iterable[tuple[float, float]], *, keep_table: bool = True,
            envelope: bool = False, split: bool = True) -> "CollectiveCost":
        """Least-squares alpha-beta line through measured points (alpha, beta >= 0).

        ``envelope``: read the points through their split and lower monotone envelopes
        first (:func:`split_envelope`, :func:`monotone_envelope`), for stream-timed
        measurements whose noise only adds time; ``split=False``: the monotone one only
        (:func:`fit_measured`)."""
        table = sorted((float(b), float(t)) for b, t in points)
        if envelope:
            sizes = [b for b, _ in table]
            times = [t for _, t in table]
            table = list(zip(sizes, monotone_envelope(split_envelope(sizes, times) if split else times).tolist()))
        alpha, beta = fit_line(table)
        return cls(alpha, beta, tuple(table) if keep_table else None)

    def to_dict(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}


def fit_measured(collective: str, points: Iterable[tuple[float, float]]) -> "CollectiveCost":
    """A collective's cost from stream-timed measurements (``gradsched netbench``, the bench's network table):
    through the split and monotone envelopes, but a per-rank-sized collective (:data:`PER_RANK`) through the
    monotone one only.

    The split envelope caps a size at the time of smaller ones carrying its bytes one after another; gloo's
    reduce-scatter (an all-to-all and a local sum) and all-gather take systematically longer per byte at
    large sizes, and the cap priced them at the small sizes' rate: on 2 testbed hosts at 1 Gbit/s,
    reduce-scatter 16 MiB a rank measured 296 ms, capped at 174 ms (64 times 256 KiB's 2.7 ms), and
    ResNet-50's ``dear`` plan was predicted 1114 ms; it ran 1666-1814 ms under ``gradsched train`` with the
    same plan, and 1710 ms is its prediction on the measured tables (docs/notes/2026-12-decoupled.md)."""
    return CollectiveCost.fit(points, envelope=True, split=collective not in PER_RANK)


def monotone_envelope(seconds: Iterable[float]) -> np.ndarray:
    """Times measured at increasing sizes, each lowered to the smallest time of any larger size.

    A collective never needs longer for fewer bytes (it could pad them to the larger
    size), so where a measurement's noise only adds time (a thread that waited for a core,
    a rank that left the barrier late), a time above a larger size's is noise and the
    lower envelope is the robust reading.  ``gradsched netbench`` reads its own
    measurements so (docs/cost-model.md); a table given in a cluster file is used as it
    is (the bundled OSU tables dip by up to 17% where MPI switches algorithms)."""
    ys = np.asarray(list(seconds), dtype=float)
    return np.minimum.accumulate(ys[::-1])[::-1] if ys.size else ys


def split_envelope(sizes: list[float], seconds: Iterable[float]) -> list[float]:
    """Times measured at increasing sizes, each capped at ``ceil(s / s') * t(s')`` for every smaller size ``s'``.

    A collective of ``s`` bytes never needs longer than the ``ceil(s / s')`` collectives
    of a smaller measured size that would carry its bytes one after another, when each
    size was timed in a stream of back-to-back operations (as ``gradsched netbench``
    times).  A time above that is noise that only adds time: a TCP retransmission, a
    stalled rank.  Measured: 8 testbed hosts at 250 Mbit/s, 1 MiB timed 150 ms against
    31 ms for 512 KiB and 124 ms for 2 MiB; capped, 62 ms, and usbyte's 64 operations
    (a dozen of 0.5-2 MiB) were predicted 0.9% over their measured 922 ms instead of
    9.9% over (that run re-simulated: ``python benchmarks/resimulate.py --rev cc5d228``;
    docs/cost-model.md).  Tables timed one operation at a time after an idle pause do
    not obey it (a token bucket's burst or TCP's restarted window makes one operation
    cheaper than its share of a stream), so a table given in a cluster file is used as it is."""
    ys = [float(t) for t in seconds]
    for i, size in enumerate(sizes):
        for j in range(i):
            if 0 < sizes[j] < size:
                ys[i] = min(ys[i], math.ceil(size / sizes[j]) * ys[j])
    return ys


def fit_line(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Fit ``t = alpha + beta * s`` by least squares, clamping both to be non-negative.

    Relative residuals are minimised (each point weighted by 1/t), so small messages,
    where alpha dominates, count as much as large ones."""
    pts = np.array(list(points), dtype=float)
    if pts.ndim != 2 or len(pts) < 2:
        raise GradschedError("fitting a cost line needs at least two (bytes, seconds) points")
    s, t = pts[:, 0], pts[:, 1]
    w = 1.0 / np.maximum(t, 1e-12)
    a = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if beta < 0:
        alpha, beta = float(np.mean(t)), 0.0
    if alpha < 0:  # refit through the origin
        beta = float(np.sum(s * t * w * w) / np.sum(s * s * w * w))
        alpha = 0.0
    return float(alpha), float(beta)




def with_line(base: CollectiveCost, alpha_s: float, beta_s_per_byte: float) -> CollectiveCost:
    """``base`` moved to the line ``alpha + beta * s``; its table, if any, is scaled size by size
    by the ratio of the new line to the line it was measured with (it keeps its shape)."""
    if base.points is None:
        return CollectiveCost(alpha_s, beta_s_per_byte)
    table_line = base.table_line or (base.alpha_s, base.beta_s_per_byte)
    return CollectiveCost(alpha_s, beta_s_per_byte, base.points, table_line)


def extrapolate(base: CollectiveCost, collective: str, algorithm: str, p0: int, p: int) -> CollectiveCost:
    """``base``, measured at ``p0`` ranks, at ``p`` ranks by the ring (or tree) formulas."""
    if p < 1:
        raise GradschedError(f"world size must be at least 1, got {p}")
    if p == p0:
        return base
    if p == 1:
        return CollectiveCost(0.0, 0.0)
    if p0 == 1:
        raise GradschedError("a cost measured on 1 rank cannot be extrapolated to more ranks")
    ka, kb = extrapolation_ratios(collective, algorithm, p0, p)
    return with_line(base, base.alpha_s * ka, base.beta_s_per_byte * kb)


def extrapolation_ratios(collective: str, algorithm: str, p0: int, p: int) -> tuple[float, float]:
    """How alpha and beta scale from ``p0`` to ``p`` ranks (ring or tree formulas)."""
    if collective in PER_RANK:
        k = (p - 1) / (p0 - 1)
        return k, k
    if algorithm == "tree":
        return math.log2(p) / math.log2(p0), 1.0
    return (p - 1) / (p0 - 1), ((p - 1) / p) / ((p0 - 1) / p0)


# What the runtime's reduce-scatter and all-gather (gradsched.torch.runtime.decoupled: gloo's in pieces of at most
# 512 KiB a rank on 8-thread side groups) cost a byte over half the all-reduce's, where the network table did not
# time them: {backend: ((ranks, (reducescatter, allgather)), ...)}, read at the largest rank count at or below the
# cluster's (docs/cost-model.md, "Two phases not measured"; docs/notes/2026-12-decoupled.md, "dear8").
# 2 ranks: the medians of five bench tables that timed them (1 Gbit/s testbed, since the pieces); 4: one netbench
# (4 Gbit/s testbed); 8: what re-predicted the six stored 8-host dear plans best (benchmarks/dear_trials.py, median
# |error| 11.5%) on their tables' lines refitted below 2 MiB (38-42 ns/B, where the bench's lines, fitted up to the
# model's size and anchored to its probe, have 54-57): a cluster file without the field keeps it (err10).
DERIVED_PHASE_RATIOS: dict[str, tuple[tuple[int, tuple[float, float]], ...]] = {
    "gloo": ((2, (1.34, 1.16)), (4, (1.8, 1.3)), (8, (2.0, 2.0))),
}
# The same ratios as measured alone against the same network's all-reduce line (benchmarks/two_phase_ratios.py):
# 8 ranks: netbench on 8 testbed hosts at 250 Mbit/s, the links of the stored 8-host runs (1.56, 1.75); fitted on
# no run.  `gradsched bench` writes them into its cluster (gradsched.jobs.bench.with_phase_ratios) where its table
# did not time the phases: its line is anchored to the rounds' all-reduce, the reading these ratios are taken on
# (the six 8-host dear plans re-predicted so: median |error| 7.3%, worst 17.3%, docs/notes/2026-12-err10.md).
MEASURED_PHASE_RATIOS: dict[str, tuple[tuple[int, tuple[float, float]], ...]] = {
    "gloo": ((2, (1.34, 1.16)), (4, (1.8, 1.3)), (8, (1.56, 1.75))),
}


# The measured ratios as a function of the group's size (its whole bytes; the phase's time at each size, linear in
# the bytes between them, the end's ratio beyond), where one ratio is wrong: {backend: ((ranks, {collective: ((bytes, ratio),
# ...)}), ...)}, read at the largest rank count at or below the cluster's (none below the smallest).  8 ranks: the
# all-to-alls at 8 testbed hosts at 250 Mbit/s, operations one after another, each waited for (as the bench's table
# and netbench time them), over half the same sweep's all-reduce line from 256 KiB (3.6 ms, 60.6 ns/B): 0.74-0.81 at
# 256 KiB, 1.07 at 512 KiB, 1.21-1.28 at 1 MiB (medians of 11, benchmarks/results/gloo_ring_phases_8h_250mbit_a2a12.json);
# from 2 MiB the flat 1.56 and 1.75 (the sweep bracketed them there: 1.80-2.10 one after another, 1.32-1.43 after a
# barrier).  Against the five stored 8-host bench tables that timed the phases, groups of 512 KiB-1 MiB priced so err
# by a median 19.8% (the flat ratios 58.6%), of 64-256 KiB 47.7% (93.3%): benchmarks/phase_ratio_points.py,
# docs/notes/2026-12-a2a12.md.  `gradsched bench` writes them (``derived_phase_ratio_points``,
# gradsched.jobs.bench.with_phase_ratios); a file without the field keeps its flat ratios.
MEASURED_PHASE_RATIO_POINTS: dict[str, tuple[tuple[int, dict[str, tuple[tuple[int, float], ...]]], ...]] = {
    "gloo": ((8, {"reducescatter": ((256 << 10, 0.81), (512 << 10, 1.07), (1 << 20, 1.28), (2 << 20, 1.56)),
                  "allgather": ((256 << 10, 0.74), (512 << 10, 1.07), (1 << 20, 1.21), (2 << 20, 1.75))}),),
}


def measured_phase_ratio_points(backend: str, world_size: int,
                                collective: str) -> tuple[tuple[int, float], ...] | None:
    """:data:`MEASURED_PHASE_RATIO_POINTS`' ``(group bytes, ratio)`` for ``collective`` on ``backend`` at the
    largest listed rank count at or below ``world_size``; None where none is listed (fewer ranks: the flat
    ratio)."""
    below = [points for p, points in MEASURED_PHASE_RATIO_POINTS.get(backend, ()) if p <= world_size]
    return below[-1].get(collective) if below else None


def _ratio_at(table: tuple[tuple[int, tuple[float, float]], ...], world_size: int, collective: str) -> float:
    below = [r for p, r in table if p <= world_size]
    ratios = below[-1] if below else table[0][1]
    return ratios[0] if collective == "reducescatter" else ratios[1]


def derived_phase_ratio(backend: str, world_size: int, collective: str) -> float:
    """:data:`DERIVED_PHASE_RATIOS`' ratio for ``collective`` (``reducescatter`` or ``allgather``) on ``backend`` at
    ``world_size`` ranks (the largest measured rank count not above it, the smallest below all); 1 on a backend
    with none measured (NCCL's ring phases: half the all-reduce each)."""
    table = DERIVED_PHASE_RATIOS.get(backend)
    return _ratio_at(table, world_size, collective) if table else 1.0


def measured_phase_ratio(backend: str, world_size: int, collective: str) -> float | None:
    """:data:`MEASURED_PHASE_RATIOS`' ratio for ``collective`` on ``backend`` at ``world_size`` ranks, read as
    :func:`derived_phase_ratio` reads its table; None on a backend with none measured."""
    table = MEASURED_PHASE_RATIOS.get(backend)
    return _ratio_at(table, world_size, collective) if table else None


# gloo beyond two ranks: the runtime (gradsched.torch.runtime.decoupled.uses_ring) sends a reduce-scatter or all-gather
# group of at least this many bytes (the whole group, each rank's buffer) as a ring of point-to-point messages, smaller
# groups as all-to-alls; ``GRADSCHED_RING_MIN_BYTES`` overrides it (a huge value: no rings).  8 hosts at 250 Mbit/s,
# x half the all-reduce (reduce-scatter / all-gather): 4 and 16 MiB rings 1.08/1.04 and 1.00/1.00 against the
# all-to-alls' 2.00/1.57 and 1.80/1.39; at 2 MiB 1.37/1.80 against 1.42/1.40, below it the all-to-alls faster (a ring
# pays p - 1 start-ups; benchmarks/results/gloo_ring_phases_8h_250mbit.json).
RING_MIN_BYTES = 4 << 20
RING_MIN_BYTES_ENV = "GRADSCHED_RING_MIN_BYTES"
NO_RING_BYTES = 1 << 62  # a threshold no group reaches: all-to-alls at every size (runs made before the rings)
# What a ring phase costs a byte over half the all-reduce's (the ratios above price the all-to-alls), where the
# table did not time it: {backend: ((ranks, (reducescatter, allgather)), ...)}, read as those are.  8 ranks: the
# slopes of the 4-16 MiB rings over half the all-reduce's in the sweep above (1.00, 1.01:
# benchmarks/two_phase_ratios.py, results/two_phase_ring_ratios.json), its 16 MiB times (1.00, 1.00), and the 8-host
# VGG-16 bench whose table timed them (0.98 each, emulate_papers_vgg16_8h_ring10.json): 1.0, a ring all-reduce's
# half, which is also what fewer ranks take (not measured there).
RING_PHASE_RATIOS: dict[str, tuple[tuple[int, tuple[float, float]], ...]] = {
    "gloo": ((8, (1.0, 1.0)),),
}


def ring_min_bytes() -> int:
    """The group size (bytes) from which gloo's two phases go as rings beyond two ranks: ``GRADSCHED_RING_MIN_BYTES``
    where set (the runtime reads it at each phase), else :data:`RING_MIN_BYTES`."""
    raw = os.environ.get(RING_MIN_BYTES_ENV)
    return int(raw) if raw else RING_MIN_BYTES


def runs_ring(world_size: int, group_bytes: float, nccl: bool, least: int | None = None) -> bool:
    """Whether the runtime sends a two-phase group of ``group_bytes`` as a ring: not on NCCL (one collective there),
    beyond two ranks, and at least ``least`` bytes (default :func:`ring_min_bytes`)."""
    return not nccl and world_size > 2 and group_bytes >= (ring_min_bytes() if least is None else least)


def ring_phase_ratio(backend: str, world_size: int, collective: str) -> float | None:
    """:data:`RING_PHASE_RATIOS`' ratio for ``collective`` on ``backend`` at ``world_size`` ranks (read as
    :func:`derived_phase_ratio` reads its table); None where no ring runs (two ranks or fewer) or none is listed
    for the backend (NCCL: its phases are one collective at every size)."""
    table = RING_PHASE_RATIOS.get(backend)
    return _ratio_at(table, world_size, collective) if table and world_size > 2 else None


def switched_at(below: CollectiveCost, above: CollectiveCost, at_bytes: int) -> CollectiveCost:
    """One cost of whole numbers of bytes that is the line ``below`` under ``at_bytes`` and ``above`` from it: a table
    of three points (1 byte, half a byte under ``at_bytes``, ``at_bytes``; ``below`` is straight up to the second)
    with ``above``'s line beyond, so that every consumer of a cost (sums, the simulator, the planners, the bound)
    keeps the step.  ``above`` where ``at_bytes`` is 1 or less; ``below`` where it is 2**62 or more (no size priced
    reaches it: "no rings").  Both must be lines (no table)."""
    if below.points is not None or above.points is not None:
        raise InternalError("switched_at takes two lines")
    if at_bytes <= 1:
        return above
    if at_bytes >= NO_RING_BYTES:
        return below
    under = at_bytes - 0.5
    points = ((1.0, below.time_s(1.0)), (under, below.time_s(under)), (float(at_bytes), above.time_s(at_bytes)))
    return CollectiveCost(above.alpha_s, above.beta_s_per_byte, points)


def table_then_line(below: CollectiveCost, above: CollectiveCost, at_bytes: int) -> CollectiveCost:
    """:func:`switched_at` for a ``below`` that may be a table: ``below`` (its points and its line between them)
    under ``at_bytes``, the line ``above`` from it.  ``below`` where ``at_bytes`` is 2**62 or more."""
    if below.points is None:
        return switched_at(below, above, at_bytes)
    if at_bytes >= NO_RING_BYTES:
        return below
    if at_bytes <= 1:
        return CollectiveCost(above.alpha_s, above.beta_s_per_byte)
    under = at_bytes - 0.5
    kept = [(float(b), float(t)) for b, t in below.points if b < under]
    points = (*kept, (under, below.time_s(under)), (float(at_bytes), above.time_s(at_bytes)))
    return CollectiveCost(above.alpha_s, above.beta_s_per_byte, points)


def per_total(cost: CollectiveCost, world_size: int) -> CollectiveCost:
    """A per-rank-sized cost (``allgather``, ``reducescatter``: ``s`` is each rank's part) as a cost of
    the whole buffer, ``world_size * s`` bytes: the line's slope and the table's sizes scaled."""
    p = float(world_size)
    if cost.points is None:
        return CollectiveCost(cost.alpha_s, cost.beta_s_per_byte / p)
    sizes = np.array([x for x, _ in cost.points])
    return CollectiveCost(cost.alpha_s, cost.beta_s_per_byte / p,
                          tuple(zip((sizes * p).tolist(), cost.times_s(sizes).tolist())))


def ring_link(allreduce: CollectiveCost, p: int) -> tuple[float, float]:
    """Per-link latency ``a`` and inverse bandwidth ``b`` of a ring all-reduce line measured at
    ``p`` ranks: its line is ``2(p-1) a + 2(p-1)/p * s * b`` (``(0, 0)`` for one rank: no link)."""
    if p <= 1:
        return 0.0, 0.0
    return allreduce.alpha_s / (2 * (p - 1)), allreduce.beta_s_per_byte * p / (2 * (p - 1))


def combine(terms: Iterable[tuple[float, CollectiveCost]]) -> CollectiveCost:
    """``sum(w * cost)``: the line is the weighted sum of the lines; where any term has a table,
    the sum is tabulated at the union of their sizes (so every table's shape is kept) and
    interpolated between them, as any table is."""
    terms = [(w, c) for w, c in terms if w != 0]
    alpha = sum(w * c.alpha_s for w, c in terms)
    beta = sum(w * c.beta_s_per_byte for w, c in terms)
    xs = sorted({float(x) for _, c in terms if c.points is not None for x, _ in c.points})
    if not xs:
        return CollectiveCost(alpha, beta)
    grid = np.array(xs)
    ys = sum(w * c.times_s(grid) for w, c in terms)
    return CollectiveCost(alpha, beta, tuple(zip(xs, np.asarray(ys, dtype=float).tolist())))


def cheaper(a: CollectiveCost, b: CollectiveCost) -> CollectiveCost:
    """The lower envelope ``min(a, b)`` at every size, as one cost.

    ``a`` or ``b`` itself where one is never above the other (checked at 1 byte, every size
    of either table and every size where the two cross); else a :class:`CheaperOf` whose
    times are exactly ``min(a, b)`` and whose line is that of the one with the smaller
    start-up (what small operations pay: the figure MG-WFBP's merge rule and US-Byte's
    block sizing weigh)."""
    grid = _crossing_grid(a, b)
    ta, tb = a.times_s(grid), b.times_s(grid)
    large = a if (a.beta_s_per_byte, a.alpha_s) <= (b.beta_s_per_byte, b.alpha_s) else b
    if np.all(ta <= tb) and large is a:
        return a
    if np.all(tb <= ta) and large is b:
        return b
    small = a if (a.alpha_s, a.beta_s_per_byte) <= (b.alpha_s, b.beta_s_per_byte) else b
    return CheaperOf(small.alpha_s, small.beta_s_per_byte, first=a, second=b)


@dataclass(frozen=True)
class CheaperOf(CollectiveCost):
    """``min(first, second)`` at every size (:func:`cheaper`): what a planner that may run each
    operation as either of two collectives pays.  Times are the exact minimum; ``alpha_s`` and
    ``beta_s_per_byte`` are the line of the one with the smaller start-up (a planner's start-up
    figure), not used for times."""

    first: CollectiveCost | None = None  # defaults only because the fields above have them: both are required
    second: CollectiveCost | None = None

    def __post_init__(self) -> None:
        if self.first is None or self.second is None:
            raise InternalError("CheaperOf needs both costs (first and second)")
        super().__post_init__()

    def time_s(self, nbytes: float) -> float:
        a, b = self.first, self.second
        if a is None or b is None:  # never: __post_init__ refuses it (mypy's narrowing)
            raise InternalError("CheaperOf needs both costs (first and second)")
        return min(a.time_s(nbytes), b.time_s(nbytes))

    def times_s(self, nbytes: np.ndarray | Sequence[float]) -> np.ndarray:
        a, b = self.first, self.second
        if a is None or b is None:
            raise InternalError("CheaperOf needs both costs (first and second)")
        if a.points is None and b.points is None:  # two lines: the common case, kept cheap
            s = np.asarray(nbytes, dtype=float)
            out = s * a.beta_s_per_byte
            out += a.alpha_s
            other = s * b.beta_s_per_byte
            other += b.alpha_s
            np.minimum(out, other, out=out)
            out[s <= 0] = 0.0
            return out
        return np.minimum(a.times_s(nbytes), b.times_s(nbytes))


def _crossing_grid(a: CollectiveCost, b: CollectiveCost) -> np.ndarray:
    """Sizes where ``a - b`` may change sign: 1 byte, the tables' sizes, and the crossings of a and b
    between consecutive ones and of their lines beyond them."""
    xs = {1.0}
    for c in (a, b):
        if c.points is not None:
            xs.update(float(x) for x, _ in c.points)
    dbeta = a.beta_s_per_byte - b.beta_s_per_byte
    if dbeta != 0:
        x = (b.alpha_s - a.alpha_s) / dbeta
        if x > 1.0:
            xs.add(x)
    grid = np.array(sorted(xs))
    d = a.times_s(grid) - b.times_s(grid)
    flip = np.nonzero(d[:-1] * d[1:] < 0)[0]
    cross = grid[flip] + (grid[flip + 1] - grid[flip]) * d[flip] / (d[flip] - d[flip + 1])
    return np.unique(np.concatenate([grid, cross]))


def collectives_from_dict(data: Any, source: str, where: str = "",
                          known: tuple[str, ...] = COLLECTIVES) -> dict[str, CollectiveCost]:
    """The ``collectives`` (lines) and optional ``points`` (tables) of ``data``, checked field by
    field; ``where`` is the dotted path of ``data`` in the file ("" for the top level);
    ``known``: the collective names allowed there."""
    raw = v.require(data, "collectives", source, where)
    if not isinstance(raw, dict) or not raw:
        raise FormatError(source, _at(where, "collectives"), "must be a non-empty JSON object")
    raw_points = data.get("points", {}) or {}
    if not isinstance(raw_points, dict):
        raise FormatError(source, _at(where, "points"),
                          "must be a JSON object of collective name to [[bytes, seconds], ...]")
    collectives = {}
    for name, c in raw.items():
        at = _at(where, f"collectives.{name}")
        if name not in known:
            raise FormatError(source, at, f"unknown collective; known: {', '.join(known)}")
        if isinstance(c, dict):
            v.check_fields(c, ("alpha_s", "beta_s_per_byte"), source, at)
        alpha = v.number(v.require(c, "alpha_s", source, at), source, f"{at}.alpha_s", maximum=v.MAX_SECONDS)
        beta = v.number(v.require(c, "beta_s_per_byte", source, at), source, f"{at}.beta_s_per_byte", maximum=1.0)
        pts = raw_points.get(name)
        table = None if pts is None else _points(pts, source, _at(where, f"points.{name}"))
        collectives[name] = CollectiveCost(alpha, beta, table)
    for name in raw_points:
        if name not in collectives:
            raise FormatError(source, _at(where, f"points.{name}"), "has a table but no line in 'collectives'")
    return collectives


def collectives_to_dict(collectives: dict[str, CollectiveCost]) -> dict[str, Any]:
    """``{"collectives": {...}, "points": {...}}`` (points only where there is a table)."""
    out: dict[str, Any] = {"collectives": {k: c.to_dict() for k, c in collectives.items()}}
    points = {k: [list(p) for p in c.points] for k, c in collectives.items() if c.points}
    if points:
        out["points"] = points
    return out


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _points(raw: Any, source: str, where: str) -> tuple[tuple[float, float], ...]:
    pts = []
    for j, p in enumerate(v.array(raw, source, where)):
        if not isinstance(p, list) or len(p) != 2:
            raise FormatError(source, f"{where}[{j}]", "must be a [bytes, seconds] pair")
        b = v.number(p[0], source, f"{where}[{j}][0]", positive=True, maximum=v.MAX_BYTES)
        t = v.number(p[1], source, f"{where}[{j}][1]", maximum=v.MAX_SECONDS)
        pts.append((b, t))
    if len(pts) < 2:
        raise FormatError(source, where, "a measured table needs at least two points")
    pts.sort()
    if len({b for b, _ in pts}) != len(pts):
        raise FormatError(source, where, "has two points for the same size")
    return tuple(pts)
