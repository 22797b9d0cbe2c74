"""``usbyte``: US-Byte's unequal-sized blocks and searched priorities (Gao et al., TPDS 2024).

ByteScheduler cuts every tensor into equal blocks and sends the layers closest to
the input first, so the next forward can start early.  US-Byte sizes each block to
the gap it has to fill and searches the layer priorities:

Phase 1, during backward.  Whenever the channel frees at ``t`` before the next
gradient is ready at ``r``, the highest-priority ready layer with data left sends a
block sized to the gap ``g = r - t``: one unit if ``g < alpha``;
``ceil((g - alpha) / (beta * unit))`` units if ``alpha <= g < T(rest)``; otherwise all
that is left.  Phase 2, after backward: each layer's remaining data goes as one
operation, highest priority first, and the next iteration's forward of a layer waits
only for that layer's operations (``overlap_forward``).

Priorities start front-first (input layer first).  The search then walks the layers
from the output to the input; where other layers become ready while a layer's first
block is on the wire, it tries promoting the layer ahead of all of them and keeps
the change when the modelled iteration gets shorter (the paper's search: O(L) tries).
A try costs the phase-1 blocks it replays, most for the layers nearest the output,
and its gain is often one start-up, at any point of the walk: a fixed cap on the tries
(24 until issue 40) cost up to 0.73% of the iteration against the full search on
random profiles (``benchmarks/usbyte_search.py``).  So there is no cap by default
(``max_evaluations`` sets one); once ``patience`` tries in a row have not gained, only
the tries cheap for that dry spell go on, those that replay at most an eighth of phase 1
(near its end, where late gains were found) or at most ``patience * 256 / dry spell``
blocks (:func:`_skipped`), and a kept one starts the count again (docs/strategies.md).  With numba
installed (``gradsched[fast]``) the search runs compiled, with the same plans
(:mod:`gradsched.planners._usbyte_jit`; this module's model is its reference and fallback).

Two rules where gradsched and the paper differ are options, chosen by simulation when
left out (docs/strategies.md has the comparison): ``window`` -- promote over the layers
ready while the first block is on the wire (``"block"``) or within the time to send the
whole layer from its start (``"layer"``, nearest the paper's, whose window starts at the
layer's own ready time); ``extend`` -- a layer's
back-to-back phase-1 blocks go as one message (the paper's block extension, with
every element still sent exactly once).  Two differences are not options: phase 2 goes
by the searched priorities (the authors' code sends the remainders front-first, its
``P_2`` never searched), and the walk goes on with the next layer after a kept
promotion (the authors' resumes below the layers it was promoted over).

One step is gradsched's own: ``merge_bytes`` -- before any of this, consecutive layers
(in the order their gradients become ready) are merged into groups of at least that many
bytes, each scheduled as one layer, as MG-WFBP merges gradients to save start-ups.  0,
the default, keeps the paper's layers; ``auto`` searches 256 KiB, 1 MiB and 4 MiB beside
it, and at run time measures its choice against the default (docs/strategies.md has the
figures).  And ``groups`` replaces the blocks: whole groups contiguous in ready order, sent by
US-Byte's ordering (:mod:`gradsched.planners._contiguous`; ``auto`` tries ``groups=0``).

The model below is the simulator's: the plan lists every block as one operation
whose priority is its layer's rank, blocks of a layer in order, so priority
scheduling replays phase 1 exactly (when the channel frees, the top-priority ready
layer with data left is the one whose next block has the lowest priority number;
its blocks tie and go in list order).

A "layer" here is the tensors of one profile layer with one element size (blocks
never mix element sizes).  ``unit_bytes`` defaults to 4 MiB, ByteScheduler's default
block (1M fp32 elements): in a gap shorter than ``alpha`` US-Byte sends one unit and
pays a whole start-up for it, so a larger unit carries more data per start-up, while
a gap-filling block overshoots its gap by less than one unit.  Measured in simulation
(docs/strategies.md), 4 MiB was never slower than 256 KiB or 1 MiB and within 0.5%
of 16-64 MiB on GoogLeNet and synthetic profiles.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import numbers
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, NamedTuple, TypeVar

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.errors import GradschedError
from gradsched.plan import DENSE, HIER, Plan, Slice, block_operations, new_operation, new_slice
from gradsched.planners import _collective as coll
from gradsched.planners import _contiguous
from gradsched.planners import _usbyte_jit as _jit
from gradsched.planners._usbyte_eval import BlockPricer
from gradsched.planners.options import Option
from gradsched.planners.registry import check_options, register
from gradsched.profile import Profile
from gradsched.sim.engine import EPS_S  # the simulator's simultaneity: the plan must replay exactly

assert _jit.EPS_S == EPS_S  # the compiled search's simultaneity is the simulator's

DEFAULT_UNIT_BYTES = 4 << 20
DEFAULT_MAX_EVALUATIONS = None  # no fixed cap (issue 40: a cap of 24 cost up to 0.73% against the full search)
DEFAULT_PATIENCE = 24  # tries in a row without a gain before only the cheap ones go on (search_priorities)
CHEAP_TAIL = 1 / 8  # a try that replays at most this share of phase 1's blocks is cheap
DRY_SPELL_BLOCKS = 256  # after s tries without a gain, a try may also replay patience * this / s blocks


def merged_layers(profile: Profile, merge_bytes: int) -> tuple[int, ...]:
    """Each tensor's group: consecutive layers, in the order their gradients become ready,
    merged into groups of at least ``merge_bytes`` (the last may be smaller); 0: the
    profile's own layers.  A group is ready when its last layer is."""
    if merge_bytes <= 0:
        return profile.layer_of
    layer_of, tensors = profile.layer_of, profile.tensors
    group_of: dict[int, int] = {}
    group, size = 0, 0
    for i in profile.order:
        lid = layer_of[i]
        if lid not in group_of:
            if size >= merge_bytes:
                group, size = group + 1, 0
            group_of[lid] = group
        size += tensors[i].bytes
    return tuple(group_of[lid] for lid in layer_of)


class _Layer(NamedTuple):
    """One layer's tensors of one element size: the unit US-Byte schedules (a named tuple: made
    once per layer per plan, cheaper than a frozen dataclass)."""

    tensors: tuple[int, ...]  # forward order
    numel: int
    element_bytes: int
    ready_s: float
    layer: int  # profile layer id (for next-forward gating)
    forward_rank: int  # position of its first tensor in forward order


@dataclass
class Schedule:
    """What the model predicts for one priority order."""

    iteration_s: float
    blocks: list[tuple[int, int, int, float, float]]  # (layer unit, first element, end element, start_s, end_s)
    decide_s: list[float] = field(default_factory=list)  # the model's clock when each block was chosen
    # a dry run's phase 2, not yet in ``blocks``: (the units left as sorted heap keys, start, clock, left, sent)
    pending: tuple | None = field(default=None, repr=False)
    # made when first needed (_block_arrays): each block's unit and end, and the running largest end + after
    arrays: tuple | None = field(default=None, repr=False, compare=False)
    # the simulator's iteration (one channel, no timeline) where predict simulated this plan to choose it
    simulated_s: float | None = field(default=None, compare=False)


class _Units(NamedTuple):
    """The units US-Byte schedules (a layer's tensors of one element size), as arrays indexed by
    unit, units in the order they first appear in the ready order (:func:`_unit_table`)."""

    numel: np.ndarray  # int64: elements
    elem: np.ndarray  # int64: bytes per element
    ready: np.ndarray  # float: when the last of its tensors is ready
    layer: np.ndarray  # int64: the scheduled layer id (profile layer, or merged group)
    ptr: np.ndarray  # int64 (units + 1): unit u's tensors are tensors[ptr[u]:ptr[u + 1]]
    tensors: np.ndarray  # int64: each unit's tensors, in forward order


