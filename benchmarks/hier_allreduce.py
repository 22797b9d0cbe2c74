"""Where the model predicts the hierarchical all-reduce wins, does it win when measured?  (issue 21)

    python benchmarks/hier_allreduce.py [--hosts 2] [--ranks-per-host 2] [--rate 1gbit] [--reps 5] [--timing stream] \
        [--json benchmarks/results/hier_allreduce_2x2.json]

As root: a testbed (prefix ``gsw``) of ``--hosts`` hosts, ``--ranks-per-host`` ranks each
(ranks of one host over its loopback, hosts over the shaped links), gloo on CPU.  In one job:

1. the two-level cluster is measured as ``gradsched netbench`` does
   (:func:`gradsched.torch.measure.netbench.benchmark`: the flat all-reduce over all
   ranks; inside each host the all-reduce, the reduce and the broadcast; across hosts
   the all-reduce);
2. for every size (64 KiB .. 64 MiB by powers of 4) two one-parameter modules of that
   size are wrapped in gradsched's ``DistributedDataParallel``, one with a hand-made plan
   of one dense ``allreduce`` operation (gloo's flat ring), one with one
   ``hier-allreduce`` operation (the runtime's operation, as training runs it);
   backward + ``synchronize()`` is timed as netbench times a size (``--timing stream``:
   after a barrier, one untimed step, then the mean of a run of steps back to back) or
   alone after a barrier (``--timing alone``, how this script timed until 2026-12-05), the
   two interleaved, the slowest rank's time per rep, the median over ``--reps``;
3. beside them, gloo's plain reduce + broadcast and all-reduce inside each host (how far
   the "a reduce plus a broadcast is one intra-node all-reduce" rule, which the model uses
   where a cluster has no measured reduce and broadcast, is from gloo).

Prints, per size, the model's flat and hierarchical predictions (``Cluster.cost``) from
the cluster measured in step 1, the predicted and the measured winner, and whether they
agree, and the hierarchical prediction by the half rule beside it
(``predicted_hier_half_rule_s``); writes JSON with the machine's load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

KiB, MiB = 1024, 1024 * 1024
SIZES = [64 * KiB * 4 ** k for k in range(6)]  # 64 KiB .. 64 MiB
FLAT, HIER = "flat", "hier"


# --------------------------------------------------------------------------- worker (one rank)
def _wrapped(numel: int, collective: str, ranks_per_node: int):
    """gradsched's DDP around a module of one ``numel``-element parameter, with a plan of one operation."""
    import torch

    from gradsched.plan import Operation, Plan, Slice
    from gradsched.torch import DistributedDataParallel
    from gradsched.torch.runtime.planning import profile_from_module

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(numel))

        def forward(self) -> torch.Tensor:
            return self.w.sum()

    module = One()
    profile = profile_from_module(module)
    plan = Plan("hand", (Operation((Slice(0, 0, numel),), collective),), profile.fingerprint)
    return DistributedDataParallel(module, plan, use_torch_ddp=False, ranks_per_node=ranks_per_node, timeout_s=120)


def _timed(fn, run: int = 0) -> float:
    """Seconds of one ``fn()`` after a barrier (``run`` 0: alone), or, as netbench times a size,
    the mean of ``run`` calls back to back after one untimed lead (in a stream)."""
    import torch.distributed as dist

    from gradsched.torch.measure.netbench import stream_time_s

    dist.barrier()
    if run:
        return stream_time_s(fn, run)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _step(model) -> None:
    model.zero_grad(set_to_none=False)
    model().backward()
    model.synchronize()


