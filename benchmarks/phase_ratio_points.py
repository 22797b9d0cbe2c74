"""gloo's two phases under the ring threshold at 8 ranks: the ratio over half the all-reduce by the group's size
(``gradsched.costs.MEASURED_PHASE_RATIO_POINTS``, a2a12), and how the derived prices compare with the phases the
stored 8-host bench tables timed.

    python benchmarks/phase_ratio_points.py [--json benchmarks/results/phase_ratio_points.json]

1. From a ``benchmarks/gloo_ring_phases.py`` sweep with ``--queue-mib`` (default: the a2a12 one): each size's
   all-to-all ratio ``(t - a/2) / (b/2 * n)`` over the sweep's all-reduce line ``a + b n`` fitted from 256 KiB, for
   the operations run one after another, each waited for (``queued_points["1"]``: how the bench's table and netbench
   time them) and for one after a barrier (``rows``).
2. For each stored 8-host bench whose table timed the phases (runs11's four, lead12's BERT-Large): the bench's
   reading (``predict_fixes.bench_reading``) with the timed phases taken out, priced by the group's size (the
   points) and at the flat ratios (1.56, 1.75), against the table's timed medians at each size.
No network: seconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from predict_fixes import bench_reading

from gradsched.cluster import Cluster
from gradsched.costs import fit_line
from gradsched.jobs.results import read_bench_row
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SWEEP = RESULTS / "gloo_ring_phases_8h_250mbit_a2a12.json"
RUNS = [RESULTS / f"emulate_papers_{m}.json" for m in
        ("resnet50_8h_runs11dear", "densenet201_8h_runs11dear", "bert_base_8h_runs11", "bert_large_8h_runs11",
         "bert_large_8h_lead12")]
PHASES = {"reducescatter": REDUCE_SCATTER, "allgather": ALL_GATHER}
MIB = 1 << 20


def sweep_ratios(sweep: dict[str, Any]) -> dict[str, Any]:
    """Each size's ratio over half the sweep's all-reduce line (fitted from 256 KiB to 4 MiB)."""
    rows = [r for r in sweep["rows"] if 0.25 <= r["mib_per_rank"] <= 4]
    a, b = fit_line([(r["mib_per_rank"] * MIB, r["median_s"]["allreduce"]) for r in rows])

    def ratio(n: float, t: float) -> float:
        return (t - a / 2) / (b / 2 * n)

    p = sweep["ranks"]
    waited = {name: [[pt[0] * p, ratio(pt[0] * p, pt[1])] for pt in q["1"]]
              for name, q in sweep["queued_points"].items()}
    barrier = {name: [[r["mib_per_rank"] * MIB, ratio(r["mib_per_rank"] * MIB, r["median_s"][case])]
                      for r in sweep["rows"]] for name, case in (("reducescatter", "a2a_rs"), ("allgather", "a2a_ag"))}
    return {"allreduce_line": [a, b], "one_after_another": waited, "after_a_barrier": barrier}


def without_timed_phases(row0: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(row0)
    cluster = out["cluster"]
    for name in PHASES:
        cluster["collectives"].pop(name, None)
        (cluster.get("points") or {}).pop(name, None)
    cluster["measured_points"] = {k: x for k, x in cluster["measured_points"].items() if k not in PHASES}
    for key in ("queued", "queued_points"):
        cluster.pop(key, None)
    return out


def compare(path: Path) -> dict[str, Any]:
    row0, _ = read_bench_row(json.loads(path.read_text())[0])
    by_size = bench_reading(without_timed_phases(row0))
    flat = Cluster.from_dict({k: x for k, x in by_size.to_dict().items() if k != "derived_phase_ratio_points"})
    out: dict[str, Any] = {"run": path.stem}
    for name, op in PHASES.items():
        rows = []
        for per_rank, timed in row0["cluster"]["measured_points"][name]:
            n = per_rank * row0["cluster"]["world_size"]
            rows.append({"group_bytes": n, "timed_s": timed, "by_size_s": by_size.operation_cost(op).time_s(n),
                         "flat_s": flat.operation_cost(op).time_s(n)})
        out[name] = rows
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |error| against the timed medians, by size band (whole group bytes)."""
    bands = {"64-256 KiB": (64 << 10, 256 << 10), "512 KiB-1 MiB": (512 << 10, MIB), "2 MiB": (2 * MIB, 2 * MIB)}
    out: dict[str, Any] = {}
    for band, (lo, hi) in bands.items():
        rows = [r for run in runs for name in PHASES for r in run[name] if lo <= r["group_bytes"] <= hi]
        out[band] = {how: statistics.median(abs(r[f"{how}_s"] / r["timed_s"] - 1) for r in rows)
                     for how in ("by_size", "flat")} | {"n": len(rows)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=Path, default=SWEEP)
    ap.add_argument("runs", nargs="*", type=Path, default=RUNS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    ratios = sweep_ratios(json.loads(args.sweep.read_text()))
    a, b = ratios["allreduce_line"]
    print(f"sweep {args.sweep.name}: all-reduce line {a * 1e3:.1f} ms + {b * 1e9:.1f} ns/B; ratio over half by size")
    for how in ("one_after_another", "after_a_barrier"):
        for name, pts in ratios[how].items():
            print(f"  {how:17s} {name:13s} " + "  ".join(f"{n / MIB:g} MiB {r:.2f}" for n, r in pts))
    runs = [compare(p) for p in args.runs]
    print("timed / by size / flat (ms), the bench's reading with its timed phases taken out:")
    for run in runs:
        for name in PHASES:
            print(f"  {run['run']:40s} {name[:6]} " + "; ".join(
                f"{r['group_bytes'] / MIB:g}M {r['timed_s'] * 1e3:.0f}/{r['by_size_s'] * 1e3:.0f}/{r['flat_s'] * 1e3:.0f}"
                for r in run[name]))
    bands = summary(runs)
    for band, s in bands.items():
        print(f"  median |error| {band:14s} by size {s['by_size']:.1%}  flat {s['flat']:.1%}  ({s['n']} sizes)")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "sweep": args.sweep.name,
                                         "ratios": ratios, "runs": runs, "median_abs_error": bands}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
