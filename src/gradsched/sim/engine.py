"""A small deterministic discrete-event simulator of one training iteration.

The model (docs/simulator.md has the figures):

1. **Backward** runs on the compute stream at t = 0 in ``profile.order``; a layer's
   tensors are ready when its backward ends.  A sparse operation's top-k selection
   runs on the same stream right after the layer that completes it, delaying the
   layers after it (OMGS-SGD's timeline).
2. **Communication**: each operation costs the cluster's collective time for its
   bytes (a top-k all-gather moves ``k`` values and ``k`` int32 indices per rank; a
   ``hier-allreduce`` the cluster's two-level cost, docs/cost-model.md).
   Operations are issued to ``channels`` FIFO channels, in plan order (``fifo``) or
   highest priority first among the ready ones (``priority``).  Without a credit
   window an operation is issued only onto an idle channel, so a later,
   higher-priority operation overtakes at every operation boundary (preemption at
   block boundaries).  With ``credit_bytes`` operations are issued while the bytes
   issued but unfinished stay within the window, queueing on busy channels.
   The runtime's own host time per operation (the profile's optional ``op_host``)
   runs on the compute stream: issuing it right after the layer that completes it,
   retiring it (waiting done, results written back) once it is done and the stream
   reaches it, in issue order; an overlapping plan's deferred updates cost
   ``op_host.update_call_s`` each in the next forward, one per layer whose operations
   were not complete at an earlier one (the runtime updates every complete one at once).
   A ``reduce-scatter`` / ``all-gather`` of ``n`` bytes costs the cluster's
   ``reducescatter`` / ``allgather`` of ``n / p`` bytes per rank; an all-gather is
   ready when its reduce-scatter ends and the runtime has reached its first wait after
   backward, where it starts the gathers (``decoupled.retire_alone``): the first forward
   layer's gate, after ``other_s``, in an overlapping plan; the end of backward otherwise
   (plan order still holds under ``fifo``).
3. **Update and next forward**: without ``overlap_forward``, ``other_s`` (the
   optimizer step, the loss, whatever is not a layer) runs when every operation is
   done and the updates applied, then the next forward (the optimizer needs the
   averaged gradients, so none of it can hide communication); with it, ``other_s``
   runs right after backward, overlapping communication, and each layer's forward waits
   only for the operations holding its tensors (steady state: every operation ends
   before the next backward, so one iteration is the period).  In any plan, a layer's
   forward also waits for the all-gathers gated on it (DeAR's pre-forward hook).
4. **Memory**: a merged bucket needs a flat buffer from its first gradient until
   it is reduced; a partitioned or single-tensor operation works in place; a top-k
   operation needs a residual (persistent) and value/index buffers for the gathered
   result while it is in flight; a reduce-scatter's flat buffer lives until its
   all-gather ends.

Everything is O(operations log operations) with closed-form costs, so 1,000
tensors and 1,024 workers simulate in milliseconds.  Where numba is installed
(``gradsched[fast]``) the pass itself runs compiled (:mod:`gradsched.sim._kernel`: the
same floats in the same order) unless a timeline is asked for, contention dilates compute
or communication, or the runtime's retire time is charged; this module's pass is the
reference and the fallback.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from gradsched.cluster import Cluster
from gradsched.queued import QueuedRule
from gradsched.sim._queued import schedule_queued
from gradsched.costs import CollectiveCost
from gradsched.errors import GradschedError
from gradsched.plan import ALL_GATHER, DENSE, HIER, REDUCE_SCATTER, SPARSE, TWO_PHASE, Operation, Plan, gate_tensor
from gradsched.profile import Profile
from gradsched.sim import _kernel
from gradsched.sparsity import sent_bytes
from gradsched.timeline import BACKWARD, COMM, FORWARD, HOST, OTHER, SELECT, UPDATE, WAIT, Timeline

EPS_S = 1e-12  # events closer than this are simultaneous


@dataclass
class SimResult:
    """What one simulated iteration costs."""

    strategy: str
    iteration_s: float
    compute_s: float  # forward + backward + other + selection + update: the time with free communication
    exposed_comm_s: float  # iteration_s - compute_s
    comm_s: float  # total time the channels were busy
    peak_extra_bytes: int
    operations: int
    backward_end_s: float
    comm_end_s: float
    op_start_s: list[float] = field(repr=False, default_factory=list)
    op_end_s: list[float] = field(repr=False, default_factory=list)
    timeline: Timeline | None = field(repr=False, default=None)

    def summary(self) -> dict[str, float | int | str]:
        return {"strategy": self.strategy, "iteration_s": self.iteration_s, "compute_s": self.compute_s,
                "exposed_comm_s": self.exposed_comm_s, "comm_s": self.comm_s, "operations": self.operations,
                "peak_extra_bytes": self.peak_extra_bytes}


def simulate(plan: Plan, profile: Profile, cluster: Cluster, *, channels: int = 1,
             timeline: bool = True) -> SimResult:
    """Predict one steady-state iteration of ``plan`` (``timeline=False`` is faster)."""
    if channels < 1:
        raise GradschedError(f"channels must be at least 1, got {channels}")
    st = _static(plan, profile, cluster)
    kc, kn, lat, op_lat = contention(cluster)
    by_op = _phase_slowdowns(plan, cluster)
    own_figures = any(k is not None for k in by_op)
    if not timeline and kc == 0 and kn == 0 and lat == 0 and not own_figures:
        compiled = _run_compiled(plan, profile, st, channels, op_lat)
        if compiled is not None:  # the same times as _run's, without its spans (sim/_kernel.py)
            return _result(plan, profile, cluster, st, compiled, channels, timeline)
    timing = _run(plan, profile, st, channels, _free, _dilator([], 0.0, op_latency_s=op_lat))
    if kc > 0 or kn > 0 or lat > 0 or own_figures:
        # Fixed point: compute slows while communication is in flight and vice versa;
        # each pass dilates one resource's work by the other's busy intervals of the
        # previous pass.  Converges in a handful of passes; capped for safety.
        for _ in range(MAX_CONTENTION_PASSES):
            comm_busy = _merge([(a, b) for a, b in zip(timing.start, timing.end) if b > a])
            compute_busy = _merge([(a, b) for _, cat, a, b, _ in timing.compute if cat != WAIT and b > a])
            base = _dilator(compute_busy, kn, lat, op_lat)
            on_comm: Dilate | list[Dilate] = base
            if own_figures:  # two-phase operations with their own slowdowns
                own = {k: _dilator(compute_busy, k, lat, op_lat) for k in by_op if k is not None}
                on_comm = [own[k] if k is not None else base for k in by_op]
            nxt = _run(plan, profile, st, channels, _dilator(comm_busy, kc), on_comm)
            done = abs(nxt.iteration - timing.iteration) <= 1e-9 * max(1.0, timing.iteration)
            timing = nxt
            if done:
                break
    return _result(plan, profile, cluster, st, timing, channels, timeline)


def _run_compiled(plan: Plan, profile: Profile, st: _Static, channels: int, op_latency_s: float) -> _Timing | None:
    """:func:`_run`'s pass by the compiled kernel (:mod:`gradsched.sim._kernel`), without compute spans; None
    where it does not apply (numba absent or off, few operations and layers, the runtime's retire time charged:
    the Python pass walks every layer, so a plan of one operation on a thousand layers runs compiled)."""
    ops = plan.operations
    n = len(ops)
    if st.retire_s > 0 or n + len(st.layer_time) < _kernel.MIN_OPERATIONS or not _kernel.enabled():
        return None
    if _queued(plan, st, channels) is not None:
        return None  # queued streams: the Python pass (sim/_queued.py)
    run_pass = _kernel.kernel()
    if run_pass is None:
        return None
    fixed = profile_arrays(profile)
    if st.arrays is None:  # made once per _Static: auto simulates one set of blocks with several windows
        comp_ptr, comp_ops = _csr(st.completes)
        g_ptr, g_ops = _csr(st.gated)
        o_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(op.slices) for op in ops], out=o_ptr[1:])
        o_tensors = np.fromiter((s.tensor for op in ops for s in op.slices), dtype=np.int64, count=int(o_ptr[-1]))
        st.arrays = (comp_ptr, comp_ops, np.array(st.select, dtype=float), np.array(st.cost, dtype=float),
                     np.array(st.op_bytes, dtype=np.int64),
                     np.fromiter((op.priority for op in ops), dtype=np.int64, count=n),
                     np.array(st.after, dtype=np.int64), g_ptr, g_ops, o_ptr, o_tensors)
    comp_ptr, comp_ops, select, cost, nbytes, priority, after, g_ptr, g_ops, o_ptr, o_tensors = st.arrays
    ready, start, end = np.zeros(n), np.zeros(n), np.zeros(n)
    layer_end = np.zeros(len(st.layer_time))
    credit = -1 if plan.credit_bytes is None else plan.credit_bytes
    backward_end, comm_end, iteration = run_pass(
        fixed.layer_time, comp_ptr, comp_ops, select, st.issue_s, cost, nbytes, priority, after,
        plan.scheduling == "fifo", credit, channels, op_latency_s, profile.other_s, plan.overlap_forward,
        st.update_total, st.update_call_s, fixed.forward_s, fixed.update_s, fixed.f_ptr, fixed.f_tensors, g_ptr,
        g_ops, o_ptr,
        o_tensors, profile.num_tensors, ready, start, end, layer_end)
    return _Timing([], ready.tolist(), start.tolist(), end.tolist(), layer_end.tolist(), float(backward_end),
                   float(comm_end), float(iteration))


_SPARSE_MEMO: list[tuple[Cluster, dict[tuple[int, int, float], tuple[float, float, int]]]] = []
_LAST_STATIC: list[tuple[tuple[Operation, ...], Profile, Cluster, _Static]] = []


def _static(plan: Plan, profile: Profile, cluster: Cluster) -> _Static:
    """``_Static`` of ``plan``: the last one made where the operations, profile and cluster are the very
    same objects (it depends on nothing else: ``auto`` simulates one set of blocks with several windows)."""
    if _LAST_STATIC:
        ops, known_profile, known_cluster, st = _LAST_STATIC[0]
        if ops is plan.operations and known_profile is profile and known_cluster is cluster:
            return st
    st = _Static(plan, profile, cluster)
    _LAST_STATIC[:] = [(plan.operations, profile, cluster, st)]
    return st


@dataclass(frozen=True)
class _ProfileArrays:
    """What every simulation of a profile reads (made once per profile: the last few are kept)."""

    layer_time: np.ndarray  # backward, layers in ready order
    forward_s: np.ndarray  # layers in forward order
    update_s: np.ndarray
    f_ptr: np.ndarray  # layer k's tensors: f_tensors[f_ptr[k]:f_ptr[k + 1]]
    f_tensors: np.ndarray
    element_bytes: list[int]  # per tensor
    ready_layer: list[int]  # per tensor: its layer's place in ready order
    forward_layer: list[int]  # per tensor: its layer's place in forward order
    layer_name: list[str]  # layers in ready order: their first tensor's name
    forward: list[tuple[str, float, float, tuple[int, ...]]]  # forward layers: (name, forward_s, update_s, tensors)


_PROFILES: list[tuple[Profile, _ProfileArrays]] = []  # the last few profiles simulated, by identity


def profile_arrays(profile: Profile) -> _ProfileArrays:
    """``profile``'s layers as the simulator reads them (kept for the last few profiles)."""
    for known, arrays in _PROFILES:
        if known is profile:
            return arrays
    layers, layer_of, tensors = profile.layer_table, profile.layer_of, profile.tensors
    forward_pos = {layer_of[ts[0]]: k for k, ts in enumerate(layers.forward)}
    f_ptr, f_tensors = _csr(layers.forward)
    arrays = _ProfileArrays(np.array(layers.backward_s, dtype=float), np.array(layers.forward_s, dtype=float),
                            np.array(layers.update_s, dtype=float), f_ptr, f_tensors,
                            [t.element_bytes for t in tensors], [layers.position[lid] for lid in layer_of],
                            [forward_pos[lid] for lid in layer_of], [tensors[ts[0]].name for ts in layers.ready],
                            [(tensors[ts[0]].name, f, u, ts)
                             for ts, f, u in zip(layers.forward, layers.forward_s, layers.update_s)])
    _PROFILES.insert(0, (profile, arrays))
    del _PROFILES[4:]
    return arrays


