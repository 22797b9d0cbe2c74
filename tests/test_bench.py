"""``gradsched bench``: what it runs, its lower bound, its errors, and one short end-to-end run."""

from __future__ import annotations

import json
import os

import pytest

from gradsched.cli import main
from gradsched.cluster import Cluster
from gradsched.calibration import lower_bound_s
from gradsched.commands.bench import entries
from gradsched.errors import GradschedError
from gradsched.profile import Profile, TensorProfile


def test_entries_add_ddp_reference_and_bucket_sweep_without_duplicates():
    got = entries("auto,wfbp,auto", "1,25,100,all")
    labels = [e["label"] for e in got]
    assert labels == ["ddp", "auto", "wfbp", "ddp-1mb", "ddp-100mb", "ddp-all"]
    by = {e["label"]: e for e in got}
    assert by["ddp"]["torch_ddp"] and "ddp_kwargs" not in by["ddp"]  # DDP's own default, 25 MB
    assert by["ddp-1mb"]["ddp_kwargs"] == {"bucket_cap_mb": 1.0}
    assert by["ddp-all"]["ddp_kwargs"]["bucket_cap_mb"] > 1e5
    assert not by["auto"]["torch_ddp"] and by["wfbp"]["strategy"] == "wfbp"


def test_entries_without_sweep_run_only_what_is_asked():
    assert [e["label"] for e in entries("wfbp,mgwfbp", "none")] == ["wfbp", "mgwfbp"]


def test_fsdp2_is_a_row_beside_the_strategies():
    got = entries("fsdp2,dear,fsdp2", "none")
    assert [e["label"] for e in got] == ["fsdp2", "dear"]
    assert got[0]["fsdp2"] and not got[0]["torch_ddp"] and "fsdp2" not in got[1]


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(GradschedError, match="unknown; known: .*mgwfbp.*auto"):
        entries("ddp,fastest", "none")
    with pytest.raises(GradschedError, match="give its density"):
        entries("topk", "none")
    with pytest.raises(GradschedError, match=r"--density must be at most 1, got 2"):
        entries("omgs", "none", density=2.0)


def test_sparse_entries_carry_their_density_and_auto_stays_dense():
    by = {e["label"]: e for e in entries("topk,omgs,auto", "none", density=0.01)}
    assert by["topk"]["options"] == {"density": 0.01} and by["omgs"]["options"] == {"density": 0.01}
    assert "density" not in by["auto"]["options"]
    with pytest.raises(GradschedError, match="megabytes or 'all'"):
        entries("ddp", "1,big")


def _profile() -> Profile:
    # Backward order 2, 1, 0: tensor 2 ready at 0.1 s, 1 at 0.3 s, 0 at 0.6 s.
    tensors = (TensorProfile("a", 100, 400, 0.05, 0.3), TensorProfile("b", 1000, 4000, 0.05, 0.2),
               TensorProfile("c", 10, 40, 0.05, 0.1))
    return Profile("toy", tensors, other_s=0.05)


def test_lower_bound_is_the_larger_of_compute_and_network_bounds():
    prof = _profile()  # compute 0.15 + 0.6 + 0.05 = 0.8 s
    fast = Cluster.alpha_beta(0.01, 1e-6, 2)  # all 4440 B: 0.01444 s; last-ready tensor a (400 B): 0.0104 s
    lb = lower_bound_s(prof, fast)
    assert lb["compute_s"] == pytest.approx(0.8)
    assert lb["lower_bound_s"] == pytest.approx(0.8)  # the last all-reduce can hide behind 0.05 s of other work
    less = Profile("toy", prof.tensors, other_s=0.004)  # ... not behind 0.004 s of it
    assert lower_bound_s(less, fast)["lower_bound_s"] == pytest.approx(0.754 + 0.01 + 400e-6 - 0.004)
    slow = Cluster.alpha_beta(0.01, 1e-3, 2)  # all: 4.45 s, starting when c is ready at 0.1 s
    assert lower_bound_s(prof, slow)["lower_bound_s"] == pytest.approx(0.1 + 0.01 + 4.44)


def test_bytes_cost_no_less_than_their_cheapest_split():
    from gradsched.calibration.bounds import least_time_s
    from gradsched.cluster import CollectiveCost

    line = CollectiveCost(0.01, 1e-6)
    assert least_time_s(line, 4440) == pytest.approx(line.time_s(4440))  # one operation is the cheapest split
    # a table whose 2 MB costs 3 s but whose 1 MB costs 1 s: two 1 MB operations move 2 MB in 2 s
    table = CollectiveCost(0.0, 1.5e-6, ((1e6, 1.0), (2e6, 3.0)))
    assert least_time_s(table, 2e6) == pytest.approx(2.0)
    assert least_time_s(table, 1e6) == pytest.approx(1.0) and least_time_s(table, 0) == 0.0


def test_bytes_cost_no_less_than_the_cheapest_larger_operation_that_carries_them():
    """Beyond a table its line may start below the table's last point: 1 KB then rides more
    cheaply in an operation of 2001 bytes than alone (hypothesis found an mgwfbp plan that did)."""
    from gradsched.calibration.bounds import least_time_s
    from gradsched.cluster import CollectiveCost

    table = CollectiveCost(0.5, 1e-4, ((1.0, 0.5), (1e3, 1.0), (2e3, 3.0)))
    assert table.time_s(2001) == pytest.approx(0.7001)
    assert least_time_s(table, 1e3) == pytest.approx(1.0)  # operations of at most 1 KB: one of 1 KB
    assert least_time_s(table, 1e3, largest=4e3) == pytest.approx(0.7001)
    assert least_time_s(table, 1e3, largest=1.5e3) == pytest.approx(1.0)


