"""runs11's two ``dear`` rows predicted again (issue 36, phase12): the queued gain capped at the queue's timed rate and
a timed phase priced as the ring from the threshold where its table stops under it, against the pricing before.

    python benchmarks/dear_queued.py [RUN.json ...] [--json benchmarks/results/dear_queued.json] [--no-queue]

For each kept 8-host ``gradsched bench --json`` run with a ``dear`` row whose table timed the phases (default:
runs11's BERT-Large and BERT-Base), the bench's reading (``predict_fixes.bench_reading``) twice: "before", the file's
phases' ``measured_points`` and its ``queued_points`` left out (what the pricing before phase12 read: the queued gain
at every size, the timed table's line at every size), and "now", the file as it is.  The ``dear`` plan that ran is
``dear`` planned on "before" (its hash checked against the row's); it is simulated on both, beside ``dear`` planned
and ``auto`` on each pricing (with and without its check of a decoupled plan under the bound:
``auto.under_bound_checked_s``), PyTorch DDP (the ``ddp`` row's buckets) and the bound (``lower_bound_s``).  Planned on
the profile with the runtime's costs, simulated on it calibrated to the run's compute-only step, as
``benchmarks/dear_rings.py``.  No network: seconds.  Times in emulated seconds (the run's over its dilation).
``--no-queue`` (a2a12): also "no queue", the file as it is without its queued rule (each operation one at a time).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from dear_trials import StoredBench, group_bytes, write_runs
from predict_fixes import bench_reading

from gradsched.calibration import lower_bound_s
from gradsched.costs import RING_MIN_BYTES
from gradsched.planners import auto, make_plan
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [RESULTS / f"emulate_papers_{m}_8h_runs11.json" for m in ("bert_large", "bert_base")]
PHASES = ("reducescatter", "allgather")


def before(first: dict[str, Any]) -> dict[str, Any]:
    """``first`` as the pricing before phase12 read it: no ``queued_points``, no phases' ``measured_points``."""
    out = copy.deepcopy(first)
    cluster = out["cluster"]
    cluster.pop("queued_points", None)
    cluster["measured_points"] = {k: v for k, v in (cluster.get("measured_points") or {}).items() if k not in PHASES}
    return out


def without_queue(first: dict[str, Any]) -> dict[str, Any]:
    """``first`` without its queued rule (``queued``, ``queued_points``): each operation one at a time, what the
    bench's table leaves where it stops under the queue's sizes (a2a12)."""
    out = copy.deepcopy(first)
    for key in ("queued", "queued_points"):
        out["cluster"].pop(key, None)
    return out


def analyse(path: Path, no_queue: bool = False) -> dict[str, Any]:
    run = StoredBench.read(path)
    rows, first, dilate, planned, scaled = run.rows, run.first, run.dilate, run.planned, run.scaled
    ddp_row = next(r for r in rows if r["strategy"] == "ddp")
    dear_row = next(r for r in rows if r["strategy"] == "dear")
    readings = {"before": bench_reading(before(first)), "now": bench_reading(first)}
    if no_queue:
        readings["no queue"] = bench_reading(without_queue(first))
    ran = make_plan("dear", planned, readings["before"])
    sizes = group_bytes(ran, planned)
    out: dict[str, Any] = {
        "run": path.stem, "model": first.get("model"), "dilate": dilate,
        "measured": {"ddp": ddp_row["iteration_s_median"], "dear": dear_row["iteration_s_median"],
                     "auto": next(r["iteration_s_median"] for r in rows if r["strategy"] == "auto")},
        "dear_ran": {"plan_hash": ran.hash, "row_plan_hash": dear_row["plan_hash"],
                     "operations": len(ran.operations), "groups": len(sizes),
                     "groups_under_1mib": sum(b < 2**20 for b in sizes),
                     "groups_from_ring_threshold": sum(b >= RING_MIN_BYTES for b in sizes)},
        "pricings": {}}
    for name, cluster in readings.items():
        ddp = run.ddp_plan(cluster)
        dear = make_plan("dear", planned, cluster)
        chosen = make_plan("auto", planned, cluster)
        kept, auto.under_bound_checked_s = auto.under_bound_checked_s, _unchecked
        try:
            unchecked = make_plan("auto", planned, cluster)
        finally:
            auto.under_bound_checked_s = kept
        out["pricings"][name] = {
            "dear_ran_s": simulate(ran, scaled, cluster, timeline=False).iteration_s / dilate,
            "dear_planned_s": simulate(dear, scaled, cluster, timeline=False).iteration_s / dilate,
            "dear_planned": f"{dear.options.get('planned_grouping')}, {len(dear.operations)} operations",
            "auto_s": simulate(chosen, scaled, cluster, timeline=False).iteration_s / dilate,
            "auto_chose": f"{chosen.options.get('chose')} ({len(chosen.operations)} operations)",
            "auto_without_bound_check_s": simulate(unchecked, scaled, cluster, timeline=False).iteration_s / dilate,
            "auto_without_bound_check_chose": f"{unchecked.options.get('chose')} ({len(unchecked.operations)} operations)",
            "ddp_s": simulate(ddp, run.scaled_ddp, cluster, timeline=False).iteration_s / dilate,
            "bound_s": lower_bound_s(scaled, cluster)["lower_bound_s"] / dilate}
    return out


def _unchecked(candidate: Any, predicted_s: float, *rest: Any) -> float:
    """``auto.under_bound_checked_s`` off: every plan ranked as predicted (``auto`` before phase12)."""
    return predicted_s


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'run':36s} {'pricing':7s} {'dear ran':>9s} {'measured':>9s} {'error':>7s} {'dear now':>9s} "
          f"{'auto':>7s} {'ddp':>7s} {'bound':>7s}  auto chose / dear planned")
    for r in results:
        m = r["measured"]["dear"]
        for name, p in r["pricings"].items():
            print(f"{r['run']:36s} {name:8s} {p['dear_ran_s']:9.3f} {m:9.3f} {100 * (p['dear_ran_s'] / m - 1):+6.1f}% "
                  f"{p['dear_planned_s']:9.3f} {p['auto_s']:7.3f} {p['ddp_s']:7.3f} {p['bound_s']:7.3f}  "
                  f"{p['auto_chose']} / {p['dear_planned']}; without the bound check: "
                  f"{p['auto_without_bound_check_chose']} {p['auto_without_bound_check_s']:.3f}")
        d = r["dear_ran"]
        print(f"{'':44s} dear ran: {d['groups']} groups ({d['groups_under_1mib']} under 1 MiB, "
              f"{d['groups_from_ring_threshold']} from 4 MiB), hash {d['plan_hash']} (row's {d['row_plan_hash']}); "
              f"measured ddp {r['measured']['ddp']:.3f}, auto {r['measured']['auto']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-queue", action="store_true", help="also the file without its queued rule (a2a12)")
    args = ap.parse_args(argv)
    results = [analyse(p, args.no_queue) for p in args.runs]
    print_table(results)
    if args.json:
        write_runs(args.json, args.runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
