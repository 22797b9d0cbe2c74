"""Which dense collective each operation runs: the plain all-reduce or the hierarchical one.

On a cluster with a topology (nodes x ranks per node, docs/cost-model.md "Two-level
clusters") a dense operation may run as ``hier-allreduce``: reduce inside each node,
all-reduce among the node leaders, broadcast inside each node.  gradsched's own dense
planners take the option ``hierarchical``:

- ``auto`` (default): plan with the cheaper of the two at every size
  (:func:`planning_cost`, so that merge decisions know about it), then run each
  operation as whichever is cheaper for its bytes (:func:`choose_collective`);
- ``never``: plain all-reduces only (the plans of a cluster without a topology);
- ``always``: every dense operation hierarchical.

On a cluster without a topology ``auto`` and ``never`` change nothing and ``always``
is an error.  The planners that mimic a tool (``ddp``, ``horovod``, ``sync``) do not take
the option: the tool runs plain all-reduces."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.costs import cheaper, combine
from gradsched.errors import GradschedError
from gradsched.plan import ALL_GATHER, DENSE, HIER, REDUCE_SCATTER, Operation
from gradsched.planners.options import Option
from gradsched.profile import Profile

MODES = ("auto", "never", "always")
OPTION = Option("hierarchical", str, "auto", choices=MODES,
                doc="two-level clusters: run an operation as hier-allreduce where it is cheaper ('auto'), "
                    "never, or always")


def check_mode(strategy: str, mode: str, cluster: Cluster) -> None:
    if mode not in MODES:
        raise GradschedError(f"{strategy}: hierarchical must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "always" and cluster.topology is None:
        raise GradschedError(f"{strategy}: hierarchical=always needs a cluster with a topology (nodes x ranks per "
                             "node, docs/formats.md); this one has none")


def planning_cost(cluster: Cluster, mode: str = "auto") -> CollectiveCost:
    """The cost a planner merges and orders dense operations by: the plain all-reduce, the
    hierarchical one, or (``auto``) the cheaper of the two at every size.  The plain one as a plan's operation
    costs (:meth:`Cluster.operation_cost`: the cluster's ``allreduce_stream`` where it has one)."""
    plain = cluster.operation_cost("allreduce")
    if cluster.topology is None or mode == "never":
        return plain
    hier = cluster.cost(HIER)
    return hier if mode == "always" else cheaper(plain, hier)


def two_phase_cost(cluster: Cluster) -> CollectiveCost:
    """What a decoupled all-reduce of a group costs by the group's bytes: its reduce-scatter plus its
    all-gather (each the cluster's per-rank cost of ``bytes / world_size``; docs/cost-model.md)."""
    return combine([(1.0, cluster.operation_cost(REDUCE_SCATTER)), (1.0, cluster.operation_cost(ALL_GATHER))])


def choose_collective(ops: Sequence[Operation], profile: Profile, cluster: Cluster,
                      mode: str = "auto") -> tuple[Operation, ...]:
    """``ops`` with each dense all-reduce made ``hier-allreduce`` where ``mode`` says so:
    ``auto`` where the cluster predicts it strictly cheaper for the operation's bytes."""
    if cluster.topology is None or mode == "never":
        return tuple(ops)
    elem = [t.element_bytes for t in profile.tensors]
    nbytes = [sum([(s.end - s.start) * elem[s.tensor] for s in op.slices]) for op in ops]
    kinds = collectives_for(nbytes, cluster, mode)
    return tuple(Operation(op.slices, HIER, op.priority, op.density) if kind == HIER and op.collective == DENSE
                 else op for op, kind in zip(ops, kinds))


def dense_collectives(cluster: Cluster, mode: str = "auto") -> list[str]:
    """The collectives a dense operation may run as with ``hierarchical=mode``: those
    :func:`collectives_for` (and :func:`choose_collective`) may give on ``cluster``."""
    if cluster.topology is None or mode == "never":
        return [DENSE]
    return [HIER] if mode == "always" else [DENSE, HIER]


def collectives_for(nbytes: Sequence[float], cluster: Cluster, mode: str = "auto") -> list[str]:
    """The dense collective for an operation of each size in ``nbytes`` (for a planner that
    builds its operations knowing their sizes: :func:`choose_collective` without rebuilding)."""
    if cluster.topology is None or mode == "never":
        return [DENSE] * len(nbytes)
    if mode == "always":
        return [HIER] * len(nbytes)
    sizes = np.asarray(nbytes, dtype=float)
    wins = cluster.cost(HIER).times_s(sizes) < cluster.cost("allreduce").times_s(sizes)
    return [HIER if w else DENSE for w in wins.tolist()]


def recorded(options: dict[str, Any], cluster: Cluster, mode: str) -> dict[str, Any]:
    """A plan's options with ``hierarchical`` recorded where it can matter (a two-level cluster),
    so that plans for a flat cluster stay as they were."""
    return options if cluster.topology is None else {**options, "hierarchical": mode}
