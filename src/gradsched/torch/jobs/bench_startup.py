"""Steps 1-3 of the bench's job (:mod:`gradsched.torch.jobs.bench_worker`): the start-up, in order.

The profile measured in situ and broadcast (:func:`_measure_profile`), the network table
(:mod:`~gradsched.torch.jobs.bench_network`), the contention and overhead probes
(:mod:`~gradsched.torch.jobs.bench_overheads`); what they measured is a :class:`_Start` (:func:`_start`).
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch
import torch.distributed as dist

from gradsched.calibration import calibrate
from gradsched.jobs.config import BenchConfig
from gradsched.jobs.results import contention_to_run, pooled_contention
from gradsched.jobs.startup import AutoWarmup
from gradsched.jobs.results import Contention as ProbeFigures  # the probe's figures
from gradsched.cluster import Cluster
from gradsched.profile import Profile
from gradsched.torch.jobs.bench_network import _broadcast, _measure_cluster, network_collectives
from gradsched.torch.jobs.bench_overheads import (_Resampling, _RuntimeOverheads, _share, _startup_probe,
                                                  _with_contention, update_call_s)
from gradsched.torch.jobs.bench_rows import _fast_steps
from gradsched.torch.jobs.phases import Phases
from gradsched.torch.jobs.replay import fast_forward, restart_clocks
from gradsched.torch.jobs.shared_model import SharedModel
from gradsched.torch.measure.probe import PROBE_BUDGET_S, ContentionProbe, NetworkResampler


def _measure_profile(cfg: BenchConfig, shared: SharedModel) -> Profile:
    from gradsched.torch.jobs.shared_model import RowBuffers
    from gradsched.torch.measure.profiler import profile_module

    spec = shared.copy_spec()
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 999)
    batch = spec.make_batch(cfg.batch_size, gen)
    dist.barrier()
    opt = shared.sgd(spec.module, cfg.lr)  # the rounds' optimizer
    # a replayed model waits out its profile's times: two iterations tell its layers apart (the rounds' compute-only
    # row sets the scale later), one where dilated (its waits are K times longer against the same noise); each
    # further one costs a dilated step at start-up (the profiler's unhooked reference, another, is left out where
    # dilated: a replay's clock does not count the hooks); the warm-up runs without the replayed compute
    # (fast_forward: nothing reads its time)
    replay = bool(getattr(spec.module, "hides_host_work", False))
    iterations, warmup = cfg.profile_iterations, 1
    if replay:
        iterations, warmup = min(cfg.profile_iterations, 2 if cfg.dilate == 1 else 1), 0
        for _ in _fast_steps(spec.module, 1):
            opt.zero_grad()
            spec.loss_fn(spec.module(batch[0]), batch[1]).backward()
            opt.step()
    prof = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=iterations, warmup=warmup,
                          model_name=cfg.model, optimizer=opt, plain_reference=not (replay and cfg.dilate > 1))
    RowBuffers(spec.module).release()  # its gradients
    dist.barrier()
    return _broadcast(prof)


@dataclasses.dataclass
class _Start:
    """What the start-up measured (steps 1-3), in this run's seconds."""

    hooked: Profile  # as profiled
    profile: Profile  # scaled to the probe's compute when probed: what the plans are made from
    cluster: Cluster  # with the contention figures (pooled with --contention-from's) when probed
    history: list[dict[str, float]]  # earlier jobs' fitted figures, in run seconds
    probe: ProbeFigures | None = None  # the probe's figures (None: --no-probe)
    contention: ContentionProbe | None = None
    network: NetworkResampler | None = None
    overheads: "_RuntimeOverheads | None" = None
    samplers: _Resampling | None = None
    auto_warmups: dict[str, AutoWarmup] = dataclasses.field(default_factory=dict)  # per auto row's label


