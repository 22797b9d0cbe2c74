"""Kept bench runs predicted again with and without the bench's two prediction fixes (no network: seconds).

    python benchmarks/predict_fixes.py [RUN.json ...]   # default: the emulated runs in benchmarks/results

Per run, the median and worst |prediction error| over its rows in four readings: as the
job's own table and contention figures give them (``benchmarks/resimulate.py``'s plans),
with PyTorch DDP's first bucket as torch 2.13 makes it (1 MiB only at DDP's default
``bucket_cap_mb``: :func:`gradsched.jobs.bench.ddp_first_bucket_mb`), with the all-reduce
table's bandwidth term through the contention probe's all-gradients all-reduce
(:func:`gradsched.jobs.bench.anchored_to_probe`, the contention figures refitted on it), both,
and both with each all-reduce costing its start-up or its bytes, whichever is longer
(:func:`gradsched.jobs.bench.with_stream_cost`, issue 35: what the bench predicts with now).
Writes ``benchmarks/results/predict_fixes.json``, with the median and worst over the 8-host runs
of the papers' models apart (``emulate_papers_*_8h*.json``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import STREAM, Cluster
from gradsched.jobs.bench import anchored_to_probe, ddp_first_bucket_mb, with_stream_cost
from gradsched.jobs.results import read_bench_row
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
import resimulate  # noqa: E402

RESULTS = Path(__file__).parent / "results"
READINGS = {"as run": (False, False, False), "first bucket": (False, True, False), "anchored": (True, False, False),
            "both": (True, True, False), "stream": (True, True, True)}


def _plan(row: dict, profile: Profile, probe: dict, job: Cluster, first: bool):
    if row["runs"] != "torch DDP":
        return resimulate.plan_as_run(row, profile, probe, job)
    cap = float(row.get("bucket_cap_mb", 25.0))
    default = row["strategy"] == "ddp" and (row.get("scale_bytes") or 1) == 1  # no bucket_cap_mb given to DDP
    return make_plan("ddp", profile, job, bucket_cap_mb=cap,
                     first_bucket_mb=ddp_first_bucket_mb({} if default else {"bucket_cap_mb": cap}, first))


def _without_stream(cluster: Cluster) -> Cluster:
    return dataclasses.replace(cluster, extra={k: x for k, x in cluster.extra.items() if k != STREAM})


def _cores(row: dict) -> int:
    """The cores of the machine a run was made on (its ``machine``: "NAME ARCH, N CPUs, torch ...")."""
    match = re.search(r"(\d+) CPUs", row.get("machine") or "")
    return int(match.group(1)) if match else 2


def errors(path: Path, anchor: bool, first: bool, stream: bool = False) -> list[float]:
    rows = json.loads(path.read_text())
    row0, dilate = read_bench_row(rows[0])
    profile, probe = Profile.from_dict(row0["profile"]["measured"]), row0["contention"]
    job = cluster = _without_stream(Cluster.from_dict(row0["cluster"]))  # runs since issue 35 carry it: readings add it
    if anchor and probe and "samples" in probe:
        alone_s = statistics.median(probe["samples"]["allreduce_alone_s"])
        cluster, _ = anchored_to_probe(job, probe["allreduce_bytes"], alone_s)
        cluster = resimulate.refit_contention(cluster, probe, bool(probe.get("history")))
        if stream:
            cluster = with_stream_cost(cluster, probe["allreduce_bytes"], alone_s, _cores(row0))
    compute_s = row0["compute_only"]["iteration_s_median"]
    out = []
    for row in rows:
        try:
            plan = _plan(row, profile, probe, job, first)
        except KeyError:  # an auto row that kept no chosen plan (planned at start-up before it was recorded)
            continue
        scaled = with_runtime_costs(calibrate(profile, compute_s), probe, row["runs"] == "torch DDP")
        predicted = simulate(plan, scaled, cluster, timeline=False).iteration_s / dilate
        out.append((predicted - row["iteration_s_median"]) / row["iteration_s_median"])
    return out


def _summary(out: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {name: {"median_abs": statistics.median(abs(x) for r in out.values() for x in r[name]),
                   "worst_abs": max(abs(x) for r in out.values() for x in r[name]),
                   "rows": sum(len(r[name]) for r in out.values())} for name in READINGS}


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(
        p for pattern in ("bench_replay_*_*h*.json", "bench_startup_*.json", "emulate_papers_*_8h*.json",
                        "bench_*_8h_*.json")
        for p in RESULTS.glob(pattern))
    out: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        out[path.stem] = {name: errors(path, *flags) for name, flags in READINGS.items()}
        print(f"{path.stem[:50]:50s}", "  ".join(f"{statistics.median(map(abs, e)):6.1%}/{max(map(abs, e)):6.1%}"
                                                 for e in out[path.stem].values()))
    summary = _summary(out)
    papers = _summary({k: r for k, r in out.items() if k.startswith("emulate_papers_") and "_8h" in k})
    print("readings (median/worst |error|):", ", ".join(READINGS))
    print("all:", json.dumps(summary))
    print("the papers' models on 8 hosts:", json.dumps(papers))
    (RESULTS / "predict_fixes.json").write_text(json.dumps({"summary": summary, "papers_8h": papers, "runs": out},
                                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
