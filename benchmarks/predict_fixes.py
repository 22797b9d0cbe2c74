"""Kept bench runs predicted again with and without the bench's two prediction fixes (no network: seconds).

    python benchmarks/predict_fixes.py [RUN.json ...]   # default: the emulated runs in benchmarks/results
    python benchmarks/predict_fixes.py --implied        # the 8-host runs: the start-up each DDP row implies
    python benchmarks/predict_fixes.py --choose         # the DDP rows with each start-up figure and exponent
    python benchmarks/predict_fixes.py --table [RUN.json ...] [--out FILE]   # per row, before and after err10
    python benchmarks/predict_fixes.py --variants [RUN.json ...] [--out FILE]  # err11's start-up readings, by row kind and load

Per run, the median and worst |prediction error| over its rows in four readings: as the
job's own table and contention figures give them (``benchmarks/resimulate.py``'s plans),
with PyTorch DDP's first bucket as torch 2.13 makes it (1 MiB only at DDP's default
``bucket_cap_mb``: :func:`gradsched.jobs.bench.ddp_first_bucket_mb`), with the all-reduce
table's bandwidth term through the contention probe's all-gradients all-reduce
(:func:`gradsched.jobs.bench.anchored_to_probe`, the contention figures refitted on it), both,
both with each all-reduce costing its start-up or its bytes, whichever is longer
(:func:`gradsched.jobs.bench.with_stream_cost` with ``exponent=None``, issue 35), and both with the two blended,
``(L**p + (b*B)**p)**(1/p)`` at p = :data:`BLEND_EXPONENT` (before err10), and "err10" (what
the bench predicted with from err10 to err11): the blend with the probe's all-reduce at the least of its samples
(:func:`gradsched.jobs.bench.probe_alone_s`) and the phases the table did not time at the ratios netbench measured
alone (:func:`gradsched.jobs.bench.with_phase_ratios`).
``--table``: per row of the 8-host runs of the papers' models (or the runs given), its operations, measured median,
its counted rounds' medians and the error as run, "blend" and "err10", whether the prediction lies within its
rounds' range, and whether it ran today's runtime (:data:`PIECES_SINCE`); summaries over all rows, per model, and
over the runs :data:`CHOSEN_ON` and the others; writes ``benchmarks/results/predict_fixes_rows.json`` (or ``--out``).
``--variants``: every row of the 2-, 4- and 8-host runs (or the runs given) in the readings of :data:`VARIANTS` (err11:
the queued start-up against the table's, the blend against the longer), summarised by hosts and row kind (``ddp-1mb``,
``ddp-5mb``, PyTorch DDP's other rows, gradsched's all-reduce plans, and since err12 the two-phase rows apart: ``dear``,
``fsdp2``, an ``auto`` that ran a decoupled plan) and, on 8 hosts, by the load the job ran beside (quiet: no counted
round above the job's ``loaded_above`` where it recorded its load per round, since err12; else the 1-minute load at most
:data:`QUIET_LOAD` after it, from its summary); writes ``benchmarks/results/predict_fixes_ops13.json`` (or ``--out``;
err11's and err12's runs of it: ``predict_fixes_err11.json``, ``predict_fixes_err12.json``); since ops13 with the reading
"queue gain", the bench's pricing since ops13: the table's start-up over :data:`gradsched.jobs.bench.STREAM_QUEUE_GAIN`.
Since tidy13 a gradsched row is read on the plan it ran, made again from its JSON and checked against its ``plan_hash``
(:func:`plan_as_run`), or left out with the reason (``skipped`` in the JSON): run-time ``auto`` planned from its own
measured profile, and re-planned rows were off by up to 1048% (q12).
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
from collections.abc import Iterable
from pathlib import Path

from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import STREAM, Cluster
from gradsched.errors import GradschedError
from gradsched.jobs.bench import (STREAM_EXPONENT, STREAM_QUEUE_GAIN, anchored_to_probe, ddp_first_bucket_mb,
                                  probe_alone_s, with_phase_ratios, with_stream_cost)
from gradsched.jobs.results import read_bench_row
from gradsched.jobs.rounds import loaded_rounds
from gradsched.plan import Plan
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
import resimulate  # noqa: E402

RESULTS = Path(__file__).parent / "results"
BLEND_EXPONENT = 2.0  # err9's blend, the bench's exponent until err11 (its STREAM_EXPONENT is None since: the longer)
READINGS = {"as run": (False, False, False), "first bucket": (False, True, False), "anchored": (True, False, False),
            "both": (True, True, False), "stream": (True, True, True), "blend": (True, True, True),
            "err10": (True, True, True)}
# the runs the blend's exponent was chosen on (the first 8-host run of each of the papers' models); the others are held out
CHOSEN_ON = tuple(f"emulate_papers_{m}_8h" for m in ("resnet50", "densenet201", "vgg16", "inception_v4", "bert_base",
                                                      "bert_large"))


# what a gradsched row's plan_options hold beside its planner's options (dear's record of its grouping, a prediction)
NOT_PLANNER_OPTIONS = frozenset({"predicted_iteration_s", "planned_grouping"})


class NotAsRun(Exception):
    """A gradsched row whose plan could not be made again from what its JSON records: the reason."""


def plan_as_run(row: dict, profile: Profile, probe: dict, job: Cluster) -> Plan:
    """The plan a gradsched row ran, made again from what its JSON records and checked against its ``plan_hash``:
    ``resimulate.plan_as_run``'s (offline ``auto``'s choice, ``dear``'s grouping), else, for a row of one planner, that
    planner with the row's ``plan_options`` (its planner's options, as ``gradsched bench`` scaled them: rows carry no
    ``options``, which ``resimulate.plan_as_run`` reads, so it plans them at their defaults).  Raises
    :class:`NotAsRun` where neither is the plan run: run-time ``auto`` planned from its own measured profile, and a
    search of today's code may order or cut otherwise; predicted, such a plan is another plan's figure (q12's
    DenseNet-201 at byte scale 8: ``threshold`` re-planned into 1 operation where it ran 52, ``usbyte`` into 402
    where it ran 4: -24% and +1048%)."""
    made = [resimulate.plan_as_run(row, profile, probe, job)]
    options = {k: v for k, v in (row.get("plan_options") or {}).items() if k not in NOT_PLANNER_OPTIONS}
    if row["strategy"] != "auto" and options:
        try:
            made.append(make_plan(row["strategy"], with_runtime_costs(profile, probe, False), job, **options))
        except GradschedError:  # options of another version of the planner
            pass
    for plan in made:
        if row.get("plan_hash") in (plan.hash, dataclasses.replace(plan, strategy="auto").hash):  # auto's: relabelled
            return plan
    ran = "run-time auto's plan, from its own measured profile" if row.get("autotune") else "the plan made again"
    raise NotAsRun(f"{ran} is not the one recorded: made again, {len(made[-1].operations)} operations and another "
                   f"hash, where it ran {row.get('operations')} ({row.get('plan_hash')})")


def _plan(row: dict, profile: Profile, probe: dict, job: Cluster, first: bool, as_run: bool = False):
    """The plan a row is predicted on: PyTorch DDP's buckets, or a gradsched row's plan made again
    (``resimulate.plan_as_run``; with ``as_run``, only where it is the plan run: :func:`plan_as_run`)."""
    if row["runs"] != "torch DDP":
        if as_run and row["runs"] == "gradsched":
            return plan_as_run(row, profile, probe, job)
        return resimulate.plan_as_run(row, profile, probe, job)
    cap = float(row.get("bucket_cap_mb", 25.0))
    default = row["strategy"] == "ddp" and (row.get("scale_bytes") or 1) == 1  # no bucket_cap_mb given to DDP
    return make_plan("ddp", profile, job, bucket_cap_mb=cap,
                     first_bucket_mb=ddp_first_bucket_mb({} if default else {"bucket_cap_mb": cap}, first))


def _without_stream(cluster: Cluster) -> Cluster:
    """``cluster`` without its stream cost and its all-reduces' queued rule (the readings add them, or not)."""
    extra = {k: x for k, x in cluster.extra.items() if k != STREAM}
    queued = {k: x for k, x in (extra.get("queued") or {}).items() if k != "allreduce"}
    if "queued" in extra:
        extra["queued"] = queued
    return dataclasses.replace(cluster, extra=extra)


