"""The 8-host replays predicted again with a per-operation latency during compute fitted on DDP's rows alone.

    python benchmarks/busy_latency_refit.py [RUN.json ...]   # default: benchmarks/results/emulate_papers_*_8h*.json

Why (docs/notes/2026-12-bench-runs.md, "Where `auto`'s 130 ms go on 8 emulated hosts"): on 8 gloo
ranks sharing 2 cores, an all-reduce that runs while the ranks compute (their backward: autograd, hooks,
the replay's sleeps waking up) takes longer than the network table says, by about the same time per
operation whatever its bytes (a ring of 8 needs 14 hand-offs, each a thread woken on a busy core).  The
simulator has that term (``Contention.busy_latency_s``, more per collective that starts during compute),
but the bench's probe fits it from 8 all-reduces of 4 KiB during a replay step without hooks, and finds
0 ms on these runs.  Here it is fitted instead on each run's PyTorch DDP rows (their buckets are exactly
what ran): the value, on a grid, that minimises the DDP rows' median |error|; then every row, ``auto``
included, is predicted with it.  ``auto``'s plan is re-made from its chosen strategy and options
(``resimulate.plan_as_run``), which may differ from the plan that ran by a few operations (printed).

Prints per run the fitted latency (run seconds and emulated), and per row the measured median, the
prediction as the job's figures give it and with the fitted latency; writes
``benchmarks/results/busy_latency_refit.json``.  No network: seconds.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import Cluster
from gradsched.jobs.bench import ddp_first_bucket_mb
from gradsched.jobs.results import read_bench_row
from gradsched.planners import make_plan
from gradsched.planners.registry import planner_option_specs
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
import resimulate  # noqa: E402

RESULTS = Path(__file__).parent / "results"
GRID_S = [k * 0.001 for k in range(0, 41)]  # 0-40 ms of run time per operation during compute


def _plan(row: dict[str, Any], profile: Profile, probe: dict[str, Any], job: Cluster) -> Any:
    if row["runs"] != "torch DDP":
        options = row.get("plan_options") or {}
        if row["strategy"] == "auto" and "chose" in options:  # keys a planner records but does not take
            known = planner_option_specs(options["chose"])
            row = {**row, "plan_options": {**options, "chosen_options": {
                k: v for k, v in (options.get("chosen_options") or {}).items() if k in known}}}
        return resimulate.plan_as_run(row, profile, probe, job)
    cap = float(row.get("bucket_cap_mb", 25.0))
    default = row["strategy"] == "ddp" and (row.get("scale_bytes") or 1) == 1
    return make_plan("ddp", profile, job, bucket_cap_mb=cap,
                     first_bucket_mb=ddp_first_bucket_mb({} if default else {"bucket_cap_mb": cap}, True))


def _predict(rows: list[dict[str, Any]], plans: list[Any], scaled: list[Profile], job: Cluster,
             latency_s: float) -> list[float]:
    """Each row's predicted iteration (run seconds) with ``busy_latency_s = latency_s``."""
    contention = dataclasses.replace(job.contention, busy_latency_s=latency_s)
    cluster = dataclasses.replace(job, contention=contention)
    return [simulate(p, s, cluster, timeline=False).iteration_s for p, s in zip(plans, scaled)]


def refit(path: Path) -> dict[str, Any]:
    """One run: the latency fitted on its DDP rows and every row's error without and with it."""
    raw = json.loads(path.read_text())
    first, dilate = read_bench_row(raw[0])
    profile, probe = Profile.from_dict(first["profile"]["measured"]), first["contention"]
    job = Cluster.from_dict(first["cluster"])
    compute_s = first["compute_only"]["iteration_s_median"]
    rows = [read_bench_row(r)[0] for r in raw]
    plans = [_plan(r, profile, probe, job) for r in rows]
    scaled = [with_runtime_costs(calibrate(profile, compute_s), probe, r["runs"] == "torch DDP") for r in rows]
    measured = [r["iteration_s_median"] for r in rows]
    ddp = [i for i, r in enumerate(rows) if r["runs"] == "torch DDP"]

    def errors(latency_s: float) -> list[float]:
        return [(p - m) / m for p, m in zip(_predict(rows, plans, scaled, job, latency_s), measured)]

    table = {lat: errors(lat) for lat in GRID_S}
    fitted = min(GRID_S, key=lambda lat: (statistics.median(abs(table[lat][i]) for i in ddp), lat))
    base = job.contention.busy_latency_s
    as_run = errors(base)
    return {"run": path.stem, "dilate": dilate, "probe_busy_latency_s": base, "fitted_busy_latency_s": fitted,
            "fitted_busy_latency_emulated_s": fitted / dilate,
            "rows": [{"strategy": r["strategy"], "operations": len(p.operations), "ran_operations": r["operations"],
                      "measured_s": m / dilate, "error_as_run": e0, "error_fitted": e1}
                     for r, p, m, e0, e1 in zip(rows, plans, measured, as_run, table[fitted])]}


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(RESULTS.glob("emulate_papers_*_8h*.json"))
    out = []
    for path in paths:
        run = refit(path)
        out.append(run)
        print(f"{run['run']}: busy latency fitted on DDP's rows {run['fitted_busy_latency_s'] * 1e3:.0f} ms "
              f"({run['fitted_busy_latency_emulated_s'] * 1e3:.1f} ms emulated; the probe's "
              f"{run['probe_busy_latency_s'] * 1e3:.1f} ms)")
        for r in run["rows"]:
            ops = f"{r['operations']}" + (f" (ran {r['ran_operations']})" if r["operations"] != r["ran_operations"] else "")
            print(f"  {r['strategy']:10s} {ops:14s} measured {r['measured_s'] * 1e3:7.1f} ms  "
                  f"error as run {r['error_as_run']:+6.1%}  with the fitted latency {r['error_fitted']:+6.1%}")
    (RESULTS / "busy_latency_refit.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
