"""Planner and simulator speed on 1,000-tensor profiles, at 8 and 1,024 workers, flat and 128 x 8.

    python benchmarks/planner_speed.py [--tensors 1000] [--repeat 7] [--profiles synthetic,heldout] \
        [--clusters 8,1024,128x8] [--json benchmarks/results/planner_speed.json]
    python benchmarks/planner_speed.py --clusters 1024,128x8 --json benchmarks/results/planner_speed_two_level.json
    python benchmarks/planner_speed.py --random 20 --random-seed 619327 --json benchmarks/results/planner_speed_random.json
    python benchmarks/planner_speed.py --random-seed 586569 --json benchmarks/results/planner_speed_fresh.json

Two profiles: ``synthetic`` (gradsched.synthetic, 4 KB to 13 MB tensors) and ``heldout``
(sizes log-uniform from 40 B to 80 MB, one tensor per layer, a seed no test uses: the
issue-16 check's kind of input).  Targets (issue 2): each planner except auto < 50 ms,
one simulation < 20 ms, auto < 2 s; issue 16 aims at 10 ms per planner and auto < 0.5 s
at 1,024 workers.  Issue 21: the same targets on a two-level cluster of 128 nodes x 8
ranks (``two_level_cluster``: measured at 2 x 8, extrapolated by ``Cluster.at_topology``),
where gradsched's own dense planners may run operations hierarchically (column ``hier``).
Prints a table of medians (wall clock and CPU time: on a shared machine the CPU time is the
steadier figure) and writes JSON with the load average.

Issue 40: a planner's speed depends on its input, so beside the fixed profiles every run
draws ``--random`` fresh cases of issue 40's grid (``gradsched.synthetic.random_case``:
1,000 tensors of 40 B to 80 MB, alpha 1e-5 to 5e-3 s, beta 1e-10 to 1e-8 s/B at 8 workers,
8 to 1,024 workers, compute 2e10 to 2e12 flop/s), from a seed drawn at random and printed
(``--random-seed`` replays it), for the ``--random-strategies`` (usbyte, auto and dear: the
ones whose work depends on the input).  Each row also has the plan's predicted iteration
(``predicted_s``) and, for ``auto``, what it chose (``chose``).  The last table gives each strategy's median and worst
least-CPU time over every case with the case that was worst.  US-Byte's search runs compiled
and the simulator's pass run compiled where numba is installed (``gradsched[fast]``; the JSON's
``usbyte_search`` says which ran):
the least time of the repeats leaves out the first call's import of numba.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.plan import HIER, Plan
from gradsched.planners import make_plan, strategy_names
from gradsched.sim import simulate
from gradsched.profile import Profile
from gradsched.synthetic import heldout_profile, random_case, synthetic_profile

TARGET_PLAN_S, TARGET_SIM_S, TARGET_AUTO_S = 0.050, 0.020, 2.0


def median_time(fn, repeat: int, cpu_min: list | None = None) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``fn`` over ``repeat`` calls (the least CPU time
    appended to ``cpu_min``: on a loaded machine the steadiest figure of what ``fn`` costs)."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if cpu_min is not None:
        cpu_min.append(min(cpu))
    return statistics.median(wall), statistics.median(cpu)


def two_level_cluster(nodes: int = 128, ranks_per_node: int = 8) -> Cluster:
    """The flat benchmark cluster's links between nodes (all-reduce 30 us + 0.6 ns/B at 2 nodes),
    links 6x faster per byte inside a node of 8 (30 us + 0.1 ns/B), at ``nodes`` x ``ranks_per_node``."""
    intra, inter = CollectiveCost(3e-5, 1e-10), CollectiveCost(3e-5, 6e-10)
    return Cluster.two_level(intra, inter, 2, 8).at_topology(nodes, ranks_per_node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--density", type=float, default=0.01, help="density for sparse strategies and auto")
    ap.add_argument("--profiles", default="synthetic,heldout", help="comma-separated: synthetic, heldout")
    ap.add_argument("--clusters", default="8,1024,128x8",
                    help="comma-separated: 8 and 1024 (flat workers), 128x8 (two-level: nodes x ranks per node)")
    ap.add_argument("--random", type=int, default=8, help="fresh random cases (issue 40's grid) drawn this run")
    ap.add_argument("--random-seed", type=int, default=None, help="the first case's seed (default: drawn, printed)")
    ap.add_argument("--random-strategies", default="usbyte,auto,dear")
    ap.add_argument("--json", default="benchmarks/results/planner_speed.json")
    args = ap.parse_args()
    seed = args.random_seed if args.random_seed is not None else random.SystemRandom().randrange(1 << 20)
    print(f"random cases: seeds {seed} to {seed + args.random - 1} (replay: --random-seed {seed}); "
          f"usbyte's search: {search_kind()} (GRADSCHED_JIT=0: the Python search)")
    make = {"synthetic": synthetic_profile, "heldout": heldout_profile}
    base = Cluster.alpha_beta(2e-4, 1e-9, 8)
    rows = []
    known = {"8": lambda: base, "1024": lambda: base.at_world_size(1024), "128x8": two_level_cluster}
    clusters = [(label, known[label]()) for label in args.clusters.split(",")]
    for pname in args.profiles.split(","):
        profile = make[pname](args.tensors)
        for name in strategy_names():  # each planner on every cluster back to back: side by side in time
            for label, cluster in clusters:
                rows.append(_row(name, pname, profile, cluster, label, args))
    for k in range(args.random):  # fresh cases: each its own profile and cluster
        case = random_case(seed + k, args.tensors)
        profile, cluster = case.profile(), case.cluster()
        for name in args.random_strategies.split(","):
            rows.append({**_row(name, f"random{case.seed}", profile, cluster, str(case.workers), args),
                         "case": case.label()})
    print(f"{'profile':<10} {'strategy':<14} {'workers':>7} {'ops':>6} {'hier':>5} {'plan ms':>9} {'plan cpu':>9} "
          f"{'cpu min':>8} {'sim ms':>8} {'sim+trace ms':>12}  ok")
    for r in rows:
        ok = "yes" if r["plan_ok"] and r["simulate_ok"] else "NO"
        print(f"{r['profile']:<10} {r['strategy']:<14} {r['topology']:>7} {r['operations']:>6} {r['hier_operations']:>5} "
              f"{1e3 * r['plan_s']:>9.2f} {1e3 * r['plan_cpu_s']:>9.2f} {1e3 * r['plan_cpu_min_s']:>8.2f} "
              f"{1e3 * r['simulate_s']:>8.2f} "
              f"{1e3 * r['simulate_with_timeline_s']:>12.2f}  {ok}")
    worst = _worst(rows)
    print(f"load average (1, 5, 15 min) after the run: {os.getloadavg()}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r["load_average"] = os.getloadavg()
    Path(args.json).write_text(json.dumps({"random_seed": seed, "random_cases": args.random, "worst": worst,
                                           "usbyte_search": search_kind(), "rows": rows}, indent=1))
    print(f"wrote {args.json}")


def search_kind() -> str:
    """Which US-Byte search ran: compiled (numba, ``gradsched[fast]``) or the Python model."""
    from gradsched.planners import _usbyte_jit

    if not _usbyte_jit.enabled():
        return "python"
    import numba

    return f"compiled (numba {numba.__version__}) for {_usbyte_jit.MIN_UNITS} layers or more"


def _worst(rows: list[dict]) -> list[dict]:
    """Per strategy: the median and the worst least-CPU plan time over every case, printed."""
    out = []
    print(f"\n{'strategy':<14} {'cases':>5} {'median cpu ms':>13} {'worst cpu ms':>12}  worst case")
    for name in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == name]
        top = max(mine, key=lambda r: r["plan_cpu_min_s"])
        where = top.get("case") or f"{top['profile']} at {top['topology']}"
        out.append({"strategy": name, "cases": len(mine), "median_cpu_min_s":
                    statistics.median(r["plan_cpu_min_s"] for r in mine), "worst_cpu_min_s": top["plan_cpu_min_s"],
                    "worst_case": where})
        print(f"{name:<14} {len(mine):>5} {1e3 * out[-1]['median_cpu_min_s']:>13.2f} "
              f"{1e3 * top['plan_cpu_min_s']:>12.2f}  {where}")
    return out


def fresh(plan: Plan) -> Plan:
    """``plan`` with its operations in a new tuple (the same operations): simulated as a new plan."""
    return replace(plan, operations=tuple(list(plan.operations)))


def _row(name: str, pname: str, profile: Profile, cluster: Cluster, label: str, args: argparse.Namespace) -> dict:
    opts = {"density": args.density} if name in ("topk", "omgs", "auto") else {}
    repeat = max(1, args.repeat // 3) if name == "auto" else args.repeat
    least: list[float] = []
    plan_s, plan_cpu_s = median_time(lambda: make_plan(name, profile, cluster, **opts), repeat, least)
    plan = make_plan(name, profile, cluster, **opts)
    # each time a plan of new operations: simulate keeps the set-up of the very same ones (auto's credit windows)
    sim_s, _ = median_time(lambda: simulate(fresh(plan), profile, cluster, timeline=False), args.repeat)
    sim_tl_s, _ = median_time(lambda: simulate(fresh(plan), profile, cluster), args.repeat)
    target = TARGET_AUTO_S if name == "auto" else TARGET_PLAN_S
    return {"profile": pname, "strategy": name, "workers": cluster.world_size, "topology": label,
            "tensors": profile.num_tensors, "operations": len(plan.operations),
            "hier_operations": sum(op.collective == HIER for op in plan.operations), "plan_s": plan_s,
            "plan_cpu_s": plan_cpu_s, "plan_cpu_min_s": least[0], "simulate_s": sim_s,
            "simulate_with_timeline_s": sim_tl_s, "plan_ok": plan_s < target, "simulate_ok": sim_s < TARGET_SIM_S,
            "predicted_s": simulate(plan, profile, cluster, timeline=False).iteration_s, "chose": _chose(plan)}


def _chose(plan: Plan) -> str | None:
    """What ``auto`` chose (its strategy, and ``usbyte``'s ``groups`` where set), None for the other planners."""
    if "chose" not in plan.options:
        return None
    groups = plan.options["chosen_options"].get("groups")
    return plan.options["chose"] + ("" if groups is None else f" groups={groups}")


if __name__ == "__main__":
    main()
