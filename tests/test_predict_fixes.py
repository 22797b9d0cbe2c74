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


def test_err11s_readings_take_the_queued_start_up_only_where_ranks_share_cores() -> None:
    """--variants: the probe's queued start-up (least sample, per operation) is below the table's 4 KiB time in this
    quiet 8-host job, so its 95-operation ddp-1mb row is predicted faster; at 2 hosts (a rank per core) no reading
    prices a stream, so all agree; the job's load is read from the runs' summary."""
    first = _first("inception_v4_8h_runs10")
    probe = first["contention"]
    figures = predict_fixes._start_up_figures(first, predict_fixes.bench_reading(first))
    assert figures["queued_small_least_s"] == pytest.approx(min(probe["samples"]["small_ops_alone_s"]) / 8)
    assert figures["queued_small_least_s"] < 0.8 * figures["table_start_up_s"]
    rows = {r["row"]: r for r in predict_fixes.variant_rows(RESULTS / "emulate_papers_inception_v4_8h_runs10.json")}
    small = rows["ddp-1mb"]
    assert small["kind"] == "ddp-1mb" and small["hosts"] == "8h" and small["operations"] == 95
    assert small["errors"]["queued"] < small["errors"]["err10"] and small["errors"]["longer"] < small["errors"]["err10"]
    assert rows["auto"]["kind"] == "gradsched" and rows["ddp-all"]["kind"] == "ddp other"
    two = predict_fixes.variant_rows(RESULTS / "bench_replay_resnet50_2h_1gbit_sweep.json")
    assert two and all(r["hosts"] == "2h" and len(set(r["errors"].values())) == 1 for r in two if r["skipped"] is None)
    loads = predict_fixes.job_loads([RESULTS / "emulate_papers_inception_v4_8h_runs10.json"])
    assert loads["emulate_papers_inception_v4_8h_runs10"][1] <= predict_fixes.QUIET_LOAD


def test_two_phase_rows_are_their_own_kind_not_gradscheds() -> None:
    """err12: a row that ran reduce-scatters and all-gathers (dear here) is counted apart from gradsched's all-reduce
    plans; each row says whether its prediction lies within its rounds' medians and their spread."""
    rows = {r["row"]: r for r in predict_fixes.variant_rows(RESULTS / "emulate_papers_resnet50_8h_runs11dear.json")}
    assert rows["dear"]["kind"] == "two-phase" and rows["auto"]["kind"] == "gradsched"
    assert rows["ddp-1mb"]["kind"] == "ddp-1mb" and rows["ddp-all"]["kind"] == "ddp other"
    assert all(r["rounds_loaded"] is None for r in rows.values())  # a run from before the load per round
    assert all(r["rounds_spread"] >= 0 for r in rows.values())
    assert all(set(r["in_rounds"]) == set(predict_fixes.VARIANTS) for r in rows.values() if r["skipped"] is None)
    assert rows["dear"]["error_as_run"] == pytest.approx(-0.2403, abs=1e-3)  # what the bench itself printed


def test_the_quiet_loaded_split_takes_the_jobs_own_load_per_round_where_it_has_one(tmp_path) -> None:
    """A run with ``load`` is split by its counted rounds (one above ``loaded_above``: loaded), whatever its summary
    says; one without falls back to the summary's load at the job's end."""
    rows = json.loads((RESULTS / "emulate_papers_inception_v4_8h_runs10.json").read_text())
    load = {"source": "/proc/loadavg, 1-minute", "startup_end": 3.0, "ranks": 8, "cores": 2, "loaded_above": 6.0}
    warm = rows[0].get("warmup_rounds") or 0
    counted = len(rows[0]["step_s"]) - warm
    for name, rounds in (("quiet", [9.0] * warm + [5.0] * counted), ("loaded", [1.0] * warm + [5.0, 6.5] +
                                                                      [5.0] * (counted - 2))):
        path = tmp_path / f"emulate_papers_inception_v4_8h_{name}.json"
        path.write_text(json.dumps([{**r, "load": {**load, "rounds": rounds}} for r in rows]))
        found = predict_fixes.variant_rows(path)
        assert {predict_fixes._era(r) for r in found} == {name}
    summary = {**found[0], "rounds_loaded": None, "load": (1.0, 6.8)}
    assert predict_fixes._era(summary) == "loaded" and predict_fixes._era({**summary, "load": None}) == \
        "load not recorded"


