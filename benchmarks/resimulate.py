"""Kept bench runs predicted again: the current simulator, the current reading of the same measurements.

    python benchmarks/resimulate.py [RUN.json ...] [--json benchmarks/results/resimulate.json]
    python benchmarks/resimulate.py --rev cc5d228   # the default runs as committed at a revision
    python benchmarks/resimulate.py RUN.json --queued benchmarks/results/netbench_queued_2h_1gbit.json

``--queued FILE``: reduce-scatters and all-gathers queued together priced by FILE's rule (a cluster
file's ``queued`` field, or a bench JSON's cluster's; docs/cost-model.md, "Queued streams"); a run
measured with its own rule keeps it without the flag.  ``dear`` rows are simulated on the plan they
ran: the candidate grouping and scheduling with the row's plan hash (:func:`dear_as_run`).

Default runs: the emulated regime's (``benchmarks/results/bench_replay_*_{2,4,8}h.json``,
made by ``benchmarks/bench_replay.py``).  For each ``gradsched bench --json`` file, the
all-reduce table is read again from the medians the job measured (``measured_points``,
through :meth:`CollectiveCost.fit`'s envelopes, as ``gradsched netbench`` reads them) and
the contention figures fitted again from the probe's medians and samples
(:func:`contention_from_probe`); every row's plan is made again from the job's own
final table and simulated with them.  DDP rows' buckets are exactly what ran; ``auto``'s
plan is its chosen strategy and options, while the run planned from its start-up
measurements and re-planned from its own steps, so a few of its blocks may differ
(the operation counts are printed).  Prints per row the measured median, the
prediction the job made and the one made now, and writes the rows and the median
absolute errors as JSON.  No network: seconds.

Runs whose contention was pooled with earlier jobs' (``--contention-from``) keep their
pooled figures (the earlier jobs' samples are not in the file).

Units: the simulator runs in the job's own seconds, those of its measured profile and
cluster (stretched K times under ``--dilate K``); each row is read into them by
:func:`gradsched.jobs.results.read_bench_row`, and a prediction is divided by K once, to
compare with the row's measured median (emulated seconds, as the file holds it).  Files
with ``units`` are read by the declared types; older ones (no ``units``) by undoing the
rule on key names that wrote them, which had left ``runtime_overhead_s`` in run seconds and
divided the probe's other figures.  Before, this script used the probe's figures as the
file held them, so dilated runs were simulated with mixed units: bucket passes and host
time per operation K times too small, contention refitted from emulated measurements
against the run-second cost model, and on files with ``units`` the runtime overheads K
times too small as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from gradsched.calibration import (calibrate, contention_from_probe, median_se, phase_costs, phase_slowdowns,
                                   with_runtime_costs)
from gradsched.cluster import Cluster, CollectiveCost, Contention
from gradsched.costs import PER_RANK
from gradsched.net_extend import extended_costs
from gradsched.jobs.results import read_bench_row
from gradsched.plan import Plan
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [RESULTS / f"bench_replay_{name}.json" for name in
                ("googlenet_k80_2h", "gpt_6x512_2h", "googlenet_k80_4h", "googlenet_k80_8h")]


def reread_cluster(job: Cluster) -> Cluster:
    """The job's cluster with its all-reduce table fitted again from the medians as measured, and its
    reduce-scatter and all-gather tables extended again beyond them by the current rule (``extended_costs``)."""
    points = (job.extra or {}).get("measured_points", {})
    measured = points.get("allreduce")
    if not measured:
        return job
    cost = CollectiveCost.fit([(float(b), float(t)) for b, t in measured], envelope=True)
    two_phase = {}
    if (job.extra or {}).get("extended_beyond_bytes"):  # the job extended them to its all-reduce table's top
        top = int(job.collectives["allreduce"].points[-1][0])
        two_phase = extended_costs(points, [n for n in PER_RANK if n in job.collectives], top)
    return dataclasses.replace(job, collectives={**job.collectives, **two_phase, "allreduce": cost})


def refit_contention(cluster: Cluster, probe: dict[str, Any], pooled: bool,
                     phases: dict[str, float] | None = None) -> Cluster:
    """``cluster`` with the contention figures the probe's measurements give now (pooled runs: as kept).
    The two phases' own slowdowns from the probe's times of them against the cluster's tables (jobs that ran
    two-phase rows since issue 36's round 7), else from ``phases`` where given: each phase's ``1 + slowdown``
    over the all-reduce's in another job (:func:`phase_ratios`), times this job's all-reduce's."""
    if pooled or "samples" not in probe:
        return cluster
    from gradsched.torch.measure.probe import SMALL_NUMEL

    cost = cluster.cost("allreduce")
    fitted = contention_from_probe(probe["compute_alone_s"], cost.time_s(probe["allreduce_bytes"]),
                                   probe["compute_overlapped_s"], probe["allreduce_overlapped_s"],
                                   probe["small_ops"] * cost.time_s(SMALL_NUMEL * 4), probe["small_ops_busy_s"],
                                   probe["small_ops"], probe["small_ops_alone_s"],
                                   median_se(probe["samples"]["small_ops_busy_s"]))
    own = phase_slowdowns(probe, {n: c.time_s(probe["allreduce_bytes"]) for n, c in phase_costs(cluster).items()})
    if not own and phases:
        own = {f"{n}_comm_slowdown": max(0.0, (1 + fitted["comm_slowdown"]) * r - 1) for n, r in phases.items()}
    return dataclasses.replace(cluster, contention=Contention(**fitted, **own))