def _cores(row: dict) -> int:
    """The cores of the machine a run was made on (its ``machine``: "NAME ARCH, N CPUs, torch ...")."""
    match = re.search(r"(\d+) CPUs", row.get("machine") or "")
    return int(match.group(1)) if match else 2


def _reading(row0: dict, job: Cluster, anchor: bool, stream: bool, exponent: float | None, start_up: str,
             least: bool, gain: float = 1.0) -> Cluster:
    """The cluster a reading predicts with (see :func:`errors`); ``gain``: queued all-reduces' below the knee
    (:data:`gradsched.jobs.bench.STREAM_QUEUE_GAIN`; 1: none)."""
    probe, cluster = row0["contention"], job
    if anchor and probe and "samples" in probe:
        samples = probe["samples"]["allreduce_alone_s"]
        alone_s = probe_alone_s(samples, job.world_size, _cores(row0)) if least else statistics.median(samples)
        cluster, _ = anchored_to_probe(job, probe["allreduce_bytes"], alone_s)
        cluster = resimulate.refit_contention(cluster, probe, bool(probe.get("history")))
        if stream:
            cluster = with_stream_cost(cluster, probe["allreduce_bytes"], alone_s, _cores(row0), exponent, gain)
            if STREAM in cluster.extra and start_up != "table_start_up_s":
                figures = {**cluster.extra[STREAM], "latency_s": _start_up_figures(row0, cluster)[start_up]}
                cluster = dataclasses.replace(cluster, extra={**cluster.extra, STREAM: figures})
        if least:
            cluster = with_phase_ratios(cluster)
    return cluster


