"""The job wing (gradsched.jobs): typed results converted to emulated seconds once, by their declared
units; --contention-from pooled in one unit under --dilate; one launcher's timeout, kill, environment
and prefix policy."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest

from gradsched.calibration import contention_history, this_machine
from gradsched.cli import build_parser
from gradsched.jobs import launch as launcher
from gradsched.jobs.bench import DDP_DEFAULT_MB, finish, history_job
from gradsched.jobs.launch import PREFIXES, Ranks, environment, launch
from gradsched.jobs.results import (UNITS, BenchJsonRow, contention_to_run, pooled_contention, read_bench_row,
                                    to_emulated, undeclared)

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FITTED = {"compute_slowdown": 0.4, "comm_slowdown": 0.2, "busy_latency_s": 0.004, "op_latency_s": 0.002}


def _result(fitted: dict[str, float], **contention: object) -> dict:
    """A workers' bench.json, in run seconds."""
    return {"rows": [{"strategy": "ddp", "runs": "torch DDP", "iteration_s_median": 0.8, "iteration_s_mean": 0.9,
                      "predicted_iteration_s": 0.7, "prediction_error": -0.125, "lower_bound_s": 0.4,
                      "vs_lower_bound": 2.0, "contention_bound_s": 0.5, "vs_contention_bound": 1.6,
                      "operations": 3, "plan_hash": "x", "step_s": [[0.8, 1.0]], "warmup_rounds": 0,
                      "bucket_cap_mb": 25.0, "speedup_vs_ddp": 1.0, "speedup_vs_best_ddp": 1.0}],
            "lower_bound": {"lower_bound_s": 0.4, "compute_s": 0.3, "allreduce_all_s": 0.2,
                            "contention_bound_s": 0.5},
            "compute_only": {"iteration_s_median": 0.3, "step_s": [[0.3, 0.3]]},
            "contention": {"fitted": dict(fitted), "compute_alone_s": 0.3, **contention},
            "cluster": {"alpha_s": 1e-3}, "profile": {"compute_s": 0.3, "measured": {"other_s": 0.01}},
            "job_s": 100.0, "phases": [{"phase": "rounds", "s": 50.0, "peak_rss_bytes": 1}],
            "best_ddp": "ddp", "world_size": 2, "backend": "gloo", "machine": f"{this_machine()}, torch x"}


# ----------------------------------------------------------------------------- results in emulated seconds
def test_every_duration_the_types_mark_is_divided_once_and_nothing_else():
    out = to_emulated(_result(FITTED, op_host_samples=[[2e-4, 4e-4]], runtime_overhead_s={"gradsched": 0.01},
                              op_host={"issue_s": 2e-4, "retire_s": 4e-4}), 2.0)
    row, c = out["rows"][0], out["contention"]
    assert row["iteration_s_median"] == 0.4 and row["step_s"] == [[0.4, 0.5]] and row["vs_lower_bound"] == 2.0
    # these two escaped the old regex on key names and stayed dilated
    assert c["op_host_samples"] == [[1e-4, 2e-4]] and c["runtime_overhead_s"] == {"gradsched": 0.005}
    assert c["op_host"] == {"issue_s": 1e-4, "retire_s": 2e-4} and c["fitted"]["busy_latency_s"] == 0.002
    assert c["fitted"]["compute_slowdown"] == 0.4  # a ratio
    assert out["job_s"] == 100.0 and out["phases"][0]["s"] == 50.0  # the job's own time
    assert out["cluster"] == {"alpha_s": 1e-3} and out["profile"]["measured"] == {"other_s": 0.01}  # as measured
    assert out["dilate"] == 2.0 and to_emulated(_result(FITTED), 1.0) == _result(FITTED)


def test_the_stored_bench_results_declare_every_field():
    """Every field of the committed bench JSONs has a declared unit (BenchJsonRow: a row and the job's and
    command line's facts): none is converted, or left, by guess."""
    seen = 0
    for path in sorted(RESULTS.glob("*.json")):
        rows = json.loads(path.read_text())
        if not (isinstance(rows, list) and rows and isinstance(rows[0], dict) and "lower_bound" in rows[0]):
            continue
        assert [p for row in rows for p in undeclared(row, BenchJsonRow)] == [], path.name
        seen += 1
    assert seen >= 5