def phase_ratios(path: Path) -> dict[str, float]:
    """Each two-phase collective's ``1 + slowdown`` over the all-reduce's in a bench JSON whose probe timed the two
    phases, fitted as the job fitted its all-reduce's (against its own tables), to price another job's by
    (``--phases-from``)."""
    first, _ = read_bench_row(json.loads(path.read_text())[0])
    probe = first["contention"]
    job = Cluster.from_dict(first["cluster"])
    own = phase_slowdowns(probe, {n: c.time_s(probe["allreduce_bytes"]) for n, c in phase_costs(job).items()})
    if not own:
        raise SystemExit(f"{path}: its probe did not time the two phases (a job with a dear or fsdp2 row, since round 7)")
    kn = probe.get("own_fitted", probe["fitted"])["comm_slowdown"]
    return {n: (1 + own[f"{n}_comm_slowdown"]) / (1 + kn) for n in ("reducescatter", "allgather")}


def plan_as_run(row: dict[str, Any], profile: Profile, probe: dict[str, Any], job: Cluster):
    """The plan the row ran, made as the job made it: DDP rows as DDP buckets, the rest from the job's table."""
    if row["runs"] == "torch DDP" or "bucket_cap_mb" in (row.get("plan_options") or {}):  # auto keeping DDP too
        cap = row.get("bucket_cap_mb", (row.get("plan_options") or {}).get("bucket_cap_mb", 25.0))
        return make_plan("ddp", profile, job, bucket_cap_mb=float(cap))
    planned = with_runtime_costs(profile, probe, False)
    name, opts = ((row["plan_options"]["chose"], row["plan_options"]["chosen_options"]) if row["strategy"] == "auto"
                  else (row["strategy"], row.get("options") or {}))
    if name == "usbyte":
        opts = {"merge_bytes": 0, **opts}  # runs from before the option: the paper's layers
    if name == "dear" and opts.get("grouping", "planned") == "planned":
        ran = dear_as_run(row, planned, job)
        if ran is not None:
            return ran
    return make_plan(name, planned, job, **opts)


def dear_as_run(row: dict[str, Any], planned: Profile, job: Cluster) -> Plan | None:
    """The ``dear`` plan the row ran: the candidate grouping and scheduling whose plan has the row's hash, else the
    grouping it names in fifo order; None where it names none.  Planned again, ``dear`` would choose by today's
    simulator, which can pick another grouping than the run's (GoogLeNet: 26 operations instead of 10)."""
    from gradsched.planners._tables import tensor_table
    from gradsched.planners.dear import candidate_groupings, prioritized, two_phase_ops

    options = row.get("plan_options") or {}
    named = options.get("planned_grouping", (options.get("chosen_options") or {}).get("planned_grouping"))
    fallback = None
    for name, groups in candidate_groupings(planned, job):
        ops = two_phase_ops(groups, planned, tensor_table(planned).whole)
        for scheduling in ("fifo", "priority"):
            plan = Plan("dear", prioritized(ops) if scheduling == "priority" else ops, planned.fingerprint,
                        planned.model, {"grouping": "planned", "planned_grouping": name}, scheduling=scheduling,
                        overlap_forward=True)
            if plan.hash == row.get("plan_hash"):
                return plan
            if name == named and fallback is None:
                fallback = plan
    return fallback


