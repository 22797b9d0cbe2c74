"""Kept 8-host runs' ``dear`` plans predicted again: the reduce-scatter and all-gather priced as the cluster derives
them now (the job's table timed the all-reduce only) against what each ran.

    python benchmarks/dear_trials.py [RUN.json ...] [--json benchmarks/results/dear_trials.json]
    python benchmarks/dear_trials.py --half   # the rule before: each phase half the all-reduce
    python benchmarks/dear_trials.py --as-bench [--ratios RS,AG]   # the cluster as ``gradsched bench`` prices now
    python benchmarks/dear_trials.py --rings [--as-bench] --json benchmarks/results/dear_trials_rings.json

``--rings`` (phase11): each run's ``dear`` plans priced twice with the phases derived from the all-reduce (the timed
phases of a run whose table timed them set aside, with its probe's times of them): "a2a", the rule before phase11,
all-to-alls at every size; "by size", as the runtime runs them (:meth:`gradsched.cluster.Cluster.phase_cost`: a ring
from ``RING_MIN_BYTES``, 4 MiB).  Beside them, a run with timed phases predicted on its own tables ("timed").  The
runs made before the rings (:data:`RING_RUNS` lists those made after; every other stored run ran on code before
``6d08978``, 14:51 UTC on 2026-12-07, runs10 included: main of ``68774c3``) ran the all-to-alls at every size, and
every reading here prices them so: their "by size" is their "a2a".

``--as-bench`` (err10): the job's own table (fitted up to the model's size, where the default reading refits the line
from the medians below 2 MiB, 22-33% less a byte on the six runs), anchored to the probe's least all-reduce of every
gradient, with the stream cost and the phases at the ratios measured alone
(``predict_fixes.py``'s reading "err10": :func:`gradsched.jobs.bench.with_phase_ratios`); ``--ratios`` overrides them.

Each run's ``dear`` plan is the one with the hash it ran (run-time ``auto``'s trial, in the ``auto`` row's
``autotune.trial_decision``; or the row's own plan where ``auto`` planned ``dear`` at start-up), found among
``dear``'s candidate groupings (``resimulate.dear_as_run``) and simulated on the job's cluster and probe as
``benchmarks/resimulate.py`` reads them.  Prints per run the measured median of the trial's windows (or the row's),
the prediction the job made, and the one made now.  No network: seconds.

Run-time ``auto`` planned its trials from its own profiled steps, so their hashes are not among the start-up
profile's candidates: those are ``dear``'s plan on the start-up profile, planned with the phases as the job derived
them (half), and "now" differs from "then" by that too: compare ``--half`` (the old rule, same plan) with the
default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resimulate import dear_as_run, reread_cluster, refit_contention

from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import Cluster
from gradsched.costs import NO_RING_BYTES, PER_RANK
from gradsched.jobs.bench import ddp_first_bucket_mb
from gradsched.jobs.results import read_bench_row
from gradsched.plan import Plan
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [RESULTS / f"emulate_papers_{name}.json" for name in
                ("bert_base_8h_ovh9", "bert_base_8h_start8", "densenet201_8h_runs9", "vgg16_8h_runs9",
                 "vgg16_8h_runs9b", "bert_large_8h_start8")]
# Stored runs whose dear ran rings (the runtime's threshold then, bytes); every other ran the all-to-alls at every size.
RING_RUNS = {"emulate_papers_vgg16_8h_ring10": 4 << 20}
RING_DEFAULT_RUNS = [*DEFAULT_RUNS, RESULTS / "emulate_papers_vgg16_8h_ring10.json"]


@dataclass(frozen=True)
class StoredBench:
    """A stored 8-host bench read back for re-prediction: its rows, its first row (the job's shared figures), the
    profile as planned (``planned``: the runtime's costs on the measured profile) and as simulated (``scaled``:
    calibrated to the compute-only row; ``scaled_ddp``: with PyTorch DDP's costs), and the ``ddp`` row's bucket size."""

    rows: list[dict[str, Any]]
    first: dict[str, Any]
    dilate: float
    profile: Profile
    planned: Profile
    scaled: Profile
    scaled_ddp: Profile
    ddp_cap_mb: float

    @classmethod
    def read(cls, path: Path) -> "StoredBench":
        rows = json.loads(path.read_text())
        first, dilate = read_bench_row(rows[0])
        profile = Profile.from_dict(first["profile"]["measured"])
        probe = first["contention"]
        calibrated = calibrate(profile, first["compute_only"]["iteration_s_median"])
        ddp_row = next(r for r in rows if r["strategy"] == "ddp")
        return cls(rows, first, dilate, profile, with_runtime_costs(profile, probe, False),
                   with_runtime_costs(calibrated, probe, False), with_runtime_costs(calibrated, probe, True),
                   float(ddp_row.get("bucket_cap_mb") or 25.0))

    def ddp_plan(self, cluster: Cluster) -> Plan:
        """The ``ddp`` row's plan: its bucket size, PyTorch's first bucket as torch 2.13 makes it."""
        cap = self.ddp_cap_mb
        return make_plan("ddp", self.profile, cluster, bucket_cap_mb=cap,
                         first_bucket_mb=ddp_first_bucket_mb({} if cap == 25.0 else {"bucket_cap_mb": cap}, True))


def write_runs(path: Path, runs: list[Path], results: list[dict[str, Any]], **extra: Any) -> None:
    """A stored-bench benchmark's JSON: its command, the runs it read (relative to the repository), ``extra`` and
    ``results``."""
    path.write_text(json.dumps({"command": " ".join(["python", *sys.argv]),
                                "runs": [str(p.resolve().relative_to(ROOT)) for p in runs], **extra,
                                "results": results}, indent=1))


def dear_runs(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """``(plan hash, measured s, predicted s then)`` of each ``dear`` plan the run ran: run-time ``auto``'s
    trials (median of its windows) and rows that ran ``dear`` for the whole job."""
    out = []
    for row in rows:
        chose = (row.get("plan_options") or {}).get("chose")
        if row["strategy"] == "dear" or (row["strategy"] == "auto" and chose == "dear"):
            out.append((row["plan_hash"], row["iteration_s_median"], row["predicted_iteration_s"]))
        trials = (row.get("autotune") or {}).get("trial_decision") or {}
        for h, name in (trials.get("plans") or {}).items():
            if name == "dear":
                then = [s["predicted_iteration_s"] for s in row["autotune"]["switches"] if s["plan_hash"] == h]
                out.append((h, trials["measured"][h], then[0] if then else float("nan")))
    return out


def with_ratios(cluster: Cluster, reducescatter: float, allgather: float) -> Cluster:
    """``cluster`` with its derived reduce-scatter and all-gather at these ratios over half the all-reduce."""
    return dataclasses.replace(cluster, extra={**cluster.extra, "derived_phase_ratios": {
        "reducescatter": reducescatter, "allgather": allgather}})


def as_half(cluster: Cluster) -> Cluster:
    """``cluster`` with the reduce-scatter and all-gather derived as before: half the all-reduce each."""
    return with_ratios(cluster, 1.0, 1.0)


def with_threshold(cluster: Cluster, least: int) -> Cluster:
    """``cluster`` with the runtime's ring threshold as a run ran it (``NO_RING_BYTES``: the all-to-alls at every size)."""
    return dataclasses.replace(cluster, extra={**cluster.extra, "ring_min_bytes": least})


def untimed(first: dict[str, Any]) -> dict[str, Any]:
    """A run's first row as if its table and probe had not timed the two phases: the cluster derives them."""
    cluster = {**first["cluster"], "collectives": {k: c for k, c in first["cluster"]["collectives"].items()
                                                   if k not in PER_RANK}}
    for key in ("points", "measured_points", "startup_measured_points"):
        if isinstance(cluster.get(key), dict):
            cluster[key] = {k: x for k, x in cluster[key].items() if k not in PER_RANK}
    probe = dict(first["contention"] or {})
    for key in list(probe):
        if key.startswith(PER_RANK):
            del probe[key]
    for key in ("samples", "fitted", "startup_fitted"):
        if isinstance(probe.get(key), dict):
            probe[key] = {k: x for k, x in probe[key].items() if not k.startswith(PER_RANK)}
    return {**first, "cluster": cluster, "contention": probe}


def predict(path: Path, half: bool, ratios: tuple[float, float] | None = None,
            as_bench: bool = False, rings: str = "as-run", drop_timed: bool = False) -> list[dict[str, Any]]:
    """Each ``dear`` plan of the run at ``path`` predicted again.  ``rings``: "as-run" (the threshold the run ran,
    :data:`RING_RUNS`), "never" (the all-to-alls at every size); ``drop_timed``: the phases derived even where the
    table timed them (:func:`untimed`)."""
    rows = json.loads(path.read_text())
    first, dilate = read_bench_row(rows[0])
    timed = bool(set(PER_RANK) & set(first["cluster"]["collectives"]))
    pricing_row = untimed(first) if drop_timed else first
    profile = Profile.from_dict(first["profile"]["measured"])
    probe = first["contention"]
    job = Cluster.from_dict(first["cluster"])
    if as_bench:
        from predict_fixes import bench_reading

        now = bench_reading(pricing_row)
    else:
        own_probe = pricing_row["contention"]
        now = refit_contention(reread_cluster(Cluster.from_dict(pricing_row["cluster"])), own_probe,
                               bool((own_probe or {}).get("history")))
    if half:
        now = as_half(now)
    elif ratios is not None:
        now = with_ratios(now, *ratios)
    least = RING_RUNS.get(path.stem, NO_RING_BYTES) if rings == "as-run" else NO_RING_BYTES
    now = with_threshold(now, least)
    compute_s = first["compute_only"]["iteration_s_median"]
    planned = with_runtime_costs(profile, probe, False)
    scaled = with_runtime_costs(calibrate(profile, compute_s), probe, False)
    out = []
    as_planned = with_threshold(as_half(job), RING_RUNS.get(path.stem, NO_RING_BYTES))  # the job's pricing then
    for plan_hash, measured, then in dear_runs(rows):
        plan = dear_as_run({"plan_hash": plan_hash, "plan_options": {}}, planned, as_planned)
        found = plan is not None and plan.hash == plan_hash
        if not found:  # run-time auto planned from its own profiled steps: dear's plan on the start-up profile
            plan = make_plan("dear", planned, as_planned)
        predicted = simulate(plan, scaled, now, timeline=False).iteration_s / dilate
        out.append({"run": path.stem, "plan_hash": plan_hash, "operations": len(plan.operations), "same_plan": found,
                    "rings": path.stem in RING_RUNS, "phases_timed": timed and not drop_timed,
                    "group_bytes": group_bytes(plan, profile),
                    "measured_s": measured, "predicted_then_s": then, "predicted_now_s": predicted,
                    "error_then": (then - measured) / measured, "error_now": (predicted - measured) / measured})
    return out


def group_bytes(plan: Any, profile: Profile) -> list[int]:
    """Each reduce-scatter's bytes (a group's), in plan order."""
    return [sum(s.numel * profile.tensors[s.tensor].element_bytes for s in op.slices)
            for op in plan.operations if op.collective == "reduce-scatter"]


def rings_table(runs: list[Path], as_bench: bool) -> list[dict[str, Any]]:
    """Per ``dear`` plan: measured, and predicted with the phases derived as all-to-alls at every size ("a2a", the
    rule before) and by size ("by size": rings from the threshold where the run ran them), and on the run's own
    tables where it timed them ("timed")."""
    out = []
    for path in runs:
        a2a = predict(path, False, None, as_bench, rings="never", drop_timed=True)
        by_size = predict(path, False, None, as_bench, rings="as-run", drop_timed=True)
        timed = predict(path, False, None, as_bench) if by_size and by_size[0]["rings"] else [None] * len(by_size)
        for a, b, t in zip(a2a, by_size, timed):
            m = a["measured_s"]
            least = RING_RUNS.get(path.stem)
            out.append({"run": a["run"], "plan_hash": a["plan_hash"], "operations": a["operations"],
                        "same_plan": a["same_plan"], "ran": "rings from 4 MiB" if least else "all-to-alls",
                        "group_mib": [round(x / 2**20, 2) for x in a["group_bytes"]],
                        "ring_groups": sum(x >= least for x in a["group_bytes"]) if least else 0,
                        "measured_s": m, "predicted_then_s": a["predicted_then_s"],
                        "a2a_s": a["predicted_now_s"], "by_size_s": b["predicted_now_s"],
                        "timed_s": t["predicted_now_s"] if t else None,
                        "error_a2a": a["error_now"], "error_by_size": b["error_now"],
                        "error_timed": t["error_now"] if t else None})
    return out


def print_rings(rows: list[dict[str, Any]]) -> None:
    print(f"{'run':40s} {'ops':>4s} {'ran':>16s} {'measured':>9s} {'a2a':>9s} {'by size':>9s} {'timed':>9s}"
          f" {'err a2a':>8s} {'err size':>8s}")
    for r in rows:
        timed = f"{r['timed_s'] * 1e3:9.1f}" if r["timed_s"] else f"{'-':>9s}"
        print(f"{r['run']:40s} {r['operations']:4d} {r['ran']:>16s} {r['measured_s'] * 1e3:9.1f} {r['a2a_s'] * 1e3:9.1f} "
              f"{r['by_size_s'] * 1e3:9.1f} {timed} {r['error_a2a'] * 100:+7.1f}% {r['error_by_size'] * 100:+7.1f}%")
    for key in ("error_a2a", "error_by_size"):
        print(f"median |{key}|: {statistics.median(abs(r[key]) for r in rows) * 100:.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--half", action="store_true", help="derive each phase as half the all-reduce (the rule before)")
    ap.add_argument("--ratios", default=None, metavar="RS,AG",
                    help="derive the phases at these ratios over half the all-reduce instead of the cluster's")
    ap.add_argument("--as-bench", action="store_true",
                    help="read the cluster as gradsched bench prices now (anchored, measured phase ratios)")
    ap.add_argument("--rings", action="store_true",
                    help="phases derived as all-to-alls at every size against by size (rings from the threshold)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and medians here")
    args = ap.parse_args(argv)
    if args.rings:
        runs = RING_DEFAULT_RUNS if args.runs is DEFAULT_RUNS else args.runs
        table = rings_table(runs, args.as_bench)
        print_rings(table)
        if args.json:
            args.json.write_text(json.dumps({
                "command": " ".join(["python", *sys.argv]), "as_bench": args.as_bench,
                "runs": [str(p.resolve().relative_to(ROOT)) for p in runs], "ring_runs": RING_RUNS,
                "median_abs_error_a2a": statistics.median(abs(r["error_a2a"]) for r in table),
                "median_abs_error_by_size": statistics.median(abs(r["error_by_size"]) for r in table),
                "rows": table}, indent=1))
        return 0
    ratios = tuple(float(x) for x in args.ratios.split(",")) if args.ratios else None
    rows = [r for p in args.runs for r in predict(p, args.half, ratios, args.as_bench)]  # type: ignore[arg-type]
    if not rows:
        print("no dear plan ran in these runs (neither a dear row nor a run-time auto trial of dear)")
        return 0
    print(f"{'run':40s} {'ops':>4s} {'measured':>9s} {'then':>9s} {'now':>9s} {'err then':>9s} {'err now':>8s}")
    for r in rows:
        print(f"{r['run']:40s} {r['operations']:4d} {r['measured_s'] * 1e3:9.1f} {r['predicted_then_s'] * 1e3:9.1f} "
              f"{r['predicted_now_s'] * 1e3:9.1f} {r['error_then'] * 100:+8.1f}% {r['error_now'] * 100:+7.1f}%")
    then = statistics.median(abs(r["error_then"]) for r in rows)
    now = statistics.median(abs(r["error_now"]) for r in rows)
    print(f"median |error|: {then * 100:.1f}% then, {now * 100:.1f}% now, {len(rows)} dear plans")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "half": args.half,
                                         "ratios": ratios, "as_bench": args.as_bench,
                                         "runs": [str(p.resolve().relative_to(ROOT)) for p in args.runs],
                                         "median_abs_error_then": then, "median_abs_error_now": now,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