def test_variants_read_gradsched_rows_on_the_plan_they_ran_or_leave_them_out() -> None:
    """q12's DenseNet-201 at byte scale 8: ``threshold`` is read on its recorded options (0.125 MB: the 52 operations
    it ran, its hash), where re-planned at the planner's defaults it made 1 operation (-24%; usbyte's 402: +1048%); the
    ``usbyte`` ``groups=0`` row's search cuts its 4 groups otherwise today (another hash): left out, with the reason;
    PyTorch DDP's rows are read as before."""
    rows = {r["row"]: r for r in predict_fixes.variant_rows(RESULTS / "bench_replay_densenet201_8h_q12.json")}
    threshold, usbyte = rows["threshold"], rows["usbyte"]
    assert threshold["skipped"] is None and threshold["operations"] == 52
    assert all(abs(e) < 0.5 for e in threshold["errors"].values())
    assert usbyte["skipped"] and "another hash" in usbyte["skipped"] and usbyte["errors"] == {}
    assert usbyte["kind"] == "gradsched" and usbyte["error_as_run"] == pytest.approx(-0.1062, abs=1e-3)
    assert rows["ddp-1mb"]["skipped"] is None and rows["ddp-1mb"]["operations"] == 52


def test_a_gradsched_row_whose_hash_is_not_made_again_is_not_as_run() -> None:
    rows = json.loads((RESULTS / "bench_replay_densenet201_8h_q12.json").read_text())
    first = read_bench_row(rows[0])[0]
    profile = predict_fixes.Profile.from_dict(first["profile"]["measured"])
    job = predict_fixes.Cluster.from_dict(first["cluster"])
    row = next(r for r in rows if r["strategy"] == "threshold")
    plan = predict_fixes.plan_as_run(row, profile, first["contention"], predict_fixes._without_stream(job))
    assert plan.hash == row["plan_hash"] and plan.options == {"mb": 0.125}
    with pytest.raises(predict_fixes.NotAsRun, match="52"):
        predict_fixes.plan_as_run({**row, "plan_hash": "0" * 16}, profile, first["contention"],
                                  predict_fixes._without_stream(job))


def test_the_queue_gain_reading_lowers_the_small_all_reduces_and_leaves_the_bytes_bound_rows() -> None:
    """--variants' "queue gain" (the bench's pricing since ops13: the table's start-up over STREAM_QUEUE_GAIN): runs12's
    quiet DenseNet-201 job, whose 52 all-reduces of 153 KB (ddp-1mb) were predicted 14% slow, comes within 8%; its rows
    of one all-reduce of every gradient (bytes-bound) are predicted as before."""
    from gradsched.cluster import STREAM
    from gradsched.jobs.bench import STREAM_QUEUE_GAIN

    assert predict_fixes.VARIANTS["queue gain"] == (None, "table_start_up_s", STREAM_QUEUE_GAIN)
    run = RESULTS / "emulate_papers_densenet201_8h_runs12.json"
    rows = {r["row"]: r for r in predict_fixes.variant_rows(run)}
    small, whole = rows["ddp-1mb"]["errors"], rows["ddp-all"]["errors"]
    assert small["longer"] > 0.08 and abs(small["queue gain"]) < 0.08 and small["queue gain"] < small["longer"]
    assert whole["queue gain"] == pytest.approx(whole["longer"], abs=1e-9)
    first = _first("densenet201_8h_runs12")
    stream = predict_fixes.bench_reading(first).extra[STREAM]
    assert stream["queue_gain"] == STREAM_QUEUE_GAIN
    figures = predict_fixes._start_up_figures(first, predict_fixes.bench_reading(first))
    assert figures["table_start_up_s"] == pytest.approx(stream["latency_s"] * STREAM_QUEUE_GAIN)