def bench_reading(row0: dict, exponent: float | None = STREAM_EXPONENT) -> Cluster:
    """The cluster of a run's first row (:func:`gradsched.jobs.results.read_bench_row`'s) as ``gradsched bench`` prices
    now: the reading "err10" (:func:`_reading`) with the longer of start-up and bytes (err11's
    :data:`gradsched.jobs.bench.STREAM_EXPONENT`; ``exponent=BLEND_EXPONENT``: err10's own)."""
    job = _without_stream(Cluster.from_dict(row0["cluster"]))
    return _reading(row0, job, True, True, exponent, "table_start_up_s", True, STREAM_QUEUE_GAIN)


def predicted_rows(path: Path, anchor: bool, first: bool, stream: bool = False, exponent: float | None = None,
                   ddp_only: bool = False, start_up: str = "table_start_up_s", least: bool = False,
                   not_as_run: list[tuple[dict, str]] | None = None, gain: float = 1.0) -> Iterable[tuple]:
    """Per row (an ``auto`` row without its plan left out; only PyTorch DDP's with ``ddp_only``): the row, the plan
    it is simulated on and the prediction (emulated seconds).  ``least`` (the reading "err10"): the probe's all-reduce
    taken at the least of its samples (:func:`gradsched.jobs.bench.probe_alone_s`) and the phases the table did not
    time at the ratios measured alone (:func:`gradsched.jobs.bench.with_phase_ratios`), as ``gradsched bench`` prices
    now.  ``not_as_run`` (a list): gradsched rows whose plan is not made again as run (:func:`plan_as_run`) are left
    out and added to it with the reason; without it they are predicted on the plan made again."""
    rows = json.loads(path.read_text())
    row0, dilate = read_bench_row(rows[0])
    profile, probe = Profile.from_dict(row0["profile"]["measured"]), row0["contention"]
    job = _without_stream(Cluster.from_dict(row0["cluster"]))  # runs since issue 35 carry it: readings add it
    cluster = _reading(row0, job, anchor, stream, exponent, start_up, least, gain)
    compute_s = row0["compute_only"]["iteration_s_median"]
    for row in rows:
        if ddp_only and row["runs"] != "torch DDP":
            continue
        try:
            plan = _plan(row, profile, probe, job, first, as_run=not_as_run is not None)
        except KeyError:  # an auto row that kept no chosen plan (planned at start-up before it was recorded)
            continue
        except NotAsRun as reason:
            if not_as_run is not None:
                not_as_run.append((row, str(reason)))
            continue
        scaled = with_runtime_costs(calibrate(profile, compute_s), probe, row["runs"] == "torch DDP")
        yield row, plan, simulate(plan, scaled, cluster, timeline=False).iteration_s / dilate


def errors(path: Path, anchor: bool, first: bool, stream: bool = False, exponent: float | None = None,
           ddp_only: bool = False, start_up: str = "table_start_up_s", least: bool = False) -> list[tuple[bool, float]]:
    """Per row (:func:`predicted_rows`): whether PyTorch's DDP ran it, and its prediction error; with ``stream``, the
    start-up one of :func:`_start_up_figures` (``start_up``)."""
    return [(row["runs"] == "torch DDP", (predicted - row["iteration_s_median"]) / row["iteration_s_median"])
            for row, _, predicted in predicted_rows(path, anchor, first, stream, exponent, ddp_only, start_up, least)]


