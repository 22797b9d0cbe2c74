"""Host time a runtime spends per operation on its training thread: what ``gradsched bench`` measures.

Every operation costs the thread that trains some Python and a backend call: issuing
it (the hook's bookkeeping, ``all_reduce(async_op=True)``) and retiring it (the wait's
bookkeeping, the results written back).  On 2 local ranks of this project's 2-core
machine that is 0.08-0.25 ms of CPU to issue and 0.02-0.07 ms to retire, against
1.5-50 ms steps: ``mlp``'s 8 one-tensor operations cost a millisecond more than its
single bucket does, which the simulator did not see (``mlp``'s ``wfbp`` was predicted
19-39% short in four jobs; docs/simulator.md, "Fidelity").

:class:`HostTimer` counts the thread's CPU time (``time.thread_time``), not wall time:
when communication keeps the cores busy, the simulator stretches compute-stream work by
the contention figures, and counting wall time would charge that stretch twice.  Only
the outermost counted call of a thread counts (retiring waits issue nothing, but call
the issuing code).  It is off unless asked for (:meth:`DistributedDataParallel.host_timer`):
reading a thread's CPU clock is a system call at every gradient hook.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")
KINDS = ("issue", "retire")


class HostTimer:
    """Thread CPU seconds spent issuing and retiring operations, and the backward passes counted."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.passes = 0
        self._clock = clock  # this thread's CPU seconds (a test hands in its own)
        self._inside = threading.local()

    def count(self, kind: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, its CPU time added to ``kind`` unless this thread is already counting."""
        if getattr(self._inside, "on", False):
            return fn(*args)
        self._inside.on = True
        t0 = self._clock()
        try:
            return fn(*args)
        finally:
            self.seconds[kind] += self._clock() - t0
            self._inside.on = False

    def reset(self) -> None:
        """Start counting afresh."""
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.passes = 0

    def per_pass(self) -> dict[str, float]:
        """Seconds of each kind per backward pass so far (zeros before the first)."""
        return {k: s / self.passes if self.passes else 0.0 for k, s in self.seconds.items()}
