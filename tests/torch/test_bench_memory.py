"""A bench's memory per rank does not grow with its rows (gradsched.torch.jobs.shared_model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from gradsched.profile import Profile  # noqa: E402
from gradsched.torch.jobs.shared_model import RowBuffers, SharedModel  # noqa: E402

TENSOR_NUMEL = 5_000_000  # 20 MB of float32 per tensor: rows that copied the model would show
TENSORS = 4


def _big_profile(path) -> int:
    """A replay profile of 80 MB of parameters and little compute; returns its bytes."""
    tensors = [{"name": f"l{i}.w", "numel": TENSOR_NUMEL, "bytes": 4 * TENSOR_NUMEL, "forward_s": 0.002,
                "backward_s": 0.004} for i in range(TENSORS)]
    data = {"format": "gradsched.profile/1", "model": "big", "tensors": tensors,
            "ready_order": list(range(TENSORS))[::-1], "other_s": 0.001}
    Profile.from_dict(data).save(path)
    return 4 * TENSOR_NUMEL * TENSORS


def test_copies_share_parameters_and_momentum_but_not_gradients(tmp_path):
    path = tmp_path / "big.profile.json"
    _big_profile(path)
    shared = SharedModel(f"replay:{path}", seed=0)
    a, b = shared.copy(), shared.copy()
    for p, q, r in zip(shared.spec.module.parameters(), a.parameters(), b.parameters()):
        assert p.data_ptr() == q.data_ptr() == r.data_ptr() and q is not r  # one storage, distinct tensors
    opt = shared.sgd(a, lr=0.1)
    x, y = shared.spec.make_batch(4, torch.Generator().manual_seed(0))
    shared.spec.loss_fn(a(x), y).backward()
    assert all(p.grad is not None for p in a.parameters()) and all(p.grad is None for p in b.parameters())
    opt.step()
    bufs = [opt.state[p]["momentum_buffer"] for p in a.parameters()]
    assert [t.data_ptr() for t in bufs] == [t.data_ptr() for t in shared.momentum]
    buffers = RowBuffers(a, opt)
    assert buffers.release() == 4 * TENSOR_NUMEL * TENSORS  # the gradients' storages, then gone
    assert all(p.grad is None for p in a.parameters())


def _bench(path, out, strategies: str, buckets: str) -> dict:
    cmd = [sys.executable, "-m", "gradsched.cli", "bench", "--replay", str(path), "--loopback", "--hosts", "2",
           "--strategies", strategies, "--ddp-buckets", buckets, "--no-probe", "--rounds", "2", "--warmup-rounds",
           "1", "--steps", "1", "--profile-iterations", "1", "--net-reps", "1", "-q", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_memory_per_rank_does_not_grow_with_rows(tmp_path):
    """2 rows and 6 rows of an 80 MB model: the same peak RSS per rank (each row used to hold
    about 4x the parameters: 6 rows took 1.3 GB more than 2)."""
    path = tmp_path / "big.profile.json"
    model_bytes = _big_profile(path)
    two = _bench(path, tmp_path / "two.json", "ddp,sync", "none")
    six = _bench(path, tmp_path / "six.json", "ddp,sync,wfbp,mgwfbp", "1,100")
    assert len(two) == 2 and len(six) == 6
    peak_two, peak_six = two[0]["peak_rss_bytes"], six[0]["peak_rss_bytes"]
    assert peak_six - peak_two < model_bytes, (peak_two, peak_six)  # was 18x that: 1.39 GB, then 2.82 GB
    # near the issue's target (3x + 0.5 GB: 0.66 GB measured here, 0.75 GB on a fresh clone's
    # first run); the target itself is the benchmarks' to report (benchmarks/emulate_papers.py)
    assert peak_six <= 3 * model_bytes + 1e9
    assert [p["phase"] for p in six[0]["phases"]][-1] == "rounds" and six[0]["phases"][-1]["peak_rss_bytes"] == peak_six


def test_phases_record_autos_warm_up_apart_from_the_rows(tmp_path):
    import time

    import torch.distributed as dist

    from gradsched.torch.jobs.phases import Phases

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        phases = Phases()
        time.sleep(0.05)
        phases.end_apart("rows (built, primed)", "auto warm-up", 0.04)
        time.sleep(0.02)
        phases.end("rounds")
    finally:
        dist.destroy_process_group()
    rows, warmup, rounds = phases.records
    assert rows["phase"] == "rows (built, primed)" and warmup == {**warmup, "phase": "auto warm-up", "s": 0.04}
    assert 0.01 <= rows["s"] < 0.05 and rounds["s"] >= 0.02  # the rows less the warm-up; the next phase from now
    # the mapped files' share of the peak (torch's libraries at least), recorded beside it and never above it
    assert all(0 < r["rss_file_bytes"] <= r["peak_rss_bytes"] for r in phases.records)


# run-time auto warming up in situ, briefly: 2 iterations profiled, then every candidate (PyTorch's DDP at the user's
# size, at the advised one and as one bucket among them) in 2 windows of 1 measured iteration
IN_SITU = {"switch_iteration": 2, "trials": 2, "trial_iterations": 2, "trial_rounds": 2, "trial_window_s": 0,
           "runoff_rounds": 0, "max_replans": 0}


def test_autos_warm_up_in_situ_holds_one_ddps_buckets_at_a_time(tmp_path, world_of_one):
    """The bench's ``auto`` row warming up in situ (gradsched.torch.jobs.bench_worker: _build_entry, auto_warm_up):
    the PyTorch DDPs it keeps for the trials' later windows hold no buckets while another plan runs
    (gradsched.torch.runtime.torch_ddp: TorchDDPPool.park).  Each kept its buckets: googlenet-k80's default bench
    peaked at 0.97 GB a rank against its 0.66 GB line (3 DDPs' 54 MB beside the running plan's)."""
    from gradsched.bundled import bundled_cluster
    from gradsched.jobs.config import BenchConfig, BenchEntry
    from gradsched.torch.jobs.bench_worker import _build_entry, _burst, auto_warm_up
    from gradsched.torch.jobs.replay import fast_forward
    from gradsched.torch.runtime.torch_ddp import is_torch_ddp

    path = tmp_path / "small.profile.json"
    tensors = [{"name": f"layers.{i}.t0", "numel": 250_000, "bytes": 1_000_000, "forward_s": 0.001, "backward_s": 0.001}
               for i in range(4)]
    profile = Profile.from_dict({"format": "gradsched.profile/1", "model": "small", "tensors": tensors,
                                 "ready_order": [3, 2, 1, 0], "other_s": 0.001})
    profile.save(path)
    entry = BenchEntry(label="auto", strategy="auto", torch_ddp=False, options={**IN_SITU, "adaptive": True})
    cfg = BenchConfig(model=f"replay:{path}", seed=0, batch_size=2, lr=0.01, entries=[entry], steps=1, rounds=1,
                      warmup_rounds=1, profile_iterations=1, net_reps=1, probe=False, probe_s=1.0,
                      resample_share=0.0, contention_history=[], timeout_s=60.0, progress=False, out_dir=".",
                      backend="gloo", threads=1, round_tol=0.0, min_rounds=1)
    shared = SharedModel(cfg.model, 0)
    batches = [shared.spec.make_batch(2, None) for _ in range(4)]
    model, opt = _build_entry(entry, cfg, profile, bundled_cluster(), shared, (shared.spec.loss_fn, batches[0]))
    seen: dict[float, list] = {}  # per DDP: the storages behind .grad after its latest step
    held: list[int] = []  # per step while a DDP seen earlier is not running: the bytes those DDPs hold
    step = opt.step

    def recorded_step() -> None:
        step()
        running = model.plan.options["bucket_cap_mb"] if is_torch_ddp(model.plan) else None
        if running is not None:
            seen[running] = list({s.data_ptr(): s for s in (p.grad.untyped_storage() for p in model.module.parameters())
                                  }.values())
        if set(seen) - {running}:
            held.append(sum(s.nbytes() for cap, storages in seen.items() if cap != running for s in storages))

    opt.step = recorded_step
    with fast_forward(model.module):
        auto_warm_up(model.autotuner, lambda steps, until: _burst(model, opt, shared.spec.loss_fn, batches, steps, 0,
                                                                  until))
    assert model.autotuner.trials_done and len(seen) >= 2 and len(held) >= 3, (seen.keys(), held)
    assert max(held) == 0, held  # was each kept DDP's 4 MB


def _resident() -> tuple[int, int]:
    """This process's VmRSS and VmHWM, in bytes."""
    from gradsched.procfs import proc_bytes

    return proc_bytes("/proc/self/status", "VmRSS") or 0, proc_bytes("/proc/self/status", "VmHWM") or 0


