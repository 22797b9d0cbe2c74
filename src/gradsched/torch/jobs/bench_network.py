"""Step 2 of the bench's job (:mod:`gradsched.torch.jobs.bench_worker`): the network table.

All-reduce timed on the live group from 4 KiB up to twice the model's gradient size (rounded up to a power of
two; larger sizes extended on the line through the largest measured ones), and reduce-scatter and all-gather
where a row runs them (:func:`network_collectives`), those also beyond the table's top
(:func:`_time_two_phase`) and in queues (:func:`_measure_queued`); fitted to a Cluster on rank 0 and broadcast
(:func:`_broadcast`, rank 0's object on every rank, which the other steps use too).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Callable

import torch.distributed as dist

from gradsched.jobs.config import BenchConfig
from gradsched.cluster import Cluster
from gradsched.net_extend import (MAX_RUN, MEASURED_MAX_BYTES, extended_costs, measured_top,
                                  operations_for, table_floor, table_run)
from gradsched.profile import Profile
from gradsched.torch.jobs.shared_model import trim_heap
from gradsched.torch.measure.probe import slowest


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _measured_top(sizes: list[int], reps: int) -> tuple[int, int]:
    """The largest size the table times (:func:`measured_top`, at least the first bandwidth-bound one:
    :func:`table_floor`) and the most operations a repetition times back to back (:func:`table_run`), from one
    all-reduce of 4 KiB and one of 1 MiB (the slowest rank's, so that every rank times the same sizes)."""
    from gradsched.torch.measure.netbench import measure_points

    small_s, mib_s = slowest([t for _, t in measure_points("allreduce", [4096, 1 << 20], reps=1, warmup=0)])
    run = table_run(small_s)
    top = measured_top(sizes, lambda b: operations_for(b, reps + 1, run) * max(small_s, mib_s * b / (1 << 20)),
                       floor_bytes=table_floor(small_s, mib_s))
    return top, run


def _measure_cluster(profile: Profile, cfg: BenchConfig) -> Cluster:
    from gradsched.netbench_args import sizes_bytes
    from gradsched.torch.measure.netbench import benchmark

    # One size beyond the gradients' (rounded up to a power of two): the table is read through its
    # lower monotone envelope, which bounds a size only by larger ones, and the all-reduce of all
    # gradients sits near the top (cnn: its time came out 3.9 ms in one job, 1.0 ms in the next).
    # Sizes above MEASURED_MAX_BYTES, or above what fits the table's budget on slow (dilated) links,
    # are bandwidth-bound: on the line through the largest measured ones (gradsched.net_extend).
    top = 2 << max(12, math.ceil(math.log2(max(profile.total_bytes, 4096))))
    measured_max, run = _measured_top(sizes_bytes(4096, min(top, MEASURED_MAX_BYTES)), cfg.net_reps)
    names = network_collectives(cfg)
    clock = _PartClock()
    cluster = benchmark(min_bytes=4096, max_bytes=measured_max, reps=cfg.net_reps, warmup=1, collectives=names,
                        max_run=run, report=clock.report)
    if cluster is not None and run < MAX_RUN:  # the samples between the rounds time as the table did
        cluster = dataclasses.replace(cluster, extra={**cluster.extra, "table_max_run": run})
    beyond = _time_two_phase(cluster, measured_max, profile, cfg)
    clock.part("beyond the table")
    if cluster is not None and (top > measured_max or beyond):  # every timed collective, on its own line
        points = {**cluster.extra["measured_points"]}
        for name, more in beyond.items():
            points[name] = [*points[name], *([float(b), t] for b, t in more)]
        extended = extended_costs(points, names if top > measured_max else list(beyond), max(top, measured_max))
        extra = {**cluster.extra, "measured_points": points}
        if top > measured_max:
            extra["extended_beyond_bytes"] = measured_max
        if beyond:
            extra["two_phase_beyond_bytes"] = [int(b) for b, _ in next(iter(beyond.values()))]
        cluster = dataclasses.replace(cluster, collectives={**cluster.collectives, **extended}, extra=extra)
    queued = _measure_queued(cluster, cfg)
    clock.part("queue")
    clock.show()
    if cluster is not None and queued:
        cluster = dataclasses.replace(cluster, extra={**cluster.extra, **queued})
    trim_heap()  # the large sizes' buffers (up to 4 x 36 MiB a rank), freed below glibc's mmap threshold: else
    # they stay resident and the later phases grow on top (googlenet-k80, 4 hosts: 0.66 -> 0.93 GB a rank)
    return _broadcast(cluster)


class _PartClock:
    """Rank 0's seconds of each part of the network table (each collective's sizes, the phases beyond the table, the
    queue), printed after it: the phase record has their sum only (docs/notes/2026-12-dear13.md)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._t = time.perf_counter()

    def part(self, name: str) -> None:
        """The part ``name`` (or more of it) ends now."""
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._t
        self._t = now

    def report(self, line: str) -> None:
        """``benchmark``'s report of one size (rank 0's): the collective named first gets the time since."""
        self.part(line.split()[0])

    def show(self) -> None:
        if dist.get_rank() == 0:
            print("[bench] network table's parts: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.parts.items()),
                  file=sys.stderr, flush=True)


def _two_phase_rates(cluster: Cluster | None, names: list[str]) -> dict[str, tuple[int, float]] | None:
    """Each two-phase collective's largest measured size a rank and its seconds per byte there (rank 0's
    table; None on the other ranks)."""
    if cluster is None:
        return None
    points = cluster.extra["measured_points"]
    return {n: (int(points[n][-1][0]), float(points[n][-1][1]) / float(points[n][-1][0])) for n in names}


def _time_two_phase(cluster: Cluster | None, measured_max: int, profile: Profile,
                    cfg: BenchConfig) -> dict[str, list[tuple[float, float]]]:
    """Where the table times reduce-scatters and all-gathers: those two also at the sizes a rank beyond the
    table's top up to the model's largest group, or short of the groups the runtime sends as rings
    (:func:`beyond_sizes`), as the table times them; ``{name: [(bytes a rank, s), ...]}``.  Every rank calls it."""
    from gradsched.planners.dear import largest_group_bytes
    from gradsched.torch.measure.netbench import measure_points, operations_for

    names = [n for n in network_collectives(cfg) if n != "allreduce"]
    if not names:
        return {}
    world = dist.get_world_size()
    rates = _two_phase_rates(cluster, names)
    sizes = None
    if rates is not None and cluster is not None:
        sizes = beyond_sizes(min(b for b, _ in rates.values()), largest_group_bytes(profile), world,
                             cluster.backend == "nccl", lambda b: operations_for(b * world, cfg.net_reps + 1)
                             * sum(rate * b for _, rate in rates.values()))
    sizes = _broadcast(sizes)
    return {n: measure_points(n, sizes, reps=cfg.net_reps, warmup=1) for n in names} if sizes else {}


def beyond_sizes(top: int, group_bytes: int, world: int, nccl: bool, seconds_of: Callable[[int], float]) -> list[int]:
    """The sizes a rank (ascending) above the phases' table's ``top`` at which :func:`_time_two_phase` times them:
    :func:`~gradsched.net_extend.two_phase_sizes` up to the part of the model's largest group (``group_bytes``), within
    :data:`~gradsched.net_extend.TWO_PHASE_BUDGET_S` (``seconds_of`` a size, both phases), except that of the sizes
    whose groups the runtime sends as rings (:func:`~gradsched.costs.runs_ring`: gloo beyond two ranks, from 4 MiB a
    group) only the smallest is timed, the line beyond it going on at its rate (a ring's seconds a byte are flat:
    at 8 hosts 30-31 ns a group byte at 4 and 16 MiB).  At 8 hosts the larger ones (up to 2 MiB a rank) took up to
    7.4 s of a ``dear`` row's start-up, and its plan re-predicts without them as with them (-3.8% against -3.9%;
    ``benchmarks/dear_no_beyond.py``, docs/notes/2026-12-dear13.md).  Timing no ring at all (the ring then priced
    over the all-reduce) changed the plan and took its error from -3.9% to -7.5% in one run."""
    from gradsched.costs import ring_min_bytes, runs_ring
    from gradsched.net_extend import two_phase_sizes

    sizes = two_phase_sizes(top, -(-group_bytes // world), seconds_of)
    kept = [b for b in sizes if not runs_ring(world, b * world, nccl)]
    if len(kept) == len(sizes):
        return sizes
    least = 1 << max(0, math.ceil(math.log2(max(1, -(-ring_min_bytes() // world)))))  # a rank's part of the least ring
    return sorted({*kept, least} if least > top else set(kept))


def _measure_queued(cluster: Cluster | None, cfg: BenchConfig) -> dict[str, Any]:
    """Where the table times reduce-scatters and all-gathers: each also in a queue of :data:`QUEUE_DEPTH` issued
    together beside one at a time (:func:`~gradsched.torch.measure.netbench.measure_queued`), at the groups'
    sizes within the table's range (:func:`~gradsched.net_extend.queue_sizes`); the cluster's ``queued_points``
    and fitted ``queued`` rule, which the simulator prices queued two-phase operations by (docs/cost-model.md,
    "Queued streams").  Not at a size whose groups the runtime sends as rings (:func:`~gradsched.costs.runs_ring`):
    its rings of a group run one after another on one thread (:func:`gradsched.torch.runtime.ring.submit`), so
    a queue of them is the same operations one at a time; timing it at 8 hosts (1 MiB a rank, 8 MiB groups) took
    about 14 s of a ``dear`` row's start-up (docs/notes/2026-12-dear13.md).  Every rank calls it (``cluster``:
    rank 0's, None elsewhere)."""
    from gradsched.queued import fit_queued
    from gradsched.torch.measure.netbench import measure_queued

    names = [n for n in network_collectives(cfg) if n != "allreduce"]
    if not names:
        return {}
    rates = _two_phase_rates(cluster, names)
    sizes = None
    if rates is not None and cluster is not None:
        sizes = phase_queue_sizes(rates, dist.get_world_size(), cluster.backend == "nccl", cfg.net_reps)
    sizes = _broadcast(sizes)
    if not sizes:  # the table stops under the queue's sizes, or its groups there go as rings: no rule, one at a time
        return {}
    points = {n: measure_queued(n, sizes, (QUEUE_DEPTH,), reps=cfg.net_reps, warmup=1) for n in names}
    rules = {n: r.to_dict() for n, q in points.items() if (r := fit_queued(q)) is not None}
    return {"queued_points": points, "queued": rules}


