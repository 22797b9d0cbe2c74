"""Why the best plan the planners find on the papers' models at 8 emulated hosts sits above the bench's bound
(no network: about a minute per run).

    python benchmarks/plan_headroom.py [RUN.json ...] [--evaluations N]   # default: the five runs below

For each kept ``gradsched bench --json`` run, rebuilt from its own profile, cluster and probe as the bench
predicted with (``benchmarks/resimulate.py`` reads them the same way): the bench's lower bound; the tighter
network bound of ``benchmarks/headroom.py`` (:func:`headroom.startup_bound_s`: the network's idle time at the
start and end of a step and the start-up of the operations there); PyTorch DDP's prediction (the row's bucket
size); each planner's prediction with its defaults (``auto`` with its grid); and the best plan a local search
over the simulator finds outside the planners: tensors cut into groups contiguous in ready order, the group
boundaries moved, added and removed at random (seeded), each grouping run as decoupled all-reduces
(reduce-scatters in ready order, all-gathers in forward order: ``dear``'s operations, fifo or by priority) or
as all-reduces by forward-order priority, both overlapping the next forward.  For the best planner's plan it
splits the step into the network's wait for the first operation, its busy time (against the bound's one
all-reduce of all gradients) and what runs after the last operation; ``runtime_costs_s`` is what the runtime adds
to the compute stream per step (:func:`gradsched.calibration.with_runtime_costs`), which plans pay and the bounds
do not count.  Since fwd10 ``auto``'s grid tries ``usbyte`` with ``groups=0`` (planners/_contiguous.py: whole groups
contiguous in ready order, by forward-order priority, gating the next forward); each run also gives ``auto``
without it (its grid as before, ``"auto before fwd10"``), that candidate alone (``"usbyte groups=0"``), and
``auto``'s planning time with and without it (least CPU seconds of 3, ``auto_plan_cpu_s``).  Writes
``benchmarks/results/plan_headroom.json``.  Times in emulated seconds (the run's, divided by its dilation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from gradsched.calibration import with_runtime_costs
from gradsched.cluster import Cluster
from gradsched.jobs.bench import ddp_first_bucket_mb
from gradsched.jobs.results import read_bench_row
from gradsched.plan import ALL_GATHER, DENSE, REDUCE_SCATTER, Operation, Plan, whole_slices
from gradsched.planners import make_plan
from gradsched.planners.auto import GRID
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
import headroom  # noqa: E402

RESULTS = Path(__file__).parent / "results"
RUNS = [RESULTS / f"emulate_papers_{name}.json" for name in
        ("bert_base_8h_start8", "vgg16_8h_runs9b", "resnet50_8h_runs9", "densenet201_8h_runs9")] + [
    RESULTS / "bench_main_job_googlenet_k80_2h.json"]  # the README's main job (2 hosts, 1 Gbit/s)
PLANNERS = ("usbyte", "optimal", "mgwfbp", "dear", "auto")
GROUPED = "usbyte groups=0"  # usbyte's whole groups contiguous in ready order (auto's grid tries it since fwd10)
BEFORE = "auto before fwd10"  # auto without that candidate: its grid as it was
KINDS = ("two-phase fifo", "two-phase priority", "all-reduce priority")


def grouped_plan(profile: Profile, cuts: list[int], kind: str) -> Plan:
    """Tensors in ready order cut at ``cuts`` into groups, run as ``kind`` (see the module docstring)."""
    order, whole = list(profile.order), whole_slices(profile)
    edges = [0, *cuts, len(order)]
    groups = [tuple(whole[t] for t in sorted(order[a:b])) for a, b in zip(edges, edges[1:]) if b > a]
    first_in_forward = [min(s.tensor for s in g) for g in groups]
    if kind == "all-reduce priority":
        ops = tuple(Operation(g, DENSE, f) for g, f in zip(groups, first_in_forward))
        return Plan("grouped", ops, profile.fingerprint, profile.model, scheduling="priority", overlap_forward=True)
    rs = [Operation(g, REDUCE_SCATTER, j) for j, g in enumerate(groups)]
    by_forward = sorted(range(len(groups)), key=first_in_forward.__getitem__)
    ag = [Operation(groups[j], ALL_GATHER, len(groups) + k) for k, j in enumerate(by_forward)]
    if kind == "two-phase priority":  # the earlier a group's first layer in forward order, the sooner
        place = {j: k for k, j in enumerate(by_forward)}
        rs = [dataclasses.replace(op, priority=place[j]) for j, op in enumerate(rs)]
        ag = [dataclasses.replace(op, priority=k) for k, op in enumerate(ag)]
    return Plan("grouped", tuple(rs + ag), profile.fingerprint, profile.model,
                scheduling="priority" if kind == "two-phase priority" else "fifo", overlap_forward=True)


def search(profile: Profile, cluster: Cluster, kind: str, evaluations: int, seed: int = 0) -> tuple[list[int], float]:
    """The fastest grouping a seeded local search finds (cuts, simulated iteration): from the best of 1-24
    groups of equal bytes, moves of one cut (by 1-8 tensors), a cut added, a cut removed."""
    def simulated(cuts: list[int]) -> float:
        return simulate(grouped_plan(profile, cuts, kind), profile, cluster, timeline=False).iteration_s

    n = len(profile.order)
    nbytes = [profile.tensors[t].bytes for t in profile.order]
    cum = [sum(nbytes[:i + 1]) for i in range(n)]
    starts = [sorted({next(i + 1 for i, c in enumerate(cum) if c >= cum[-1] * j / k) for j in range(1, k)} - {n})
              for k in range(1, 25)]
    best, best_s = min(((c, simulated(c)) for c in starts), key=lambda x: x[1])
    rng = random.Random(seed)
    for _ in range(evaluations):
        cuts, move = list(best), rng.random()
        if move < 0.15 and cuts:
            cuts.pop(rng.randrange(len(cuts)))
        elif move < 0.3:
            cuts.append(rng.randrange(1, n))
        elif cuts:
            i = rng.randrange(len(cuts))
            cuts[i] = min(n - 1, max(1, cuts[i] + rng.choice((-8, -4, -2, -1, 1, 2, 4, 8))))
        cuts = sorted(set(cuts))
        s = simulated(cuts)
        if s < best_s:
            best, best_s = cuts, s
    return best, best_s


def breakdown(plan: Plan, profile: Profile, cluster: Cluster, dilate: float) -> dict[str, float]:
    """Where a plan's step goes: the network's wait for its first operation, its busy time, the rest."""
    r = simulate(plan, profile, cluster, timeline=False)
    first = min(r.op_start_s)
    return {"iteration_s": r.iteration_s / dilate, "first_op_start_s": first / dilate, "comm_busy_s": r.comm_s / dilate,
            "after_last_op_s": (r.iteration_s - max(r.op_end_s)) / dilate, "operations": len(plan.operations)}


def analyse(path: Path, evaluations: int) -> dict[str, Any]:
    rows = json.loads(path.read_text())
    first, dilate = read_bench_row(rows[0])  # run seconds: the profile and cluster the bench predicted with
    profile = Profile.from_dict(first["profile"]["measured"])
    probe, cluster = first["contention"], Cluster.from_dict(first["cluster"])
    planned = with_runtime_costs(profile, probe, False)
    ddp_row = next(r for r in rows if r["strategy"] == "ddp")
    cap = float(ddp_row.get("bucket_cap_mb") or 25.0)
    ddp = make_plan("ddp", profile, cluster, bucket_cap_mb=cap,
                    first_bucket_mb=ddp_first_bucket_mb({} if cap == 25.0 else {"bucket_cap_mb": cap}, True))
    predicted = {"ddp": simulate(ddp, with_runtime_costs(profile, probe, True), cluster).iteration_s / dilate}
    plans = {name: make_plan(name, planned, cluster) for name in PLANNERS}
    plans[GROUPED] = make_plan("usbyte", planned, cluster, groups=0)
    with _grid_before():
        plans[BEFORE] = make_plan("auto", planned, cluster)
    predicted |= {name: simulate(p, planned, cluster, timeline=False).iteration_s / dilate for name, p in plans.items()}
    planning = {"auto": _least_cpu_s(lambda: make_plan("auto", planned, cluster))}
    with _grid_before():
        planning[BEFORE] = _least_cpu_s(lambda: make_plan("auto", planned, cluster))
    best_planner = min(PLANNERS, key=predicted.__getitem__)
    searched = {}
    for kind in KINDS:
        cuts, s = search(planned, cluster, kind, evaluations)
        searched[kind] = {"iteration_s": s / dilate, "groups": len(cuts) + 1, "cuts": cuts}
    best_kind = min(KINDS, key=lambda k: searched[k]["iteration_s"])
    tight = headroom.startup_bound_s(profile, cluster)  # the profile the bench bounded
    bound = first["lower_bound_s"] / dilate
    return {"run": path.stem, "model": first.get("model"), "dilate": dilate, "bound_s": bound,
            "startup_bound_s": tight["startup_bound_s"] / dilate, "allreduce_all_s": tight["allreduce_all_s"] / dilate,
            "compute_s": profile.compute_s / dilate, "runtime_costs_s": (planned.compute_s - profile.compute_s) / dilate,
            "measured_ddp_s": ddp_row["iteration_s_median"],
            "predicted_s": predicted, "best_planner": best_planner, "auto_plan_cpu_s": planning,
            "auto_chose": _chose(plans["auto"]), "auto_before_chose": _chose(plans[BEFORE]), "searched": searched,
            "best_searched": best_kind,
            "best_planner_breakdown": breakdown(plans[best_planner], planned, cluster, dilate)}


@contextmanager
def _grid_before() -> Iterator[None]:
    """``auto``'s grid as it was before fwd10: ``usbyte`` without ``groups``."""
    saved = GRID["usbyte"]
    GRID["usbyte"] = [o for o in saved if "groups" not in o]
    try:
        yield
    finally:
        GRID["usbyte"] = saved