LAYERS, WIDTH = 6, 1000  # 6 x (1000 x 1000 + 1000) floats: 24 MB of gradients


def _dear_memory(rank: int, world: int) -> dict:
    """A dear plan's operations on two gloo ranks, run as the executor runs them (issue in backward, the gathers
    in forward order, the waits): the peak resident bytes they add beside the arena, and whether the averaged
    gradients equal what the earlier runtime computed (``torch.sum`` of every rank's gradient / 2)."""
    import torch.distributed as dist
    from torch import nn

    from gradsched.planners import make_plan
    from gradsched.torch.runtime.decoupled import executable
    from gradsched.torch.runtime.executor import Executor
    from gradsched.torch.runtime.planning import default_cluster, profile_from_module

    module = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    params = list(module.parameters())
    plan = make_plan("dear", profile_from_module(module), default_cluster(world), grouping="nearby", nearby_layers=2)
    plan, order = executable(plan, list(range(len(plan.operations))))
    group = dist.group.WORLD
    ex = Executor(params, [str(i) for i in range(len(params))], plan, order, group, group, timeout_s=60,
                  find_unused_parameters=False, tracer=None)
    arena = ex.arenas["float32"]  # the gradients, in place
    start = torch.randn(arena.numel(), generator=torch.Generator().manual_seed(rank))
    mine = start / world
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    expected = torch.sum(torch.stack(every), dim=0)
    del every
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here (Linux >= 4.0)
    before, _ = _resident()
    for _ in range(2):
        arena.copy_(start)
        for j in reversed(order):
            ex.runners[j].issue()
        for r in sorted(ex.runners, key=lambda r: r.first_tensor):
            r.start_gather(60.0)
        for r in ex.runners:
            r.wait(60.0)
    _, peak = _resident()
    ex.close()
    return {"added": peak - before, "grad_bytes": arena.numel() * 4, "equal": torch.equal(arena, expected)}


