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
met at all, and (columns ``tight``, ``auto/T``) the tighter network bound of :func:`startup_bound_s` over the
bench's bound and ``auto`` against it; writes ``benchmarks/results/headroom.json``.  Current figure: over the
kept runs the tighter bound is 1.00-1.07x the bench's (BERT-Base and DenseNet-201 at 8 hosts 1.04-1.07x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from gradsched.calibration.bounds import least_time_s
from gradsched.cluster import Cluster, CollectiveCost
from gradsched.costs import cheaper, combine
from gradsched.jobs.results import read_bench_row
from gradsched.plan import ALL_GATHER, HIER, REDUCE_SCATTER
from gradsched.profile import Profile

RESULTS = Path(__file__).parent / "results"
PATTERNS = ("bench_replay_*.json", "emulate_papers_*_8h*.json", "bench_main_job_*.json", "bench_default_*.json")
TARGETS = {  # issue: (regime test on (allreduce_all/backward, allreduce_all/compute), row, needed ratio to the bound)
    "36: auto >= 1.15x today's auto": (lambda bwd, comp: bwd >= 1.0, "auto", 1.15),
    "36: auto >= 1.3x DDP": (lambda bwd, comp: bwd >= 1.0, "ddp", 1.3),
    "35: auto >= 1.2x DDP": (lambda bwd, comp: 1.0 <= comp <= 2.0, "ddp", 1.2),
}


def group_cost(cluster: Cluster) -> CollectiveCost:
    """What the bench's bound prices a group of gradients at: the cheapest of one all-reduce (plain or, on a
    two-level cluster, hierarchical) and a reduce-scatter plus an all-gather, each as a plan's operation costs."""
    plain = cluster.operation_cost("allreduce")
    if cluster.topology is not None:
        plain = cheaper(plain, cluster.cost(HIER))
    return cheaper(plain, combine([(1.0, cluster.operation_cost(REDUCE_SCATTER)),
                                   (1.0, cluster.operation_cost(ALL_GATHER))]))


def startup_bound_s(profile: Profile, cluster: Cluster) -> dict[str, float]:
    """A network bound that counts the network's idle time in every step and the start-up of the operations
    around it (seconds; ``startup_bound_s`` and its parts).

    The bench's bound lets one all-reduce of every gradient overlap all the compute, which no plan does: one
    operation waits for the last gradient and holds up the first layer's forward.  In any plan a step's first
    operation waits for its gradients: carrying ``b1`` bytes, at least until the first ``b1`` bytes in ready
    order are ready.  After a step's last operation ends, at least the forward of the layers its gradients
    belong to runs (``bk`` bytes: at least the forward of the shortest tail of the forward order that holds
    ``bk`` bytes), before the next step's backward makes its first gradient ready: the network idles through
    both waits.  In between it moves every group of gradients, which costs at least ``least(B)`` (the bench's
    one all-reduce of all ``B`` bytes at the least cost per byte, ``m``), and the first and last groups
    ``cost(b) - m * b`` more each (one group, counted once, where the two are the reduce-scatter and the
    all-gather of the same group): with a start-up per operation, an early small first operation pays its
    start-up and a late large one leaves the network idle longer.  The bound is the least over ``b1`` and
    ``bk``; compute slowed by communication is not counted."""
    cost = group_cost(cluster)
    total = float(profile.total_bytes)
    least = least_time_s(cost, total)
    per_byte = least / total
    ready, order = profile.ready_s, list(profile.order)
    prefix = np.cumsum([profile.tensors[t].bytes for t in order], dtype=float)  # bytes ready by each ready time
    ready_at = np.array([ready[t] for t in order])
    fwd: dict[int, list[float]] = {}  # layers in forward order: [bytes, forward]
    for t, lid in zip(profile.tensors, profile.layer_of):
        row = fwd.setdefault(lid, [0.0, 0.0])
        row[0] += t.bytes
        row[1] += t.forward_s
    back = list(fwd.values())[::-1]
    suffix = np.cumsum([b for b, _ in back])  # bytes of the last m layers in forward order, and their forward
    tail = np.cumsum([f for _, f in back])
    # cells (edge[i], edge[i+1]] of byte counts: in each, the least wait and the least extra cost over m * b
    edges = np.unique(np.concatenate([[0.0], prefix, suffix, np.geomspace(1.0, total, 4096)]))
    edges = edges[edges <= total]
    lo, hi = edges[:-1] + 1.0, edges[1:]
    grid = np.unique(np.concatenate([lo, np.geomspace(1.0, total, 512)]))
    floor = np.minimum.accumulate(cost.times_s(grid)[::-1])[::-1]  # the least cost of that size or more
    extra = np.maximum(0.0, floor[np.searchsorted(grid, lo)] - per_byte * hi)
    wait_first = ready_at[np.minimum(np.searchsorted(prefix, lo), len(prefix) - 1)]
    wait_last = tail[np.minimum(np.searchsorted(suffix, lo), len(suffix) - 1)]
    apart = float((wait_first + extra).min() + (wait_last + extra).min())
    same = float((wait_first + wait_last + extra).min())
    return {"startup_bound_s": least + min(apart, same), "allreduce_all_s": least,
            "idle_and_startup_s": min(apart, same)}


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
    tight = max(bound, _startup_bound(first))
    regime = (allreduce / backward, allreduce / compute)
    room = {}
    for target, (applies, row, needed) in TARGETS.items():
        if applies(*regime) and row in ratio:
            room[target] = ratio[row] >= needed
    return {"run": path.name, "hosts": first.get("hosts"), "date": first.get("date"), "bound_s": bound,
            "allreduce_over_backward": regime[0], "allreduce_over_compute": regime[1],
            "vs_bound": ratio, "best": min(ratio, key=ratio.__getitem__), "room": room,
            "tight_bound_s": tight, "vs_tight_bound": {name: r * bound / tight for name, r in ratio.items()}}


