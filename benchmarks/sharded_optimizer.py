"""Sharded optimizer state (``shard_optimizer=True``) against the same plan unsharded: Adam's state per rank
(bytes of the state tensors and the RSS the first step adds) and the iteration time, on local gloo ranks.

One command::

    .venv/bin/python benchmarks/sharded_optimizer.py        # writes benchmarks/results/sharded_optimizer.json

Over ``dear`` the sharded optimizer steps the reduce-scatters' shards and all-gathers parameters before
each layer's forward (``ShardedOptimizer``); over ``wfbp`` it is PyTorch's ZeroRedundancyOptimizer after
all-reduced gradients.  Each configuration runs in fresh processes (so the RSS one adds is its own),
unsharded and sharded alternating ``--rounds`` times; a round times ``--blocks`` blocks of ``--steps``
steps without a synchronisation inside a block (the overlap of gathers and updates with the forward
counts), each block's time divided by its steps; then (``--pairs``) both in the same processes, blocks
taking turns, for the time ratio less exposed to the load's drift.  Reported per rank: the state bytes
(``gradsched.torch.runtime.sharded.state_bytes``) and the RSS growth over the first step (the state is
allocated there), each as a fraction of the unsharded run's, against the ideal 1/p; the median step time
of each and their ratio, and the median of the interleaved pairs' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MODELS = ("mlp", "cnn", "vgg")
STRATEGIES = ("dear", "wfbp")


def _rss() -> int:
    from gradsched.procfs import proc_bytes

    return proc_bytes("/proc/self/status", "VmRSS") or 0


def _one(rank: int, world: int, model_name: str, strategy: str, sharded: bool, steps: int, blocks: int) -> dict:
    import torch

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model
    from gradsched.torch.runtime.sharded import state_bytes

    torch.set_num_threads(1)
    spec = build_model(model_name, seed=0)
    model = DistributedDataParallel(spec.module, strategy, timeout_s=120, shard_optimizer=sharded)
    opt = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)
    gen = torch.Generator().manual_seed(1)
    batches = [spec.make_batch(8 * world, gen) for _ in range(4)]

    def step(k: int) -> None:
        x, y = batches[k % len(batches)]
        opt.zero_grad()
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        opt.step()

    x, y = batches[0]
    spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
    rss0 = _rss()
    opt.step()
    model.synchronize()
    rss_added = _rss() - rss0
    for k in range(2):  # warm-up
        step(k)
    times = []
    for _ in range(blocks):
        model.synchronize()
        torch.distributed.barrier()
        t0 = time.perf_counter()
        for k in range(steps):
            step(k)
        model.synchronize()
        times.append((time.perf_counter() - t0) / steps)
    return {"state_bytes": state_bytes(opt.optimizer), "rss_added": rss_added, "times": times,
            "kind": type(opt.optimizer).__name__}


def _interleaved(rank: int, world: int, model_name: str, strategy: str, steps: int, blocks: int) -> dict:
    """Unsharded and sharded side by side in the same processes: blocks of ``steps`` steps taking turns (the
    order swapped every pair), so that a load change hits both alike; each pair's ratio, and their median."""
    import torch

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    torch.set_num_threads(1)
    runs = []
    for sharded in (False, True):
        spec = build_model(model_name, seed=0)
        model = DistributedDataParallel(spec.module, strategy, timeout_s=120, shard_optimizer=sharded)
        runs.append((spec, model, DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)))
    gen = torch.Generator().manual_seed(1)
    batches = [runs[0][0].make_batch(8 * world, gen) for _ in range(4)]

    def block(i: int, n: int) -> float:
        spec, model, opt = runs[i]
        model.synchronize()
        torch.distributed.barrier()
        t0 = time.perf_counter()
        for k in range(n):
            x, y = batches[k % len(batches)]
            opt.zero_grad()
            spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
            opt.step()
        model.synchronize()
        return (time.perf_counter() - t0) / n

    for i in (0, 1):
        block(i, 2)  # warm-up: state allocated, first gathers
    pairs = []
    for b in range(blocks):
        order = (0, 1) if b % 2 == 0 else (1, 0)
        t = {i: block(i, steps) for i in order}
        pairs.append((t[0], t[1]))
    return {"pairs": pairs, "ratio_median": statistics.median(on / off for off, on in pairs)}


def _rows(args: argparse.Namespace) -> list[dict]:
    from gradsched.torch.jobs.selftest import spawn_local

    rows = []
    for model_name in args.models.split(","):
        for strategy in STRATEGIES:
            runs: dict[bool, list[list[dict]]] = {False: [], True: []}
            for _ in range(args.rounds):
                for sharded in (False, True):
                    runs[sharded].append(spawn_local(_one, args.ranks, model_name, strategy, sharded, args.steps,
                                                     args.blocks, timeout_s=600))
            side = spawn_local(_interleaved, args.ranks, model_name, strategy, args.steps, args.pairs,
                               timeout_s=600) if args.pairs else None
            for rank in range(args.ranks):
                off, on = runs[False][0][rank], runs[True][0][rank]
                t_off = statistics.median(t for r in runs[False] for t in r[rank]["times"])
                t_on = statistics.median(t for r in runs[True] for t in r[rank]["times"])
                rows.append({"model": model_name, "strategy": strategy, "rank": rank, "sharded_by": on["kind"],
                             "state_bytes_unsharded": off["state_bytes"], "state_bytes_sharded": on["state_bytes"],
                             "state_fraction": on["state_bytes"] / off["state_bytes"],
                             "rss_added_unsharded": off["rss_added"], "rss_added_sharded": on["rss_added"],
                             "rss_fraction": on["rss_added"] / max(off["rss_added"], 1),
                             "ideal_fraction": 1 / args.ranks, "step_s_median_unsharded": t_off,
                             "step_s_median_sharded": t_on, "step_ratio": t_on / t_off,
                             "interleaved_pairs_s": side[rank]["pairs"] if side else None,
                             "interleaved_ratio_median": side[rank]["ratio_median"] if side else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--pairs", type=int, default=6,
                    help="blocks of each, interleaved in the same processes, for the time ratio (0: none)")
    ap.add_argument("--out", default=str(ROOT / "results" / "sharded_optimizer.json"))
    args = ap.parse_args(argv)
    rows = _rows(args)
    print(f"{'model':6} {'strategy':8} {'rank':>4} {'by':>24} {'state':>7} {'rss':>6} {'ideal':>6} "
          f"{'step unsharded':>15} {'sharded':>9} {'ratio':>6} {'interleaved':>11}")
    for r in rows:
        print(f"{r['model']:6} {r['strategy']:8} {r['rank']:>4} {r['sharded_by']:>24} {r['state_fraction']:7.3f} "
              f"{r['rss_fraction']:6.3f} {r['ideal_fraction']:6.3f} {r['step_s_median_unsharded'] * 1e3:13.1f}ms "
              f"{r['step_s_median_sharded'] * 1e3:7.1f}ms {r['step_ratio']:5.3f}x "
              f"{r['interleaved_ratio_median'] or float('nan'):10.3f}x")
    result = {"benchmark": "sharded_optimizer", "ranks": args.ranks, "steps": args.steps, "blocks": args.blocks,
              "rounds": args.rounds, "load_1min_at_end": os.getloadavg()[0], "rows": rows,
              "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
