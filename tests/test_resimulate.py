"""benchmarks/resimulate.py on a committed bench run: plans as they ran, the table read again."""

from __future__ import annotations

import json
import math
import re
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import resimulate  # noqa: E402

from gradsched.cluster import Cluster  # noqa: E402
from gradsched.commands.bench import rows_for_json  # noqa: E402
from gradsched.jobs.results import UNITS, BenchJsonRow, BenchResult, BenchRow, read_bench_row, to_emulated  # noqa: E402

RUN = ROOT / "benchmarks" / "results" / "bench_replay_googlenet_k80_8h.json"


def test_ddp_rows_are_planned_as_they_ran_and_every_row_is_predicted():
    rows = resimulate.resimulate(RUN)
    kept = json.loads(RUN.read_text())
    assert [r["strategy"] for r in rows] == [r["strategy"] for r in kept]
    for got, row in zip(rows, kept):
        assert got["measured_s"] == row["iteration_s_median"] and got["predicted_now_s"] > 0
        if row["runs"] == "torch DDP":
            assert got["operations"] == row["operations"]
            assert math.isclose(got["error_now"], (got["predicted_now_s"] - got["measured_s"]) / got["measured_s"])


def test_the_table_is_read_again_through_the_split_envelope():
    job = Cluster.from_dict(json.loads(RUN.read_text())[0]["cluster"])
    points = resimulate.reread_cluster(job).cost("allreduce").points
    for i, (size, seconds) in enumerate(points):
        for smaller, t in points[:i]:
            assert seconds <= math.ceil(size / smaller) * t * (1 + 1e-12)


# ----------------------------------------------------------------------------- dilated runs, both file layouts
SMALL = ROOT / "benchmarks" / "results" / "bench_replay_googlenet_k80_2h.json"  # dilation 1: run seconds


def _old_undilate(result: dict, dilate: float) -> dict:
    """How ``gradsched bench`` converted before ``units`` (commands/bench.py at 22f138f..a8db2c5^): by key names."""
    keep = {"job_s", "resample_s", "measured", "cluster", "peak_rss_bytes", "phases"}
    seconds = re.compile(r"(?:^|_)s(?:_|$)")

    def scale(value, key):
        if key in keep:
            return value
        if isinstance(value, dict):
            return {k: scale(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [scale(v, key if seconds.search(key) else "") for v in value]
        if isinstance(value, float) and seconds.search(key):
            return value / dilate
        return value

    return {**scale(result, ""), "dilate": dilate}


def _as_dilated(rows: list[dict], dilate: float, path: Path, *, before_units: bool) -> Path:
    """``rows`` (a job at dilation 1) as the same run written at ``--dilate dilate``: its workers' seconds
    are the same numbers, the figures the user reads divided by ``dilate`` (the writer then or now)."""
    shared = set(typing.get_type_hints(BenchResult))
    meta = set(typing.get_type_hints(BenchJsonRow)) - set(typing.get_type_hints(BenchRow)) - shared - {"units"}
    result = {k: rows[0][k] for k in shared if k in rows[0]}
    result["rows"] = [{k: v for k, v in r.items() if k not in shared and k not in meta} for r in rows]
    facts = {**{k: rows[0][k] for k in meta if k in rows[0]}, "dilate": dilate}
    converted = _old_undilate(result, dilate) if before_units else to_emulated(result, dilate)  # type: ignore
    out = rows_for_json(converted, facts)  # type: ignore[arg-type]
    for row in out if before_units else []:
        del row["units"]
    path.write_text(json.dumps(out))
    return path


@pytest.mark.parametrize("before_units", [False, True], ids=["units", "before-units"])
def test_a_dilated_run_is_resimulated_in_one_unit(tmp_path, before_units):
    """The same measurements declared at --dilate 4: every prediction the same, divided by 4 once.

    Before, the probe's figures were used as the file held them beside a profile and cluster in
    run seconds: the runtime overheads divided by K (files with units), the contention refitted
    from emulated measurements against run-second costs (both)."""
    rows = json.loads(SMALL.read_text())[:2]  # ddp and auto
    assert [r["strategy"] for r in rows] == ["ddp", "auto"] and rows[0]["contention"]["runtime_overhead_s"]["gradsched"]
    base = resimulate.resimulate(_write(tmp_path / "base.json", rows))
    dilated = resimulate.resimulate(_as_dilated(rows, 4.0, tmp_path / "k4.json", before_units=before_units))
    for got, want in zip(dilated, base):
        assert math.isclose(got["measured_s"], want["measured_s"] / 4, rel_tol=1e-12)
        assert math.isclose(got["predicted_now_s"], want["predicted_now_s"] / 4, rel_tol=1e-9)
        assert math.isclose(got["error_now"], want["error_now"], rel_tol=1e-9, abs_tol=1e-12)


def test_a_row_is_read_back_in_run_seconds_whichever_rule_wrote_it():
    row = {"strategy": "ddp", "iteration_s_median": 0.2, "dilate": 2.0, "job_s": 9.0,
           "contention": {"runtime_overhead_s": {"gradsched": 0.01}, "op_host": {"issue_s": 1e-4},
                          "op_host_samples": [[1e-4, 2e-4]]}}
    new, k = read_bench_row({**row, "units": UNITS})
    assert k == 2.0 and new["iteration_s_median"] == 0.4 and new["job_s"] == 9.0
    assert new["contention"] == {"runtime_overhead_s": {"gradsched": 0.02}, "op_host": {"issue_s": 2e-4},
                                 "op_host_samples": [[2e-4, 4e-4]]}
    old, _ = read_bench_row(row)  # the old rule left these two dilated: they are run seconds already
    assert old["iteration_s_median"] == 0.4 and old["contention"]["op_host"] == {"issue_s": 2e-4}
    assert old["contention"]["runtime_overhead_s"] == {"gradsched": 0.01}
    assert old["contention"]["op_host_samples"] == [[1e-4, 2e-4]]
    assert read_bench_row({**row, "dilate": None})[0] == {**row, "dilate": None}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows))
    return path


def test_a_dear_row_is_predicted_on_the_plan_it_ran_and_a_queued_rule_speeds_it():
    run = ROOT / "benchmarks" / "results" / "bench_replay_googlenet_k80_2h_1gbit_emu.json"
    row = next(r for r in json.loads(run.read_text()) if r["strategy"] == "dear")
    first, _ = read_bench_row(json.loads(run.read_text())[0])
    from gradsched.profile import Profile
    from gradsched.calibration import with_runtime_costs

    planned = with_runtime_costs(Profile.from_dict(first["profile"]["measured"]), first["contention"], False)
    plan = resimulate.dear_as_run(row, planned, Cluster.from_dict(first["cluster"]))
    assert plan is not None and plan.hash == row["plan_hash"] and len(plan.operations) == row["operations"]
    rules = {"reducescatter": {"slots": 2, "speedup": 1.6}, "allgather": {"slots": 2, "speedup": 1.4}}
    before = next(r for r in resimulate.resimulate(run) if r["strategy"] == "dear")
    after = next(r for r in resimulate.resimulate(run, queued=rules) if r["strategy"] == "dear")
    assert before["operations"] == row["operations"] and after["predicted_now_s"] < before["predicted_now_s"]
