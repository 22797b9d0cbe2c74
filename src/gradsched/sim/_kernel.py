"""The simulator's pass compiled with numba (the optional extra ``gradsched[fast]``).

The same pass as :func:`gradsched.sim.engine._run` with :func:`~gradsched.sim.engine._schedule`
(backward with its selections and issue times, the three scheduling disciplines, the other
work, updates and the next forward), on arrays, without the spans: the same floats added
and compared in the same order, so the times are identical (tests/test_sim_kernel.py).
The Python pass stays the reference and the fallback: without numba, with
``GRADSCHED_JIT=0``, for a timeline, where contention dilates compute or communication,
or where the runtime's retire time is charged, ``simulate`` runs it.  An operation costs
microseconds of interpreter in the Python pass and tens of nanoseconds here, which is
what lets ``auto`` and ``dear`` simulate thousands of operations per candidate.

Like :mod:`gradsched.planners._usbyte_jit`, numba is imported on the first compiled
simulation in a process, which compiles the kernel (once: cached on disk by numba where
the package directory is writable) or loads it from the cache.
"""

from __future__ import annotations

import heapq
import importlib.util
import logging
import os
from typing import Any, Callable

import numpy as np

EPS_S = 1e-12  # gradsched.sim.engine.EPS_S (the engine checks that they are equal)
MIN_OPERATIONS = 64  # fewer operations and layers together: the Python pass takes less than converting to arrays

_failed: list[str] = []
_compiled: dict[str, Callable[..., Any]] = {}


def enabled() -> bool:
    """Whether the compiled pass may be used: numba installed (and loadable) and ``GRADSCHED_JIT`` not ``0``."""
    return (os.environ.get("GRADSCHED_JIT", "1") != "0" and not _failed
            and importlib.util.find_spec("numba") is not None)


def kernel() -> Callable[..., Any] | None:
    """:func:`run_pass`, compiled (the first call in a process imports numba and compiles it, or
    loads it from numba's cache); None where numba fails to import: the Python pass then runs."""
    if _failed:
        return None
    if "run_pass" not in _compiled:
        try:
            import numba
        except Exception as e:  # noqa: BLE001 - any failure to load the optional extra means: no kernel
            _failed.append(f"{type(e).__name__}: {e}")
            logging.getLogger(__name__).warning("simulate: numba could not be imported (%s); the simulator runs "
                                                "in Python (the same times, slower)", _failed[0])
            return None
        jit = numba.njit(cache=True, nogil=True)
        space = globals()
        for name in ("_backward", "_first_free", "_schedule_fifo", "_schedule_events", "_settle", "_forward"):
            space[name] = jit(space[name])
        _compiled["run_pass"] = jit(run_pass)
    return _compiled["run_pass"]


