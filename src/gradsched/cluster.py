"""Cluster: what a collective costs on one network (``gradsched.cluster/1``).

Each collective has an alpha-beta line ``T(s) = alpha + beta * s`` fitted by least
squares to measured ``(bytes, seconds)`` points, and optionally the measured table
itself.  Inside the table's range the table wins, interpolated piecewise-linearly,
because real curves have protocol switches that no single line fits (B-Caffe's
OSU measurements jump 4x between 8 and 12 KiB).  Outside it, the line.

Sizes: for ``allreduce`` ``s`` is the size of the reduced buffer; for ``allgather``
it is each rank's contribution (the output is ``world_size * s``).

Other world sizes are extrapolated from the ring formulas (docs/cost-model.md):
a ring all-reduce over P ranks costs ``2(P-1) a + 2(P-1)/P * s * b`` and a ring
all-gather ``(P-1) a + (P-1) * s * b`` for link latency ``a`` and inverse bandwidth
``b``; with ``"algorithm": "tree"`` the all-reduce start-up grows as ``log2 P``
instead.  A measured table is scaled, size by size, by the ratio of the new line
to the line of the world size it was measured at, so it keeps its shape (protocol
switches) and meets the ring formulas at both ends.
Every cost is closed-form, so 1,024 workers cost the same to simulate as 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from gradsched import _validate as v
from gradsched.errors import FormatError, GradschedError

FORMAT = "gradsched.cluster/1"
COLLECTIVES = ("allreduce", "allgather")
CONTENTION_FIELDS = ("compute_slowdown", "comm_slowdown", "busy_latency_s", "op_latency_s")  # docs/simulator.md, "Contention"
FIELDS = ("format", "world_size", "backend", "algorithm", "collectives", "points")
# Optional fields gradsched reads or its tools write (kept verbatim; docs/formats.md):
# known, so that a misspelling of one is caught (_validate.check_fields).
OPTIONAL_FIELDS = ("contention", "topk_selection_s_per_nlogn", "source", "measured_by", "device", "reps", "host",
                   "measured_points", "startup_measured_points", "samples")


@dataclass(frozen=True, slots=True)
class Contention:
    """How compute and communication slow each other on this machine (the cluster's optional
    ``contention``; docs/simulator.md, "Contention").  A figure left out is 0: no effect."""

    compute_slowdown: float = 0.0  # compute runs 1 + this times slower while a collective is in flight
    comm_slowdown: float = 0.0  # a collective runs 1 + this times slower while compute runs
    busy_latency_s: float = 0.0  # more per collective that overlaps compute
    op_latency_s: float = 0.0  # more per collective, compute or not

    def __post_init__(self) -> None:
        for name in CONTENTION_FIELDS:
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise GradschedError(f"contention figure {name} must be a finite non-negative number, got {x!r}; "
                                     "fix the cluster's contention (docs/simulator.md, \"Contention\")")

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in CONTENTION_FIELDS}

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>", where: str = "contention") -> "Contention":
        """From the JSON object (every figure optional), checked field by field."""
        return cls(**v.numbers(data, source, where, CONTENTION_FIELDS))


@dataclass(frozen=True)
class CollectiveCost:
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

    def time_s(self, nbytes: float) -> float:
        """Seconds to run the collective on ``nbytes`` (0 bytes cost nothing)."""
        if nbytes <= 0:
            return 0.0
        if self.points is not None and self._xs[0] <= nbytes <= self._xs[-1]:
            return float(np.interp(nbytes, self._xs, self._ys) * self._table_scale(nbytes))
        return self.alpha_s + self.beta_s_per_byte * nbytes

    def times_s(self, nbytes: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`time_s`."""
        s = np.asarray(nbytes, dtype=float)
        out = self.alpha_s + self.beta_s_per_byte * s
        if self.points is not None:
            inside = (s >= self._xs[0]) & (s <= self._xs[-1])
            out = np.where(inside, np.interp(s, self._xs, self._ys) * self._table_scale(s), out)
        return np.where(s <= 0, 0.0, out)

    def _table_scale(self, nbytes):
        if self.table_line is None:
            return 1.0
        a0, b0 = self.table_line
        before = a0 + b0 * nbytes
        return np.where(before > 0, (self.alpha_s + self.beta_s_per_byte * nbytes) / np.maximum(before, 1e-300), 1.0)

    @classmethod
    def fit(cls, points: Iterable[tuple[float, float]], *, keep_table: bool = True,
            envelope: bool = False) -> "CollectiveCost":
        """Least-squares alpha-beta line through measured points (alpha, beta >= 0).

        ``envelope``: read the points through their lower monotone envelope first
        (:func:`monotone_envelope`), for measurements whose noise only adds time."""
        table = sorted((float(b), float(t)) for b, t in points)
        if envelope:
            table = list(zip([b for b, _ in table], monotone_envelope([t for _, t in table]).tolist()))
        alpha, beta = fit_line(table)
        return cls(alpha, beta, tuple(table) if keep_table else None)

    def to_dict(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}


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


