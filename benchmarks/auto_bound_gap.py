"""Why ``auto``'s plan on the papers' models at 8 emulated hosts is predicted above the bench's lower bound, and
whether any plan the planners can make is predicted closer (no network: the simulator only, a minute or two a run).

    python benchmarks/auto_bound_gap.py [RUN.json ...]   # default: runs12's ResNet-50, BERT-Base, DenseNet-201

For each stored ``gradsched bench --json`` run, rebuilt as the bench predicted with (its profile, cluster and probe,
``benchmarks/plan_headroom.py`` reads them the same way; gradsched's plans with the executor's costs): the bound;
the plan the ``auto`` row ran, remade from its recorded options, and its prediction beside the row's; every
candidate of ``auto``'s search at the run's byte scale (``ranked``: the best of each strategy, and of each
``usbyte`` option set); ``dear`` with each of its groupings; ``usbyte`` with 1-24 groups of equal bytes; and, for
the best plan, where its step goes (the network's wait for its first operation, its busy time against the
bound's one all-reduce of all gradients, what runs after its last operation).  Writes
``benchmarks/results/auto_bound_gap.json`` (``--json``).  Times in emulated seconds (the run's, divided by its
dilation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gradsched.calibration import with_runtime_costs
from gradsched.cluster import Cluster
from gradsched.jobs.results import read_bench_row
from gradsched.plan import Plan
from gradsched.planners import make_plan
from gradsched.planners.auto import ranked
from gradsched.planners.registry import byte_scaled_options
from gradsched.profile import Profile
from gradsched.sim import simulate

RESULTS = Path(__file__).parent / "results"
RUNS = [RESULTS / f"emulate_papers_{name}_8h_runs12.json" for name in ("resnet50", "bert_base", "densenet201")]
GROUP_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24)


def _load(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any], float, Profile, Cluster, Profile]:
    rows = json.loads(path.read_text())
    first, dilate = read_bench_row(rows[0])  # run seconds: what the bench predicted with
    profile = Profile.from_dict(first["profile"]["measured"])
    cluster = Cluster.from_dict(first["cluster"])
    planned = with_runtime_costs(profile, first["contention"], False)  # gradsched's executor's costs
    return rows, first, dilate, profile, cluster, planned


def _sim(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    return simulate(plan, profile, cluster, timeline=False).iteration_s


def _breakdown(plan: Plan, profile: Profile, cluster: Cluster, dilate: float) -> dict[str, float]:
    r = simulate(plan, profile, cluster, timeline=False)
    return {"iteration_s": r.iteration_s / dilate, "first_op_start_s": min(r.op_start_s) / dilate,
            "comm_busy_s": r.comm_s / dilate, "after_last_op_s": (r.iteration_s - max(r.op_end_s)) / dilate,
            "operations": len(plan.operations)}


def analyse(path: Path) -> dict[str, Any]:
    rows, first, dilate, profile, cluster, planned = _load(path)
    scale = int(rows[0].get("scale_bytes") or 1)
    auto_row = next(r for r in rows if r["strategy"] == "auto")
    bound = first["lower_bound"]
    out: dict[str, Any] = {"run": path.stem, "dilate": dilate, "scale_bytes": scale,
                           "bound_s": bound["lower_bound_s"] / dilate,
                           "contention_bound_s": bound["contention_bound_s"] / dilate,
                           "allreduce_all_s": bound["allreduce_all_s"] / dilate,
                           "compute_s": bound["compute_s"] / dilate,
                           "auto_row": {"measured_s": auto_row["iteration_s_median"],
                                        "predicted_s": auto_row["predicted_iteration_s"],
                                        "chose": auto_row["plan_options"]["chose"],
                                        "options": auto_row["plan_options"]["chosen_options"],
                                        "operations": auto_row["operations"]}}
    chose, opts = auto_row["plan_options"]["chose"], dict(auto_row["plan_options"]["chosen_options"])
    ran = make_plan(chose, planned, cluster, **opts)
    out["auto_row"]["remade_s"] = _sim(ran, planned, cluster) / dilate
    out["auto_row"]["remade_operations"] = len(ran.operations)
    candidates: dict[str, dict[str, Any]] = {}
    for r in ranked(planned, cluster, byte_scale=scale):  # auto's search, every candidate, fastest first
        key = f"{r.strategy} {json.dumps(r.plan.options, sort_keys=True, default=str)}"
        candidates.setdefault(key, {"strategy": r.strategy, "predicted_s": r.predicted_s / dilate,
                                    "operations": len(r.plan.operations)})
    out["auto_candidates"] = sorted(candidates.values(), key=lambda c: c["predicted_s"])
    extra: dict[str, Plan] = {}
    for grouping in ("planned", "threshold", "nearby"):
        extra[f"dear grouping={grouping}"] = make_plan("dear", planned, cluster, **byte_scaled_options(
            "dear", {"grouping": grouping}, scale))
    extra["optimal"] = make_plan("optimal", planned, cluster)
    extra["usbyte groups=0"] = make_plan("usbyte", planned, cluster, **byte_scaled_options("usbyte", {"groups": 0},
                                                                                             scale))
    for k in GROUP_COUNTS:
        extra[f"usbyte groups={k}"] = make_plan("usbyte", planned, cluster, groups=k)
    out["plans"] = {name: {"predicted_s": _sim(p, planned, cluster) / dilate, "operations": len(p.operations)}
                    for name, p in extra.items()}
    best_name = min(out["plans"], key=lambda n: out["plans"][n]["predicted_s"])
    out["best"] = best_name
    out["best_breakdown"] = _breakdown(extra[best_name], planned, cluster, dilate)
    out["auto_breakdown"] = _breakdown(ran, planned, cluster, dilate)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=RUNS)
    ap.add_argument("--json", type=Path, default=RESULTS / "auto_bound_gap.json")
    args = ap.parse_args(argv)
    out = []
    for path in args.runs:
        r = analyse(path)
        out.append(r)
        b = r["bound_s"]
        row = r["auto_row"]
        print(f"{r['run']}: bound {b:.4f} s (contention bound {r['contention_bound_s']:.4f}, all-reduce of all "
              f"{r['allreduce_all_s']:.4f}, compute {r['compute_s']:.4f}); auto row {row['chose']} {row['options']}: "
              f"predicted {row['predicted_s']:.4f} ({row['predicted_s'] / b:.3f}x), remade {row['remade_s']:.4f}")
        for c in r["auto_candidates"][:6]:
            print(f"  auto candidate {c['strategy']:14s} {c['predicted_s']:.4f} ({c['predicted_s'] / b:.3f}x) "
                  f"{c['operations']} ops")
        for name, p in sorted(r["plans"].items(), key=lambda x: x[1]["predicted_s"]):
            print(f"  {name:26s} {p['predicted_s']:.4f} ({p['predicted_s'] / b:.3f}x) {p['operations']} ops")
        for label in ("auto", "best"):
            d = r[f"{label}_breakdown"]
            print(f"  {label} breakdown: first op at {d['first_op_start_s']:.4f}, network busy {d['comm_busy_s']:.4f}, "
                  f"after last op {d['after_last_op_s']:.4f}")
    args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "runs": out}, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