def read_queued(path: Path) -> dict[str, Any] | None:
    """The ``queued`` rules of a cluster file, or of a ``gradsched bench --json`` file's cluster (its first row's)."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        data = data[0]["cluster"] if data else {}
    return data.get("queued")


def with_queued(cluster: Cluster, rules: dict[str, Any] | None) -> Cluster:
    """``cluster`` with the queued-stream rules (a cluster file's ``queued`` field) added, where given (the simulator
    uses those of reduce-scatter and all-gather: docs/cost-model.md, "Queued streams")."""
    if not rules:
        return cluster
    return dataclasses.replace(cluster, extra={**cluster.extra, "queued": rules})


def read_run(path: Path, rev: str | None) -> list[dict[str, Any]]:
    """A bench JSON's rows, from the working tree or as committed at ``rev``."""
    if rev is None:
        return json.loads(path.read_text())
    rel = path.resolve().relative_to(ROOT)
    return json.loads(subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, check=True, capture_output=True,
                                     text=True).stdout)


def resimulate(path: Path, rev: str | None = None, queued: dict[str, Any] | None = None,
               phases: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per strategy of one bench JSON: measured, predicted then, predicted now (emulated seconds)."""
    rows = read_run(path, rev)
    first, dilate = read_bench_row(rows[0])  # in the run's seconds, as its profile and cluster
    profile = Profile.from_dict(first["profile"]["measured"])
    probe = first["contention"]
    job = Cluster.from_dict(first["cluster"])
    now = with_queued(refit_contention(reread_cluster(job), probe, bool((probe or {}).get("history")), phases), queued)
    compute_s = first["compute_only"]["iteration_s_median"]
    out = []
    for row in rows:
        plan = plan_as_run(row, profile, probe, job)
        scaled = with_runtime_costs(calibrate(profile, compute_s), probe, row["runs"] == "torch DDP")
        predicted = simulate(plan, scaled, now, timeline=False).iteration_s / dilate
        measured = row["iteration_s_median"]
        out.append({"run": path.stem, "strategy": row["strategy"], "operations": len(plan.operations),
                    "operations_run": row.get("operations"), "measured_s": measured,
                    "predicted_then_s": row["predicted_iteration_s"], "predicted_now_s": predicted,
                    "error_then": row["prediction_error"], "error_now": (predicted - measured) / measured})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--rev", default=None, help="read the runs as committed at this git revision")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and medians here")
    ap.add_argument("--queued", type=Path, default=None, metavar="FILE.json",
                    help="price queued reduce-scatters and all-gathers by this cluster file's (or bench JSON's) "
                         "queued rule "
                         "(gradsched netbench --queue-depths; docs/cost-model.md, \"Queued streams\")")
    ap.add_argument("--phases-from", type=Path, default=None, metavar="RUN.json",
                    help="price the two phases of runs whose probe did not time them by their slowdowns relative to "
                         "the all-reduce in RUN.json's probe (docs/cost-model.md, \"Contention\")")
    args = ap.parse_args(argv)
    queued = read_queued(args.queued) if args.queued else None
    phases = phase_ratios(args.phases_from) if args.phases_from else None
    rows = [r for path in args.runs for r in resimulate(path, args.rev, queued, phases)]
    print(f"{'run':32s} {'strategy':12s} {'ops':>4s} {'measured':>9s} {'then':>9s} {'now':>9s} {'err then':>9s} "
          f"{'err now':>8s}")
    for r in rows:
        mark = "" if r["operations_run"] in (None, r["operations"]) else f"  (ran {r['operations_run']} operations)"
        print(f"{r['run']:32s} {r['strategy']:12s} {r['operations']:4d} {r['measured_s'] * 1e3:9.1f} "
              f"{r['predicted_then_s'] * 1e3:9.1f} {r['predicted_now_s'] * 1e3:9.1f} {r['error_then'] * 100:+8.1f}% "
              f"{r['error_now'] * 100:+7.1f}%{mark}")
    then = statistics.median(abs(r["error_then"]) for r in rows)
    now = statistics.median(abs(r["error_now"]) for r in rows)
    worst = max(abs(r["error_now"]) for r in rows)
    print(f"median |error|: {then * 100:.2f}% then, {now * 100:.2f}% now (worst row now {worst * 100:.1f}%), "
          f"{len(rows)} rows")
    if args.json:
        runs = [str(p.resolve().relative_to(ROOT)) for p in args.runs]
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "runs": runs, "rev": args.rev,
                                         "queued": queued, "phases_from": phases,
                                         "median_abs_error_then": then, "median_abs_error_now": now,
                                         "max_abs_error_now": worst, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
