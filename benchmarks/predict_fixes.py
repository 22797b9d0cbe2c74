"""Kept bench runs predicted again with and without the bench's two prediction fixes (no network: seconds).

    python benchmarks/predict_fixes.py [RUN.json ...]   # default: the emulated runs in benchmarks/results

Per run, the median and worst |prediction error| over its rows in four readings: as the
job's own table and contention figures give them (``benchmarks/resimulate.py``'s plans),
with PyTorch DDP's first bucket as torch 2.13 makes it (1 MiB only at DDP's default
``bucket_cap_mb``: :func:`gradsched.jobs.bench.ddp_first_bucket_mb`), with the all-reduce
table's bandwidth term through the contention probe's all-gradients all-reduce
(:func:`gradsched.jobs.bench.anchored_to_probe`, the contention figures refitted on it), both,
both with each all-reduce costing its start-up or its bytes, whichever is longer
(:func:`gradsched.jobs.bench.with_stream_cost` with ``exponent=None``, issue 35), and both with the two blended,
``(L**p + (b*B)**p)**(1/p)`` at p = :data:`gradsched.jobs.bench.STREAM_EXPONENT` (what the bench predicts with now).
Writes ``benchmarks/results/predict_fixes.json``, with the median and worst over the 8-host runs
of the papers' models apart (``emulate_papers_*_8h*.json``), per model, over PyTorch DDP's rows alone,
and over the runs the exponent was chosen on (:data:`CHOSEN_ON`) and those held out.
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
from gradsched.jobs.bench import STREAM_EXPONENT, anchored_to_probe, ddp_first_bucket_mb, with_stream_cost
from gradsched.jobs.results import read_bench_row
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
import resimulate  # noqa: E402

RESULTS = Path(__file__).parent / "results"
READINGS = {"as run": (False, False, False), "first bucket": (False, True, False), "anchored": (True, False, False),
            "both": (True, True, False), "stream": (True, True, True), "blend": (True, True, True)}
# the runs the blend's exponent was chosen on (the first 8-host run of each of the papers' models); the others are held out
CHOSEN_ON = tuple(f"emulate_papers_{m}_8h" for m in ("resnet50", "densenet201", "vgg16", "inception_v4", "bert_base",
                                                      "bert_large"))


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


def errors(path: Path, anchor: bool, first: bool, stream: bool = False,
           exponent: float | None = None) -> list[tuple[bool, float]]:
    """Per row (an ``auto`` row without its plan left out): whether PyTorch's DDP ran it, and its prediction error."""
    rows = json.loads(path.read_text())
    row0, dilate = read_bench_row(rows[0])
    profile, probe = Profile.from_dict(row0["profile"]["measured"]), row0["contention"]
    job = cluster = _without_stream(Cluster.from_dict(row0["cluster"]))  # runs since issue 35 carry it: readings add it
    if anchor and probe and "samples" in probe:
        alone_s = statistics.median(probe["samples"]["allreduce_alone_s"])
        cluster, _ = anchored_to_probe(job, probe["allreduce_bytes"], alone_s)
        cluster = resimulate.refit_contention(cluster, probe, bool(probe.get("history")))
        if stream:
            cluster = with_stream_cost(cluster, probe["allreduce_bytes"], alone_s, _cores(row0), exponent)
    compute_s = row0["compute_only"]["iteration_s_median"]
    out = []
    for row in rows:
        try:
            plan = _plan(row, profile, probe, job, first)
        except KeyError:  # an auto row that kept no chosen plan (planned at start-up before it was recorded)
            continue
        scaled = with_runtime_costs(calibrate(profile, compute_s), probe, row["runs"] == "torch DDP")
        predicted = simulate(plan, scaled, cluster, timeline=False).iteration_s / dilate
        out.append((row["runs"] == "torch DDP", (predicted - row["iteration_s_median"]) / row["iteration_s_median"]))
    return out


Errors = dict[str, dict[str, list[tuple[bool, float]]]]


def _summary(out: Errors, ddp_only: bool = False) -> dict[str, dict[str, float]]:
    summary = {}
    for name in READINGS:
        e = [abs(x) for r in out.values() for ddp, x in r[name] if ddp or not ddp_only]
        summary[name] = {"median_abs": statistics.median(e), "worst_abs": max(e), "rows": len(e)} if e else {}
    return summary


def _papers_8h(name: str) -> bool:
    return name.startswith("emulate_papers_") and "_8h" in name


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(
        p for pattern in ("bench_replay_*_*h*.json", "bench_startup_*.json", "emulate_papers_*_8h*.json",
                        "bench_*_8h_*.json")
        for p in RESULTS.glob(pattern))
    out: Errors = {}
    for path in paths:
        out[path.stem] = {name: errors(path, *flags, exponent=STREAM_EXPONENT if name == "blend" else None)
                          for name, flags in READINGS.items()}
        print(f"{path.stem[:50]:50s}", "  ".join(f"{statistics.median(abs(x) for _, x in e):6.1%}/"
                                                 f"{max(abs(x) for _, x in e):6.1%}" for e in out[path.stem].values()))
    papers = {k: r for k, r in out.items() if _papers_8h(k)}
    models = sorted({k.removeprefix("emulate_papers_").split("_8h")[0] for k in papers})
    hosts = {f"{h}h": {k: r for k, r in out.items() if f"_{h}h" in k} for h in (2, 4, 8)}
    result = {"summary": _summary(out), "papers_8h": _summary(papers), "papers_8h_ddp": _summary(papers, True),
              "papers_8h_per_model": {m: _summary({k: r for k, r in papers.items() if f"_{m}_8h" in k}) for m in models},
              "papers_8h_ddp_per_model": {m: _summary({k: r for k, r in papers.items() if f"_{m}_8h" in k}, True)
                                          for m in models},
              "ddp_by_hosts": {h: _summary(r, True) for h, r in hosts.items()},
              "ddp_8h_chosen_on": _summary({k: r for k, r in out.items() if k in CHOSEN_ON}, True),
              "ddp_8h_held_out": _summary({k: r for k, r in hosts["8h"].items() if k not in CHOSEN_ON}, True),
              "chosen_on": list(CHOSEN_ON), "stream_exponent": STREAM_EXPONENT,
              "runs": {k: {name: [x for _, x in e] for name, e in r.items()} for k, r in out.items()}}
    print("readings (median/worst |error|):", ", ".join(READINGS))
    for key in ("summary", "papers_8h", "papers_8h_ddp", "ddp_8h_chosen_on", "ddp_8h_held_out"):
        print(f"{key}:", "  ".join(f"{n} {s['median_abs']:.1%}/{s['worst_abs']:.1%}" for n, s in result[key].items()))
    for h, r in result["ddp_by_hosts"].items():
        print(f"DDP rows, {h}:", "  ".join(f"{n} {s['median_abs']:.1%}/{s['worst_abs']:.1%}" for n, s in r.items()))
    (RESULTS / "predict_fixes.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
