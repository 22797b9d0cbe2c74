"""Planner and simulator speed on a synthetic 1,000-tensor profile, at 8 and 1,024 workers.

    python benchmarks/planner_speed.py [--tensors 1000] [--repeat 7] [--json benchmarks/results/planner_speed.json]

Targets (issue 2): each planner except auto < 50 ms, one simulation < 20 ms, auto < 2 s,
the same at 1,024 workers.  Prints a table of medians and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gradsched.cluster import Cluster
from gradsched.planners import make_plan, strategy_names
from gradsched.sim import simulate
from gradsched.synthetic import synthetic_profile

TARGET_PLAN_S, TARGET_SIM_S, TARGET_AUTO_S = 0.050, 0.020, 2.0


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--density", type=float, default=0.01, help="density for sparse strategies and auto")
    ap.add_argument("--json", default="benchmarks/results/planner_speed.json")
    args = ap.parse_args()
    profile = synthetic_profile(args.tensors)
    base = Cluster.alpha_beta(2e-4, 1e-9, 8)
    rows = []
    for workers in (8, 1024):
        cluster = base.at_world_size(workers)
        for name in strategy_names():
            opts = {"density": args.density} if name in ("topk", "omgs", "auto") else {}
            repeat = max(1, args.repeat // 3) if name == "auto" else args.repeat
            plan_s = median_time(lambda: make_plan(name, profile, cluster, **opts), repeat)
            plan = make_plan(name, profile, cluster, **opts)
            sim_s = median_time(lambda: simulate(plan, profile, cluster, timeline=False), args.repeat)
            sim_tl_s = median_time(lambda: simulate(plan, profile, cluster), args.repeat)
            target = TARGET_AUTO_S if name == "auto" else TARGET_PLAN_S
            rows.append({"strategy": name, "workers": workers, "tensors": profile.num_tensors,
                         "operations": len(plan.operations), "plan_s": plan_s, "simulate_s": sim_s,
                         "simulate_with_timeline_s": sim_tl_s, "plan_ok": plan_s < target,
                         "simulate_ok": sim_s < TARGET_SIM_S})
    print(f"{'strategy':<14} {'workers':>7} {'ops':>6} {'plan ms':>9} {'sim ms':>8} {'sim+trace ms':>12}  ok")
    for r in rows:
        ok = "yes" if r["plan_ok"] and r["simulate_ok"] else "NO"
        print(f"{r['strategy']:<14} {r['workers']:>7} {r['operations']:>6} {1e3 * r['plan_s']:>9.2f} "
              f"{1e3 * r['simulate_s']:>8.2f} {1e3 * r['simulate_with_timeline_s']:>12.2f}  {ok}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
