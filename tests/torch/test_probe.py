"""The bench's machine probes: pooling samples taken between rounds, and when to take them."""

import statistics

import pytest

pytest.importorskip("torch")

from gradsched.cluster import Cluster, CollectiveCost  # noqa: E402
from gradsched.torch.jobs import bench_overheads, bench_worker  # noqa: E402
from gradsched.torch.measure.netbench import operations_for  # noqa: E402
from gradsched.calibration import across_jobs, contention_from_probe, median_se  # noqa: E402
from gradsched.torch.measure.probe import (  # noqa: E402
    RESAMPLE_MAX_BYTES, SMALL_NUMEL, SMALL_OPS, ContentionProbe, NetworkResampler)

SIZES = [4096 << k for k in range(14)]  # 4 KiB .. 32 MiB


def _cluster(seconds: list[float]) -> Cluster:
    points = list(zip(map(float, SIZES), seconds))
    return Cluster(2, {"allreduce": CollectiveCost.fit(points, envelope=True)}, backend="gloo",
                   extra={"measured_by": "gradsched netbench", "measured_points": {"allreduce": [list(p) for p in points]}})


def test_pooled_table_is_the_median_of_every_sample_for_the_small_sizes_only():
    start = [1e-3 * (1 + k) for k in range(len(SIZES))]
    net = NetworkResampler(_cluster(start))
    assert net.sizes == [b for b in SIZES if b <= RESAMPLE_MAX_BYTES] and len(net.sizes) < len(SIZES)
    later = [[0.5 * t for t in start], [0.6 * t for t in start]]  # the machine got faster for small operations
    for sample in later:
        for b, t in zip(SIZES, sample):
            if b in net.sizes:
                net.samples[b].append(t)
    pooled = net.pooled()
    points = dict(pooled.extra["measured_points"]["allreduce"])
    for b, t in zip(SIZES, start):
        if b <= RESAMPLE_MAX_BYTES:
            assert points[b] == pytest.approx(statistics.median([t, 0.5 * t, 0.6 * t]))
        else:
            assert points[b] == pytest.approx(t)  # bandwidth-bound: the start-up time stays
    cost = pooled.cost("allreduce")
    assert cost.time_s(4096) == pytest.approx(0.6 * start[0])  # the table follows the samples
    assert [t for _, t in cost.points] == [min(points[b] for b in SIZES[k:]) for k in range(len(SIZES))]
    assert pooled.extra["samples"] == 3 and pooled.world_size == 2 and pooled.backend == "gloo"
    assert net.cluster.cost("allreduce").time_s(4096) == pytest.approx(start[0])  # the start-up one is untouched
    assert pooled.extra["startup_measured_points"] == net.cluster.extra["measured_points"]  # kept beside it


def test_contention_figures_come_from_the_medians_of_every_repetition():
    probe = ContentionProbe.__new__(ContentionProbe)  # its samples only: no model, no process group
    probe.total_bytes = 1 << 20
    probe.samples = {k: [] for k in ContentionProbe.TIMES}
    reps = [(40e-3, 2e-3, 60e-3, 8e-3, 5e-3, 16e-3), (41e-3, 2e-3, 62e-3, 9e-3, 5e-3, 17e-3),
            (90e-3, 9e-3, 99e-3, 40e-3, 20e-3, 60e-3)]  # the last one in a slow phase of the machine
    for rep in reps:
        for key, t in zip(ContentionProbe.TIMES, rep):
            probe.samples[key].append(t)
    cost = CollectiveCost(1e-4, 1e-9)
    fig = probe.figures(cost)
    medians = {k: statistics.median(r[i] for r in reps) for i, k in enumerate(ContentionProbe.TIMES)}
    assert {k: fig[k] for k in ContentionProbe.TIMES} == pytest.approx(medians)
    assert fig["reps"] == 3
    assert fig["samples"] == {k: [r[i] for r in reps] for i, k in enumerate(ContentionProbe.TIMES)}  # kept, in order
    assert fig["fitted"] == pytest.approx(contention_from_probe(
        medians["compute_alone_s"], cost.time_s(1 << 20), medians["compute_overlapped_s"],
        medians["allreduce_overlapped_s"], SMALL_OPS * cost.time_s(SMALL_NUMEL * 4), medians["small_ops_busy_s"],
        SMALL_OPS, medians["small_ops_alone_s"], median_se([r[5] for r in reps])))  # net of the busy times' noise
    assert fig["fitted"]["op_latency_s"] > 0  # the small operations took longer than the table says