@pytest.mark.slow
def test_a_dear_plan_on_two_gloo_ranks_holds_half_its_gradients_beside_the_arena():
    """dear's buffers (gradsched.torch.runtime.decoupled): on two gloo ranks the reduce-scatter receives the other
    rank's part into the shard and the all-gather runs as an all-to-all into the arena, so a rank holds its
    shards beside the arena (half the gradients) and the averaged gradients are those of before, bit for bit.
    It held an all-to-all buffer as large as the gradients beside its shards, and gloo's all-gather allocated
    another per call: a dear row peaked at 0.91 GB a rank on googlenet-k80 (54 MB), sync's at 0.53 GB."""
    from gradsched.torch.jobs.selftest import spawn_local

    for r in spawn_local(_dear_memory, 2, timeout_s=120):
        assert r["equal"]
        assert r["added"] < 0.75 * r["grad_bytes"], (r["added"] / 1e6, r["grad_bytes"] / 1e6)


def test_a_bench_plans_without_numbas_kernels_unless_gradsched_jit_is_given(monkeypatch):
    """Rank 0 plans for every rank; numba's code costs it about 0.1 GB, and on the bench's clusters the Python passes
    give the same plans as fast (docs/notes/2026-12-err11.md): the bench's workers set GRADSCHED_JIT=0 whatever the
    model, and a GRADSCHED_JIT given by the user wins."""
    from gradsched.sim import _kernel
    from gradsched.torch.jobs import bench_startup

    monkeypatch.setenv("GRADSCHED_JIT", "1")  # recorded, so that the test's own setting is undone after it
    monkeypatch.delenv("GRADSCHED_JIT")
    assert bench_startup._kernels_where_they_pay() is False
    assert os.environ["GRADSCHED_JIT"] == "0" and not _kernel.enabled()
    monkeypatch.setenv("GRADSCHED_JIT", "1")
    assert bench_startup._kernels_where_they_pay() is True and os.environ["GRADSCHED_JIT"] == "1"
