"""gradsched's executor against real PyTorch DDP: iteration time per strategy.

    python benchmarks/runtime_vs_ddp.py [--model cnn] [--nproc 2] [--steps 30] [--rounds 3]

Every configuration runs ``gradsched train`` (workers under ``torch.distributed.run``
on loopback, one compute thread each); rounds are interleaved so that background
load hits all configurations alike, and the figure reported is the median over
rounds of each run's median iteration time.  The key row is ``ddp-plan``: the
``ddp`` planner's buckets (PyTorch DDP's own rule) executed by gradsched, which
should stay within 5% of ``torch-ddp``.  Writes benchmarks/results/runtime_vs_ddp.json.

``default`` is the drop-in's default when no plan is named (run-time ``auto`` starting
on DDP's buckets, PyTorch's DDP among its candidates, no re-plans after the trials;
``--opt initial=ddp --opt max_replans=0``, what ``DEFAULT_OPTIONS`` sets).  Its jobs need enough
``--steps`` to get past the trials
(about 110 iterations on ``cnn``): its rows add the median after its last switch
(``after_switch_s``: what it settles on against DDP), the mean over every timed step
(``mean_s``: the trials' cost included) and what it settled on per round.

    python benchmarks/runtime_vs_ddp.py --only torch-ddp,default --steps 160 --rounds 3 \
        --out benchmarks/results/dropin_default_auto_cnn.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gradsched.commands.train import _config, launch, register

CONFIGS = [("torch-ddp", "ddp", []), ("ddp-plan", "ddp", ["--no-torch-ddp"]), ("wfbp", "wfbp", []),
           ("mgwfbp", "mgwfbp", []), ("sync", "sync", []), ("bytescheduler", "bytescheduler", []),
           ("usbyte", "usbyte", []), ("default", "auto", ["--opt", "initial=ddp", "--opt", "max_replans=0"])]


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


def load_average() -> str:
    """The 1, 5 and 15 minute load averages now (the machine is shared: say how loaded it was)."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def job_extras(res: dict) -> dict:
    """Per job: the mean of every timed step and, for auto, the median after its last switch and what it chose."""
    timed = res["iteration_s"][res["warmup_steps"]:] or res["iteration_s"]
    out = {"mean_s": statistics.fmean(timed)}
    if "autotune" in res:
        out["after_switch_s"] = res["measured_iteration_s_after_switch"]
        last = res["autotune"]["switches"][-1]
        out["settled_on"] = last["strategy"]
        out["settled_at"] = last["iteration"]
    return out


def summarise(jobs: list[dict]) -> dict:
    """Medians over rounds of the per-job extras."""
    out: dict = {"mean_s_median": statistics.median(j["mean_s"] for j in jobs), "mean_s_rounds": [j["mean_s"] for j in jobs]}
    if jobs and "after_switch_s" in jobs[0]:
        out["after_switch_s_rounds"] = [j["after_switch_s"] for j in jobs]
        out["after_switch_s_median"] = statistics.median(j["after_switch_s"] for j in jobs)
        out["settled_on"] = [j["settled_on"] for j in jobs]
        out["settled_at"] = [j["settled_at"] for j in jobs]
    return out


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
    extras: dict[str, list[dict]] = {label: [] for label, _, _ in configs}
    t0 = time.time()
    loads = [load_average()]
    for r in range(args.rounds):
        for label, strategy, extra in configs:
            res = run_once(args.model, strategy, extra, args.nproc, args.steps, args.batch_size)
            medians[label].append(res["iteration_s_median"])
            extras[label].append(job_extras(res))
            print(f"round {r + 1}/{args.rounds} {label:14s} {res['iteration_s_median'] * 1e3:8.1f} ms", file=sys.stderr)
        loads.append(load_average())
    ref = statistics.median(medians["torch-ddp"]) if "torch-ddp" in medians else None
    rows = []
    print(f"\n{args.model}, {args.nproc} ranks (gloo, loopback), batch {args.batch_size}/rank, {args.steps} steps, "
          f"median of {args.rounds} rounds")
    print(f"{'strategy':14s} {'iteration ms':>12s} {'vs torch-ddp':>12s}   per-round medians (ms)")
    for label, _, _ in configs:
        m = statistics.median(medians[label])
        ratio = m / ref if ref else None
        rows.append({"label": label, "iteration_s_median": m, "ratio_vs_torch_ddp": ratio, "rounds_s": medians[label],
                     **summarise(extras[label])})
        print(f"{label:14s} {m * 1e3:12.1f} {format(ratio, '.3f') if ratio else '-':>12s}   "
              + " ".join(f"{x * 1e3:.1f}" for x in medians[label]))
    ref_mean = rows[[r["label"] for r in rows].index("torch-ddp")]["mean_s_median"] if ref else None
    for row in rows:
        if ref_mean:
            row["mean_ratio_vs_torch_ddp"] = row["mean_s_median"] / ref_mean
        if ref and "after_switch_s_median" in row:
            row["after_switch_ratio_vs_torch_ddp"] = row["after_switch_s_median"] / ref
            print(f"{row['label']}: after its last switch {row['after_switch_s_median'] * 1e3:.1f} ms "
                  f"({row['after_switch_ratio_vs_torch_ddp']:.3f}x torch-ddp's median), settled on "
                  f"{', '.join(row['settled_on'])} at iterations {row['settled_at']}; mean of every timed step "
                  f"{row['mean_ratio_vs_torch_ddp']:.3f}x torch-ddp's (the trials' cost included)")
    print(f"load average (1, 5, 15 min) before each round and at the end: {' | '.join(loads)}")
    out = {"model": args.model, "nproc": args.nproc, "steps": args.steps, "batch_size": args.batch_size,
           "rounds": args.rounds, "wall_s": time.time() - t0, "load_average_by_round": loads, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
