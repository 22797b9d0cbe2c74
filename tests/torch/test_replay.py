"""The replay model: a profile's sizes, order and times, emulated compute, real gradients."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gradsched.commands.bench import shaped_rate, undilate  # noqa: E402
from gradsched.errors import GradschedError  # noqa: E402
from gradsched.profile import Profile  # noqa: E402
from gradsched.torch.jobs.models import build_model  # noqa: E402
from gradsched.torch.jobs import replay  # noqa: E402
from gradsched.torch.jobs.replay import ReplayModel, _Clock  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, run, spawn_local  # noqa: E402
from helpers import VirtualTime  # noqa: E402

LAYER_S = 0.02  # each layer's backward; forward half of it


def _profile(scale: float = 1.0, mixed: bool = True) -> Profile:
    """Five layers; layer 2 has a float16 weight and a float64 bias (float32 both unless ``mixed``); ready
    order is not the reverse of forward."""
    tensors = [
        {"name": "a.w", "numel": 3000, "bytes": 12000, "forward_s": LAYER_S / 2, "backward_s": LAYER_S},
        {"name": "b.w", "numel": 200_000, "bytes": 800_000, "forward_s": LAYER_S / 2, "backward_s": LAYER_S},
        {"name": "c.w", "numel": 5000, "bytes": 10000, "forward_s": LAYER_S / 2, "backward_s": 2 * LAYER_S},
        {"name": "c.b", "numel": 50, "bytes": 400, "forward_s": 0.0, "backward_s": 0.0},
        {"name": "d.w", "numel": 70_000, "bytes": 280_000, "forward_s": LAYER_S / 2, "backward_s": LAYER_S},
        {"name": "e.w", "numel": 10, "bytes": 40, "forward_s": LAYER_S / 2, "backward_s": LAYER_S},
    ]
    if not mixed:
        tensors[2]["bytes"], tensors[3]["bytes"] = 20000, 200
    data = {"format": "gradsched.profile/1", "model": "toy", "tensors": tensors,
            "ready_order": [5, 2, 3, 4, 1, 0], "other_s": LAYER_S}
    return Profile.from_dict(data).with_times(scale)


def _step(model: ReplayModel, batch: int = 4, clock: Any = time) -> tuple[float, float, float, list[tuple[int, float]]]:
    """One forward and backward: (forward's wall s, wall s, CPU s, [(tensor, ready s after forward starts)]) on
    ``clock`` (the time module, or a VirtualTime)."""
    stamps: list[tuple[int, float]] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: stamps.append((i, clock.perf_counter())))
               for i, p in enumerate(model.parameters())]
    x, y = torch.randn(batch, 8), torch.randn(batch, 8)
    model.zero_grad(set_to_none=True)
    w0, c0 = clock.perf_counter(), clock.process_time()
    loss = torch.nn.functional.mse_loss(model(x), y)
    b0 = clock.perf_counter()
    loss.backward()
    wall, cpu = clock.perf_counter() - w0, clock.process_time() - c0
    for h in handles:
        h.remove()
    return b0 - w0, wall, cpu, [(i, t - w0) for i, t in stamps]


def test_parameters_have_the_profiles_sizes_dtypes_and_order():
    prof = _profile()
    model = ReplayModel(prof)
    params = list(model.parameters())
    assert [p.numel() for p in params] == [t.numel for t in prof.tensors]
    assert [p.numel() * p.element_size() for p in params] == [t.bytes for t in prof.tensors]
    assert [p.dtype for p in params] == [torch.float32] * 2 + [torch.float16, torch.float64] + [torch.float32] * 2
    assert len(model.layers) == 5  # c.w and c.b share a layer


def test_gradients_ready_in_order_never_early_and_without_computing(monkeypatch):
    prof = _profile()
    model = ReplayModel(prof)
    _step(model)  # warm-up
    _, wall, cpu, _ = _step(model)
    expected = prof.forward_s + prof.backward_s + prof.other_s
    # real time: never earlier than the clock allows (at most carry_s of the host's time before the forward is
    # hidden); no upper bound, as a loaded machine only makes a step later: the exact times are asserted on the
    # virtual clock below.  And this process waiting, not computing (its CPU time)
    assert wall >= prof.forward_s + prof.backward_s - model.clock.carry_s - replay.HOST_SLACK_S
    assert cpu < 0.25 * expected  # real compute would take about `expected` of CPU
    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype
    t = VirtualTime().install(monkeypatch, replay)  # the times on a virtual clock: exact, whatever the load
    model = ReplayModel(prof)
    _step(model, clock=t)  # warm-up
    model.clock.carry_s = 0.0  # the host's work before this forward is not hidden: times count from its call
    t.work(0.05)
    fwd, _, _, stamps = _step(model, clock=t)
    assert [i for i, _ in stamps] == list(prof.order)
    before = prof.other_s + prof.forward_s - replay.HOST_SLACK_S  # the slack forgiven at the forward's call
    for i, s in stamps:  # the emulated device never runs ahead of the profile
        assert s == pytest.approx(before + prof.ready_s[i]), (i, s, prof.ready_s[i])
    assert fwd == pytest.approx(before)


def _work(seconds: float) -> None:
    """Host work: this thread's CPU busy for ``seconds``."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_the_clock_hides_host_work_and_counts_blocked_time(monkeypatch):
    """On a virtual clock (tests/torch/helpers.py): what counts is decided by what the host did, not by how
    loaded the machine running the test is."""
    t = VirtualTime().install(monkeypatch, replay)
    clock = _Clock(slack_s=0.002, carry_s=0.01)
    first = clock.start()
    assert first == t.perf_counter()  # the first piece starts now
    clock.wait_until(first, 0.01)
    assert t.perf_counter() == first + 0.01  # waited out on the clock
    t.work(0.05)  # the host's own work between two layers (hooks, copies, the optimizer): beside the device
    assert clock.start() == first + 0.01  # its work does not delay the next piece
    t.work(0.05)
    t.preempt(0.03)  # nor does the time it waited for one of this machine's shared cores (a GPU's host has its own)
    assert clock.start() == first + 0.01
    t.block(0.03)  # ... but blocked (waiting for communication) it counts
    second = clock.start()
    assert second == pytest.approx(first + 0.01 + 0.03 - 0.002)  # beyond the slack
    clock.wait_until(second, 0.01)
    t.sleep(0.001)  # a late wake-up within the slack does not count
    assert clock.start() == second + 0.01
    t.block(0.08)  # blocked (waiting for communication): all of it beyond the slack counts
    third = clock.start()
    assert third == pytest.approx(second + 0.01 + 0.001 + 0.08 - 0.002)
    assert third <= t.perf_counter()  # the device never runs ahead of the host
    clock.wait_until(third, 0.01)
    clock.new_iteration()  # another model's work, or the optimizer's: at most carry_s of it is hidden
    t.work(0.05)
    fourth = clock.start()
    assert fourth == pytest.approx(third + 0.01 + 0.05 - 0.01 - 0.002)
    clock.wait_until(fourth, 0.01)
    t.work(0.05)  # the carry applies to one start only
    assert clock.start() == fourth + 0.01


def test_run_queue_s_reads_each_threads_wait_for_a_core(monkeypatch):
    """Linux's schedstat for the calling thread (0.0 where there is none); a stale descriptor is opened again;
    threads that come and go leave a bounded number of descriptors open."""
    first = replay.run_queue_s()
    assert 0.0 <= first <= replay.run_queue_s()
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        assert first == 0.0
        return
    seen: list[float] = []
    other = threading.Thread(target=lambda: seen.append(replay.run_queue_s()))
    other.start()
    other.join()
    assert len(seen) == 1 and seen[0] >= 0.0
    key = (os.getpid(), threading.get_native_id())
    os.close(replay._SCHEDSTAT[key])  # a thread id reused after its thread ended: its descriptor reads nothing
    replay._SCHEDSTAT[key] = os.open(os.devnull, os.O_RDONLY)
    assert replay.run_queue_s() >= first
    monkeypatch.setattr(replay, "_MAX_SCHEDSTAT", 2)
    for _ in range(4):
        other = threading.Thread(target=replay.run_queue_s)
        other.start()
        other.join()
    assert 1 <= len(replay._SCHEDSTAT) <= 2


def test_the_optimizer_step_on_the_cpu_does_not_lengthen_a_replayed_step(monkeypatch):
    """On a GPU the optimizer step runs on the device, in the profile's (here zero) update time.  On a virtual
    clock: the steps' own CPU (autograd, the real optimizer) takes no virtual time, so the walls are exact."""
    t = VirtualTime().install(monkeypatch, replay)
    prof = _profile()
    model = ReplayModel(prof)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    expected = prof.forward_s + prof.backward_s + prof.other_s  # 0.17 s
    walls = []
    for _ in range(4):
        w0 = t.perf_counter()
        _step(model)
        opt.step()
        t.work(0.02)  # a slow optimizer: 20 ms of CPU after every step
        walls.append(t.perf_counter() - w0)
    assert walls[0] == pytest.approx(expected + 0.02)  # the first step's own 20 ms: nothing follows it yet
    # its 20 ms hide behind the next step's emulated compute: every later step is the profile's time
    assert walls[1:] == pytest.approx([expected] * 3)
    model.clock.carry_s = 0.01  # at most carry_s of host work hidden at an iteration's start: 10 ms count
    w0 = t.perf_counter()
    _step(model)
    t.work(0.02)
    assert t.perf_counter() - w0 == pytest.approx(expected + 0.02 - 0.01 - replay.HOST_SLACK_S)


def test_dilation_stretches_compute(monkeypatch):
    t = VirtualTime().install(monkeypatch, replay)  # on a virtual clock: the emulated times exactly, whatever the load
    prof = _profile()
    fast, slow = ReplayModel(prof), ReplayModel(prof.with_times(3.0))
    fast.clock.carry_s = slow.clock.carry_s = 0.0  # the other model's work between their steps is not hidden
    _step(fast, clock=t), _step(slow, clock=t)
    _, wall_fast, _, _ = _step(fast, clock=t)
    _, wall_slow, _, stamps = _step(slow, clock=t)
    emulated = prof.other_s + prof.forward_s + prof.backward_s  # each from its call (less the slack)
    assert wall_fast == pytest.approx(emulated - replay.HOST_SLACK_S)
    assert wall_slow == pytest.approx(3.0 * emulated - replay.HOST_SLACK_S)
    assert max(s for _, s in stamps) == pytest.approx(wall_slow)  # the last gradient ends the step


def test_fast_forward_skips_the_replayed_compute_and_only_within(monkeypatch):
    t = VirtualTime().install(monkeypatch, replay)
    prof = _profile().with_times(20.0)  # a dilated replay: its steps take seconds
    model = ReplayModel(prof)
    model.clock.carry_s = 0.0
    wrapped = torch.nn.Sequential(model)  # found inside a wrapper, as a bench row's module
    with replay.fast_forward(wrapped):
        _, wall_fast, _, stamps = _step(model, clock=t)
    _, wall, _, _ = _step(model, clock=t)
    emulated = prof.other_s + prof.forward_s + prof.backward_s
    assert wall_fast < 0.01 * emulated and len(stamps) == prof.num_tensors  # every gradient, no waiting
    assert wall == pytest.approx(emulated, abs=2 * replay.HOST_SLACK_S)  # after it, the full time again
    with replay.fast_forward(torch.nn.Linear(2, 2)):  # nothing replayed: nothing to skip
        pass


def test_a_restarted_clock_does_not_hide_what_ran_meanwhile(monkeypatch):
    t = VirtualTime().install(monkeypatch, replay)
    prof = _profile().with_times(20.0)
    emulated = prof.other_s + prof.forward_s + prof.backward_s
    model = ReplayModel(prof)
    _step(model, clock=t)
    t.work(emulated)  # another model's steps in this thread (the bench's rounds), all CPU
    _, hidden, _, _ = _step(model, clock=t)
    assert hidden < 0.75 * emulated  # that work hidden from its first step (up to carry_s)
    t.work(emulated)
    replay.restart_clocks(torch.nn.Sequential(model))
    _, wall, _, _ = _step(model, clock=t)
    assert wall == pytest.approx(emulated, abs=2 * replay.HOST_SLACK_S)


def test_dilation_shapes_links_slower_and_rescales_reports():
    assert shaped_rate("1gbit", 2, 2.0, replay=True) == 500_000_000
    assert shaped_rate("1gbit", 4, 2.0, replay=True) == 500_000_000  # 2 Gbit/s in all: faithful here
    assert shaped_rate(None, 2, 1.0, replay=True) is None
    result = {"rows": [{"iteration_s_median": 0.8, "step_s": [[0.8, 1.0]], "speedup_vs_ddp": 1.2,
                        "autotune": {"predicted_iteration_s": 0.6}}],
              "lower_bound": {"lower_bound_s": 0.4}, "job_s": 100.0, "cluster": {"alpha_s": 1e-3}}
    out = undilate(result, 2.0)
    row = out["rows"][0]
    assert row["iteration_s_median"] == 0.4 and row["step_s"] == [[0.4, 0.5]] and row["speedup_vs_ddp"] == 1.2
    assert row["autotune"]["predicted_iteration_s"] == 0.3 and out["lower_bound"]["lower_bound_s"] == 0.2
    assert out["job_s"] == 100.0 and out["cluster"] == {"alpha_s": 1e-3} and out["dilate"] == 2.0


@pytest.mark.parametrize("rate,hosts,dilate,words", [
    ("10gbit", 4, 1.0, "--dilate 20 or more"), ("1gbit", 4, 1.0, "--dilate 2 or more"), ("1gbit", 2, 0.5, "at least 1"),
    ("1gbit", 2, float("nan"), "at least 1"),
])
def test_impossible_dilation_or_rate_is_refused(rate, hosts, dilate, words):
    with pytest.raises(GradschedError, match=words):
        shaped_rate(rate, hosts, dilate, replay=True)
    with pytest.raises(GradschedError, match="--replay"):
        shaped_rate("1gbit", 2, 2.0, replay=False)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradsched.cli", "bench", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("content,words", [
    ('{"format": "gradsched.profile/1", "model": "x"}', "tensors"),
    ('{"format": "gradsched.profile/1", "model": "x", "tensors": [{"name": "a", "numel": 3, "bytes": 3, '
     '"forward_s": 0.1, "backward_s": 0.1}]}', "1-byte elements"),
    ("not json", "JSON"),
])
def test_bad_profiles_exit_2_with_one_line(tmp_path, content, words):
    path = tmp_path / "bad.profile.json"
    path.write_text(content)
    r = _cli("--replay", str(path), "--loopback")
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_unknown_profile_and_dilation_on_loopback_exit_2():
    for args, words in ((["--replay", "no-such-profile", "--loopback"], "bundled"),
                        (["--replay", "googlenet-k80", "--loopback", "--dilate", "2"], "--rate")):
        r = _cli(*args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bundled_googlenet_k80_is_replayable():
    spec = build_model("replay:googlenet-k80")
    assert sum(p.numel() for p in spec.module.parameters()) == spec.module.profile.total_numel


# --------------------------------------------------------------------------- 2 ranks (slow)
@pytest.fixture()
def toy_path(tmp_path):
    path = tmp_path / "toy.profile.json"
    _profile(0.1).save(path)
    return str(path)


@pytest.mark.slow
def test_ddp_and_gradsched_strategies_train_alike_on_replay(toy_path):
    strategies = ["wfbp", "sync", "mgwfbp", "bytescheduler", "usbyte", "ddp"]
    results = run(2, strategies=strategies, optimizers=("sgd",), steps=6, model=f"replay:{toy_path}")
    assert set(results) == {f"{s}/sgd" for s in strategies}
    for label, r in results.items():
        assert r["rel_diff_vs_ddp"] <= 1e-5 and r["identical_across_ranks"], (label, r)


def _train_topk(rank: int, world: int, path: str) -> list:
    from gradsched.torch import DistributedDataParallel, DistributedOptimizer

    spec = build_model(f"replay:{path}", seed=0)
    start = [p.detach().clone() for p in spec.module.parameters()]
    model = DistributedDataParallel(spec.module, "topk", plan_options={"density": 0.1})
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), model)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x, y = spec.make_batch(4, gen)
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        opt.step()
    model.synchronize()
    return [start, [p.detach().clone() for p in spec.module.parameters()]]


