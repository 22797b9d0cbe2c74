"""gradsched's executor against real PyTorch DDP: iteration time per strategy.

    python benchmarks/runtime_vs_ddp.py [--model cnn] [--nproc 2] [--steps 30] [--rounds 3]

Every configuration runs ``gradsched train`` (workers under ``torch.distributed.run``
on loopback, one compute thread each); rounds are interleaved so that background
load hits all configurations alike, and the figure reported is the median over
rounds of each run's median iteration time.  The key row is ``ddp-plan``: the
``ddp`` planner's buckets (PyTorch DDP's own rule) executed by gradsched, which
should stay within 5% of ``torch-ddp``.  Writes benchmarks/results/runtime_vs_ddp.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gradsched.commands.train import _config, launch, register

CONFIGS = [("torch-ddp", "ddp", []), ("ddp-plan", "ddp", ["--no-torch-ddp"]), ("wfbp", "wfbp", []),
           ("mgwfbp", "mgwfbp", []), ("sync", "sync", []), ("bytescheduler", "bytescheduler", []),
           ("usbyte", "usbyte", [])]


def run_once(model: str, strategy: str, extra: list[str], nproc: int, steps: int, batch: int) -> dict:
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    args = ap.parse_args(["train", "--model", model, "--strategy", strategy, "--nproc", str(nproc), "--steps",
                          str(steps), "--warmup", "5", "--batch-size", str(batch)] + extra)
    with tempfile.TemporaryDirectory() as tmp:
        code, out = launch(_config(args, tmp), nproc)
        if code != 0:
            raise SystemExit(f"{strategy} failed:\n{out[-3000:]}")
        return json.loads(Path(tmp, "result.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn", help="compute-bound by default (cnn)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated labels to run (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "runtime_vs_ddp.json"))
    args = ap.parse_args(argv)
    configs = [c for c in CONFIGS if not args.only or c[0] in args.only.split(",")]
    medians: dict[str, list[float]] = {label: [] for label, _, _ in configs}
    t0 = time.time()
    for r in range(args.rounds):
        for label, strategy, extra in configs:
            res = run_once(args.model, strategy, extra, args.nproc, args.steps, args.batch_size)
            medians[label].append(res["iteration_s_median"])
            print(f"round {r + 1}/{args.rounds} {label:14s} {res['iteration_s_median'] * 1e3:8.1f} ms", file=sys.stderr)
    ref = statistics.median(medians["torch-ddp"]) if "torch-ddp" in medians else None
    rows = []
    print(f"\n{args.model}, {args.nproc} ranks (gloo, loopback), batch {args.batch_size}/rank, {args.steps} steps, "
          f"median of {args.rounds} rounds")
    print(f"{'strategy':14s} {'iteration ms':>12s} {'vs torch-ddp':>12s}   per-round medians (ms)")
    for label, _, _ in configs:
        m = statistics.median(medians[label])
        ratio = m / ref if ref else None
        rows.append({"label": label, "iteration_s_median": m, "ratio_vs_torch_ddp": ratio, "rounds_s": medians[label]})
        print(f"{label:14s} {m * 1e3:12.1f} {('%.3f' % ratio) if ratio else '-':>12s}   "
              + " ".join(f"{x * 1e3:.1f}" for x in medians[label]))
    out = {"model": args.model, "nproc": args.nproc, "steps": args.steps, "batch_size": args.batch_size,
           "rounds": args.rounds, "wall_s": time.time() - t0, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