def _least_cpu_s(fn: Callable[[], object], repeat: int = 3) -> float:
    """The least CPU seconds of ``repeat`` calls of ``fn`` (after one to warm up): on a shared machine the steadiest."""
    fn()
    out = []
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        out.append(time.process_time() - c0)
    return min(out)


def _chose(plan: Plan) -> str:
    opts = plan.options.get("chosen_options", {})
    detail = f" groups={opts['groups']}" if opts.get("groups") is not None else ""
    return f"{plan.options.get('chose')}{detail} ({len(plan.operations)} operations)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=RUNS)
    ap.add_argument("--evaluations", type=int, default=2000, help="simulations per search (default 2000)")
    ap.add_argument("--json", type=Path, default=RESULTS / "plan_headroom.json")
    args = ap.parse_args(argv)
    out = []
    print(f"{'run':36s} {'bound':>6s} {'tight':>6s} {'ddp':>6s} " + " ".join(f"{p:>7s}" for p in PLANNERS)
          + f" {'before':>7s} {'search':>7s}  best/bound best/tight search/best  auto cpu s (before)")
    for path in args.runs:
        r = analyse(path, args.evaluations)
        out.append(r)
        p, best = r["predicted_s"], r["predicted_s"][r["best_planner"]]
        found = r["searched"][r["best_searched"]]["iteration_s"]
        print(f"{r['run'][:36]:36s} {r['bound_s']:6.3f} {r['startup_bound_s']:6.3f} {p['ddp']:6.3f} "
              + " ".join(f"{p[n]:7.3f}" for n in PLANNERS)
              + f" {p[BEFORE]:7.3f} {found:7.3f}  {best / r['bound_s']:10.3f} {best / r['startup_bound_s']:10.3f}"
              + f" {found / best:11.3f}  {r['auto_plan_cpu_s']['auto']:.3f} ({r['auto_plan_cpu_s'][BEFORE]:.3f})")
    args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "evaluations": args.evaluations,
                                     "runs": out}, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
