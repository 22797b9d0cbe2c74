"""Soak: thousands of steps of run-time ``auto`` re-planning on 2 local ranks, watched for a hang,
memory growth and ranks drifting apart.

    python benchmarks/soak.py [--steps 5000] [--model mlp] [--nproc 2]

Each rank trains with ``DistributedDataParallel(model, "auto")`` tuned to check and
re-plan often (a check every ``--patience`` steps, every check acting: threshold
1e-9, up to ``--max-replans`` re-plans), so plans switch many times while the
executor, its buffers, hooks and progress threads are rebuilt.  Every rank samples
its resident memory (``VmRSS`` from ``/proc/self/status``) every ``--sample`` steps.

Reported per rank: plan switches, RSS after warm-up (the median of the samples in
the second tenth of the run), the largest RSS after it, and the growth between the
two; at the end every rank's parameters are compared with rank 0's, bit for bit.
Pass: no hang (the run ends within its timeout), growth <= 2%, parameters equal.
Writes benchmarks/results/soak.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

GROWTH_LIMIT = 0.02


def rss_bytes() -> int:
    """This process's resident memory now (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def soak(rank: int, world: int, model_name: str, steps: int, patience: int, max_replans: int, sample: int) -> dict:
    import torch
    import torch.distributed as dist

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    spec = build_model(model_name, seed=0)
    options = {"switch_iteration": 3, "patience": patience, "replan_threshold": 1e-9,
               "max_replans": max_replans, "trials": 2, "trial_iterations": 2, "trial_rounds": 1}
    model = DistributedDataParallel(spec.module, "auto", plan_options=options, timeout_s=120)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model)
    gen = torch.Generator().manual_seed(1)
    samples: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = spec.make_batch(8 * world, gen)
        opt.zero_grad()
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
        if step % sample == 0:
            samples.append((step, rss_bytes()))
    model.synchronize()
    seconds = time.perf_counter() - t0
    flat = torch.cat([p.detach().reshape(-1) for p in spec.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    tuner = model.autotuner
    return {"rank": rank, "samples": samples, "seconds": seconds,
            "switches": len(tuner.switches) if tuner is not None else 0,
            "strategies": sorted({s.strategy for s in tuner.switches}) if tuner is not None else [],
            "params_equal_to_rank0": bool(torch.equal(gathered[0], flat))}


def growth(samples: list[tuple[int, int]], steps: int) -> dict:
    """RSS after warm-up (median over the second tenth of the run), the peak after it, and the growth."""
    warm = [r for s, r in samples if steps // 10 <= s < steps // 5] or [samples[0][1]]
    base = statistics.median(warm)
    later = [r for s, r in samples if s >= steps // 5] or [base]
    peak = max(later)
    return {"rss_after_warmup_mb": base / 2**20, "rss_peak_after_mb": peak / 2**20, "growth": peak / base - 1}


def main(argv: list[str] | None = None) -> int:
    from gradsched.torch.jobs.selftest import spawn_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--patience", type=int, default=25, help="steps per check (each check re-plans)")
    ap.add_argument("--max-replans", type=int, default=100)
    ap.add_argument("--sample", type=int, default=10, help="steps between RSS samples")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    args = ap.parse_args(argv)
    t0 = time.time()
    ranks = spawn_local(soak, args.nproc, args.model, args.steps, args.patience, args.max_replans, args.sample,
                        timeout_s=600)
    rows = [{**{k: r[k] for k in ("rank", "switches", "strategies", "seconds", "params_equal_to_rank0")},
             **growth(r["samples"], args.steps), "samples": r["samples"]} for r in ranks]
    ok = all(r["growth"] <= GROWTH_LIMIT and r["params_equal_to_rank0"] for r in rows)
    print(f"soak: {args.model}, {args.nproc} ranks, {args.steps} steps of run-time auto "
          f"(check every {args.patience}, up to {args.max_replans} re-plans), {time.time() - t0:.0f} s")
    print(f"{'rank':>4} {'switches':>8} {'RSS warm (MB)':>14} {'peak after':>11} {'growth':>7} {'params = rank 0':>15}")
    for r in rows:
        print(f"{r['rank']:>4} {r['switches']:>8} {r['rss_after_warmup_mb']:>14.1f} {r['rss_peak_after_mb']:>11.1f} "
              f"{r['growth'] * 100:>6.2f}% {str(r['params_equal_to_rank0']):>15}")
    print(f"strategies run: {', '.join(sorted({s for r in rows for s in r['strategies']}))}")
    print("PASS" if ok else f"FAIL (limit: growth <= {GROWTH_LIMIT:.0%}, parameters equal on every rank)")
    Path(args.out).write_text(json.dumps({"command": " ".join(["python", "benchmarks/soak.py", *(argv or sys.argv[1:])]),
                                          "model": args.model, "nproc": args.nproc, "steps": args.steps,
                                          "patience": args.patience, "max_replans": args.max_replans,
                                          "growth_limit": GROWTH_LIMIT, "pass": ok, "ranks": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
