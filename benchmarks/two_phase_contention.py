"""Does a reduce-scatter or an all-gather slow compute, and get slowed by it, as an all-reduce does?

The contention probe (``gradsched.torch.measure.probe.ContentionProbe``) fits its slowdowns from
all-reduces only; ``dear`` runs reduce-scatters (on gloo an ``all_to_all_single`` and a local sum)
and all-gathers beside forward and backward.  This script times, on ``--ranks`` local gloo ranks
(one thread each), for each of the three collectives of one ``--mib`` MiB buffer a rank:

- the collective alone, and while training steps of a small convolutional network run back to back
  (its time to completion, stamped on the backend's thread, as the probe stamps it);
- one training step alone, and behind a queue of that collective longer than the step.

The three collectives take turns within every repetition (the machine's load drifts), and the script
prints each one's communication and compute slowdown (medians over ``--reps`` repetitions, slowest
rank), writing them to ``--out``.  One command::

    .venv/bin/python benchmarks/two_phase_contention.py   # writes benchmarks/results/two_phase_contention.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
OPS = ("allreduce", "reducescatter", "allgather")


def _model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, 10))
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    return m, x, y, torch.optim.SGD(m.parameters(), lr=0.01)


class Bench:
    """The buffers and the step; ``issue(op)`` starts one collective of ``op`` asynchronously."""

    def __init__(self, nbytes: int, world: int) -> None:
        self.world = world
        n = nbytes // 4 // world * world
        self.full, self.pieces = torch.zeros(n), torch.zeros(n)
        self.shard = torch.zeros(n // world)
        self.module, self.x, self.y, self.opt = _model()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(self.module(self.x), self.y).backward()
        self.opt.step()

    def issue(self, op: str) -> dist.Work:
        if op == "allreduce":
            return dist.all_reduce(self.full, async_op=True)
        if op == "reducescatter":  # as the runtime runs it on gloo: an all-to-all (the sum follows on completion)
            return dist.all_to_all_single(self.pieces, self.full, async_op=True)
        return ALL_GATHER(self.full, self.shard, async_op=True)

    def finish(self, op: str) -> None:
        if op == "reducescatter":
            torch.sum(self.pieces.view(self.world, -1), dim=0, out=self.shard)

    def comm(self, op: str, busy: bool) -> float:
        """Seconds until one ``op`` completes (and its local sum), steps running meanwhile if ``busy``."""
        stamp: list[float] = []
        dist.barrier()
        t0 = time.perf_counter()
        work = self.issue(op)
        work.get_future().add_done_callback(lambda _f: stamp.append(time.perf_counter()))
        while busy and not stamp:
            self.step()
        work.wait()
        while not stamp:
            time.sleep(1e-4)
        t1 = time.perf_counter()
        self.finish(op)
        return stamp[0] - t0 + (time.perf_counter() - t1)

    def step_behind(self, op: str, queue: int) -> tuple[float, float]:
        """Seconds of one step while ``queue`` of ``op`` run (waited for off the clock), and 1.0 where the
        queue outlasted the step (compute was behind communication all along), else 0.0."""
        stamp: list[float] = []
        dist.barrier()
        works = [self.issue(op) for _ in range(queue)]
        works[-1].get_future().add_done_callback(lambda _f: stamp.append(time.perf_counter()))
        t0 = time.perf_counter()
        self.step()
        seconds = time.perf_counter() - t0
        covered = 0.0 if stamp else 1.0
        for w in works:
            w.wait()
        return seconds, covered


def _slowest(xs: list[float]) -> list[float]:
    t = torch.tensor(xs, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _timed(f: Callable[[], None]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _worker(rank: int, world: int, port: int, mib: float, reps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    b = Bench(int(mib * (1 << 20)), world)
    for op in OPS:  # warm-up
        b.comm(op, False)
    b.step()
    step_s = statistics.median(_slowest([_timed(b.step) for _ in range(3)]))
    # a queue three steps long: compute stays behind it though both slow each other (checked: ``covered``)
    queues = {op: math.ceil(3 * step_s / max(statistics.median(_slowest([b.comm(op, False)])), 1e-9)) for op in OPS}
    t: dict[str, list[float]] = {}
    for _ in range(reps):
        for op in OPS:
            for key, f in ((f"{op}_alone_s", lambda: b.comm(op, False)), (f"{op}_busy_s", lambda: b.comm(op, True)),
                           (f"compute_alone_{op}_s", lambda: _timed(b.step))):
                t.setdefault(key, []).append(f())
            seconds, covered = b.step_behind(op, queues[op])
            t.setdefault(f"compute_behind_{op}_s", []).append(seconds)
            t.setdefault(f"covered_{op}", []).append(-covered)  # negated: the slowest rank's is the least covered
    t = {k: _slowest(v) for k, v in t.items()}
    if rank == 0:
        m = {k: statistics.median(v) for k, v in t.items()}
        rows = {op: {"comm_alone_s": m[f"{op}_alone_s"], "comm_busy_s": m[f"{op}_busy_s"],
                     "comm_slowdown": m[f"{op}_busy_s"] / m[f"{op}_alone_s"] - 1,
                     "compute_alone_s": m[f"compute_alone_{op}_s"], "compute_behind_s": m[f"compute_behind_{op}_s"],
                     "compute_slowdown": m[f"compute_behind_{op}_s"] / m[f"compute_alone_{op}_s"] - 1,
                     "queue": queues[op], "covered": -statistics.mean(t[f"covered_{op}"])} for op in OPS}
        result = {"ranks": world, "mib_per_rank": mib, "reps": reps, "load_1min": os.getloadavg()[0],
                  "rows": rows, "samples": t}
        Path(out).write_text(json.dumps(result, indent=1) + "\n")
        for op, r in rows.items():
            print(f"{op:14s} comm {r['comm_alone_s'] * 1e3:7.1f} -> {r['comm_busy_s'] * 1e3:7.1f} ms "
                  f"(slowdown {r['comm_slowdown']:.2f})  compute {r['compute_alone_s'] * 1e3:6.1f} -> "
                  f"{r['compute_behind_s'] * 1e3:6.1f} ms (slowdown {r['compute_slowdown']:.2f}, covered {r['covered']:.2f})")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mib", type=float, default=8.0, help="buffer per rank, MiB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "results" / "two_phase_contention.json"))
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(a.ranks, port, a.mib, a.reps, a.out), nprocs=a.ranks)


if __name__ == "__main__":
    main()
