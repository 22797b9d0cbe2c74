"""Measured against predicted: the compare command on a synthetic 'measured' run."""

from __future__ import annotations

import json

import pytest

from gradsched import Cluster
from gradsched.cli import main
from gradsched.fidelity import compare
from gradsched.planners import make_plan
from gradsched.sim import simulate
from gradsched.synthetic import synthetic_profile
from gradsched.timeline import Event, Timeline

SLOWER = 1.1  # the fake measured run is 10% slower than predicted, uniformly


def fake_measured(predicted: Timeline, iteration_s: float, iterations: int = 4) -> Timeline:
    events = []
    for k in range(iterations):
        shift = k * SLOWER * iteration_s + 5.0  # measured clocks start anywhere
        for e in predicted.events:
            events.append(Event(e.name, e.cat, e.track, shift + SLOWER * e.start_s, SLOWER * e.dur_s, 0,
                                {**(e.args or {}), "iteration": k}))
    return Timeline(events=events)


@pytest.fixture
def predicted():
    profile = synthetic_profile(30)
    cluster = Cluster.alpha_beta(1e-3, 1e-9, 4)
    result = simulate(make_plan("mgwfbp", profile, cluster), profile, cluster)
    result.timeline.meta["iteration_s"] = result.iteration_s
    return result


def test_uniformly_slower_run_gives_uniform_errors(predicted):
    measured = fake_measured(predicted.timeline, predicted.iteration_s)
    report = compare(measured, predicted.timeline, predicted.iteration_s)
    assert report.measured_iteration_s == pytest.approx(SLOWER * predicted.iteration_s)
    assert report.iteration_error == pytest.approx(1 / SLOWER - 1)
    assert len(report.ops) == predicted.operations
    assert all(o.dur_error == pytest.approx(1 / SLOWER - 1) for o in report.ops)
    assert len(report.measured_iterations) == 2  # 4 iterations, warm-up dropped, last has no successor


def test_compare_command(tmp_path, capsys, predicted):
    pred_path, meas_path = tmp_path / "pred.json", tmp_path / "meas.json"
    predicted.timeline.save_chrome_trace(pred_path)
    fake_measured(predicted.timeline, predicted.iteration_s).save_chrome_trace(meas_path)
    png = tmp_path / "both.png"
    assert main(["compare", str(meas_path), str(pred_path), "--json", "--plot", str(png)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["iteration_error"] == pytest.approx(1 / SLOWER - 1)
    assert png.stat().st_size > 1000
    # a predicted trace without the iteration time is refused with a one-line error
    raw = json.loads(pred_path.read_text())
    raw["otherData"].pop("iteration_s")
    pred_path.write_text(json.dumps(raw))
    assert main(["compare", str(meas_path), str(pred_path)]) == 2
    assert "otherData.iteration_s: missing" in capsys.readouterr().err


def test_simulate_trace_and_plot_files(tmp_path, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["simulate", "--strategy", "wfbp,optimal", "--trace", str(trace), "--plot", str(png), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"strategy", "iteration_s", "exposed_comm_s", "operations", "peak_extra_bytes", "plan_s"} <= set(rows[0])
    data = json.loads(trace.read_text())
    pids = {e["pid"] for e in data["traceEvents"] if e.get("ph") == "X"}
    assert pids == {0, 1}  # one process per strategy
    assert png.stat().st_size > 1000