QUEUE_DEPTH = 4


def phase_queue_sizes(rates: dict[str, tuple[int, float]], world: int, nccl: bool, reps: int) -> list[int]:
    """The sizes a rank :func:`_measure_queued` times the queue at: :func:`~gradsched.net_extend.queue_sizes` within
    the phases' table (``rates``: :func:`_two_phase_rates`, each repetition QUEUE_DEPTH operations one at a time and
    as many queued, after a warm-up), less those whose groups go as rings (:func:`~gradsched.costs.runs_ring`)."""
    from gradsched.costs import runs_ring
    from gradsched.net_extend import queue_sizes

    per_size = QUEUE_DEPTH * (2 * reps + 1)
    sizes = queue_sizes(min(b for b, _ in rates.values()), lambda b: per_size * sum(r * b for _, r in rates.values()))
    return [b for b in sizes if not runs_ring(world, b * world, nccl)]


def network_collectives(cfg: BenchConfig) -> list[str]:
    """What the network table times: the all-reduce, and where a row runs reduce-scatters and all-gathers
    (``dear``, ``fsdp2``) those too, as the runtime runs them.  Elsewhere the cluster derives them from the
    all-reduce at a ratio over half of it each (:meth:`~gradsched.cluster.Cluster.derived_phase_ratio`).  Not for
    ``auto`` alone, though it may try ``dear`` at run time (which measures what it tries): timing both phases
    (table, the sizes beyond its top, the queues) and the probe's phases took VGG-16's start-up on 8 hosts from
    58 to 150 s (``emulate_papers_vgg16_8h_ring10.json``), past issue 35's two minutes."""
    two_phase = any(e.fsdp2 or (not e.torch_ddp and e.strategy == "dear") for e in cfg.entries)
    return ["allreduce", "reducescatter", "allgather"] if two_phase else ["allreduce"]