def test_the_json_rows_say_their_units_and_read_back_as_the_workers_measured():
    from gradsched.commands.bench import rows_for_json

    raw = _result(FITTED, op_host_samples=[[2e-4, 4e-4]], runtime_overhead_s={"gradsched": 0.01})
    rows = rows_for_json(finish(json.loads(json.dumps(raw)), 2.0), {"dilate": 2.0})
    assert {r["units"] for r in rows} == {UNITS}
    back, dilate = read_bench_row(rows[0])
    assert dilate == 2.0 and back["contention"] == raw["contention"] and back["step_s"] == raw["rows"][0]["step_s"]
    assert back["compute_only"] == raw["compute_only"] and back["lower_bound"] == raw["lower_bound"]


def test_the_load_per_round_is_in_every_json_row_and_reads_back_as_recorded():
    """The machine's load (a count of tasks, not a duration) is kept as recorded under a dilation, declared, and
    read back by the quiet/loaded split (gradsched.jobs.rounds.loaded_rounds)."""
    from gradsched.commands.bench import rows_for_json
    from gradsched.jobs.rounds import RoundLoads, loaded_rounds

    reads = iter([4.0, 3.0, 6.5, 5.9])
    loads = RoundLoads(read=lambda: next(reads))
    loads.at_startup_end()
    for _ in range(3):
        loads.after_round()
    raw = {**_result(FITTED), "load": loads.record(ranks=8, cores=2)}
    rows = rows_for_json(finish(json.loads(json.dumps(raw)), 2.5), {"dilate": 2.5})
    assert all(undeclared(r, BenchJsonRow) == [] for r in rows)
    back, _ = read_bench_row(json.loads(json.dumps(rows[0])))
    assert back["load"] == {"source": "/proc/loadavg, 1-minute", "startup_end": 4.0, "rounds": [3.0, 6.5, 5.9],
                            "ranks": 8, "cores": 2, "loaded_above": 6.0}
    assert loaded_rounds(back["load"], warmup_rounds=1) == [1] and loaded_rounds(back["load"], 2) == []
    assert loaded_rounds(None) is None and loaded_rounds({**back["load"], "rounds": [None, None]}) is None


# ----------------------------------------------------------------------------- --contention-from with --dilate
def test_contention_from_a_dilated_job_pools_in_the_workers_seconds(tmp_path):
    """Two jobs of one replay at --dilate 2 that measured the same: the pooled figures are that job's.

    The earlier job's JSON holds emulated seconds; this job's workers measure run seconds (2x).
    Before, the workers pooled the two as they were: the median of 4 ms and 2 ms per operation."""
    dilate = 2.0
    job = history_job("replay:googlenet-k80", 2, 1, "testbed 1gbit", "1gbit", 16, dilate)
    earlier = finish(_result(FITTED), dilate)  # what `gradsched bench --json` wrote for the first job
    rows = [{**r, **job, **{k: v for k, v in earlier.items() if k != "rows"}} for r in earlier["rows"]]
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(rows))
    history = contention_history([str(path)], job)
    assert history[0]["busy_latency_s"] == 0.002  # emulated seconds, as the file holds them
    twice = [str(path), str(path)]
    assert pooled_contention(FITTED, contention_history(twice, job), dilate) == FITTED  # run seconds, all alike
    # and the second job's JSON says the history as it was read, the pooled figures in emulated seconds
    second = finish(_result(FITTED, own_fitted=FITTED, history=contention_to_run(history, dilate)), dilate)
    assert second["contention"]["history"] == history
    assert second["contention"]["fitted"] == second["contention"]["own_fitted"] == history[0]


def test_the_bench_config_carries_the_dilation_and_the_history_as_read(tmp_path):
    from gradsched.commands.bench import _config
    from gradsched.jobs.config import BenchConfig

    args = build_parser().parse_args(["bench", "--replay", "googlenet-k80", "--dilate", "2", "--loopback",
                                      "--strategies", "wfbp", "--ddp-buckets", "none"])
    cfg = _config(args, str(tmp_path), [dict(FITTED)], "replay", 4)
    assert cfg.dilate == 2.0 and cfg.scale_bytes == 4 and cfg.contention_history == [FITTED]
    assert cfg.label == "googlenet-k80"  # the progress bar's name, not the workers' temporary copy's path
    assert BenchConfig.from_dict(cfg.to_dict()).label == cfg.label  # as the workers read it


