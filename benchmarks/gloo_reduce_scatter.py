"""How fast gloo reduce-scatters: ``reduce_scatter_tensor`` against ``all_to_all_single`` and a local sum.

Gloo's ``reduce_scatter_tensor`` is an all-reduce of the whole buffer and a slice (PyTorch PR
#118911), so it moves about twice the bytes a ring reduce-scatter would.  An all-to-all moves
each rank's (p-1)/p of the buffer once, to the rank that owns that shard, which then sums the p
pieces locally: the same result with the reduce-scatter's bytes.  This script times both (and
the all-reduce and ``all_gather_into_tensor`` beside them) on ``--ranks`` local gloo ranks,
checks that both reduce-scatters give the same shard, and prints the median of ``--reps``
timed repetitions per size.  One command::

    .venv/bin/python benchmarks/gloo_reduce_scatter.py      # writes benchmarks/results/gloo_reduce_scatter.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent
# the 2.13 names (the old ones warn FutureWarning on every call): the same collectives
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SIZES_BYTES = (64 << 10, 1 << 20, 4 << 20, 16 << 20)


def reduce_scatter_all_to_all(out: torch.Tensor, full: torch.Tensor, world: int) -> None:
    """``out`` = this rank's shard of the sum of every rank's ``full``, by one all-to-all and a local sum."""
    pieces = torch.empty_like(full)
    dist.all_to_all_single(pieces, full)
    torch.sum(pieces.view(world, -1), dim=0, out=out)


def _timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(rank: int, world: int, port: int, reps: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = []
    for nbytes in SIZES_BYTES:
        n = nbytes // 4 // world * world
        full = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        shard, shard2, gathered = torch.empty(n // world), torch.empty(n // world), torch.empty(n)
        REDUCE_SCATTER(shard, full)
        reduce_scatter_all_to_all(shard2, full, world)
        same = bool(torch.allclose(shard, shard2, rtol=1e-5, atol=1e-5))
        row = {"bytes": n * 4, "same_result": same,
               "reduce_scatter_tensor_s": _timed(lambda: REDUCE_SCATTER(shard, full), reps),
               "all_to_all_sum_s": _timed(lambda: reduce_scatter_all_to_all(shard2, full, world), reps),
               "all_reduce_s": _timed(lambda: dist.all_reduce(full.clone()), reps),
               "all_gather_into_tensor_s": _timed(lambda: ALL_GATHER(gathered, shard), reps)}
        rows.append(row)
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "results" / "gloo_reduce_scatter.json"))
    args = ap.parse_args(argv)
    tmp = Path(args.out).with_suffix(".rows.tmp")
    mp.spawn(_worker, args=(args.ranks, _free_port(), args.reps, str(tmp)), nprocs=args.ranks)
    rows = json.loads(tmp.read_text())
    tmp.unlink()
    print(f"{'bytes':>10} {'RS (gloo)':>10} {'A2A+sum':>10} {'ratio':>6} {'allreduce':>10} {'allgather':>10} same")
    for r in rows:
        print(f"{r['bytes']:>10} {r['reduce_scatter_tensor_s'] * 1e3:8.2f}ms {r['all_to_all_sum_s'] * 1e3:8.2f}ms "
              f"{r['reduce_scatter_tensor_s'] / r['all_to_all_sum_s']:5.2f}x {r['all_reduce_s'] * 1e3:8.2f}ms "
              f"{r['all_gather_into_tensor_s'] * 1e3:8.2f}ms {r['same_result']}")
    result = {"benchmark": "gloo_reduce_scatter", "ranks": args.ranks, "reps": args.reps,
              "torch": torch.__version__, "rows": rows, "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
