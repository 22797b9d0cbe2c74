"""Whole short jobs: the drop-in's default (run-time ``auto``) against PyTorch DDP's default, end to end.

    python benchmarks/auto_short_jobs.py [--models cnn,gpt2] [--steps 100,1000] [--pairs 3,1] [--variants default]

What a user pays: a job of ``steps`` steps from wrapping the model to the last step,
``gradsched.torch.DistributedDataParallel(module)`` (no plan: run-time ``auto`` with its
trials, docs/autotune.md) against ``torch.nn.parallel.DistributedDataParallel(module)``
(PyTorch's default buckets), 2 ranks, gloo over loopback, one compute thread per rank,
plain ``torch.optim.SGD`` (momentum) over ``model.parameters()`` as a DDP script has it.
The machine is shared, so the two take turns in the same processes, job after job
(``pairs`` pairs per job length, which one goes first alternating, after one short job of
each, unrecorded: a process's first job pays one-time costs, 8 s once); the ratio reported is the median
of the pairs' ratios (auto's job time / DDP's).  ``--variants`` adds ``auto``
(``strategy="auto"``: starts on ``wfbp``, re-plans allowed) and ``auto-off``
(``plan_options={"trials": "off"}``).  Target: at most 1.02.

Writes ``benchmarks/results/auto_short_jobs.json`` (``--out``): every job's time, the
plan each settled on and when, the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

TARGET = 1.02
VARIANTS = {"default": None, "auto": {"strategy": "auto"}, "auto-off": {"plan_options": {"trials": "off"}}}


def _job(model_name: str, variant: str, steps: int, batch_size: int, rank: int) -> dict:
    import torch

    import gradsched.torch as gt
    from gradsched.torch.jobs.models import build_model

    spec = build_model(model_name, seed=0)
    gen = torch.Generator().manual_seed(rank)
    batches = [spec.make_batch(batch_size, gen) for _ in range(8)]
    torch.distributed.barrier()
    t0 = time.perf_counter()
    if variant == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(spec.module)
    else:
        how = VARIANTS[variant] or {}
        model = gt.DistributedDataParallel(spec.module, how.get("strategy"), plan_options=how.get("plan_options"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step_s = []
    for k in range(steps):
        s0 = time.perf_counter()
        x, y = batches[k % 8]
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        opt.step()
        step_s.append(time.perf_counter() - s0)
    if variant != "ddp":
        model.synchronize()
    total = time.perf_counter() - t0
    out = {"variant": variant, "total_s": total, "step_median_s": statistics.median(step_s),
           "last_half_median_s": statistics.median(step_s[steps // 2:]),
           "step_s": [round(t, 5) for t in step_s]}
    tuner = getattr(model, "autotuner", None)
    if tuner is not None:
        sw = tuner.switches
        out.update(settled_on=sw[-1].strategy, settled_at=getattr(tuner, "settled_at", None), done=tuner.done,
                   switches=[(s.iteration, s.strategy, s.reason) for s in sw])
    return out


def _worker(rank: int, world: int, model_name: str, steps_list: list[int], pairs: list[int], variants: list[str],
            batch_size: int) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    for variant in ["ddp", *variants]:  # the first job of a process pays one-time costs (imports, first use)
        _job(model_name, variant, 3, batch_size, rank)
    rows = []
    for steps, n in zip(steps_list, pairs):
        for p in range(n):
            for variant in variants:
                order = ["ddp", variant] if p % 2 == 0 else [variant, "ddp"]
                jobs = {v: _job(model_name, v, steps, batch_size, rank) for v in order}
                rows.append({"model": model_name, "steps": steps, "pair": p, "first": order[0],
                             "ddp": jobs["ddp"], "auto": jobs[variant], "variant": variant,
                             "ratio": jobs[variant]["total_s"] / jobs["ddp"]["total_s"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    from gradsched.torch.jobs.selftest import spawn_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,gpt2")
    ap.add_argument("--steps", default="100,1000")
    ap.add_argument("--pairs", default="3,1", help="pairs of jobs per --steps entry (the last repeats)")
    ap.add_argument("--variants", default="default", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "auto_short_jobs.json"))
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    steps_list = [int(s) for s in args.steps.split(",")]
    pairs = [int(p) for p in args.pairs.split(",")]
    pairs = (pairs + pairs[-1:] * len(steps_list))[:len(steps_list)]
    load_before, t0 = os.getloadavg(), time.time()
    rows = []
    print(f"{'model':<6} {'steps':>5} {'variant':<9} {'DDP job s':>10} {'auto job s':>10} {'ratio':>7}  "
          f"pairs' ratios; settled on (iteration)", flush=True)
    for model in args.models.split(","):
        got = spawn_local(_worker, 2, model, steps_list, pairs, variants, args.batch_size, timeout_s=7200)[0]
        rows.extend(got)
        for steps in steps_list:
            for variant in variants:
                mine = [r for r in got if r["steps"] == steps and r["variant"] == variant]
                ratio = statistics.median(r["ratio"] for r in mine)
                settled = ", ".join(f"{r['auto'].get('settled_on')} ({r['auto'].get('settled_at')})" for r in mine)
                print(f"{model:<6} {steps:>5} {variant:<9} {statistics.median(r['ddp']['total_s'] for r in mine):10.2f} "
                      f"{statistics.median(r['auto']['total_s'] for r in mine):10.2f} {ratio:7.3f}  "
                      f"{' '.join(format(r['ratio'], '.3f') for r in mine)}; {settled}", flush=True)
    summary = {}
    for r in rows:
        summary.setdefault(f"{r['model']}/{r['steps']}/{r['variant']}", []).append(r["ratio"])
    medians = {k: statistics.median(v) for k, v in summary.items()}
    worst = max(medians.values())
    print(f"worst median ratio {worst:.3f} (target <= {TARGET}): {'met' if worst <= TARGET else 'MISSED'}; "
          f"load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    out = {"what": "whole jobs: gradsched's drop-in default (run-time auto) / PyTorch DDP's default, taking turns",
           "command": "python benchmarks/auto_short_jobs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "started": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(t0)), "wall_s": time.time() - t0,
           "load_average_before": load_before, "load_average_after": os.getloadavg(), "target": TARGET,
           "median_ratio": medians, "worst_median_ratio": worst, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
