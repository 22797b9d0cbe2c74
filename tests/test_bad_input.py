"""Issue 17 item 6: every bad input found by trying gives exit 2 and one line naming the field.

Each case is one that used to end in a traceback, a hang or a nonsense figure (inf,
nan, 0/0 in the table, a misspelt field silently ignored).  The assertion is the
policy: exit status 2, exactly one line on stderr, no traceback, and the line names
the offending field or flag and says why."""

from __future__ import annotations

import json

import pytest

from gradsched import Cluster, Profile
from gradsched.cli import main
from gradsched.planners import make_plan

TENSORS = [{"name": "a.weight", "numel": 100, "bytes": 400, "forward_s": 0.01, "backward_s": 0.02},
           {"name": "a.bias", "numel": 10, "bytes": 40, "forward_s": 0, "backward_s": 0},
           {"name": "b.weight", "numel": 200, "bytes": 800, "forward_s": 0.01, "backward_s": 0.01}]
PROFILE = {"format": "gradsched.profile/1", "model": "tiny", "tensors": TENSORS}
CLUSTER = {"format": "gradsched.cluster/1", "world_size": 4, "backend": "gloo",
           "collectives": {"allreduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9}}}


LEVEL = {"collectives": {"allreduce": {"alpha_s": 2e-5, "beta_s_per_byte": 1e-10}}}
TOPOLOGY = {"nodes": 2, "ranks_per_node": 2, "algorithm": "ring", "intra": LEVEL,
            "inter": {"collectives": {"allreduce": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}}}}


def changed(base: dict, edit) -> dict:
    data = json.loads(json.dumps(base))
    edit(data)
    return data


def _set(path: list, value):
    def edit(data):
        obj = data
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return edit


def topology(edit) -> dict:
    """CLUSTER with a 2 x 2 topology, changed by ``edit``."""
    return changed(changed(CLUSTER, _set(["topology"], TOPOLOGY)), edit)


def _hier_plan(profile: dict) -> dict:
    plan = make_plan("wfbp", Profile.from_dict(profile), Cluster.from_dict(CLUSTER)).to_dict()
    plan["operations"][0]["collective"] = "hier-allreduce"
    return plan


def _two_phase_plan(profile: dict, edit) -> dict:
    plan = make_plan("dear", Profile.from_dict(profile), Cluster.from_dict(CLUSTER), grouping="nearby",
                     nearby_layers=1).to_dict()
    edit(plan["operations"])
    return plan


def _drop_first_reduce_scatter(ops: list) -> None:
    del ops[0]


def _gate_on_missing_layer(ops: list) -> None:
    ops[-1]["gate"] = 99


def _dense_density(profile: dict) -> dict:
    p = Profile.from_dict(profile)
    plan = make_plan("wfbp", p, Cluster.from_dict(CLUSTER)).to_dict()
    plan["operations"][0]["density"] = "abc"
    return plan


SIM = ["simulate", "--profile", "{profile}", "--cluster", "{cluster}", "--workers", "4"]
AB = ["simulate", "--profile", "{profile}", "--workers", "4", "--alpha", "1e-4", "--beta", "1e-9"]

# (case id, argv with {profile}/{cluster}/{plan}/{trace} placeholders, profile, cluster, extra file, words in the line)
CASES = [
    ("opt-not-a-number", SIM + ["--strategy", "ddp", "--opt", "ddp.bucket_cap_mb=abc"], None, None, None,
     ["bucket_cap_mb", "must be a number"]),
    ("opt-of-a-strategy-not-planned", SIM + ["--strategy", "wfbp", "--opt", "ddp.bucket_cap_mb=abc"], None, None,
     None, ["bucket_cap_mb", "must be a number"]),
    ("opt-exclude-not-names", SIM + ["--strategy", "auto", "--opt", "auto.exclude=5"], None, None, None,
     ["exclude", "strategy names"]),
    ("opt-cycle-denormal", SIM + ["--strategy", "horovod", "--opt", "horovod.cycle_ms=5e-324"], None, None, None,
     ["cycle_ms", "at least"]),
    ("opt-partition-fraction", SIM + ["--strategy", "bytescheduler", "--opt", "bytescheduler.partition_bytes=0.5"],
     None, None, None, ["partition_bytes", "whole number"]),
    ("opt-unknown-key", SIM + ["--strategy", "wfbp", "--opt", "bucket_cap_mb=5"], None, None, None,
     ["bucket_cap_mb", "wfbp"]),
    ("all-zero", ["simulate", "--profile", "{profile}", "--alpha", "0", "--beta", "0"],
     changed(PROFILE, lambda d: [t.update(forward_s=0, backward_s=0) for t in d["tensors"]]), None, None,
     ["forward_s", "--alpha", "0"]),
    ("numel-huge", AB, changed(PROFILE, _set(["tensors", 0, "numel"], 1e20)), None, None,
     ["tensors[0].numel", "above"]),
    ("forward-overflow", AB, changed(PROFILE, lambda d: [t.update(forward_s=1e308) for t in d["tensors"][:2]]),
     None, None, ["tensors[0].forward_s", "above"]),
    ("world-size-huge", SIM, None, changed(CLUSTER, _set(["world_size"], 1e30)), None, ["world_size", "above"]),
    ("misspelt-contention", SIM, None, changed(CLUSTER, _set(["contension"], {"comm_slowdown": 0.5})), None,
     ["contension", "contention"]),
    ("topology-nodes-zero", SIM, None, topology(_set(["topology", "nodes"], 0)), None,
     ["topology.nodes", "positive"]),
    ("topology-not-world-size", SIM, None, topology(_set(["topology", "nodes"], 3)), None,
     ["topology", "3 x 2", "world_size is 4"]),
    ("topology-unknown-algorithm", SIM, None, topology(_set(["topology", "algorithm"], "butterfly")), None,
     ["topology.algorithm", "butterfly"]),
    ("topology-misspelt", SIM, None, topology(_set(["topology", "ranks_per_nod"], 2)), None,
     ["topology.ranks_per_nod", "ranks_per_node"]),
    ("topology-level-missing", SIM, None, topology(lambda d: d["topology"].pop("inter")), None,
     ["topology.inter", "missing"]),
    ("topology-bad-cost", SIM, None, topology(_set(["topology", "intra", "collectives", "allreduce", "beta_s_per_byte"],
                                                   float("inf"))), None,
     ["topology.intra.collectives.allreduce.beta_s_per_byte"]),
    ("topology-level-misspelt", SIM, None, topology(_set(["topology", "inter", "point"], {})), None,
     ["topology.inter.point", "points"]),
    ("hier-plan-flat-cluster", AB + ["--plan", "{plan}"], None, None, _hier_plan(PROFILE),
     ["hier-allreduce", "topology"]),
    ("misspelt-other", AB, changed(PROFILE, _set(["other"], 0.01)), None, None, ["other", "other_s"]),
    ("misspelt-tensor-field", AB, changed(PROFILE, _set(["tensors", 2, "backwards_s"], 0.01)), None, None,
     ["tensors[2].backwards_s", "backward_s"]),
    ("duplicate-names", AB, changed(PROFILE, _set(["tensors", 2, "name"], "a.weight")), None, None,
     ["tensors[2].name", "a.weight"]),
    ("all-gather-without-reduce-scatter", AB + ["--plan", "{plan}"], None, None,
     _two_phase_plan(PROFILE, _drop_first_reduce_scatter), ["operations[", "all-gather without its reduce-scatter"]),
    ("gate-on-missing-layer", AB + ["--plan", "{plan}"], None, None, _two_phase_plan(PROFILE, _gate_on_missing_layer),
     ["gate", "99", "no such layer"]),
    ("dense-density", AB + ["--plan", "{plan}"], None, None, _dense_density(PROFILE),
     ["operations[0].density", "allreduce"]),
    ("density-for-dense-only", AB + ["--strategy", "wfbp,mgwfbp", "--density", "0.01"], None, None, None,
     ["--density", "wfbp"]),
    ("channels-huge", AB + ["--channels", "1000000000"], None, None, None, ["--channels", "1024"]),
    ("workers-huge", ["simulate", "--profile", "{profile}", "--workers", "1000000000000", "--alpha", "0",
                      "--beta", "1e-9"], None, None, None, ["--workers", "at most"]),
    ("train-warmup-negative", ["train", "--warmup", "-1"], None, None, None, ["--warmup", "-1"]),
    ("train-warmup-too-large", ["train", "--steps", "5", "--warmup", "5"], None, None, None, ["--warmup", "4"]),
    ("train-timeout-nan", ["train", "--timeout-s", "nan"], None, None, None, ["--timeout-s", "nan"]),
    ("train-ranks-per-host-no-testbed", ["train", "--ranks-per-host", "2"], None, None, None,
     ["--ranks-per-host", "--rate"]),
    ("train-auto-exclude-not-names", ["train", "--strategy", "auto", "--opt", "exclude=5"], None, None, None,
     ["exclude", "strategy names"]),
    ("train-auto-setting", ["train", "--strategy", "auto", "--opt", "switch_iteration=x"], None, None, None,
     ["switch_iteration", "'x'"]),
    ("train-opt-not-a-number", ["train", "--strategy", "threshold", "--opt", "mb=abc"], None, None, None,
     ["mb", "must be a number"]),
    ("plan-output-unwritable", ["plan", "--strategy", "wfbp", "--alpha", "0", "--beta", "1e-9", "-o",
                                "/proc/nonexistent/plan.json"], None, None, None, ["/proc/nonexistent", "written"]),
    ("bench-lr-nan", ["bench", "--loopback", "--lr", "nan"], None, None, None, ["--lr", "nan"]),
    ("bench-probe-s-zero", ["bench", "--loopback", "--probe-s", "0"], None, None, None, ["--probe-s", "0"]),
    ("netbench-reps-zero", ["netbench", "--workers", "2", "--reps", "0"], None, None, None, ["--reps", "0"]),
    ("profile-threads-zero", ["profile", "--model", "mlp", "--threads", "0"], None, None, None, ["--threads"]),
    ("compare-event-without-ts", ["compare", "{trace}", "{trace}"], None, None,
     {"traceEvents": [{"ph": "X", "name": "op0", "cat": "comm", "pid": 0, "tid": 0, "dur": 5.0}],
      "otherData": {"iteration_s": 0.1}}, ["traceEvents[0].ts", "missing"]),
]


@pytest.mark.parametrize("argv,profile,cluster,extra,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, profile, cluster, extra, words):
    if argv[0] == "profile" or "switch_iteration=x" in argv:
        pytest.importorskip("torch")
    files = {}
    for name, data in (("profile", profile or PROFILE), ("cluster", cluster or CLUSTER), ("plan", extra),
                       ("trace", extra)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        files[name] = str(path)
    code = main([a.format(**files) for a in argv])
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for word in words:
        assert word in lines[0], lines[0]
    assert "inf" not in captured.out and "nan" not in captured.out  # no figure was printed


def test_misspelling_rule_keeps_other_unknown_fields(tmp_path, capsys):
    """docs/formats.md: a field not spelled like a known one is kept, as tools add their own."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps(changed(PROFILE, _set(["recorded_on"], "laptop"))))
    assert Profile.load(path).extra["recorded_on"] == "laptop"
    assert main(["simulate", "--profile", str(path), "--alpha", "1e-4", "--beta", "1e-9", "--strategy", "wfbp"]) == 0


@pytest.mark.parametrize("strategy,options,word", [
    ("ddp", {"bucket_cap_mb": float("nan")}, "bucket_cap_mb"),
    ("threshold", {"mb": float("inf")}, "mb"),
    ("usbyte", {"unit_bytes": 0}, "unit_bytes"),
    ("usbyte", {"max_evaluations": 2.5}, "max_evaluations"),
    ("omgs", {"refine_plan": "maybe"}, "refine_plan"),
    ("auto", {"exclude": ["wfbp", "nope"]}, "nope"),
    ("auto", {"channels": 0}, "channels"),
    ("bytescheduler", {"partition_bytes": 1}, "partition_bytes"),
    ("wfbp", {"density": 0.1}, "density"),
])
def test_planner_options_are_checked_by_the_registry(strategy, options, word):
    """The same check for Python callers as for --opt: one place, every planner."""
    from gradsched.errors import GradschedError

    profile = Profile.from_dict(changed(PROFILE, lambda d: d["tensors"][2].update(numel=10_000_000, bytes=40_000_000)))
    with pytest.raises(GradschedError, match=word):
        make_plan(strategy, profile, Cluster.from_dict(CLUSTER), **options)


def test_options_from_the_command_line_are_typed():
    from gradsched.planners.registry import check_options

    assert check_options("ddp", {"bucket_cap_mb": "5"}) == {"bucket_cap_mb": 5.0}
    assert check_options("usbyte", {"unit_bytes": "1e6"}) == {"unit_bytes": 1_000_000}
    assert check_options("omgs", {"refine_plan": "false"}) == {"refine_plan": False}
    assert check_options("auto", {"exclude": "wfbp, ddp"}) == {"exclude": ("wfbp", "ddp")}
