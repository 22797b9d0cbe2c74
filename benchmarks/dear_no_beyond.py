"""The stored 8-host ``dear`` rows predicted again without the phases timed beyond the table where they ran as rings
(dear13): what the bench's start-up would save, and what the prediction would lose.

    python benchmarks/dear_no_beyond.py [RUN.json ...] [--json benchmarks/results/dear_no_beyond.json]

For each kept 8-host ``gradsched bench --json`` run with a ``dear`` row whose table timed the two phases beyond its
top (``two_phase_beyond_bytes``, :func:`gradsched.torch.jobs.bench_network._time_two_phase`), the bench's reading
(``predict_fixes.bench_reading``) three times: "as run" (the file as it is), "no rings timed" (the phases' points at
sizes whose groups the runtime sends as rings left out, the table's line beyond its top refitted as the bench fits it:
:func:`gradsched.net_extend.extended_costs`; :meth:`gradsched.cluster.Cluster.phase_cost` then prices those groups
as the ring derived from the all-reduce) and "smallest ring timed" (of those points, the smallest size's kept: the
line beyond it at its rate).  The ``dear`` plan that ran is ``dear`` planned on "as run" (its hash
checked against the row's); it is simulated on each, beside ``dear`` planned anew on each; and ``dear``'s three fastest
candidate groupings on "as run" (how near a tie its choice was).  The seconds those points
took to time are estimated from their own times (the table's operations per size, as
:func:`gradsched.torch.measure.netbench._time_collective` issues them).  No network: seconds.  Times in emulated
seconds (the run's over its dilation).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

from dear_trials import StoredBench, write_runs
from predict_fixes import bench_reading

from gradsched.cluster import Cluster
from gradsched.costs import runs_ring
from gradsched.net_extend import extended_costs, operations_for
from gradsched.plan import Plan
from gradsched.planners import dear, make_plan
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [RESULTS / "emulate_papers_bert_base_8h_a2a12.json"] + [
    RESULTS / f"bench_replay_bert_base_8h_dear13{t}.json" for t in ("", "b", "c")]
PHASES = ("reducescatter", "allgather")


def without_rings(first: dict[str, Any], keep_least: bool = False) -> tuple[dict[str, Any], float]:
    """``first`` as if its table had not timed the phases at ring sizes (``keep_least``: but the smallest), and the
    seconds timing those left out took (est.)."""
    cluster = Cluster.from_dict(first["cluster"])
    world, extra = cluster.world_size, cluster.extra
    points = {k: list(v) for k, v in extra["measured_points"].items()}
    run = int(extra.get("table_max_run", 64))
    reps = int(extra.get("reps", 3))
    took = 0.0
    for name in PHASES:
        ring = [(b, t) for b, t in points[name] if runs_ring(world, float(b) * world, False)]
        least = min((b for b, _ in ring), default=None) if keep_least else None
        ring = [(b, t) for b, t in ring if b != least]
        points[name] = [[b, t] for b, t in points[name]
                        if b == least or not runs_ring(world, float(b) * world, False)]
        took += sum(t * (1 + operations_for(int(b) * world, reps, run)) for b, t in ring)  # a warm-up, the reps' runs
    top = 2 << max(12, math.ceil(math.log2(max(first["profile"]["total_bytes"], 4096))))
    refit = extended_costs(points, list(PHASES), top)
    kept = {k: v for k, v in extra.items() if k != "two_phase_beyond_bytes"}
    out = dataclasses.replace(cluster, collectives={**cluster.collectives, **refit},
                              extra={**kept, "measured_points": points})
    return {**first, "cluster": out.to_dict()}, took


def best_candidates(run: StoredBench, cluster: Cluster, k: int = 3) -> list[tuple[str, int, float]]:
    """``dear``'s ``k`` fastest candidate groupings first-in first-out on ``cluster`` (:func:`dear.candidate_groupings`):
    name, operations, simulated iteration (emulated s) on the planned profile, as ``planned`` ranks them."""
    out = []
    for name, groups in dear.candidate_groupings(run.planned, cluster):
        ops = dear.two_phase_ops(groups, run.planned)
        trial = Plan("dear", ops, run.planned.fingerprint, run.planned.model, scheduling="fifo", overlap_forward=True)
        out.append((name, len(ops), simulate(trial, run.planned, cluster, timeline=False).iteration_s / run.dilate))
    return sorted(out, key=lambda c: c[2])[:k]


def analyse(path: Path) -> dict[str, Any]:
    run = StoredBench.read(path)
    first, dilate = run.first, run.dilate
    dear_row = next(r for r in run.rows if r["strategy"] == "dear")
    stripped, took = without_rings(first)
    least, took_least = without_rings(first, keep_least=True)
    readings = {"as run": bench_reading(first), "no rings timed": bench_reading(stripped),
                "smallest ring timed": bench_reading(least)}
    ran = make_plan("dear", run.planned, readings["as run"])
    measured = dear_row["iteration_s_median"]
    out: dict[str, Any] = {"run": path.stem, "model": first.get("model"), "dilate": dilate, "measured_dear_s": measured,
                           "dear_ran": {"plan_hash": ran.hash, "row_plan_hash": dear_row["plan_hash"],
                                        "operations": len(ran.operations)},
                           "beyond_bytes": first["cluster"].get("two_phase_beyond_bytes"),
                           "ring_points_took_s_est": took, "ring_points_but_smallest_took_s_est": took_least,
                           "best_candidates_as_run": best_candidates(run, readings["as run"]), "pricings": {}}
    for name, cluster in readings.items():
        dear = make_plan("dear", run.planned, cluster)
        ran_s = simulate(ran, run.scaled, cluster, timeline=False).iteration_s / dilate
        out["pricings"][name] = {"dear_ran_s": ran_s, "error": ran_s / measured - 1,
                                 "dear_planned_s": simulate(dear, run.scaled, cluster, timeline=False).iteration_s / dilate,
                                 "dear_planned": f"{dear.options.get('planned_grouping')}, {len(dear.operations)} "
                                                 f"operations, hash {dear.hash}"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    results = [analyse(p) for p in args.runs]
    print(f"{'run':40s} {'pricing':15s} {'dear ran':>9s} {'measured':>9s} {'error':>7s} {'dear now':>9s}  planned")
    for r in results:
        for name, p in r["pricings"].items():
            print(f"{r['run']:40s} {name:15s} {p['dear_ran_s']:9.3f} {r['measured_dear_s']:9.3f} "
                  f"{100 * p['error']:+6.1f}% {p['dear_planned_s']:9.3f}  {p['dear_planned']}")
        d = r["dear_ran"]
        print(f"{'':40s} ran: hash {d['plan_hash']} (row's {d['row_plan_hash']}), {d['operations']} operations; "
              f"beyond the table {r['beyond_bytes']} B a rank; the ring points took about {r['ring_points_took_s_est']:.1f} s, "
              f"all but the smallest {r['ring_points_but_smallest_took_s_est']:.1f} s")
        print(f"{'':40s} best candidates as run: " + ", ".join(f"{n} ({k}) {t * 1e3:.1f} ms"
                                                           for n, k, t in r["best_candidates_as_run"]))
    if args.json:
        write_runs(args.json, args.runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
