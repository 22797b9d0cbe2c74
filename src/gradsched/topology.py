"""Two-level clusters: ``nodes`` x ``ranks_per_node``, one cost inside a node, one between nodes.

The optional ``topology`` of a gradsched.cluster/1 file (docs/formats.md): an
all-reduce measured among the ``M = ranks_per_node`` ranks of one node (``intra``) and
one among ``N = nodes`` ranks, one per node (``inter``), each a line and optionally a
table, and the ``algorithm`` the backend's plain all-reduce runs over the two levels.
From them (docs/cost-model.md, "Two-level clusters"):

- each level's per-link latency ``a`` and inverse bandwidth ``b``, read through the ring
  formula ``2(P-1) a + 2(P-1)/P * s * b`` at the size it was measured at;
- ``ring``: one flat ring over all ``P = N M`` ranks, ``2(P-1)`` steps of ``s/P`` bytes,
  each as slow as the slowest link on the ring (the inter-node one once N > 1);
- ``hierarchical`` (the ``hier-allreduce`` operation): reduce inside each node, all-reduce
  of all ``s`` bytes among the node leaders, broadcast inside each node; the reduce and
  the broadcast as measured inside a node (``intra``'s ``reduce`` and ``broadcast``,
  which ``gradsched netbench`` writes), else each half an intra-node all-reduce (a ring
  all-reduce is a reduce-scatter plus an all-gather; a reduce is a reduce-scatter plus a
  gather, a broadcast a scatter plus an all-gather, each phase of the same steps and
  bytes);
- ``tree``: the intra-node all-reduce plus the inter-node one, whose start-up grows as
  ``log2 N`` (the flat model's tree rule applied to the inter level).

Torch-free; imports the costs, not the cluster (gradsched.cluster imports this).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradsched import _validate as v
from gradsched.costs import (COLLECTIVES, NODE_STEPS, CollectiveCost, collectives_from_dict, collectives_to_dict,
                             combine, extrapolate, ring_link, with_line)
from gradsched.errors import FormatError, GradschedError

ALGORITHMS = ("ring", "hierarchical", "tree")
FIELDS = ("nodes", "ranks_per_node", "algorithm", "intra", "inter")
LEVEL_FIELDS = ("collectives", "points")
Level = dict[str, CollectiveCost]  # collective name -> its cost among one level's ranks


@dataclass(frozen=True)
class Topology:
    """``nodes`` x ``ranks_per_node`` ranks and the cost of each level, as measured.

    ``intra`` is measured among the ``ranks_per_node`` ranks of one node, ``inter`` among
    ``nodes`` ranks, one per node; a level of one rank has no links and may be ``None``."""

    nodes: int
    ranks_per_node: int
    algorithm: str = "ring"  # the backend's plain all-reduce over both levels: ring | hierarchical | tree
    intra: Level | None = None
    inter: Level | None = None

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise GradschedError(f"topology: {name} must be a positive whole number, got {x!r}")
        if self.algorithm not in ALGORITHMS:
            raise GradschedError(f"topology: algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        for name, size in (("intra", self.ranks_per_node), ("inter", self.nodes)):
            level = getattr(self, name)
            if level is None and size > 1:
                raise GradschedError(f"topology: the {name} level has {size} ranks and needs its costs")
            if level is not None and "allreduce" not in level:
                raise GradschedError(f"topology: the {name} level needs an allreduce cost")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    # ------------------------------------------------------------------ levels
    def intra_allreduce(self, ranks_per_node: int | None = None) -> CollectiveCost:
        """The all-reduce inside one node, at ``ranks_per_node`` ranks (default: as measured)."""
        m = self.ranks_per_node if ranks_per_node is None else ranks_per_node
        return _level_cost(self.intra, "intra", self.ranks_per_node, m, "ring")

    def inter_allreduce(self, nodes: int | None = None) -> CollectiveCost:
        """The all-reduce among one rank per node, at ``nodes`` nodes (tree rule for ``tree``)."""
        n = self.nodes if nodes is None else nodes
        return _level_cost(self.inter, "inter", self.nodes, n, "tree" if self.algorithm == "tree" else "ring")

    # ------------------------------------------------------------------ two-level formulas
    def node_step(self, step: str, ranks_per_node: int | None = None) -> tuple[float, CollectiveCost]:
        """``(weight, cost)`` of the hierarchical all-reduce's ``reduce`` or ``broadcast`` inside a
        node: as measured (``intra[step]``, moved to ``ranks_per_node`` by the ring rule), else
        half the intra-node all-reduce."""
        m = self.ranks_per_node if ranks_per_node is None else ranks_per_node
        if self.intra is not None and step in self.intra:
            return 1.0, _level_cost(self.intra, "intra", self.ranks_per_node, m, "ring", step)
        return 0.5, self.intra_allreduce(ranks_per_node)

    def hier_allreduce(self, nodes: int | None = None, ranks_per_node: int | None = None) -> CollectiveCost:
        """The hierarchical all-reduce: intra reduce + inter all-reduce of all the bytes among the
        leaders + intra broadcast (:meth:`node_step`)."""
        return combine([self.node_step("reduce", ranks_per_node), (1.0, self.inter_allreduce(nodes)),
                        self.node_step("broadcast", ranks_per_node)])

    def flat_ring(self, nodes: int | None = None, ranks_per_node: int | None = None) -> CollectiveCost:
        """One ring over all ``N M`` ranks: ``2(P-1)`` steps of ``s/P`` bytes, each step as slow as
        the slowest link on the ring (per component: the larger latency and inverse bandwidth)."""
        n = self.nodes if nodes is None else nodes
        m = self.ranks_per_node if ranks_per_node is None else ranks_per_node
        p = n * m
        if p == 1:
            return CollectiveCost(0.0, 0.0)
        links = []  # (level's measured all-reduce, per-link a, b) of the levels the ring crosses
        if m > 1:
            intra = self.intra_allreduce()
            links.append((intra, *ring_link(intra, self.ranks_per_node)))
        if n > 1:
            inter = self.inter_allreduce()
            links.append((inter, *ring_link(inter, self.nodes)))
        a = max(x[1] for x in links)
        b = max(x[2] for x in links)
        # the table that shapes the ring's curve: its slowest link's (the inter-node one once N > 1)
        return with_line(links[-1][0], 2 * (p - 1) * a, 2 * (p - 1) / p * b)

    def tree(self, nodes: int | None = None, ranks_per_node: int | None = None) -> CollectiveCost:
        """The intra-node all-reduce plus the inter-node one by the tree rule (start-up ~ log2 N)."""
        return combine([(1.0, self.intra_allreduce(ranks_per_node)), (1.0, self.inter_allreduce(nodes))])

    def plain_allreduce(self, nodes: int | None = None, ranks_per_node: int | None = None) -> CollectiveCost:
        """The backend's plain all-reduce over both levels, by :attr:`algorithm`'s formula."""
        formula = {"ring": self.flat_ring, "hierarchical": self.hier_allreduce, "tree": self.tree}[self.algorithm]
        return formula(nodes, ranks_per_node)

    def at(self, nodes: int, ranks_per_node: int) -> "Topology":
        """This topology at ``nodes`` x ``ranks_per_node``, each level's costs extrapolated."""
        if nodes == self.nodes and ranks_per_node == self.ranks_per_node:
            return self
        intra = self._level_at(self.intra, self.ranks_per_node, ranks_per_node, "ring")
        inter = self._level_at(self.inter, self.nodes, nodes, "tree" if self.algorithm == "tree" else "ring")
        return Topology(nodes, ranks_per_node, self.algorithm, intra, inter)

    @staticmethod
    def _level_at(level: Level | None, p0: int, p: int, algorithm: str) -> Level | None:
        if p == 1:
            return None
        if level is None:
            raise GradschedError(f"a level measured on 1 rank cannot be extrapolated to {p} ranks")
        return {c: extrapolate(cost, c, algorithm, p0, p) for c, cost in level.items()}

    # ------------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node,
                               "algorithm": self.algorithm}
        for name in ("intra", "inter"):
            level = getattr(self, name)
            if level is not None:
                out[name] = collectives_to_dict(level)
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str, world_size: int, where: str = "topology") -> "Topology":
        """The ``topology`` object of a cluster file of ``world_size`` ranks, checked field by field."""
        if not isinstance(data, dict):
            raise FormatError(source, where, "must be a JSON object with nodes, ranks_per_node, algorithm, "
                                             "intra, inter")
        v.check_fields(data, FIELDS, source, where)
        nodes = v.integer(v.require(data, "nodes", source, where), source, f"{where}.nodes", minimum=1,
                          maximum=v.MAX_WORLD_SIZE)
        m = v.integer(v.require(data, "ranks_per_node", source, where), source, f"{where}.ranks_per_node",
                      minimum=1, maximum=v.MAX_WORLD_SIZE)
        if nodes * m != world_size:
            raise FormatError(source, where, f"nodes x ranks_per_node = {nodes} x {m} = {nodes * m}, "
                                             f"but world_size is {world_size}")
        algorithm = v.string(data.get("algorithm", "ring"), source, f"{where}.algorithm")
        if algorithm not in ALGORITHMS:
            raise FormatError(source, f"{where}.algorithm", f"must be one of {', '.join(ALGORITHMS)}, "
                                                            f"got {algorithm!r}")
        levels = {}
        for name, size, known in (("intra", m, COLLECTIVES + NODE_STEPS), ("inter", nodes, COLLECTIVES)):
            levels[name] = _level_from_dict(data.get(name), source, f"{where}.{name}", size, known)
        return cls(nodes, m, algorithm, levels["intra"], levels["inter"])


def _level_from_dict(raw: Any, source: str, where: str, size: int, known: tuple[str, ...]) -> Level | None:
    if raw is None:
        if size > 1:
            raise FormatError(source, where, f"missing field (this level has {size} ranks: give its measured "
                                             "all-reduce)")
        return None
    if not isinstance(raw, dict):
        raise FormatError(source, where, "must be a JSON object with collectives (and optionally points)")
    v.check_fields(raw, LEVEL_FIELDS, source, where)
    level = collectives_from_dict(raw, source, where, known)
    if "allreduce" not in level:
        raise FormatError(source, f"{where}.collectives.allreduce", "missing field (a level needs its all-reduce)")
    return level


def _level_cost(level: Level | None, name: str, p0: int, p: int, algorithm: str,
                collective: str = "allreduce") -> CollectiveCost:
    if p == 1:
        return CollectiveCost(0.0, 0.0)
    if level is None:
        raise GradschedError(f"topology: the {name} level was measured on 1 rank and cannot be extrapolated "
                             f"to {p} ranks")
    # a reduce or a broadcast is half a ring all-reduce's steps: it moves with ranks as the all-reduce does
    return extrapolate(level[collective], "allreduce", algorithm, p0, p)