def compiled(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled with numba (a planner's loop over arrays, kept beside its Python form), or None where the
    compiled code may not be used (:func:`enabled`, numba fails to import)."""
    if not enabled() or kernel() is None:
        return None
    name = f"{fn.__module__}.{fn.__qualname__}"
    if name not in _compiled:
        import numba

        _compiled[name] = numba.njit(cache=True, nogil=True)(fn)
    return _compiled[name]


def _backward(layer_time, comp_ptr, comp_ops, select, issue_s, ready, layer_end):
    """Backward on the compute stream: each layer, then the selections and issue times of the
    operations it completes; their ready times.  Returns when backward ends."""
    clock = 0.0
    for p in range(layer_time.shape[0]):
        dt = layer_time[p]
        if dt > 0:
            clock = clock + dt
        layer_end[p] = clock
        for k in range(comp_ptr[p], comp_ptr[p + 1]):
            j = comp_ops[k]
            if select[j] > 0:
                clock = clock + select[j]
            if issue_s > 0:
                clock = clock + issue_s
            ready[j] = clock
    return clock


def _first_free(free):
    c = 0
    for k in range(1, free.shape[0]):
        if free[k] < free[c]:
            c = k
    return c


def _schedule_fifo(ready, cost, after, channels, op_lat, start, end, gather_from):
    """Plan order, no credit window (engine._schedule's first branch)."""
    free = np.zeros(channels)
    last_start = 0.0
    for j in range(ready.shape[0]):
        if after[j] >= 0:
            ready[j] = max(end[after[j]], gather_from)
        c = 0
        for k in range(1, channels):
            if free[k] < free[c]:
                c = k
        s = max(ready[j], free[c], last_start)
        start[j] = s
        end[j] = s + cost[j] if op_lat == 0 else s + cost[j] + op_lat
        free[c] = end[j]
        last_start = s


def _schedule_events(ready, cost, nbytes, priority, after, fifo, credit, channels, op_lat,
                     start, end, gather_from):
    """Priority order, or a credit window (engine._schedule's event loop, decision for decision)."""
    # long function: engine._schedule's loop, kept line for line beside it so that the two can be compared
    n = ready.shape[0]
    free = np.zeros(channels)
    dep_count = np.zeros(n + 1, dtype=np.int64)
    for j in range(n):
        if after[j] >= 0:
            dep_count[after[j] + 1] += 1
    dep_ptr = np.cumsum(dep_count)
    dep_ops = np.empty(dep_ptr[n], dtype=np.int64)
    fill = dep_ptr[:n].copy()
    for j in range(n):
        if after[j] >= 0:
            dep_ops[fill[after[j]]] = j
            fill[after[j]] += 1
    free_ops = np.empty(n - dep_ptr[n], dtype=np.int64)  # ready by their layers; the others when their first ends
    m = 0
    for j in range(n):
        if after[j] < 0:
            free_ops[m] = j
            m += 1
    by_ready = free_ops[np.argsort(ready[free_ops], kind="mergesort")]
    n_free = by_ready.shape[0]
    unlocked = [(0.0, 0)]
    unlocked.pop()
    queue = [(0, 0)]
    queue.pop()
    finishing = [(0.0, 0)]
    finishing.pop()
    is_ready = np.zeros(n, dtype=np.bool_)
    inflight = 0
    issued = 0
    next_fifo = 0
    nxt = 0
    t = 0.0
    while issued < n:
        while nxt < n_free and ready[by_ready[nxt]] <= t + EPS_S:
            j = by_ready[nxt]
            is_ready[j] = True
            if not fifo:
                heapq.heappush(queue, (priority[j], j))
            nxt += 1
        while len(unlocked) > 0 and unlocked[0][0] <= t + EPS_S:
            j = heapq.heappop(unlocked)[1]
            is_ready[j] = True
            if not fifo:
                heapq.heappush(queue, (priority[j], j))
        while len(finishing) > 0 and finishing[0][0] <= t + EPS_S:
            inflight -= heapq.heappop(finishing)[1]
        while issued < n:
            cand = -1
            if fifo:
                if next_fifo < n and is_ready[next_fifo]:
                    cand = next_fifo
            elif len(queue) > 0:
                cand = queue[0][1]
            if cand < 0:
                break
            c = _first_free(free)
            if credit < 0:
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
            start[cand] = s
            end[cand] = s + cost[cand] if op_lat == 0 else s + cost[cand] + op_lat
            free[c] = end[cand]
            inflight += nbytes[cand]
            heapq.heappush(finishing, (end[cand], nbytes[cand]))
            for k in range(dep_ptr[cand], dep_ptr[cand + 1]):
                d = dep_ops[k]
                ready[d] = max(end[cand], gather_from)
                heapq.heappush(unlocked, (ready[d], d))
            issued += 1
        if issued >= n:
            break
        t_next = np.inf
        if nxt < n_free:
            t_next = min(t_next, ready[by_ready[nxt]])
        if len(unlocked) > 0:
            t_next = min(t_next, unlocked[0][0])
        if len(finishing) > 0:
            t_next = min(t_next, finishing[0][0])
        if credit < 0:
            for f in free:
                if f > t:
                    t_next = min(t_next, f)
        if t_next == np.inf:
            t_next = t
        if t_next <= t:
            later = np.inf
            for f in free:
                if f > t:
                    later = min(later, f)
            if later == np.inf:
                raise RuntimeError("simulator stalled: no operation can be issued")
            t_next = later
        t = t_next


def _settle(t, upto, settled, by_issue, end):
    """Wait for the operations in issue order up to ``upto`` (engine._run's settle, no retire time):
    the new time and how many are settled."""
    for k in range(settled, upto + 1):
        if end[by_issue[k]] > t:
            t = end[by_issue[k]]
    return t, max(settled, upto + 1)


def _forward(t, end, start, overlap, other_s, update_total, call_s, fwd_s, upd_s, f_ptr, f_tensors, g_ptr, g_ops,
             o_ptr, o_tensors, num_tensors):
    """Other work, updates and the next forward (engine._run's last part): when the iteration ends."""
    n = end.shape[0]
    applied = 0  # overlapping plans: operations (a prefix of the issue order) whose updates are applied
    if overlap and other_s > 0:
        t = t + other_s
    by_issue = np.argsort(start, kind="mergesort")
    settled = 0
    if not overlap:
        t, settled = _settle(t, n - 1, settled, by_issue, end)
        if update_total > 0:
            t = t + update_total
        if other_s > 0:
            t = t + other_s
    last_holding = np.full(num_tensors, -1, dtype=np.int64)
    issue_pos = np.empty(n, dtype=np.int64)
    for k in range(n):
        j = by_issue[k]
        issue_pos[j] = k
        if overlap:
            for q in range(o_ptr[j], o_ptr[j + 1]):
                last_holding[o_tensors[q]] = k
    for f in range(fwd_s.shape[0]):
        if g_ptr[f + 1] > g_ptr[f]:
            upto = -1
            for q in range(g_ptr[f], g_ptr[f + 1]):
                upto = max(upto, issue_pos[g_ops[q]])
            t, settled = _settle(t, upto, settled, by_issue, end)
        if overlap:
            upto = -1
            for q in range(f_ptr[f], f_ptr[f + 1]):
                upto = max(upto, last_holding[f_tensors[q]])
            t, settled = _settle(t, upto, settled, by_issue, end)
            if call_s > 0 and upto >= applied:  # one deferred update: this layer's and every complete one
                applied = upto + 1
                while applied < n and end[by_issue[applied]] <= t + EPS_S:
                    applied += 1
                t = t + call_s
            if upd_s[f] > 0:
                t = t + upd_s[f]
        if fwd_s[f] > 0:
            t = t + fwd_s[f]
    return t


def run_pass(layer_time, comp_ptr, comp_ops, select, issue_s, cost, nbytes, priority, after, fifo, credit,
             channels, op_lat, other_s, overlap, update_total, call_s, fwd_s, upd_s, f_ptr, f_tensors, g_ptr, g_ops,
             o_ptr, o_tensors, num_tensors, ready, start, end, layer_end):
    """One pass (no dilation, no retire time): fills ``ready``, ``start``, ``end`` and ``layer_end``;
    returns ``(backward_end, comm_end, iteration)``.  ``credit`` < 0: no window."""
    backward_end = _backward(layer_time, comp_ptr, comp_ops, select, issue_s, ready, layer_end)
    n = ready.shape[0]
    # the runtime starts the all-gathers at its first wait after backward (engine._run): after other_s in an
    # overlapping plan, at the end of backward otherwise
    gather_from = backward_end + other_s if overlap and other_s > 0 else backward_end
    if n > 0:
        if fifo and credit < 0:
            _schedule_fifo(ready, cost, after, channels, op_lat, start, end, gather_from)
        else:
            _schedule_events(ready, cost, nbytes, priority, after, fifo, credit, channels, op_lat, start, end,
                             gather_from)
    comm_end = 0.0
    for j in range(n):
        comm_end = max(comm_end, end[j]) if j > 0 else end[j]
    iteration = _forward(backward_end, end, start, overlap, other_s, update_total, call_s, fwd_s, upd_s, f_ptr, f_tensors,
                         g_ptr, g_ops, o_ptr, o_tensors, num_tensors)
    return backward_end, comm_end, iteration