@pytest.mark.parametrize("share,expected", [(0.25, [1, 3, 5, 7, 9, 11]), (0.5, list(range(12))), (0.0, [])])
def test_resampling_keeps_within_its_share_of_the_rounds(monkeypatch, share, expected):
    monkeypatch.setattr(bench_overheads, "slowest", lambda v: v)  # one rank: its own times are the slowest
    now = [0.0]
    calls = [0, 0]

    def sampler(k: int):
        def sample() -> float:  # 0.5 s of the clock each
            calls[k] += 1
            now[0] += 0.5
            return 0.5
        return sample

    sampling = bench_overheads._Resampling([sampler(0), sampler(1)], share, [0.5, 0.5], clock=lambda: now[0])
    sampling.start()
    sampled = []
    for r in range(12):
        now[0] += 1.0  # a round takes 1 s
        before = sampling.count
        sampling.after_round(r)
        if sampling.count > before:
            sampled.append(r)
        assert sampling.spent_s <= share * sampling.rounds_s
    assert sampled == expected  # a sample of 0.5 s whenever it fits, the sampler with fewer samples first
    assert abs(calls[0] - calls[1]) <= 1 and sum(calls) == round(share * 12 / 0.5)
    assert sampling.spent_s == pytest.approx(sum(calls) * 0.5)
    assert sampling.rounds_s == pytest.approx(12.0)  # the samples' own time is not the rounds'


def test_a_costly_sampler_neither_keeps_the_others_out_nor_overruns_the_share(monkeypatch):
    """BERT-Large on 8 emulated hosts: the overhead probe's first sample (its rows built, its warm-up rotation)
    took 245 s, estimated with the others at 28 s, where a quarter of its four rounds allowed 186 s."""
    monkeypatch.setattr(bench_overheads, "slowest", lambda v: v)
    now, costs, calls = [0.0], [10.0, 20.0, 245.0], [0, 0, 0]

    def sampler(k: int):
        def sample() -> float:
            calls[k] += 1
            now[0] += costs[k]
            return costs[k]
        return sample

    sampling = bench_overheads._Resampling([sampler(k) for k in range(3)], 0.25, costs, clock=lambda: now[0])
    sampling.start()
    for r in range(4):
        now[0] += 186.0  # a round of BERT-Large's seven rows
        sampling.after_round(r)
        assert sampling.spent_s <= 0.25 * sampling.rounds_s
    assert calls[2] == 0 and calls[0] >= 2 and calls[1] >= 2


def test_network_sample_estimate_counts_the_repetitions():
    net = NetworkResampler(_cluster([1e-3 * (1 + k) for k in range(len(SIZES))]))
    assert net.estimate_s() == pytest.approx(sum(operations_for(b, 1) * 1e-3 * (1 + k)
                                                 for k, b in enumerate(SIZES) if b <= RESAMPLE_MAX_BYTES))


def test_figures_across_jobs_are_each_figures_median():
    own = {"compute_slowdown": 0.2, "comm_slowdown": 3.0, "busy_latency_s": 1e-3}
    earlier = [{"compute_slowdown": 0.6, "comm_slowdown": 1.0, "busy_latency_s": 0.0},
               {"compute_slowdown": 0.4, "comm_slowdown": 2.0}]  # no latency measured: it reads as 0
    assert across_jobs(own, earlier) == pytest.approx({"compute_slowdown": 0.4, "comm_slowdown": 2.0,
                                                       "busy_latency_s": 0.0})
    assert across_jobs(own, earlier[:1]) == pytest.approx({"compute_slowdown": 0.4, "comm_slowdown": 2.0,
                                                           "busy_latency_s": 5e-4})  # two jobs: their mean
    alone = across_jobs(own, [])
    assert alone == own and alone is not own  # no history: this job's own, a copy


