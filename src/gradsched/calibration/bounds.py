"""How fast any schedule could run: the lower bound and the bound under contention (``gradsched bench``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.costs import cheaper
from gradsched.planners._collective import planning_cost, two_phase_cost
from gradsched.profile import Profile
from gradsched.plan import TWO_PHASE

FEW_STEPS = 10  # a compute-only median over fewer counted steps than this is called noise


def lower_bound_s(profile: Profile, cluster: Cluster) -> dict[str, Any]:  # seconds, and "overlap": what may overlap
    """The shortest iteration any schedule could reach under the measured profile and cluster.

    Which overlap it assumes (``"overlap"`` in the result): communication may hide behind both the
    backward pass and the next forward (a layer's forward waits only for its own gradients), the
    most any plan gradsched runs can overlap.

    Two bounds, the larger wins.  Compute: the compute stream cannot finish faster than
    all its compute, and no layer's forward starts before its gradients are reduced, so
    each layer adds its all-reduce between its gradients' ready time and its update and
    forward (and those of the layers after it); for the layer that is both ready last
    and first in forward that is all its compute plus the all-reduce of its gradients,
    less what only a plan that overlaps the next forward could hide behind it (the
    optimizer step and the other per-step work).  Network: the network cannot move all
    gradients faster than one all-reduce of all of them, which cannot start before the
    first gradient is ready.  An all-reduce costs the cheapest the cluster offers: on a
    two-level cluster, the plain or the hierarchical one, and on any cluster the decoupled
    one (a reduce-scatter and an all-gather, DeAR's), whichever is cheaper at each size (a
    plan may run any); and bytes cost no less than the cheapest split of them
    into operations allows (:func:`least_time_s`).  ``contention_bound_s`` is the same bound when overlap is
    not free: with the cluster's contention figures, compute and communication slow
    each other wherever they overlap (:func:`contention_bound_s`)."""
    from gradsched.sim.engine import contention

    # what a planner may pay per group: the cheaper of plain, hierarchical and decoupled (reduce-scatter
    # during backward + all-gather before the next forward) at every size
    cost = cheaper(planning_cost(cluster), two_phase_cost(cluster))
    ready = profile.ready_s
    layers: dict[int, list[float]] = {}  # forward order: layer -> [bytes, ready, forward, update]
    for t, lid, r in zip(profile.tensors, profile.layer_of, ready):
        row = layers.setdefault(lid, [0.0, r, 0.0, 0.0])
        row[0] += t.bytes
        row[2] += t.forward_s
        row[3] += t.update_s
    last = max(ready)
    compute_bound, alone_after = profile.compute_s, 0.0
    kc, kn, _, _ = contention(cluster)
    if cluster.contention is not None:  # the least any operation is slowed: a two-phase one may have its own
        kn = min([kn, *(cluster.contention.comm_slowdown_of(x) for x in TWO_PHASE)])
    before = 0.0  # forward and update of the layers before this one
    rest = profile.forward_s + profile.update_s  # ... of this one and those after it
    for nbytes, r, fwd, upd in layers.values():
        reduce_s = least_time_s(cost, nbytes, profile.total_bytes)
        compute_bound = max(compute_bound, r + reduce_s + rest)
        if r >= last:  # compute can hide only this much of its all-reduce; overlapped, compute runs slower
            alone_after = max(alone_after, reduce_s - (profile.other_s + before) * (1 + kc) / (1 + kn))
        before += fwd + upd
        rest -= fwd + upd
    first_ready = min(ready)
    comm_all = least_time_s(cost, profile.total_bytes)
    network_bound = first_ready + comm_all
    bound = max(compute_bound, network_bound)
    return {"lower_bound_s": bound, "compute_s": profile.compute_s, "overlap": "backward+forward",
            "allreduce_all_s": comm_all, "compute_bound_s": compute_bound, "network_bound_s": network_bound,
            "contention_bound_s": max(bound, contention_bound_s(profile.compute_s, comm_all, first_ready,
                                                                 alone_after, kc, kn))}


def least_time_s(cost: CollectiveCost, nbytes: float, largest: float | None = None) -> float:
    """The least time any set of operations that carries ``nbytes`` costs, each operation at
    most ``largest`` bytes (default ``nbytes``).

    An operation that carries ``b`` of the bytes costs no less than the cheapest operation of
    ``b`` to ``largest`` bytes: a measured table need not rise with size (the line beyond a
    table can start below its last point; the bundled OSU tables dip), so bytes may ride more
    cheaply in a larger operation.  And a table need not be subadditive (on 2 hosts x 2 ranks
    a usbyte plan of 4 MiB blocks ran in 0.98x the bound that priced all gradients as one
    operation), so the bytes cost ``nbytes`` times the least of that cost per byte."""
    if nbytes <= 0:
        return 0.0
    largest = max(float(nbytes), float(largest or 0.0))
    breaks = {x for c in _costs(cost) if c.points is not None for x, _ in c.points}
    # integer byte counts: just past a table's end is one byte past it
    breaks = {y for x in breaks for y in (float(x), float(x) + 1.0) if y <= largest}
    sizes = np.array(sorted(breaks | {float(nbytes), largest}
                            | set(np.geomspace(min(4096.0, nbytes), nbytes, 64).tolist())
                            | set(np.geomspace(1.0, largest, 256).tolist())))
    cheapest_from = np.minimum.accumulate(cost.times_s(sizes)[::-1])[::-1]  # least cost of >= each size
    carried = sizes <= nbytes
    return float(nbytes * np.min(cheapest_from[carried] / sizes[carried]))


def _costs(cost: CollectiveCost) -> list[CollectiveCost]:
    """``cost`` and the costs it takes the cheaper of (:class:`gradsched.costs.CheaperOf`)."""
    parts = [getattr(cost, "first", None), getattr(cost, "second", None)]
    return [cost] + [c for p in parts if p is not None for c in _costs(p)]


def contention_bound_s(compute_s: float, comm_s: float, compute_alone_s: float, comm_alone_s: float,
                       compute_slowdown: float, comm_slowdown: float) -> float:
    """The shortest iteration when overlapped compute and communication slow each other.

    ``compute_s`` of compute and ``comm_s`` of communication (each at full speed), of
    which at least ``compute_alone_s`` and ``comm_alone_s`` cannot overlap.  For ``x``
    seconds of overlap, compute runs ``1 + compute_slowdown`` times slower and
    communication ``1 + comm_slowdown`` times slower (the simulator's fluid model), so
    the iteration is ``compute_s + comm_s - x * gain`` with ``gain = 1/(1 + kc) +
    1/(1 + kn) - 1``: overlap pays only while ``gain > 0``, and most when ``x`` is as
    long as either side's overlappable work allows.  Without contention it is never
    above :func:`lower_bound_s`'s bound, which takes the larger of the two."""
    fc, fn = 1.0 + compute_slowdown, 1.0 + comm_slowdown
    gain = 1.0 / fc + 1.0 / fn - 1.0
    if gain <= 0:
        return compute_s + comm_s
    overlap = max(0.0, min((compute_s - compute_alone_s) * fc, (comm_s - comm_alone_s) * fn))
    return compute_s + comm_s - gain * overlap


def below_bound(row: dict[str, Any], bound: dict[str, float], compute_only: dict[str, Any] | None = None,
                *, sparse: bool = False) -> dict[str, str] | None:
    """Which assumption of :func:`lower_bound_s` a measured ``gradsched bench`` row broke, when its
    median ran below the bound (None when it did not).

    The bound holds for the profile and cluster it is given, not for the run: its compute is the
    compute-only reference's median step (``compute_only``, timed in the same rounds), its bytes
    cost what the network probe measured, and every gradient is all-reduced dense.  A row below
    it ran faster than one of these (issue 39: ``mlp`` on the testbed, 0.73x), and says which:
    ``assumption`` is the first of ``sparse`` (a top-k row moves a share of the bytes), ``compute``
    (the row's median is below all the compute), ``network`` (below one all-reduce of all
    gradients at the probe's price, after the first gradient is ready) and ``compute or last
    all-reduce`` (below the compute plus the all-reduce that must follow the last gradient) that
    the row broke; ``reason`` says each it broke in words, with the figures."""
    median = row["iteration_s_median"]
    if median >= bound["lower_bound_s"]:
        return None
    ratio = f"{median / bound['lower_bound_s']:.2f}x the bound"
    if sparse:
        return {"assumption": "sparse", "reason": f"{ratio}: a top-k row moves a share of the gradients, and the "
                                                  "bound prices them all, dense"}
    counted = (compute_only or {}).get("step_s", [])[row.get("warmup_rounds", 0):]
    steps = [s for rnd in counted for s in rnd]
    broken = [(name, why) for name, limit, why in (
        ("compute", bound["compute_s"], _compute_reason(bound, steps)),
        ("network", bound["network_bound_s"], _network_reason(bound)),
        ("compute or last all-reduce", bound["compute_bound_s"], _compute_reason(bound, steps) + ", or the last "
         "gradients' all-reduce beat the probe's price")) if median < limit]
    if broken[0][0] == "compute":
        broken = broken[:1]  # the last entry repeats it
    advice = _more_steps(steps) if any(name.startswith("compute") for name, _ in broken) else ""
    return {"assumption": broken[0][0], "reason": f"{ratio}: " + "; ".join(why for _, why in broken) + advice}


def _compute_reason(bound: dict[str, float], steps: list[float]) -> str:
    spread = f"; its {len(steps)} steps ranged {min(steps) * 1e3:.2f}-{max(steps) * 1e3:.2f} ms" if steps else ""
    return (f"its steps computed faster than the compute-only reference's median ({bound['compute_s'] * 1e3:.2f} ms"
            f"{spread}) that the bound assumes every step needs")


def _network_reason(bound: dict[str, float]) -> str:
    return (f"it moved all gradients faster than one all-reduce of them costs at the network probe's price "
            f"({bound['allreduce_all_s'] * 1e3:.2f} ms): the probe times all-reduces back to back, and after a pause "
            f"a link (a shaped one: its token bucket) can pass a burst faster")


def _more_steps(steps: list[float]) -> str:
    """Advice when the reference's median rests on few steps."""
    return "; a median of so few steps is noise: count more (--rounds, --steps)" if len(steps) < FEW_STEPS else ""