def _unit_table(profile: Profile, layer_of: tuple[int, ...], ready_t: np.ndarray) -> _Units:
    """Each layer's tensors of one element size as one unit (``layer_of``: each tensor's layer as
    scheduled), in arrays: no Python object per unit."""
    tensors = profile.tensors
    n = len(tensors)
    numel = np.array([t.numel for t in tensors], dtype=np.int64)
    elem = np.array([t.bytes for t in tensors], dtype=np.int64) // numel
    order = np.array(profile.order, dtype=np.int64)
    lay = np.array(layer_of, dtype=np.int64)
    if len(set(layer_of)) == n:  # every tensor its own layer (the common case): unit u is order[u]
        return _Units(numel[order], elem[order], ready_t[order], lay[order], np.arange(n + 1, dtype=np.int64), order)
    # a unit per (layer, element size), numbered in order of first appearance in the ready order
    sizes, elem_code = np.unique(elem, return_inverse=True)
    key = (np.unique(lay, return_inverse=True)[1] * len(sizes) + elem_code)[order]
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    number = np.empty(len(first), dtype=np.int64)
    number[np.argsort(first, kind="stable")] = np.arange(len(first))
    unit_of = np.empty(n, dtype=np.int64)
    unit_of[order] = number[inverse.ravel()]
    members = np.argsort(unit_of, kind="stable")  # by unit, then tensor index (forward order)
    ptr = np.concatenate(([0], np.cumsum(np.bincount(unit_of, minlength=len(first))))).astype(np.int64)
    total = np.zeros(len(first), dtype=np.int64)
    np.add.at(total, unit_of, numel)
    ready = np.full(len(first), -np.inf)
    np.maximum.at(ready, unit_of, ready_t)
    lead = members[ptr[:-1]]  # each unit's first tensor
    return _Units(total, elem[lead], ready, lay[lead], ptr, members)


