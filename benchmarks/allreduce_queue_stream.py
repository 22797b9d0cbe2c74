"""Gloo all-reduces on the testbed: a blocking stream (as the network table times them) against an
asynchronous queue (as PyTorch DDP and gradsched's executor issue them), per size (root; about a minute).

    sudo .venv/bin/python benchmarks/allreduce_queue_stream.py --hosts 8 --rate 250mbit --prefix gsq \
        [--sizes 16384,...] [--json benchmarks/results/allreduce_queue_stream_8h.json]

Each size, three repetitions behind barriers, of ``n`` operations (16 MiB in all, 8 to 32 of them):
*stream*, each waited for before the next is issued (``gradsched netbench``'s way, after one untimed lead),
and *queued*, ``n`` then ``2n`` issued with ``async_op=True`` then waited for (gloo's two worker threads take
two at a time); seconds per operation, the slowest rank's median, and the *marginal* seconds of an operation
in a long queue, ``(t(2n) - t(n)) / n`` (the queue's fill and drain cancel).  The question (issue 35, the 8-host rows):
does an operation in a training step's queue pay the per-operation start-up the table measured in a
blocking stream on top of its bytes?  Prints a line per size and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

SIZES = "16384,65536,262144,524288,1048576,2097152,4194304"


def _count(nbytes: int) -> int:
    return max(8, min(32, -(-(16 << 20) // nbytes)))


def _one(size: int) -> dict[str, float]:
    import torch
    import torch.distributed as d

    n = _count(size)
    bufs = [torch.zeros(size // 4) for _ in range(2 * n)]
    stream, queued, marginal = [], [], []
    for _ in range(3):
        d.barrier()
        d.all_reduce(bufs[0])  # the untimed lead, as netbench's stream
        t0 = time.perf_counter()
        for b in bufs[:n]:
            d.all_reduce(b)
        stream.append((time.perf_counter() - t0) / n)
        ends = []
        for k in (n, 2 * n):
            d.barrier()
            t0 = time.perf_counter()
            works = [d.all_reduce(b, async_op=True) for b in bufs[:k]]
            for w in works:
                w.wait()
            ends.append(time.perf_counter() - t0)
        queued.append(ends[0] / n)
        marginal.append((ends[1] - ends[0]) / n)
    slowest = torch.tensor([statistics.median(x) for x in (stream, queued, marginal)], dtype=torch.float64)
    d.all_reduce(slowest, op=d.ReduceOp.MAX)
    return {"bytes": size, "operations": n, "stream_s": slowest[0].item(), "queued_s": slowest[1].item(),
            "marginal_s": slowest[2].item()}


def worker(sizes: list[int], out: str | None) -> None:
    import torch.distributed as d

    d.init_process_group("gloo", timeout=timedelta(seconds=300))
    rows = []
    for size in sizes:
        row = _one(size)
        rows.append(row)
        if d.get_rank() == 0:
            print(f"size {size:9d} x{row['operations']:2d}: stream {row['stream_s'] * 1e3:7.2f} ms, queued "
                  f"{row['queued_s'] * 1e3:7.2f} ms per operation ({row['queued_s'] / row['stream_s']:.2f}x), "
                  f"marginal in a queue {row['marginal_s'] * 1e3:7.2f} ms",
                  flush=True)
    if d.get_rank() == 0 and out:
        Path(out).write_text(json.dumps({"world_size": d.get_world_size(), "rows": rows}, indent=1))
    d.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--rate", default="250mbit")
    p.add_argument("--prefix", default="gsq")
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--json", default=None, help="write the figures here (rank 0)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if "RANK" in os.environ:  # launched by torchrun on a testbed host
        worker(sizes, args.json)
        return 0
    from gradsched.testbed import Testbed

    out = os.path.abspath(args.json) if args.json else None
    with Testbed(hosts=args.hosts, rate=args.rate, prefix=args.prefix) as tb:
        argv = [os.path.abspath(__file__), "--sizes", args.sizes] + (["--json", out] if out else [])
        codes = tb.launch(argv).wait(timeout_s=900)
    if out:
        data = json.loads(Path(out).read_text())
        data.update(hosts=args.hosts, rate=args.rate, command=" ".join(["python", *sys.argv]),
                    date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load=os.getloadavg())
        Path(out).write_text(json.dumps(data, indent=1))
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