def _start_up_figures(row0: dict, cluster: Cluster) -> dict[str, float]:
    """What the bench measured at start-up of a tiny all-reduce's cost (run seconds): the stream cost's start-up (the
    table's envelope at 4 KiB), the median of the table's measured times up to 32 KiB, and the contention probe's
    8 all-reduces of 4 KiB issued at once, per operation, alone (the median and the least of its samples, at
    start-up and between the rounds) and while compute runs."""
    probe, points = row0["contention"], cluster.extra.get("measured_points", {}).get("allreduce", [])
    small = [t for b, t in points if b <= 32768]
    n = probe["small_ops"]
    stream = cluster.extra[STREAM]  # its start-up the table's over the queue's gain, where it has one (ops13)
    return {"table_start_up_s": stream["latency_s"] * stream.get("queue_gain", 1.0),
            "table_small_median_s": statistics.median(small) if small else float("nan"),
            "queued_small_s": statistics.median(probe["samples"]["small_ops_alone_s"]) / n,
            "queued_small_least_s": min(probe["samples"]["small_ops_alone_s"]) / n,
            "queued_small_busy_s": statistics.median(probe["samples"]["small_ops_busy_s"]) / n}


def implied_start_up(path: Path) -> dict:
    """Per PyTorch DDP row of a run whose ranks share cores: the start-up ``L`` at which ``max(L, b * bytes)`` predicts
    the row's measured step (bisection; None where no ``L`` does: a row the start-up does not set), beside its
    operations' median bytes, ``b * bytes`` and the start-up figures the bench measured (:func:`_start_up_figures`)."""
    rows = json.loads(path.read_text())
    row0, dilate = read_bench_row(rows[0])
    profile, probe = Profile.from_dict(row0["profile"]["measured"]), row0["contention"]
    job = _without_stream(Cluster.from_dict(row0["cluster"]))
    alone_s = statistics.median(probe["samples"]["allreduce_alone_s"])
    cluster = resimulate.refit_contention(anchored_to_probe(job, probe["allreduce_bytes"], alone_s)[0], probe,
                                          bool(probe.get("history")))
    cluster = with_stream_cost(cluster, probe["allreduce_bytes"], alone_s, _cores(row0), None)
    if STREAM not in cluster.extra:
        return {}
    s_per_byte = cluster.extra[STREAM]["s_per_byte"]
    scaled = with_runtime_costs(calibrate(profile, row0["compute_only"]["iteration_s_median"]), probe, True)
    out: dict = {"figures": _start_up_figures(row0, cluster), "s_per_byte": s_per_byte, "rows": {}}
    for row in rows:
        if row["runs"] != "torch DDP":
            continue
        plan = _plan(row, profile, probe, job, True)

        def step(latency_s: float) -> float:
            c = dataclasses.replace(cluster, extra={**cluster.extra, STREAM: {"latency_s": latency_s,
                                                                             "s_per_byte": s_per_byte}})
            return simulate(plan, scaled, c, timeline=False).iteration_s / dilate

        measured, lo, hi = row["iteration_s_median"], 1e-5, 0.5
        fit = None
        if step(lo) <= measured <= step(hi):
            for _ in range(24):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if step(mid) < measured else (lo, mid)
            fit = lo
        nbytes = statistics.median(4 * sum(sl.end - sl.start for sl in op.slices) for op in plan.operations)
        out["rows"][row["strategy"]] = {"operations": len(plan.operations), "median_bytes": nbytes,
                                        "bytes_s": s_per_byte * nbytes, "implied_start_up_s": fit}
    return out


def choose_blend(paths: list[Path]) -> int:
    """The DDP rows' median and worst |error| with each start-up figure and exponent (None: the longer), over the
    runs :data:`CHOSEN_ON`, the other 8-host runs (held out) and the 4-host runs; writes
    ``benchmarks/results/predict_fixes_exponents.json``."""
    found: dict[str, dict[str, dict]] = {}
    for start_up in ("table_start_up_s", "table_small_median_s", "queued_small_s"):
        for exponent in (None, 2.0, 3.0, 4.0, 6.0):
            runs = {p.stem: {"blend": errors(p, True, True, True, exponent, True, start_up)} for p in paths}
            sets = {"chosen_on": {k: r for k, r in runs.items() if k in CHOSEN_ON},
                    "held_out_8h": {k: r for k, r in runs.items() if k not in CHOSEN_ON and "_8h" in k},
                    "held_out_8h_papers": {k: r for k, r in runs.items() if k not in CHOSEN_ON and _papers_8h(k)},
                    "4h": {k: r for k, r in runs.items() if "_4h" in k}}
            key = f"{start_up} p={exponent}"
            found[key] = {name: _summary(rs, True, ("blend",))["blend"] for name, rs in sets.items()}
            print(f"{key:32s}", "  ".join(f"{n} {x['median_abs']:.1%}/{x['worst_abs']:.1%} ({x['rows']})"
                                          for n, x in found[key].items()), flush=True)
    (RESULTS / "predict_fixes_exponents.json").write_text(json.dumps(found, indent=1))
    return 0