def _csr(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` as (pointers, values): row k is ``values[pointers[k]:pointers[k + 1]]``."""
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(ptr[-1]))
    return ptr, values


def contention(cluster: Cluster) -> tuple[float, float, float, float]:
    """``(compute_slowdown, comm_slowdown, busy_latency_s, op_latency_s)`` from the cluster's
    optional ``contention``.

    While a collective is in flight, compute runs ``1 + compute_slowdown`` times
    slower; while compute runs, a collective runs ``1 + comm_slowdown`` times slower,
    and each collective that overlaps compute pays ``busy_latency_s`` more (CPU
    collectives share the cores with the model: DESIGN.md's testbed section; every
    step of a collective waits for its thread to get a core, which costs small
    operations far more than their bytes do).  Every collective pays ``op_latency_s``
    more, compute or not: what an operation issued by a runtime, among others, costs
    beyond one timed alone (docs/simulator.md, "Contention").  A reduce-scatter or
    all-gather may have its own communication slowdown (:func:`_phase_slowdowns`)."""
    c = cluster.contention
    if c is None:
        return 0.0, 0.0, 0.0, 0.0
    return c.compute_slowdown, c.comm_slowdown, c.busy_latency_s, c.op_latency_s


def _phase_slowdowns(plan: Plan, cluster: Cluster) -> list[float | None]:
    """Per operation, the communication slowdown of a two-phase one where the cluster's contention gives its
    collective its own figure (``reducescatter_comm_slowdown``, ``allgather_comm_slowdown``), else None: as
    every other operation, ``comm_slowdown``.  All None for clusters without those figures."""
    c = cluster.contention
    if c is None or (c.reducescatter_comm_slowdown is None and c.allgather_comm_slowdown is None):
        return [None] * len(plan.operations)
    return [c.comm_slowdown_of(op.collective) if op.collective in TWO_PHASE else None for op in plan.operations]


MAX_CONTENTION_PASSES = 30
Dilate = Callable[[float, float], float]  # (start_s, work_s) -> end_s


def _free(start_s: float, work_s: float) -> float:
    return start_s + work_s


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _dilator(busy: list[tuple[float, float]], slowdown: float, latency_s: float = 0.0,
             op_latency_s: float = 0.0) -> Dilate:
    """End time of ``work_s`` started at ``start_s`` that runs ``1 + slowdown`` times
    slower inside the ``busy`` intervals (sorted, disjoint), plus ``latency_s`` once
    if it starts inside one of them, plus ``op_latency_s`` in any case (latencies are
    waiting, not work: they are not stretched)."""
    if (slowdown == 0 and latency_s == 0) or not busy:
        return _free if op_latency_s == 0 else (lambda start_s, work_s: start_s + work_s + op_latency_s)
    starts = [a for a, _ in busy]
    factor = 1.0 + slowdown

    def finish(start_s: float, work_s: float) -> float:
        end = _stretch(start_s, work_s) + op_latency_s
        if latency_s > 0:
            k = bisect.bisect_right(starts, start_s) - 1
            if k >= 0 and busy[k][0] <= start_s < busy[k][1]:
                end += latency_s  # waiting for a core, not work: not stretched
        return end

    def _stretch(start_s: float, work_s: float) -> float:
        t, left = start_s, work_s
        k = max(0, bisect.bisect_right(starts, t) - 1)
        while left > 0 and k < len(busy):
            a, b = busy[k]
            if b <= t:
                k += 1
                continue
            if t < a:  # free stretch before the next busy interval
                if left <= a - t:
                    return t + left
                left -= a - t
                t = a
            capacity = (b - t) / factor
            if left <= capacity:
                return t + left * factor
            left -= capacity
            t = b
            k += 1
        return t + left

    return finish


class _Static:
    """What does not change between contention passes: sizes, costs, layer structure."""

    def __init__(self, plan: Plan, profile: Profile, cluster: Cluster) -> None:
        # long function: one walk over the operations fills every per-operation list; split, each
        # part would walk them again (thousands of blocks per plan in auto's search)
        ops = plan.operations
        n_ops = len(ops)
        fixed = profile_arrays(profile)
        elem, layer_pos = fixed.element_bytes, fixed.ready_layer
        world = cluster.world_size
        dense = _dense_costs(ops, cluster)
        self.op_bytes = [0] * n_ops
        self.cost = [0.0] * n_ops
        self.select = [0.0] * n_ops
        self.inflight_mem = [0] * n_ops  # buffers alive while the op is being prepared / in flight
        self.residual_bytes = 0
        self.completes: list[list[int]] = [[] for _ in fixed.layer_time]  # ops each backward layer completes
        self.first_layer = [0] * n_ops
        by_collective: dict[str, list[int]] = {}
        sparse: list[int] = []
        for j, op in enumerate(ops):
            slices = op.slices
            collective = op.collective
            if len(slices) == 1:  # the common case (whole tensors, blocks), without a generator
                s0 = slices[0]
                nb = (s0.end - s0.start) * elem[s0.tensor]
                first = last = layer_pos[s0.tensor]
            else:
                nb = sum([(s.end - s.start) * elem[s.tensor] for s in slices])
                positions = [layer_pos[s.tensor] for s in slices]
                first, last = min(positions), max(positions)
            self.op_bytes[j] = nb
            if collective == SPARSE:
                sparse.append(j)
            else:
                by_collective.setdefault(collective, []).append(j)
                if (len(slices) > 1 and collective != ALL_GATHER) or collective == REDUCE_SCATTER:
                    self.inflight_mem[j] = nb  # flat bucket buffer (a reduce-scatter's until its all-gather ends)
            if collective != ALL_GATHER:  # an all-gather is ready when its reduce-scatter ends, not when a layer does
                self.completes[last].append(j)
                self.first_layer[j] = first
        for collective, members in by_collective.items():
            for j, c in zip(members, _times_s(dense[collective], [self.op_bytes[j] for j in members])):
                self.cost[j] = c
        if sparse:
            self._sparse(ops, sparse, cluster, elem, world)
        self.layer_time = profile.layer_table.backward_s
        self.layer_name = fixed.layer_name
        self.forward = fixed.forward  # forward layers in forward order: (name, forward_s, update_s, tensors)
        self.update_total = profile.update_s
        self.issue_s, self.retire_s = profile.op_host_s()
        self.update_call_s = profile.op_update_call_s()  # charged to overlapping plans only
        self._two_phase(plan, profile, fixed.forward_layer, REDUCE_SCATTER in by_collective)
        self.rules = queued_rules(ops, cluster, self.cost, self.op_bytes)
        self.arrays: tuple[np.ndarray, ...] | None = None  # the compiled pass's, made on its first use

    def _sparse(self, ops: tuple[Operation, ...], sparse: list[int], cluster: Cluster, elem: list[int],
                world: int) -> None:
        """Cost, selection time and buffers of the top-k operations ``sparse`` (each size's figures kept for the
        cluster's next simulation: ``omgs`` and ``topk`` simulate many groupings of the same tensors)."""
        if not _SPARSE_MEMO or _SPARSE_MEMO[0][0] is not cluster or len(_SPARSE_MEMO[0][1]) > 100_000:
            _SPARSE_MEMO[:] = [(cluster, {})]
        memo = _SPARSE_MEMO[0][1]
        for j in sparse:
            op = ops[j]
            if op.density is None:
                raise GradschedError(f"operation {j} is a top-k all-gather without a density (the fraction of its "
                                     "elements sent): give the plan's operation one (docs/formats.md)")
            numel = sum([s.numel for s in op.slices])
            key = (numel, elem[op.slices[0].tensor], op.density)
            known = memo.get(key)
            if known is None:
                per_rank = sent_bytes(op.density, numel, key[1])
                memo[key] = known = (cluster.cost("allgather").time_s(per_rank), cluster.selection_s(numel), per_rank)
            self.cost[j], self.select[j], per_rank = known
            nb = self.op_bytes[j]
            self.residual_bytes += nb
            self.inflight_mem[j] = per_rank * (world + 1) + nb  # own top-k, gathered top-ks, rebuilt dense

    def _two_phase(self, plan: Plan, profile: Profile, forward_layer: list[int], decoupled: bool) -> None:
        """Each all-gather issues once its reduce-scatter is done (``after``), frees the reduce-scatter's
        buffer when it ends (``freed_by``) and gates one forward layer (``gated``)."""
        n_ops = len(plan.operations)
        self.after = [-1] * n_ops
        self.freed_by = list(range(n_ops))
        self.gated: list[list[int]] = [[] for _ in profile.layer_table.forward]  # all-gathers each forward layer waits for
        if not decoupled and not any(op.collective == ALL_GATHER for op in plan.operations):
            return
        for ag, rs in plan.gathers().items():
            self.after[ag] = rs
            self.freed_by[rs] = ag
        for j, op in enumerate(plan.operations):
            if op.collective == ALL_GATHER:
                self.gated[forward_layer[gate_tensor(op)]].append(j)


def _queued(plan: Plan, st: _Static, channels: int) -> list[QueuedRule] | None:
    """Each operation's queued rule where the plan runs as queued streams (:func:`queued_rules`, one channel,
    no credit window); else None: the one-at-a-time pass, compiled where it can be."""
    return st.rules if channels == 1 and plan.credit_bytes is None else None


def queued_rules(ops: Sequence[Operation], cluster: Cluster, cost: Sequence[float] | None = None,
                 op_bytes: Sequence[int] | None = None) -> list[QueuedRule] | None:
    """Each operation's queued rule (:mod:`gradsched.queued`), where every operation of the plan is a reduce-scatter
    or an all-gather, the cluster has a rule for each collective it uses, and one of them gains; else None (the
    one-channel pass: all-reduces were measured gaining nothing in a queue, docs/cost-model.md).  With each
    operation's ``cost`` alone and ``op_bytes``, its rule gains at most down to the queue's timed seconds a byte
    (:meth:`~gradsched.queued.QueuedRule.for_operation`); None too where then none gains."""
    if not ops:
        return None
    names = {op.collective for op in ops}
    if not names <= {REDUCE_SCATTER, ALL_GATHER}:
        return None
    found = {name: cluster.queued_rule(name) for name in names}
    rules = {name: r for name, r in found.items() if r is not None}
    if len(rules) < len(found) or all(r.speedup <= 1.0 for r in rules.values()):
        return None
    out = [rules[op.collective] for op in ops]
    if cost is not None and op_bytes is not None:  # each capped at the queue's measured rate (QueuedRule.for_operation)
        out = [r.for_operation(c, nb) for r, c, nb in zip(out, cost, op_bytes)]
    return out if any(r.speedup > 1.0 for r in out) else None


def _times_s(cost: CollectiveCost, nbytes: list[int]) -> list[float]:
    """``cost.time_s`` of each size: a plain line with numpy (the same arithmetic), else one at a time."""
    if type(cost) is CollectiveCost and cost.points is None and len(nbytes) > 8:
        return cost.times_s(nbytes).tolist()
    return [cost.time_s(nb) for nb in nbytes]


def _dense_costs(ops, cluster: Cluster) -> dict:
    """The cost of each dense collective the plan uses, by the bytes an operation holds
    (``hier-allreduce`` needs a topology)."""
    names = {op.collective for op in ops if not op.sparse} | {DENSE}
    if HIER in names and cluster.topology is None:
        raise GradschedError("the plan has hier-allreduce operations (two-level all-reduce) but the cluster has no "
                             "topology to cost them: give a cluster with one (docs/formats.md, \"topology\"), or "
                             "plan with the option hierarchical=never")
    return {name: cluster.operation_cost(name) for name in names}


@dataclass
class _Timing:
    """One pass's times: compute spans ``(name, cat, start, end, args)`` and operations."""

    compute: list[tuple[str, str, float, float, dict]]
    ready: list[float]
    start: list[float]
    end: list[float]
    layer_end: list[float]
    backward_end: float
    comm_end: float
    iteration: float


def _run(plan: Plan, profile: Profile, st: _Static, channels: int, on_compute: Dilate,
         on_comm: Dilate | list[Dilate]) -> _Timing:
    # long function: one pass over the timeline: backward, communication, update and forward share
    # clocks and spans; split, they would pass a dozen lists between them
    n_ops = len(plan.operations)
    spans: list[tuple[str, str, float, float, dict]] = []
    # ---- backward on the compute stream, selections inserted after the completing layer
    layer_end = [0.0] * len(st.layer_time)
    ready = [0.0] * n_ops
    clock = 0.0
    for p, dt in enumerate(st.layer_time):
        if dt > 0:
            end = on_compute(clock, dt)
            spans.append((st.layer_name[p], BACKWARD, clock, end, {}))
            clock = end
        layer_end[p] = clock
        for j in st.completes[p]:
            if st.select[j] > 0:
                end = on_compute(clock, st.select[j])
                spans.append((f"select op{j}", SELECT, clock, end, {"op": j}))
                clock = end
            if st.issue_s > 0:  # the hook issues it: host time before it starts and the next layer waits for
                end = on_compute(clock, st.issue_s)
                spans.append((f"issue op{j}", HOST, clock, end, {"op": j}))
                clock = end
            ready[j] = clock
    backward_end = clock

    # ---- other work (overlapping plans: before the first forward's wait), then communication
    t = backward_end

    def other(t: float) -> float:
        if profile.other_s <= 0:
            return t
        end = on_compute(t, profile.other_s)
        spans.append(("other", OTHER, t, end, {}))
        return end

    if plan.overlap_forward:
        t = other(t)  # the optimizer's bookkeeping and the loss run while the operations are in flight
    start = [0.0] * n_ops
    finish = [0.0] * n_ops
    # the runtime issues all-gathers at its first wait after backward (decoupled.retire_alone): the first
    # forward layer's gate (overlapping plans) or the end of backward, never before
    rules = _queued(plan, st, channels)
    comm_of = on_comm if isinstance(on_comm, list) else None  # per operation (_phase_slowdowns)
    one = _free if isinstance(on_comm, list) else on_comm
    if rules is not None:  # several in flight, the rate shared
        schedule_queued(plan.scheduling == "fifo", [op.priority for op in plan.operations], ready, st.cost,
                        rules, start, finish, one, st.after, gather_from_s=t, comm_of=comm_of)
    else:
        _schedule(plan, ready, st.cost, st.op_bytes, channels, start, finish, one, st.after, gather_from_s=t,
                  comm_of=comm_of)
    comm_end = max(finish, default=0.0)

    # ---- updates and the next forward
    by_issue = sorted(range(n_ops), key=lambda j: (start[j], j))
    settled = 0  # operations retired so far, a prefix of by_issue

    def settle(t: float, upto: int, label: str) -> float:
        """Wait for the operations in issue order up to position ``upto`` and retire each once
        it is done (its host time), as the runtime retires operations: oldest first."""
        nonlocal settled
        if st.retire_s <= 0:
            need = max((finish[j] for j in by_issue[settled:upto + 1]), default=t)
            settled = max(settled, upto + 1)
            if need > t:
                spans.append((label, WAIT, t, need, {}))
            return max(t, need)
        for j in by_issue[settled:upto + 1]:
            if finish[j] > t + EPS_S:
                spans.append((label, WAIT, t, finish[j], {}))
                t = finish[j]
            end = on_compute(t, st.retire_s)
            spans.append((f"retire op{j}", HOST, t, end, {"op": j}))
            t = end
        settled = max(settled, upto + 1)
        return t

    if not plan.overlap_forward:
        t = settle(t, n_ops - 1, "wait for communication")
        if st.update_total > 0:
            end = on_compute(t, st.update_total)
            spans.append(("update", UPDATE, t, end, {}))
            t = end
        t = other(t)  # the optimizer step needs the averaged gradients: it cannot overlap communication
    last_holding = [-1] * profile.num_tensors  # overlapping plans: the latest issued operation each tensor waits for
    if plan.overlap_forward:
        for k, j in enumerate(by_issue):
            for s in plan.operations[j].slices:
                last_holding[s.tensor] = k  # by_issue is in issue order: the last one seen is the latest
    issue_pos = {j: k for k, j in enumerate(by_issue)}
    applied = 0  # overlapping plans: the operations (a prefix of by_issue) whose updates are applied
    for (name, fwd, upd, tensors), gated in zip(st.forward, st.gated):
        if gated:  # all-gathers gate this layer's forward in any plan
            t = settle(t, max(issue_pos[j] for j in gated), f"wait {name}")
        if plan.overlap_forward:
            need = max(last_holding[i] for i in tensors)
            t = settle(t, need, f"wait {name}")
            if need >= applied and st.update_call_s > 0:
                # one deferred update (DistributedOptimizer.apply): this layer's operations and every one
                # complete by now, so a layer whose updates went with an earlier one costs no call
                applied = need + 1
                while applied < n_ops and finish[by_issue[applied]] <= t + EPS_S:
                    applied += 1
                end = on_compute(t, st.update_call_s)
                spans.append((f"update call {name}", HOST, t, end, {}))
                t = end
            if upd > 0:
                end = on_compute(t, upd)
                spans.append((f"update {name}", UPDATE, t, end, {}))
                t = end
        if fwd > 0:
            end = on_compute(t, fwd)
            spans.append((name, FORWARD, t, end, {}))
            t = end
    return _Timing(spans, ready, start, finish, layer_end, backward_end, comm_end, t)


def _result(plan: Plan, profile: Profile, cluster: Cluster, st: _Static, timing: _Timing, channels: int,
            timeline: bool) -> SimResult:
    ops = plan.operations
    n_ops = len(ops)
    # free communication: an overlapping plan's updates are one deferred call at the first layer
    compute = profile.compute_s + sum(st.select) + n_ops * (st.issue_s + st.retire_s) + \
        (st.update_call_s if plan.overlap_forward else 0.0)
    # ---- memory over time
    if timeline:
        deltas: list[tuple[float, int]] = []
        for j in range(n_ops):
            if st.inflight_mem[j]:
                alloc_at = (timing.layer_end[st.first_layer[j]] if not ops[j].sparse
                            else timing.ready[j] - st.select[j] - st.issue_s)
                deltas.append((alloc_at, st.inflight_mem[j]))
                deltas.append((timing.end[st.freed_by[j]], -st.inflight_mem[j]))
        deltas.sort()  # by time, frees (negative) before allocations at the same instant
        live = st.residual_bytes
        peak = live
        samples = [(0.0, live)]
        for when, delta in deltas:
            live += delta
            peak = max(peak, live)
            samples.append((when, live))
    else:
        peak = _peak_bytes(ops, st, timing)
    tl = None
    if timeline:
        tl = Timeline(meta={"strategy": plan.strategy, "model": profile.model, "world_size": cluster.world_size,
                            "label": f"{plan.strategy} (predicted)"})
        for name, cat, a, b, args in timing.compute:
            tl.add(name, cat, "compute", a, b - a, **args)
        for j in range(n_ops):
            tl.add(f"op{j}", COMM, f"comm{_channel_of(j, plan, channels)}", timing.start[j],
                   timing.end[j] - timing.start[j], op=j, bytes=st.op_bytes[j], collective=ops[j].collective,
                   priority=ops[j].priority)
        tl.memory = samples
    comm_busy = sum(b - a for a, b in zip(timing.start, timing.end))
    if st.rules is not None:  # operations in flight together: the time any was (docs/cost-model.md, "Queued streams")
        comm_busy = sum(b - a for a, b in _merge(list(zip(timing.start, timing.end))))
    return SimResult(plan.strategy, timing.iteration, compute, max(0.0, timing.iteration - compute), comm_busy, peak,
                     n_ops, timing.backward_end, timing.comm_end, timing.start, timing.end, tl)


def _peak_bytes(ops: tuple[Operation, ...], st: _Static, timing: _Timing) -> int:
    """:func:`_result`'s peak of the memory samples without the samples: the same allocations and frees in
    the same order (by time, frees first at the same instant), summed with numpy."""
    mem = np.array(st.inflight_mem, dtype=np.int64)
    held = np.flatnonzero(mem)
    if held.size == 0:
        return st.residual_bytes
    sparse = np.array([ops[j].sparse for j in held.tolist()], dtype=bool)
    ready = np.array(timing.ready, dtype=float)[held]
    dense_at = np.array(timing.layer_end, dtype=float)[np.array(st.first_layer, dtype=np.int64)[held]]
    alloc_at = np.where(sparse, ready - np.array(st.select, dtype=float)[held] - st.issue_s, dense_at)
    free_at = np.array(timing.end, dtype=float)[np.array(st.freed_by, dtype=np.int64)[held]]
    times = np.concatenate([alloc_at, free_at])
    deltas = np.concatenate([mem[held], -mem[held]])
    live = st.residual_bytes + np.cumsum(deltas[np.lexsort((deltas, times))])
    return int(max(st.residual_bytes, int(live.max())))


def _channel_of(j: int, plan: Plan, channels: int) -> int:
    return 0 if channels == 1 else j % channels  # display only


def _schedule(plan: Plan, ready: list[float], cost: list[float], nbytes: list[int], channels: int,
              start: list[float], end: list[float], on_comm: Dilate = _free, after: list[int] | None = None,
              gather_from_s: float = 0.0, comm_of: Sequence[Dilate] | None = None) -> None:
    """Fill ``start``/``end`` of every operation (see the module docstring, point 2).  ``after[j]``: an
    earlier operation that must end before ``j`` is ready (an all-gather's reduce-scatter), or -1; such an
    operation is ready no earlier than ``gather_from_s`` either (when the runtime starts its gathers).
    ``comm_of[j]``, where given, dilates operation ``j`` instead of ``on_comm``."""
    # long function: the scheduling disciplines (fifo, credit, priority) share the channels' state; each branch is short
    n = len(ready)
    if n == 0:
        return
    if comm_of is None:
        comm_of = [on_comm] * n
    credit = plan.credit_bytes
    free = [0.0] * channels  # when each channel finishes what it was given
    after = after or [-1] * n
    dependents: dict[int, list[int]] = {}
    for j, first in enumerate(after):
        if first >= 0:
            dependents.setdefault(first, []).append(j)
    if plan.scheduling == "fifo" and credit is None:
        last_start = 0.0
        for j in range(n):
            if after[j] >= 0:
                ready[j] = max(end[after[j]], gather_from_s)  # list order puts the reduce-scatter first
            c = min(range(channels), key=free.__getitem__)
            s = max(ready[j], free[c], last_start)
            start[j], end[j] = s, comm_of[j](s, cost[j])
            free[c] = end[j]
            last_start = s
        return

    by_ready = sorted((j for j in range(n) if after[j] < 0), key=lambda j: (ready[j], j))
    n_free = len(by_ready)  # operations ready by their layers; the others when what they wait for ends
    unlocked: list[tuple[float, int]] = []  # (ready, index) of operations whose predecessor was issued
    nxt = 0  # next op (in by_ready) not yet known to be ready
    fifo = plan.scheduling == "fifo"
    queue: list[tuple[int, int]] = []  # ready, unissued: (priority, index); fifo uses (index, index)
    finishing: list[tuple[float, int]] = []  # (end, bytes) of issued ops
    inflight = 0
    issued = 0
    next_fifo = 0
    is_ready = [False] * n
    t = 0.0
    while issued < n:
        # events within EPS count as simultaneous, so float noise in summed times
        # (0.1 + 0.2 + 0.3 > 0.6) cannot reorder operations that tie exactly
        while nxt < n_free and ready[by_ready[nxt]] <= t + EPS_S:
            j = by_ready[nxt]
            is_ready[j] = True
            if not fifo:
                heapq.heappush(queue, (plan.operations[j].priority, j))
            nxt += 1
        while unlocked and unlocked[0][0] <= t + EPS_S:
            j = heapq.heappop(unlocked)[1]
            is_ready[j] = True
            if not fifo:
                heapq.heappush(queue, (plan.operations[j].priority, j))
        while finishing and finishing[0][0] <= t + EPS_S:
            inflight -= heapq.heappop(finishing)[1]
        progressed = True
        while progressed and issued < n:
            progressed = False
            if fifo:
                cand = next_fifo if next_fifo < n and is_ready[next_fifo] else None
            else:
                cand = queue[0][1] if queue else None
            if cand is None:
                break
            c = min(range(channels), key=free.__getitem__)
            if credit is None:
                ok = free[c] <= t + EPS_S
            else:
                ok = inflight == 0 or inflight + nbytes[cand] <= credit
            if not ok:
                break
            if fifo:
                next_fifo += 1
            else:
                heapq.heappop(queue)
            s = max(t, free[c])
            start[cand], end[cand] = s, comm_of[cand](s, cost[cand])
            free[c] = end[cand]
            inflight += nbytes[cand]
            heapq.heappush(finishing, (end[cand], nbytes[cand]))
            for d in dependents.get(cand, ()):
                ready[d] = max(end[cand], gather_from_s)
                heapq.heappush(unlocked, (ready[d], d))
            issued += 1
            progressed = True
        if issued >= n:
            break
        # advance to the next moment something can change
        candidates = []
        if nxt < n_free:
            candidates.append(ready[by_ready[nxt]])
        if unlocked:
            candidates.append(unlocked[0][0])
        if finishing:
            candidates.append(finishing[0][0])
        if credit is None:
            later = [f for f in free if f > t]
            if later:
                candidates.append(min(later))
        t_next = min(candidates) if candidates else t
        if t_next <= t:  # nothing changes: should not happen, guard against a stall
            t_next = min([f for f in free if f > t] + [x for x in candidates if x > t], default=t)
            if t_next <= t:
                raise RuntimeError("simulator stalled: no operation can be issued")
        t = t_next
