"""The queued-stream pass of the simulator: operations of one level in flight several at once, the link's
rate shared (:mod:`gradsched.queued`; docs/cost-model.md, "Queued streams").

Used for plans whose every operation has a queued rule (reduce-scatters and all-gathers on a cluster
measured with ``gradsched netbench --queue-depths``), on one channel without a credit window.  Up to
``slots`` operations are in flight; with ``n`` of them, each progresses at ``rule.rate(n) / n`` of its own
speed alone, so one operation alone ends exactly when the one-channel pass ends it, and ``k`` operations
issued together never end later than one after another (the queue moves at least one alone's bytes a
second).  The order is the one-channel pass's: plan order (``fifo``) or the highest priority among the
ready ones, issued whenever a slot is free.  An operation's work is what ``on_comm`` makes of it from the
moment it starts (contention and per-operation latency as for one alone).
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

from gradsched.queued import QueuedRule

EPS_S = 1e-12


def schedule_queued(fifo: bool, priority: Sequence[int], ready: list[float], cost: Sequence[float],
                    rules: Sequence[QueuedRule], start: list[float], end: list[float],
                    on_comm: Callable[[float, float], float], after: Sequence[int], gather_from_s: float,
                    comm_of: Sequence[Callable[[float, float], float]] | None = None) -> None:
    """Fill ``start``/``end`` of every operation; ``after[j]``: an operation that must end before ``j`` is ready
    (no earlier than ``gather_from_s`` either), or -1.  ``ready`` of such operations is set here."""
    # long function: one event loop (admit, issue, advance the shared rates); split, it would pass its state around
    n = len(ready)
    slots = max((r.slots for r in rules), default=1)
    dependents: dict[int, list[int]] = {}
    arrivals: list[tuple[float, int]] = []  # (ready, index) not yet admitted
    for j in range(n):
        if after[j] >= 0:
            dependents.setdefault(after[j], []).append(j)
        else:
            heapq.heappush(arrivals, (ready[j], j))
    waiting: list[tuple[int, int]] = []  # admitted, not issued: (priority or index, index)
    active: dict[int, float] = {}  # in flight: remaining seconds of work at one alone's speed
    next_fifo, done, t = 0, 0, 0.0
    is_ready = [False] * n
    while done < n:
        while arrivals and arrivals[0][0] <= t + EPS_S:
            j = heapq.heappop(arrivals)[1]
            is_ready[j] = True
            heapq.heappush(waiting, (j if fifo else priority[j], j))
        while len(active) < slots:
            if fifo:
                if next_fifo >= n or not is_ready[next_fifo]:
                    break
                j = next_fifo
                next_fifo += 1
            elif waiting:
                j = heapq.heappop(waiting)[1]
            else:
                break
            start[j] = t
            active[j] = (on_comm if comm_of is None else comm_of[j])(t, cost[j]) - t
        if not active:
            if not arrivals:
                raise RuntimeError("simulator stalled: no operation can be issued")
            t = max(t, arrivals[0][0])
            continue
        speed = {j: rules[j].rate(len(active)) / len(active) for j in active}
        dt = min(left / speed[j] for j, left in active.items())
        if arrivals and arrivals[0][0] - t < dt:
            dt = max(0.0, arrivals[0][0] - t)
        t += dt
        for j in list(active):
            active[j] -= speed[j] * dt
            if active[j] <= EPS_S * max(1.0, t):
                del active[j]
                end[j] = t
                done += 1
                for d in dependents.get(j, ()):
                    ready[d] = max(t, gather_from_s)
                    heapq.heappush(arrivals, (ready[d], d))
