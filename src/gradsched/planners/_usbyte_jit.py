"""US-Byte's priority search compiled with numba (the optional extra ``gradsched[fast]``).

The same search as :func:`gradsched.planners.usbyte.search_priorities` over
:class:`~gradsched.planners.usbyte._Model` (phase 1 replayed from each try's first
changed block, phase 2 and the next forward priced in closed form, the same tries in
the same order, the same floats compared in the same order), with every try's loop
compiled: each phase-1 block costs tens of nanoseconds instead of microseconds of
interpreter.  Two shortcuts of its own, neither changing a choice (so the plans stay the
Python search's): a try stops as soon as its iteration cannot be below the best's (the
floor, a block's end plus the work after it, or the bytes left at the cheaper rate), and a
try that meets the best schedule (the same clock, start and last block, every unit as far
as the best was there, the units left in the same order) takes the best's rest instead of
replaying it (:func:`_run`; a kept one, rare, is then played whole for its blocks): where a
promotion changes a few blocks and the schedule then runs as before, most of phase 1.
The Python model stays the reference and the fallback: without numba
(``pip install 'gradsched[fast]'`` adds it), with ``GRADSCHED_JIT=0`` in the
environment, or for a model this kernel does not cover (a measured cost table, or a
layer with no elements), ``usbyte`` runs the Python search, and the two give identical
plans (tests/test_usbyte_jit.py).

Covered: one cost line or the cheaper of two (the hierarchical all-reduce beside the
plain one), ready times spread or not, block extension, both promotion windows,
``max_evaluations`` and ``patience``; used for :data:`MIN_UNITS` layers or more.  numba is
imported on the first such search in a process, which compiles the kernel (once: cached
on disk by numba where the package directory is writable) or loads it from the cache.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from typing import Callable

import numpy as np

EPS_S = 1e-12  # gradsched.sim.engine.EPS_S (usbyte checks that they are equal)
NO_LIMIT = 1 << 62  # max_evaluations left out
MEET_EVERY = 8  # decisions between two tests of whether a try met the best schedule (_loop)
MIN_UNITS = 64  # fewer layers: the Python search takes milliseconds, less than loading the kernel

_COMPILED: list[str] = []  # the kernel's functions, compiled on first use (numba is imported only then)
_INLINED: list[str] = []
_kernel: Callable | None = None


_failed: list[str] = []  # why numba could not be loaded (then the Python search runs, said once in the log)


def enabled() -> bool:
    """Whether the compiled search may be used: numba installed (and loadable) and ``GRADSCHED_JIT``
    not ``0``."""
    return (os.environ.get("GRADSCHED_JIT", "1") != "0" and not _failed
            and importlib.util.find_spec("numba") is not None)


def kernel(name: str = "search") -> Callable | None:
    """:func:`search` (or the kernel's function ``name``), compiled (the first call in a
    process imports numba and compiles the functions, or loads them from numba's cache on disk);
    None where numba fails to import (e.g. built for another numpy): the Python search then runs."""
    global _kernel
    if _failed:
        return None
    if _kernel is None:
        try:
            import numba
        except Exception as e:  # noqa: BLE001 - any failure to load the optional extra means: no kernel
            _failed.append(f"{type(e).__name__}: {e}")
            logging.getLogger(__name__).warning("usbyte: numba could not be imported (%s); the priority "
                                                "search runs in Python (the same plans, slower)", _failed[0])
            return None

        space = globals()
        for helper in _INLINED:  # the loop's small helpers: no call, no reference counting of their arrays
            space[helper] = numba.njit(cache=True, nogil=True, inline="always")(space[helper])
        for function in _COMPILED:
            space[function] = numba.njit(cache=True, nogil=True)(space[function])
        _kernel = space["search"]
    return globals()[name]


def _jit(fn: Callable) -> Callable:
    _COMPILED.append(fn.__name__)
    return fn


def _inline(fn: Callable) -> Callable:
    _INLINED.append(fn.__name__)
    return fn


@_inline
def _time(nbytes, a1, b1, a2, b2, two):
    """The model's seconds for ``nbytes`` (usbyte._Timer / _cheapest: the cheaper of two lines)."""
    if nbytes <= 0:
        return 0.0
    first = a1 + b1 * nbytes
    if two:
        second = a2 + b2 * nbytes
        if second < first:
            return second
    return first


@_inline
def _fill(gap, rest, unit, eb, alpha, beta, a1, b1, a2, b2, two):
    """usbyte._fill: the elements of a phase-1 block that fills ``gap``."""
    if gap < alpha:
        elems = unit
    elif beta > 0 and gap < _time(rest * eb, a1, b1, a2, b2, two):
        elems = max(1, math.ceil((gap - alpha) / (beta * unit * eb))) * unit
    else:
        elems = rest
    return rest if elems > rest else elems


_MAGIC = 0x03F79D71B4CB0A89  # a de Bruijn sequence: the lowest set bit's index by one multiply and a table
_CTZ = np.zeros(64, np.int64)
for _bit in range(64):
    _CTZ[(((1 << _bit) * _MAGIC) & ((1 << 64) - 1)) >> 58] = _bit
_ONE, _MAGIC_U, _SHIFT = np.uint64(1), np.uint64(_MAGIC), np.uint64(58)


@_inline
def _ctz(x):
    """The index of the lowest set bit of the (nonzero) uint64 ``x``."""
    return _CTZ[((x & (~x + _ONE)) * _MAGIC_U) >> _SHIFT]


# The ready units with data left, by rank: a two-level bitset (``bits``: one bit per rank;
# ``summ``: one bit per nonzero word of ``bits``), where the heap of the Python model pops
# the lowest rank: the same unit, in a few word operations instead of a sift.  Its operations
# are written out where they are used: an inlined helper given arrays counts their references
# (two calls into numba's runtime) on every call.


@_inline
def _extend(lo, hi, s0, start, next_ready, rest, unit, eb, alpha, beta, a1, b1, a2, b2, two):
    """usbyte._Model._extend on the last block (its first and end element, its start; the caller
    checks that it is the unit's and ends at ``start``): the elements added to it and its new end,
    or -1.  Scalars only: an inlined helper given arrays counts their references on every call."""
    total = _fill(next_ready - s0, rest + hi - lo, unit, eb, alpha, beta, a1, b1, a2, b2, two)
    elems = max(total - (hi - lo), min(unit, rest))
    end = s0 + _time((hi - lo + elems) * eb, a1, b1, a2, b2, two)
    if end < start:
        return -1, end
    return elems, end


# A schedule's state, in arrays (``cap`` phase-1 blocks at most, ``n`` units):
#   I int64 (3, cap): each block's unit, first and end element
#   F float64 (5, cap): each block's start, end, decision time, running largest end + after, and
#     the largest end + after from the block on
#   N int64 (4, n): (unused), each unit's elements left and sent, phase 2's sorted keys
#   S float64 (4,): the iteration, phase 2's start and clock, phase 2's largest end + after
#   Z int64 (3,): blocks, phase 2's keys, (during a try) the best's blocks passed
# The model: FA float64 (5, n): ready times sorted, each + EPS_S, each unit's whole time, the
# work after its earliest layer, its ready time; IA int64 (4, n): units by ready time, elements,
# element bytes, unit elements; P: alpha, beta (the line blocks are sized by), the exact
# cost's line(s) a1, b1, a2, b2, the iteration's floor; Q: two lines, ready times spread,
# extend, window "layer", max evaluations, patience, the dry spell's blocks (usbyte._skipped).


@_jit
def _start(I, F, N, bI, bF, bS, bZ, at, IA, FA, rank, bits, summ):
    """usbyte._Model._start: ``I, F, N`` set to the state of ``bI..bZ`` just before its block
    ``at`` (0: the start), the units ready with data left in ``bits``.  Returns (blocks, clock,
    channel free, next ready, units in ``bits``)."""
    numel, by_ready, ready = IA[1], IA[0], FA[0]
    n = numel.shape[0]
    left, sent = N[1], N[2]
    for u in range(n):
        left[u], sent[u] = numel[u], 0
    bits[:] = 0
    summ[:] = 0
    if at == 0:
        m, t, free = 0, 0.0, 0.0
    else:
        m = at
        I[:, :at] = bI[:, :at]
        F[:3, :at] = bF[:3, :at]
        t = bF[2, at] if at < bZ[0] else bS[2]  # block at's decision time, or phase 2's clock
        free = F[1, at - 1]
        for k in range(at):  # a unit's blocks go in order: its last one says how far it got
            u = I[0, k]
            sent[u] = I[2, k]
            left[u] = numel[u] - I[2, k]
    nxt = 0
    if m > 0:
        nxt = np.searchsorted(ready, t + EPS_S, side="right")
    size = 0
    for j in range(nxt):
        u = by_ready[j]
        if left[u] > 0:  # joins the bitset
            r = rank[u]
            w = r >> 6
            bits[w] |= _ONE << np.uint64(r & 63)
            summ[w >> 6] |= _ONE << np.uint64(w & 63)
            size += 1
    return m, t, free, nxt, size


@_jit
def _dry_iteration(I, F, N, S, Z, bF, order, start, t, m, at, IA, FA, P, Q):
    """usbyte._Model._dry_iteration_s: phase 2 left pending, the iteration in closed form.  The
    heap then holds every unit with data left: its sorted keys are those units in ``order``."""
    numel, elem, full, after = IA[1], IA[2], FA[2], FA[3]
    n = numel.shape[0]
    keys, left = N[3], N[1]
    last, run = -np.inf, 0.0
    size = 0
    for r in range(n):
        u = order[r]
        rest = left[u]
        if rest <= 0:
            continue
        keys[size] = r * n + u
        j = size
        size += 1
        took = full[u] if rest == numel[u] else _time(rest * elem[u], P[2], P[3], P[4], P[5], Q[0] != 0)
        run = took + start if j == 0 else run + took
        if run + after[u] > last:
            last = run + after[u]
    same = at - 1 if at > 1 else 0  # blocks[:same] are the resumed schedule's as they were
    first = bF[3, same - 1] if same else 0.0  # their largest end + after, and the blocks' from ``same`` on
    for k in range(same, m):
        v = F[1, k] + after[I[0, k]]
        if v > first:
            first = v
    S[0] = max(P[6], first, last)
    S[1], S[2], S[3] = start, t, last
    Z[0], Z[1] = m, size


@_inline
def _bound(free, rem, count, a_lo, b_lo, after_lo):
    """A lower bound of the iteration once the channel is free at ``free``: every byte left
    (``rem``) sent at the cheaper line's bytes rate, a start-up for each of the ``count``
    units with data left (each goes in at least one more message: the cost is subadditive;
    the caller leaves out the last block's unit where blocks extend), then the least work after a block."""
    return free + b_lo * rem + a_lo * count + after_lo


@_jit
def _diff_zero(I, bI, m, at, jb, diff):
    """Whether the try (blocks ``at..m-1`` of ``I``, and what it added to its block ``at - 1``) has sent
    each unit as many elements as the best's blocks ``at..jb-1`` (``diff``: zeros on entry and exit).
    Called only where the try's hash of the difference is 0 (:func:`_loop`), so rarely."""
    if at > 0:
        diff[I[0, at - 1]] += I[2, at - 1] - bI[2, at - 1]
    for k in range(at, m):
        diff[I[0, k]] += I[2, k] - I[1, k]
    for k in range(at, jb):
        diff[bI[0, k]] -= bI[2, k] - bI[1, k]
    same = True
    for k in range(at - 1 if at > 0 else 0, m):
        same = same and diff[I[0, k]] == 0
        diff[I[0, k]] = 0
    for k in range(at, jb):
        same = same and diff[bI[0, k]] == 0
        diff[bI[0, k]] = 0
    return same


@_inline
def _same_state(I, F, m, t, start, bI, bF, jb, mb, extend):
    """Whether the try's decision now (clock ``t``, the block to start at ``start``) is the one the
    best schedule made creating its block ``jb``: the same clock and start and (where blocks
    extend) the same last block; the caller checks that every unit has sent as much."""
    if jb >= mb or jb < 1 or m < 1 or bF[2, jb] != t or bF[0, jb] != start:
        return False
    if not extend:
        return True
    return (I[0, m - 1] == bI[0, jb - 1] and I[1, m - 1] == bI[1, jb - 1] and I[2, m - 1] == bI[2, jb - 1]
            and F[0, m - 1] == bF[0, jb - 1] and F[1, m - 1] == bF[1, jb - 1])


@_jit
def _synced(F, I, S, bF, bS, m, at, jb, after, floor):
    """The iteration of a try that meets the best schedule at its block ``jb`` (the try's blocks up to
    ``m``, then the best's from ``jb`` on, and its phase 2): as :func:`_dry_iteration` would price it."""
    same = at - 1 if at > 1 else 0
    first = bF[3, same - 1] if same else 0.0
    for k in range(same, m):
        v = F[1, k] + after[I[0, k]]
        if v > first:
            first = v
    S[0] = max(floor, first, bF[4, jb], bS[3])


@_jit
def _run(I, F, N, S, Z, bI, bF, bS, bZ, at, order, rank, IA, FA, P, Q, bits, summ, thr, diff, promoted, target,
         top_rank):
    """usbyte._Model.run (dry) into ``I..Z``, resumed from ``bI..bZ`` at block ``at``: phase 1
    played block by block, phase 2 priced.  Returns 0, or 1 where every unit is sent before
    phase 2 (a case the Python model plays: the search falls back), or 2 as soon as the
    iteration cannot be below ``thr`` (a block's end plus the work after it, or
    :func:`_bound`, reaches it: the search's try is then not kept, whatever the rest is), or 3
    where the try meets the best schedule (``promoted`` >= 0: the unit the try moved from rank
    ``top_rank`` to ``target``): at a decision where every unit has sent what it had when the
    best made its block ``jb`` (checked by :func:`_diff_zero` where a hash of the difference is 0), at
    the same clock, start and last block, and the units with data left keep their order (the
    promoted one done, or the ones it passed), the rest is the best's: ``S[0]`` priced by
    :func:`_synced` (the try's blocks are then not whole: the search plays a kept one again,
    with ``promoted`` -1)."""
    elem, left = IA[2], N[1]
    m, t, free, nxt, size = _start(I, F, N, bI, bF, bS, bZ, at, IA, FA, rank, bits, summ)
    rem, count = 0, 0  # the bytes left, and the units with data left
    for u in range(elem.shape[0]):
        if left[u] > 0:
            rem += left[u] * elem[u]
            count += 1
    Z[0], Z[2] = m, at
    if P[6] >= thr or (at > 1 and bF[3, at - 2] >= thr):  # the floor, or a block before the first that may
        return 2  # change, already too late
    jb, mb, passed = at, bZ[0], 0  # the best's next block, its blocks, passed units left
    if promoted >= 0:
        for r in range(target + 1, top_rank + 1):
            passed += left[order[r]] > 0
    return _loop(I, F, N, S, Z, bI, bF, bS, bZ, at, order, rank, IA, FA, P, Q, bits, summ, thr, diff, promoted,
                 target, top_rank, m, t, free, nxt, size, rem, count, jb, mb, passed)


@_jit
def _loop(I, F, N, S, Z, bI, bF, bS, bZ, at, order, rank, IA, FA, P, Q, bits, summ, thr, diff, promoted, target,
          top_rank, m, t, free, nxt, size, rem, count, jb, mb, passed):
    """:func:`_run`'s loop (from its state after :func:`_start`); leaves the try's blocks in ``Z[0]``
    and the best's blocks it passed in ``Z[2]``.  Meeting the best is tested lazily: ``h``, the sum over
    units of (the elements the try sent it) - (those the best's blocks passed sent it), times the unit's
    number + 1, is 0 wherever every unit's difference is; only then (and at the same clock and start) does
    :func:`_diff_zero` compare unit by unit (no per-unit count kept on every block).  A try that met the
    best makes the best's decisions from there on (the same state, and the same order of the units left),
    so the test runs at the first decision and then every :data:`MEET_EVERY`: a met try is found a few
    blocks later, and the blocks between cost no bookkeeping."""
    # long function: the model's phase-1 loop, one block per pass, as usbyte._Model._run_line
    by_ready, elem, unit_elems, after = IA[0], IA[2], IA[3], FA[3]
    ready, ready_eps = FA[0], FA[1]
    alpha, beta, a1, b1, a2, b2 = P[0], P[1], P[2], P[3], P[4], P[5]
    two, spread, extend = Q[0] != 0, Q[1] != 0, Q[2] != 0
    a_lo, b_lo = (min(a1, a2), min(b1, b2)) if two else (a1, b1)
    after_lo = after.min()
    n = by_ready.shape[0]
    left, sent = N[1], N[2]
    Z[0], Z[2] = m, jb
    words = summ.shape[0]
    h, wait = 0, 1
    while True:
        lim = t + EPS_S
        while nxt < n and ready[nxt] <= lim:  # the units ready by now join the bitset
            r = rank[by_ready[nxt]]
            w = r >> 6
            bits[w] |= _ONE << np.uint64(r & 63)
            summ[w >> 6] |= _ONE << np.uint64(w & 63)
            size += 1
            nxt += 1
        if size > 0 and free <= lim:
            start = t if t > free else free
            if nxt == n:  # phase 2 from here
                _dry_iteration(I, F, N, S, Z, bF, order, start, t, m, at, IA, FA, P, Q)
                Z[2] = jb
                return 0
            wait -= 1
            if promoted >= 0 and wait == 0:  # a try that met the best stays met: tested every MEET_EVERY decisions
                wait = MEET_EVERY
                while jb < mb and bF[0, jb] < start:  # the best's blocks up to now
                    h -= (bI[2, jb] - bI[1, jb]) * (bI[0, jb] + 1)
                    jb += 1
                if h == 0 and (left[promoted] == 0 or passed == 0) and \
                        _same_state(I, F, m, t, start, bI, bF, jb, mb, extend) and _diff_zero(I, bI, m, at, jb, diff):
                    _synced(F, I, S, bF, bS, m, at, jb, after, P[6])
                    Z[0], Z[1], Z[2] = m, jb, jb
                    return 3
            top = -1  # the lowest rank in the bitset
            for k in range(words):
                if summ[k] != 0:
                    w = k * 64 + _ctz(summ[k])
                    top = w * 64 + _ctz(bits[w])
                    break
            u = order[top]
            rest = left[u]
            eb, ue = elem[u], unit_elems[u]
            elems = -1
            if extend and m > 0 and I[0, m - 1] == u and F[1, m - 1] == start:
                elems, end = _extend(I[1, m - 1], I[2, m - 1], F[0, m - 1], start, ready[nxt], rest, ue, eb, alpha,
                                     beta, a1, b1, a2, b2, two)
                if elems >= 0:
                    I[2, m - 1] += elems
                    F[1, m - 1] = free = end
            if elems < 0:
                elems = _fill(ready[nxt] - start, rest, ue, eb, alpha, beta, a1, b1, a2, b2, two)
                free = start + _time(elems * eb, a1, b1, a2, b2, two)
                s0 = sent[u]
                I[0, m], I[1, m], I[2, m] = u, s0, s0 + elems
                F[0, m], F[1, m], F[2, m] = start, free, t
                m += 1
            sent[u] += elems
            left[u] = rest - elems
            rem -= elems * eb
            if promoted >= 0:
                h += elems * (u + 1)
            if rest == elems:  # leaves the bitset
                w = top >> 6
                bits[w] &= ~(_ONE << np.uint64(top & 63))
                if bits[w] == 0:
                    summ[w >> 6] &= ~(_ONE << np.uint64(w & 63))
                size -= 1
                count -= 1
                if promoted >= 0 and target < top <= top_rank:
                    passed -= 1
            if free + after[u] >= thr or _bound(free, rem, count - 1 if extend and left[u] > 0 else count, a_lo, b_lo,
                                                after_lo) * (1 - 1e-9) >= thr:
                Z[0], Z[2] = m, jb
                return 2
            continue
        if size == 0 and nxt == n:
            Z[0], Z[2] = m, jb
            return 1
        if nxt < n and free > lim:  # channel busy: to when it may be free (usbyte._busy_until_spread / _busy_until)
            k = nxt
            if spread:  # bisect_left(ready_eps, free, nxt), galloping from nxt: the next block usually ends soon
                hi, step = nxt, 1
                while hi < n and ready_eps[hi] < free:
                    k = hi + 1
                    hi = k + step
                    step *= 2
                hi = min(hi, n)
                while k < hi:
                    mid = (k + hi) >> 1
                    if ready_eps[mid] < free:
                        k = mid + 1
                    else:
                        hi = mid
                r = ready[n - 1] if k == n else ready[k]
                t = r if k == n or free >= r else free
                continue
            while True:
                r = ready[k]
                t = free if free > t and free < r else r
                lim = t + EPS_S
                while k < n and ready[k] <= lim:
                    k += 1
                if free <= lim or k == n:
                    break
            continue
        t_next = ready[nxt] if nxt < n else free
        if free > t and free < t_next:
            t_next = free
        t = t_next


@_jit
def _first_change(bI, bF, bN, bZ, rank, u, target, FA):
    """usbyte._first_change on the arrays: the first block whose choice the promotion of ``u``
    to rank ``target`` could change (``m``: in phase 2), or -1."""
    m, nk = bZ[0], bZ[1]
    n = rank.shape[0]
    in_phase_two = bN[1, u] > 0
    last_u = m
    if not in_phase_two:
        last_u = m - 1
        while bI[0, last_u] != u:
            last_u -= 1
    ready_u, top = FA[4, u] - 2 * EPS_S, rank[u]
    for k in range(last_u):
        r = rank[bI[0, k]]
        if r >= target and r < top and bF[1, k] >= ready_u:
            return k
    if in_phase_two:
        k = np.searchsorted(bN[3, :nk], target * n)
        if k < nk and bN[3, k] < top * n:
            return m
    return -1


@_jit
def _kept(bI, bF, bZ, FA, first_lo, first_hi, first_s, first_e):
    """A new best: its running largest end + after, and each unit's first block."""
    after = FA[3]
    first_lo[:] = -1
    best = -np.inf
    for k in range(bZ[0]):
        u = bI[0, k]
        v = bF[1, k] + after[u]
        best = v if v > best else best
        bF[3, k] = best
        if first_lo[u] < 0:
            first_lo[u], first_hi[u], first_s[u], first_e[u] = bI[1, k], bI[2, k], bF[0, k], bF[1, k]
    best = -np.inf
    for k in range(bZ[0] - 1, -1, -1):  # and the largest from each block on
        v = bF[1, k] + after[bI[0, k]]
        best = v if v > best else best
        bF[4, k] = best


@_jit
def _promote(order, rank, u, target, t_order, t_rank):
    """usbyte._promoted into ``t_*``: ``u`` moved up to rank ``target``."""
    top = rank[u]
    t_order[:] = order
    t_rank[:] = rank
    t_order[target + 1:top + 1] = order[target:top]
    t_order[target] = u
    for r in range(target, top + 1):
        v = t_order[r]
        t_rank[v] = r


@_jit
def search(order, cap, IA, FA, P, Q, cheap_tail):
    """usbyte.search_priorities, compiled.  Returns (status, evaluations, rank, I, F, N, S, Z):
    status 1 where the Python search must run instead."""
    # long function: the search's walk, as usbyte.search_priorities, on the arrays
    n = order.shape[0]
    numel, by_ready, ready, full = IA[1], IA[0], FA[0], FA[2]
    window_layer, max_eval, patience = Q[3] != 0, Q[4], Q[5]
    state = [(np.zeros((3, cap), np.int64), np.zeros((5, cap)), np.zeros((4, n), np.int64), np.zeros(4),
              np.zeros(3, np.int64)) for _ in range(2)]
    diff = np.zeros(n, np.int64)
    bI, bF, bN, bS, bZ = state[0]
    tI, tF, tN, tS, tZ = state[1]
    rank = np.empty(n, np.int64)
    for r in range(n):
        rank[order[r]] = r
    order = order.copy()
    t_order, t_rank = order.copy(), rank.copy()
    walk = order.copy()  # the layers in their first ranks, output first
    words = (n + 63) >> 6
    bits, summ = np.zeros(words, np.uint64), np.zeros((words + 63) >> 6, np.uint64)
    if _run(bI, bF, bN, bS, bZ, bI, bF, bS, bZ, 0, order, rank, IA, FA, P, Q, bits, summ, np.inf, diff, -1, 0, 0):
        return 1, 0, rank, bI, bF, bN, bS, bZ
    first_lo, first_hi = np.empty(n, np.int64), np.empty(n, np.int64)
    first_s, first_e = np.empty(n), np.empty(n)
    _kept(bI, bF, bZ, FA, first_lo, first_hi, first_s, first_e)
    evaluations, since = 1, 0
    for j in range(n - 1, -1, -1):
        u = walk[j]
        if evaluations >= max_eval:
            break
        if first_lo[u] < 0 or first_hi[u] - first_lo[u] >= numel[u]:
            continue  # sent whole in phase 2, or in one block
        end_s = first_s[u] + full[u] if window_layer else first_e[u]
        a = np.searchsorted(ready, first_s[u], side="right")
        b = np.searchsorted(ready, end_s, side="right")
        target = n
        for k in range(a, b):
            r = rank[by_ready[k]]
            if r < rank[u] and r < target:
                target = r
        if target == n:
            continue
        evaluations += 1
        at = _first_change(bI, bF, bN, bZ, rank, u, target, FA)
        if at < 0:
            continue
        m = bZ[0]
        if patience and since >= patience and m - at > cheap_tail * m and (m - at) * since > patience * Q[6]:
            continue
        _promote(order, rank, u, target, t_order, t_rank)
        thr = bS[0] * (1 - 1e-12)  # a try is kept below this
        status = _run(tI, tF, tN, tS, tZ, bI, bF, bS, bZ, at, t_order, t_rank, IA, FA, P, Q, bits, summ, thr, diff,
                      u, target, rank[u])
        if status == 3 and tS[0] < thr:  # kept (rare: not met in 300 random cases): played whole, for its blocks
            status = _run(tI, tF, tN, tS, tZ, bI, bF, bS, bZ, at, t_order, t_rank, IA, FA, P, Q, bits, summ, np.inf,
                          diff, -1, target, rank[u])
        if status == 1:
            return 1, evaluations, rank, bI, bF, bN, bS, bZ
        since += 1
        if status == 0 and tS[0] < thr:
            bI, tI, bF, tF, bN, tN, bS, tS, bZ, tZ = tI, bI, tF, bF, tN, bN, tS, bS, tZ, bZ
            order, t_order, rank, t_rank = t_order, order, t_rank, rank
            _kept(bI, bF, bZ, FA, first_lo, first_hi, first_s, first_e)
            since = 0
    return 0, evaluations, rank, bI, bF, bN, bS, bZ


@_jit
def complete(I, F, N, S, Z, IA, FA, P, Q, layer_ptr, layer_idx, work, base):
    """usbyte._Model.complete on the arrays: phase 2 played into the block arrays after phase 1
    (every unit with data left, in priority order, back to back), then the iteration in the
    simulator's order (each forward layer after its units' last block: ``work`` holds each
    layer's update and forward time, ``layer_ptr``/``layer_idx`` each unit's forward layers).
    Returns the number of blocks and the iteration."""
    numel, elem, full = IA[1], IA[2], FA[2]
    n = numel.shape[0]
    m, nk = Z[0], Z[1]
    left, sent = N[1], N[2]
    start, t = S[1], S[2]
    for j in range(nk):
        u = N[3, j] % n
        rest, lo = left[u], sent[u]
        end = start + (full[u] if rest == numel[u] else _time(rest * elem[u], P[2], P[3], P[4], P[5], Q[0] != 0))
        I[0, m], I[1, m], I[2, m] = u, lo, lo + rest
        F[0, m], F[1, m], F[2, m] = start, end, t
        m += 1
        t = start = end
    done = np.zeros(work.shape[1])
    for k in range(m):
        u, end = I[0, k], F[1, k]
        for j in range(layer_ptr[u], layer_ptr[u + 1]):
            if end > done[layer_idx[j]]:
                done[layer_idx[j]] = end
    clock = base
    for k in range(work.shape[1]):
        clock = (clock if clock >= done[k] else done[k]) + work[0, k] + work[1, k]
    return m, clock
