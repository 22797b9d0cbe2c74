"""The bench's stopping rule (gradsched.jobs.rounds) replayed on earlier benches' step times.

    python benchmarks/round_stopping.py [--tol 0.01] [--min-rounds 2]

For every ``gradsched bench --json`` file in benchmarks/results with more counted rounds than
the rule's least, where the rule would have stopped and how far each row's median, and each
row's speed-up over DDP's default, would then be from what all the rounds gave.  Writes
``benchmarks/results/round_stopping.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from gradsched.jobs.rounds import MIN_COUNTED_ROUNDS, ROUND_TOL, StoppingRule

RESULTS = Path(__file__).parent / "results"


def _median(rounds: list[list[float]]) -> float:
    return statistics.median([s for steps in rounds for s in steps])


def _one(rows: list[dict], rule: StoppingRule) -> dict:
    times = [r["step_s"] for r in rows]
    run = len(times[0])
    stop = next((r for r in range(rule.warmup + 1, run + 1) if rule.settled([t[:r] for t in times])), run)
    full = {r["strategy"]: _median(r["step_s"][rule.warmup:]) for r in rows}
    early = {r["strategy"]: _median(r["step_s"][rule.warmup:stop]) for r in rows}
    dev = max(abs(early[k] / full[k] - 1) for k in full)
    speed = (max(abs(early["ddp"] / early[k] / (full["ddp"] / full[k]) - 1) for k in full) if "ddp" in full else None)
    return {"rounds": run, "stopped_at": stop, "median_dev": dev, "speedup_dev": speed,
            "dilate": rows[0].get("dilate")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tol", type=float, default=ROUND_TOL)
    p.add_argument("--min-rounds", type=int, default=MIN_COUNTED_ROUNDS)
    args = p.parse_args()
    out = {}
    for path in sorted(RESULTS.glob("*.json")):
        try:
            rows = json.loads(path.read_text())
        except ValueError:
            continue
        if not (isinstance(rows, list) and rows and isinstance(rows[0], dict) and "step_s" in rows[0]):
            continue
        rule = StoppingRule(args.tol, args.min_rounds, rows[0].get("warmup_rounds", 1))
        if len(rows[0]["step_s"]) - rule.warmup > args.min_rounds:
            out[path.name] = _one(rows, rule)
    runs = list(out.values())
    devs = [r["median_dev"] for r in runs]
    speeds = [r["speedup_dev"] for r in runs if r["speedup_dev"] is not None]
    summary = {"tol": args.tol, "min_rounds": args.min_rounds, "files": len(runs),
               "rounds": sum(r["rounds"] for r in runs), "rounds_saved": sum(r["rounds"] - r["stopped_at"] for r in runs),
               "median_dev_median": statistics.median(devs), "median_dev_worst": max(devs),
               "speedup_dev_median": statistics.median(speeds), "speedup_dev_worst": max(speeds)}
    for name, r in out.items():
        print(f"{name:58s} {r['stopped_at']}/{r['rounds']} rounds  median {r['median_dev']:6.2%}  "
              f"speed-up {r['speedup_dev'] if r['speedup_dev'] is not None else float('nan'):6.2%}")
    print(json.dumps(summary))
    (RESULTS / "round_stopping.json").write_text(json.dumps({"summary": summary, "files": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