@pytest.mark.parametrize("model_mb,largest_mb,ranks,free_gb,fits", [
    (53.5, 4.1, 8, 21.5, True),   # GoogLeNet on 8 hosts: refused when every row held its own copy
    (102, 9.4, 8, 21.5, True),    # ResNet-50 on 8 hosts: the same
    (553, 411, 4, 21.5, True),    # VGG-16 on 4 hosts (on 8 it needs --scale-bytes)
    (553, 411, 8, 21.5, False),
    (2000, 200, 8, 21.5, False),  # 2 GB of parameters on 8 ranks: 52 GB
    (553, 411, 8, 8.0, False),    # VGG-16 on 8 hosts of a machine with 8 GB available
])
def test_memory_check_does_not_count_rows_and_names_its_margin(model_mb, largest_mb, ranks, free_gb, fits):
    from gradsched.bench_memory import COPIES, check_memory, planning_bytes, rank_bytes

    have = int(free_gb * 1e9)
    model, largest = int(model_mb * 1e6), int(largest_mb * 1e6)
    if fits:
        assert check_memory(model, largest, ranks, have) == pytest.approx(ranks * rank_bytes(model, largest)
                                                                          + planning_bytes())
    else:
        with pytest.raises(GradschedError, match=f"on {ranks} ranks needs about .*{COPIES}x the parameters.* "
                                                 "80% of the available .* the rest is the margin"):
            check_memory(model, largest, ranks, have)


def test_memory_check_counts_numbas_kernels_only_where_gradsched_jit_loads_them(monkeypatch):
    """The bench plans without numba's kernels unless GRADSCHED_JIT is given (bench_startup._kernels_where_they_pay),
    whatever the model: check_memory counts rank 0's 0.1 GB of kernels only where it is given, not 0."""
    import importlib.util

    from gradsched.bench_memory import KERNELS_BYTES, check_memory, rank_bytes

    model, largest, have = int(40e6), int(4e6), int(100e9)
    plain = 8 * rank_bytes(model, largest, 8)
    for jit in (None, "0"):
        if jit is None:
            monkeypatch.delenv("GRADSCHED_JIT", raising=False)
        else:
            monkeypatch.setenv("GRADSCHED_JIT", jit)
        assert check_memory(model, largest, 8, have) == pytest.approx(plain)
    monkeypatch.setenv("GRADSCHED_JIT", "1")
    numba = importlib.util.find_spec("numba") is not None
    assert check_memory(model, largest, 8, have) == pytest.approx(plain + (KERNELS_BYTES if numba else 0.0))


# stored runs of the current design (shared model, the probe's buffers cut, numba left out: googlenet-k80's 128 tensors):
# the default job verbatim (6 rows, run-time auto among them), and 12 rows (8 strategies, DDP's 4 bucket sizes); and
# large parameters: LLaMA-7B at S = 128 on 2 hosts (210 MB; auto planned at start-up, and warmed up in situ),
# since the probe's first restore no longer holds its buffer twice
MEMORY_RUNS = ["bench_main_job_mem7.json", "bench_rows_mem7_googlenet_k80_2h_nodear.json", "bench_main_job_mem8.json",
               "bench_replay_llama_7b_2h_mem13.json", "bench_replay_llama_7b_2h_mem13_insitu.json"]


@pytest.mark.parametrize("name", MEMORY_RUNS)
def test_the_memory_estimate_matches_the_stored_runs_peaks(name, monkeypatch):
    """check_memory's estimate of the largest rank's peak (bench_memory.peak_bytes) against the VmHWM that a stored
    bench measured (peak_rss_bytes): not under it by more than 3%, not over it by more than 10%."""
    from pathlib import Path

    from gradsched.bench_memory import peak_bytes

    monkeypatch.delenv("GRADSCHED_JIT", raising=False)  # as the stored runs ran
    rows = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / name).read_text())
    tensors = rows[0]["profile"]["measured"]["tensors"]
    two_phase = any(r["strategy"] in ("dear", "auto") for r in rows)  # auto: dear among its candidates
    estimate = peak_bytes(rows[0]["profile"]["total_bytes"], max(t["bytes"] for t in tensors), rows[0]["world_size"],
                          two_phase)
    measured = rows[0]["peak_rss_bytes"]
    assert 0.97 * measured <= estimate <= 1.10 * measured, (estimate, measured)


def test_auto_planned_at_start_up_leaves_dear_out_where_the_table_did_not_time_its_phases():
    from gradsched.jobs.bench import runs_two_phase, unmeasured_phases_excluded
    from gradsched.jobs.config import BenchEntry

    opts = {"adaptive": False}
    planned = unmeasured_phases_excluded(opts, {"allreduce": None}, in_situ=False)
    assert planned["exclude"] == ["dear"] and planned["adaptive"] is False and "exclude" not in opts
    assert not runs_two_phase([BenchEntry(label="auto", strategy="auto", torch_ddp=False, options=planned)])
    # the phases timed, run-time auto (it measures what it tries), or dear left out already: as given
    timed = {"allreduce": None, "reducescatter": None, "allgather": None}
    assert unmeasured_phases_excluded(opts, timed, in_situ=False) is opts
    assert unmeasured_phases_excluded(opts, {"allreduce": None}, in_situ=True) is opts
    given = {"exclude": "dear,usbyte"}
    assert unmeasured_phases_excluded(given, {"allreduce": None}, in_situ=False) is given
    assert unmeasured_phases_excluded({"exclude": ["usbyte"]}, {}, in_situ=False)["exclude"] == ["usbyte", "dear"]


