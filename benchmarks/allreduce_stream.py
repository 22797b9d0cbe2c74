"""What one all-reduce costs alone, right after another, and in a stream (why netbench times runs).

    python benchmarks/allreduce_stream.py [--rate 1gbit] [--reps 9] \
        [--json benchmarks/results/allreduce_stream_1gbit.json]

As root: 2 testbed hosts (prefix ``gsb``), gloo.  For each size from 128 KiB to 8 MiB,
the slowest rank's median over ``--reps`` of one all-reduce timed three ways:

- ``alone``: behind a barrier after 50 ms of idle links (how netbench timed until
  2026-12-04: every repetition behind a barrier);
- ``after_busy``: behind a barrier that follows a 4 MiB all-reduce;
- ``stream``: the mean of 8 back-to-back all-reduces (as a training step issues them
  while communication is the bottleneck; how netbench times now, after one untimed lead).

On the testbed the links' token bucket (tbf, about 1 ms of burst) lets the first bytes
after an idle pause through at the veth's speed, so ``alone`` is optimistic for sizes of
about that burst (docs/cost-model.md, "Measured in a stream"; with the 10 ms burst used
until 2026-12-05 it halved the cost of 1-2 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIZES = [128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20]
STREAM = 8


def worker(out: str, reps: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    drain = torch.zeros(1 << 20)  # 4 MiB
    result = {}
    for nbytes in SIZES:
        buf = torch.zeros(nbytes // 4)
        for _ in range(2):
            dist.all_reduce(buf)
        alone, after_busy, stream = [], [], []
        for _ in range(reps):
            dist.barrier()
            time.sleep(0.05)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            alone.append(time.perf_counter() - t0)
            dist.all_reduce(drain)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            after_busy.append(time.perf_counter() - t0)
            dist.barrier()
            dist.all_reduce(buf)
            t0 = time.perf_counter()
            for _ in range(STREAM):
                dist.all_reduce(buf)
            stream.append((time.perf_counter() - t0) / STREAM)
        t = torch.tensor([statistics.median(x) for x in (alone, after_busy, stream)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        result[str(nbytes)] = dict(zip(("alone_s", "after_busy_s", "stream_s"), t.tolist()))
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--prefix", default="gsb")
    ap.add_argument("--json", default=None, help="default benchmarks/results/allreduce_stream_<rate>.json")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.reps)
        return 0
    from gradsched.testbed import Testbed

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"{args.prefix}-stream-") as tmp:
        Path(tmp).chmod(0o777)
        out = Path(tmp, "worker.json")
        with Testbed(hosts=2, rate=args.rate, prefix=args.prefix) as tb:
            tb.launch([str(Path(__file__).resolve()), "--worker", str(out), "--reps", str(args.reps)]).wait(
                timeout_s=900)
        raw = json.loads(out.read_text())
    print(f"all-reduce on 2 testbed hosts at {args.rate}, gloo; slowest rank's median of {args.reps}")
    print(f"{'bytes':>10s} {'alone ms':>9s} {'ns/B':>6s} {'after busy':>10s} {'ns/B':>6s} {'stream ms':>9s} {'ns/B':>6s}")
    for k, r in raw.items():
        n = int(k)
        print(f"{n:10d} {r['alone_s'] * 1e3:9.2f} {r['alone_s'] / n * 1e9:6.2f} {r['after_busy_s'] * 1e3:10.2f} "
              f"{r['after_busy_s'] / n * 1e9:6.2f} {r['stream_s'] * 1e3:9.2f} {r['stream_s'] / n * 1e9:6.2f}")
    path = Path(args.json or Path(__file__).parent / "results" / f"allreduce_stream_{args.rate}.json")
    path.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "rate": args.rate, "reps": args.reps,
                                "load_before": load_before, "load_after": os.getloadavg()[0],
                                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": raw}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
