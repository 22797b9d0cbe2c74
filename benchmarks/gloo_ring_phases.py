"""gloo's two phases over the testbed: the runtime's all-to-all form against rings of point-to-point messages (root).

    sudo python benchmarks/gloo_ring_phases.py [--hosts 8] [--rate 250mbit] [--mib 0.25,0.5,1,2,4,16] [--reps 5] \
        [--queue-mib 0.25,1,2] [--queue-depth 4] [--threads 2,4,8] [--tag T]

For each size (MiB a rank's buffer holds), in every repetition and in turn: one ``all_reduce`` of the buffer; the
runtime's reduce-scatter and all-gather as all-to-alls (``gradsched.torch.runtime.decoupled.reduce_scatter`` /
``all_gather`` with ``GRADSCHED_RING_MIN_BYTES`` out of reach: all-to-alls in pieces on threaded side groups); and
the same two phases as rings (``gradsched.torch.runtime.ring``, what the runtime runs from ``RING_MIN_BYTES``).
Each timed on the slowest rank after a barrier; medians over ``--reps``, and each phase against half the
all-reduce (what a ring all-reduce's halves cost).  ``--threads`` (dear13): the queue timed again for each count of
the phase groups' gloo threads (``decoupled.PHASE_THREADS``), in the order given and then reversed, so that a drift
of the load shifts every count alike (``queued_by_threads``; ``0``: the queue as rings, key ``rings``).  Prints a table and writes
``benchmarks/results/gloo_ring_phases_{hosts}h_{rate}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
CASES = ("allreduce", "a2a_rs", "a2a_ag", "ring_rs", "ring_ag")
RINGS = 0  # in --threads: the queue of rings (every group one), not all-to-alls on phase groups
QUEUE_DEPTH = 4  # the bench's (gradsched.torch.jobs.bench_network.QUEUE_DEPTH)


def worker(mibs: list[float], reps: int, out: str, queue_mibs: list[float], depth: int = QUEUE_DEPTH,
           threads: list[int] | None = None) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gradsched.torch.runtime.decoupled import all_gather, reduce_scatter
    from gradsched.torch.runtime.ring import ring_all_gather, ring_reduce_scatter

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    p, world = dist.get_world_size(), dist.group.WORLD

    def all_to_alls(f) -> None:
        """``f`` with the runtime's rings off: its all-to-alls, whatever the size."""
        os.environ["GRADSCHED_RING_MIN_BYTES"] = str(1 << 62)
        try:
            f()
        finally:
            del os.environ["GRADSCHED_RING_MIN_BYTES"]

    def timed(f) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        f()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    rows = []
    for mib in mibs:
        n = int(mib * (1 << 20)) // 4 // p * p
        full, shard = torch.ones(n), torch.ones(n // p)
        scratch = torch.empty_like(full)  # the all-to-alls' (scratch_for's where no ring runs)
        incoming = torch.empty(n // p)
        run = {"allreduce": lambda: dist.all_reduce(full),
               "a2a_rs": lambda: all_to_alls(lambda: reduce_scatter(shard, full, scratch)),
               "a2a_ag": lambda: all_to_alls(lambda: all_gather(full, shard, scratch)),
               "ring_rs": lambda: ring_reduce_scatter(full, world, incoming),
               "ring_ag": lambda: ring_all_gather(full, world)}
        for case in CASES:  # warm-up
            run[case]()
        samples: dict[str, list[float]] = {c: [] for c in CASES}
        for _ in range(reps):
            for case in CASES:
                samples[case].append(timed(run[case]))
        med = {c: statistics.median(v) for c, v in samples.items()}
        half = med["allreduce"] / 2
        rows.append({"mib_per_rank": mib, "median_s": med, "samples_s": samples,
                     "vs_half_allreduce": {c: med[c] / half for c in CASES if c != "allreduce"}})
    queued: dict = {}
    by_threads: dict[str, list] = {}
    if queue_mibs:  # as the bench's table times the queue (depth issued together against one at a time)
        from gradsched.torch.measure.netbench import measure_queued
        from gradsched.torch.runtime import decoupled

        per_rank = [int(m * (1 << 20)) // p // 4 * 4 for m in queue_mibs]

        def queue() -> dict:
            return {name: measure_queued(name, per_rank, (depth,), reps=reps, warmup=1)
                    for name in ("reducescatter", "allgather")}
        if not threads:
            queued = queue()
        for t in [*(threads or []), *reversed(threads or [])]:
            if t == RINGS:  # every group a ring (the runtime's form from RING_MIN_BYTES), on the ring groups
                os.environ["GRADSCHED_RING_MIN_BYTES"] = "1"
            else:
                decoupled.PHASE_THREADS = t  # new phase groups of t threads (made on first use, on every rank)
            try:
                by_threads.setdefault("rings" if t == RINGS else str(t), []).append(queue())
            finally:
                os.environ.pop("GRADSCHED_RING_MIN_BYTES", None)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"ranks": p, "reps": reps, "rows": rows, "queued_points": queued,
                                         "queue_depth": depth, "queued_by_threads": by_threads,
                                         "load_1min": os.getloadavg()[0]}, indent=1) + "\n")
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rate", default="250mbit")
    ap.add_argument("--mib", default="0.25,0.5,1,2,4,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prefix", default="gsl")
    ap.add_argument("--queue-mib", default="", help="group sizes (MiB a rank's buffer holds) at which each phase is "
                    "also timed in a queue of 4 against one at a time, as the bench's table does (queued_points, "
                    "sizes a rank)")
    ap.add_argument("--queue-depth", type=int, default=QUEUE_DEPTH, help="operations queued together (default: "
                    "the bench's 4)")
    ap.add_argument("--threads", default="", help="gloo threads of the phase groups to time the queue on, in turn "
                    "(e.g. 2,4,8; 0: the queue as rings, every group one; default: the runtime's PHASE_THREADS only)")
    ap.add_argument("--tag", default="", help="suffix of the result file's name (keeps a stored sweep)")
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    mibs = [float(x) for x in args.mib.split(",")]
    queue_mibs = [float(x) for x in args.queue_mib.split(",") if x]
    threads = [int(x) for x in args.threads.split(",") if x]
    if "RANK" in os.environ:  # launched by torchrun on a testbed host
        worker(mibs, args.reps, args.worker_out, queue_mibs, args.queue_depth, threads)
        return 0
    from gradsched.testbed import Testbed

    tag = f"_{args.tag}" if args.tag else ""
    out = RESULTS / f"gloo_ring_phases_{args.hosts}h_{args.rate}{tag}.json"
    load0 = os.getloadavg()[0]
    with Testbed(hosts=args.hosts, rate=args.rate, prefix=args.prefix) as tb:
        job = tb.launch([os.path.abspath(__file__), "--mib", args.mib, "--reps", str(args.reps),
                         "--queue-mib", args.queue_mib, "--queue-depth", str(args.queue_depth),
                         "--threads", args.threads, "--worker-out", str(out.resolve())])
        codes = job.wait()
    if max(codes):
        return max(codes)
    result = json.loads(out.read_text())
    result.update(command="python " + " ".join(sys.argv), hosts=args.hosts, rate=args.rate, load_1min_before=load0)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.hosts} hosts at {args.rate}: median ms (x half the all-reduce)")
    print(f"{'MiB':>5s} {'all-reduce':>11s} " + " ".join(f"{c:>16s}" for c in CASES[1:]))
    for r in result["rows"]:
        m, v = r["median_s"], r["vs_half_allreduce"]
        print(f"{r['mib_per_rank']:5g} {m['allreduce'] * 1e3:11.1f} "
              + " ".join(f"{m[c] * 1e3:9.1f} ({v[c]:.2f})" for c in CASES[1:]))
    d = args.queue_depth
    for name, depths in result.get("queued_points", {}).items():
        for (b, alone), (_, queued) in zip(depths["1"], depths[str(d)]):
            print(f"{name:13s} {b * args.hosts / (1 << 20):5g} MiB a group: {alone * 1e3:7.1f} ms alone, "
                  f"{queued * 1e3:7.1f} per operation {d} queued ({alone / queued:.2f}x)")
    for t, passes in result.get("queued_by_threads", {}).items():
        for name in ("reducescatter", "allgather"):
            for i, (b, _) in enumerate(passes[0][name]["1"]):
                alone = statistics.median(q[name]["1"][i][1] for q in passes)
                queued = statistics.median(q[name][str(d)][i][1] for q in passes)
                print(f"{t} threads {name:13s} {b * args.hosts / (1 << 20):5g} MiB a group: {alone * 1e3:7.1f} ms "
                      f"alone, {queued * 1e3:7.1f} per operation {d} queued ({alone / queued:.2f}x; "
                      f"passes {', '.join(f'{q[name][str(d)][i][1] * 1e3:.1f}' for q in passes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