def test_memory_check_counts_a_two_phase_rows_buffers_and_names_them():
    """A dear row (or auto trying dear) holds its shards beside the arena, and beyond two ranks the all-to-all's
    buffer as large as the gradients (gradsched.torch.runtime.decoupled): the check counts them where a row may
    run them, says so and how many MB, and names its margin."""
    from gradsched.bench_memory import COPIES, RANK_BASE_BYTES, check_memory, planning_bytes, rank_bytes, two_phase_bytes
    from gradsched.jobs.bench import entries, runs_two_phase

    model, largest = int(100e6), int(10e6)
    assert two_phase_bytes(model, 2) == model / 2 and two_phase_bytes(model, 4) == model * 1.25
    assert rank_bytes(model, largest, 4, two_phase=True) == RANK_BASE_BYTES + COPIES * model + largest + model * 1.25
    plain = 4 * rank_bytes(model, largest, 4) + planning_bytes()
    have = int(plain / 0.8) + 1  # fits without the two phases, not with them
    assert check_memory(model, largest, 4, have) == pytest.approx(plain)
    with pytest.raises(GradschedError, match=r"125 MB for the two phases' buffers \(dear\).* the rest is the "
                                             r"margin: [0-9.]+ GB"):
        check_memory(model, largest, 4, have, two_phase=True)
    assert runs_two_phase(entries("ddp,dear", "none")) and runs_two_phase(entries("ddp,auto", "none"))
    assert not runs_two_phase(entries("ddp,sync,usbyte,fsdp2", "1,5"))
    assert not runs_two_phase(entries("ddp,auto", "none", options={"auto": {"exclude": ["dear"]}}))
    assert not runs_two_phase(entries("ddp,auto", "none", options={"auto": {"exclude": "usbyte,dear"}}))


