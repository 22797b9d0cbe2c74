"""Network benchmark: measure collectives on the live process group, fit a Cluster.

Planners are only as good as the cost model they are given (MG-WFBP's users found it
slower than plain WFBP with hard-coded constants), so the model is measured on the
user's own network: run under ``torchrun`` on the machines that will train::

    torchrun --nnodes 2 --nproc-per-node 1 ... -m gradsched.torch.measure.netbench -o cluster.json
    gradsched netbench --nproc 2 -o cluster.json     # one machine: local ranks on loopback

For every size from 4 KiB to 256 MiB by powers of two (``--max-bytes`` cuts it short)
each collective is run ``warmup`` times, then timed ``reps`` times, each rep started
together behind a barrier, one untimed operation, then a run of back-to-back operations
(at least 8 MiB in all, at most 64) ended with the device synchronised: a rep's time is
the run's mean, what an operation costs in a stream of them (:func:`_time_collective`).  A size's time is
the median over reps, then the maximum over ranks (a collective is done when its
slowest rank is).  Rank 0 fits a line (:func:`~gradsched.costs.fit_measured`) to each collective's points
read through their lower monotone envelope (a size measured slower than a larger one was
delayed by scheduling noise: docs/cost-model.md), keeps that table (it wins over the
line inside its range) and the medians as measured (``measured_points``), and writes
``gradsched.cluster/1`` with ``world_size`` and ``backend``.

Two levels: with several nodes of several ranks (``--ranks-per-node``, else torchrun's
``LOCAL_WORLD_SIZE``; node ``i`` holds ranks ``[i*M, (i+1)*M)``) the all-reduce is also
timed inside each node and across nodes (one rank per node) and written as the
cluster's ``topology`` (:func:`measure_topology`; docs/profiling.md, "Two levels").

Sizes: an all-reduce of ``s`` bytes reduces an ``s``-byte buffer; an all-gather's
size is each rank's contribution, and its contributions stop at ``max_bytes /
world_size`` so that its output buffer is no larger than the all-reduce's.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from gradsched.cluster import COLLECTIVES, Cluster, Topology
from gradsched.costs import PER_RANK, fit_measured
from gradsched.queued import fit_queued
from gradsched.torch.runtime.decoupled import all_gather, reduce_scatter, scratch_for, start_all_gather, start_reduce_scatter
from gradsched.torch.runtime.groups import uses_nccl
from gradsched.costs import NODE_STEPS
from gradsched.errors import GradschedError
from gradsched.netbench_args import DEFAULT_OUTPUT
from gradsched.netbench_args import MAX_BYTES, MIN_BYTES, add_arguments, check_backend, check_sizes, sizes_bytes, top_bytes  # noqa: F401
from gradsched.netbench_args import parse_depths
from gradsched.net_extend import MAX_RUN, RUN_BYTES, operations_for, run_for  # noqa: F401 - their old home
_ELEMENT = torch.float32  # 4 bytes per element


def stream_time_s(once: Callable[[], None], run: int, sync: Callable[[], None] = lambda: None) -> float:
    """Mean seconds of ``run`` calls of ``once`` back to back, after one untimed lead call (so the
    timed ones follow another, as in training); ``sync`` waits for the device before each clock read."""
    once()
    sync()
    t0 = time.perf_counter()
    for _ in range(run):
        once()
    sync()
    return (time.perf_counter() - t0) / run


def benchmark(*, min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES, reps: int = 5, warmup: int = 2,
              collectives: Sequence[str] = COLLECTIVES, ranks_per_node: int | None = None,
              report: Callable[[str], None] | None = None, queue_depths: Sequence[int] = (),
              max_run: int = MAX_RUN) -> Cluster | None:
    """Measure ``collectives`` on the default process group; rank 0 returns the fitted Cluster.

    With several nodes of several ranks (``ranks_per_node``, else ``LOCAL_WORLD_SIZE``:
    :func:`node_layout`), the all-reduce is also measured inside each node and across
    nodes, and the cluster's ``topology`` field written (:func:`measure_topology`).
    ``queue_depths`` (e.g. ``(2, 4)``): each collective is also timed in queues of that many asynchronous
    operations from 1 MiB a rank up (:func:`measure_queued`), kept as ``queued_points`` with the rule fitted
    to them (``queued``: :func:`gradsched.queued.fit_queued`).  ``max_run``: at most this many operations timed
    back to back a repetition (:func:`run_for`; the bench's table where an operation takes milliseconds).
    Every rank must call this with the same arguments (it issues collectives)."""
    if not dist.is_initialized():
        raise GradschedError("no process group: call torch.distributed.init_process_group first (or use main())")
    if reps < 1 or warmup < 0:
        raise GradschedError(f"need reps >= 1 and warmup >= 0, got {reps} and {warmup}")
    world = dist.get_world_size()
    if world < 2:
        raise GradschedError("a network benchmark needs at least 2 ranks (torchrun --nproc-per-node 2 ...)")
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise GradschedError(f"unknown collective {unknown[0]!r}; known: {', '.join(COLLECTIVES)}")
    check_sizes(min_bytes, max_bytes, world, collectives)  # before anything is timed
    points: dict[str, list[tuple[float, float]]] = {}
    for name in collectives:
        top = top_bytes(name, min_bytes, max_bytes, world)
        points[name] = measure_points(name, sizes_bytes(min_bytes, top), reps=reps, warmup=warmup, report=report,
                                      max_run=max_run)
    queued = {}
    for name in collectives if queue_depths else ():
        top = top_bytes(name, min_bytes, max_bytes, world)
        sizes = [b for b in sizes_bytes(min_bytes, top) if b >= QUEUE_MIN_BYTES] or [top]
        queued[name] = measure_queued(name, sizes, queue_depths, reps=reps, warmup=warmup, report=report)
    nodes, per_node = node_layout(world, ranks_per_node)
    topology = None
    if nodes > 1 and per_node > 1:
        topology = measure_topology(nodes, per_node, sizes_bytes(min_bytes, max_bytes), reps=reps, warmup=warmup,
                                    report=report)
    if dist.get_rank() != 0:
        return None
    # Scheduling noise only adds time: the table is the measurements' lower monotone envelope
    # (docs/cost-model.md); the medians as measured are kept beside it.
    fitted = {name: fit_measured(name, pts) for name, pts in points.items()}
    two_level = None if topology is None else Topology.from_dict(topology, "gradsched netbench", world)
    extra: dict[str, Any] = {"measured_by": "gradsched netbench", "device": _device().type, "reps": reps,
                             "host": socket.gethostname(),
                             "measured_points": {k: [list(p) for p in v] for k, v in points.items()}}
    if queued:
        extra["queued_points"] = queued
        extra["queued"] = {k: rule.to_dict() for k, q in queued.items() if (rule := fit_queued(q)) is not None}
    return Cluster(world, fitted, backend=dist.get_backend(), topology=two_level, extra=extra)


def measure_points(name: str, sizes: Sequence[int], *, reps: int, warmup: int,
                   report: Callable[[str], None] | None = None, group: dist.ProcessGroup | None = None,
                   label: str = "", root: int = 0, max_run: int = MAX_RUN) -> list[tuple[float, float]]:
    """``(bytes, seconds)`` of collective ``name`` at each size on ``group`` (default: all ranks):
    the slowest rank's median over ``reps`` repetitions, the same on every rank
    of the group (a collective call on it).  ``root``: the global rank a ``reduce`` sums to and a
    ``broadcast`` sends from."""
    world, device = dist.get_world_size(group), _device()
    points = []
    for nbytes in sizes:
        seconds = _time_collective(name, nbytes, world, device, reps, warmup, group, root, max_run)
        points.append((float(nbytes), seconds))
        if report is not None and dist.get_rank() == 0:
            report(f"{label}{name:9s} {nbytes:>11,d} B  {seconds * 1e6:12.1f} us  {nbytes / seconds / 1e9:8.3f} GB/s")
        dist.barrier(group=group)
    return points


def _time_collective(name: str, nbytes: int, world: int, device: torch.device, reps: int, warmup: int,
                     group: dist.ProcessGroup | None = None, root: int = 0, max_run: int = MAX_RUN) -> float:
    """Median seconds of one collective over ``reps`` on ``group``, its slowest rank's.

    A repetition starts behind a barrier with one untimed operation, then times
    :func:`run_for` operations back to back (at least 8 MiB in all) and takes their mean:
    what an operation costs in a stream of them, as a training step issues them.  An
    operation timed alone after an idle pause can be cheaper than that on a shaped link
    (the testbed's token bucket lets a burst through: at 1 Gbit/s a lone 1 MiB all-reduce
    on 2 hosts took 8.4 ms, one in a stream 10.8 ms, docs/cost-model.md), and a lone
    small one carries the barrier's skew."""
    numel = max(1, nbytes // 4)
    buf = torch.zeros(numel, dtype=_ELEMENT, device=device)  # zeros: repeated sums stay finite
    out = torch.zeros(numel * world, dtype=_ELEMENT, device=device) if name in PER_RANK else None
    # the two phases as the runtime runs them (gradsched.torch.runtime.decoupled), with its buffers
    scratch = scratch_for(out, world, uses_nccl(group or dist.group.WORLD, device)) if out is not None else None

    def once() -> None:
        if name == "allreduce":
            dist.all_reduce(buf, group=group)
        elif name == "reduce":
            dist.reduce(buf, dst=root, group=group)
        elif name == "broadcast":
            dist.broadcast(buf, src=root, group=group)
        elif name == "reducescatter":
            reduce_scatter(buf, out, scratch, group)
        else:
            all_gather(out, buf, scratch, group)

    for _ in range(warmup):
        once()
    # a run's bytes are the whole group's: a phase of s bytes a rank moves about an all-reduce of world * s (sized by
    # the part, the 8-host tables ran 10 reduce-scatters of 2 MiB groups a repetition against the all-reduce's 4)
    run = run_for(nbytes * world if name in PER_RANK else nbytes, max_run)
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        times.append(stream_time_s(once, run, lambda: _sync(device)))
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return float(slowest.item())


QUEUE_MIN_BYTES = 1 << 20  # queued streams are timed from this size a rank up (below it, latency rules)


def measure_queued(name: str, sizes: Sequence[int], depths: Sequence[int], *, reps: int, warmup: int,
                   report: Callable[[str], None] | None = None) -> dict[str, list[list[float]]]:
    """Seconds per operation of ``name`` at each size: ``"1"``, :data:`max(depths)` operations one at a time
    (each waited for before the next is issued), and for each ``k`` of ``depths``, ``k`` operations issued
    together (asynchronously, back to back) then all waited for: ``{"1": [[bytes, s], ...], "2": ...}``, the
    slowest rank's median over ``reps``, on every rank.  Each repetition times all of them one after another
    behind barriers, so a change of load or of the link's state shifts them alike.

    A training step issues its collectives queued so (the runtime's hooks, ``async_op=True``); gloo runs a
    process group's queued operations on its worker threads, several at once, and one all-to-all or
    all-gather alone can leave a shaped link partly idle, so a queue of them can move more bytes a second
    than one at a time (docs/cost-model.md, "Queued streams")."""
    device, world = _device(), dist.get_world_size()
    ks = sorted({k for k in depths if k > 1})
    rows: dict[str, list[list[float]]] = {str(k): [] for k in [1, *ks]}
    for nbytes in sizes:
        issue = None  # the last size's buffers go before this one's are made
        issue = _queue(name, nbytes, max(ks), world, device)
        for _ in range(warmup):
            issue(max(ks), False)
        times: dict[int, list[float]] = {k: [] for k in [1, *ks]}
        for _ in range(reps):
            for k in [1, *ks]:
                dist.barrier()
                t0 = time.perf_counter()
                issue(max(ks) if k == 1 else k, k > 1)
                times[k].append((time.perf_counter() - t0) / (max(ks) if k == 1 else k))
        slowest = torch.tensor([statistics.median(times[k]) for k in [1, *ks]], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        for k, seconds in zip([1, *ks], slowest.tolist()):
            rows[str(k)].append([float(nbytes), seconds])
            if report is not None and dist.get_rank() == 0:
                how = "one at a time" if k == 1 else f"{k} queued"
                report(f"{name:9s} {nbytes:>11,d} B  {seconds * 1e6:12.1f} us per operation, {how}")
    return rows


def _queue(name: str, nbytes: int, most: int, world: int, device: torch.device) -> Callable[[int, bool], None]:
    """``issue(k, together)``: ``k`` operations of ``name`` on ``nbytes`` (a rank's part for a per-rank
    collective), each on its own buffers as a plan's groups are (those it only reads shared); issued all
    before any is waited for (``together``) or each waited for before the next; done when the device is."""
    numel = max(1, nbytes // 4)
    # a two-phase operation's input only read (a reduce-scatter's whole, an all-gather's part): one for the
    # queue (the 4 inputs and 4 outputs of 16 MiB a rank set a dear row's peak memory: 0.66 GB a rank)
    bufs = [torch.zeros(numel, dtype=_ELEMENT, device=device) for _ in range(most if name != "allgather" else 1)]
    fulls = [torch.zeros(numel * world, dtype=_ELEMENT, device=device)
             for _ in range(most if name == "allgather" else 1)] if name in PER_RANK else []
    bufs, fulls = bufs * (most // len(bufs)), fulls * (most // max(1, len(fulls)))
    nccl = uses_nccl(dist.group.WORLD, device)
    scratch = [scratch_for(f, world, nccl) for f in fulls] or [None] * most  # the runtime's buffers for the phases
    rank = dist.get_rank()

    def one(i: int) -> list[dist.Work]:
        if name == "allreduce":
            return [dist.all_reduce(bufs[i], async_op=True)]
        if name == "reducescatter":  # as the runtime starts it (its local sum, after the wait, is compute)
            return start_reduce_scatter(bufs[i], fulls[i], scratch[i], None, rank, nccl)
        return start_all_gather(fulls[i], bufs[i], scratch[i], None, rank, nccl)

    def issue(k: int, together: bool) -> None:
        works: list[dist.Work] = []
        for i in range(k):
            if together:
                works += one(i)
            else:
                for w in one(i):
                    w.wait()
        for w in works:
            w.wait()
        _sync(device)

    return issue


def node_layout(world: int, ranks_per_node: int | None = None) -> tuple[int, int]:
    """``(nodes, ranks_per_node)`` of ``world`` ranks, node ``i`` holding ranks ``[i * M, (i + 1) * M)``
    (as torchrun numbers them).  ``M``: ``ranks_per_node`` if given, else ``LOCAL_WORLD_SIZE``
    (torchrun sets it), else 1 (every rank its own node): the runtime's rule
    (:func:`gradsched.torch.runtime.nodes.ranks_per_node`)."""
    from gradsched.torch.runtime.nodes import ranks_per_node as resolve

    per_node = resolve(ranks_per_node)
    if world % per_node:
        source = "ranks per node" if ranks_per_node is not None else "LOCAL_WORLD_SIZE"
        raise GradschedError(f"{source} {per_node} does not divide the {world} ranks into equal nodes; give "
                             f"the number of ranks on each node (--ranks-per-node)")
    return world // per_node, per_node


def measure_topology(nodes: int, ranks_per_node: int, sizes: Sequence[int], *, reps: int, warmup: int,
                     report: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """Time the all-reduce at both levels of ``nodes`` x ``ranks_per_node``; rank 0 returns the
    cluster's ``topology`` field (docs/formats.md), the others None.  Every rank calls this.

    Inside a node: a group of each node's ranks; all nodes measure at once (as a two-level
    all-reduce's first step runs on all of them) and a size's time is the slowest node's:
    the all-reduce, then the reduce to and the broadcast from the node's first rank (the
    hierarchical all-reduce's first and last steps, ``intra``'s ``reduce`` and ``broadcast``).
    Across nodes: a group of each node's first rank (local rank 0), timed while the other
    ranks wait.  The groups are made on every rank in that order (``new_group`` is a
    collective of the whole job).  Each level is fitted as the top-level one is: a line
    and the table, through the measurements' lower monotone envelope."""
    rank = dist.get_rank()
    node_groups = [dist.new_group(list(range(i * ranks_per_node, (i + 1) * ranks_per_node))) for i in range(nodes)]
    leaders = dist.new_group([i * ranks_per_node for i in range(nodes)])
    node, leader = rank // ranks_per_node, rank - rank % ranks_per_node
    intra = {}  # the all-reduce, and the hierarchical all-reduce's reduce to and broadcast from the leader
    for name in ("allreduce",) + NODE_STEPS:
        points = measure_points(name, sizes, reps=reps, warmup=warmup, report=report, group=node_groups[node],
                                label="in node ", root=leader)
        seconds = torch.tensor([t for _, t in points], dtype=torch.float64, device=_device())
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest node's
        intra[name] = [(b, float(t)) for (b, _), t in zip(points, seconds.tolist())]
    inter = None
    if rank % ranks_per_node == 0:
        inter = measure_points("allreduce", sizes, reps=reps, warmup=warmup, report=report, group=leaders,
                               label="across nodes ")
    dist.barrier()
    if rank != 0:
        return None
    return {"nodes": nodes, "ranks_per_node": ranks_per_node,
            "algorithm": "ring",  # what gloo's and NCCL's plain all-reduce does by default: one flat ring
            "intra": _level(intra), "inter": _level({"allreduce": inter})}


def _level(measured: dict[str, Sequence[tuple[float, float]]]) -> dict[str, Any]:
    """One level's ``collectives`` and ``points``, each fitted as the top-level all-reduce is."""
    costs = {name: fit_measured(name, points) for name, points in measured.items()}
    return {"collectives": {k: c.to_dict() for k, c in costs.items()},
            "points": {k: [list(p) for p in c.points] for k, c in costs.items()}}


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summary(cluster: Cluster) -> str:
    """Human-readable fitted lines, one per collective."""
    lines = [f"{cluster.backend}, {cluster.world_size} ranks:"]
    for name, c in cluster.collectives.items():
        bw = f"{1 / c.beta_s_per_byte / 1e9:.3f} GB/s" if c.beta_s_per_byte > 0 else "unbounded"
        lines.append(f"  {name:9s} alpha {c.alpha_s * 1e6:9.1f} us, beta {c.beta_s_per_byte * 1e9:.4f} ns/B ({bw})")
    topology = cluster.to_dict().get("topology")
    if topology:
        n, m = topology["nodes"], topology["ranks_per_node"]
        for level, where in (("intra", f"in a node ({m} ranks)"), ("inter", f"across nodes ({n} ranks)")):
            c = topology[level]["collectives"]["allreduce"]
            lines.append(f"  allreduce {where}: alpha {c['alpha_s'] * 1e6:.1f} us, "
                         f"beta {c['beta_s_per_byte'] * 1e9:.4f} ns/B")
    return "\n".join(lines)


# ------------------------------------------------------------------------ entry point
def run_under_launcher(args: argparse.Namespace) -> int:
    """Body of one rank: join the group torchrun set up, measure, rank 0 writes the file."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise GradschedError("not started by torchrun (RANK/WORLD_SIZE unset): run `torchrun --nproc-per-node N "
                             "-m gradsched.torch.measure.netbench`, or `gradsched netbench --nproc N` on one machine")
    check_backend(args.backend)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(backend)
    try:
        report = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        cluster = benchmark(min_bytes=args.min_bytes, max_bytes=args.max_bytes, reps=args.reps, warmup=args.warmup,
                            collectives=[c.strip() for c in args.collectives.split(",") if c.strip()],
                            ranks_per_node=args.ranks_per_node, report=report,
                            queue_depths=parse_depths(args.queue_depths))
        if cluster is not None:
            cluster.save(args.output)
            if not args.quiet:
                print(f"wrote {args.output}: {summary(cluster)}")
    finally:
        if created:
            dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradsched.torch.measure.netbench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.output = args.output or DEFAULT_OUTPUT
    try:
        return run_under_launcher(args)
    except GradschedError as exc:
        print(f"gradsched netbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from gradsched.torch.runtime.shutdown import leave

    leave(main())  # skip interpreter finalisation: see gradsched.torch.runtime.shutdown