# ----------------------------------------------------------------------------- one launcher
def _sleepers(monkeypatch, *codes_after: tuple[int, float]) -> None:
    """Launchers that exit with ``code`` after ``seconds`` (instead of torch.distributed.run)."""
    argvs = [[sys.executable, "-c", f"import sys, time; print('hello {i}', flush=True); time.sleep({s}); "
              f"sys.exit({c})"] for i, (c, s) in enumerate(codes_after)]
    monkeypatch.setattr(launcher, "loopback_argvs", lambda ranks: argvs)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_launcher_that_fails_stops_the_others(monkeypatch, tmp_path):
    # rank 0 fails once rank 1 has said hello (an event, not a race with a loaded machine's start-up)
    said = tmp_path / "rank1-said-hello"
    argvs = [[sys.executable, "-c", f"import os, sys, time; print('hello 0', flush=True)\n"
              f"while not os.path.exists({str(said)!r}): time.sleep(0.01)\nsys.exit(3)"],
             [sys.executable, "-c", f"import time; print('hello 1', flush=True); open({str(said)!r}, 'w').close(); "
              "time.sleep(60)"]]
    monkeypatch.setattr(launcher, "loopback_argvs", lambda ranks: argvs)
    t0 = time.monotonic()
    done = launch(Ranks(script_argv=("-m", "x"), hosts=2), on_line=lambda line: None)
    assert done.code == 3 and not done.timed_out and time.monotonic() - t0 < 30
    assert sorted(done.tail) == ["hello 0", "hello 1"]
    with pytest.raises(Exception, match="the workers failed \\(exit status 3\\)"):
        done.check("the workers")


def test_the_timeout_stops_every_launcher_with_124(monkeypatch):
    _sleepers(monkeypatch, (0, 60.0), (0, 60.0))
    started = []
    real_popen = launcher.subprocess.Popen
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or
                        started[-1])
    done = launch(Ranks(script_argv=("-m", "x"), hosts=2, timeout_s=0.5))
    assert done.timed_out and done.code == 124
    assert all(p.poll() is not None for p in started) and all(_gone(p.pid) for p in started)
    with pytest.raises(Exception, match="did not finish within 0.5 s"):
        done.check("the workers")


def test_one_environment_policy(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    env = environment(Ranks(script_argv=(), hosts=2, threads=3))
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["PYTHONUNBUFFERED"]) == ("3", "3", "1")
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice stands
    assert environment(Ranks(script_argv=(), hosts=2))["GLOO_SOCKET_IFNAME"] == "eth7"


def test_one_prefix_rule_each_command_its_own_testbed():
    assert len(set(PREFIXES.values())) == len(PREFIXES) and "gs" not in PREFIXES.values()
    parser = build_parser()
    for command, extra in (("bench", []), ("train", []), ("netbench", [])):
        assert parser.parse_args([command, *extra]).prefix == PREFIXES[command]
    assert parser.parse_args(["bench", "--prefix", "tj"]).prefix == "tj"


