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


# ---------------------------------------------------------------- issue 39 item 6: hostile files and values
# Every file a command reads goes through gradsched._files: a regular file only (a named pipe hung, /dev/zero
# filled memory), size-capped before parsing, UTF-8, JSON within limits of digits and depth.  Each case
# used to end in a hang, a MemoryError, a traceback or a misleading message.


def _fifo(tmp_path):
    import os

    path = tmp_path / "pipe.json"
    os.mkfifo(path)  # nobody writes to it: reading it without care waits for ever
    return str(path)


def _oversized(tmp_path, flag):
    """A sparse file one byte over the cap (no disk used): refused on its size, never read."""
    from gradsched import _files

    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate((_files.MAX_TRACE_BYTES if flag == "compare" else _files.MAX_INPUT_BYTES) + 1)
    return str(path)


def _written(tmp_path, data: bytes):
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    return str(path)


# (kind, how the file is made, words in the error line)
HOSTILE_FILES = [
    ("named-pipe", lambda tmp, flag: _fifo(tmp), ["named pipe", "not a regular file"]),
    ("dev-zero", lambda tmp, flag: "/dev/zero", ["/dev/zero", "character device"]),
    ("directory", lambda tmp, flag: str(tmp), ["directory", "not a regular file"]),
    ("utf-16", lambda tmp, flag: _written(tmp, json.dumps(PROFILE).encode("utf-16")), ["UTF-16", "UTF-8"]),
    ("invalid-utf-8", lambda tmp, flag: _written(tmp, b'{"format": "\xff\xfe"}'), ["not UTF-8", "0xff", "offset 12"]),
    ("nested-100000-deep", lambda tmp, flag: _written(tmp, b"[" * 100_000 + b"]" * 100_000), ["nests deeper", "64"]),
    ("integer-5000-digits", lambda tmp, flag: _written(tmp, b'{"format": 1' + b"0" * 5000 + b"}"),
     ["integer of 5,001 digits"]),
    ("oversized", _oversized, ["MiB, above the most gradsched reads"]),
]
# (flag, argv with {bad}, {profile}, {cluster} placeholders)
FILE_FLAGS = [
    ("simulate-profile", ["simulate", "--profile", "{bad}", "--alpha", "1e-4", "--beta", "1e-9"]),
    ("simulate-cluster", ["simulate", "--profile", "{profile}", "--cluster", "{bad}"]),
    ("simulate-plan", ["simulate", "--profile", "{profile}", "--alpha", "1e-4", "--beta", "1e-9", "--plan", "{bad}"]),
    ("compare", ["compare", "{bad}", "{bad}"]),
    ("bench-contention-from", ["bench", "--loopback", "--contention-from", "{bad}"]),
    ("bench-replay", ["bench", "--loopback", "--replay", "{bad}"]),
    ("train-plan", ["train", "--plan", "{bad}"]),
]


@pytest.mark.timeout(60)  # a named pipe read without care hangs: fail, do not stall
@pytest.mark.parametrize("argv", [f[1] for f in FILE_FLAGS], ids=[f[0] for f in FILE_FLAGS])
@pytest.mark.parametrize("make,words", [h[1:] for h in HOSTILE_FILES], ids=[h[0] for h in HOSTILE_FILES])
def test_hostile_file_is_refused_before_parsing(tmp_path, capsys, argv, make, words):
    profile, cluster = tmp_path / "profile.json", tmp_path / "cluster.json"
    profile.write_text(json.dumps(PROFILE))
    cluster.write_text(json.dumps(CLUSTER))
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = make(bad_dir, argv[0])
    code = main([a.format(bad=bad, profile=profile, cluster=cluster) for a in argv])
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert bad in lines[0], lines[0]  # the line names the file ...
    for word in words:  # ... and the cause
        assert word in lines[0], lines[0]


def test_utf8_byte_order_mark_and_large_float_exponents_are_read(tmp_path):
    """What is not hostile still reads: a UTF-8 BOM (Windows editors write one) and long decimals."""
    from gradsched import _files

    path = tmp_path / "p.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(changed(PROFILE, _set(["tensors", 0, "forward_s"], 0.1))).encode())
    assert Profile.load(path).tensors[0].forward_s == 0.1
    assert _files.parse_json('{"x": 0.' + "1" * 5000 + "}", "<text>")["x"] == pytest.approx(0.1111111)
    assert _files.parse_json("[" * 64 + "]" * 64, "<text>") == _files.parse_json("[" * 64 + "]" * 64, "<text>")


@pytest.mark.parametrize("argv", [
    ["simulate", "--alpha", "1e-4", "--beta", "1e-9", "--strategy", "wfbp", "--json", "/dev/full"],
    ["simulate", "--alpha", "1e-4", "--beta", "1e-9", "--strategy", "wfbp", "--trace", "/dev/full"],
    ["plan", "--strategy", "wfbp", "--alpha", "1e-4", "--beta", "1e-9", "-o", "/dev/full"],
    ["advise", "--alpha", "1e-4", "--beta", "1e-9", "--json", "/dev/full"],
    ["plan", "--strategy", "wfbp", "--alpha", "1e-4", "--beta", "1e-9", "-o", "/proc/version"],
    ["simulate", "--alpha", "1e-4", "--beta", "1e-9", "--strategy", "wfbp", "--json", "/etc/hostname/out.json"],
], ids=["simulate-json", "simulate-trace", "plan-output", "advise-json", "plan-output-refused", "json-folder-is-a-file"])
def test_output_that_cannot_be_written_is_one_line(capsys, argv):
    """/dev/full: every write fails with ENOSPC, an OSError without a file name (was an internal error);
    /proc/version refuses writes, even root's; a folder that is a file ("File exists") is named."""
    code = main(argv)
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert argv[-1] in lines[0] and "cannot be written" in lines[0], lines[0]
    assert "No space left" in lines[0] or "/proc" in lines[0] or "its folder /etc/hostname cannot be made" in lines[0]
    assert "give a path in a folder you can write" in lines[0]  # the remedy