Errors = dict[str, dict[str, list[tuple[bool, float]]]]


def _summary(out: Errors, ddp_only: bool = False, readings: Iterable[str] = READINGS) -> dict[str, dict[str, float]]:
    summary = {}
    for name in readings:
        e = [abs(x) for r in out.values() for ddp, x in r[name] if ddp or not ddp_only]
        summary[name] = {"median_abs": statistics.median(e), "worst_abs": max(e), "rows": len(e)} if e else {}
    return summary


def _papers_8h(name: str) -> bool:
    return name.startswith("emulate_papers_") and "_8h" in name


# The runtime ran dear's phases in pieces on 8-thread side groups from this commit on (4a938b7, 2026-12-07 09:27 UTC):
# two-phase rows run before it ran another runtime, which today's pricing does not model.
PIECES_SINCE = "2026-12-07T09:27"


def _round_medians(row: dict) -> list[float]:
    """The medians of the row's counted rounds (its ``step_s`` after ``warmup_rounds``)."""
    rounds = row["step_s"][row.get("warmup_rounds") or 0:] or row["step_s"]
    return [statistics.median(r) for r in rounds]


def row_table(path: Path) -> list[dict]:
    """Per row of a run: its operations (count, collectives, median bytes, bytes over start-up at the stream's
    figures), its measured median and its counted rounds' medians, the error as the job predicted it, and as the
    readings "blend" (before err10) and "err10" predict it; ``in_rounds``: whether the prediction lies within the
    range of the row's rounds' medians (a miss its own rounds spread as much as); ``runtime_as_today``: False for
    a two-phase plan run before its phases ran in pieces (:data:`PIECES_SINCE`)."""
    before = [x for _, _, x in predicted_rows(path, True, True, True, BLEND_EXPONENT)]
    after = list(predicted_rows(path, True, True, True, BLEND_EXPONENT, least=True))  # the same rows, in order
    rows = json.loads(path.read_text())
    stream = bench_reading(read_bench_row(rows[0])[0]).extra.get(STREAM, {})
    out = []
    for (row, plan, predicted), old in zip(after, before, strict=True):
        measured, rounds = row["iteration_s_median"], _round_medians(row)
        nbytes = statistics.median(4 * sum(sl.end - sl.start for sl in op.slices) for op in plan.operations)
        collectives = sorted({op.collective for op in plan.operations})
        two_phase = any(c != "allreduce" for c in collectives)
        out.append({"run": path.stem, "row": row["strategy"], "runs": row["runs"],
                    "plan": (row.get("plan_options") or {}).get("chose") or row["strategy"],
                    "operations": len(plan.operations), "collectives": collectives, "median_bytes": nbytes,
                    "bytes_over_start_up": (stream["s_per_byte"] * nbytes / stream["latency_s"]) if stream else None,
                    "measured_s": measured, "round_medians_s": rounds,
                    "rounds_spread": (max(rounds) - min(rounds)) / statistics.median(rounds),
                    "error_as_run": row.get("prediction_error"), "error_blend": (old - measured) / measured,
                    "error_err10": (predicted - measured) / measured,
                    "in_rounds": min(rounds) <= predicted <= max(rounds),
                    "runtime_as_today": not (two_phase and row["date"] < PIECES_SINCE)})
    return out