def _slowest(times: list[float]) -> list[float]:
    """Each rep's slowest rank (a collective is done when its slowest rank is)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _runtime_times(nbytes: int, m: int, reps: int, stream: bool) -> dict[str, list[float]]:
    """Per rep, the slowest rank's backward + synchronize with the dense and with the hier operation
    (``stream``: in a stream of netbench's run length for the size, else alone)."""
    from gradsched.plan import DENSE, HIER as HIER_OP
    from gradsched.torch.measure.netbench import run_for

    models = {FLAT: _wrapped(nbytes // 4, DENSE, m), HIER: _wrapped(nbytes // 4, HIER_OP, m)}
    times: dict[str, list[float]] = {FLAT: [], HIER: []}
    for model in models.values():
        _step(model)  # warm-up
    run = run_for(nbytes) if stream else 0
    for r in range(reps):
        order = [FLAT, HIER] if r % 2 == 0 else [HIER, FLAT]  # interleaved, neither always first
        for arm in order:
            times[arm].append(_timed(lambda: _step(models[arm]), run))
    return {arm: _slowest(ts) for arm, ts in times.items()}


def _intra_times(nbytes: int, group, leader: int, reps: int) -> dict[str, list[float]]:
    """Inside each host: gloo's reduce + broadcast, and its all-reduce, per rep the slowest rank's."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(nbytes // 4)

    def reduce_broadcast() -> None:
        dist.reduce(buf, dst=leader, group=group)
        dist.broadcast(buf, src=leader, group=group)

    times: dict[str, list[float]] = {"reduce+broadcast": [], "allreduce": []}
    reduce_broadcast(), dist.all_reduce(buf, group=group)  # warm-up
    for _ in range(reps):
        times["reduce+broadcast"].append(_timed(reduce_broadcast))
        times["allreduce"].append(_timed(lambda: dist.all_reduce(buf, group=group)))
    return {k: _slowest(ts) for k, ts in times.items()}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from gradsched.torch.measure.netbench import benchmark

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    m, rank = args.ranks_per_host, dist.get_rank()
    cluster = benchmark(min_bytes=SIZES[0], max_bytes=args.max_bytes, reps=args.netbench_reps,
                        collectives=["allreduce"], ranks_per_node=m)
    nodes = [dist.new_group(list(range(i * m, (i + 1) * m))) for i in range(dist.get_world_size() // m)]
    sizes = [s for s in SIZES if s <= args.max_bytes]
    runtime, intra = {}, {}
    for nbytes in sizes:
        runtime[nbytes] = _runtime_times(nbytes, m, args.reps, args.timing == "stream")
        intra[nbytes] = _intra_times(nbytes, nodes[rank // m], (rank // m) * m, args.reps)
        if rank == 0:
            print(f"{nbytes:>10,d} B  flat {statistics.median(runtime[nbytes][FLAT]) * 1e3:8.1f} ms  "
                  f"hier {statistics.median(runtime[nbytes][HIER]) * 1e3:8.1f} ms", file=sys.stderr, flush=True)
    if rank == 0:
        Path(args.worker).write_text(json.dumps({"cluster": cluster.to_dict(), "sizes": sizes,
                                                 "runtime_s": {str(s): t for s, t in runtime.items()},
                                                 "intra_s": {str(s): t for s, t in intra.items()}}))
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- driver and table
def drive(args: argparse.Namespace) -> dict:
    from gradsched.testbed import Testbed

    with tempfile.TemporaryDirectory(prefix=f"{args.prefix}-hier-") as tmp:
        Path(tmp).chmod(0o777)
        out = Path(tmp, "worker.json")
        argv = [str(Path(__file__).resolve()), "--worker", str(out), "--ranks-per-host", str(args.ranks_per_host),
                "--reps", str(args.reps), "--timing", args.timing, "--netbench-reps", str(args.netbench_reps),
                "--max-bytes", str(args.max_bytes)]
        with Testbed(hosts=args.hosts, rate=args.rate, prefix=args.prefix) as tb:  # always torn down
            tb.launch(argv, ranks_per_host=args.ranks_per_host).wait(timeout_s=args.timeout_s)
        return json.loads(out.read_text())


def winner(flat_s: float, hier_s: float) -> str:
    return HIER if hier_s < flat_s else FLAT


def rows(raw: dict) -> list[dict]:
    """Per size: the model's predictions (from the measured cluster) beside the medians measured."""
    from gradsched.cluster import Cluster
    from gradsched.plan import HIER as HIER_OP

    cluster = Cluster.from_dict(raw["cluster"], "measured cluster")
    flat_cost, hier_cost = cluster.cost("allreduce"), cluster.cost(HIER_OP)
    topology = cluster.topology
    half_rule = None  # the model without netbench's measured reduce and broadcast: each half an all-reduce
    if topology is not None and topology.intra is not None:
        intra = {k: c for k, c in topology.intra.items() if k == "allreduce"}
        half_rule = dataclasses.replace(topology, intra=intra).hier_allreduce()
    out = []
    for nbytes in raw["sizes"]:
        measured = {arm: statistics.median(ts) for arm, ts in raw["runtime_s"][str(nbytes)].items()}
        intra = {k: statistics.median(ts) for k, ts in raw.get("intra_s", {}).get(str(nbytes), {}).items()}
        pred = {FLAT: flat_cost.time_s(nbytes), HIER: hier_cost.time_s(nbytes)}
        row = {"bytes": nbytes, "predicted_flat_s": pred[FLAT], "predicted_hier_s": pred[HIER],
               "measured_flat_s": measured[FLAT], "measured_hier_s": measured[HIER],
               "predicted_winner": winner(pred[FLAT], pred[HIER]),
               "measured_winner": winner(measured[FLAT], measured[HIER])}
        row["agree"] = row["predicted_winner"] == row["measured_winner"]
        if half_rule is not None:
            row["predicted_hier_half_rule_s"] = half_rule.time_s(nbytes)
        row["predicted_speedup"] = pred[FLAT] / pred[HIER]  # flat over hier: > 1 where hier wins
        row["measured_speedup"] = measured[FLAT] / measured[HIER]
        if intra:
            row["intra_reduce_broadcast_over_allreduce"] = intra["reduce+broadcast"] / intra["allreduce"]
        out.append(row)
    return out


def summary(table: list[dict]) -> dict:
    """The target: every size where hier is predicted to win, it wins measured; and agreement overall."""
    predicted_hier = [r for r in table if r["predicted_winner"] == HIER]
    return {"sizes": len(table), "agree": sum(r["agree"] for r in table),
            "predicted_hier_wins": len(predicted_hier),
            "target_holds": all(r["measured_winner"] == HIER for r in predicted_hier)}


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def format_table(table: list[dict]) -> str:
    lines = [f"{'size':>8} {'pred flat':>10} {'pred hier':>10} {'meas flat':>10} {'meas hier':>10} "
             f"{'pred f/h':>8} {'meas f/h':>8} {'pred win':>8} {'meas win':>8} {'agree':>5} {'rb/ar':>6}"]
    for r in table:
        rb = r.get("intra_reduce_broadcast_over_allreduce")
        lines.append(f"{_size(r['bytes']):>8} {r['predicted_flat_s'] * 1e3:>8.1f}ms {r['predicted_hier_s'] * 1e3:>8.1f}ms "
                     f"{r['measured_flat_s'] * 1e3:>8.1f}ms {r['measured_hier_s'] * 1e3:>8.1f}ms "
                     f"{r['predicted_speedup']:>8.2f} {r['measured_speedup']:>8.2f} "
                     f"{r['predicted_winner']:>8} {r['measured_winner']:>8} {'yes' if r['agree'] else 'NO':>5} "
                     f"{'' if rb is None else f'{rb:.2f}':>6}")
    s = summary(table)
    lines.append(f"agreement {s['agree']}/{s['sizes']}; hier predicted to win at {s['predicted_hier_wins']} "
                 f"size(s); target (those win when measured): {'holds' if s['target_holds'] else 'FAILS'}")
    lines.append("f/h: flat time over hier time (> 1: hier faster); "
                 "rb/ar: inside a host, gloo's reduce + broadcast over its all-reduce "
                 "(the model takes netbench's measured reduce and broadcast)")
    return "\n".join(lines)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--reps", type=int, default=5, help="timed reps per size and operation (default 5)")
    ap.add_argument("--timing", choices=["stream", "alone"], default="stream",
                    help="time each operation in a stream, as netbench times a size (default), or alone after a barrier")
    ap.add_argument("--netbench-reps", type=int, default=3, help="netbench reps per size (default 3)")
    ap.add_argument("--max-bytes", type=int, default=SIZES[-1])
    ap.add_argument("--prefix", default="gsw", help="testbed name prefix (default gsw)")
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--json", default=None, help="default benchmarks/results/hier_allreduce_HxM.json")
    ap.add_argument("--table", default=None, metavar="JSON", help="reprint the table of a result file (its raw data)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if sum(s <= args.max_bytes for s in SIZES) < 2:  # netbench fits each level's line through 2 sizes or more
        ap.error(f"--max-bytes {args.max_bytes} leaves fewer than two sizes to time (at least {SIZES[1]})")
    if args.worker:
        worker(args)
        return
    if args.table:
        done = json.loads(Path(args.table).read_text())
        print(f"{args.table}: load before {done['load_before']}, after {done['load_after']}")
        print(format_table(rows(done["raw"])))
        return
    load_before, t0 = load_average(), time.time()
    raw = drive(args)
    table = rows(raw)
    print(f"{args.hosts} hosts x {args.ranks_per_host} ranks at {args.rate}, gloo (CPU); operations timed "
          f"{'in a stream' if args.timing == 'stream' else 'alone'}, median of {args.reps} reps; "
          f"load before {load_before}, after {load_average()}")
    print(format_table(table))
    path = Path(args.json or f"benchmarks/results/hier_allreduce_{args.hosts}x{args.ranks_per_host}.json")
    path.write_text(json.dumps({"hosts": args.hosts, "ranks_per_host": args.ranks_per_host, "rate": args.rate,
                                "reps": args.reps, "timing": args.timing, "netbench_reps": args.netbench_reps,
                                "rows": table,
                                "summary": summary(table), "load_before": load_before, "load_after": load_average(),
                                "wall_s": time.time() - t0, "raw": raw,
                                "command": "python benchmarks/hier_allreduce.py " + " ".join(sys.argv[1:]),
                                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
