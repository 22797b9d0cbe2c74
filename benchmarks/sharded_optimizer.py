"""Sharded optimizer state (``shard_optimizer=True``, ZeRO-1) against the same plan unsharded: Adam's state
per rank and the iteration time, measured side by side in one run on local gloo ranks.

One command::

    .venv/bin/python benchmarks/sharded_optimizer.py        # writes benchmarks/results/sharded_optimizer.json

For each model and strategy, each rank trains ``--steps`` steps with AdamW unsharded and sharded,
alternating blocks of steps (so a load change on the machine hits both alike); it reports this
rank's optimizer state bytes (``gradsched.torch.runtime.sharded.state_bytes``) as a fraction of
the unsharded state, against the ideal 1/p (ZeroRedundancyOptimizer partitions whole parameters,
so a model of few large tensors cannot split evenly), and the median step time of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MODELS = ("mlp", "cnn", "vgg")
STRATEGIES = ("dear", "wfbp")


def _one(model_name: str, strategy: str, sharded: bool, steps: int) -> tuple[list[float], int]:
    import torch

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model
    from gradsched.torch.runtime.sharded import state_bytes

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = build_model(model_name, seed=0)
    model = DistributedDataParallel(spec.module, strategy, timeout_s=60, shard_optimizer=sharded)
    opt = DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)
    gen = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        x, y = spec.make_batch(8 * world, gen)
        torch.distributed.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
        model.synchronize()
        times.append(time.perf_counter() - t0)
    return times[2:], state_bytes(opt.optimizer)  # the first steps allocate state and warm up


def _job(rank: int, world: int, steps: int, rounds: int) -> list[dict]:
    rows = []
    for model_name in MODELS:
        for strategy in STRATEGIES:
            times = {False: [], True: []}
            state = {}
            for _ in range(rounds):
                for sharded in (False, True):
                    t, state[sharded] = _one(model_name, strategy, sharded, steps)
                    times[sharded] += t
            rows.append({"model": model_name, "strategy": strategy, "rank": rank,
                         "state_bytes_unsharded": state[False], "state_bytes_sharded": state[True],
                         "state_fraction": state[True] / state[False], "ideal_fraction": 1 / world,
                         "step_s_median_unsharded": statistics.median(times[False]),
                         "step_s_median_sharded": statistics.median(times[True])})
    return rows


def main(argv: list[str] | None = None) -> int:
    from gradsched.torch.jobs.selftest import spawn_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "sharded_optimizer.json"))
    args = ap.parse_args(argv)
    per_rank = spawn_local(_job, args.ranks, args.steps, args.rounds, timeout_s=300)
    print(f"{'model':6} {'strategy':8} {'rank':>4} {'state unsharded':>16} {'sharded':>10} {'fraction':>9} "
          f"{'ideal':>6} {'step unsharded':>15} {'sharded':>9} {'ratio':>6}")
    for rows in zip(*per_rank):
        for r in rows:
            print(f"{r['model']:6} {r['strategy']:8} {r['rank']:>4} {r['state_bytes_unsharded']:>16,} "
                  f"{r['state_bytes_sharded']:>10,} {r['state_fraction']:9.3f} {r['ideal_fraction']:6.3f} "
                  f"{r['step_s_median_unsharded'] * 1e3:13.1f}ms {r['step_s_median_sharded'] * 1e3:7.1f}ms "
                  f"{r['step_s_median_sharded'] / r['step_s_median_unsharded']:5.2f}x")
    result = {"benchmark": "sharded_optimizer", "ranks": args.ranks, "steps": args.steps, "rounds": args.rounds,
              "rows": [r for rows in per_rank for r in rows], "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
