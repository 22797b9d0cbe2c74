"""Decoupled all-reduce at run time: a plan's ``reduce-scatter`` and its ``all-gather`` as one operation.

A two-phase plan (``dear``) pairs each group's reduce-scatter with an all-gather of the same
slices (docs/formats.md).  The executor knows operations that each hold their elements once,
so :func:`executable` hands it the reduce-scatters alone, each run by one
:class:`DecoupledAllReduce` that does both phases on the group's arena piece:

1. **issue** (its gradients are complete, during backward): divide by the world size and
   start the reduce-scatter.  On gloo that is ``all_to_all_single`` and a local sum of the p
   pieces (gloo's ``reduce_scatter_tensor`` is an all-reduce and a slice, PyTorch PR
   #118911: measured 1.6-2.8x slower on 2 ranks, benchmarks/gloo_reduce_scatter.py), one
   all-to-all per piece of at most :data:`CHUNK_BYTES` a rank (:func:`chunks`), on a group of its
   own with :data:`PHASE_THREADS` worker threads (:func:`scatter_group`): over a shaped link one
   large all-to-all alone moves about half the link's rate, many small ones at once nearly all of
   it.  On two ranks each all-to-all sends the other rank its part alone and receives the other's
   part into the shard, so no buffer as large as the group is held (:func:`scratch_for`).  Beyond
   two ranks a group of at least :data:`RING_MIN_BYTES` goes as a ring of point-to-point messages
   instead (:mod:`gradsched.torch.runtime.ring`, on a group and thread of its own): at 8 testbed
   hosts the all-to-alls of 4-16 MiB cost 1.4-2.0x half an all-reduce, the ring 1.0-1.08x
   (``sudo python benchmarks/gloo_ring_phases.py``).  On NCCL one ``reduce_scatter_tensor``.
2. **gather** (:func:`retire_alone`, when the executor first waits for any operation after
   backward: the first forward layer's gate with a ``DistributedOptimizer``, else the end of
   backward): for every decoupled operation in flight, in forward order (by its first tensor,
   the order the next forward needs them), wait for its reduce-scatter, sum this rank's
   shard and start the all-gather back into the piece (:func:`start_all_gather`: on NCCL one
   ``all_gather_single``; on gloo an all-to-all per piece straight into the piece, each piece's parts
   where its reduce-scatter took them, as gloo's own all-gather allocates a buffer as large as its
   output per call), on a group of its own
   (:func:`gather_group`), as DeAR's ``step()`` waits for the reduce-scatters and starts the
   all-gathers.  The group takes its collectives in issue order, so the first layers'
   gathers start first.
3. **wait**: the executor retires the operation the layer needs out of issue order
   (:func:`retire_alone`: a layer's forward waits only for its own group's gather); the
   piece then holds the averaged gradient, the all-reduce's result up to the order of the
   additions.

A piece whose length is not a multiple of the world size is padded (a copy each way, as
DeAR pads its buffers).  Every rank ends with every gradient (DeAR's semantics: all-gather the
gradients, every rank updates every parameter), unless a sharded optimizer sets ``keep_shard``: the
runner then stops after the reduce-scatter and :class:`~gradsched.torch.runtime.sharded.ShardedOptimizer`
steps the shard and all-gathers the updated parameters.
An all-gather gated before the group's first layer (a ``gate`` other than the default) is
refused: the executor gates each layer on the operation holding its own tensors.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradsched.costs import RING_MIN_BYTES as RING_MIN_BYTES  # re-exported: the runtime's threshold, by its old name
from gradsched.costs import runs_ring
from gradsched.errors import GradschedError
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER, Operation, Plan, gate_tensor
from gradsched.torch.runtime.groups import gloo_thread_group, side_group, uses_nccl
from gradsched.torch.runtime.layout import Piece
from gradsched.torch.runtime.ops import OP_KINDS, wait_all
from gradsched.torch.runtime.ring import RingWork, ring_all_gather, ring_reduce_scatter, submit

GATHER_TIMEOUT_S = 1800.0  # the gather group's own timeout; each wait is bounded by the executor's
# gloo: each phase of a group goes as collectives of at most this many bytes a rank.  One all-to-all or all-gather
# alone moved about half a shaped link's rate (2 testbed hosts at 1 Gbit/s, a 16 MiB buffer: 142 and 112 ms; in
# 0.5-1 MiB pieces 74-86 and 72-80 ms); dear's GoogLeNet stream of both phases 576 -> 515 ms
# (benchmarks/two_phase_pieces.py, docs/runtime.md; its groups asked for 8-16 threads and ran on gloo's two)
CHUNK_BYTES = 512 << 10
# ... on side groups of this many gloo worker threads each (gloo_thread_group; side_group's thread count was dropped by
# torch 2.13, so these groups had always run on two).  8 testbed hosts at 250 Mbit/s, 8 all-to-alls queued, ms each
# (reduce-scatter / all-gather): groups of 0.56 MiB (BERT-Base's dear) 21.0 / 19.7 on 2 threads, 23.5 / 22.0 on 8,
# 21.3 / 22.9 on 1; of 2 MiB 88 / 86 on 2, 73 / 74 on 8 (benchmarks/results/gloo_ring_phases_8h_250mbit_dear13_threads2.json)
PHASE_THREADS = 2
# RING_MIN_BYTES (gloo beyond two ranks: a group of at least this many bytes goes as a ring) lives in gradsched.costs,
# torch-free, where the simulator prices the phases by it; imported here under the same name.
# the phase groups, by the user's group and the threads asked (a benchmark may set PHASE_THREADS between runs)
_GATHER_GROUPS: dict[tuple[int, int], dist.ProcessGroup] = {}
_SCATTER_GROUPS: dict[tuple[int, int], dist.ProcessGroup] = {}
_RING_GROUPS: dict[int, tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}
# PyTorch 2.13 renamed both (the old names warn FutureWarning on every call); older releases have the old only
all_gather_single: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single: Callable[..., Any] = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def executable(plan: Plan, order: list[int]) -> tuple[Plan, list[int]]:
    """``plan`` as the executor runs it: without its all-gathers (each reduce-scatter's runner gathers),
    with ``order`` renumbered; a plan without two-phase operations is returned as it is."""
    gathers = plan.gathers()
    if not gathers:
        return plan, order
    for j in gathers:
        op = plan.operations[j]
        if gate_tensor(op) != min(s.tensor for s in op.slices):
            raise GradschedError(f"operation {j}: the runtime runs each all-gather gated on its group's first layer; "
                                 f"this one gates on tensor {op.gate}: leave gate out of the plan")
    keep = [j for j, op in enumerate(plan.operations) if op.collective != ALL_GATHER]
    new_index = {j: k for k, j in enumerate(keep)}
    ops = tuple(plan.operations[j] for j in keep)
    return replace(plan, operations=ops), [new_index[j] for j in order if j in new_index]


def gather_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The side group the all-gathers of ``group``'s decoupled operations run on (made once, on every
    rank at the same point: the first decoupled operation's construction, in plan order); on gloo alone,
    with :data:`PHASE_THREADS` worker threads (:func:`gradsched.torch.runtime.groups.gloo_thread_group`:
    ``side_group``'s gloo options are dropped by torch 2.13, which ran these groups on gloo's two)."""
    key = (id(group), PHASE_THREADS)
    if key not in _GATHER_GROUPS:
        _GATHER_GROUPS[key] = gloo_thread_group(group, GATHER_TIMEOUT_S, PHASE_THREADS)
    return _GATHER_GROUPS[key]


def scatter_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The side group the reduce-scatters of ``group``'s decoupled operations run on where gloo carries them
    (:data:`PHASE_THREADS` at once; made once, on every rank right after :func:`gather_group`)."""
    key = (id(group), PHASE_THREADS)
    if key not in _SCATTER_GROUPS:
        _SCATTER_GROUPS[key] = gloo_thread_group(group, GATHER_TIMEOUT_S, PHASE_THREADS)
    return _SCATTER_GROUPS[key]


def ring_groups(group: dist.ProcessGroup) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """The groups ``group``'s rings run on (reduce-scatters, all-gathers), made on first use as
    :func:`gather_group`: each with a thread of its own (:func:`gradsched.torch.runtime.ring.submit`), so that
    no other traffic of those groups interleaves differently on different ranks."""
    key = id(group)
    if key not in _RING_GROUPS:
        _RING_GROUPS[key] = (side_group(group, GATHER_TIMEOUT_S), side_group(group, GATHER_TIMEOUT_S))
    return _RING_GROUPS[key]


def uses_ring(full: torch.Tensor, world: int, nccl: bool) -> bool:
    """Whether a phase of ``full`` goes as a ring: gloo, beyond two ranks, and at least :data:`RING_MIN_BYTES` (4 MiB,
    or ``GRADSCHED_RING_MIN_BYTES``: :func:`gradsched.costs.runs_ring`, the rule the simulator prices the phases by;
    docs/runtime.md, "Why rings").  A ring leaves each rank's shard in one region (chunk ``rank``), the layout a
    sharded optimizer's ``whole`` phases keep, so it serves them too."""
    return runs_ring(world, full.numel() * full.element_size(), nccl)


def chunks(padded: int, world_size: int, element_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each piece of a padded buffer of ``padded`` elements that one collective of a phase
    moves on gloo: consecutive, each a multiple of ``world_size`` elements and at most :data:`CHUNK_BYTES` a
    rank (at least one element a rank)."""
    step = max(1, CHUNK_BYTES // element_bytes) * world_size
    return [(a, min(a + step, padded)) for a in range(0, padded, step)] or [(0, padded)]


class DecoupledAllReduce:
    """A reduce-scatter during backward and its all-gather before the next forward (module docstring)."""

    def __init__(self, index: int, op: Operation, pieces: tuple[Piece, ...], arenas: dict[str, torch.Tensor],
                 group: dist.ProcessGroup, world_size: int, rank: int,
                 on_complete: Callable[[int], None] | None = None, **_context: object) -> None:
        if len(pieces) != 1:
            raise GradschedError(f"operation {index}: a reduce-scatter holds one element type; this one holds "
                                 f"{len(pieces)} (plan it with one operation per dtype, as dear does)")
        self.index = index
        self.piece = arenas[pieces[0].dtype][pieces[0].start:pieces[0].end]
        self.nbytes = self.piece.numel() * self.piece.element_size()
        self.group = group
        self.gather_on = gather_group(group)
        self.nccl = uses_nccl(group, self.piece.device)
        if not self.nccl:
            scatter_group(group)  # made here, on every rank in plan order, as the gather group
            if world_size > 2:
                ring_groups(group)
        self.world_size = world_size
        self.rank = rank
        self.on_complete = on_complete
        self.works: list[dist.Work | RingWork] = []
        n = self.piece.numel()
        self.padded = -(-n // world_size) * world_size
        self.full = self.piece if self.padded == n else torch.zeros(self.padded, dtype=self.piece.dtype,
                                                                     device=self.piece.device)
        # gloo beyond two ranks: the p pieces the all-to-all brings (two ranks receive the other's into the shard)
        self.pieces = scratch_for(self.full, world_size, self.nccl)
        self.shard = torch.empty(self.padded // world_size, dtype=self.piece.dtype, device=self.piece.device)
        self.phase = 0  # 0 idle, 1 reduce-scatter in flight, 2 gather in flight
        # set by a ShardedOptimizer (gradsched.torch.runtime.sharded): keep the reduced shard, gather nothing
        # (the optimizer steps the shard and all-gathers updated parameters into ``full`` itself)
        self.keep_shard = False
        self.fresh = False
        self.first_tensor = min(s.tensor for s in op.slices)  # forward order of the gathers

    def issue(self) -> None:
        if self.full is not self.piece:
            self.full[:self.piece.numel()].copy_(self.piece)
        self.full.div_(self.world_size)
        # the sharded optimizer's layout (keep_shard): this rank's shard in one region, so one collective
        self.works = start_reduce_scatter(self.shard, self.full, self.pieces, self.group, self.rank, self.nccl,
                                          whole=self.keep_shard)
        self.phase = 1

    def _gather(self) -> None:
        """The reduce-scatter is done: this rank's shard, then the all-gather into the piece."""
        if not self.nccl:
            sum_pieces(self.shard, self.full, self.pieces, self.rank, whole=self.keep_shard)
        if self.keep_shard:  # this rank's region of the piece holds the average, the rest its own part
            m = self.shard.numel()
            self.full[self.rank * m:(self.rank + 1) * m].copy_(self.shard)
            self.fresh = True  # a gradient shard the optimizer has not stepped yet
            self.works = []
            self.phase = 2
            if self.on_complete is not None:
                self.on_complete(self.index)
            return
        self.works = self.start_all_gather()
        self.phase = 2
        if self.on_complete is not None:
            done = (self.works[0].get_future() if len(self.works) == 1
                    else torch.futures.collect_all([w.get_future() for w in self.works]))
            done.add_done_callback(lambda _f: self.on_complete(self.index))

    def start_all_gather(self) -> list[dist.Work | RingWork]:
        """Start gathering every rank's shard into ``full`` on the gather group (:func:`start_all_gather`; whole
        where the sharded optimizer keeps its shard in one region)."""
        return start_all_gather(self.full, self.shard, self.pieces, self.group, self.rank, self.nccl,
                                whole=self.keep_shard)

    def is_done(self) -> bool:
        # never starts the gather itself: gathers go in forward order from one place (retire_alone), so
        # that every rank issues the same sequence on the gather group whatever the timing
        return self.phase == 2 and _done(self.works, self.nccl)

    def start_gather(self, timeout_s: float) -> None:
        """Wait for the reduce-scatter (if in flight) and start the all-gather."""
        if self.phase == 1:
            wait_all(self.works, host_wait=not self.nccl, timeout_s=timeout_s, rank=self.rank,
                     what=f"reduce-scatter of operation {self.index} ({self.nbytes} bytes)")
            self._gather()

    def wait(self, timeout_s: float) -> None:
        what = f"operation {self.index} ({self.nbytes} bytes)"
        self.start_gather(timeout_s)
        wait_all(self.works, host_wait=not self.nccl, timeout_s=timeout_s, rank=self.rank,
                 what=f"all-gather of {what}")
        if self.full is not self.piece:
            self.piece.copy_(self.full[:self.piece.numel()])
        self.works = []
        self.phase = 0


def retire_alone(ex: Any, j: int) -> bool:
    """The executor's hook before it waits for operation ``j`` (``Executor._drain_locked``): start the
    gathers of every decoupled operation in flight, in forward order; return whether ``j`` is one
    (the executor then retires it alone, out of issue order; else it drains in issue order as usual).

    Deterministic on every rank: the operations in flight at a drain are those issued and not
    retired, and a decoupled one retires only there or after its gather started here."""
    runners = ex.runners
    decoupled = sorted((k for k in ex.inflight if isinstance(runners[k], DecoupledAllReduce)),
                       key=lambda k: runners[k].first_tensor)
    for k in decoupled:
        runners[k].start_gather(ex.timeout_s)
    return j in decoupled


def spans(full: torch.Tensor, world: int, nccl: bool, whole: bool = False) -> list[tuple[int, int]]:
    """``[start, end)`` of the collectives a phase of ``full`` goes as: one on NCCL or ``whole``, else
    :func:`chunks`."""
    return [(0, full.numel())] if nccl or whole else chunks(full.numel(), world, full.element_size())


def _to_peer(rank: int, m: int) -> list[int]:
    """Two ranks' all-to-all split sizes: ``m`` elements to (from) the other rank, none to (from) oneself."""
    return [0, m] if rank == 0 else [m, 0]


def start_reduce_scatter(shard: torch.Tensor, full: torch.Tensor, scratch: torch.Tensor | None,
                         group: dist.ProcessGroup | None = None, rank: int = 0, nccl: bool = False,
                         whole: bool = False) -> list[dist.Work | RingWork]:
    """Start what leaves ``shard`` this rank's part of the sum of every rank's ``full`` (p times ``shard``'s
    elements), as the runner does: ``reduce_scatter_tensor`` on NCCL; on gloo a ring where :func:`uses_ring` (on
    its thread, which leaves the sum in ``shard``; ``scratch``: at least one shard), else an all-to-all per span
    (:func:`spans`; on :func:`scatter_group` unless ``whole``), of the span into ``scratch`` beyond two ranks,
    on two ranks (``scratch`` None) of the other rank's part alone into ``shard`` (:func:`sum_pieces` then adds
    what it brought)."""
    group = group if group is not None else dist.group.WORLD
    if nccl:
        return [reduce_scatter_single(shard, full, group=group, async_op=True)]
    p = full.numel() // shard.numel()
    if uses_ring(full, p, nccl):
        on, m = ring_groups(group)[0], shard.numel()
        incoming = scratch if scratch is not None else torch.empty_like(shard)

        def scatter() -> None:
            shard.copy_(ring_reduce_scatter(full, on, incoming[:m]))
        return [submit(on, scatter)]
    on = group if whole else scatter_group(group)
    works = []
    for a, b in spans(full, p, nccl, whole):
        m = (b - a) // p
        if scratch is not None:
            works.append(dist.all_to_all_single(scratch[a:b], full[a:b], group=on, async_op=True))
        else:
            peer, split = 1 - rank, _to_peer(rank, m)
            works.append(dist.all_to_all_single(shard[a // p:b // p], full[a + peer * m:a + (peer + 1) * m],
                                                split, split, group=on, async_op=True))
    return works


def sum_pieces(shard: torch.Tensor, full: torch.Tensor, scratch: torch.Tensor | None, rank: int,
               whole: bool = False) -> None:
    """On gloo, after :func:`start_reduce_scatter`'s all-to-alls: ``shard`` = the sum of every rank's part of
    it (two ranks: the other's, received there, plus this rank's own, one addition as ``torch.sum`` of the
    two makes)."""
    p = full.numel() // shard.numel()
    if uses_ring(full, p, False):
        return  # the ring's last step left the sum in the shard
    for a, b in spans(full, p, False, whole):
        m = (b - a) // p
        part = shard[a // p:b // p]
        if scratch is None:
            part.add_(full[a + rank * m:a + (rank + 1) * m])
        else:
            torch.sum(scratch[a:b].view(p, m), dim=0, out=part)


def start_all_gather(full: torch.Tensor, shard: torch.Tensor, scratch: torch.Tensor | None,
                     group: dist.ProcessGroup | None = None, rank: int = 0, nccl: bool = False,
                     whole: bool = False) -> list[dist.Work | RingWork]:
    """Start gathering every rank's ``shard`` into ``full`` on :func:`gather_group`, each span's parts where
    :func:`start_reduce_scatter` took them from: ``all_gather_single`` on NCCL; on gloo an all-to-all per
    span straight into ``full`` (gloo's all-gather allocates a buffer as large as its output per call and
    copies out), beyond two ranks from ``scratch`` (``shard`` copied into each of its parts), on two ranks
    this rank's part copied into place and sent to the other; a ring where :func:`uses_ring` (``shard`` copied
    into this rank's chunk, the rest received in place)."""
    group = group if group is not None else dist.group.WORLD
    on = gather_group(group)
    if nccl:
        return [all_gather_single(full, shard, group=on, async_op=True)]
    p = full.numel() // shard.numel()
    if uses_ring(full, p, nccl):
        ring = ring_groups(group)[1]
        m = shard.numel()
        full[rank * m:(rank + 1) * m].copy_(shard)
        return [submit(ring, lambda: ring_all_gather(full, ring))]
    works = []
    for a, b in spans(full, p, nccl, whole):
        m = (b - a) // p
        part = shard[a // p:b // p]
        if scratch is not None:
            scratch[a:b].view(p, m).copy_(part.expand(p, m))
            works.append(dist.all_to_all_single(full[a:b], scratch[a:b], group=on, async_op=True))
        else:
            peer, split = 1 - rank, _to_peer(rank, m)
            full[a + rank * m:a + (rank + 1) * m].copy_(part)
            works.append(dist.all_to_all_single(full[a + peer * m:a + (peer + 1) * m], part, split, split,
                                                group=on, async_op=True))
    return works


def reduce_scatter(shard: torch.Tensor, full: torch.Tensor, scratch: torch.Tensor | None,
                   group: dist.ProcessGroup | None = None) -> None:
    """:func:`start_reduce_scatter`, waited for, and :func:`sum_pieces`, synchronously (``gradsched netbench``
    times it so; ``scratch``: :func:`scratch_for`'s)."""
    nccl = uses_nccl(group or dist.group.WORLD, full.device)
    rank = dist.get_rank(group)
    for work in start_reduce_scatter(shard, full, scratch, group, rank, nccl):
        work.wait()
    if not nccl:
        sum_pieces(shard, full, scratch, rank)


def all_gather(full: torch.Tensor, shard: torch.Tensor, scratch: torch.Tensor | None,
               group: dist.ProcessGroup | None = None) -> None:
    """Every rank's ``shard`` into ``full``, synchronously, as the runner does it (:func:`start_all_gather`)."""
    nccl = uses_nccl(group or dist.group.WORLD, full.device)
    for work in start_all_gather(full, shard, scratch, group, dist.get_rank(group), nccl):
        work.wait()


def scratch_for(full: torch.Tensor, world: int, nccl: bool) -> torch.Tensor | None:
    """The buffer the two phases need beside ``full`` on ``world`` ranks (None: none): the all-to-all's, as large as
    ``full``; a ring's, one shard."""
    if nccl or world == 2:
        return None
    return torch.empty(full.numel() // world, dtype=full.dtype, device=full.device) if uses_ring(full, world, nccl) \
        else torch.empty_like(full)


def _done(works: list[dist.Work | RingWork], nccl: bool) -> bool:
    return all(w.is_completed() if nccl else w.get_future().done() for w in works)


OP_KINDS[REDUCE_SCATTER] = DecoupledAllReduce
