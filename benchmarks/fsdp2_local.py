"""FSDP2 beside gradsched, measured in one run: PyTorch's ``fully_shard`` per block against gradsched's
plans and PyTorch DDP, on local gloo ranks (CPU).

One command::

    .venv/bin/python benchmarks/fsdp2_local.py        # writes benchmarks/results/fsdp2_local.json

Each rank trains the same model (``--model``, gradsched's job models) with AdamW for ``--steps``
steps per variant, the variants taking turns ``--rounds`` times (a load change on the shared
machine hits all alike); median step time per variant, and each variant's final parameters
against PyTorch DDP's (FSDP2's gathered with ``full_tensor()``).  FSDP2 is written as a user
would: ``fully_shard`` on each child module that owns parameters (a block), then on the root,
``reshard_after_forward=False`` (as ``gradsched advise --fsdp`` simulates it).  Loopback is
fast, so this measures the runtimes' own costs more than their scheduling: the network-bound
comparison is ``gradsched advise --fsdp`` (simulated).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VARIANTS = ("torch-ddp", "fsdp2", "dear", "wfbp", "usbyte")


def _model(name: str):
    from gradsched.torch import build_model

    return build_model(name, seed=0)


def _wrap(variant: str, spec):
    import torch
    from torch.distributed.fsdp import fully_shard

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer

    module = spec.module
    if variant == "fsdp2":
        for child in module.children():
            if any(p.requires_grad for p in child.parameters()):
                fully_shard(child, reshard_after_forward=False)
        fully_shard(module, reshard_after_forward=False)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        return module, opt, opt
    ddp = variant == "torch-ddp"
    model = DistributedDataParallel(module, "ddp" if ddp else variant, use_torch_ddp=ddp, timeout_s=60)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, DistributedOptimizer(inner, model), inner


def _params(module) -> list:
    out = []
    for p in module.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(t.detach().clone())
    return out


def _run(variant: str, model_name: str, steps: int) -> tuple[list[float], list]:
    import torch

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = _model(model_name)
    model, opt, _ = _wrap(variant, spec)
    gen = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        x, y = spec.make_batch(8 * world, gen)
        torch.distributed.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
        if hasattr(model, "synchronize"):
            model.synchronize()
        times.append(time.perf_counter() - t0)
    return times[2:], _params(spec.module)


def _job(rank: int, world: int, model_name: str, steps: int, rounds: int) -> dict:
    from gradsched.torch.jobs.selftest import rel_diff

    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    final = {}
    for _ in range(rounds):
        for v in VARIANTS:
            t, final[v] = _run(v, model_name, steps)
            times[v] += t
    return {v: {"step_s_median": statistics.median(times[v]), "rel_diff_vs_ddp": rel_diff(final[v], final["torch-ddp"])}
            for v in VARIANTS}


def main(argv: list[str] | None = None) -> int:
    from gradsched.torch.jobs.selftest import spawn_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "fsdp2_local.json"))
    args = ap.parse_args(argv)
    per_rank = spawn_local(_job, args.ranks, args.model, args.steps, args.rounds, timeout_s=300)
    rows = per_rank[0]
    base = rows["torch-ddp"]["step_s_median"]
    print(f"{args.model}, {args.ranks} local gloo ranks, AdamW: median step (rank 0)")
    for v, r in rows.items():
        print(f"  {v:10} {r['step_s_median'] * 1e3:8.1f} ms  {base / r['step_s_median']:5.2f}x torch DDP  "
              f"params vs DDP {r['rel_diff_vs_ddp']:.1e}")
    result = {"benchmark": "fsdp2_local", "model": args.model, "ranks": args.ranks, "steps": args.steps,
              "rounds": args.rounds, "rows": rows, "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
