"""US-Byte's priority search: the default against the full search and the old fixed cap, on random cases.

    python benchmarks/usbyte_search.py [--cases 60] [--big 20] [--seed 0] [--repeat 2] \
        [--json benchmarks/results/usbyte_search.json]

Issue 40's grid (``gradsched.synthetic.random_case``: tensors of 40 B to 80 MB, alpha
1e-5..5e-3 s and beta 1e-10..1e-8 s/B at 8 workers, 8 to 1,024 workers, compute 2e10 to
2e12 flop/s): ``--cases`` cases with 30 to 1,000 tensors (seeds ``--seed`` on) and ``--big``
cases of 1,000 tensors (seeds ``--seed + 100000`` on).  Each case is planned three ways,
every rule searched as ``usbyte`` does by default:

- ``cap24``: the search before issue 40 (at most 24 promotions considered per rule, every try);
- ``default``: no cap, ``patience`` 24 (after 24 fruitless tries only the cheap ones go on);
- ``full``: no cap, every try (``patience=0``): the reference.

Prints, per kind of case, each search's worst and median gap to ``full`` (predicted
iteration) and its median and worst least-CPU time, and writes every case to JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from gradsched.planners.usbyte import predict
from planner_speed import search_kind
from gradsched.synthetic import random_case

SEARCHES = {"cap24": {"max_evaluations": 24, "patience": 0}, "default": {}, "full": {"patience": 0}}


def least_cpu(fn, repeat: int):
    """(least CPU seconds over ``repeat`` calls, the last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return best, out


def run_case(seed: int, num_tensors: int | None, repeat: int) -> dict:
    case = random_case(seed, num_tensors)
    profile, cluster = case.profile(), case.cluster()
    row: dict = {"case": case.label(), "seed": seed, "tensors": case.num_tensors}
    for name, opts in SEARCHES.items():
        cpu, (_, schedule, evaluations) = least_cpu(lambda: predict(profile, cluster, **opts), repeat)
        row[name] = {"iteration_s": schedule.iteration_s, "cpu_s": cpu, "evaluations": evaluations}
    for name in SEARCHES:
        row[name]["gap_to_full"] = row[name]["iteration_s"] / row["full"]["iteration_s"] - 1
    return row


def summary(rows: list[dict], kind: str) -> list[dict]:
    out = []
    for name in SEARCHES:
        gaps = [r[name]["gap_to_full"] for r in rows]
        cpu = [r[name]["cpu_s"] for r in rows]
        worst = max(rows, key=lambda r: r[name]["gap_to_full"])
        out.append({"cases": kind, "search": name, "n": len(rows), "worst_gap": max(gaps),
                    "median_gap": statistics.median(gaps), "over_0_2_percent": sum(g > 0.002 for g in gaps),
                    "median_cpu_s": statistics.median(cpu), "worst_cpu_s": max(cpu),
                    "total_cpu_s": sum(cpu), "worst_gap_case": worst["case"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--big", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default="benchmarks/results/usbyte_search.json")
    args = ap.parse_args()
    grid = [run_case(args.seed + k, None, args.repeat) for k in range(args.cases)]
    big = [run_case(args.seed + 100000 + k, 1000, args.repeat) for k in range(args.big)]
    table = summary(grid, "30-1000 tensors") + summary(big, "1000 tensors")
    print(f"{'cases':<16} {'search':<8} {'n':>3} {'worst gap %':>11} {'median gap %':>12} {'> 0.2%':>6} "
          f"{'median cpu ms':>13} {'worst cpu ms':>12} {'total cpu s':>11}  worst-gap case")
    for t in table:
        print(f"{t['cases']:<16} {t['search']:<8} {t['n']:>3} {100 * t['worst_gap']:>11.3f} "
              f"{100 * t['median_gap']:>12.3f} {t['over_0_2_percent']:>6} {1e3 * t['median_cpu_s']:>13.1f} "
              f"{1e3 * t['worst_cpu_s']:>12.1f} {t['total_cpu_s']:>11.2f}  {t['worst_gap_case']}")
    load = os.getloadavg()
    print(f"load average (1, 5, 15 min) after the run: {load}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "load_average": load, "usbyte_search": search_kind(),
                                           "summary": table,
                                           "grid": grid, "big": big}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
