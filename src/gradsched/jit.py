"""Compile gradsched's numba kernels before they are needed: ``python -m gradsched.jit``.

With numba installed (``gradsched[fast]``), US-Byte's priority search, the simulator's pass
(which also prices ``dear``'s groupings) and ``optimal``'s recurrence run compiled on large
inputs.  numba compiles each kernel on its first use, about 20 s of CPU each, and caches the
result beside the module, so later processes load it in about a second.  A job that starts
many processes at once (a test run on several workers, ranks that each plan) would otherwise
compile in each of them; warming once first makes them all load the cache.  Without numba,
or with ``GRADSCHED_JIT=0``, there is nothing to compile and this does nothing.
"""

from __future__ import annotations

import time

from gradsched.planners import make_plan
from gradsched.sim import simulate
from gradsched.synthetic import random_case

# planners whose large plans run a kernel: usbyte's search, dear's and the simulator's pass, optimal's recurrence
WARMED = ("usbyte", "dear", "optimal", "bytescheduler")
WARM_TENSORS = 160  # above every kernel's threshold (64 layers or operations)


def warm() -> float:
    """Plan and simulate one random case with every kernel's planner; the seconds it took."""
    t0 = time.perf_counter()
    case = random_case(1, WARM_TENSORS)
    profile, cluster = case.profile(), case.cluster()
    for name in WARMED:
        simulate(make_plan(name, profile, cluster), profile, cluster, timeline=False)
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"gradsched.jit: kernels ready in {warm():.1f} s")