def test_an_interrupt_stops_every_launcher_and_is_raised(monkeypatch):
    """Ctrl-C (or SIGTERM under sigterm_unwinds) while the ranks run: all stopped, the interrupt goes on."""
    import gradsched.testbed

    _sleepers(monkeypatch, (0, 60.0), (0, 60.0))
    started = []
    real_popen = launcher.subprocess.Popen
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or
                        started[-1])

    real_sleep, calls = time.sleep, []

    def interrupted(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the wait loop's first pause; the stopping that follows sleeps as usual
        real_sleep(seconds)

    monkeypatch.setattr(gradsched.testbed.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch(Ranks(script_argv=("-m", "x"), hosts=2))
    assert len(started) == 2 and all(p.poll() is not None for p in started)


# ----------------------------------------------------------------------------- one parameter, end to end
def test_dilate_and_scale_bytes_go_from_argv_to_the_workers_and_back_unchanged(tmp_path, monkeypatch):
    """``--dilate 2 --scale-bytes 4`` from the command line: the launcher shapes links at rate / 2 / 4, the
    workers read both from their config (``BenchConfig.from_dict``, as ``worker.run_worker`` does) and replay a profile stretched
    2x with tensors 1/4; what they return in run seconds reaches the JSON divided by 2 once, with both values
    stated as given, and reads back as the workers measured.  In-process: the ranks are this test."""
    from gradsched import cli
    from gradsched.commands import bench
    from gradsched.constants import REPLAY_PREFIX
    from gradsched.jobs.config import BenchConfig
    from gradsched.jobs.launch import Launched
    from gradsched.profile import Profile
    from gradsched.replayable import load_profile

    raw = _result(FITTED, op_host_samples=[[2e-4, 4e-4]], runtime_overhead_s={"gradsched": 0.01},
                  compute_overlapped_s=0.4, compute_slowdown=1.33, allreduce_alone_s=0.1, allreduce_overlapped_s=0.12)
    seen: dict = {}

    def ranks_run(ranks: Ranks, on_line=None) -> Launched:  # what each rank does with its argv
        assert ranks.script_argv[:2] == ("-m", bench.WORKER)
        cfg = BenchConfig.from_dict(json.loads(Path(ranks.script_argv[2]).read_text()))
        seen.update(cfg=cfg, rate=ranks.rate, replayed=Profile.load(cfg.model.removeprefix(REPLAY_PREFIX)))
        Path(cfg.out_dir, "bench.json").write_text(json.dumps(raw))  # rank 0's result, run seconds
        return Launched(0, [])

    monkeypatch.setattr(launcher, "launch", ranks_run)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # --rate: the testbed's flag (no testbed comes up here)
    out = tmp_path / "out.json"
    argv = ["bench", "--replay", "googlenet-k80", "--rate", "1gbit", "--dilate", "2", "--scale-bytes", "4",
            "--strategies", "wfbp", "--ddp-buckets", "8", "--json", str(out), "-q"]
    assert cli.main(argv) == 0
    cfg, given = seen["cfg"], load_profile("googlenet-k80")
    assert (cfg.dilate, cfg.scale_bytes, seen["rate"]) == (2.0, 4, 10**9 // 2 // 4)
    assert [e["ddp_kwargs"]["bucket_cap_mb"] for e in cfg.entries if e["torch_ddp"]] == [DDP_DEFAULT_MB / 4, 8 / 4]
    assert math.isclose(seen["replayed"].compute_s, 2 * given.compute_s, rel_tol=1e-9)
    assert [t.numel for t in seen["replayed"].tensors] == [max(1, round(t.numel / 4)) for t in given.tensors]
    rows = json.loads(out.read_text())
    assert {(r["dilate"], r["scale_bytes"], r["units"]) for r in rows} == {(2.0, 4, UNITS)}
    assert rows[0]["iteration_s_median"] == raw["rows"][0]["iteration_s_median"] / 2
    assert rows[0]["contention"]["runtime_overhead_s"] == {"gradsched": 0.005}
    back, dilate = read_bench_row(rows[0])
    assert dilate == 2.0 and back["contention"] == raw["contention"] and back["step_s"] == raw["rows"][0]["step_s"]


def test_an_interrupt_while_a_launcher_starts_stops_it_too(monkeypatch):
    """Ctrl-C (or SIGTERM under sigterm_unwinds) that fires inside ``Popen``, after the child started and
    before ``Popen`` returned it: before, that launcher was never registered and ran on, orphaned."""
    import signal

    # Ctrl-C's own handler, as an interactive shell gives it: a job started in the background (`cmd &`, nohup)
    # inherits SIGINT ignored, and Python then leaves it ignored (this test failed so, whatever the load)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    _sleepers(monkeypatch, (0, 60.0), (0, 60.0))
    started = []
    real_popen = launcher.subprocess.Popen

    def popen_interrupted(*a, **k):
        started.append(real_popen(*a, **k))
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next instruction: still inside "Popen"
        time.sleep(0.05)
        return started[-1]

    monkeypatch.setattr(launcher.subprocess, "Popen", popen_interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(Ranks(script_argv=("-m", "x"), hosts=2))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(started) == 1 and started[0].poll() is not None and _gone(started[0].pid)