def tables(paths: list[Path]) -> int:
    """:func:`row_table` over ``paths``, sorted by |error| (err10), with the misses over 8% counted; writes
    ``benchmarks/results/predict_fixes_rows.json`` (the default runs) or ``--out FILE``."""
    found = [r for p in paths for r in row_table(p)]
    found.sort(key=lambda r: -abs(r["error_err10"]))
    print(f"{'run':44s} {'row':9s} {'plan':8s} {'ops':>4s} {'KB':>6s} {'b.B/L':>6s} {'as run':>7s} {'blend':>7s} "
          f"{'err10':>7s} {'spread':>6s} in-rounds today")
    for r in found:
        print(f"{r['run'][:44]:44s} {r['row']:9s} {r['plan'][:8]:8s} {r['operations']:4d} {r['median_bytes'] / 1e3:6.0f} "
              f"{r['bytes_over_start_up'] or 0:6.2f} {r['error_as_run']:+7.1%} {r['error_blend']:+7.1%} "
              f"{r['error_err10']:+7.1%} {r['rounds_spread']:6.1%} {str(r['in_rounds']):5s} {r['runtime_as_today']}")
    summary = {}
    today = [r for r in found if r["runtime_as_today"]]
    subsets = {"all": found, "runtime_as_today": today, "ddp": [r for r in found if r["runs"] == "torch DDP"],
               "chosen_on": [r for r in today if r["run"] in CHOSEN_ON],
               "held_out": [r for r in today if r["run"] not in CHOSEN_ON]}
    for model in sorted({_model(r["run"]) for r in found}):
        subsets[f"model {model}"] = [r for r in today if _model(r["run"]) == model]
    for name in ("error_as_run", "error_blend", "error_err10"):
        for subset, rs in subsets.items():
            if not rs:
                continue
            e = [abs(r[name]) for r in rs]
            summary[f"{name} {subset}"] = {"median_abs": statistics.median(e), "worst_abs": max(e), "rows": len(e),
                                          "over_8pct": sum(x > 0.08 for x in e),
                                          "over_8pct_outside_rounds": sum(abs(r[name]) > 0.08 and not r["in_rounds"]
                                                                          for r in rs)}
            print(f"{name:13s} {subset:24s} median {summary[f'{name} {subset}']['median_abs']:.1%} worst "
                  f"{summary[f'{name} {subset}']['worst_abs']:.1%} over 8%: {summary[f'{name} {subset}']['over_8pct']} "
                  f"of {len(e)}")
    out = Path(_option("--out") or RESULTS / "predict_fixes_rows.json")
    out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "runs": [p.stem for p in paths],
                               "summary": summary, "rows": found}, indent=1))
    return 0


# err11's readings (exponent, start-up figure of :func:`_start_up_figures`), all with err10's probe anchor (its least
# sample) and phase ratios.  "queued": the start-up a queued tiny all-reduce costs (the probe's 8 all-reduces of 4 KiB
# issued at once, the least sample per operation, as err10 reads the probe's all-gradients all-reduce) in place of the
# blocking table's 4 KiB time: a training step queues its all-reduces.  Named before runs11's runs were read.
# ops13's "queue gain": the longer of start-up and bytes, the start-up the table's over the queue's gain (the bench's
# pricing since ops13, gradsched.jobs.bench.STREAM_QUEUE_GAIN); "longer" is the bench's from err11 to it.
VARIANTS = {"err10": (BLEND_EXPONENT, "table_start_up_s", 1.0), "longer": (None, "table_start_up_s", 1.0),
            "queued": (BLEND_EXPONENT, "queued_small_least_s", 1.0), "queued longer": (None, "queued_small_least_s", 1.0),
            "queue gain": (None, "table_start_up_s", STREAM_QUEUE_GAIN)}


def _kind(row: dict, two_phase: bool) -> str:
    """A row's kind: ``two-phase`` (it ran reduce-scatters and all-gathers: ``dear``, ``fsdp2``, an ``auto`` that ran
    a decoupled plan; priced by other rules than the all-reduces', phase11/12), ``gradsched`` (gradsched's runtime,
    all-reduces only), PyTorch DDP's ``ddp-1mb`` and ``ddp-5mb`` (many small buckets) and its other rows."""
    if two_phase or row["runs"] == "torch FSDP2":
        return "two-phase"
    if row["runs"] != "torch DDP":
        return "gradsched"
    return row["strategy"] if row["strategy"] in ("ddp-1mb", "ddp-5mb") else "ddp other"


def _hosts(run: str) -> str:
    match = re.search(r"_(\d+)h(?:_|$)", run)
    return f"{match.group(1)}h" if match else "?"


def variant_rows(path: Path) -> list[dict]:
    """Per row of a run (that ran today's runtime, :data:`PIECES_SINCE`): its kind (:func:`_kind`), hosts, the error
    the bench itself reported (``error_as_run``) and the error in each reading of :data:`VARIANTS` (a run whose ranks
    do not outnumber the cores prices no stream: every reading as err10's), whether each prediction lies within the
    range of its counted rounds' medians (``in_rounds``), their spread, and the counted rounds that ran under load
    where the job recorded its load per round (``rounds_loaded``; None before err12).  A gradsched row is read on
    the plan it ran (:func:`plan_as_run`), or not at all: then ``skipped`` says why (None for the rows read), its
    ``errors`` and ``in_rounds`` empty, after the others."""
    found: list[dict] = []
    not_as_run: list[tuple[dict, str]] = []
    for name, (exponent, start_up, gain) in VARIANTS.items():
        left_out: list[tuple[dict, str]] = []
        rows = list(predicted_rows(path, True, True, True, exponent, start_up=start_up, least=True,
                                   not_as_run=left_out, gain=gain))
        if not found:
            not_as_run = left_out
            for row, plan, _ in rows:
                two_phase = any(op.collective != "allreduce" for op in plan.operations)
                found.append(_variant_row(path, row, two_phase, len(plan.operations)))
        for out, (row, _, predicted) in zip(found, rows, strict=True):
            out["errors"][name] = (predicted - row["iteration_s_median"]) / row["iteration_s_median"]
            medians = _round_medians(row)
            out.setdefault("in_rounds", {})[name] = min(medians) <= predicted <= max(medians)
    for row, reason in not_as_run:
        chose = (row.get("plan_options") or {}).get("chose") or row["strategy"]
        found.append({**_variant_row(path, row, chose == "dear", row.get("operations")), "in_rounds": {},
                      "skipped": reason})
    return found


