"""What ``dear`` and ``auto`` predict at 8 emulated hosts with gloo's two phases priced as the runtime now runs them
(rings from 4 MiB a group), against ``usbyte``, ``usbyte groups=0``, PyTorch DDP and the bound (issue 36, phase11).

    python benchmarks/dear_rings.py [RUN.json ...] [--json benchmarks/results/dear_rings.json]

For each kept 8-host ``gradsched bench --json`` run (default: runs10's VGG-16, ResNet-50, BERT-Base and BERT-Large,
whose tables timed the all-reduce only), its profile, probe and cluster read as ``gradsched bench`` prices now
(``predict_fixes.bench_reading``: the line anchored to the probe, the stream cost, the all-to-alls at the ratios
measured alone), and the plans made and simulated as ``benchmarks/dear_trials.py`` does (planned on the profile
with the runtime's costs, simulated on it calibrated to the run's compute-only step), twice: with the phases the
table did not time priced as all-to-alls at every size ("a2a", the rule before phase11) and by size ("rings":
:meth:`gradsched.cluster.Cluster.phase_cost`, a ring from ``RING_MIN_BYTES``).  Each plan is made on the pricing it
is simulated on.  Rows: PyTorch DDP (the ``ddp`` row's buckets), ``usbyte`` (defaults), ``usbyte groups=0``, ``dear``
planned (its choice named), ``dear`` planned without the groupings of at least the ring threshold (``"dear without
at-least"``: its candidates before phase11), DeAR's threshold rule at 25 MB and its nearby rule at 4 layers, and
``auto``; the bound
is :func:`gradsched.calibration.lower_bound_s` on each pricing.  For each ``dear`` plan: its groups and how many
reach the ring threshold.  No network: about a minute.  Times in emulated seconds (the run's over its dilation).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dear_trials import StoredBench, group_bytes, with_threshold, write_runs
from predict_fixes import bench_reading

from gradsched.calibration import lower_bound_s
from gradsched.costs import NO_RING_BYTES, RING_MIN_BYTES
from gradsched.planners import dear, make_plan
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [RESULTS / f"emulate_papers_{m}_8h_runs10.json" for m in ("vgg16", "resnet50", "bert_base", "bert_large")]
PRICINGS = {"a2a": NO_RING_BYTES, "rings": RING_MIN_BYTES}
PLANS: dict[str, tuple[str, dict[str, Any]]] = {
    "usbyte": ("usbyte", {}), "usbyte groups=0": ("usbyte", {"groups": 0}), "dear": ("dear", {}),
    "dear without at-least": ("dear", {}),
    "dear threshold 25 MB": ("dear", {"grouping": "threshold", "threshold_mb": 25.0}),
    "dear nearby 4": ("dear", {"grouping": "nearby", "nearby_layers": 4}), "auto": ("auto", {})}


def analyse(path: Path) -> dict[str, Any]:
    run = StoredBench.read(path)
    rows, first, dilate, planned, scaled = run.rows, run.first, run.dilate, run.planned, run.scaled
    ddp_row = next(r for r in rows if r["strategy"] == "ddp")
    reading = bench_reading(first)
    out: dict[str, Any] = {"run": path.stem, "model": first.get("model"), "dilate": dilate,
                           "measured_ddp_s": ddp_row["iteration_s_median"],
                           "measured_auto_s": next(r["iteration_s_median"] for r in rows if r["strategy"] == "auto"),
                           "pricings": {}}
    for pricing, least in PRICINGS.items():
        cluster = with_threshold(reading, least)
        predicted = {"ddp": simulate(run.ddp_plan(cluster), run.scaled_ddp, cluster, timeline=False).iteration_s / dilate}
        groups: dict[str, Any] = {}
        chose: dict[str, str] = {}
        for name, (strategy, options) in PLANS.items():
            with _without_at_least(name == "dear without at-least"):
                plan = make_plan(strategy, planned, cluster, **options)
            predicted[name] = simulate(plan, scaled, cluster, timeline=False).iteration_s / dilate
            if strategy == "dear":
                sizes = group_bytes(plan, planned)
                groups[name] = {"groups": len(sizes), "ring_groups": sum(b >= RING_MIN_BYTES for b in sizes),
                                "ring_bytes_share": sum(b for b in sizes if b >= RING_MIN_BYTES) / max(1, sum(sizes)),
                                "group_mib": [round(b / 2**20, 2) for b in sizes]}
                if options == {}:  # planned
                    chose[name] = f"{plan.options.get('planned_grouping')}, {plan.scheduling}"
            if strategy == "auto":
                chose[name] = f"{plan.options.get('chose')} ({len(plan.operations)} operations)"
        bound = lower_bound_s(scaled, cluster)["lower_bound_s"] / dilate
        out["pricings"][pricing] = {"predicted_s": predicted, "bound_s": bound, "dear_groups": groups, "chose": chose}
    return out


@contextmanager
def _without_at_least(on: bool) -> Iterator[None]:
    """``dear``'s candidates without the groupings of at least the ring threshold (``on``)."""
    kept = dear.RING_MULTIPLES
    if on:
        dear.RING_MULTIPLES = ()
    try:
        yield
    finally:
        dear.RING_MULTIPLES = kept


def print_table(results: list[dict[str, Any]]) -> None:
    names = ["ddp", *PLANS]
    print(f"{'run':34s} {'pricing':7s} " + " ".join(f"{n[:14]:>14s}" for n in names) + f" {'bound':>7s}")
    for r in results:
        for pricing, p in r["pricings"].items():
            cells = " ".join(f"{p['predicted_s'][n] * 1e3:14.1f}" for n in names)
            print(f"{r['run']:34s} {pricing:7s} {cells} {p['bound_s'] * 1e3:7.1f}")
            print(f"{'':42s} dear: {p['chose'].get('dear')}; without at-least: "
                  f"{p['chose'].get('dear without at-least')}; auto: {p['chose'].get('auto')}; dear's groups >= 4 MiB: "
                  + ", ".join(f"{k} {g['ring_groups']}/{g['groups']}" for k, g in p["dear_groups"].items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    results = [analyse(p) for p in args.runs]
    print_table(results)
    if args.json:
        write_runs(args.json, args.runs, results, ring_min_bytes=RING_MIN_BYTES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
