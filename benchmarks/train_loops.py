"""What each way of writing the training loop costs with an overlapping plan (docs/runtime.md,
"Between backward() and step()").

    python benchmarks/train_loops.py [--model cnn] [--strategy usbyte] [--steps 20] [--rounds 3]

Two local ranks (gloo, loopback, one compute thread each) train ``--model`` under
``--strategy`` written five ways: a plain ``torch.optim`` optimizer (the plan waits at
the end of backward), ``DistributedOptimizer`` with nothing between ``backward()`` and
``step()`` (full overlap), with ``clip_grad_norm_`` there (the guard waits at the
clip), with ``clip_grad_norm=`` (clipped inside the deferred update), and PyTorch
DDP with ``clip_grad_norm_`` as the reference.  The configurations take turns in
every round (background load hits all alike); reported per configuration: the median
over rounds of each run's median step time, and the share of the plan's bytes still
being communicated when ``step()`` returns (what is left to overlap the next forward:
less dependent on machine load than times).  Writes benchmarks/results/train_loops.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS = ("torch-ddp+clip", "plain-optimizer", "dist-opt", "dist-opt+clip", "dist-opt+clip-option")
CLIP = 1.0


def _unfinished_fraction(model: Any) -> float:
    """Share of the plan's bytes whose operation is not complete (not issued, or issued and running)."""
    left, total = model.unfinished_bytes()
    return left / total


def _run(config: str, strategy: str, model_name: str, steps: int, warmup: int, batch: int) -> tuple[float, float]:
    """Median step time (s) of one configuration on this rank, and the median share of the plan's bytes
    still being communicated when ``step()`` returns (what overlaps the next forward)."""
    import torch
    import torch.distributed as dist

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    rank = dist.get_rank()
    spec = build_model(model_name, seed=0)
    ddp = config.startswith("torch-ddp")
    model = DistributedDataParallel(spec.module, "ddp" if ddp else strategy, use_torch_ddp=ddp)
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt: Any = inner
    if config.startswith("dist-opt"):
        opt = DistributedOptimizer(inner, model, **({"clip_grad_norm": CLIP} if config.endswith("option") else {}))
    clip = config.endswith("+clip")
    gen = torch.Generator().manual_seed(rank)
    times, left = [], []
    for step in range(warmup + steps):
        x, y = spec.make_batch(batch, gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            left.append(0.0 if ddp else _unfinished_fraction(model))
    if not ddp:
        model.synchronize()
    dist.barrier()
    return statistics.median(times), statistics.median(left)


def _job(rank: int, world: int, strategy: str, model: str, steps: int, warmup: int, batch: int,
         rounds: int) -> dict[str, list[tuple[float, float]]]:
    import torch

    torch.manual_seed(0)
    out: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    for _ in range(rounds):
        for c in CONFIGS:
            out[c].append(_run(c, strategy, model, steps, warmup, batch))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--strategy", default="usbyte")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "train_loops.json"))
    args = ap.parse_args(argv)
    from gradsched.torch.jobs.selftest import spawn_local

    t0 = time.time()
    results = spawn_local(_job, 2, args.strategy, args.model, args.steps, args.warmup, args.batch_size,
                          args.rounds, timeout_s=300)
    per_round = {c: [max(r[c][k][0] for r in results) for k in range(args.rounds)] for c in CONFIGS}
    rows = {c: statistics.median(v) for c, v in per_round.items()}
    left = {c: statistics.median(r[c][k][1] for r in results for k in range(args.rounds)) for c in CONFIGS}
    ref = rows["torch-ddp+clip"]
    print(f"{args.model}, {args.strategy}, 2 local ranks (gloo, loopback), batch {args.batch_size}/rank, "
          f"median of {args.rounds} rounds x {args.steps} steps")
    print(f"{'loop':22s} {'step ms':>8s} {'vs DDP+clip':>12s} {'in flight at step()':>20s} {'rounds ms':>20s}")
    for c, s in rows.items():
        rounds = " ".join(f"{x * 1e3:.0f}" for x in per_round[c])
        print(f"{c:22s} {s * 1e3:8.1f} {s / ref:11.2f}x {left[c]:19.0%} {rounds:>20s}")
    command = " ".join(["python benchmarks/train_loops.py"] + (argv if argv is not None else sys.argv[1:]))
    payload = {"command": command, "model": args.model,
               "strategy": args.strategy, "steps": args.steps, "rounds": args.rounds, "batch_size": args.batch_size,
               "step_s_median": rows, "per_round_s": per_round, "in_flight_at_step_fraction": left,
               "load_average_1min": os.getloadavg()[0],
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.time() - t0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
