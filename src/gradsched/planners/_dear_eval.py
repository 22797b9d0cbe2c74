"""``dear``'s candidate groupings priced by the simulator's compiled pass, without making their plans.

``dear`` (grouping ``planned``) simulates a dozen groupings, each in fifo and priority
order.  Made as plans, each costs thousands of :class:`~gradsched.plan.Operation` objects
and the simulator's per-operation set-up; here a grouping's parts become the arrays the
compiled pass (:mod:`gradsched.sim._kernel`) reads, with numpy, from arrays made once per
profile.  The arrays are exactly the ones ``simulate`` builds from the plan
:func:`gradsched.planners.dear.two_phase_ops` makes (the same operations in the same order,
the same bytes, costs, ready layers, gates and priorities), so the iteration is the one
``simulate`` predicts for that plan, bit for bit (tests/test_dear_eval.py).  Where the
compiled pass does not apply (numba absent or off, contention that dilates, the runtime's
retire time, a cluster with a queued rule (the simulator's queued-stream pass),
a cost that is not a plain line or table, fewer than :data:`MIN_TENSORS`
tensors), :meth:`TwoPhasePricer.iteration_s` returns None and ``dear`` simulates the plan.
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER
from gradsched.profile import Profile


MIN_TENSORS = 32  # fewer: simulating the plans takes milliseconds, less than loading the compiled pass


class TwoPhasePricer:
    """Prices groupings of one profile on one cluster (one channel): see the module docstring."""

    def __init__(self, profile: Profile, cluster: Cluster) -> None:
        from gradsched.sim import _kernel, engine  # the simulator imports planners' types only

        self.profile = profile
        self.run: Callable | None = None
        kc, kn, lat, self.op_latency_s = engine.contention(cluster)
        issue_s, retire_s = profile.op_host_s()
        costs = (cluster.operation_cost(REDUCE_SCATTER), cluster.operation_cost(ALL_GATHER))
        queued = any(r is not None and r.speedup > 1 for r in map(cluster.queued_rule, (REDUCE_SCATTER, ALL_GATHER)))
        c = cluster.contention  # a two-phase collective's own slowdown (Contention.comm_slowdown_of) dilates too
        kn = max([kn, *(c.comm_slowdown_of(x) for x in (REDUCE_SCATTER, ALL_GATHER))]) if c is not None else kn
        if queued or kc > 0 or kn > 0 or lat > 0 or retire_s > 0 or profile.num_tensors < MIN_TENSORS or \
                not _kernel.enabled() or any(not isinstance(c, CollectiveCost) for c in costs):
            return
        self.run = _kernel.kernel()
        self.costs, self.issue_s = costs, issue_s
        self.fixed = engine.profile_arrays(profile)
        layers, layer_of = profile.layer_table, profile.layer_of
        forward_pos = {layer_of[ts[0]]: k for k, ts in enumerate(layers.forward)}
        tensors = profile.tensors
        self.nbytes = np.array([t.numel * t.element_bytes for t in tensors], dtype=np.int64)
        self.ready_layer = np.array([layers.position[lid] for lid in layer_of], dtype=np.int64)
        self.forward_layer = np.array([forward_pos[lid] for lid in layer_of], dtype=np.int64)

    def _times(self, cost: CollectiveCost, nbytes: np.ndarray) -> np.ndarray:
        """``cost.time_s`` of each size, as the simulator computes it (a line's arithmetic is the same
        in numpy; a table's is computed one size at a time, as ``time_s`` does)."""
        if cost.points is None and type(cost) is CollectiveCost:
            return np.where(nbytes <= 0, 0.0, cost.alpha_s + cost.beta_s_per_byte * nbytes.astype(float))
        return np.array([cost.time_s(int(b)) for b in nbytes.tolist()], dtype=float)

    def iteration_s(self, parts: list[list[int]], prioritized: bool) -> float | None:
        """The simulated iteration of ``two_phase_ops`` of ``parts`` (:func:`~gradsched.planners.dear.ready_parts`:
        sorted, in ready order), in fifo order or :func:`~gradsched.planners.dear.prioritized`; None where the
        compiled pass does not apply."""
        # long function: the plan's arrays built one after another, each a line or two
        if self.run is None or not parts:
            return None
        m = len(parts)
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64, count=int(sizes.sum()))
        starts = np.zeros(m, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        nb = np.add.reduceat(self.nbytes[flat], starts)
        last = np.maximum.reduceat(self.ready_layer[flat], starts)  # the layer completing each reduce-scatter
        first_tensor = np.minimum.reduceat(flat, starts)  # parts are sorted: their first tensors
        by_forward = np.argsort(first_tensor, kind="mergesort")  # the all-gathers' order
        n = 2 * m
        cost = np.concatenate([self._times(self.costs[0], nb), self._times(self.costs[1], nb[by_forward])])
        nbytes = np.concatenate([nb, nb[by_forward]])
        after = np.concatenate([np.full(m, -1, dtype=np.int64), by_forward])
        if prioritized:  # each group's place in forward order, both phases
            place = np.empty(m, dtype=np.int64)
            place[by_forward] = np.arange(m, dtype=np.int64)
            priority = np.concatenate([place, np.arange(m, dtype=np.int64)])
        else:
            priority = np.arange(n, dtype=np.int64)
        layers = self.fixed.layer_time.shape[0]
        comp_ops = np.argsort(last, kind="mergesort")
        comp_ptr = np.zeros(layers + 1, dtype=np.int64)
        np.cumsum(np.bincount(last, minlength=layers), out=comp_ptr[1:])
        gate_layer = self.forward_layer[first_tensor[by_forward]]  # all-gather m + k gates this forward layer
        g_ops = m + np.argsort(gate_layer, kind="mergesort")
        g_ptr = np.zeros(self.fixed.forward_s.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(gate_layer, minlength=self.fixed.forward_s.shape[0]), out=g_ptr[1:])
        o_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.concatenate([sizes, sizes[by_forward]]), out=o_ptr[1:])
        o_tensors = np.concatenate([flat] + [flat[starts[p]:starts[p] + sizes[p]] for p in by_forward.tolist()])
        ready, start, end = np.zeros(n), np.zeros(n), np.zeros(n)
        fixed = self.fixed
        _, _, iteration = self.run(
            fixed.layer_time, comp_ptr, comp_ops, np.zeros(n), self.issue_s, cost, nbytes, priority, after,
            not prioritized, -1, 1, self.op_latency_s, self.profile.other_s, True, self.profile.update_s,
            self.profile.op_update_call_s(), fixed.forward_s, fixed.update_s, fixed.f_ptr, fixed.f_tensors, g_ptr,
            g_ops, o_ptr, o_tensors, self.profile.num_tensors, ready, start, end, np.zeros(layers))
        return float(iteration)
