"""Planner and simulator speed on 1,000-tensor profiles, at 8 and 1,024 workers.

    python benchmarks/planner_speed.py [--tensors 1000] [--repeat 7] [--profiles synthetic,heldout] \
        [--json benchmarks/results/planner_speed.json]

Two profiles: ``synthetic`` (gradsched.synthetic, 4 KB to 13 MB tensors) and ``heldout``
(sizes log-uniform from 40 B to 80 MB, one tensor per layer, a seed no test uses: the
issue-16 check's kind of input).  Targets (issue 2): each planner except auto < 50 ms,
one simulation < 20 ms, auto < 2 s; issue 16 aims at 10 ms per planner and auto < 0.5 s
at 1,024 workers.  Prints a table of medians (wall clock and CPU time: on a shared
machine the CPU time is the steadier figure) and writes JSON with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from gradsched.cluster import Cluster
from gradsched.planners import make_plan, strategy_names
from gradsched.sim import simulate
from gradsched.profile import Profile, TensorProfile
from gradsched.synthetic import synthetic_profile

TARGET_PLAN_S, TARGET_SIM_S, TARGET_AUTO_S = 0.050, 0.020, 2.0


def median_time(fn, repeat: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``fn`` over ``repeat`` calls."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def heldout_profile(num_tensors: int = 1000, seed: int = 1) -> Profile:
    """Tensors of 10 to 20M fp32 elements (40 B to 80 MB), log-uniform, compute ~ size."""
    rng = random.Random(seed)
    tensors = []
    for i in range(num_tensors):
        numel = int(10 ** rng.uniform(1, 7.3))
        fwd = 2 * numel * 32 / 2e12 * rng.uniform(0.5, 4)
        tensors.append(TensorProfile(f"t{i}", numel, 4 * numel, fwd, 2 * fwd))
    return Profile(f"heldout{num_tensors}", tuple(tensors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--density", type=float, default=0.01, help="density for sparse strategies and auto")
    ap.add_argument("--profiles", default="synthetic,heldout", help="comma-separated: synthetic, heldout")
    ap.add_argument("--json", default="benchmarks/results/planner_speed.json")
    args = ap.parse_args()
    make = {"synthetic": synthetic_profile, "heldout": heldout_profile}
    base = Cluster.alpha_beta(2e-4, 1e-9, 8)
    rows = []
    for pname in args.profiles.split(","):
        profile = make[pname](args.tensors)
        for workers in (8, 1024):
            cluster = base.at_world_size(workers)
            for name in strategy_names():
                rows.append(_row(name, pname, profile, cluster, workers, args))
    print(f"{'profile':<10} {'strategy':<14} {'workers':>7} {'ops':>6} {'plan ms':>9} {'plan cpu':>9} {'sim ms':>8} "
          f"{'sim+trace ms':>12}  ok")
    for r in rows:
        ok = "yes" if r["plan_ok"] and r["simulate_ok"] else "NO"
        print(f"{r['profile']:<10} {r['strategy']:<14} {r['workers']:>7} {r['operations']:>6} "
              f"{1e3 * r['plan_s']:>9.2f} {1e3 * r['plan_cpu_s']:>9.2f} {1e3 * r['simulate_s']:>8.2f} "
              f"{1e3 * r['simulate_with_timeline_s']:>12.2f}  {ok}")
    print(f"load average (1, 5, 15 min) after the run: {os.getloadavg()}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r["load_average"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


def _row(name: str, pname: str, profile: Profile, cluster: Cluster, workers: int, args: argparse.Namespace) -> dict:
    opts = {"density": args.density} if name in ("topk", "omgs", "auto") else {}
    repeat = max(1, args.repeat // 3) if name == "auto" else args.repeat
    plan_s, plan_cpu_s = median_time(lambda: make_plan(name, profile, cluster, **opts), repeat)
    plan = make_plan(name, profile, cluster, **opts)
    sim_s, _ = median_time(lambda: simulate(plan, profile, cluster, timeline=False), args.repeat)
    sim_tl_s, _ = median_time(lambda: simulate(plan, profile, cluster), args.repeat)
    target = TARGET_AUTO_S if name == "auto" else TARGET_PLAN_S
    return {"profile": pname, "strategy": name, "workers": workers, "tensors": profile.num_tensors,
            "operations": len(plan.operations), "plan_s": plan_s, "plan_cpu_s": plan_cpu_s, "simulate_s": sim_s,
            "simulate_with_timeline_s": sim_tl_s, "plan_ok": plan_s < target, "simulate_ok": sim_s < TARGET_SIM_S}


if __name__ == "__main__":
    main()
