"""dear's two phases on gloo over the testbed: one collective a group against pieces on threaded groups (root).

    python benchmarks/two_phase_pieces.py [--prefix gse] [--reps 7] [--out benchmarks/results/two_phase_pieces.log]

The stream is dear's GoogLeNet-K80 plan on 2 hosts at 1 Gbit/s (``threshold(1 MB)``, 30 groups of 0.13-4.2 MiB a
rank): each group's reduce-scatter (all-to-all) issued at the time the traced backward issued it, then, from the
end of backward, each group's all-gather in forward order once its reduce-scatter is done, as
``gradsched.torch.runtime.decoupled`` runs them; timed until the last all-gather is done.  Cases, alternating in
each repetition: one collective a group on groups of gloo's default two worker threads (the runtime before
2026-12-07), and pieces of 1 MiB, 512 KiB and 256 KiB a rank on groups of 8 or 16 threads (``CHUNK_BYTES``,
``PHASE_THREADS``).  Rank 0 prints one line per case: medians over ``--reps`` of when the reduce-scatters and
the all-gathers were done (docs/runtime.md, "Decoupled all-reduce").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

# bytes of each group (fp32 gradients), in the order backward makes them ready, and when (ms from backward's start)
SIZES = [4100096, 426496, 774912, 2655744, 639744, 1279488, 943360, 1844480, 533248, 852992, 748800, 1844480,
         880384, 4100096, 8392704, 673024, 1494272, 860160, 1180672, 810496, 953600, 558336, 4100096, 8392704,
         262656, 951040, 927744, 918528, 794880, 621312]
ISSUE_MS = [0.6, 1.4, 19.6, 24.0, 60.1, 63.3, 64.2, 65.1, 69.6, 70.3, 79.3, 80.2, 80.9, 82.4, 132.9, 134.4, 145.9,
            151.9, 152.6, 153.7, 154.3, 159.6, 161.4, 176.6, 191.4, 192.2, 192.9, 197.9, 198.7, 211.7]
BACKWARD_MS = 212.0
MiB = 1 << 20
CASES = {"one a group, 2 threads": (2, 0), "8 threads, no pieces": (8, 0), "8 threads, 1 MiB": (8, MiB),
         "8 threads, 512 KiB": (8, MiB // 2), "8 threads, 256 KiB": (8, MiB // 4), "16 threads, 512 KiB": (16, MiB // 2)}


def _spans(n: int, world: int, chunk: int) -> list[tuple[int, int]]:
    step = (chunk // 4) * world if chunk else n
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def worker(reps: int) -> None:
    import torch
    import torch.distributed as d

    d.init_process_group("gloo", timeout=timedelta(seconds=300))
    p = d.get_world_size()

    def group(threads: int) -> Any:
        opts = d.ProcessGroupGloo._Options()
        opts._timeout, opts._threads = timedelta(seconds=300), threads
        opts._devices = [d.ProcessGroupGloo.create_default_device()]
        return d.new_group(backend="gloo", pg_options=opts)

    groups = {t: (group(t), group(t)) for t in sorted({t for t, _ in CASES.values()})}
    fulls = [torch.ones(-(-(s // 4) // p) * p) for s in SIZES]
    outs = [torch.empty_like(f) for f in fulls]
    shards = [torch.ones(f.numel() // p) for f in fulls]

    def chain(threads: int, chunk: int) -> tuple[float, float]:
        rs_group, ag_group = groups[threads]
        d.barrier()
        t0 = time.perf_counter()
        scattering = []
        for i, f in enumerate(fulls):
            time.sleep(max(0.0, t0 + ISSUE_MS[i] / 1e3 - time.perf_counter()))
            scattering.append([d.all_to_all_single(outs[i][a:b], f[a:b], group=rs_group, async_op=True)
                               for a, b in _spans(f.numel(), p, chunk)])
        time.sleep(max(0.0, t0 + BACKWARD_MS / 1e3 - time.perf_counter()))
        gathering = []
        for i in reversed(range(len(fulls))):  # forward order: the group issued last first
            for w in scattering[i]:
                w.wait()
            gathering += [d.all_gather_into_tensor(fulls[i][a:b], shards[i][a // p:b // p], group=ag_group,
                                                   async_op=True) for a, b in _spans(fulls[i].numel(), p, chunk)]
        scattered = time.perf_counter() - t0
        for w in gathering:
            w.wait()
        return scattered, time.perf_counter() - t0

    times: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
    for _ in range(reps):
        for name, (threads, chunk) in CASES.items():
            times[name].append(chain(threads, chunk))
    if d.get_rank() == 0:
        for name, v in times.items():
            print(f"{name:22s} reduce-scatters done {statistics.median(x[0] for x in v) * 1e3:6.1f} ms, all-gathers "
                  f"done {statistics.median(x[1] for x in v) * 1e3:6.1f} ms  (each: {[round(x[1] * 1e3) for x in v]})",
                  flush=True)
    d.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default="gse")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="also write rank 0's lines here")
    args = ap.parse_args()
    if "RANK" in os.environ:  # launched by torchrun on a testbed host
        worker(args.reps)
        return 0
    from subprocess import PIPE

    from gradsched.testbed import Testbed

    with Testbed(hosts=2, rate="1gbit", prefix=args.prefix) as tb:
        job = tb.launch([os.path.abspath(__file__), "--reps", str(args.reps)], stdout=PIPE, text=True)
        codes = job.wait()
        lines = [ln for proc in job.procs for ln in (proc.stdout.read() if proc.stdout else "").splitlines()
                 if "done" in ln]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text(" ".join(["python", *sys.argv]) + "\n" + "\n".join(lines) + "\n")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