def _variant_row(path: Path, row: dict, two_phase: bool, operations: int | None) -> dict:
    """:func:`variant_rows`' record of ``row`` before its readings."""
    return {"run": path.stem, "row": row["strategy"], "kind": _kind(row, two_phase), "hosts": _hosts(path.stem),
            "operations": operations, "runtime_as_today": not (two_phase and row["date"] < PIECES_SINCE),
            "rounds_loaded": loaded_rounds(row.get("load"), row.get("warmup_rounds") or 0),
            "rounds_spread": _spread(_round_medians(row)), "errors": {},
            "error_as_run": row.get("prediction_error"), "skipped": None}


# the 1-minute load at a job's end above which it ran beside other sessions' work: runs10's and runs11's 8-host jobs,
# made with the machine otherwise idle, ended at 1.5-5.4 (their own 8 ranks); the next recorded is 6.8
QUIET_LOAD = 5.5


def job_loads(paths: list[Path]) -> dict[str, tuple[float, float]]:
    """The load before and after each 8-host job, as the summaries of ``benchmarks/emulate_papers.py`` record them
    (``emulate_papers_*.json`` beside the runs, keyed by the run's file name)."""
    loads: dict[str, tuple[float, float]] = {}
    for folder in {RESULTS, *(p.parent for p in paths)}:
        for summary in folder.glob("emulate_papers_*.json"):
            data = json.loads(summary.read_text())
            if "_8h" in summary.stem or not isinstance(data, dict):
                continue
            for run in (data.get("runs") or {}).values():
                name = re.search(r"--json \S*?([^/\s]+)\.json", run.get("command", ""))
                if name and run.get("load_after") is not None:
                    loads[name.group(1)] = (run.get("load_before"), run["load_after"])
    return loads


def _era(row: dict) -> str:
    """Whether a row's rounds ran quiet or loaded: by the job's own load per round where it recorded one (a counted
    round ending above its ``loaded_above``: :func:`gradsched.jobs.rounds.loaded_rounds`), else by the load at the
    job's end in its summary (:data:`QUIET_LOAD`), else "load not recorded"."""
    if row.get("rounds_loaded") is not None:
        return "loaded" if row["rounds_loaded"] else "quiet"
    if row.get("load") is None:
        return "load not recorded"
    return "quiet" if row["load"][1] <= QUIET_LOAD else "loaded"


def _spread(medians: list[float]) -> float:
    """(largest - least) / median of a row's counted rounds' medians."""
    return (max(medians) - min(medians)) / statistics.median(medians) if medians else float("nan")


ROWS_SHOWN = 80  # --variants prints each row where the runs given have at most this many


def _show_rows(rows: list[dict]) -> None:
    """Each row: run, row, kind, operations, the bench's own error, each reading's (``*``: outside its rounds'
    medians), the rounds' spread and their load."""
    print(f"{'run':40s} {'row':9s} {'kind':10s} {'ops':>4s} {'as run':>7s} " +
          " ".join(f"{v[:13]:>14s}" for v in VARIANTS) + f" {'spread':>6s} load")
    for r in rows:
        cells = (" ".join(f"{r['errors'][v]:+13.1%}{' ' if r['in_rounds'][v] else '*'}" for v in VARIANTS)
                 if r["skipped"] is None else f"skipped: {r['skipped']}")
        load = (f"loaded rounds {r['rounds_loaded']}" if r.get("rounds_loaded") is not None else
                f"at the job's end {r['load'][1]:.1f}" if r.get("load") else "-")
        print(f"{r['run'][-40:]:40s} {r['row']:9s} {r['kind']:10s} {r['operations'] or 0:4d} "
              f"{r['error_as_run'] or 0:+7.1%} {cells} {r['rounds_spread']:6.1%} {load}")


