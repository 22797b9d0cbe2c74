"""Kept 8-host runs' ``dear`` plans predicted again: the reduce-scatter and all-gather priced as the cluster derives
them now (the job's table timed the all-reduce only) against what each ran.

    python benchmarks/dear_trials.py [RUN.json ...] [--json benchmarks/results/dear_trials.json]
    python benchmarks/dear_trials.py --half   # the rule before: each phase half the all-reduce
    python benchmarks/dear_trials.py --as-bench [--ratios RS,AG]   # the cluster as ``gradsched bench`` prices now

``--as-bench`` (err10): the job's own table (fitted up to the model's size, where the default reading refits the line
from the medians below 2 MiB, 22-33% less a byte on the six runs), anchored to the probe's least all-reduce of every
gradient, with the stream cost and the phases at the ratios measured alone
(``predict_fixes.py``'s reading "err10": :func:`gradsched.jobs.bench.with_phase_ratios`); ``--ratios`` overrides them.

Each run's ``dear`` plan is the one with the hash it ran (run-time ``auto``'s trial, in the ``auto`` row's
``autotune.trial_decision``; or the row's own plan where ``auto`` planned ``dear`` at start-up), found among
``dear``'s candidate groupings (``resimulate.dear_as_run``) and simulated on the job's cluster and probe as
``benchmarks/resimulate.py`` reads them.  Prints per run the measured median of the trial's windows (or the row's),
the prediction the job made, and the one made now.  No network: seconds.

Run-time ``auto`` planned its trials from its own profiled steps, so their hashes are not among the start-up
profile's candidates: those are ``dear``'s plan on the start-up profile, planned with the phases as the job derived
them (half), and "now" differs from "then" by that too: compare ``--half`` (the old rule, same plan) with the
default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from resimulate import dear_as_run, reread_cluster, refit_contention

from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import Cluster
from gradsched.jobs.results import read_bench_row
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [RESULTS / f"emulate_papers_{name}.json" for name in
                ("bert_base_8h_ovh9", "bert_base_8h_start8", "densenet201_8h_runs9", "vgg16_8h_runs9",
                 "vgg16_8h_runs9b", "bert_large_8h_start8")]


def dear_runs(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """``(plan hash, measured s, predicted s then)`` of each ``dear`` plan the run ran: run-time ``auto``'s
    trials (median of its windows) and rows that ran ``dear`` for the whole job."""
    out = []
    for row in rows:
        chose = (row.get("plan_options") or {}).get("chose")
        if row["strategy"] == "dear" or (row["strategy"] == "auto" and chose == "dear"):
            out.append((row["plan_hash"], row["iteration_s_median"], row["predicted_iteration_s"]))
        trials = (row.get("autotune") or {}).get("trial_decision") or {}
        for h, name in (trials.get("plans") or {}).items():
            if name == "dear":
                then = [s["predicted_iteration_s"] for s in row["autotune"]["switches"] if s["plan_hash"] == h]
                out.append((h, trials["measured"][h], then[0] if then else float("nan")))
    return out


def with_ratios(cluster: Cluster, reducescatter: float, allgather: float) -> Cluster:
    """``cluster`` with its derived reduce-scatter and all-gather at these ratios over half the all-reduce."""
    return dataclasses.replace(cluster, extra={**cluster.extra, "derived_phase_ratios": {
        "reducescatter": reducescatter, "allgather": allgather}})


def as_half(cluster: Cluster) -> Cluster:
    """``cluster`` with the reduce-scatter and all-gather derived as before: half the all-reduce each."""
    return with_ratios(cluster, 1.0, 1.0)


def predict(path: Path, half: bool, ratios: tuple[float, float] | None = None,
            as_bench: bool = False) -> list[dict[str, Any]]:
    rows = json.loads(path.read_text())
    first, dilate = read_bench_row(rows[0])
    profile = Profile.from_dict(first["profile"]["measured"])
    probe = first["contention"]
    job = Cluster.from_dict(first["cluster"])
    if as_bench:
        from predict_fixes import bench_reading

        now = bench_reading(first)
    else:
        now = refit_contention(reread_cluster(job), probe, bool((probe or {}).get("history")))
    if half:
        now = as_half(now)
    elif ratios is not None:
        now = with_ratios(now, *ratios)
    compute_s = first["compute_only"]["iteration_s_median"]
    planned = with_runtime_costs(profile, probe, False)
    scaled = with_runtime_costs(calibrate(profile, compute_s), probe, False)
    out = []
    for plan_hash, measured, then in dear_runs(rows):
        plan = dear_as_run({"plan_hash": plan_hash, "plan_options": {}}, planned, as_half(job))
        found = plan is not None and plan.hash == plan_hash
        if not found:  # run-time auto planned from its own profiled steps: dear's plan on the start-up profile
            plan = make_plan("dear", planned, as_half(job))
        predicted = simulate(plan, scaled, now, timeline=False).iteration_s / dilate
        out.append({"run": path.stem, "plan_hash": plan_hash, "operations": len(plan.operations), "same_plan": found,
                    "measured_s": measured, "predicted_then_s": then, "predicted_now_s": predicted,
                    "error_then": (then - measured) / measured, "error_now": (predicted - measured) / measured})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--half", action="store_true", help="derive each phase as half the all-reduce (the rule before)")
    ap.add_argument("--ratios", default=None, metavar="RS,AG",
                    help="derive the phases at these ratios over half the all-reduce instead of the cluster's")
    ap.add_argument("--as-bench", action="store_true",
                    help="read the cluster as gradsched bench prices now (anchored, measured phase ratios)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and medians here")
    args = ap.parse_args(argv)
    ratios = tuple(float(x) for x in args.ratios.split(",")) if args.ratios else None
    rows = [r for p in args.runs for r in predict(p, args.half, ratios, args.as_bench)]  # type: ignore[arg-type]
    if not rows:
        print("no dear plan ran in these runs (neither a dear row nor a run-time auto trial of dear)")
        return 0
    print(f"{'run':40s} {'ops':>4s} {'measured':>9s} {'then':>9s} {'now':>9s} {'err then':>9s} {'err now':>8s}")
    for r in rows:
        print(f"{r['run']:40s} {r['operations']:4d} {r['measured_s'] * 1e3:9.1f} {r['predicted_then_s'] * 1e3:9.1f} "
              f"{r['predicted_now_s'] * 1e3:9.1f} {r['error_then'] * 100:+8.1f}% {r['error_now'] * 100:+7.1f}%")
    then = statistics.median(abs(r["error_then"]) for r in rows)
    now = statistics.median(abs(r["error_now"]) for r in rows)
    print(f"median |error|: {then * 100:.1f}% then, {now * 100:.1f}% now, {len(rows)} dear plans")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "half": args.half,
                                         "ratios": ratios, "as_bench": args.as_bench,
                                         "runs": [str(p.resolve().relative_to(ROOT)) for p in args.runs],
                                         "median_abs_error_then": then, "median_abs_error_now": now,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