@dataclass(frozen=True)
class Cluster:
    """Collective costs measured (or assumed) at ``world_size`` ranks."""

    world_size: int
    collectives: dict[str, CollectiveCost]
    backend: str = "unknown"
    algorithm: str = "ring"  # how costs extrapolate to other world sizes: ring | tree
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    contention: Contention | None = None  # None: compute and communication overlap for free

    def __post_init__(self) -> None:
        # ``extra={"contention": {...}}`` (how the figures were passed before they had a field)
        # lands in the field, so that the JSON and the simulator see one place.
        if "contention" in self.extra:
            rest = {k: x for k, x in self.extra.items() if k != "contention"}
            raw = self.extra["contention"]
            object.__setattr__(self, "contention", raw if isinstance(raw, Contention) else Contention.from_dict(raw))
            object.__setattr__(self, "extra", rest)

    # ------------------------------------------------------------------ costs
    def cost(self, collective: str, world_size: int | None = None) -> CollectiveCost:
        """The cost model of ``collective`` at ``world_size`` (default: measured size)."""
        base = self._base(collective)
        p = self.world_size if world_size is None else world_size
        if p == self.world_size:
            return base
        if p < 1:
            raise GradschedError(f"world size must be at least 1, got {p}")
        if p == 1:
            return CollectiveCost(0.0, 0.0)
        if self.world_size == 1:
            raise GradschedError("a cluster measured on 1 rank cannot be extrapolated to more ranks")
        ka, kb = _ratios(collective, self.algorithm, self.world_size, p)
        table_line = base.table_line or (base.alpha_s, base.beta_s_per_byte)
        return CollectiveCost(base.alpha_s * ka, base.beta_s_per_byte * kb, base.points,
                              table_line if base.points is not None else None)

    def _base(self, collective: str) -> CollectiveCost:
        if collective in self.collectives:
            return self.collectives[collective]
        if collective == "allgather" and "allreduce" in self.collectives:
            # A ring all-reduce is a reduce-scatter plus an all-gather of the same
            # total size: the all-gather of s bytes per rank costs half the start-up
            # and (P/2) times the per-byte cost of an all-reduce of s bytes.
            ar = self.collectives["allreduce"]
            return CollectiveCost(ar.alpha_s / 2, ar.beta_s_per_byte * self.world_size / 2)
        raise GradschedError(f"cluster has no cost model for {collective!r}; it knows {sorted(self.collectives)}")

    def selection_s(self, numel: int) -> float:
        """Seconds to pick the top-k of ``numel`` gradient elements on the compute device.

        OMGS-SGD's model ``c * n * log2(n)``; ``c`` comes from the cluster file's optional
        ``topk_selection_s_per_nlogn`` (fitted by a microbenchmark) and defaults to the
        OMGS authors' GPU constant 2.19e-10."""
        if numel <= 1:
            return 0.0
        c = float(self.extra.get("topk_selection_s_per_nlogn", 2.19e-10))
        return c * numel * math.log2(numel)

    def at_world_size(self, world_size: int) -> "Cluster":
        """This cluster's costs extrapolated to ``world_size`` ranks."""
        names = set(self.collectives) | {"allgather"}
        return replace(self, world_size=world_size,
                       collectives={c: self.cost(c, world_size) for c in sorted(names)})

    @classmethod
    def alpha_beta(cls, alpha_s: float, beta_s_per_byte: float, world_size: int) -> "Cluster":
        """A cluster whose all-reduce costs ``alpha + beta * s`` at ``world_size``."""
        return cls(world_size, {"allreduce": CollectiveCost(alpha_s, beta_s_per_byte)})

    # -------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "world_size": self.world_size, "backend": self.backend,
                               "collectives": {k: c.to_dict() for k, c in self.collectives.items()}}
        points = {k: [list(p) for p in c.points] for k, c in self.collectives.items() if c.points}
        if points:
            out["points"] = points
        if self.algorithm != "ring":
            out["algorithm"] = self.algorithm
        out.update(self.extra)
        if self.contention is not None:
            out["contention"] = self.contention.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "Cluster":
        v.check_format(data, FORMAT, source)
        v.check_fields(data, FIELDS + OPTIONAL_FIELDS, source, "")
        world = v.integer(v.require(data, "world_size", source, ""), source, "world_size", minimum=1,
                          maximum=v.MAX_WORLD_SIZE)
        backend = v.string(data.get("backend", "unknown"), source, "backend")
        algorithm = v.string(data.get("algorithm", "ring"), source, "algorithm")
        if algorithm not in ("ring", "tree"):
            raise FormatError(source, "algorithm", f"must be 'ring' or 'tree', got {algorithm!r}")
        raw = v.require(data, "collectives", source, "")
        if not isinstance(raw, dict) or not raw:
            raise FormatError(source, "collectives", "must be a non-empty JSON object")
        raw_points = data.get("points", {}) or {}
        if not isinstance(raw_points, dict):
            raise FormatError(source, "points", "must be a JSON object of collective name to [[bytes, seconds], ...]")
        collectives = {}
        for name, c in raw.items():
            where = f"collectives.{name}"
            if name not in COLLECTIVES:
                raise FormatError(source, where, f"unknown collective; known: {', '.join(COLLECTIVES)}")
            if isinstance(c, dict):
                v.check_fields(c, ("alpha_s", "beta_s_per_byte"), source, where)
            alpha = v.number(v.require(c, "alpha_s", source, where), source, f"{where}.alpha_s", maximum=v.MAX_SECONDS)
            beta = v.number(v.require(c, "beta_s_per_byte", source, where), source, f"{where}.beta_s_per_byte",
                            maximum=1.0)
            pts = raw_points.get(name)
            table = None
            if pts is not None:
                table = _points(pts, source, f"points.{name}")
            collectives[name] = CollectiveCost(alpha, beta, table)
        for name in raw_points:
            if name not in collectives:
                raise FormatError(source, f"points.{name}", "has a table but no line in 'collectives'")
        if "topk_selection_s_per_nlogn" in data:
            v.number(data["topk_selection_s_per_nlogn"], source, "topk_selection_s_per_nlogn", maximum=1.0)
        contention = Contention.from_dict(data["contention"], source) if "contention" in data else None
        extra = {k: x for k, x in data.items() if k not in FIELDS and k != "contention"}
        return cls(world, collectives, backend, algorithm, extra, contention)

    @classmethod
    def load(cls, path: str | Path) -> "Cluster":
        return cls.from_dict(v.read_json(path), str(path))

    def save(self, path: str | Path) -> None:
        v.write_json(path, self.to_dict())


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


def _ratios(collective: str, algorithm: str, p0: int, p: int) -> tuple[float, float]:
    """How alpha and beta scale from ``p0`` to ``p`` ranks (ring or tree formulas)."""
    if collective == "allgather":
        k = (p - 1) / (p0 - 1)
        return k, k
    if algorithm == "tree":
        return math.log2(p) / math.log2(p0), 1.0
    return (p - 1) / (p0 - 1), ((p - 1) / p) / ((p0 - 1) / p0)