def _kernels_where_they_pay() -> bool:
    """Whether this rank may load gradsched's numba kernels (``GRADSCHED_JIT``): only where ``GRADSCHED_JIT`` is
    given; else it is set to ``0``.  Rank 0 plans for every rank (run-time ``auto``'s tuner, the rows' predictions),
    and numba's code and LLVM cost it about 0.1 GB resident (:data:`~gradsched.bench_memory.KERNELS_BYTES`), a fifth
    of a rank's 0.5 GB beside the model, for no time on the bench's clusters: their contention figures keep the
    simulator on its Python pass and their measured table keeps usbyte's search on its own, so ``auto``'s ranking
    takes as long either way, whatever the model (DenseNet-201's 604 tensors at 8 ranks: 3.3-4.4 s without, 3.6-4.5
    s with, +105 MiB VmHWM; docs/notes/2026-12-err11.md).  Returns whether they may load."""
    os.environ.setdefault("GRADSCHED_JIT", "0")
    return os.environ["GRADSCHED_JIT"] != "0"


def _start(cfg: BenchConfig, shared: SharedModel, phases: Phases) -> _Start:
    """Steps 1-3 of the module docstring: profile, network table, contention and overhead probes."""
    profile = _measure_profile(cfg, shared)
    _kernels_where_they_pay()
    phases.end("profiling")
    cluster = _measure_cluster(profile, cfg)
    phases.end("network table")
    # earlier jobs' figures (gradsched bench --contention-from) are emulated seconds: this job's are run seconds
    start = _Start(hooked=profile, profile=profile, cluster=cluster,
                   history=contention_to_run(cfg.contention_history, cfg.dilate))
    if not cfg.probe:
        return start
    spec = shared.copy_spec()
    # a replay's step is its profile's, its all-reduce of every gradient the table's (its line): not timed again
    replay = bool(getattr(spec.module, "hides_host_work", False))
    start.contention = ContentionProbe(spec, profile.total_bytes, lr=cfg.lr, seed=cfg.seed, batch_size=cfg.batch_size,
                                       budget_s=_share(cfg, PROBE_BUDGET_S), optimizer=shared.sgd(spec.module, cfg.lr),
                                       off_clock=lambda: fast_forward(spec.module),
                                       step_s=profile.compute_s if replay else None,
                                       allreduce_s=cluster.cost("allreduce").time_s(profile.total_bytes) if replay
                                       else None, restart=lambda: restart_clocks(spec.module),
                                       two_phase="reducescatter" in network_collectives(cfg))
    start.network = NetworkResampler(cluster)
    t0 = time.perf_counter()
    probe, cluster = _startup_probe(start.contention, cluster, cfg)
    probe["host_work_hidden"] = replay  # a replayed model's clock
    probe_rep_s = (time.perf_counter() - t0) / probe["startup_reps"]
    pooled = pooled_contention(probe["fitted"], cfg.contention_history, cfg.dilate)
    start.cluster = _with_contention(cluster, pooled)
    start.profile = calibrate(profile, probe["compute_alone_s"])
    overheads = _RuntimeOverheads(cfg, start.profile, start.cluster, probe, shared)
    # no rotation at start-up where even the fewest take minutes (a dilated replay): the samples between rounds
    rotation_s = overheads.measure(overheads.start_reps) / overheads.start_reps if overheads.start_reps \
        else overheads.rotation_s
    probe["op_host"] = overheads.op_host()
    probe["update_call_s"] = update_call_s(spec.module, cfg.lr)
    probe["runtime_overhead_s"] = overheads.figures(start.profile, start.cluster, probe)
    contention, network = start.contention, start.network
    start.samplers = _Resampling([network.measure, lambda: contention.measure(1), lambda: overheads.measure(1)],
                                 cfg.resample_share, [network.estimate_s(), probe_rep_s,
                                                      rotation_s + (0.0 if overheads.runs else overheads.setup_s)])
    start.probe, start.overheads = probe, overheads
    phases.end("probe")
    return start