def test_each_phase_is_slowed_against_its_own_table():
    # the reduce-scatter 10 -> 30 ms while steps run, the all-gather 10 -> 10 ms; the cluster's tables give them
    # 12 and 8 ms (the times the simulator stretches, as the all-reduce's figure is taken against its table)
    probe = ContentionProbe.__new__(ContentionProbe)
    probe.total_bytes = 1 << 20
    times = (40e-3, 10e-3, 60e-3, 20e-3, 5e-3, 16e-3, 10e-3, 30e-3, 10e-3, 10e-3)
    keys = ContentionProbe.TIMES + ("reducescatter_alone_s", "reducescatter_overlapped_s", "allgather_alone_s",
                                    "allgather_overlapped_s")
    probe.samples = {k: [t] for k, t in zip(keys, times)}
    cost = CollectiveCost(0.0, 8e-3 / (1 << 20))  # the table's all-reduce of 1 MiB: 8 ms
    phases = {"reducescatter": CollectiveCost(0.0, 12e-3 / (1 << 20)), "allgather": CollectiveCost(0.0, 8e-3 / (1 << 20))}
    fig = probe.figures(cost, phases)
    assert fig["fitted"]["comm_slowdown"] == pytest.approx(1.5)
    assert fig["reducescatter_slowdown"] == pytest.approx(3.0) and fig["allgather_slowdown"] == pytest.approx(1.0)
    assert fig["fitted"]["reducescatter_comm_slowdown"] == pytest.approx(30 / 12 - 1)
    assert fig["fitted"]["allgather_comm_slowdown"] == pytest.approx(10 / 8 - 1)
    alone = probe.figures(cost)["fitted"]  # no tables: against their own times alone
    assert alone["reducescatter_comm_slowdown"] == pytest.approx(2.0) and alone["allgather_comm_slowdown"] == 0.0
    probe.samples = {k: [t] for k, t in zip(ContentionProbe.TIMES, times)}  # a job without two-phase rows
    assert "reducescatter_comm_slowdown" not in probe.figures(cost, phases)["fitted"]


def test_an_earlier_job_without_the_phases_figures_pools_as_its_all_reduce():
    own = {"comm_slowdown": 1.0, "reducescatter_comm_slowdown": 3.0}
    earlier = [{"comm_slowdown": 0.5}, {"comm_slowdown": 2.0, "reducescatter_comm_slowdown": 2.5}]
    assert across_jobs(own, earlier) == pytest.approx({"comm_slowdown": 1.0, "reducescatter_comm_slowdown": 2.5})


def test_the_probe_times_the_two_phases_on_a_group(tmp_path):
    import torch
    import torch.distributed as dist

    module = torch.nn.Linear(64, 4)
    spec = type("Spec", (), {"module": module, "loss_fn": staticmethod(lambda out, y: out.square().mean()),
                             "make_batch": staticmethod(lambda n, g: (torch.randn(n, 64, generator=g), None))})()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        probe = ContentionProbe(spec, 1 << 16, lr=0.1, seed=0, batch_size=2, step_s=1e-3, allreduce_s=1e-3,
                                two_phase=True)
        probe.measure(2)
    finally:
        dist.destroy_process_group()
    assert all(len(v) == 2 and min(v) > 0 for v in probe.samples.values())
    assert {"reducescatter_overlapped_s", "allgather_alone_s"} <= set(probe.samples)
    assert probe._pieces.numel() == 0 and probe._shard.untyped_storage().nbytes() == 0  # released between them


@pytest.mark.parametrize("strategies, two_phase", [("ddp,auto", False), ("ddp,usbyte,mgwfbp", False),
                                                   ("ddp,dear", True), ("ddp,fsdp2", True),
                                                   ("auto without dear", False)])
def test_the_network_table_times_the_two_phases_where_a_row_runs_them(strategies, two_phase):
    # derived from the all-reduce, gloo's reduce-scatter and all-gather were half its time each; on the testbed
    # they took about twice that, so rows that run them get them measured (and only those: start-up time; auto,
    # which may try dear at run time, measures what it tries: timing them for it took 8 hosts' start-up past 2 min)
    from types import SimpleNamespace

    from gradsched.jobs.bench import entries

    if strategies == "auto without dear":
        cfg = SimpleNamespace(entries=entries("ddp,auto", "none", options={"auto": {"exclude": "dear"}}))
    else:
        cfg = SimpleNamespace(entries=entries(strategies, "none"))
    expected = ["allreduce", "reducescatter", "allgather"] if two_phase else ["allreduce"]
    assert bench_worker.network_collectives(cfg) == expected  # type: ignore[arg-type]


