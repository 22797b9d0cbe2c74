"""Bad input through the command line: one clear line naming file, field and reason; exit 2."""

from __future__ import annotations

import json
import math

import pytest

from gradsched.cli import main

PROFILE = {"format": "gradsched.profile/1", "model": "tiny",
           "tensors": [{"name": "a.weight", "numel": 100, "bytes": 400, "forward_s": 0.01, "backward_s": 0.02},
                       {"name": "a.bias", "numel": 10, "bytes": 40, "forward_s": 0, "backward_s": 0},
                       {"name": "b.weight", "numel": 200, "bytes": 800, "forward_s": 0.01, "backward_s": 0.01}]}
CLUSTER = {"format": "gradsched.cluster/1", "world_size": 4, "backend": "gloo",
           "collectives": {"allreduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9}}}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def error_of(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def simulate_with(tmp_path, capsys, profile=PROFILE, cluster=CLUSTER, extra=()):
    p = write(tmp_path, "p.json", profile)
    c = write(tmp_path, "c.json", cluster)
    return error_of(capsys, ["simulate", "--profile", p, "--cluster", c, "--workers", "4", *extra]), p, c


def mutate(base, path, value=None, delete=False):
    data = json.loads(json.dumps(base))
    obj = data
    for key in path[:-1]:
        obj = obj[key]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return data


def test_malformed_json(tmp_path, capsys):
    line, p, _ = simulate_with(tmp_path, capsys, profile='{"format": "gradsched.profile/1", "model": ')
    assert p in line and "malformed JSON" in line


def test_missing_file(tmp_path, capsys):
    line = error_of(capsys, ["simulate", "--profile", str(tmp_path / "nope.json"), "--alpha", "0", "--beta", "0"])
    assert "nope.json" in line and "cannot read" in line


@pytest.mark.parametrize("which", ["profile", "cluster"])
def test_unknown_format_version(tmp_path, capsys, which):
    kw = {which: mutate(PROFILE if which == "profile" else CLUSTER, ["format"], f"gradsched.{which}/9")}
    line, p, c = simulate_with(tmp_path, capsys, **kw)
    assert (p if which == "profile" else c) in line and "format" in line and "unknown format version" in line


@pytest.mark.parametrize("path,field", [
    (["model"], "model"), (["tensors", 1, "numel"], "tensors[1].numel"),
    (["tensors", 0, "backward_s"], "tensors[0].backward_s"), (["tensors"], "tensors")])
def test_missing_profile_field(tmp_path, capsys, path, field):
    line, p, _ = simulate_with(tmp_path, capsys, profile=mutate(PROFILE, path, delete=True))
    assert line.endswith(f"{p}: {field}: missing field")


def test_missing_cluster_field(tmp_path, capsys):
    line, _, c = simulate_with(tmp_path, capsys, cluster=mutate(CLUSTER, ["collectives", "allreduce", "alpha_s"], delete=True))
    assert f"{c}: collectives.allreduce.alpha_s: missing field" in line


@pytest.mark.parametrize("value,reason", [(-0.5, "negative"), (math.nan, "NaN"), (math.inf, "infinite")])
def test_bad_times(tmp_path, capsys, value, reason):
    # json.dumps writes NaN/Infinity literals, which Python's json reads back
    line, p, _ = simulate_with(tmp_path, capsys, profile=mutate(PROFILE, ["tensors", 2, "forward_s"], value))
    assert f"{p}: tensors[2].forward_s:" in line and reason in line
    line, _, c = simulate_with(tmp_path, capsys, cluster=mutate(CLUSTER, ["collectives", "allreduce", "beta_s_per_byte"], value))
    assert f"{c}: collectives.allreduce.beta_s_per_byte:" in line and reason in line


@pytest.mark.parametrize("field", ["numel", "bytes"])
@pytest.mark.parametrize("value", [0, -4])
def test_bad_sizes(tmp_path, capsys, field, value):
    line, p, _ = simulate_with(tmp_path, capsys, profile=mutate(PROFILE, ["tensors", 0, field], value))
    assert f"{p}: tensors[0].{field}: must be positive" in line


def test_bad_ready_order(tmp_path, capsys):
    line, p, _ = simulate_with(tmp_path, capsys, profile=mutate(PROFILE, ["ready_order"], [2, 2, 0]))
    assert f"{p}: ready_order: must be a permutation" in line


def make_plan_file(tmp_path, capsys):
    p = write(tmp_path, "p.json", PROFILE)
    out = str(tmp_path / "plan.json")
    assert main(["plan", "--profile", p, "--alpha", "1e-3", "--beta", "1e-9", "--strategy", "wfbp", "-o", out]) == 0
    capsys.readouterr()
    return p, out, json.loads(open(out).read())


@pytest.mark.parametrize("slices,reason", [
    ([[2, 0, 200]], "miss elements [0, 100) of tensor 0 (a.weight)"),             # a tensor never sent
    ([[2, 0, 150], [0, 0, 100]], "miss elements [150, 200) of tensor 2 (b.weight)"),  # a gap at the end
    ([[2, 0, 200], [0, 0, 60], [0, 50, 100]], "overlaps elements [50, 60)"),     # sent twice
    ([[2, 0, 201], [0, 0, 100]], "overruns tensor 2 (b.weight) of 200 elements"),  # past the end
    ([[5, 0, 1]], "tensor index 5 is outside 0..2"),
    ([[2, 10, 10]], "empty or reversed range"),
])
def test_bad_plan_slices(tmp_path, capsys, slices, reason):
    p, out, plan = make_plan_file(tmp_path, capsys)
    # one operation with the slices under test, plus a correct one for tensor 1
    plan["operations"] = [{"collective": "allreduce", "priority": 0, "slices": slices},
                          {"collective": "allreduce", "priority": 1, "slices": [[1, 0, 10]]}]
    bad = write(tmp_path, "bad.json", plan)
    line = error_of(capsys, ["simulate", "--profile", p, "--alpha", "1e-3", "--beta", "1e-9", "--plan", bad])
    assert bad in line and reason in line


def test_plan_for_another_profile(tmp_path, capsys):
    _, out, _ = make_plan_file(tmp_path, capsys)
    other = write(tmp_path, "other.json", mutate(PROFILE, ["tensors", 2, "numel"], 300) | {})
    other_data = json.loads(open(other).read())
    other_data["tensors"][2]["bytes"] = 1200
    other = write(tmp_path, "other.json", other_data)
    line = error_of(capsys, ["simulate", "--profile", other, "--alpha", "1e-3", "--beta", "1e-9", "--plan", out])
    assert out in line and "plan was made for another profile" in line


def test_plan_round_trip_and_simulate(tmp_path, capsys):
    p, out, plan = make_plan_file(tmp_path, capsys)
    assert plan["format"] == "gradsched.plan/1" and plan["strategy"] == "wfbp" and len(plan["hash"]) == 16
    assert main(["simulate", "--profile", p, "--alpha", "1e-3", "--beta", "1e-9", "--plan", out, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in rows] == ["wfbp"] and rows[0]["operations"] == 3  # one per tensor


def test_unknown_strategy_lists_known(tmp_path, capsys):
    p = write(tmp_path, "p.json", PROFILE)
    line = error_of(capsys, ["simulate", "--profile", p, "--alpha", "0", "--beta", "0", "--strategy", "nope"])
    assert "unknown strategy 'nope'" in line and "wfbp" in line and "optimal" in line


def test_bad_flags(tmp_path, capsys):
    p = write(tmp_path, "p.json", PROFILE)
    assert "--alpha and --beta go together" in error_of(capsys, ["simulate", "--profile", p, "--alpha", "1"])
    assert "--beta must be a finite" in error_of(capsys, ["simulate", "--profile", p, "--alpha", "1", "--beta", "-1"])
    assert "--workers must be at least 1" in error_of(capsys, ["simulate", "--profile", p, "--workers", "0",
                                                               "--alpha", "1", "--beta", "1"])
    line = error_of(capsys, ["simulate", "--profile", p, "--alpha", "1", "--beta", "1", "--opt", "ddp.nope=3"])
    assert "strategy 'ddp' has no option 'nope'" in line and "bucket_cap_mb" in line


@pytest.mark.parametrize("field,value,reason", [
    ("contention", {"compute_slowdown": -1}, "contention.compute_slowdown: is negative"),
    ("contention", {"cpu": 1}, "contention.cpu: unknown field"),
    ("contention", 3, "contention: must be a JSON object"),
    ("topk_selection_s_per_nlogn", math.nan, "topk_selection_s_per_nlogn: is NaN"),
])
def test_bad_optional_cluster_fields(tmp_path, capsys, field, value, reason):
    line, _, c = simulate_with(tmp_path, capsys, cluster=mutate(CLUSTER, [field], value))
    assert f"{c}: {reason}" in line


@pytest.mark.parametrize("value,reason", [
    ({"issue_s": -1e-4}, "op_host.issue_s: is negative"),
    ({"issue_s": 1e-4, "wait_s": 1e-4}, "op_host.wait_s: unknown field"),
    (1e-4, "op_host: must be a JSON object"),
])
def test_bad_host_time_per_operation(tmp_path, capsys, value, reason):
    line, p, _ = simulate_with(tmp_path, capsys, profile=mutate(PROFILE, ["op_host"], value))
    assert f"{p}: {reason}" in line


def test_host_time_per_operation_makes_many_operations_dearer(tmp_path, capsys):
    c = write(tmp_path, "c.json", CLUSTER)

    def simulated(profile):
        p = write(tmp_path, "p.json", profile)
        assert main(["simulate", "--profile", p, "--cluster", c, "--strategy", "wfbp,sync", "--json"]) == 0
        return {r["strategy"]: r for r in json.loads(capsys.readouterr().out)}

    plain = simulated(PROFILE)
    dear = simulated(mutate(PROFILE, ["op_host"], {"issue_s": 0.01, "retire_s": 0.005}))
    assert plain["wfbp"]["operations"] == 3 and plain["sync"]["operations"] == 1
    for strategy, r in plain.items():
        # issuing and retiring are compute-stream work: the stream alone takes that much longer
        assert dear[strategy]["compute_s"] == pytest.approx(r["compute_s"] + r["operations"] * 0.015)
        assert dear[strategy]["iteration_s"] >= dear[strategy]["compute_s"] - 1e-12
    assert dear["wfbp"]["iteration_s"] - plain["wfbp"]["iteration_s"] > dear["sync"]["iteration_s"] - plain["sync"]["iteration_s"]