def test_rate_without_root_says_what_to_do(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["bench", "--rate", "1gbit", "--model", "mlp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--loopback" in err[0] and "root" in err[0]


def test_bad_arguments_exit_2_before_launching(capsys):
    assert main(["bench", "--loopback", "--strategies", "nope"]) == 2
    assert "known:" in capsys.readouterr().err
    assert main(["bench", "--loopback", "--hosts", "1"]) == 2
    assert main(["bench", "--loopback", "--rounds", "2", "--warmup-rounds", "2"]) == 2
    assert main(["bench", "--loopback", "--ranks-per-host", "0"]) == 2
    assert "ranks per host must be" in capsys.readouterr().err


def test_ranks_per_host_on_loopback_start_one_launcher_per_node(monkeypatch, tmp_path):
    """3 nodes x 2 ranks: node i's torchrun starts ranks [2i, 2i + 2) (its LOCAL_WORLD_SIZE is 2), one rendezvous."""
    from gradsched.jobs import launch

    started = []

    class Exited:  # a launcher that has already exited 0
        def __init__(self, argv, **kwargs):
            started.append(argv)
            self.pid = 0

        def poll(self):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Exited)
    ranks = launch.Ranks.of("gradsched.torch.jobs.bench_worker", tmp_path / "config.json", hosts=3, ranks_per_host=2,
                            timeout_s=60.0)
    assert launch.launch(ranks).code == 0
    flags = [{a.split("=")[0]: a.split("=")[1] for a in argv if a.startswith("--")} for argv in started]
    assert [f["--node-rank"] for f in flags] == ["0", "1", "2"]
    assert all(f["--nnodes"] == "3" and f["--nproc-per-node"] == "2" for f in flags)
    assert len({f["--master-port"] for f in flags}) == 1
    assert all(argv[-3:] == ["-m", "gradsched.torch.jobs.bench_worker", str(tmp_path / "config.json")]
               for argv in started)


# the end-to-end test's testbed (as root): not the bench's default `gsb`, which a user's (or the README's) bench may
# hold while the tests run, nor a prefix another test brings up (test_testbed.py's gst, gsq, gsr, gsf, ...)
END_TO_END_PREFIX = "gsbt"


def test_the_end_to_end_benchs_testbed_is_its_own():
    from pathlib import Path

    from gradsched.jobs.launch import PREFIXES
    from gradsched.testbed import _check_prefix

    assert _check_prefix(END_TO_END_PREFIX) == END_TO_END_PREFIX and END_TO_END_PREFIX not in PREFIXES.values()
    here = Path(__file__).resolve()
    assert not [f.name for f in here.parent.rglob("*.py") if f != here and f'"{END_TO_END_PREFIX}"' in f.read_text()]


@pytest.mark.slow
def test_short_benchmark_end_to_end_writes_valid_json(tmp_path, capsys):
    """2 hosts (testbed as root, its own prefix; else loopback), tiny model, 3 strategies: valid JSON and table."""
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    net = ["--rate", "1gbit", "--prefix", END_TO_END_PREFIX] if os.geteuid() == 0 else ["--loopback"]
    code = main(["bench", "--model", "mlp", "--hosts", "2", *net, "--strategies", "ddp,wfbp,auto",
                 "--ddp-buckets", "1", "--steps", "2", "--rounds", "3", "--profile-iterations", "3",
                 "--net-reps", "1", "--no-probe", "-q", "--timeout-s", "120", "--json", str(out), "--plot", str(png)])
    assert code == 0
    rows = json.loads(out.read_text())
    assert isinstance(rows, list)
    assert [r["strategy"] for r in rows] == ["ddp", "wfbp", "auto", "ddp-1mb"]
    for r in rows:
        for key in ("iteration_s_median", "speedup_vs_ddp", "lower_bound_s", "predicted_iteration_s"):
            assert isinstance(r[key], float) and r[key] > 0, (r["strategy"], key)
        assert len(r["step_s"]) == 3 and all(len(s) == 2 for s in r["step_s"])
        assert r["world_size"] == 2 and r["hosts"] == 2
        assert r["prediction_error"] == pytest.approx((r["predicted_iteration_s"] - r["iteration_s_median"])
                                                      / r["iteration_s_median"])
    ref = rows[0]["compute_only"]  # the same steps moving no gradients, timed in the same rounds
    assert ref["iteration_s_median"] > 0 and len(ref["step_s"]) == 3
    assert rows[0]["profile"]["compute_s"] == pytest.approx(ref["iteration_s_median"])  # what predictions use
    assert rows[0]["lower_bound"]["compute_s"] == pytest.approx(ref["iteration_s_median"])
    by = {r["strategy"]: r for r in rows}
    assert by["ddp"]["speedup_vs_ddp"] == pytest.approx(1.0)
    assert by["ddp-1mb"]["bucket_cap_mb"] == 1.0 and by["ddp-1mb"]["runs"] == "torch DDP"
    # what auto runs: a plan it planned (options say what it chose) or one it measured and kept (a trial's,
    # PyTorch's own DDP): then its last switch names it
    auto = by["auto"]
    chose = auto["plan_options"].get("chose") or auto["autotune"]["switches"][-1]["strategy"]
    assert auto["runs"] == "gradsched" and chose
    assert png.stat().st_size > 1000
    table = capsys.readouterr().out
    assert "auto chose" in table and "ddp-1mb" in table


@pytest.mark.parametrize("kc,kn,lat", [(0.5, 0.3, 0.0), (0.0, 1.0, 2e-3), (0.8, 0.0, 1e-4), (0.2, 2.5, 5e-4)])
@pytest.mark.parametrize("compute_s,comm_s,small_s", [(1.0, 0.6, 0.01), (0.05, 0.003, 0.004)])
@pytest.mark.parametrize("op_lat", [0.0, 1e-4])
def test_contention_figures_invert_the_probe(kc, kn, lat, compute_s, comm_s, small_s, op_lat):
    pytest.importorskip("torch")
    from gradsched.calibration import OP_LATENCY_SHARE, contention_from_probe

    ops = 8  # what the model predicts for each probe measurement, inverted back
    alone = small_s + ops * op_lat / OP_LATENCY_SHARE  # the model's op latency is a share of this excess
    fitted = contention_from_probe(compute_s, comm_s, compute_s * (1 + kc), comm_s * (1 + kn),
                                   small_s, small_s * (1 + kn) + ops * (lat + op_lat), ops, alone)
    assert fitted == pytest.approx({"compute_slowdown": kc, "comm_slowdown": kn, "busy_latency_s": lat,
                                    "op_latency_s": op_lat}, abs=1e-12)


def test_calibration_keeps_the_shape_and_sets_the_scale():
    pytest.importorskip("torch")
    from gradsched.calibration import calibrate

    prof = Profile("toy", (TensorProfile("a", 100, 400, 0.05, 0.3, update_s=0.01), TensorProfile("b", 10, 40, 0.05, 0.1)),
                   other_s=0.04)  # compute 0.55 s
    got = calibrate(prof, 1.1)
    assert got.compute_s == pytest.approx(1.1)
    assert [t.backward_s for t in got.tensors] == pytest.approx([0.6, 0.2])
    assert got.tensors[0].update_s == pytest.approx(0.02) and got.other_s == pytest.approx(0.08)
    assert got.ready_s == pytest.approx(tuple(2 * r for r in prof.ready_s))
    assert calibrate(prof, 0.0) is prof  # nothing measured: unchanged


def test_contention_figures_are_never_negative():
    from gradsched.calibration import contention_from_probe

    # noise can make the busy runs faster than the quiet ones: that is no contention, not a speed-up
    fitted = contention_from_probe(1.0, 0.5, 0.9, 0.45, 0.01, 0.008, 8, 0.009)
    assert fitted == {"compute_slowdown": 0.0, "comm_slowdown": 0.0, "busy_latency_s": 0.0, "op_latency_s": 0.0}


def test_runtime_costs_add_bucket_passes_and_the_buffer_broadcast():
    pytest.importorskip("torch")
    from gradsched.calibration import with_runtime_costs

    prof = Profile("toy", (TensorProfile("w", 100, 400, 0.05, 0.3, update_s=0.01), TensorProfile("b", 100, 400, 0, 0)),
                   other_s=0.04)  # one layer of 800 bytes
    probe = {"allreduce_bytes": 1000, "bucket_copy_s": 2e-3, "bucket_scale_s": 1e-3, "buffer_sync_s": 5e-3}
    ours, ddp = with_runtime_costs(prof, probe, False), with_runtime_costs(prof, probe, True)
    assert ours.backward_s == pytest.approx(0.3 + 800 * 3e-6) and ddp.backward_s == pytest.approx(ours.backward_s)
    assert ours.update_s == pytest.approx(0.01)  # gradsched's executor: gradients are views of the buckets
    assert ddp.update_s == pytest.approx(0.01 + 800 * 2e-6)  # DDP copies the averaged buckets back
    assert ours.other_s == pytest.approx(0.045) and ddp.other_s == pytest.approx(0.045)
    assert ours.layer_of == prof.layer_of  # the bias still belongs to the weight's layer
    assert with_runtime_costs(prof, None, True) is prof  # no probe (--no-probe): nothing added
    # each runtime's measured overhead per step goes to its own rows only
    probe["runtime_overhead_s"] = {"gradsched": 3e-3, "torch DDP": 1e-3}
    assert with_runtime_costs(prof, probe, False).other_s == pytest.approx(0.045 + 3e-3)
    assert with_runtime_costs(prof, probe, True).other_s == pytest.approx(0.045 + 1e-3)
    # gradsched's host time per operation goes to its rows only (DDP issues its buckets from C++)
    assert ours.op_host_s() == (0.0, 0.0)
    probe["op_host"] = {"issue_s": 8e-5, "retire_s": 5e-5}
    assert with_runtime_costs(prof, probe, False).op_host_s() == (8e-5, 5e-5)
    assert with_runtime_costs(prof, probe, True).op_host_s() == (0.0, 0.0)
    # a replayed model's clock hides the host's work: only the buffer broadcast and the measured overhead stay
    probe["host_work_hidden"] = True
    for torch_ddp, overhead in ((False, 3e-3), (True, 1e-3)):
        hidden = with_runtime_costs(prof, probe, torch_ddp)
        assert (hidden.backward_s, hidden.update_s) == (prof.backward_s, prof.update_s)
        assert hidden.op_host_s() == (0.0, 0.0)
        assert hidden.other_s == pytest.approx(0.045 + overhead)


def test_a_replayed_model_says_its_clock_hides_the_host_work():
    pytest.importorskip("torch")
    from gradsched.torch.jobs.models import build_model

    assert build_model("replay:googlenet-k80").module.hides_host_work is True
    assert getattr(build_model("mlp").module, "hides_host_work", False) is False


def test_probe_repetitions_fit_the_budget():
    pytest.importorskip("torch")
    from gradsched.torch.measure.probe import PROBE_BUDGET_S, PROBE_REPS, probe_reps

    assert probe_reps(0.001, 0.0005) == PROBE_REPS[1]  # ms-scale model: the most
    assert probe_reps(1.0, 0.5) == PROBE_REPS[0]  # a slow model: still the fewest allowed ...
    assert probe_reps(10.0, 5.0) == 1  # ... unless they take minutes (a dilated replay): resampled between rounds
    mid = probe_reps(0.3, 0.05)
    assert PROBE_REPS[0] <= mid <= PROBE_REPS[1] and mid * (3 * 0.3 + 2 * 0.05) <= PROBE_BUDGET_S
    # the two phases (four more all-reduces' time a repetition) count against the budget, not the floor
    assert probe_reps(0.001, 0.0005, phase_ops=4) == PROBE_REPS[1]
    assert probe_reps(0.3, 0.05, phase_ops=4) < mid
    assert probe_reps(1.8, 1.4) == probe_reps(1.8, 1.4, phase_ops=4) == PROBE_REPS[0]  # googlenet-k80, 4 hosts


@pytest.mark.slow
def test_probe_measures_contention_and_runtime_costs(tmp_path):
    """The contention probe runs (loopback, cnn: BatchNorm buffers) and its figures reach the predictions."""
    out = tmp_path / "bench.json"
    # two earlier jobs of the same shape, both far above anything this machine measures, loaded or not:
    # the medians over the three jobs are theirs (whatever this job measures, two of three are theirs)
    earlier = {"compute_slowdown": 50.0, "comm_slowdown": 500.0, "busy_latency_s": 5.0, "op_latency_s": 1.0}
    history = []
    for k in range(2):
        history += ["--contention-from", str(tmp_path / f"earlier{k}.json")]
        (tmp_path / f"earlier{k}.json").write_text(json.dumps([_earlier("cnn", earlier)]))
    code = main(["bench", "--model", "cnn", "--hosts", "2", "--loopback", "--strategies", "sync",
                 "--ddp-buckets", "none", "--steps", "2", "--rounds", "2", "--warmup-rounds", "0",
                 "--profile-iterations", "2", "--net-reps", "1", "-q", "--timeout-s", "120", "--json", str(out),
                 "--probe-s", "4", *history])
    assert code == 0
    rows = json.loads(out.read_text())
    probe = rows[0]["contention"]
    assert set(probe["own_fitted"]) == {"compute_slowdown", "comm_slowdown", "busy_latency_s", "op_latency_s"}
    assert all(0 <= v < earlier[k] for k, v in probe["own_fitted"].items())
    assert probe["fitted"] == earlier and probe["history"] == [earlier, earlier]  # what the predictions use
    from gradsched.torch.measure.probe import PROBE_REPS

    assert PROBE_REPS[0] <= probe["startup_reps"] <= PROBE_REPS[1]  # as many as fit --probe-s, at least 3
    # the figures pool the start-up repetitions and one more per sample between rounds, the table likewise
    assert probe["reps"] == probe["startup_reps"] + probe["resamples"]
    # each sampler on its own budget (under load the table may get fewer samples than the probe): its own count
    assert probe["resamples_each"]["contention"] == probe["resamples"]
    assert rows[0]["cluster"]["samples"] == 1 + probe["resamples_each"]["network"]
    assert set(probe["startup_fitted"]) == set(probe["fitted"])
    assert set(probe["startup_runtime_overhead_s"]) == set(probe["runtime_overhead_s"])
    assert probe["bucket_copy_s"] > 0 and probe["bucket_scale_s"] > 0 and probe["buffer_sync_s"] > 0
    assert rows[0]["cluster"]["contention"] == probe["fitted"]
    assert set(probe["runtime_overhead_s"]) == {"gradsched", "torch DDP"}
    assert all(v >= 0 for v in probe["runtime_overhead_s"].values())
    # host time per operation, from wfbp's 38 operations against sync's one, in the gradsched rows' profile
    assert set(probe["op_host"]) == set(probe["startup_op_host"]) == {"issue_s", "retire_s"}
    assert probe["op_host"]["issue_s"] > 0 and probe["op_host"]["retire_s"] >= 0
    # one all-reduce after backward: its prediction holds the compute, both bucket passes, the broadcast
    # and gradsched's measured overhead
    sync = next(r for r in rows if r["strategy"] == "sync")
    runtime = (probe["bucket_copy_s"] + probe["bucket_scale_s"] + probe["buffer_sync_s"]
               + probe["runtime_overhead_s"]["gradsched"])
    assert sync["predicted_iteration_s"] > (rows[0]["compute_only"]["iteration_s_median"] + runtime
                                           + probe["op_host"]["issue_s"] + probe["op_host"]["retire_s"])


def _earlier(model: str, fitted: dict[str, float], **job) -> dict:
    """The first row of an earlier ``gradsched bench --json``, as much of it as --contention-from reads."""
    from gradsched.calibration import this_machine

    return {"model": model, "hosts": 2, "network": "loopback", "rate": None, "batch_size": 16,
            "machine": f"{this_machine()}, torch 2.13.0+cpu", "contention": {"fitted": fitted}, **job}


FIGURES = {"compute_slowdown": 0.4, "comm_slowdown": 3.0, "busy_latency_s": 0.0, "op_latency_s": 1e-4}


@pytest.mark.parametrize("content,says", [
    ("[{", "not JSON"),
    ("{}", "the JSON that `gradsched bench --json` writes"),
    (json.dumps([{"model": "mlp"}]), "without --no-probe"),
    (json.dumps([_earlier("cnn", FIGURES)]), "model was 'cnn', this one's is 'mlp'"),
    (json.dumps([_earlier("mlp", FIGURES, batch_size=32)]), "batch_size was 32, this one's is 16"),
    (json.dumps([_earlier("mlp", FIGURES, hosts=4)]), "hosts was 4"),
    (json.dumps([_earlier("mlp", FIGURES, machine="big x86_64, 96 CPUs, torch 2.13.0")]), "not on this machine"),
    (json.dumps([_earlier("mlp", {**FIGURES, "compute_slowdown": -1.0})]), "compute_slowdown"),
    (json.dumps([_earlier("mlp", {**FIGURES, "speed": 1.0})]), "unknown field"),
])
def test_earlier_contention_must_be_the_same_jobs_figures(tmp_path, capsys, content, says):
    path = tmp_path / "earlier.json"
    path.write_text(content)
    assert main(["bench", "--model", "mlp", "--loopback", "--contention-from", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and str(path) in err


def test_earlier_contention_needs_a_file_and_this_jobs_probe(tmp_path, capsys):
    assert main(["bench", "--model", "mlp", "--loopback", "--contention-from", str(tmp_path / "none.json")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps([_earlier("mlp", FIGURES)]))
    assert main(["bench", "--model", "mlp", "--loopback", "--no-probe", "--contention-from", str(path)]) == 2
    assert "drop --no-probe" in capsys.readouterr().err


def test_earlier_contention_is_that_jobs_own(tmp_path):
    from gradsched.calibration import contention_history

    job = {"model": "mlp", "hosts": 2, "network": "loopback", "rate": None, "batch_size": 16}
    row = _earlier("mlp", {**FIGURES, "compute_slowdown": 0.9})  # a job that pooled: its own figures count
    row["contention"]["own_fitted"] = FIGURES
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps([row]))
    assert contention_history([str(path), str(path)], job) == [FIGURES, FIGURES]
    assert contention_history([], job) == []


def test_contention_bound_by_hand():
    from gradsched.calibration import contention_bound_s

    # 1 s of compute (0.1 s of it before any gradient), 0.6 s of communication (0.05 s after backward);
    # compute 1.5x slower while communication runs: overlap saves 1/1.5 + 1 - 1 = 2/3 of each second,
    # and at most 0.55 s of communication can overlap
    assert contention_bound_s(1.0, 0.6, 0.1, 0.05, 0.5, 0.0) == pytest.approx(1.6 - 0.55 * 2 / 3)
    assert contention_bound_s(1.0, 0.6, 0.1, 0.05, 0.0, 0.0) == pytest.approx(max(1.0 + 0.05, 0.1 + 0.6))
    assert contention_bound_s(1.0, 0.6, 0.1, 0.05, 1.0, 1.0) == pytest.approx(1.6)  # overlap buys nothing
    assert contention_bound_s(1.0, 0.6, 0.1, 0.05, 3.0, 2.0) == pytest.approx(1.6)  # nor when it costs


def _row(strategy, ms, **extra):
    return {"strategy": strategy, "iteration_s_median": ms / 1e3, "speedup_vs_ddp": 1.0, "speedup_vs_best_ddp": 1.0,
            "vs_lower_bound": 1.2, "predicted_iteration_s": ms / 1e3, "prediction_error": 0.0, "operations": 3,
            **extra}


def test_table_names_the_plan_auto_settled_on_and_the_contention_bound():
    from gradsched.commands.bench import table

    switches = [{"strategy": "wfbp", "reason": "initial"}, {"strategy": "usbyte", "reason": "profiled"},
                {"strategy": "ddp", "reason": "revert"}]
    rows = [_row("ddp", 400.0), _row("auto", 390.0, plan_options={"bucket_cap_mb": 25.0},
                                     autotune={"switches": switches, "replans": 1})]
    bound = {"lower_bound_s": 0.3, "compute_s": 0.28, "allreduce_all_s": 0.29, "contention_bound_s": 0.37}
    text = table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    assert "auto chose ddp {'bucket_cap_mb': 25.0}" in text  # where run-time auto ended, not "None"
    assert "contention 370.0 ms" in text and "auto, is 1.05x it" in text
    rows[1] = _row("auto", 390.0, plan_options={"chose": "mgwfbp", "chosen_options": {"mb": 4}})
    assert "auto chose mgwfbp {'mb': 4}" in table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    bound["contention_bound_s"] = bound["lower_bound_s"]  # no contention: no second bound line
    assert "contention" not in table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})


def test_table_says_when_auto_was_planned_at_start_up():
    from gradsched.commands.bench import table
    from gradsched.jobs.startup import auto_warmup

    planned = auto_warmup(303, 7.9, options=None, replay=True).to_dict()
    rows = [_row("ddp", 400.0), _row("auto", 390.0, plan_options={"chose": "mgwfbp", "chosen_options": {}},
                                     auto_warmup=planned)]
    bound = {"lower_bound_s": 0.3, "compute_s": 0.28, "allreduce_all_s": 0.29}
    text = table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    assert "auto planned at start-up" in text and "303 iterations" in text and "auto.adaptive=true" in text
    rows[1]["auto_warmup"] = auto_warmup(303, 0.4, options=None, replay=True).to_dict()  # dilation 1: in situ
    assert "planned at start-up" not in table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    from gradsched.jobs.startup import shorter

    short = shorter(auto_warmup(281, 1.7, options=None, replay=True), auto_warmup(144, 1.7, options=None, replay=True))
    rows[1]["auto_warmup"] = short.to_dict()  # 8 emulated hosts: the short warm-up, said
    text = table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    assert "a short warm-up (144 iterations" in text and "planned at start-up" not in text


def test_table_reports_the_runtime_costs_the_probe_measured():
    from gradsched.commands.bench import table

    probe = {"compute_alone_s": 0.05, "compute_overlapped_s": 0.07, "compute_slowdown": 1.4,
             "allreduce_alone_s": 0.002, "allreduce_overlapped_s": 0.01, "allreduce_slowdown": 5.0,
             "allreduce_model_s": 0.0016, "fitted": {"comm_slowdown": 5.25, "busy_latency_s": 0.0,
                                                     "op_latency_s": 1.5e-4},
             "bucket_copy_s": 1e-4, "bucket_scale_s": 1e-4,
             "buffer_sync_s": 1.2e-3, "runtime_overhead_s": {"gradsched": 4.8e-3, "torch DDP": 3.5e-3}}
    bound = {"lower_bound_s": 0.05, "compute_s": 0.05, "allreduce_all_s": 0.002, "contention_bound_s": 0.05}
    text = table({"rows": [_row("ddp", 55.0)], "lower_bound": bound, "best_ddp": "ddp", "contention": probe})
    assert "buffer broadcast 1.2 ms" in text
    assert "gradsched 4.8 ms, torch DDP 3.5 ms" in text
    assert "2.0 ms alone (1.6 ms in the cost model), 10.0 ms while steps run (x6.25 the cost model)" in text
    assert "0.15 ms more per operation in any case" in text
    assert "host time per operation" not in text  # not measured: no line
    probe["op_host"] = {"issue_s": 8.5e-5, "retire_s": 4.2e-5}
    text = table({"rows": [_row("ddp", 55.0)], "lower_bound": bound, "best_ddp": "ddp", "contention": probe})
    assert "host time per operation: 0.085 ms to issue, 0.042 ms to retire" in text
    assert "samples between rounds" not in text  # start-up figures only
    assert "--contention-from" not in text  # this job's figures only
    probe.update(resamples=7, resample_s=3.25)
    text = table({"rows": [_row("ddp", 55.0)], "lower_bound": bound, "best_ddp": "ddp", "contention": probe})
    assert "start-up measurement and 7 samples between rounds (3.2 s)" in text
    pooled = {"compute_slowdown": 0.5, "comm_slowdown": 4.0, "busy_latency_s": 2e-4, "op_latency_s": 1e-4}
    probe.update(own_fitted=probe["fitted"], fitted=pooled, history=[pooled, pooled])
    text = table({"rows": [_row("ddp", 55.0)], "lower_bound": bound, "best_ddp": "ddp", "contention": probe})
    assert "(x6.25 the cost model)" in text  # the measurement line stays this job's own
    assert ("median over this job and 2 earlier (--contention-from): compute 0.50, communication 4.00, "
            "0.20 and 0.10 ms per operation") in text
    del probe["runtime_overhead_s"]  # a result written before the overhead probe existed still prints
    assert "runtime overhead" not in table({"rows": [_row("ddp", 55.0)], "lower_bound": bound, "best_ddp": "ddp",
                                            "contention": probe})


@pytest.mark.slow
def test_fsdp2_row_runs_beside_a_plan_in_the_same_rounds(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    code = main(["bench", "--model", "mlp", "--hosts", "2", "--loopback", "--strategies", "dear,fsdp2",
                 "--ddp-buckets", "none", "--steps", "2", "--rounds", "2", "--profile-iterations", "3",
                 "--net-reps", "1", "--no-probe", "-q", "--timeout-s", "120", "--json", str(out)])
    assert code == 0
    by = {r["strategy"]: r for r in json.loads(out.read_text())}
    assert by["fsdp2"]["runs"] == "torch FSDP2" and by["dear"]["runs"] == "gradsched"
    for r in by.values():
        assert r["iteration_s_median"] > 0 and r["predicted_iteration_s"] > 0 and len(r["step_s"]) == 2
    assert by["fsdp2"]["plan_options"] == {"grouping": "per block"}


def test_auto_adaptive_reaches_the_auto_row_and_nothing_else():
    from gradsched.commands.bench import entries
    from gradsched.errors import GradschedError

    rows = entries("ddp,wfbp,auto", "none", None, ["auto.adaptive=true", "wfbp.layerwise=true"])
    by = {e.label: e for e in rows}
    assert by["auto"].options["adaptive"] is True and by["wfbp"].options == {"layerwise": True}
    with pytest.raises(GradschedError, match="true or false"):
        entries("ddp,auto", "none", None, ["auto.adaptive=maybe"])


def test_run_time_autos_settings_reach_the_auto_row_typed_and_checked():
    """``--opt auto.trials=2`` and the like: run-time auto's own settings (gradsched.tuning.config.OPTIONS), not
    planner options; a bad value is one line naming it."""
    from gradsched.commands.bench import entries
    from gradsched.errors import GradschedError

    rows = entries("ddp,auto", "none", None, ["auto.trials=2", "auto.trial_window_s=0", "auto.channels=2"])
    options = next(e for e in rows if e.label == "auto").options
    assert {k: options[k] for k in ("trials", "trial_window_s", "channels")} == {"trials": 2, "trial_window_s": 0.0,
                                                                                "channels": 2}
    with pytest.raises(GradschedError, match="--opt auto.trial_iterations"):
        entries("ddp,auto", "none", None, ["auto.trial_iterations=0"])


def test_the_auto_line_tells_two_trials_of_one_strategy_apart_by_their_options():
    from gradsched.commands.bench import table

    decision = {"measured": {"a": 0.2112, "b": 0.1913, "c": 0.2177}, "kept": "b", "baseline": "c",
                "plans": {"a": "usbyte", "b": "usbyte", "c": "torch-ddp 3.125 MB"},
                "options": {"a": {"unit_bytes": 262144, "merge_bytes": 262144},
                            "b": {"groups": 0, "unit_bytes": 524288, "merge_bytes": 0},
                            "c": {"bucket_cap_mb": 3.125}}}
    switches = [{"strategy": "ddp", "reason": "initial"}, {"strategy": "usbyte", "reason": "fastest"}]
    rows = [_row("ddp", 400.0), _row("auto", 191.3, plan_options={"groups": 0},
                                     autotune={"switches": switches, "replans": 0, "trial_decision": decision})]
    text = table({"rows": rows, "lower_bound": {"lower_bound_s": 0.15, "compute_s": 0.1, "allreduce_all_s": 0.15},
                  "best_ddp": "ddp"})
    line = next(x for x in text.splitlines() if x.startswith("  trials"))
    assert line == ("  trials (median ms): usbyte (groups=0, merge_bytes=0, unit_bytes=524288) 191.3 kept; "
                    "usbyte (merge_bytes=262144, unit_bytes=262144) 211.2; torch-ddp 3.125 MB 217.7")
    del decision["options"]  # a record from before the options: the labels, told apart by their hashes
    assert "usbyte [plan b] 191.3 kept; usbyte [plan a] 211.2" in table({"rows": rows, "lower_bound": {
        "lower_bound_s": 0.15, "compute_s": 0.1, "allreduce_all_s": 0.15}, "best_ddp": "ddp"})


def test_the_auto_line_tells_two_trials_of_one_strategy_and_options_apart_by_their_origin():
    """The README job's two ``usbyte`` ``groups=0`` plans with the same options (the measured profile's and the
    bench's): what each was planned on and its operations, or its hash in a record from before those."""
    from gradsched.commands.bench import _trial_lines

    opts = {"groups": 0, "unit_bytes": 4194304, "merge_bytes": 0}
    decision = {"measured": {"f836caf90e027d7a": 0.4640, "2f6ecab9f12bdc84": 0.4645, "70a820fc603fdcef": 0.6624},
                "kept": "f836caf90e027d7a", "baseline": "70a820fc603fdcef",
                "plans": {"f836caf90e027d7a": "usbyte", "2f6ecab9f12bdc84": "usbyte",
                          "70a820fc603fdcef": "torch-ddp default"},
                "options": {"f836caf90e027d7a": opts, "2f6ecab9f12bdc84": opts,
                            "70a820fc603fdcef": {"bucket_cap_mb": 25.0, "default": True}},
                "planned_on": {"f836caf90e027d7a": "given", "2f6ecab9f12bdc84": "measured",
                               "70a820fc603fdcef": "start-up"},
                "operations": {"f836caf90e027d7a": 13, "2f6ecab9f12bdc84": 11, "70a820fc603fdcef": 4}}
    usbyte = "usbyte (groups=0, merge_bytes=0, unit_bytes=4194304)"
    assert _trial_lines(decision) == [  # torch-ddp's label alone: no other plan shares it
        f"  trials (median ms): {usbyte} [planned on the given profile, 13 operations] 464.0 kept; "
        f"{usbyte} [planned on the measured profile, 11 operations] 464.5; torch-ddp default 662.4"]
    del decision["planned_on"], decision["operations"]
    assert _trial_lines(decision) == [
        f"  trials (median ms): {usbyte} [plan f836caf9] 464.0 kept; {usbyte} [plan 2f6ecab9] 464.5; "
        "torch-ddp default 662.4"]


def test_auto_line_flags_plan_switches_inside_the_rounds_not_in_the_warm_up():
    from gradsched.commands.bench import table

    warmup = {"mode": "run-time (warm-up off the clock)", "estimated_s": 100.0, "iterations": 108, "budget_s": 300.0}
    switches = [{"strategy": "ddp", "reason": "initial", "iteration": 0},
                {"strategy": "usbyte", "reason": "fastest", "iteration": 50}]
    rows = [_row("ddp", 400.0), _row("auto", 390.0, plan_options={"groups": 0}, auto_warmup=warmup,
                                     autotune={"switches": switches, "replans": 0})]
    bound = {"lower_bound_s": 0.3, "compute_s": 0.28, "allreduce_all_s": 0.29}
    assert "switched plans during the rounds" not in table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    switches += [{"strategy": "usbyte", "reason": "replan", "iteration": 128},
                 {"strategy": "usbyte", "reason": "revert", "iteration": 134}]
    text = table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    assert "! auto switched plans during the rounds (replan at iteration 128, revert at iteration 134" in text
    rows[1]["auto_warmup"] = {**warmup, "mode": "planned at start-up"}  # no in-situ warm-up: nothing to tell apart
    assert "switched plans during the rounds" not in table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})