def variants(paths: list[Path]) -> int:
    """:func:`variant_rows` over ``paths``, summarised (median / worst |error|, rows over 8%) by hosts, by row kind
    and, on 8 hosts, by the load its rounds ran under (:func:`_era`); writes ``benchmarks/results/predict_fixes_ops13.json``
    (or ``--out FILE``)."""
    found = [r for p in paths for r in variant_rows(p) if r["runtime_as_today"]]
    rows, skipped = [r for r in found if r["skipped"] is None], [r for r in found if r["skipped"] is not None]
    loads = job_loads(paths)
    subsets: dict[str, list[dict]] = {}
    for r in rows:
        keys = [f"{r['hosts']}", f"{r['hosts']} {r['kind']}"]
        if r["hosts"] == "8h":
            r["load"] = loads.get(r["run"])
            keys += [f"8h {_era(r)}", f"8h {_era(r)} {r['kind']}"]
            if r["kind"] != "two-phase":
                keys += ["8h all-reduce rows", f"8h {_era(r)} all-reduce rows"]
        for k in keys:
            subsets.setdefault(k, []).append(r)
    if len(found) <= ROWS_SHOWN:  # a few runs given: each row, as the bench predicted it and in each reading
        _show_rows(found)
    if skipped:
        print(f"{len(skipped)} gradsched rows left out, their plans not made again as run (plan_as_run): "
              + ", ".join(sorted({f"{r['run']} {r['row']}" for r in skipped})))
    summary = {}
    print(f"{'rows':28s} {'n':>3s} " + " ".join(f"{v:>20s}" for v in VARIANTS))
    for key in sorted(subsets):
        cells = {}
        for v in VARIANTS:
            e = [abs(r["errors"][v]) for r in subsets[key]]
            cells[v] = {"median_abs": statistics.median(e), "worst_abs": max(e), "over_8pct": sum(x > 0.08 for x in e),
                        "rows": len(e)}
        summary[key] = cells
        print(f"{key:28s} {len(subsets[key]):3d} " + " ".join(
            f"{c['median_abs']:6.1%}/{c['worst_abs']:6.1%} ({c['over_8pct']:2d})" for c in cells.values()))
    out = Path(_option("--out") or RESULTS / "predict_fixes_ops13.json")
    out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "variants": {
        k: {"exponent": e, "start_up": s, "queue_gain": g} for k, (e, s, g) in VARIANTS.items()},
        "runs": sorted({r["run"] for r in rows}), "summary": summary, "rows": rows, "skipped": skipped}, indent=1))
    return 0


def _model(run: str) -> str:
    return run.removeprefix("emulate_papers_").split("_8h")[0]


def _option(name: str) -> str | None:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def _kept_runs() -> list[Path]:
    """The stored bench runs these readings cover, each once (a file two patterns match, e.g. an 8-host
    ``bench_replay_*``, was read twice before err11)."""
    return sorted({p for pattern in ("bench_replay_*_*h*.json", "bench_startup_*.json", "emulate_papers_*_8h*.json",
                                     "bench_*_8h_*.json") for p in RESULTS.glob(pattern)})


def main() -> int:
    implied, choose = "--implied" in sys.argv[1:], "--choose" in sys.argv[1:]
    given = [a for i, a in enumerate(sys.argv[1:]) if not a.startswith("--") and sys.argv[i] != "--out"]
    if "--table" in sys.argv[1:]:
        return tables([Path(p) for p in given] or sorted(RESULTS.glob("emulate_papers_*_8h*.json")))
    if "--variants" in sys.argv[1:]:
        return variants([Path(p) for p in given] or _kept_runs())
    paths = [Path(p) for p in given] or _kept_runs()
    if implied:
        found = {path.stem: implied_start_up(path) for path in paths if "_8h" in path.stem}
        for name, run in found.items():
            print(name, {k: round(x * 1e3, 1) for k, x in run["figures"].items()}, "ms;", "  ".join(
                f"{k} {r['operations']} x {r['median_bytes'] / 1e3:.0f} KB ({r['bytes_s'] * 1e3:.1f} ms): "
                f"{r['implied_start_up_s'] and round(r['implied_start_up_s'] * 1e3, 1)}" for k, r in run["rows"].items()))
        (RESULTS / "predict_fixes_implied.json").write_text(json.dumps(found, indent=1))
        return 0
    if choose:
        return choose_blend([p for p in paths if "_8h" in p.stem or "_4h" in p.stem])
    out: Errors = {}
    for path in paths:
        out[path.stem] = {name: errors(path, *flags, exponent=BLEND_EXPONENT if name in ("blend", "err10") else None,
                                       least=name == "err10") for name, flags in READINGS.items()}
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
              "chosen_on": list(CHOSEN_ON), "stream_exponent": BLEND_EXPONENT,
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