class _SlowLink:
    """torch.distributed as the probe sees it, one rank, with every all-reduce of ``numel`` elements taking
    ``seconds`` on a link that runs one at a time (asynchronous ones complete on a timer); counted."""

    def __init__(self, numel: int, seconds: float) -> None:
        import threading

        import torch.distributed as dist

        self._dist, self._threading, self.numel, self.seconds = dist, threading, numel, seconds
        self.big, self._busy_until = 0, 0.0

    def __getattr__(self, name: str):
        return getattr(self._dist, name)

    def all_reduce(self, t, *args, async_op: bool = False, **kwargs):
        import time

        import torch

        if t.numel() != self.numel:
            return self._dist.all_reduce(t, *args, async_op=async_op, **kwargs)
        self.big += 1
        start = max(time.perf_counter(), self._busy_until)
        self._busy_until = start + self.seconds
        fut: torch.futures.Future = torch.futures.Future()
        timer = self._threading.Timer(self._busy_until - time.perf_counter(), lambda: fut.set_result(None))
        timer.start()
        if not async_op:
            fut.wait()
            return None
        return type("Work", (), {"get_future": lambda _self: fut, "wait": lambda _self: fut.wait()})()


def test_a_replays_probe_times_each_all_reduce_of_every_gradient_once(monkeypatch, tmp_path):
    """A replay at a high dilation: an all-reduce of every gradient outlasts a step (googlenet-k80 at 50 Mbit/s:
    9 s against 8).  The probe takes it from the table, and times the step behind it and it behind steps in one
    window: 2 of them a repetition (alone, overlapped), where it timed 5 (one to size the queue, alone, a queue
    of two behind the step, one behind steps), and 3 steps (alone, two behind it), where it ran 4 (and one
    more where the small all-reduces, instant here, do not complete before the busy loop starts one)."""
    import time

    import torch
    import torch.distributed as dist

    from gradsched.torch.measure import probe as probe_module

    step_s, allreduce_s, numel = 0.06, 0.09, 1 << 12

    class Sleepy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(numel))
            self.steps = 0

        def forward(self, x):
            self.steps += 1
            time.sleep(step_s)
            return (self.w * x).sum()

    spec = type("Spec", (), {"module": Sleepy(), "make_batch": staticmethod(lambda n, g: (torch.ones(numel), None)),
                             "loss_fn": staticmethod(lambda out, _y: out)})()
    link = _SlowLink(numel, allreduce_s)
    monkeypatch.setattr(probe_module, "dist", link)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        probe = ContentionProbe(spec, numel * 4, lr=0.1, seed=0, batch_size=1, step_s=step_s,
                                allreduce_s=allreduce_s)
        assert link.big == 0 and probe.one_window  # nothing timed to size the probe
        spec.module.steps = 0
        probe.measure(1)
    finally:
        dist.destroy_process_group()
    assert link.big == 2 and spec.module.steps in (3, 4)
    s = probe.samples
    assert s["allreduce_overlapped_s"][0] == pytest.approx(allreduce_s, rel=0.5)
    assert s["compute_overlapped_s"][0] == pytest.approx(step_s, rel=0.5)
    assert s["compute_overlapped_s"][0] < s["allreduce_overlapped_s"][0]  # the step behind it ended first
    assert all(len(v) == 1 for v in s.values())


def test_the_probe_holds_no_shard_without_the_two_phases_and_its_bucket_pass_no_source_of_its_own(tmp_path):
    """Its memory beside the step's: the all-gradients buffer alone where the job runs no two-phase row (the shard
    was half the gradients on two ranks, restored at every sample), and the bucket pass copies that buffer onto
    itself, every byte read and written once (its source of ones was as large as the gradients)."""
    import torch
    import torch.distributed as dist

    module = torch.nn.Linear(24, 4)
    spec = type("Spec", (), {"module": module, "loss_fn": staticmethod(lambda out, y: out.square().mean()),
                             "make_batch": staticmethod(lambda n, g: (torch.randn(n, 24, generator=g), None))})()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        probe = ContentionProbe(spec, 251 * 4, lr=0.1, seed=0, batch_size=2, step_s=1e-3, allreduce_s=1e-3)
        probe._restore()
        assert probe._big.untyped_storage().nbytes() == 251 * 4 and probe._shard.untyped_storage().nbytes() == 0
        probe._big.copy_(torch.arange(251.0))
        pieces = probe._copy_pieces(probe._big)
        assert sum(d.numel() for d, _ in pieces) == 251 and all(d.numel() == s.numel() for d, s in pieces)
        for dst, src in pieces:
            dst.copy_(src)
        assert torch.equal(probe._big, torch.cat([torch.arange(125.0, 250.0)] * 2 + [torch.tensor([125.0])]))
        probe._release()
        copy_s, scale_s = probe.bucket_pass_s(2)
    finally:
        dist.destroy_process_group()
    assert copy_s > 0 and scale_s > 0 and probe._big.untyped_storage().nbytes() == 0


