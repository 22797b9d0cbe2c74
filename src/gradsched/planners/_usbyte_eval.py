"""``usbyte``'s rule plans priced by the simulator's compiled pass, without making their plans.

A merged ``usbyte`` candidate (``merge_bytes`` above 0) simulates the plan of each of its
rules to choose one; ``auto`` tries three merges, so twelve plans of thousands of blocks
were made as :class:`~gradsched.plan.Operation` objects and set up by the simulator one
operation at a time, to keep one per merge.  Here a rule's blocks (each block's unit,
first and end element) become the arrays the compiled pass (:mod:`gradsched.sim._kernel`)
reads, with numpy: the same operations in the same order as
:func:`gradsched.planners.usbyte.build_plan` makes (each block one operation, its unit's
rank as priority, each the collective ``collectives_for`` gives its bytes), the same bytes,
costs, completing layers and tensors, so the iteration is the one ``simulate`` predicts for
that plan, bit for bit (tests/test_usbyte_eval.py).  Where the compiled pass does not apply
(numba absent or off, contention that dilates, the runtime's retire time, a cost that is
not a :class:`~gradsched.cluster.CollectiveCost`, a tensor without elements, fewer
operations than the simulator compiles for), :meth:`BlockPricer.iteration_s` returns None
and ``usbyte`` builds and simulates the plan."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.planners import _collective as coll
from gradsched.profile import Profile


class BlockPricer:
    """Prices block schedules of one profile's units on one cluster (one channel): see the module docstring."""

    def __init__(self, profile: Profile, cluster: Cluster, ptr: np.ndarray, tensors: np.ndarray,
                 hierarchical: str) -> None:
        """``ptr``/``tensors``: unit u's tensors are ``tensors[ptr[u]:ptr[u + 1]]``, back to back in that order."""
        from gradsched.sim import _kernel, engine  # the simulator imports planners' types only

        self.profile, self.cluster, self.hierarchical = profile, cluster, hierarchical
        self.run: Callable | None = None
        kc, kn, lat, self.op_latency_s = engine.contention(cluster)
        issue_s, retire_s = profile.op_host_s()
        numel = np.array([t.numel for t in profile.tensors], dtype=np.int64)
        if kc > 0 or kn > 0 or lat > 0 or retire_s > 0 or not _kernel.enabled() or not len(numel) or \
                numel.min() <= 0:
            return
        self.costs = {name: cluster.operation_cost(name) for name in coll.dense_collectives(cluster, hierarchical)}
        if any(not isinstance(c, CollectiveCost) for c in self.costs.values()):
            return
        self.run, self.min_ops, self.issue_s = _kernel.kernel(), _kernel.MIN_OPERATIONS, issue_s
        self.fixed = fixed = engine.profile_arrays(profile)
        self.elem = np.array(fixed.element_bytes, dtype=np.int64)
        self.ready_layer = np.array(fixed.ready_layer, dtype=np.int64)
        self.ptr, self.tensors = ptr, tensors
        ordered = numel[tensors]  # the units' tensors back to back: element offsets over all units
        self.end = np.cumsum(ordered)
        self.begin = self.end - ordered
        self.base = np.concatenate([[0], self.end])[ptr[:-1]]  # each unit's first element's offset

    def iteration_s(self, unit: np.ndarray, lo: np.ndarray, hi: np.ndarray, rank: np.ndarray) -> float | None:
        """The simulated iteration (one channel, no timeline) of the plan of these blocks (elements
        ``[lo, hi)`` of ``unit``, in order) with ``rank`` as its units' priorities; None where the
        compiled pass does not apply."""
        # long function: the plan's arrays built one after another, each a line or two
        n = len(unit)
        if self.run is None or n + self.fixed.layer_time.shape[0] < self.min_ops:  # as simulate chooses
            return None
        a, b = self.base[unit] + lo, self.base[unit] + hi  # each block's elements, as offsets
        first = np.searchsorted(self.end, a, side="right")  # its first slice's place in self.tensors
        last = np.searchsorted(self.begin, b, side="left") - 1
        sizes = last - first + 1  # slices per block
        o_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=o_ptr[1:])
        places = np.repeat(first - o_ptr[:-1], sizes) + np.arange(int(o_ptr[-1]), dtype=np.int64)
        o_tensors = self.tensors[places]
        starts = o_ptr[:-1]
        nbytes = np.add.reduceat((np.minimum(np.repeat(b, sizes), self.end[places]) -
                                  np.maximum(np.repeat(a, sizes), self.begin[places])) * self.elem[o_tensors], starts)
        completing = np.maximum.reduceat(self.ready_layer[o_tensors], starts)
        cost = np.empty(n)
        kinds = np.array(coll.collectives_for(nbytes.tolist(), self.cluster, self.hierarchical))
        for name, c in self.costs.items():  # as the simulator costs each collective's operations
            mine = kinds == name
            if mine.any():
                cost[mine] = _times(c, nbytes[mine])
        layers = self.fixed.layer_time.shape[0]
        comp_ops = np.argsort(completing, kind="mergesort")
        comp_ptr = np.zeros(layers + 1, dtype=np.int64)
        np.cumsum(np.bincount(completing, minlength=layers), out=comp_ptr[1:])
        forward = self.fixed.forward_s.shape[0]
        ready, start, end = np.zeros(n), np.zeros(n), np.zeros(n)
        fixed, profile = self.fixed, self.profile
        _, _, iteration = self.run(
            fixed.layer_time, comp_ptr, comp_ops, np.zeros(n), self.issue_s, cost, nbytes,
            np.ascontiguousarray(rank[unit], dtype=np.int64), np.full(n, -1, dtype=np.int64), False, -1, 1,
            self.op_latency_s, profile.other_s, True, profile.update_s, profile.op_update_call_s(), fixed.forward_s,
            fixed.update_s,
            fixed.f_ptr, fixed.f_tensors, np.zeros(forward + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
            o_ptr, o_tensors, profile.num_tensors, ready, start, end, np.zeros(layers))
        return float(iteration)


def _times(cost: CollectiveCost, nbytes: np.ndarray) -> np.ndarray:
    """``cost.time_s`` of each size, as the simulator computes it: a plain line in numpy where it has more than
    8 operations of the collective, else one size at a time (the same arithmetic either way)."""
    if cost.points is None and type(cost) is CollectiveCost and len(nbytes) > 8:
        return cost.times_s(nbytes)
    return np.array([cost.time_s(int(x)) for x in nbytes.tolist()], dtype=float)
