"""How much faster any schedule could still make each kept bench run: the lower bound's headroom (no network: seconds).

    python benchmarks/headroom.py [RUN.json ...]   # default: every emulated run in benchmarks/results

The bench's lower bound (docs/bench.md, "Lower bound") is the longer of the step's compute and one
all-reduce of every gradient, with communication free to overlap backward and the next forward: no
dense schedule of all-reduces, reduce-scatters and all-gathers moves fewer bytes, so none runs a
step faster.  A speed-up target over a row is therefore reachable only where that row runs at least
the target times the bound.  Issue 36 asks, where one all-reduce of all gradients takes at least the
backward time, for ``auto`` >= 1.15x today's ``auto`` and >= 1.3x PyTorch DDP while within 1.05x of
the bound: that needs today's ``auto`` at >= 1.15x the bound and DDP at >= 1.3x it.  Issue 35 asks,
where that all-reduce takes 1-2x the compute, for ``auto`` >= 1.2x DDP and <= 1.10x the bound: DDP
at >= 1.2x the bound.  Per run this prints each ratio to the bound and whether each target could be
met at all; writes ``benchmarks/results/headroom.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
PATTERNS = ("bench_replay_*.json", "emulate_papers_*_8h*.json", "bench_main_job_*.json", "bench_default_*.json")
TARGETS = {  # issue: (regime test on (allreduce_all/backward, allreduce_all/compute), row, needed ratio to the bound)
    "36: auto >= 1.15x today's auto": (lambda bwd, comp: bwd >= 1.0, "auto", 1.15),
    "36: auto >= 1.3x DDP": (lambda bwd, comp: bwd >= 1.0, "ddp", 1.3),
    "35: auto >= 1.2x DDP": (lambda bwd, comp: 1.0 <= comp <= 2.0, "ddp", 1.2),
}


def _rows(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [r for r in data if isinstance(r, dict) and r.get("lower_bound_s") and r.get("iteration_s_median")]


def headroom(path: Path) -> dict | None:
    """One run's rows against its bound, and which targets its bound leaves room for."""
    rows = {r["strategy"]: r for r in _rows(path)}
    if "ddp" not in rows:
        return None
    first = rows["ddp"]
    bound = first["lower_bound_s"]
    lb = first.get("lower_bound") or {}
    compute, allreduce = lb.get("compute_s"), lb.get("allreduce_all_s")
    backward = (first.get("profile") or {}).get("backward_s")
    if not (compute and allreduce and backward):
        return None
    ratio = {name: r["iteration_s_median"] / bound for name, r in rows.items()}
    regime = (allreduce / backward, allreduce / compute)
    room = {}
    for target, (applies, row, needed) in TARGETS.items():
        if applies(*regime) and row in ratio:
            room[target] = ratio[row] >= needed
    return {"run": path.name, "hosts": first.get("hosts"), "date": first.get("date"), "bound_s": bound,
            "allreduce_over_backward": regime[0], "allreduce_over_compute": regime[1],
            "vs_bound": ratio, "best": min(ratio, key=ratio.__getitem__), "room": room}


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted({p for pat in PATTERNS for p in RESULTS.glob(pat)})
    runs = [h for h in map(headroom, paths) if h]
    print(f"{'run':58} {'h':>2} {'AR/bwd':>6} {'AR/comp':>7} {'DDP/LB':>6} {'auto/LB':>7} {'best/LB':>7}  targets reachable")
    for h in runs:
        auto = h["vs_bound"].get("auto")
        marks = ", ".join(f"{t.split(':')[0]}{'+' if ok else '-'}" for t, ok in h["room"].items())
        print(f"{h['run'][:58]:58} {h['hosts']:>2} {h['allreduce_over_backward']:6.2f} {h['allreduce_over_compute']:7.2f} "
              f"{h['vs_bound']['ddp']:6.2f} {'-' if auto is None else f'{auto:.2f}':>7} "
              f"{h['vs_bound'][h['best']]:7.2f}  {marks}")
    summary = {}
    for target in TARGETS:
        cases = [h["room"][target] for h in runs if target in h["room"]]
        summary[target] = {"runs_in_regime": len(cases), "reachable": sum(cases)}
        print(f"{target}: bound leaves room in {sum(cases)} of {len(cases)} runs in its regime")
    autos = [h["vs_bound"]["auto"] for h in runs if "auto" in h["vs_bound"]]
    if autos:
        summary["auto_vs_bound_median"] = statistics.median(autos)
        print(f"auto / bound over {len(autos)} runs: median {statistics.median(autos):.2f}, worst {max(autos):.2f}")
    out = RESULTS / "headroom.json"
    out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