class _Model:
    """US-Byte's phase 1 + phase 2 for a given priority order, and the iteration it gives.

    The tables are numpy arrays made without a Python loop over tensors where it can be
    helped (``*_np``: what the compiled search takes); the Python model's lists are made
    from them when it first needs them."""

    def __init__(self, profile: Profile, cost: CollectiveCost, unit_bytes: int,
                 exact: tuple[CollectiveCost, ...] | None = None, layer_of: tuple[int, ...] | None = None) -> None:
        """``cost``: the line the block sizes are chosen by; ``exact``: the costs whose minimum a
        block takes (default: ``cost``; with hierarchical operations the plain and the
        hierarchical all-reduce, each block run as the cheaper, as the simulator costs it);
        ``layer_of``: each tensor's layer as scheduled (default: the profile's;
        :func:`merged_layers`)."""
        self.profile = profile
        self.cost = cost
        timers = [_Timer(c) for c in (exact or (cost,))]
        self.time_s: Callable[[int], float] = _cheapest(timers)  # bytes -> seconds, as simulated
        self.lines = None if any(t.table is not None for t in timers) else [(t.alpha_s, t.beta_s) for t in timers]
        self.alpha_s = cost.alpha_s
        self.beta_s = cost.beta_s_per_byte
        ready_t = np.array(profile.ready_s, dtype=float)
        table = self.table = _unit_table(profile, layer_of or profile.layer_of, ready_t)
        self.numel_np, self.elem_np, self.ready_of_np = table.numel, table.elem, table.ready
        self.by_ready_np = np.argsort(table.ready, kind="stable")  # ties: by unit
        self.unit_elems_np = np.maximum(1, unit_bytes // table.elem)
        self.ready_sorted_np = table.ready[self.by_ready_np]
        self.ready_eps_np = self.ready_sorted_np + EPS_S
        self.spread = bool(np.all(self.ready_sorted_np[1:] > self.ready_eps_np[:-1]))  # each its own step
        self.full_np = self._times(table.numel * table.elem, timers)
        self.backward_end_s = float(ready_t.max())
        self._forward_tables(profile, table)
        # one cost line, every ready time its own step (the common case): run's loop inlined (_run_line)
        timer = self.time_s
        self.line = (isinstance(timer, _Timer) and timer.table is None and self.spread
                     and (timer.alpha_s, timer.beta_s) == (cost.alpha_s, cost.beta_s_per_byte))
        self._seen: dict[tuple[bool, tuple[int, ...]], Schedule] = {}
        self.arrays: tuple | None = None  # the compiled search's arrays (_compiled_search)
        self._pricer: BlockPricer | None = None

    def pricer(self, cluster: Cluster, hierarchical: str) -> BlockPricer:
        """The :class:`~gradsched.planners._usbyte_eval.BlockPricer` of this model's units (made once)."""
        if self._pricer is None:
            self._pricer = BlockPricer(self.profile, cluster, self.table.ptr, self.table.tensors, hierarchical)
        return self._pricer

    def _times(self, nbytes: np.ndarray, timers: list[_Timer]) -> np.ndarray:
        """:attr:`time_s` of each of ``nbytes``, bit for bit (a line's ``alpha + beta * bytes``, or
        the cheaper of two, vectorised: the same float operations)."""
        if self.lines is None:
            return np.array([self.time_s(int(x)) for x in nbytes.tolist()], dtype=float)
        x = nbytes.astype(float)
        out = None
        for alpha, beta in self.lines:
            line = alpha + beta * x
            out = line if out is None else np.where(line < out, line, out)
        assert out is not None
        return np.where(nbytes <= 0, 0.0, out)

    def _forward_tables(self, profile: Profile, table: _Units) -> None:
        """Next-forward gating: the profile's layers in forward order with their update and forward
        time (:attr:`Profile.layer_table`, the simulator's); each waits for every block of the
        units that hold its tensors (of merged layers: the group's, where the simulator waits for
        the blocks holding the layer's own elements).  And what the search's trials need to price
        phase 2 and the next forward without a loop: forward layer ``k`` ends no earlier than
        ``done[k]`` plus the forward and update work of layers ``k`` to the last, and the
        iteration is the largest of these bounds (the max-plus form of :meth:`_forward`).  Per
        unit: the work after its earliest layer."""
        layers = profile.layer_table
        n = len(profile.tensors)
        self.forward_work = list(zip(layers.update_s, layers.forward_s))
        if len(layers.forward) == n:  # one tensor per layer: forward layer k is tensor k
            position = np.arange(n, dtype=np.int64)
        else:
            position = np.empty(n, dtype=np.int64)
            position[np.fromiter(itertools.chain.from_iterable(layers.forward), dtype=np.int64, count=n)] = \
                np.repeat(np.arange(len(layers.forward)), [len(ts) for ts in layers.forward])
        self.layer_idx_np = position[table.tensors]  # each unit's tensors' forward layers (CSR by table.ptr)
        work = np.array(layers.update_s, dtype=float) + np.array(layers.forward_s, dtype=float)
        after = np.append(np.cumsum(work[::-1])[::-1], 0.0)  # after[k]: layers k..end, summed from the last
        self.floor_s = self.backward_end_s + profile.other_s + float(after[0])
        per_tensor = after[self.layer_idx_np]
        if len(per_tensor) == len(table.numel):  # one tensor per unit
            self.after_np = per_tensor
        else:
            self.after_np = np.full(len(table.numel), -np.inf)
            np.maximum.at(self.after_np, np.repeat(np.arange(len(table.numel)), np.diff(table.ptr)), per_tensor)

    # the Python model's lists (the compiled search takes the arrays)
    @cached_property
    def by_ready(self) -> list[int]:
        return self.by_ready_np.tolist()

    @cached_property
    def ready_sorted(self) -> list[float]:
        return self.ready_sorted_np.tolist()

    @cached_property
    def ready_eps(self) -> list[float]:
        return self.ready_eps_np.tolist()

    @cached_property
    def ready_of(self) -> list[float]:
        return self.ready_of_np.tolist()

    @cached_property
    def numel(self) -> list[int]:
        return self.numel_np.tolist()

    @cached_property
    def elem(self) -> list[int]:
        return self.elem_np.tolist()

    @cached_property
    def unit_elems(self) -> list[int]:
        return self.unit_elems_np.tolist()

    @cached_property
    def full_time_s(self) -> list[float]:
        return self.full_np.tolist()

    @cached_property
    def after_unit(self) -> list[float]:
        return self.after_np.tolist()

    @cached_property
    def unit_layers(self) -> list[tuple[int, ...]]:
        """Each unit's forward layers (positions in :attr:`forward_work`), sorted."""
        ptr, idx = self.table.ptr.tolist(), self.layer_idx_np.tolist()
        return [tuple(sorted(set(idx[a:b]))) for a, b in zip(ptr, ptr[1:])]

    @cached_property
    def units(self) -> list[_Layer]:
        """Each unit as a :class:`_Layer` (for reading; the model works on the arrays)."""
        t = self.table
        ptr, members = t.ptr.tolist(), t.tensors.tolist()
        return [_Layer(tuple(members[a:b]), numel, eb, ready, lid, members[a])
                for a, b, numel, eb, ready, lid in zip(ptr, ptr[1:], self.numel, self.elem, self.ready_of,
                                                       t.layer.tolist())]

    def busy_until(self, ready: list[float], nxt: int, t: float, free: float) -> float:
        """The clock while the channel is busy (:func:`_busy_until_spread` where every ready time
        is its own step, else :func:`_busy_until`)."""
        if self.spread:
            return _busy_until_spread(ready, self.ready_eps, nxt, free)
        return _busy_until(ready, nxt, t, free)

    def run(self, rank: list[int], extend: bool = False, resume: Schedule | None = None, at: int = 0,
            dry: bool = False, key: list[int] | None = None) -> Schedule:
        """Model the schedule where unit ``u`` has priority number ``rank[u]`` (lower first).

        The clock moves like the simulator's (to the next ready time or the moment the
        channel frees, events within ``EPS_S`` simultaneous), so that priority
        scheduling of the emitted plan replays these blocks exactly.  ``extend``: a
        phase-1 block that follows a block of the same unit back to back is merged into
        it, resized to fill the gap from the merged block's start (the paper's block
        extension).  ``resume``/``at``: start from ``resume``'s state just before it
        chose its block ``at`` (the caller knows that ``rank`` chooses the same up to
        there), which gives exactly what a run from the start would.  ``dry``: phase 2 is
        left pending (:meth:`complete` plays it) and the iteration priced in closed form
        (:meth:`_dry_iteration_s`; the search's trials, where phase 2 is most of the work)."""
        if self.line:
            return self._run_line(rank, extend, resume, at, dry, key)
        by_ready, ready, elem, unit_elems = self.by_ready, self.ready_sorted, self.elem, self.unit_elems
        n = len(by_ready)
        left, sent, blocks, decide, t, free, nxt, heap, key = self._start(rank, resume, at, key)
        time_s, busy_until = self.time_s, self.busy_until
        pop = heapq.heappop
        while True:
            if nxt < n and ready[nxt] <= t + EPS_S:  # the units ready by now join the heap
                nxt = _take_in(heap, key, by_ready, ready, nxt, t)
            if heap and free <= t + EPS_S:
                start = t if t > free else free
                if nxt == n:  # phase 2 from here: the rest of each layer back to back, by priority
                    keys = np.sort(np.array(heap, dtype=np.int64))  # the units left, by priority
                    iteration_s = self._dry_iteration_s(keys, key, start, left, blocks, resume, at)
                    lazy = Schedule(iteration_s, blocks, decide, (keys, start, t, left, sent))
                    return lazy if dry else self.complete(lazy)
                # phase 1: fill the gap before the next gradient is ready
                u = heap[0] % n
                rest = left[u]
                elems = self._extend(blocks, u, start, ready[nxt], rest) if extend else None
                if elems is None:
                    elems = _fill(ready[nxt] - start, rest, unit_elems[u], elem[u], self.alpha_s, self.beta_s, time_s)
                    free = start + time_s(elems * elem[u])
                    blocks.append((u, sent[u], sent[u] + elems, start, free))
                    decide.append(t)
                else:
                    free = blocks[-1][4]
                sent[u] += elems
                left[u] = rest - elems
                if rest == elems:
                    pop(heap)
                continue
            if not heap and nxt == n:
                break
            if nxt < n and free > t + EPS_S:  # channel busy: to when it may be free (the top takes in the ready)
                t = busy_until(ready, nxt, t, free)
                continue
            # advance to the next moment something can change
            t_next = ready[nxt] if nxt < n else free
            if free > t and free < t_next:
                t_next = free
            t = t_next
        return Schedule(self.iteration_s(blocks), blocks, decide)

    def _run_line(self, rank: list[int], extend: bool, resume: Schedule | None, at: int, dry: bool,
                  key: list[int] | None) -> Schedule:
        # long function: run's loop with _take_in, _fill, the cost line and _busy_until_spread inlined
        """:meth:`run` for one cost line ``alpha + beta * bytes`` and ready times each their own step
        (``self.line``): the same floats in the same order, without a function call per block
        (phase 1 is most of the search's time)."""
        by_ready, ready, ready_eps, elem, unit_elems = (self.by_ready, self.ready_sorted, self.ready_eps, self.elem,
                                                        self.unit_elems)
        n = len(by_ready)
        left, sent, blocks, decide, t, free, nxt, heap, key = self._start(rank, resume, at, key)
        alpha, beta = self.alpha_s, self.beta_s
        pop, push, add_block, add_decision, ceil = heapq.heappop, heapq.heappush, blocks.append, decide.append, math.ceil
        bisect_left = bisect.bisect_left
        last_ready = ready[-1]
        while True:
            lim = t + EPS_S
            while nxt < n and ready[nxt] <= lim:  # the units ready by now join the heap
                push(heap, key[by_ready[nxt]])
                nxt += 1
            if heap and free <= lim:
                start = t if t > free else free
                if nxt == n:  # phase 2 from here
                    keys = np.sort(np.array(heap, dtype=np.int64))
                    iteration_s = self._dry_iteration_s(keys, key, start, left, blocks, resume, at)
                    lazy = Schedule(iteration_s, blocks, decide, (keys, start, t, left, sent))
                    return lazy if dry else self.complete(lazy)
                u = heap[0] % n
                rest = left[u]
                elems = self._extend(blocks, u, start, ready[nxt], rest) if extend else None
                if elems is None:
                    eb, gap = elem[u], ready[nxt] - start
                    if gap < alpha:
                        elems = unit_elems[u]
                    elif beta > 0 and gap < alpha + beta * (rest * eb):
                        unit = unit_elems[u]
                        elems = max(1, ceil((gap - alpha) / (beta * unit * eb))) * unit
                    else:
                        elems = rest
                    if elems > rest:
                        elems = rest
                    free = start + (alpha + beta * (elems * eb))
                    lo = sent[u]
                    add_block((u, lo, lo + elems, start, free))
                    add_decision(t)
                else:
                    free = blocks[-1][4]
                sent[u] += elems
                left[u] = rest - elems
                if rest == elems:
                    pop(heap)
                continue
            if not heap and nxt == n:
                break
            if nxt < n and free > lim:  # channel busy: to when it may be free (_busy_until_spread)
                k = bisect_left(ready_eps, free, nxt)
                if k == n:
                    t = last_ready
                else:
                    r = ready[k]
                    t = free if free < r else r
                continue
            t_next = ready[nxt] if nxt < n else free
            if free > t and free < t_next:
                t_next = free
            t = t_next
        return Schedule(self.iteration_s(blocks), blocks, decide)

    def _start(self, rank: list[int], resume: Schedule | None, at: int, key: list[int] | None) -> tuple:
        """:meth:`run`'s state at the start, or just before ``resume`` chose its block ``at``:
        (left, sent, blocks, decide, clock, channel free, next ready, heap, key).

        The heap holds each unit as one int, ``key[u] = rank[u] * n + u``: the order of
        ``(rank[u], u)``, without a tuple per entry (fewer objects for the garbage collector);
        ``key`` as given (the search's, updated where a promotion moved ranks) or made here."""
        if resume is None or at == 0:
            blocks: list[tuple[int, int, int, float, float]] = []
            decide: list[float] = []
            t = free = 0.0  # the clock; when the channel finishes its current block
            left, sent = list(self.numel), [0] * len(self.numel)
        else:  # (``at`` may be len(resume.blocks) of a pending schedule: just before its phase 2)
            blocks, decide = resume.blocks[:at], resume.decide_s[:at]
            t = resume.decide_s[at] if at < len(resume.decide_s) else _pending(resume)[2]
            free = blocks[-1][4]
            numel = self.numel
            left, sent = numel.copy(), [0] * len(numel)
            for u, _, hi, _, _ in blocks:  # a unit's blocks go in order: its last one says how far it got
                sent[u], left[u] = hi, numel[u] - hi
        nxt = bisect.bisect_right(self.ready_sorted, t + EPS_S) if blocks else 0
        n = len(left)
        if key is None:
            key = [r * n + u for u, r in enumerate(rank)]
        heap = [key[u] for u in self.by_ready[:nxt] if left[u] > 0]
        heapq.heapify(heap)
        return left, sent, blocks, decide, t, free, nxt, heap, key

    def _extend(self, blocks: list[tuple[int, int, int, float, float]], u: int, start: float, next_ready_s: float,
                rest: int) -> int | None:
        """The paper's block extension: if ``u``'s last block ends at ``start``, grow it into one
        message from that block's start, sized to the gap up to ``next_ready_s`` (at least one
        unit or the rest more); returns the elements added, or None (no merge: another
        unit's block last, a gap, or a measured table that makes the merged message end
        before ``start``, which the clock cannot go back to)."""
        if not blocks or blocks[-1][0] != u or blocks[-1][4] != start:
            return None
        _, lo, hi, s0, _ = blocks[-1]
        unit, eb = self.unit_elems[u], self.elem[u]
        total = _fill(next_ready_s - s0, rest + hi - lo, unit, eb, self.alpha_s, self.beta_s, self.time_s)
        elems = max(total - (hi - lo), min(unit, rest))
        end = s0 + self.time_s((hi - lo + elems) * eb)
        if end < start:
            return None
        blocks[-1] = (u, lo, hi + elems, s0, end)
        return elems

    def _phase_two(self, queue: list[int], start: float, t: float, left: list[int], sent: list[int],
                   blocks: list[tuple[int, int, int, float, float]], decide: list[float]) -> None:
        """Phase 2 as :meth:`run`'s loop would play it, without the loop: every layer is
        ready, so each decision takes the next layer in priority order when the last
        block ends (the clock is that end), and sends all it has left."""
        time_s, elem, numel, full = self.time_s, self.elem, self.numel, self.full_time_s
        add_block, add_decision = blocks.append, decide.append
        for u in queue:
            rest, lo = left[u], sent[u]
            end = start + (full[u] if rest == numel[u] else time_s(rest * elem[u]))
            add_block((u, lo, lo + rest, start, end))
            add_decision(t)
            sent[u] = lo + rest
            left[u] = 0
            t = start = end

    def _dry_iteration_s(self, keys: np.ndarray, key: list[int], start: float, left: list[int],
                         blocks: list[tuple[int, int, int, float, float]], resume: Schedule | None = None,
                         at: int = 0) -> float:
        """The iteration :meth:`_phase_two` then :meth:`iteration_s` would give, without a loop over
        the units left: phase 2's ends are a running sum of the units' times in priority order
        (``keys``), and the next forward is the largest of each block's end plus the work
        after its earliest layer (:meth:`_forward_tables`); equal to the loop's up to rounding.
        ``resume``/``at``: ``blocks[:at]`` are ``resume``'s (their largest end + after is kept
        with ``resume``, :func:`_block_arrays`), but for block ``at - 1``, which block extension
        may have grown."""
        n = len(left)
        queue = keys % n
        took = self.full_np[queue]
        elem, time_s = self.elem, self.time_s
        rest = np.array(left)
        partial = np.flatnonzero((rest > 0) & (rest < self.numel_np)).tolist()  # partly sent in phase 1
        if partial:
            took[np.searchsorted(keys, [key[u] for u in partial])] = [time_s(left[u] * elem[u]) for u in partial]
        took[0] += start
        last = float((np.add.accumulate(took) + self.after_np[queue]).max())
        after = self.after_unit
        same = at - 1 if resume is not None and at > 1 else 0  # blocks[:same] are resume's as they were
        first = float(_block_arrays(self, resume)[2][same - 1]) if same and resume else 0.0  # largest end + after
        first = max([first] + [end + after[u] for u, _, _, _, end in blocks[same:]])
        return max(self.floor_s, first, last)

    def evaluate(self, rank: list[int], extend: bool, resume: Schedule | None = None, at: int = 0,
                 key: list[int] | None = None) -> Schedule:
        """:meth:`run`, dry and remembered: the searches of the two promotion windows try many of
        the same priority orders (the front-first one always)."""
        seen = (extend, tuple(rank))
        schedule = self._seen.get(seen)
        if schedule is None:
            schedule = self._seen[seen] = self.run(rank, extend, resume, at, dry=True, key=key)
        return schedule

    def complete(self, schedule: Schedule) -> Schedule:
        """``schedule`` with its pending phase 2 played: every block, and the iteration summed in
        the simulator's order."""
        if schedule.pending is None:
            return schedule
        keys, start, t, left, sent = schedule.pending
        blocks, decide = list(schedule.blocks), list(schedule.decide_s)
        self._phase_two((keys % len(left)).tolist(), start, t, list(left), list(sent), blocks, decide)
        return Schedule(self.iteration_s(blocks), blocks, decide)

    def iteration_s(self, blocks: list[tuple[int, int, int, float, float]]) -> float:
        return self._forward(self._layer_done(blocks))

    def _layer_done(self, blocks: list[tuple[int, int, int, float, float]]) -> list[float]:
        """When each forward layer's last block ends (0 if none yet)."""
        done = [0.0] * len(self.forward_work)
        unit_layers = self.unit_layers
        for u, _, _, _, end in blocks:
            for k in unit_layers[u]:
                if end > done[k]:
                    done[k] = end
        return done

    def _forward(self, done: list[float]) -> float:
        """The next forward, each layer after its blocks: the iteration."""
        t = self.backward_end_s + self.profile.other_s
        for d, (upd, fwd) in zip(done, self.forward_work):
            t = (t if t >= d else d) + upd + fwd  # max(t, d), summed in the simulator's order
        return t


def _take_in(heap: list[int], key: list[int], by_ready: list[int], ready: list[float], nxt: int,
             t: float) -> int:
    """Push the units ready by ``t`` (from ``by_ready[nxt]`` on) onto ``heap``; returns the next one not ready."""
    end = bisect.bisect_right(ready, t + EPS_S, nxt)
    if end - nxt <= len(heap):
        push = heapq.heappush
        for u in by_ready[nxt:end]:
            push(heap, key[u])
    else:  # more than the heap holds: one heapify
        heap.extend([key[u] for u in by_ready[nxt:end]])
        heapq.heapify(heap)
    return end


def _busy_until(ready: list[float], nxt: int, t: float, free: float) -> float:
    """The clock :meth:`_Model.run`'s loop reaches, one step at a time, while the channel is busy
    (``free > t + EPS_S``, ``ready[nxt]`` the next ready time): each step to the next ready time
    or to ``free``, whichever is first, until the channel may be free or every unit is ready.
    The same floats compared in the same order, without the heap work of each step."""
    n, k = len(ready), nxt
    while True:
        r = ready[k]
        t = free if free > t and free < r else r
        lim = t + EPS_S
        while k < n and ready[k] <= lim:
            k += 1
        if free <= lim or k == n:
            return t


def _busy_until_spread(ready: list[float], ready_eps: list[float], nxt: int, free: float) -> float:
    """:func:`_busy_until` where no two ready times are within ``EPS_S`` (each its own step of
    the loop), by bisection: the loop stops at the first ready time ``r`` with
    ``free <= r + EPS_S`` (``ready_eps``: each ``r + EPS_S``; the clock is ``free`` if that
    ``r`` is later), or at the last."""
    k = bisect.bisect_left(ready_eps, free, nxt)
    if k == len(ready):
        return ready[-1]
    r = ready[k]
    return free if free < r else r


def _cheapest(timers: list["_Timer"]):
    """Seconds for ``nbytes``: the cheapest of ``timers``, each bit for bit as the simulator's
    (two lines, the common two-level case, in one expression: the search calls it per block)."""
    if len(timers) == 1:
        return timers[0]
    if len(timers) == 2 and all(t.table is None for t in timers):
        (a1, b1), (a2, b2) = [(t.alpha_s, t.beta_s) for t in timers]

        def two_lines(nbytes: float) -> float:  # min(first, second), without a call to min
            if nbytes <= 0:
                return 0.0
            first, second = a1 + b1 * nbytes, a2 + b2 * nbytes
            return second if second < first else first

        return two_lines
    return lambda nbytes: min([t(nbytes) for t in timers])


class _Timer:
    """``cost.time_s`` bit for bit, without numpy's per-call overhead (the search calls it
    once per block per evaluation): the simulator must see exactly the modelled times."""

    def __init__(self, cost: CollectiveCost) -> None:
        self.cost = cost
        self.alpha_s, self.beta_s = cost.alpha_s, cost.beta_s_per_byte
        self.table = ([float(x) for x, _ in cost.points], [float(y) for _, y in cost.points]) if cost.points else None
        # below the table: the line, capped at what the table's first size costs (CollectiveCost.time_s)
        self.first = cost.time_s(cost.points[0][0]) if cost.points else math.inf

    def __call__(self, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        if self.table is not None:
            xs, ys = self.table
            if xs[0] <= nbytes <= xs[-1]:
                return float(_interp(nbytes, xs, ys) * self.cost._table_scale(nbytes))
            if nbytes < xs[0]:
                return min(self.alpha_s + self.beta_s * nbytes, self.first)
        return self.alpha_s + self.beta_s * nbytes


def _fill(gap: float, rest: int, unit: int, eb: int, alpha: float, beta: float, time_s) -> int:
    """Elements of a phase-1 block that fills ``gap``: one unit if ``gap < alpha``, whole units
    up to the gap if less than ``rest`` fits in it, else all of ``rest``."""
    if gap < alpha:
        elems = unit
    elif beta > 0 and gap < time_s(rest * eb):
        elems = max(1, math.ceil((gap - alpha) / (beta * unit * eb))) * unit
    else:
        elems = rest
    return rest if elems > rest else elems


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """``np.interp`` for one ``x`` inside ``[xs[0], xs[-1]]``, with numpy's arithmetic."""
    if x == xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x) - 1
    if x == xs[j]:
        return ys[j]
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return slope * (x - xs[j]) + ys[j]


def _first_blocks(schedule: Schedule) -> dict[int, tuple[int, int, int, float, float]]:
    """Each unit's first block among ``schedule.blocks`` (of a pending schedule: phase 1's; a unit
    first sent in phase 2 goes whole, in one block)."""
    first: dict[int, tuple[int, int, int, float, float]] = {}
    for b in schedule.blocks:
        first.setdefault(b[0], b)
    return first


def search_priorities(model: _Model, max_evaluations: int | None, extend: bool = False, window: str = "block",
                      patience: int = 0) -> tuple[list[int], Schedule, int]:
    """Front-first priorities improved by US-Byte's promotion search; returns (rank, schedule, evaluations).

    ``window``: a layer is tried ahead of the layers that become ready between its first
    block's start and that block's end (``"block"``, gradsched's rule) or the time it
    would take to send the whole layer from there (``"layer"``, nearest the paper's).
    ``max_evaluations``: at most that many promotions considered (None: every layer).
    ``patience``: after that many tries in a row that did not shorten the iteration, only
    the cheap tries go on: those that replay at most :data:`CHEAP_TAIL` of phase 1's blocks
    (a kept one starts the count again); 0: every try (the full search)."""
    found = _search(model, max_evaluations, extend, window, patience)
    return found.rank.tolist(), found.schedule(), found.evaluations


def _search(model: _Model, max_evaluations: int | None, extend: bool, window: str, patience: int) -> _Found:
    """:func:`search_priorities`, compiled where it can be (:func:`_compiled_search`), its schedule
    left as arrays until read."""
    compiled = _compiled_search(model, max_evaluations, extend, window, patience)
    if compiled is not None:
        return compiled
    rank, schedule, evaluations = _python_search(model, max_evaluations, extend, window, patience)
    return _Found(np.array(rank, dtype=np.int64), evaluations, schedule.iteration_s, schedule)


def _python_search(model: _Model, max_evaluations: int | None, extend: bool, window: str,
                   patience: int) -> tuple[list[int], Schedule, int]:
    """:func:`search_priorities` on the Python model (the reference, and the fallback)."""
    limit = math.inf if max_evaluations is None else max_evaluations
    numel, elem = model.numel, model.elem
    n = len(numel)
    order = _front_first(model).tolist()
    rank = [0] * n
    for r, u in enumerate(order):
        rank[u] = r
    key = [r * n + u for u, r in enumerate(rank)]
    rank_np = np.asarray(rank)
    best = model.evaluate(rank, extend, key=key)
    evaluations = 1
    first = _first_blocks(best)
    ready = model.ready_sorted
    since = 0  # trials since the last kept one
    for u in sorted(range(n), key=lambda u: rank[u], reverse=True):  # output layer first
        if evaluations >= limit:
            break
        if u not in first:
            continue  # sent whole in phase 2
        _, lo, hi, start_s, end_s = first[u]
        if hi - lo >= numel[u]:
            continue  # sent whole in one block: nothing to keep going
        if window == "layer":
            end_s = start_s + model.time_s(numel[u] * elem[u])
        span = model.by_ready[bisect.bisect_right(ready, start_s):bisect.bisect_right(ready, end_s)]
        rivals = [v for v in span if rank[v] < rank[u]]
        if not rivals:
            continue
        target = min(rank[v] for v in rivals)
        evaluations += 1
        at = _first_change(model, best, rank, u, target, rank_np)
        if at is None:
            continue  # the promotion changes no choice: the same schedule, not shorter
        if _skipped(since, patience, len(best.blocks) - at, len(best.blocks)):
            continue  # the search has stopped paying: only the tries cheap enough for the dry spell go on
        trial_order, trial_rank, trial_key = _promoted(order, rank, key, u, target)
        trial = model.evaluate(trial_rank, extend, best, at, trial_key)
        since += 1
        if trial.iteration_s < best.iteration_s * (1 - 1e-12):
            best, rank, order, key = trial, trial_rank, trial_order, trial_key
            rank_np = np.asarray(rank)
            first = _first_blocks(best)
            since = 0
    return rank, model.complete(best), evaluations


def _skipped(since: int, patience: int, replays: int, blocks: int) -> bool:
    """Whether a try that replays ``replays`` of phase 1's ``blocks`` blocks is skipped after ``since``
    tries in a row without a gain.  Once ``since`` reaches ``patience``, a try goes on only where it
    replays at most :data:`CHEAP_TAIL` of phase 1, or at most ``patience * DRY_SPELL_BLOCKS / since``
    blocks: what a dry spell may spend is bounded in blocks replayed (the CPU time), not in tries, so
    where phase 1 is short (merged layers: 250-350 blocks at 1,000 tensors) a cluster of gains behind
    a dry spell of 30-50 tries is still reached, and where it is long (1,000 blocks and more) the
    search is as before.  The compiled search decides the same, in integers
    (:func:`gradsched.planners._usbyte_jit.search`, ``Q[6]``)."""
    return (patience > 0 and since >= patience and replays > CHEAP_TAIL * blocks
            and replays * since > patience * DRY_SPELL_BLOCKS)


def _front_first(model: _Model) -> np.ndarray:
    """The units in front-first order (input layer first, by each unit's first tensor in forward
    order: no two units share one): the search's first priorities."""
    table = model.table
    return np.argsort(table.tensors[table.ptr[:-1]], kind="stable")


T = TypeVar("T")


def _given(x: T | None) -> T:
    """``x``, known not to be None here."""
    assert x is not None
    return x


def _pending(schedule: Schedule) -> tuple:
    """A dry schedule's pending phase 2."""
    return _given(schedule.pending)


class _Found:
    """One rule's search: the rank, how many tries, the iteration, and the schedule: the compiled
    search's as its block arrays (``I``: unit, first and end element; ``F``: start, end and
    decision time), made into a :class:`Schedule` only where it is read."""

    def __init__(self, rank: np.ndarray, evaluations: int, iteration_s: float, schedule: Schedule | None = None,
                 I: np.ndarray | None = None, F: np.ndarray | None = None) -> None:  # noqa: E741
        self.rank, self.evaluations, self.iteration_s = rank, evaluations, iteration_s
        self._schedule, self._I, self._F = schedule, I, F

    @property
    def count(self) -> int:
        """Its operations (blocks)."""
        return len(self._schedule.blocks) if self._schedule is not None else _given(self._I).shape[1]

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each block's unit, first element and end element."""
        if self._I is None:
            I = np.array([b[:3] for b in self.schedule().blocks], dtype=np.int64).reshape(-1, 3).T  # noqa: E741
            return I[0], I[1], I[2]
        return self._I[0], self._I[1], self._I[2]

    def key(self) -> bytes:
        """The rank and blocks, as bytes: equal exactly where two rules found the same plan."""
        unit, lo, hi = self.blocks()
        return b"".join(np.ascontiguousarray(a).tobytes() for a in (self.rank, unit, lo, hi))

    def schedule(self) -> Schedule:
        if self._schedule is None:
            (unit, lo, hi), (start, end, decide) = _given(self._I).tolist(), _given(self._F).tolist()
            self._schedule = Schedule(self.iteration_s, list(zip(unit, lo, hi, start, end)), decide)
        return self._schedule


def _compiled_search(model: _Model, max_evaluations: int | None, extend: bool, window: str,
                     patience: int) -> _Found | None:
    """:func:`search_priorities` by the compiled kernel (:mod:`gradsched.planners._usbyte_jit`), or
    None where it is not used (numba not installed, ``GRADSCHED_JIT=0``, a measured cost table,
    a layer without elements, or a schedule the kernel leaves to the Python model)."""
    if (len(model.numel_np) < _jit.MIN_UNITS or model.lines is None or len(model.lines) > 2
            or model.numel_np.min() <= 0 or not _jit.enabled()):
        return None
    if model.arrays is None:  # the model as the kernel takes it, made once for every rule
        (a1, b1), (a2, b2) = model.lines[0], model.lines[-1]
        ia = np.stack([model.by_ready_np, model.numel_np, model.elem_np, model.unit_elems_np]).astype(np.int64)
        fa = np.stack([model.ready_sorted_np, model.ready_eps_np, model.full_np, model.after_np, model.ready_of_np])
        p = np.array([model.alpha_s, model.beta_s, a1, b1, a2, b2, model.floor_s], dtype=float)
        cap = int((-(-ia[1] // ia[3])).sum()) + 1 + len(ia[1])  # phase 1's blocks (each a unit or the rest), phase 2's
        layers = model.profile.layer_table
        work = np.array([layers.update_s, layers.forward_s], dtype=float)
        base = model.backward_end_s + model.profile.other_s  # as _Model._forward starts
        forward = (model.table.ptr, model.layer_idx_np, work, base)  # each unit's layers: duplicates are harmless
        model.arrays = (_front_first(model).astype(np.int64), cap, ia, fa, p, forward)
    limit = _jit.NO_LIMIT if max_evaluations is None else max_evaluations
    q = np.array([len(model.lines) == 2, model.spread, extend, window == "layer", limit, patience,
                  DRY_SPELL_BLOCKS], dtype=np.int64)
    order, cap, ia, fa, p, forward = model.arrays
    search = _jit.kernel()
    if search is None:
        return None  # numba would not load
    status, evaluations, rank, i, f, n, s, z = search(order, cap, ia, fa, p, q, CHEAP_TAIL)
    if status:
        return None
    m, iteration_s = _given(_jit.kernel("complete"))(i, f, n, s, z, ia, fa, p, q, *forward)  # phase 2 played
    return _Found(rank, int(evaluations), float(iteration_s), None, i[:, :m], f[:3, :m])


def _promoted(order: list[int], rank: list[int], key: list[int], u: int,
              target: int) -> tuple[list[int], list[int], list[int]]:
    """Order, rank and heap key with ``u`` moved up to rank ``target`` (the units ranked
    ``target..rank[u]-1`` one down): copies, changed only where ranks moved."""
    n, top = len(order), rank[u]
    order, rank, key = order.copy(), rank.copy(), key.copy()
    del order[top]
    order.insert(target, u)
    for r in range(target, top + 1):
        v = order[r]
        rank[v], key[v] = r, r * n + v
    return order, rank, key


def _block_arrays(model: _Model, schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``schedule``'s blocks as arrays, made once: each block's unit and end, and the running
    largest of end + the work after the block's earliest layer (:meth:`_Model._dry_iteration_s`)."""
    if schedule.arrays is None:
        m = len(schedule.blocks)
        units = np.fromiter((b[0] for b in schedule.blocks), dtype=np.int64, count=m)
        ends = np.fromiter((b[4] for b in schedule.blocks), dtype=float, count=m)
        schedule.arrays = (units, ends, np.maximum.accumulate(ends + model.after_np[units]))
    return schedule.arrays


def _first_change(model: _Model, schedule: Schedule, rank: list[int], u: int, target: int,
                  rank_np: np.ndarray | None = None) -> int | None:
    """Index of the first block of ``schedule`` whose choice promoting ``u`` to rank ``target``
    could change, or None if none can.

    Promotion moves ``u`` ahead of the units ranked ``target..rank[u]-1`` only, so a
    choice changes only where one of those was chosen (block ``b``, or a decision that
    extended it) while ``u`` was ready with data left: ``u`` is ready by the block's end
    and its own last block comes later.  Of a pending schedule, a change in phase 2 is
    reported as ``len(blocks)`` (phase 2's start, where a trial resumes)."""
    blocks, pending = schedule.blocks, schedule.pending
    in_phase_two = pending is not None and pending[3][u] > 0  # u sends its rest in phase 2
    last_u = len(blocks)
    if not in_phase_two:
        last_u -= 1
        while blocks[last_u][0] != u:  # u's last block: near the end (phase 2 sends every layer's rest)
            last_u -= 1
    ready_u, top = model.ready_of[u] - 2 * EPS_S, rank[u]  # conservative: earlier is safe
    if last_u > 0:  # the first block k < last_u with target <= rank[v] < top and ready_u <= its end
        units, ends, _ = _block_arrays(model, schedule)
        ranks = (np.asarray(rank) if rank_np is None else rank_np)[units[:last_u]]
        hit = (ranks >= target) & (ranks < top) & (ends[:last_u] >= ready_u)
        if hit.any():
            return int(hit.argmax())
    if in_phase_two:  # phase 2 goes by priority, every unit ready: is one ranked target..top-1 left?
        n = len(rank)
        keys = _pending(schedule)[0]
        k = int(np.searchsorted(keys, target * n))
        if k < len(keys) and keys[k] < top * n:
            return len(blocks)
    return None


def build_plan(model: _Model, rank: list[int], schedule: Schedule, options: dict,
               cluster: Cluster | None = None, hierarchical: str = "never") -> Plan:
    """The plan of ``schedule``: one operation per block, its layer's rank as priority (each made
    hierarchical where ``hierarchical`` says so, on a two-level ``cluster``)."""
    found = _Found(np.asarray(rank, dtype=np.int64), 0, schedule.iteration_s, schedule)
    return _build(model, found, options, cluster, hierarchical)


def _build(model: _Model, found: _Found, options: dict, cluster: Cluster | None, hierarchical: str) -> Plan:
    """:func:`build_plan` from a search's result."""
    profile, table = model.profile, model.table
    unit, lo, hi = found.blocks()
    count = len(unit)
    kinds = (coll.collectives_for(((hi - lo) * model.elem_np[unit]).tolist(), cluster, hierarchical)
             if cluster is not None else [DENSE] * count)  # each block's bytes, known: no second pass
    priority = found.rank[unit].tolist()
    if len(table.tensors) == len(table.numel):  # one tensor per unit: a block is one slice of it
        ops = block_operations(zip(table.tensors[unit].tolist(), lo.tolist(), hi.tolist(), kinds, priority))
    else:
        ops = [new_operation(_slices(profile, table, u, a, b), kind, p)
               for u, a, b, kind, p in zip(unit.tolist(), lo.tolist(), hi.tolist(), kinds, priority)]
    if cluster is not None:
        options = coll.recorded(options, cluster, hierarchical)
    return Plan("usbyte", tuple(ops), profile.fingerprint, profile.model, options,
                scheduling="priority", overlap_forward=True)


def _slices(profile: Profile, table: _Units, u: int, lo: int, hi: int) -> tuple[Slice, ...]:
    """Elements ``[lo, hi)`` of unit ``u`` (its tensors back to back, in forward order) as slices."""
    slices = []
    offset = 0
    tensors = profile.tensors
    for i in table.tensors[table.ptr[u]:table.ptr[u + 1]].tolist():
        numel = tensors[i].numel
        if offset >= hi:
            break  # the unit's tensors are back to back: none further is in [lo, hi)
        a, b = max(lo, offset), min(hi, offset + numel)
        if a < b:
            slices.append(new_slice(i, a - offset, b - offset))
        offset += numel
    return tuple(slices)


RULES = (("block", False), ("block", True), ("layer", False), ("layer", True))  # (window, extend); gradsched's first


def predict(profile: Profile, cluster: Cluster, unit_bytes: int = DEFAULT_UNIT_BYTES,
            max_evaluations: int | None = DEFAULT_MAX_EVALUATIONS, extend: bool | None = None,
            window: str | None = None, hierarchical: str = "auto",
            merge_bytes: int = 0, patience: int = DEFAULT_PATIENCE, *,
            beat_s: float = math.inf) -> tuple[Plan, Schedule, int]:
    """The US-Byte plan, the schedule its model predicts, and how many schedules it modelled
    (all rules together).  ``extend``/``window`` left as None are chosen: each rule is
    planned and the plan with the shortest simulated iteration kept (ties: fewer
    operations, then the order of ``RULES``).  ``merge_bytes``: the layers' groups
    (:func:`merged_layers`), scheduled as the model's layers; the plan's blocks then go
    when their own elements are ready (a block of a group's earliest layers may start
    before the whole group is), so each rule's plan is simulated."""
    unit_bytes, max_evaluations = _check_options(unit_bytes, max_evaluations, extend, window)
    _check_merge(merge_bytes)
    _check_patience(patience)
    coll.check_mode("usbyte", hierarchical, cluster)
    cost = coll.planning_cost(cluster, hierarchical)
    both = hierarchical == "auto" and cluster.topology is not None  # each block the cheaper collective
    model = _Model(profile, cost, unit_bytes, (cluster.operation_cost("allreduce"), cluster.cost(HIER)) if both else None,
                   merged_layers(profile, merge_bytes))
    rules = [(w, e) for w, e in RULES if window in (None, w) and extend in (None, e)]
    exact = merge_bytes == 0 and _model_is_exact(profile, cluster)
    best: tuple | None = None
    total = 0
    made: set[bytes] = set()  # rules' plans so far (rank and blocks): a later rule's same plan loses the tie
    for k, (w, e) in enumerate(rules):
        found = _search(model, max_evaluations, e, w, patience)
        total += found.evaluations
        if not exact:
            same = found.key()
            if same in made:
                continue  # built and simulated already (rules often agree where compute hides the blocks)
            made.add(same)
        options = {"unit_bytes": unit_bytes, "max_evaluations": max_evaluations, "patience": patience,
                   "merge_bytes": merge_bytes, "extend": e, "window": w}
        if len(rules) == 1:
            return _build(model, found, options, cluster, hierarchical), found.schedule(), total
        plan_, predicted = (None, found.iteration_s) if exact else _priced(model, found, options, cluster,
                                                                             hierarchical)
        key = (predicted, found.count, k)
        if best is None or key < best[0]:
            best = (key, found, options, plan_)
    assert best is not None
    (predicted, _, _), found, options, plan_ = best
    if not exact and predicted > beat_s:
        raise _Loses(predicted)
    schedule = found.schedule()
    if plan_ is None:
        plan_ = _build(model, found, options, cluster, hierarchical)
    if not exact:
        schedule.simulated_s = predicted  # auto need not simulate it again
    return plan_, schedule, total


def _priced(model: _Model, found: _Found, options: dict, cluster: Cluster,
            hierarchical: str) -> tuple[Plan | None, float]:
    """The simulated iteration of ``found``'s plan, and the plan where it had to be made to simulate it
    (else None: priced from its blocks by :class:`~gradsched.planners._usbyte_eval.BlockPricer`, bit for bit
    the simulator's figure, and made only if it wins)."""
    pricer = model.pricer(cluster, hierarchical)
    unit, lo, hi = found.blocks()
    predicted = pricer.iteration_s(unit, lo, hi, found.rank)
    if predicted is not None:
        return None, predicted
    plan_ = _build(model, found, options, cluster, hierarchical)
    return plan_, _simulated_s(plan_, model.profile, cluster)


class _Loses(Exception):
    """:func:`predict`'s chosen plan, simulated, is slower than ``beat_s``: not made."""

    def __init__(self, simulated_s: float) -> None:
        super().__init__(simulated_s)
        self.simulated_s = simulated_s


def plan_and_simulated(profile: Profile, cluster: Cluster, beat_s: float = math.inf,
                       **options: object) -> tuple[Plan | None, float | None]:
    """``usbyte``'s plan with ``options`` (checked as :func:`~gradsched.planners.make_plan` checks
    them) and its iteration (one channel, no timeline) where :func:`predict` simulated that very
    plan to choose its rule, else None: ``auto`` need not simulate it again.  Where that iteration
    is above ``beat_s`` the plan is not made: (None, the iteration)."""
    checked = check_options("usbyte", options)
    groups = checked.pop("groups", None)
    if groups is not None:
        return _grouped(profile, cluster, groups, checked.get("hierarchical", "auto"),
                        checked.get("unit_bytes", DEFAULT_UNIT_BYTES), checked.get("merge_bytes", 0),
                        checked.get("extend"), checked.get("window"), beat_s)
    try:
        plan_, schedule, _ = predict(profile, cluster, **checked, beat_s=beat_s)
    except _Loses as lost:
        return None, lost.simulated_s
    return plan_, schedule.simulated_s


def simulated_s(plan_: Plan) -> float | None:
    """Deprecated (it read a module-level record of the last plan): always None, "simulate it";
    :func:`plan_and_simulated` returns the plan with its simulated iteration."""
    warnings.warn("gradsched.planners.usbyte.simulated_s is deprecated: use plan_and_simulated, which returns "
                  "the plan and its simulated iteration together", DeprecationWarning, stacklevel=2)
    return None


def _model_is_exact(profile: Profile, cluster: Cluster) -> bool:
    """Whether the simulator's iteration is the model's: no contention, no runtime host time
    per operation (then the plan replays the modelled blocks, tests/test_usbyte.py)."""
    from gradsched.sim.engine import contention

    return not any(contention(cluster)) and profile.op_host_s() == (0.0, 0.0)


def _simulated_s(plan_: Plan, profile: Profile, cluster: Cluster) -> float:
    from gradsched.sim import simulate  # the simulator imports planners' types only

    return simulate(plan_, profile, cluster, timeline=False).iteration_s


def _check_merge(merge_bytes: object) -> None:
    if isinstance(merge_bytes, bool) or not (isinstance(merge_bytes, numbers.Integral) and int(merge_bytes) >= 0):
        raise GradschedError(f"usbyte: merge_bytes must be a whole number of bytes, 0 or more (0: the paper's "
                             f"layers), got {merge_bytes!r}")


def _check_patience(patience: object) -> None:
    if isinstance(patience, bool) or not (isinstance(patience, numbers.Integral) and int(patience) >= 0):
        raise GradschedError(f"usbyte: patience must be a whole number of tries, 0 or more (0: the full search), "
                             f"got {patience!r}")


def _check_options(unit_bytes: object, max_evaluations: object, extend: object,
                   window: object) -> tuple[int, int | None]:
    if not (isinstance(unit_bytes, numbers.Integral) and int(unit_bytes) > 0):
        raise GradschedError(f"usbyte: unit_bytes must be a positive whole number of bytes, got {unit_bytes!r}")
    if max_evaluations is not None and not (isinstance(max_evaluations, numbers.Integral) and int(max_evaluations) >= 1):
        raise GradschedError(f"usbyte: max_evaluations must be at least 1 (1 = front-first, no search), "
                             f"got {max_evaluations!r}")
    if extend not in (None, True, False):
        raise GradschedError(f"usbyte: extend must be true or false (or left out: chosen by simulation), "
                             f"got {extend!r}")
    if window not in (None, "block", "layer"):
        raise GradschedError(f"usbyte: window must be 'block' or 'layer' (or left out: chosen by simulation), "
                             f"got {window!r}")
    return int(unit_bytes), None if max_evaluations is None else int(max_evaluations)


OPTIONS = (
    Option("unit_bytes", int, DEFAULT_UNIT_BYTES, low=1, high=1 << 50, doc="block unit in bytes", size=True),
    Option("max_evaluations", int, DEFAULT_MAX_EVALUATIONS, low=1, high=1_000_000, optional=True,
           doc="promotions the priority search considers per rule (1: front-first, no search); "
               "left out: every layer"),
    Option("patience", int, DEFAULT_PATIENCE, low=0, high=1_000_000,
           doc="tries in a row without a gain before the search keeps only the cheap ones, cheaper the longer "
               "the dry spell (0: the full search)"),
    Option("extend", bool, None, optional=True,
           doc="send a layer's back-to-back blocks as one message (the paper's block extension); "
               "left out: chosen by simulation"),
    Option("window", str, None, optional=True,
           doc="promotion window: 'block' (gradsched's) or 'layer' (nearest the paper's); "
               "left out: chosen by simulation"),
    Option("merge_bytes", int, 0, low=0, high=1 << 50,
           doc="merge consecutive layers into groups of at least this many bytes first (0: the paper's layers)",
           size=True),
    coll.OPTION,
    Option("groups", int, None, low=0, high=1 << 20, optional=True,
           doc="send whole groups contiguous in ready order, each one all-reduce by forward-order priority: this "
               "many groups of equal bytes (0: the count and cuts chosen on the simulator); left out: US-Byte's "
               "blocks"),
)


@register("usbyte", options=OPTIONS)
def plan(profile: Profile, cluster: Cluster, unit_bytes: int = DEFAULT_UNIT_BYTES,
         max_evaluations: int | None = DEFAULT_MAX_EVALUATIONS, extend: bool | None = None,
         window: str | None = None, hierarchical: str = "auto", merge_bytes: int = 0,
         patience: int = DEFAULT_PATIENCE, groups: int | None = None) -> Plan:
    if groups is not None:
        grouped = _grouped(profile, cluster, groups, hierarchical, unit_bytes, merge_bytes, extend, window)[0]
        assert grouped is not None  # no beat_s: always made
        return grouped
    return predict(profile, cluster, unit_bytes, max_evaluations, extend, window, hierarchical, merge_bytes,
                   patience)[0]


def _grouped(profile: Profile, cluster: Cluster, groups: int, hierarchical: str, unit_bytes: int, merge_bytes: int,
             extend: bool | None, window: str | None, beat_s: float = math.inf) -> tuple[Plan | None, float | None]:
    """Option ``groups`` (:mod:`gradsched.planners._contiguous`): the plan, and its simulated iteration where
    it was simulated to choose it (``groups=0``), else None; (None, its iteration) where that is above ``beat_s``.
    The block options that shape US-Byte's blocks (``merge_bytes``, ``extend``, ``window``) are refused beside it;
    ``unit_bytes``, ``max_evaluations`` and ``patience`` go unused (the plan records the sizes, as a block plan
    does, so that ``auto``'s choice on a byte-scaled stand-in reads as the model's)."""
    coll.check_mode("usbyte", hierarchical, cluster)
    clash = [name for name, value in (("merge_bytes", merge_bytes), ("extend", extend), ("window", window))
             if value not in (0, None)]
    if clash:
        raise GradschedError(f"usbyte: groups sends whole groups of tensors, without blocks; leave out "
                             f"{', '.join(clash)} (they shape US-Byte's blocks) or groups")
    options = {"groups": groups, "unit_bytes": unit_bytes, "merge_bytes": merge_bytes}
    if groups > 0:
        return _contiguous.grouped_plan(profile, _contiguous.equal_byte_cuts(profile, groups), cluster, options,
                                        hierarchical), None
    return _contiguous.choose(profile, cluster, options, hierarchical, beat_s)
