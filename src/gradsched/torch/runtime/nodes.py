"""Nodes of a data-parallel group and the process groups a two-level all-reduce runs on.

Node layout (TOPOLOGY.md, as torchrun assigns ranks): the group's ranks form nodes of
``M`` consecutive group ranks, node ``i`` holding group ranks ``[i*M, (i+1)*M)``; its
first rank (local rank 0) is the node's *leader*.  ``M`` is, first to last, the
wrapper's ``ranks_per_node`` argument, the environment variable ``LOCAL_WORLD_SIZE``
(torchrun sets it), else 1 (every rank its own node).

:func:`node_groups` makes, once per owner (the wrapped model), the groups that
:mod:`gradsched.torch.runtime.hier` issues on:

- two groups per node (its ``M`` ranks): one for the reduces to the leader, one for
  the broadcasts from it.  A rank issues its reduces in the plan's order from the
  issuing thread, but a broadcast only when its all-reduce completes (a backend
  thread): on one group the two kinds could interleave in a different order on
  different ranks, and gloo and NCCL match collectives by the order they are issued;
- the leaders' group (one rank per node) for the all-reduce across nodes.

Every rank of the group ends up holding the same number of new groups (a non-leader
makes a one-rank group where a leader makes the leaders' group), so that groups made
later with ``use_local_synchronization`` (named from that count:
:mod:`gradsched.torch.runtime.groups`) keep the same names on every rank.  On the
whole world every rank creates every group, in the same order (``new_group``'s rule);
on a subgroup only the members of each group enter it, as
:func:`~gradsched.torch.runtime.groups.side_group` does.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch.distributed as dist

from gradsched.errors import GradschedError
from gradsched.plan import HIER, Plan
from gradsched.torch.runtime.groups import is_whole_world
from gradsched.torch.runtime.shutdown import release_at_exit

ENV_VAR = "LOCAL_WORLD_SIZE"

_NODE_GROUPS: "weakref.WeakKeyDictionary[object, NodeGroups]" = weakref.WeakKeyDictionary()


def uses_nodes(plan: Plan | None) -> bool:
    """Whether ``plan`` has an operation that runs over the node layout (``hier-allreduce``)."""
    return plan is not None and any(op.collective == HIER for op in plan.operations)


def ranks_per_node(explicit: int | None = None, env: Mapping[str, str] = os.environ) -> int:
    """``M``: ``explicit`` if given, else ``LOCAL_WORLD_SIZE`` from ``env``, else 1 (module docstring)."""
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 1:
            raise GradschedError(f"ranks_per_node must be an integer >= 1, got {explicit!r}")
        return explicit
    raw = env.get(ENV_VAR, "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise GradschedError(f"{ENV_VAR}={raw!r} is not a positive integer; launch with torchrun or pass "
                             "ranks_per_node to the wrapper")
    return value


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where one rank sits: ``nodes`` nodes of ``ranks_per_node`` group ranks (global ranks in ``ranks``)."""

    ranks: tuple[int, ...]  # global ranks of the group, in group-rank order
    ranks_per_node: int
    group_rank: int

    @property
    def nodes(self) -> int:
        return len(self.ranks) // self.ranks_per_node

    @property
    def node(self) -> int:
        return self.group_rank // self.ranks_per_node

    def members(self, node: int) -> list[int]:
        """Global ranks of node ``node``, its leader first."""
        m = self.ranks_per_node
        return list(self.ranks[node * m:(node + 1) * m])

    @property
    def leaders(self) -> list[int]:
        return [self.ranks[i * self.ranks_per_node] for i in range(self.nodes)]

    @property
    def leader(self) -> int:
        """Global rank of this rank's node leader."""
        return self.ranks[self.node * self.ranks_per_node]

    @property
    def is_leader(self) -> bool:
        return self.group_rank % self.ranks_per_node == 0


def node_layout(ranks: list[int], group_rank: int, m: int) -> NodeLayout:
    """The layout of ``ranks`` in nodes of ``m``; a one-line error if they do not fill whole nodes."""
    if len(ranks) % m:
        raise GradschedError(f"hier-allreduce: the group's {len(ranks)} ranks do not fill nodes of {m} ranks "
                             f"(ranks_per_node, else {ENV_VAR}); pass the ranks_per_node your nodes have, so that "
                             "it divides the group's size")
    return NodeLayout(tuple(ranks), m, group_rank)


def creation_order(layout: NodeLayout) -> list[tuple[str, list[int]]]:
    """The groups to create, in order, as ``(role, global ranks)``: every group of the job, each node's
    ``reduce`` and ``broadcast`` group, the ``leaders`` group, and a one-rank ``filler`` per non-leader
    (so that every rank ends up a member of as many groups).  One-rank levels are left out."""
    out: list[tuple[str, list[int]]] = []
    if layout.ranks_per_node > 1:
        out += [("reduce", layout.members(i)) for i in range(layout.nodes)]
        out += [("broadcast", layout.members(i)) for i in range(layout.nodes)]
    if layout.nodes > 1:
        out.append(("leaders", layout.leaders))
        if layout.ranks_per_node > 1:
            out += [("filler", [r]) for r in layout.ranks if r not in set(layout.leaders)]
    return out


@dataclass(frozen=True, slots=True)
class NodeGroups:
    """This rank's groups for the two levels (``None`` where a level has one rank)."""

    layout: NodeLayout
    reduce: dist.ProcessGroup | None  # this node's ranks: reduces to the leader
    broadcast: dist.ProcessGroup | None  # this node's ranks: broadcasts from the leader
    leaders: dist.ProcessGroup | None  # one rank per node; only on leaders
    held: tuple[dist.ProcessGroup, ...]  # every group made here (fillers included), kept alive


def node_groups(group: dist.ProcessGroup, m: int, timeout_s: float, owner: object) -> NodeGroups:
    """``owner``'s :class:`NodeGroups` on ``group`` with ``m`` ranks per node, made on first use.

    A collective: every rank of ``group`` calls it at the same point (all ranks of the
    job when ``group`` is the whole world)."""
    release_at_exit(_NODE_GROUPS.clear)
    held = _NODE_GROUPS.get(owner)
    if held is not None and held.layout.ranks_per_node == m:
        return held
    ranks = dist.get_process_group_ranks(group)
    layout = node_layout(ranks, dist.get_rank(group), m)
    me = dist.get_rank()
    whole = is_whole_world(group)
    kw = {"backend": str(dist.get_backend_config(group)), "timeout": timedelta(seconds=timeout_s)}
    mine: dict[str, dist.ProcessGroup] = {}
    made: list[dist.ProcessGroup] = []
    for role, members in creation_order(layout):
        if whole:
            pg = dist.new_group(members, **kw)  # every rank enters every group
        elif me in members:
            pg = dist.new_group(members, use_local_synchronization=True, **kw)
        else:
            continue
        if me in members:
            mine[role] = pg
            made.append(pg)
    groups = NodeGroups(layout, mine.get("reduce"), mine.get("broadcast"), mine.get("leaders"), tuple(made))
    _NODE_GROUPS[owner] = groups
    return groups