@pytest.mark.slow
def test_sparse_topk_trains_on_replay(tmp_path):
    # one dtype: gradsched's sparse operations do not mix element types within a layer
    path = tmp_path / "toy32.profile.json"
    _profile(0.1, mixed=False).save(path)
    (start0, end0), (_, end1) = spawn_local(_train_topk, 2, str(path))
    assert rel_diff(end0, end1) == 0.0  # every rank applies the same sparse average
    assert rel_diff(end0, start0) > 1e-4  # and it moved the parameters


@pytest.mark.parametrize("shape", ["cnn", "llama"])
def test_meta_profiles_of_real_architectures_are_replayable(shape):
    """``gradsched profile --device meta --device-tflops`` profiles replay with their sizes and FLOP times."""
    from gradsched.torch.measure.flops import TransformerConfig, build_transformer
    from gradsched.torch.measure.profiler import profile_module

    if shape == "cnn":
        with torch.device("meta"):
            spec = build_model("cnn")
    else:  # LLaMA's shapes (SwiGLU, untied head, no biases), scaled down to fit
        spec = build_transformer(TransformerConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=256, seq_len=16,
                                                   ffn_hidden=172, gated_mlp=True, tie_embeddings=False,
                                                   learned_positions=False, bias=False), device="meta")
    batch = spec.make_batch(2, torch.Generator().manual_seed(0))
    prof = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=1, warmup=0, device="meta",
                          device_tflops=1.0)
    model = ReplayModel(prof)
    assert [p.numel() for p in model.parameters()] == [t.numel for t in prof.tensors]
    _step(model)
    _, wall, _, stamps = _step(model)
    assert [i for i, _ in stamps] == list(prof.order)
    assert wall >= prof.other_s + prof.forward_s + prof.backward_s - 1e-3


