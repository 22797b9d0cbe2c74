"""benchmarks/memory_line.py on committed bench runs: the line, the phase that set each peak, the misses."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import memory_line  # noqa: E402


def _summary(name: str) -> dict:
    path = ROOT / "benchmarks" / "results" / name
    rows = memory_line.bench_rows(path)
    assert rows is not None
    return memory_line.summary(path, rows)


def test_the_probes_4x_set_a_2_host_peak_over_nothing_else_and_the_cut_moves_it():
    # BERT-Large at S = 16 on 2 hosts, the same command before and after the probe's gradients became views of
    # its buffer: the rounds (the probe's samples between them) set 0.71 GB, after it the start-up probe 0.67 GB
    before, after = (_summary(f"memory_line_bert_large_2h_{t}.json") for t in ("before", "after"))
    assert before["model_bytes"] == after["model_bytes"] and 83e6 < before["model_bytes"] < 85e6
    assert before["line_bytes"] == 3 * before["model_bytes"] + 0.5e9
    assert before["set_by"] == "rounds" and after["set_by"] == "probe"
    assert after["peak_rss_bytes"] < before["peak_rss_bytes"] < before["line_bytes"]


def test_a_stored_8_host_miss_is_placed_in_its_phases():
    r = _summary("emulate_papers_bert_large_8h_nodear.json")
    assert r["hosts"] == 8 and r["scale_bytes"] == 16 and r["missed"]
    assert r["set_by"] == "rounds" and r["phase_peaks"]["probe"] < r["line_bytes"] < r["peak_rss_bytes"]


def test_files_that_are_not_bench_runs_are_skipped(tmp_path):
    (tmp_path / "summary.json").write_text('{"runs": []}')
    (tmp_path / "rows.json").write_text('[{"strategy": "ddp"}]')
    assert memory_line.bench_rows(tmp_path / "summary.json") is None
    assert memory_line.bench_rows(tmp_path / "rows.json") is None
