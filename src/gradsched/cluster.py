"""Cluster: what a collective costs on one network (``gradsched.cluster/1``).

Each collective has an alpha-beta line ``T(s) = alpha + beta * s`` fitted by least
squares to measured ``(bytes, seconds)`` points, and optionally the measured table
itself (:class:`~gradsched.costs.CollectiveCost`).  Inside the table's range the table
wins, interpolated piecewise-linearly, because real curves have protocol switches that
no single line fits (B-Caffe's OSU measurements jump 4x between 8 and 12 KiB).
Outside it, the line.

A cluster may have a ``topology`` (gradsched.topology): nodes x ranks per node, with
a cost inside a node and one between nodes; then the hierarchical all-reduce has a
cost too (``cost("hier-allreduce")``) and :meth:`Cluster.at_topology` extrapolates
both levels.

Sizes: for ``allreduce`` ``s`` is the size of the reduced buffer; for ``allgather``
it is each rank's contribution (the output is ``world_size * s``) and for
``reducescatter`` each rank's part of the result (the input is ``world_size * s``).
Either, when not measured, is derived from the all-reduce (a ring all-reduce is one
reduce-scatter and one all-gather).

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
from typing import Any

from gradsched import _validate as v
from gradsched.costs import (COLLECTIVES, PER_RANK, CollectiveCost, collectives_from_dict, collectives_to_dict,
                             derived_phase_ratio, extrapolate, fit_line, monotone_envelope, per_total, ring_min_bytes,
                             ring_phase_ratio, split_envelope, table_then_line, with_line)
from gradsched.errors import FormatError, GradschedError
from gradsched.plan import ALL_GATHER, HIER, REDUCE_SCATTER
from gradsched.queued import QueuedRule, queue_s_per_byte
from gradsched.topology import Topology

__all__ = ["COLLECTIVES", "CONTENTION_FIELDS", "Cluster", "CollectiveCost", "Contention", "Topology", "fit_line",
           "monotone_envelope", "split_envelope"]

FORMAT = "gradsched.cluster/1"
CONTENTION_FIELDS = ("compute_slowdown", "comm_slowdown", "busy_latency_s", "op_latency_s")  # docs/simulator.md, "Contention"
# optional, per two-phase collective: its own communication slowdown (absent: the all-reduce's comm_slowdown)
PHASE_SLOWDOWNS = {REDUCE_SCATTER: "reducescatter_comm_slowdown", ALL_GATHER: "allgather_comm_slowdown"}
FIELDS = ("format", "world_size", "backend", "algorithm", "collectives", "points", "topology")
# Optional fields gradsched reads or its tools write (kept verbatim; docs/formats.md):
# known, so that a misspelling of one is caught (_validate.check_fields).
OPTIONAL_FIELDS = ("contention", "topk_selection_s_per_nlogn", "source", "measured_by", "device", "reps", "host",
                   "measured_points", "startup_measured_points", "samples", "allreduce_stream",
                   "derived_phase_ratios", "derived_phase_ratio_points", "ring_phase_ratios", "ring_min_bytes")
# Optional: an all-reduce of a training step's stream costs max(latency_s, s_per_byte * bytes), its start-up
# overlapping its bytes, instead of the table's time (docs/cost-model.md, "Start-up or bytes"); with an
# ``exponent`` p, (latency_s**p + (s_per_byte * bytes)**p) ** (1/p): the two overlap partly near where they are equal.
# ``queue_gain`` (optional, at least 1) is recorded only: latency_s is the table's start-up divided by it (a step's
# queued all-reduces overlap their start-ups: gradsched.jobs.bench.STREAM_QUEUE_GAIN).
STREAM = "allreduce_stream"
STREAM_FIELDS = ("latency_s", "s_per_byte", "exponent", "queue_gain")


@dataclass(frozen=True, slots=True)
class Contention:
    """How compute and communication slow each other on this machine (the cluster's optional
    ``contention``; docs/simulator.md, "Contention").  A figure left out is 0: no effect."""

    compute_slowdown: float = 0.0  # compute runs 1 + this times slower while a collective is in flight
    comm_slowdown: float = 0.0  # a collective runs 1 + this times slower while compute runs
    busy_latency_s: float = 0.0  # more per collective that overlaps compute
    op_latency_s: float = 0.0  # more per collective, compute or not
    # a reduce-scatter / an all-gather runs 1 + this times slower while compute runs; None: as comm_slowdown
    # (the contention probe times them where a job runs two-phase rows; docs/cost-model.md, "Contention")
    reducescatter_comm_slowdown: float | None = None
    allgather_comm_slowdown: float | None = None

    def __post_init__(self) -> None:
        for name in (*CONTENTION_FIELDS, *PHASE_SLOWDOWNS.values()):
            x = getattr(self, name)
            if x is None and name not in CONTENTION_FIELDS:
                continue
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise GradschedError(f"contention figure {name} must be a finite non-negative number, got {x!r}; "
                                     "fix the cluster's contention (docs/simulator.md, \"Contention\")")

    def comm_slowdown_of(self, collective: str) -> float:
        """The communication slowdown of an operation of ``collective`` (a plan's ``collective``)."""
        own = getattr(self, PHASE_SLOWDOWNS[collective]) if collective in PHASE_SLOWDOWNS else None
        return self.comm_slowdown if own is None else own

    def to_dict(self) -> dict[str, float]:
        out = {name: getattr(self, name) for name in CONTENTION_FIELDS}
        out.update({name: getattr(self, name) for name in PHASE_SLOWDOWNS.values() if getattr(self, name) is not None})
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>", where: str = "contention") -> "Contention":
        """From the JSON object (every figure optional), checked field by field."""
        return cls(**v.numbers(data, source, where, (*CONTENTION_FIELDS, *PHASE_SLOWDOWNS.values())))


@dataclass(frozen=True)
class Cluster:
    """Collective costs measured (or assumed) at ``world_size`` ranks."""

    world_size: int
    collectives: dict[str, CollectiveCost]
    backend: str = "unknown"
    algorithm: str = "ring"  # how costs extrapolate to other world sizes: ring | tree
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    contention: Contention | None = None  # None: compute and communication overlap for free
    topology: Topology | None = None  # None: one flat level (every link alike)

    def __post_init__(self) -> None:
        # ``extra={"contention": {...}}`` (how the figures were passed before they had a field)
        # lands in the field, so that the JSON and the simulator see one place.
        if "contention" in self.extra:
            rest = {k: x for k, x in self.extra.items() if k != "contention"}
            raw = self.extra["contention"]
            object.__setattr__(self, "contention", raw if isinstance(raw, Contention) else Contention.from_dict(raw))
            object.__setattr__(self, "extra", rest)
        if self.topology is not None and self.topology.world_size != self.world_size:
            raise GradschedError(f"topology {self.topology.nodes} x {self.topology.ranks_per_node} does not match "
                                 f"world_size {self.world_size}")

    # ------------------------------------------------------------------ costs
    def cost(self, collective: str, world_size: int | None = None) -> CollectiveCost:
        """The cost model of ``collective`` at ``world_size`` (default: measured size).

        ``"hier-allreduce"`` (the hierarchical all-reduce) needs a topology."""
        p = self.world_size if world_size is None else world_size
        if p != self.world_size and self.topology is not None:
            return self.at_world_size(p).cost(collective)
        if collective == HIER:
            if self.topology is None:
                raise GradschedError("the cluster has no topology, so a hier-allreduce operation has no cost: give "
                                     "a cluster with one (docs/formats.md, \"topology\") or plan without "
                                     "hierarchical operations")
            return self.topology.hier_allreduce()
        base = self._base(collective)
        if p == self.world_size:
            return base
        return extrapolate(base, collective, self.algorithm, self.world_size, p)

    def operation_cost(self, collective: str) -> CollectiveCost:
        """What a plan operation of ``collective`` costs as a function of the bytes it holds (the whole
        group): the all-reduce's own cost; a ``reduce-scatter`` or ``all-gather`` of ``n`` bytes is the
        cluster's ``reducescatter`` or ``allgather`` of ``n / world_size`` bytes per rank, priced by the group's
        size where derived (:meth:`phase_cost`)."""
        if collective == REDUCE_SCATTER:
            return self.phase_cost("reducescatter")
        if collective == ALL_GATHER:
            return self.phase_cost("allgather")
        if collective == "allreduce" and STREAM in self.extra:
            return stream_cost(*stream_figures(self.extra[STREAM]))
        return self.cost(collective)

    def queued_rule(self, collective: str) -> QueuedRule | None:
        """How several ``collective`` operations (a plan's name, ``reduce-scatter``, or the cluster's,
        ``reducescatter``) in flight at once share the link (:mod:`gradsched.queued`), from the file's optional
        ``queued`` field (``gradsched netbench --queue-depths``); None where it has none.  With the file's
        ``queued_points`` the rule carries the deepest queue's seconds a byte (of a plan operation's whole bytes), so
        that an operation alone as fast a byte as that queue gains nothing (:meth:`QueuedRule.for_operation`)."""
        name = {REDUCE_SCATTER: "reducescatter", ALL_GATHER: "allgather"}.get(collective, collective)
        raw = (self.extra.get("queued") or {}).get(name)
        if raw is None:
            return None
        rule = QueuedRule.from_dict(raw, "cluster", f"queued.{name}")
        points = (self.extra.get("queued_points") or {}).get(name)
        per_byte = queue_s_per_byte(points) if isinstance(points, dict) else None
        if per_byte is None:
            return rule
        # queued_points are in the table's sizes (a phase's: per rank); a plan operation's bytes are the whole group's
        return rule.with_queue_rate(per_byte / self.world_size if name in PER_RANK else per_byte)

    def _base(self, collective: str) -> CollectiveCost:
        if collective in self.collectives:
            return self.collectives[collective]
        if collective in PER_RANK and "allreduce" in self.collectives:
            # A ring all-reduce is a reduce-scatter plus an all-gather of the same
            # total size: each, of s bytes per rank, costs half the start-up
            # and (P/2) times the per-byte cost of an all-reduce of s bytes; the per-byte
            # part times what the runtime's phase measured against that half (derived_phase_ratio), by the group's
            # size where the file gives the ratio so (derived_phase_ratio_points).
            return self._derived(self.derived_phase_ratio(collective), points=self.derived_phase_ratio_points(collective))
        raise GradschedError(f"cluster has no cost model for {collective!r}; it knows {sorted(self.collectives)}")

    def _derived(self, ratio: float, slope: float | None = None,
                 points: tuple[tuple[float, float], ...] | None = None) -> CollectiveCost:
        """A phase derived from the all-reduce line, per rank byte: half its start-up, ``P/2`` times its slope (or
        ``slope``, an all-reduce's seconds a byte) times ``ratio``; with ``points`` (``(group bytes, ratio)``) the
        ratio by the group's size instead: a table at a group of 1 byte and those sizes, the last ratio's line
        beyond."""
        ar = self.collectives["allreduce"]
        beta = ar.beta_s_per_byte if slope is None else slope
        p = self.world_size
        if not points:
            return CollectiveCost(ar.alpha_s / 2, beta * p / 2 * ratio)
        sizes = [(1.0 / p, points[0][1]), *((b / p, r) for b, r in points if b > 1.0)]  # from a group of 1 byte
        table = tuple((s, ar.alpha_s / 2 + beta * p / 2 * r * s) for s, r in sizes)
        return CollectiveCost(ar.alpha_s / 2, beta * p / 2 * points[-1][1], table)

    def phase_cost(self, collective: str) -> CollectiveCost:
        """What a plan's ``reducescatter`` or ``allgather`` group costs by its whole bytes.  A phase the table timed
        is priced as timed (the runtime's own functions timed it: rings where they ran), except that where the file's
        ``measured_points`` stop under :attr:`ring_min_bytes` (:meth:`timed_to_bytes`) the groups from it are priced
        as the ring below, not on the timed all-to-alls' line extended (runs11: timed to 2 MiB a group, the line
        beyond at 82 ns a byte where the probe's ring of every gradient ran at 31).  A derived one follows the
        runtime's choice by size (:func:`gradsched.costs.runs_ring`): under :attr:`ring_min_bytes` the all-to-alls'
        ratio (:meth:`derived_phase_ratio`) over the all-reduce line, from it the ring's (:meth:`ring_phase_ratio`:
        gloo beyond two ranks, 1.0 at 8 against the all-to-alls' 2.0) over the all-reduce's bytes as a step's stream
        runs them (the ``allreduce_stream`` slope where the file has one, anchored to the probe's all-reduce of
        every gradient; else the line): the ring was timed against an all-reduce of the same size, where the
        all-to-alls' ratios were fitted on each reading's line (docs/cost-model.md, "Two phases not measured")."""
        whole = per_total(self.cost(collective), self.world_size)
        ring = self.ring_phase_ratio(collective)
        if "allreduce" not in self.collectives or ring is None:
            return whole
        slope = stream_figures(self.extra[STREAM])[1] if STREAM in self.extra else None
        ring_cost = per_total(self._derived(ring, slope), self.world_size)
        if collective in self.collectives:
            timed_to = self.timed_to_bytes(collective)
            if timed_to is None or timed_to >= self.ring_min_bytes:
                return whole
            return table_then_line(whole, ring_cost, self.ring_min_bytes)
        return table_then_line(whole, ring_cost, self.ring_min_bytes)

    def timed_to_bytes(self, collective: str) -> int | None:
        """The largest whole group the table timed ``collective`` at (the file's ``measured_points``, a phase's
        sizes per rank times the world size); None where the file does not say (its table trusted at every size)."""
        points = (self.extra.get("measured_points") or {}).get(collective)
        if not points:
            return None
        largest = max(float(b) for b, _ in points)
        return int(largest * (self.world_size if collective in PER_RANK else 1))

    @property
    def ring_min_bytes(self) -> int:
        """The group size from which the phases ran as rings where this cluster was measured: the file's optional
        ``ring_min_bytes`` (2**62 or more: no rings, the runs before them), else the runtime's
        (:func:`gradsched.costs.ring_min_bytes`: 4 MiB, or ``GRADSCHED_RING_MIN_BYTES``)."""
        given = self.extra.get("ring_min_bytes")
        return int(given) if given is not None else ring_min_bytes()

    def ring_phase_ratio(self, collective: str) -> float | None:
        """What a derived ``reducescatter`` or ``allgather`` sent as a ring costs a byte over half the all-reduce's:
        the file's optional ``ring_phase_ratios``, else :func:`gradsched.costs.ring_phase_ratio` for the backend and
        world size; None where no ring runs (NCCL, two ranks or fewer) or none is known for the backend."""
        if self.backend == "nccl" or self.world_size <= 2:
            return None
        given = (self.extra.get("ring_phase_ratios") or {}).get(collective)
        return float(given) if given is not None else ring_phase_ratio(self.backend, self.world_size, collective)

    def derived_phase_ratio(self, collective: str) -> float:
        """What a ``reducescatter`` or ``allgather`` the table did not time costs a byte over half the
        all-reduce's: the file's optional ``derived_phase_ratios`` (``{name: ratio}``), else the ratio for the
        backend and world size (:func:`gradsched.costs.derived_phase_ratio`: gloo 2.0 each at 8 ranks, where
        half each priced the stored dear plans 26-48% too fast), else 1 (half each, as a ring all-reduce splits)."""
        given = (self.extra.get("derived_phase_ratios") or {}).get(collective)
        return float(given) if given is not None else derived_phase_ratio(self.backend, self.world_size, collective)

    def derived_phase_ratio_points(self, collective: str) -> tuple[tuple[float, float], ...] | None:
        """That ratio as a function of the group's size, where the file gives it (optional
        ``derived_phase_ratio_points``: ``{name: [[group bytes, ratio], ...]}``: the phase's time at each size,
        linear in the bytes between them, the end's ratio beyond; it wins over ``derived_phase_ratios``); None where
        it does not.  At 8 ranks on gloo the all-to-alls measured 0.74-0.81x half the all-reduce a byte at 256 KiB
        and 1.21-1.28x at 1 MiB, where the flat 1.56 and 1.75 priced them too slow
        (:data:`gradsched.costs.MEASURED_PHASE_RATIO_POINTS`, which ``gradsched bench`` writes)."""
        given = (self.extra.get("derived_phase_ratio_points") or {}).get(collective)
        if not given:
            return None
        return tuple(sorted((float(b), float(r)) for b, r in given))

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
        """This cluster's costs extrapolated to ``world_size`` ranks.

        With a topology, nodes keep their ranks per node (:meth:`at_topology`); a world size
        that is not a whole number of nodes is an error."""
        if world_size == self.world_size:
            return self
        if self.topology is not None:
            m = self.topology.ranks_per_node
            if world_size < 1 or world_size % m:
                raise GradschedError(f"the cluster has nodes of {m} ranks, so {world_size} ranks is not a whole "
                                     f"number of nodes; give --nodes and --ranks-per-node")
            return self.at_topology(world_size // m, m)
        names = set(self.collectives) | {"allgather"}
        return replace(self, world_size=world_size,
                       collectives={c: self.cost(c, world_size) for c in sorted(names)})

    def at_topology(self, nodes: int, ranks_per_node: int) -> "Cluster":
        """This two-level cluster at ``nodes`` x ``ranks_per_node``: both levels extrapolated
        (ring formulas; the tree rule between nodes for ``tree``), the top-level all-reduce
        moved by the ratio of the backend algorithm's two-level formula there to the one at
        the measured topology (a table keeps its shape), the all-gather by the flat rule."""
        topo = self.topology
        if topo is None:
            raise GradschedError("the cluster has no topology (nodes x ranks per node); give a cluster with one "
                                 "(docs/formats.md, \"topology\"), or a world size for the flat model")
        for name, x in (("nodes", nodes), ("ranks_per_node", ranks_per_node)):
            if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= v.MAX_WORLD_SIZE:
                raise GradschedError(f"{name} must be a whole number from 1 to {v.MAX_WORLD_SIZE:,}, got {x!r}")
        if (nodes, ranks_per_node) == (topo.nodes, topo.ranks_per_node):
            return self
        new_topo = topo.at(nodes, ranks_per_node)
        p = nodes * ranks_per_node
        collectives = {c: extrapolate(self._base(c), c, self.algorithm, self.world_size, p)
                       for c in sorted(set(self.collectives) | {"allgather"})}
        collectives["allreduce"] = _moved(self.collectives["allreduce"], topo.plain_allreduce(),
                                          new_topo.plain_allreduce())
        return replace(self, world_size=p, collectives=collectives, topology=new_topo)

    @classmethod
    def alpha_beta(cls, alpha_s: float, beta_s_per_byte: float, world_size: int) -> "Cluster":
        """A cluster whose all-reduce costs ``alpha + beta * s`` at ``world_size``."""
        return cls(world_size, {"allreduce": CollectiveCost(alpha_s, beta_s_per_byte)})

    @classmethod
    def two_level(cls, intra: CollectiveCost | dict[str, CollectiveCost] | None,
                  inter: CollectiveCost | dict[str, CollectiveCost] | None, nodes: int, ranks_per_node: int, *,
                  algorithm: str = "ring", backend: str = "unknown") -> "Cluster":
        """A cluster of ``nodes`` x ``ranks_per_node`` from the all-reduce among the ranks of one
        node (``intra``) and among one rank per node (``inter``); its plain all-reduce is the
        ``algorithm``'s two-level formula (modelled, not measured).  A level of one rank may be None."""
        def level(x):
            return x if x is None or isinstance(x, dict) else {"allreduce": x}

        topo = Topology(nodes, ranks_per_node, algorithm, level(intra), level(inter))
        return cls(topo.world_size, {"allreduce": topo.plain_allreduce()}, backend, topology=topo)

    # -------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "world_size": self.world_size, "backend": self.backend,
                               **collectives_to_dict(self.collectives)}
        if self.algorithm != "ring":
            out["algorithm"] = self.algorithm
        if self.topology is not None:
            out["topology"] = self.topology.to_dict()
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
        collectives = collectives_from_dict(data, source)
        if "topk_selection_s_per_nlogn" in data:
            v.number(data["topk_selection_s_per_nlogn"], source, "topk_selection_s_per_nlogn", maximum=1.0)
        contention = Contention.from_dict(data["contention"], source) if "contention" in data else None
        topology = Topology.from_dict(data["topology"], source, world) if "topology" in data else None
        extra = {k: x for k, x in data.items() if k not in FIELDS and k != "contention"}
        if STREAM in extra:
            stream_figures(extra[STREAM], source)
        for ratios in ("derived_phase_ratios", "ring_phase_ratios"):
            for name, x in v.numbers(extra.get(ratios, {}), source, ratios, PER_RANK).items():
                v.number(x, source, f"{ratios}.{name}", positive=True)
        if "ring_min_bytes" in extra:
            v.integer(extra["ring_min_bytes"], source, "ring_min_bytes", minimum=1)
        _check_ratio_points(extra.get("derived_phase_ratio_points", {}), source)
        return cls(world, collectives, backend, algorithm, extra, contention, topology)

    @classmethod
    def load(cls, path: str | Path) -> "Cluster":
        return cls.from_dict(v.read_json(path), str(path))

    def save(self, path: str | Path) -> None:
        v.write_json(path, self.to_dict())


def _moved(measured: CollectiveCost, model_then: CollectiveCost, model_now: CollectiveCost) -> CollectiveCost:
    """``measured`` (at the measured topology) moved by the ratio of the model's line now to its
    line then, component by component (a component the model put at 0 then: the model's own)."""
    a = measured.alpha_s * model_now.alpha_s / model_then.alpha_s if model_then.alpha_s > 0 else model_now.alpha_s
    b = (measured.beta_s_per_byte * model_now.beta_s_per_byte / model_then.beta_s_per_byte
         if model_then.beta_s_per_byte > 0 else model_now.beta_s_per_byte)
    return with_line(measured, a, b)


def stream_figures(data: Any, source: str = "<dict>") -> tuple[float, float, float | None]:
    """``(latency_s, s_per_byte, exponent)`` of a cluster's optional ``allreduce_stream``, checked: both figures
    positive, the optional ``exponent`` (None where absent: the longer of the two) at least 1."""
    if not isinstance(data, dict):
        raise FormatError(source, STREAM, "must be a JSON object with 'latency_s' and 's_per_byte'")
    v.check_fields(data, STREAM_FIELDS, source, STREAM)
    figures = [v.number(v.require(data, k, source, STREAM), source, f"{STREAM}.{k}", positive=True, maximum=1e3)
               for k in ("latency_s", "s_per_byte")]
    if "queue_gain" in data and v.number(data["queue_gain"], source, f"{STREAM}.queue_gain", maximum=64.0) < 1.0:
        raise FormatError(source, f"{STREAM}.queue_gain", f"must be at least 1, got {data['queue_gain']}")
    exponent = None
    if "exponent" in data:
        exponent = v.number(data["exponent"], source, f"{STREAM}.exponent", maximum=64.0)
        if exponent < 1.0:
            raise FormatError(source, f"{STREAM}.exponent", f"must be at least 1 (1: start-up plus bytes), got {exponent}")
    return figures[0], figures[1], exponent


STREAM_BLEND_SPAN = 64.0  # a blended cost is tabled from knee / this to knee x this


def stream_cost(latency_s: float, s_per_byte: float, exponent: float | None = None) -> CollectiveCost:
    """An all-reduce that costs ``max(latency_s, s_per_byte * bytes)``: the start-up or the bytes, whichever is
    longer (docs/cost-model.md, "Start-up or bytes"), as a table (flat up to where the bytes take longer) and a
    line through the origin beyond it.  With ``exponent`` p: ``(latency_s**p + (s_per_byte * bytes)**p)**(1/p)``,
    2**(1/p) times the start-up where the two are equal (p = 2: 1.41x; the stored 8-host runs' operations of
    about that size cost 1.3-1.9x it in the rounds) and, for p >= 2, within 2e-4 of the longer 64x from there; tabled at 97
    sizes around the knee (and 1 byte), above them a line of slope ``s_per_byte`` from the last (at p = 1:
    start-up plus bytes)."""
    knee = latency_s / s_per_byte
    if exponent is None:
        return CollectiveCost(0.0, s_per_byte, ((min(1.0, knee), latency_s), (knee, latency_s))) if knee > 1.0 \
            else CollectiveCost(0.0, s_per_byte)
    low, high = knee / STREAM_BLEND_SPAN, knee * STREAM_BLEND_SPAN
    sizes = [1.0] + [x for x in (low * (high / low) ** (i / 96) for i in range(97)) if x > 1.0]
    table = tuple((x, (latency_s ** exponent + (s_per_byte * x) ** exponent) ** (1.0 / exponent)) for x in sizes)
    return CollectiveCost(table[-1][1] - s_per_byte * table[-1][0], s_per_byte, table)  # the line meets the table


def _check_ratio_points(raw: Any, source: str) -> None:
    """``derived_phase_ratio_points``: ``{reducescatter|allgather: [[group bytes > 0, ratio > 0], ...]}``, at least
    one pair a phase, no size twice."""
    where = "derived_phase_ratio_points"
    if not isinstance(raw, dict):
        raise FormatError(source, where, "must be a JSON object of [bytes, ratio] lists by collective")
    v.check_fields(raw, PER_RANK, source, where)
    for name, pairs in raw.items():
        sizes = []
        for j, pair in enumerate(v.array(pairs, source, f"{where}.{name}")):
            if not isinstance(pair, list) or len(pair) != 2:
                raise FormatError(source, f"{where}.{name}[{j}]", "must be a [bytes, ratio] pair")
            sizes.append(v.number(pair[0], source, f"{where}.{name}[{j}][0]", positive=True, maximum=v.MAX_BYTES))
            v.number(pair[1], source, f"{where}.{name}[{j}][1]", positive=True)
        if not sizes:
            raise FormatError(source, f"{where}.{name}", "needs at least one [bytes, ratio] pair")
        if len(set(sizes)) != len(sizes):
            raise FormatError(source, f"{where}.{name}", "has two pairs for the same size")