def _startup_bound(row: dict) -> float:
    """:func:`startup_bound_s` of a bench row's profile and cluster, in the row's (emulated) seconds; 0 where the
    row keeps no measured profile."""
    run, dilate = read_bench_row(row)
    measured = (run.get("profile") or {}).get("measured")
    if not isinstance(measured, dict) or not run.get("cluster"):
        return 0.0
    return startup_bound_s(Profile.from_dict(measured), Cluster.from_dict(run["cluster"]))["startup_bound_s"] / dilate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="bench JSONs (default: every emulated run kept)")
    args = parser.parse_args(argv)
    paths = args.runs or sorted({p for pat in PATTERNS for p in RESULTS.glob(pat)})
    runs = [h for h in map(headroom, paths) if h]
    print(f"{'run':58} {'h':>2} {'AR/bwd':>6} {'AR/comp':>7} {'DDP/LB':>6} {'auto/LB':>7} {'best/LB':>7} "
          f"{'tight':>5} {'auto/T':>6}  targets reachable")
    for h in runs:
        auto = h["vs_bound"].get("auto")
        tight_auto = "-" if auto is None else f"{h['vs_tight_bound']['auto']:.2f}"
        marks = ", ".join(f"{t.split(':')[0]}{'+' if ok else '-'}" for t, ok in h["room"].items())
        print(f"{h['run'][:58]:58} {h['hosts']:>2} {h['allreduce_over_backward']:6.2f} {h['allreduce_over_compute']:7.2f} "
              f"{h['vs_bound']['ddp']:6.2f} {'-' if auto is None else f'{auto:.2f}':>7} "
              f"{h['vs_bound'][h['best']]:7.2f} {h['tight_bound_s'] / h['bound_s']:5.3f} "
              f"{tight_auto:>6}  {marks}")
    summary = {}
    for target in TARGETS:
        cases = [h["room"][target] for h in runs if target in h["room"]]
        summary[target] = {"runs_in_regime": len(cases), "reachable": sum(cases)}
        print(f"{target}: bound leaves room in {sum(cases)} of {len(cases)} runs in its regime")
    autos = [h["vs_bound"]["auto"] for h in runs if "auto" in h["vs_bound"]]
    if autos:
        summary["auto_vs_bound_median"] = statistics.median(autos)
        print(f"auto / bound over {len(autos)} runs: median {statistics.median(autos):.2f}, worst {max(autos):.2f}")
        tights = [h["vs_tight_bound"]["auto"] for h in runs if "auto" in h["vs_bound"]]
        summary["auto_vs_tight_bound_median"] = statistics.median(tights)
        print(f"auto / tighter bound (startup_bound_s): median {statistics.median(tights):.2f}, worst {max(tights):.2f}")
    out = RESULTS / "headroom.json"
    out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