def test_plot_to_a_full_disk_is_one_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code = main(["simulate", "--alpha", "1e-4", "--beta", "1e-9", "--strategy", "wfbp", "--plot", "/dev/full"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "/dev/full" in err, err


# (case id, argv, words in the line)
BAD_VALUES = [
    ("netbench-backend-unknown", ["netbench", "--workers", "2", "--backend", "foo"], ["--backend", "'foo'", "gloo"]),
    ("netbench-max-bytes-one-size", ["netbench", "--workers", "2", "--max-bytes", "8192"],
     ["--max-bytes", "16384", "allgather"]),
    ("netbench-max-bytes-one-size-8-ranks", ["netbench", "--workers", "8", "--max-bytes", "32768"],
     ["--max-bytes", "65536"]),
    ("netbench-workers-huge", ["netbench", "--workers", "1000000000"], ["--workers", "at most 256"]),
    ("train-workers-huge", ["train", "--workers", "1000000000"], ["--workers", "at most 256", "1,000,000,000"]),
    ("bench-hosts-huge", ["bench", "--loopback", "--hosts", "100", "--ranks-per-host", "64"],
     ["--hosts x --ranks-per-host", "6,400"]),
    ("train-batch-size-huge", ["train", "--batch-size", "1000000000"], ["--batch-size", "1,048,576"]),
    ("bench-batch-size-huge", ["bench", "--loopback", "--batch-size", "1000000000"], ["--batch-size", "1,048,576"]),
    ("model-os-system", ["train", "--model", "os:system"], ["os:system", "built-in function"]),
    ("model-builtins-print", ["train", "--model", "builtins:print"], ["builtins:print", "built-in function"]),
    ("model-stdlib-function", ["train", "--model", "json:loads"], ["json.loads", "standard library"]),
    ("profile-model-os-system", ["profile", "--model", "os:system", "-o", "/dev/null"], ["os:system", "built-in"]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv,words", [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_bad_value_is_refused_up_front(capsys, argv, words):
    """Checked before any process starts or any byte is measured (``--max-bytes 8192`` failed after
    measuring, ``--workers 1000000000`` started processes until memory ran out, ``os:system`` was called)."""
    if "--model" in argv:
        pytest.importorskip("torch")
    code = main(argv)
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 2, captured
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for word in words:
        assert word in lines[0], lines[0]
    assert captured.out == ""  # nothing ran: os.system(0) / print(0) never printed


def test_profile_batch_larger_than_memory_is_refused_before_it_is_made(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    from gradsched.commands import _model

    monkeypatch.setattr(_model, "_available_bytes", lambda: 10 * 2**20)  # 10 MiB free
    out = tmp_path / "p.json"
    code = main(["profile", "--model", "mlp", "--batch-size", "100000", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "--batch-size 100,000" in err and "GiB available" in err, err
    assert not out.exists()


@pytest.mark.parametrize("timeout_s", [float("inf"), float("nan"), 0, -1, 1e300, True])
def test_wrapper_timeout_must_be_finite(timeout_s):
    """``timeout_s=inf`` was taken, and a hung peer then reported as a dead one."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from gradsched.errors import GradschedError
    from gradsched.torch import DistributedDataParallel

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        words = r"^timeout_s must be (a finite number|a number|above 0 and at most 604800|at most 604800)\b.*, got"
        with pytest.raises(GradschedError, match=words):
            DistributedDataParallel(torch.nn.Linear(2, 2), timeout_s=timeout_s)
    finally:
        if created:
            dist.destroy_process_group()


def test_json_to_a_full_stdout_is_one_line():
    """``--json -`` with stdout on a full disk (``> /dev/full``): one line, exit 2, no traceback."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "gradsched.cli", "simulate", "--alpha", "1e-4", "--beta", "1e-9",
                               "--strategy", "wfbp", "--json", "-"], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "stdout" in lines[0] and "No space left" in lines[0], lines[0]


@pytest.mark.parametrize("argv", [["simulate", "--alpha", "1e-4", "--beta", "1e-9", "--strategy", "wfbp"],
                                  ["advise", "--alpha", "1e-4", "--beta", "1e-9", "--buckets", "5,25"]],
                         ids=["simulate", "advise"])
def test_a_plain_report_to_a_full_stdout_is_one_line(argv):
    """The human-readable report with stdout on a full disk (``> /dev/full``): buffered, it fails at the
    command's end, not in a print (was an internal error with a traceback)."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "gradsched.cli", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot be written" in lines[0] and "No space left" in lines[0], lines[0]