@pytest.mark.slow
def test_bench_replay_end_to_end_reports_emulated_times(tmp_path, capsys):
    """`gradsched bench --replay`: rows in emulated seconds (dilated on the testbed as root, else loopback)."""
    import json
    import os

    from gradsched.cli import main

    path = tmp_path / "toy.profile.json"
    prof = _profile(0.5)
    prof.save(path)
    dilate = 2.0 if os.geteuid() == 0 else 1.0
    net = ["--rate", "200mbit", "--dilate", "2", "--prefix", "gsr"] if dilate != 1 else ["--loopback"]
    out = tmp_path / "bench.json"
    code = main(["bench", "--replay", str(path), "--hosts", "2", *net, "--strategies", "ddp,wfbp,usbyte",
                 "--ddp-buckets", "none", "--steps", "2", "--rounds", "3", "--profile-iterations", "3",
                 "--net-reps", "1", "--no-probe", "-q", "--timeout-s", "300", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())
    assert [r["strategy"] for r in rows] == ["ddp", "wfbp", "usbyte"]
    assert rows[0]["model"] == f"replay:{path}" and rows[0]["compute"].startswith("emulated")
    assert rows[0]["dilate"] == dilate
    # compute-only steps in emulated seconds: the profile's compute, not `dilate` times it
    emulated = prof.compute_s
    assert emulated * 0.95 <= rows[0]["compute_only"]["iteration_s_median"] <= emulated * 1.6
    for r in rows:
        assert r["iteration_s_median"] >= emulated * 0.95
        # the counted rounds' steps; the warm-up round's skip their compute (bench_worker._warm_up_round)
        assert all(s >= emulated * 0.9 for steps in r["step_s"][r["warmup_rounds"]:] for s in steps)
    assert "replayed" in capsys.readouterr().out