def test_the_probes_step_writes_its_gradients_into_the_buffer_it_all_reduces(tmp_path):
    """The probe held 4x the parameters (parameters, momentum, its step's gradients, its all-gradients buffer),
    the rows 3x: its step's gradients are now views of that buffer, zeroed in place, so that the step allocates
    none of its own; released with the buffer between measurements.  A model whose gradients do not fit the
    buffer (float64 here) keeps gradients of its own."""
    import torch
    import torch.distributed as dist

    def spec_of(module: torch.nn.Module, dtype: torch.dtype):
        return type("Spec", (), {"module": module, "loss_fn": staticmethod(lambda out, y: out.square().mean()),
                                 "make_batch": staticmethod(lambda n, g: (torch.randn(n, 24, generator=g,
                                                                                      dtype=dtype), None))})()

    module = torch.nn.Linear(24, 4)
    numel = sum(p.numel() for p in module.parameters())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        probe = ContentionProbe(spec_of(module, torch.float32), numel * 4, lr=0.1, seed=0, batch_size=2,
                                step_s=1e-3, allreduce_s=1e-3)
        assert all(p.grad is None for p in module.parameters())
        probe._restore()
        big = probe._big.untyped_storage().data_ptr()
        probe._compute()
        ptrs = [p.grad.untyped_storage().data_ptr() for p in module.parameters()]
        assert ptrs == [big] * len(ptrs)  # the step's gradients, in the buffer
        assert torch.equal(probe._big, torch.cat([p.grad.flatten() for p in module.parameters()]))
        assert probe._big.abs().sum() > 0
        probe._release()
        probe.measure(2)
        assert all(p.grad is None for p in module.parameters()) and probe._big.untyped_storage().nbytes() == 0
        assert all(torch.isfinite(p).all() for p in module.parameters())
        wide = torch.nn.Linear(24, 4).double()
        other = ContentionProbe(spec_of(wide, torch.float64), numel * 8, lr=0.1, seed=0, batch_size=2,
                                step_s=1e-3, allreduce_s=1e-3)
        other._restore()
        other._compute()
        assert all(p.grad.untyped_storage().data_ptr() != other._big.untyped_storage().data_ptr()
                   for p in wide.parameters())
    finally:
        dist.destroy_process_group()


def test_the_probe_restores_a_buffer_already_its_size_in_place(tmp_path):
    """``resize_`` allocates and copies even to a storage's own size: the probe's first restore, just after its
    all-gradients buffer was made, held that buffer twice for a moment (LLaMA-7B at S = 128 on 2 hosts: the job's
    peak).  A restore keeps a buffer that is already its size where it is (zeroed), and grows a released one back."""
    import torch
    import torch.distributed as dist

    module = torch.nn.Linear(24, 4)
    numel = sum(p.numel() for p in module.parameters())
    spec = type("Spec", (), {"module": module, "loss_fn": staticmethod(lambda out, y: out.square().mean()),
                             "make_batch": staticmethod(lambda n, g: (torch.randn(n, 24, generator=g), None))})()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        probe = ContentionProbe(spec, numel * 4, lr=0.1, seed=0, batch_size=2, step_s=1e-3, allreduce_s=1e-3)
        probe._restore()
        at = probe._big.untyped_storage().data_ptr()
        probe._big.fill_(3.0)
        probe._restore()
        assert probe._big.untyped_storage().data_ptr() == at and probe._big.abs().sum() == 0
        assert all(p.grad.untyped_storage().data_ptr() == at for p in module.parameters())
        probe._release()
        assert probe._big.untyped_storage().nbytes() == 0
        probe._restore()
        assert probe._big.untyped_storage().nbytes() == numel * 4 and probe._big.abs().sum() == 0
    finally:
        dist.destroy_process_group()