def test_auto_line_counts_the_rounds_from_where_the_checks_were_held():
    """A decision under way at the warm-up's end ends off the clock, past the warm-up's estimated iterations: the
    switches before ``held_from`` (where the rounds began) are the warm-up's, those from it on the rounds'."""
    from gradsched.commands.bench import table

    warmup = {"mode": "run-time (warm-up off the clock)", "estimated_s": 100.0, "iterations": 108, "budget_s": 300.0}
    switches = [{"strategy": "ddp", "reason": "initial", "iteration": 0},
                {"strategy": "usbyte", "reason": "fastest", "iteration": 50},
                {"strategy": "wfbp", "reason": "control", "iteration": 110},
                {"strategy": "usbyte", "reason": "back", "iteration": 121}]
    tune = {"switches": switches, "replans": 0, "held_from": 122}
    rows = [_row("ddp", 400.0), _row("auto", 390.0, plan_options={"groups": 0}, auto_warmup=warmup, autotune=tune)]
    bound = {"lower_bound_s": 0.3, "compute_s": 0.28, "allreduce_all_s": 0.29}
    assert "switched plans during the rounds" not in table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    switches.append({"strategy": "usbyte", "reason": "replan", "iteration": 122})
    text = table({"rows": rows, "lower_bound": bound, "best_ddp": "ddp"})
    assert "! auto switched plans during the rounds (replan at iteration 122, its checks held from iteration 122)" \
        in text
