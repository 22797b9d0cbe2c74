"""Gloo all-reduces on the testbed, one at a time against queued back to back (root; a few minutes).

    python benchmarks/gloo_queue_testbed.py [--hosts 8] [--rate 250mbit] [--sizes 16384,300000,2300000] [--count 10]

Each size: ``--count`` all-reduces timed alone (each after a barrier, the median kept), then as many issued at
once (``async_op=True``, as gradsched's executor and PyTorch DDP issue ready buckets) and waited for in
order, three times: per operation, the first one's end and the last one's.  Both on the default process
group (gloo's 2 worker threads) and on one with a single thread.  Asks whether gloo's queue makes an
operation queued behind others cost more than the network table's (alone) time, which the simulator
assumes it does not (docs/notes/2026-12-bench-runs.md, "Where `auto`'s 130 ms go on 8 emulated hosts").
Testbed prefix ``gsw``; rank 0 prints one line per size and group.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta


def _groups(dist: object) -> dict[str, object]:
    import torch.distributed as d

    groups: dict[str, object] = {"default (2 threads)": None}
    opts = d.ProcessGroupGloo._Options()
    opts._timeout = timedelta(seconds=120)
    opts._threads = 1
    opts._devices = [d.ProcessGroupGloo.create_default_device()]
    groups["1 thread"] = d.new_group(backend="gloo", pg_options=opts)
    return groups


def _one(size: int, n: int, name: str, group: object) -> str:
    import torch
    import torch.distributed as d

    bufs = [torch.ones(size // 4) for _ in range(n)]
    alone = []
    for b in bufs:
        d.barrier()
        t0 = time.perf_counter()
        d.all_reduce(b, group=group)
        alone.append(time.perf_counter() - t0)
    ends = []
    for _ in range(3):
        d.barrier()
        t0 = time.perf_counter()
        works = [d.all_reduce(b, group=group, async_op=True) for b in bufs]
        mine = []
        for w in works:
            w.wait()
            mine.append(time.perf_counter() - t0)
        ends.append(mine)
    last = statistics.median(e[-1] for e in ends)
    return (f"size {size:9d} {name:20s} alone {statistics.median(alone) * 1e3:6.1f} ms | queued x{n}: "
            f"{last / n * 1e3:6.1f} ms each, first done at {statistics.median(e[0] for e in ends) * 1e3:6.1f} ms, "
            f"all at {last * 1e3:7.1f} ms")


def worker(sizes: list[int], n: int) -> None:
    import torch.distributed as d

    d.init_process_group("gloo", timeout=timedelta(seconds=120))
    groups = _groups(d)
    for size in sizes:
        for name, group in groups.items():
            line = _one(size, n, name, group)
            if d.get_rank() == 0:
                print(line, flush=True)
    d.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--rate", default="250mbit")
    p.add_argument("--sizes", default="16384,300000,2300000")
    p.add_argument("--count", type=int, default=10)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if "RANK" in os.environ:  # launched by torchrun on a testbed host
        worker(sizes, args.count)
        return 0
    from gradsched.testbed import Testbed

    with Testbed(hosts=args.hosts, rate=args.rate, prefix="gsw") as tb:
        job = tb.launch([os.path.abspath(__file__), "--sizes", args.sizes, "--count", str(args.count)])
        codes = job.wait()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
