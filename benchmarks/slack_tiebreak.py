"""``auto``'s slack tie-break checked offline on kept bench runs: which plan it picks, how busy the link is.

    python benchmarks/slack_tiebreak.py [RUN.json ...]   # default: the 8-host replays and GoogLeNet's 2-8 hosts

For each ``gradsched bench --json`` file, ``auto`` is planned again from the job's own profile and
cluster (``resimulate.plan_as_run``'s way: the measured profile with the runtime's costs, the job's
table and contention) with ``slack=0`` (the fastest predicted, as before) and with the measured
``slack`` (``planners/_slack.py``), and the run's PyTorch DDP row (its buckets) beside them.  Per plan:
operations, predicted iteration (the bench's way: the profile calibrated to the compute-only row),
seconds the channel is busy before the backward ends, and the iteration predicted with communication
during compute ``STRETCH`` times slower (the contention's ``comm_slowdown`` raised: how a plan fares
where the link slows during the backward, as on 8 ranks sharing 2 cores).  Then, for every stored
row (each run's own plan), the median and worst |error| of the prediction as the job made it and
with that stretch (option (b) of the brief: does a measured factor bring the predictions closer?).
Emulated milliseconds throughout.  Writes ``benchmarks/results/slack_tiebreak.json``.  No network.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import Cluster, Contention
from gradsched.jobs.results import read_bench_row
from gradsched.plan import Plan
from gradsched.planners import make_plan
from gradsched.planners._slack import SLACK_TOLERANCE, busy_in_backward_s
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resimulate import plan_as_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
STRETCHES = (1.1, 1.25, 1.5)  # communication during compute this many times slower than the job's contention says
DEFAULT_RUNS = sorted(RESULTS.glob("emulate_papers_*_8h*.json")) + [
    RESULTS / "bench_resnet50_8h_short_warmup.json", RESULTS / "bench_default_googlenet_k80_d20_2h.json",
    *(RESULTS / f"bench_replay_googlenet_k80_{h}h.json" for h in (2, 4, 8))]


def slowed(cluster: Cluster, factor: float) -> Cluster:
    """``cluster`` with communication during compute ``factor`` times slower than its contention says."""
    c = cluster.contention or Contention()
    return dataclasses.replace(cluster, contention=dataclasses.replace(
        c, comm_slowdown=(1 + c.comm_slowdown) * factor - 1))


def figures(plan: Plan, profile: Profile, cluster: Cluster, dilate: float) -> dict[str, Any]:
    """One plan's operations, prediction, busy seconds before the backward ends, and stretched predictions."""
    r = simulate(plan, profile, cluster, timeline=False)
    out = {"operations": len(plan.operations), "predicted_ms": r.iteration_s / dilate * 1e3,
           "backward_end_ms": r.backward_end_s / dilate * 1e3,
           "busy_in_backward_ms": busy_in_backward_s(r.op_start_s, r.op_end_s, r.backward_end_s) / dilate * 1e3}
    for f in STRETCHES:
        out[f"predicted_x{f:g}_ms"] = simulate(plan, profile, slowed(cluster, f), timeline=False).iteration_s / dilate * 1e3
    return out


def check(path: Path) -> dict[str, Any]:
    """The run's DDP row and ``auto`` at slack 0 and the default, planned again; every row's errors."""
    rows = json.loads(path.read_text())
    first, dilate = read_bench_row(rows[0])
    profile = Profile.from_dict(first["profile"]["measured"])
    probe, job = first["contention"], Cluster.from_dict(first["cluster"])
    scaled = with_runtime_costs(calibrate(profile, first["compute_only"]["iteration_s_median"]), probe, False)
    planned = with_runtime_costs(profile, probe, False)
    out: dict[str, Any] = {"run": str(path.relative_to(ROOT)), "hosts": first.get("hosts"), "plans": {}, "rows": []}
    ddp = next((r for r in rows if r["strategy"] == "ddp"), None)
    if ddp is not None:
        out["plans"]["ddp (the run's)"] = figures(plan_as_run(ddp, profile, probe, job), scaled, job, dilate)
    for slack in (0.0, SLACK_TOLERANCE):
        p = make_plan("auto", planned, job, slack=slack)
        out["plans"][f"auto slack={slack:g}"] = {"chose": p.options["chose"], "chosen_options":
                                                 p.options["chosen_options"], **figures(p, scaled, job, dilate)}
    for row in rows:
        plan = plan_as_run(row, profile, probe, job)
        row_profile = with_runtime_costs(calibrate(profile, first["compute_only"]["iteration_s_median"]), probe,
                                         row["runs"] == "torch DDP")
        measured = row["iteration_s_median"]
        errs = {"job": row["prediction_error"]}
        for f in (1.0, *STRETCHES):
            pred = simulate(plan, row_profile, slowed(job, f), timeline=False).iteration_s / dilate
            errs[f"x{f:g}"] = (pred - measured) / measured
        out["rows"].append({"strategy": row["strategy"], "measured_ms": measured * 1e3, "errors": errs})
    return out


def main(argv: list[str]) -> int:
    runs = [Path(a) for a in argv] or DEFAULT_RUNS
    checked = [check(p.resolve()) for p in runs if p.exists()]
    for c in checked:
        print(c["run"])
        for label, f in c["plans"].items():
            what = f" {f['chose']} {f['chosen_options']}" if "chose" in f else ""
            print(f"  {label:18s} ops {f['operations']:3d} pred {f['predicted_ms']:7.1f} busy {f['busy_in_backward_ms']:6.1f}"
                  f" of {f['backward_end_ms']:6.1f}  x1.25 {f['predicted_x1.25_ms']:7.1f}  x1.5 {f['predicted_x1.5_ms']:7.1f}"
                  f"{what}"[:200])
    summary = {}
    for key in ("job", "x1", *(f"x{f:g}" for f in STRETCHES)):
        errs = [abs(r["errors"][key]) for c in checked for r in c["rows"]]
        summary[key] = {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs), "rows": len(errs)}
        print(f"rows' |error| ({key}): median {summary[key]['median_abs_error'] * 100:.1f}%, "
              f"worst {summary[key]['max_abs_error'] * 100:.1f}% ({len(errs)} rows)")
    (RESULTS / "slack_tiebreak.json").write_text(json.dumps(
        {"command": " ".join(["python", "benchmarks/slack_tiebreak.py", *argv]), "slack": SLACK_TOLERANCE,
         "stretches": STRETCHES, "runs": checked, "errors": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
