"""benchmarks/predict_fixes.py's err10 reading and per-row table on committed 8-host runs: the anchor at the least
probe sample, the phases at the measured ratios, and the rows flagged as they ran."""

from __future__ import annotations

import json

import pytest

from gradsched.jobs.results import read_bench_row
from tests.scripts import ROOT, load_script

predict_fixes = load_script("benchmarks/predict_fixes.py", "predict_fixes_under_test")
RESULTS = ROOT / "benchmarks" / "results"


def _first(name: str) -> dict:
    return read_bench_row(json.loads((RESULTS / f"emulate_papers_{name}.json").read_text())[0])[0]


def test_the_bench_reading_anchors_on_the_least_sample_and_measured_ratios() -> None:
    first = _first("resnet50_8h_runs9")
    probe = first["contention"]
    cluster = predict_fixes.bench_reading(first)
    least = min(probe["samples"]["allreduce_alone_s"])
    assert cluster.cost("allreduce").time_s(probe["allreduce_bytes"]) == pytest.approx(least, rel=1e-6)
    assert cluster.extra["derived_phase_ratios"] == {"reducescatter": 1.56, "allgather": 1.75}


def test_the_bench_reading_takes_the_probes_queued_start_up_and_err10s_the_tables() -> None:
    """err11: a queued all-reduce's start-up is the probe's 8 queued all-reduces of 4 KiB, the least sample per
    operation; err10's reading keeps the table's 4 KiB time."""
    from gradsched.cluster import STREAM

    first = _first("inception_v4_8h_runs10")
    probe = first["contention"]
    queued = min(probe["samples"]["small_ops_alone_s"]) / probe["small_ops"]
    now = predict_fixes.bench_reading(first).extra[STREAM]
    before = predict_fixes.bench_reading(first, "table_start_up_s").extra[STREAM]
    assert now["latency_s"] == pytest.approx(queued, rel=1e-9) and now["exponent"] == before["exponent"] == 2.0
    assert before["latency_s"] == pytest.approx(first["cluster"]["points"]["allreduce"][0][1], rel=1e-3)  # anchored
    assert now["latency_s"] < 0.8 * before["latency_s"]  # 16.2 ms against 21.5 in this quiet job


def test_the_table_flags_rows_by_their_rounds_and_runtime() -> None:
    rows = predict_fixes.row_table(RESULTS / "emulate_papers_bert_large_8h.json")
    for r in rows:
        assert r["in_rounds"] == (min(r["round_medians_s"]) <= r["measured_s"] * (1 + r["error_err10"])
                                  <= max(r["round_medians_s"]))
    dear = [r for r in rows if r["plan"] == "dear"]
    assert dear and not any(r["runtime_as_today"] for r in dear)  # ran before the phases ran in pieces
    assert all(r["runtime_as_today"] for r in rows if r["plan"] != "dear")
    later = predict_fixes.row_table(RESULTS / "emulate_papers_bert_large_8h_start8.json")
    assert all(r["runtime_as_today"] for r in later)
