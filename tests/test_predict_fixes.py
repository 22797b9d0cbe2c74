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
