"""The drop-in's default against PyTorch DDP, side by side in one job: iteration time after the trials, and their cost.

    python benchmarks/dropin_default.py [--model cnn] [--nproc 2] [--block 8] [--rounds 8]

Whole jobs run one after another (``benchmarks/runtime_vs_ddp.py``) see the shared
machine's load change between them by more than the difference measured (iterations
1.5x apart from one 3-minute job to the next at load average 12-20).  Here both run in
the same processes, in short blocks that take turns:

1. ``gradsched.torch.DistributedDataParallel(module)`` (no plan: the default, run-time
   ``auto`` with PyTorch's DDP among its candidates) trains alone until its trials are
   decided (``autotuner.trials_done``); every step is timed ("tuning").
2. Then ``rounds`` times: ``block`` steps of ``torch.nn.parallel.DistributedDataParallel``
   on a copy of the model, and ``block`` steps of the default, alternating which goes
   first.  The first step of each block is left out (the other model's step ran just
   before).  Both use a plain ``torch.optim.SGD`` (momentum 0.9) over ``model.parameters()``,
   as a DDP script does, one compute thread per rank (gloo, loopback).

Reported: the medians of the two in phase 2 and their ratio (per round too), what the
default settled on, and the tuning phase's extra time over as many DDP iterations
(phase 2's DDP median): what the trials cost, once.  Writes
``benchmarks/results/dropin_default_paired_<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

MAX_TUNING_STEPS = 400


def _step(model, opt, spec, batch) -> float:
    t0 = time.perf_counter()
    opt.zero_grad()
    spec.loss_fn(model(batch[0]), batch[1]).backward()
    opt.step()
    return time.perf_counter() - t0


def _worker(rank: int, world: int, model_name: str, batch_size: int, block: int, rounds: int) -> dict:
    import torch

    import gradsched.torch as gt
    from gradsched.torch.jobs.models import build_model

    ours_spec, ref_spec = build_model(model_name, seed=0), build_model(model_name, seed=0)
    ours = gt.DistributedDataParallel(ours_spec.module)
    ref = torch.nn.parallel.DistributedDataParallel(ref_spec.module)
    ours_opt = torch.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    batches = [ours_spec.make_batch(batch_size, gen) for _ in range(8)]
    tuning = []
    while not ours.autotuner.trials_done and len(tuning) < MAX_TUNING_STEPS:
        tuning.append(_step(ours, ours_opt, ours_spec, batches[len(tuning) % 8]))
    pairs = []
    for r in range(rounds):
        order = [("ref", ref, ref_opt, ref_spec), ("ours", ours, ours_opt, ours_spec)]
        times: dict[str, list[float]] = {}
        for name, model, opt, spec in (order if r % 2 == 0 else order[::-1]):
            times[name] = [_step(model, opt, spec, batches[k % 8]) for k in range(block)][1:]
        pairs.append(times)
    sw = ours.autotuner.switches
    return {"tuning_s": tuning, "pairs": pairs, "settled_on": sw[-1].strategy, "settled_at": sw[-1].iteration,
            "switches": [(s.iteration, s.strategy, s.reason) for s in sw]}


def main(argv: list[str] | None = None) -> int:
    from gradsched.torch.jobs.selftest import spawn_local

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--block", type=int, default=8, help="steps per block (the first is not counted)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    t0 = time.time()
    res = spawn_local(_worker, args.nproc, args.model, args.batch_size, args.block, args.rounds, timeout_s=600)[0]
    ref = [t for p in res["pairs"] for t in p["ref"]]
    ours = [t for p in res["pairs"] for t in p["ours"]]
    ref_s, ours_s = statistics.median(ref), statistics.median(ours)
    per_round = [statistics.median(p["ours"]) / statistics.median(p["ref"]) for p in res["pairs"]]
    extra_s = sum(res["tuning_s"]) - len(res["tuning_s"]) * ref_s
    out = {"what": "the drop-in's default (no plan) against PyTorch DDP, blocks taking turns in one job",
           "command": "python benchmarks/dropin_default.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": args.model, "nproc": args.nproc, "batch_size": args.batch_size, "block": args.block,
           "rounds": args.rounds, "started": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(t0)),
           "wall_s": time.time() - t0, "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "torch_ddp_median_s": ref_s, "default_median_s": ours_s, "ratio_default_vs_torch_ddp": ours_s / ref_s,
           "ratio_per_round": per_round, "settled_on": res["settled_on"], "settled_at": res["settled_at"],
           "tuning_steps": len(res["tuning_s"]), "tuning_mean_s": statistics.fmean(res["tuning_s"]),
           "tuning_extra_s": extra_s, "tuning_extra_ddp_iterations": extra_s / ref_s,
           "switches": res["switches"], "pairs": res["pairs"], "tuning_s": res["tuning_s"]}
    print(f"{args.model}, {args.nproc} ranks (gloo, loopback), batch {args.batch_size}/rank; {args.rounds} rounds of "
          f"{args.block}-step blocks taking turns, after the default's {len(res['tuning_s'])} tuning steps")
    print(f"  PyTorch DDP       {ref_s * 1e3:8.1f} ms  (median)")
    print(f"  default           {ours_s * 1e3:8.1f} ms  {ours_s / ref_s:.3f}x  settled on {res['settled_on']} at "
          f"iteration {res['settled_at']}")
    print("  per round         " + " ".join(f"{x:.3f}" for x in per_round))
    print(f"  tuning: {len(res['tuning_s'])} steps, {extra_s:.1f} s more than as many DDP steps "
          f"({extra_s / ref_s:.1f} DDP iterations)")
    print(f"  load average before {load_before[0]:.1f}, after {out['load_average_after'][0]:.1f}")
    path = Path(args.out or Path(__file__).parent / "results" / f"dropin_default_paired_{args.model}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
