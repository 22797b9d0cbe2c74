"""The worker behind ``gradsched bench``: every strategy, interleaved, in one set of processes.

Launched once per benchmark (one process per rank, by ``torch.distributed.run`` on
loopback or on the testbed's hosts)::

    python -m torch.distributed.run ... -m gradsched.torch.jobs.bench_worker CONFIG.json

What one job does, in order (every rank runs the same steps, so collectives match):

1. **Profile in situ**: every rank profiles its own copy of the model at once (the
   same CPU contention between ranks as in training, no communication); rank 0's
   profile is broadcast so that every rank plans from the same one.
2. **Network**: all-reduce timed on the live group from 4 KiB up to twice the
   model's gradient size (rounded up to a power of two), and reduce-scatter and all-gather
   where a row runs them (:func:`network_collectives`), fitted to a Cluster on rank 0
   and broadcast.
3. **Contention probe**: a training step alone and while a queue of all-reduces of
   all gradients keeps communication busy; one such all-reduce alone and while
   steps run back to back; a burst of small all-reduces alone and with compute
   busy; a copy of all gradients and a division of them, as a runtime's hooks do; the
   broadcast of the model's buffers that precedes every forward.
   :mod:`gradsched.torch.measure.probe` turns these into the simulator's contention
   figures (compute slowdown, communication slowdown, latency per operation), put
   into the cluster, so that the plans (``auto``) and the predictions account for
   CPU contention.  Then each runtime's own overhead per step, beyond what the
   simulator accounts for, on its simplest plan, and gradsched's host time per
   operation (:class:`_RuntimeOverheads`).
4. **Models**: one copy of the model per entry (strategy, or DDP with one
   ``bucket_cap_mb``), all from the same seed, each with its own optimizer.  gradsched
   wrappers and PyTorch DDP coexist on one process group: only one of them runs at a
   time and each waits for its own communication before the next one starts.
5. **Rounds**: in round ``r`` the entries run ``steps`` training steps each, in an
   order rotated by ``r`` so that slow phases of the machine hit all alike.  One more
   entry runs the same steps without moving gradients (:class:`_ComputeOnly`).  A burst
   starts behind a barrier (off the clock) and times steady-state steps only (see
   :func:`_burst`).  Rounds before ``warmup_rounds`` are not counted (DDP rebuilds
   its buckets there; caches warm up).  Between rounds, the contention probe and the
   network's latency-bound sizes are sampled again, within ``resample_share`` of the
   rounds' time (:class:`_Resampling`).
6. **Predictions**: each entry's plan simulated with the cluster of steps 2-3 (each
   figure the median over the start-up measurement and the samples between rounds) and
   the profile of step 1 scaled to the compute-only entry's median (the profile gives
   which layer costs what; the rounds give how long a step's compute takes now), plus
   the runtimes' own costs that the probe measured (:func:`with_runtime_costs`).
   Plans are made before the rounds, from the profile scaled to the probe's compute.

Rank 0 writes ``bench.json`` (see :func:`run_bench`) into ``out_dir``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradsched.constants import REPLAY_PREFIX
from gradsched.calibration import calibrate, lower_bound_s, phase_costs, runtime_name, this_machine, with_runtime_costs
from gradsched.jobs.bench import anchored_to_probe, ddp_first_bucket_mb, with_stream_cost
from gradsched.jobs.config import BenchConfig, BenchEntry
from gradsched.jobs.results import BenchResult, BenchRow, contention_to_run, pooled_contention
from gradsched.jobs.rounds import StoppingRule
from gradsched.jobs.startup import (AUTO_WARMUP_PHASE, SHORT_WARMUP, AutoWarmup, auto_options, auto_warmup,
                                   initial_iterations, may_shorten, overhead_probe_s, probe_floor, replay_start,
                                   runtime_steps_s, shorter, warmup_estimate_s)
from gradsched.jobs.results import Contention as ProbeFigures  # the probe's figures (the cluster's Contention below)
from gradsched.cluster import Cluster, Contention
from gradsched.net_extend import (MAX_RUN, MEASURED_MAX_BYTES, extended_costs, measured_top,
                                  operations_for, table_floor, table_run)
from gradsched.plan import Plan
from gradsched.profile import Profile
from gradsched.torch.jobs.fsdp2_row import Fsdp2Row
from gradsched.torch.jobs.phases import Phases
from gradsched.torch.jobs.replay import fast_forward, restart_clocks
from gradsched.torch.jobs.shared_model import SharedModel, row_buffers, track, trim_heap
from gradsched.torch.runtime.optim import DistributedOptimizer
from gradsched.torch.measure.probe import (PROBE_BUDGET_S, ContentionProbe, NetworkResampler, slowest,
                                           slowest_median)
from gradsched.torch.jobs.worker import run_worker
from gradsched.torch.runtime.wrapper import DistributedDataParallel

OVERHEAD_BUDGET_S = 12.0  # the runtimes' overhead probe takes about this long (by default) ...
OVERHEAD_REPS = (2, 20)  # ... in this many rotations of short bursts (at least 2: slow steps; resampled later;
# none where 2 take minutes: gradsched.jobs.startup.probe_floor)


def _share(cfg: BenchConfig, default_s: float) -> float:
    """One start-up probe's part of ``--probe-s``, in the proportion of the default budgets."""
    return cfg.probe_s * default_s / (PROBE_BUDGET_S + OVERHEAD_BUDGET_S)


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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


def _measured_top(sizes: list[int], reps: int) -> tuple[int, int]:
    """The largest size the table times (:func:`measured_top`, at least the first bandwidth-bound one:
    :func:`table_floor`) and the most operations a repetition times back to back (:func:`table_run`), from one
    all-reduce of 4 KiB and one of 1 MiB (the slowest rank's, so that every rank times the same sizes)."""
    from gradsched.torch.measure.netbench import measure_points

    small_s, mib_s = slowest([t for _, t in measure_points("allreduce", [4096, 1 << 20], reps=1, warmup=0)])
    run = table_run(small_s)
    top = measured_top(sizes, lambda b: operations_for(b, reps + 1, run) * max(small_s, mib_s * b / (1 << 20)),
                       floor_bytes=table_floor(small_s, mib_s))
    return top, run


def _measure_cluster(profile: Profile, cfg: BenchConfig) -> Cluster:
    from gradsched.netbench_args import sizes_bytes
    from gradsched.torch.measure.netbench import benchmark

    # One size beyond the gradients' (rounded up to a power of two): the table is read through its
    # lower monotone envelope, which bounds a size only by larger ones, and the all-reduce of all
    # gradients sits near the top (cnn: its time came out 3.9 ms in one job, 1.0 ms in the next).
    # Sizes above MEASURED_MAX_BYTES, or above what fits the table's budget on slow (dilated) links,
    # are bandwidth-bound: on the line through the largest measured ones (gradsched.net_extend).
    top = 2 << max(12, math.ceil(math.log2(max(profile.total_bytes, 4096))))
    measured_max, run = _measured_top(sizes_bytes(4096, min(top, MEASURED_MAX_BYTES)), cfg.net_reps)
    names = network_collectives(cfg)
    cluster = benchmark(min_bytes=4096, max_bytes=measured_max, reps=cfg.net_reps, warmup=1, collectives=names,
                        max_run=run)
    if cluster is not None and run < MAX_RUN:  # the samples between the rounds time as the table did
        cluster = dataclasses.replace(cluster, extra={**cluster.extra, "table_max_run": run})
    beyond = _time_two_phase(cluster, measured_max, profile, cfg)
    if cluster is not None and (top > measured_max or beyond):  # every timed collective, on its own line
        points = {**cluster.extra["measured_points"]}
        for name, more in beyond.items():
            points[name] = [*points[name], *([float(b), t] for b, t in more)]
        extended = extended_costs(points, names if top > measured_max else list(beyond), max(top, measured_max))
        extra = {**cluster.extra, "measured_points": points}
        if top > measured_max:
            extra["extended_beyond_bytes"] = measured_max
        if beyond:
            extra["two_phase_beyond_bytes"] = [int(b) for b, _ in next(iter(beyond.values()))]
        cluster = dataclasses.replace(cluster, collectives={**cluster.collectives, **extended}, extra=extra)
    queued = _measure_queued(cluster, cfg)
    if cluster is not None and queued:
        cluster = dataclasses.replace(cluster, extra={**cluster.extra, **queued})
    trim_heap()  # the large sizes' buffers (up to 4 x 36 MiB a rank), freed below glibc's mmap threshold: else
    # they stay resident and the later phases grow on top (googlenet-k80, 4 hosts: 0.66 -> 0.93 GB a rank)
    return _broadcast(cluster)


def _two_phase_rates(cluster: Cluster | None, names: list[str]) -> dict[str, tuple[int, float]] | None:
    """Each two-phase collective's largest measured size a rank and its seconds per byte there (rank 0's
    table; None on the other ranks)."""
    if cluster is None:
        return None
    points = cluster.extra["measured_points"]
    return {n: (int(points[n][-1][0]), float(points[n][-1][1]) / float(points[n][-1][0])) for n in names}


def _time_two_phase(cluster: Cluster | None, measured_max: int, profile: Profile,
                    cfg: BenchConfig) -> dict[str, list[tuple[float, float]]]:
    """Where the table times reduce-scatters and all-gathers: those two also at the sizes a rank beyond the
    table's top up to the model's largest group (:func:`~gradsched.net_extend.two_phase_sizes`, within
    :data:`~gradsched.net_extend.TWO_PHASE_BUDGET_S`, estimated at the largest measured size's rate), as the
    table times them; ``{name: [(bytes a rank, s), ...]}``.  Every rank calls it."""
    from gradsched.net_extend import two_phase_sizes
    from gradsched.planners.dear import largest_group_bytes
    from gradsched.torch.measure.netbench import measure_points, operations_for

    names = [n for n in network_collectives(cfg) if n != "allreduce"]
    if not names:
        return {}
    world = dist.get_world_size()
    rates = _two_phase_rates(cluster, names)
    sizes = None
    if rates is not None:
        top = min(b for b, _ in rates.values())
        largest = -(-largest_group_bytes(profile) // world)
        sizes = two_phase_sizes(top, largest, lambda b: operations_for(b, cfg.net_reps + 1)
                                * sum(rate * b for _, rate in rates.values()))
    sizes = _broadcast(sizes)
    return {n: measure_points(n, sizes, reps=cfg.net_reps, warmup=1) for n in names} if sizes else {}


def _measure_queued(cluster: Cluster | None, cfg: BenchConfig) -> dict[str, Any]:
    """Where the table times reduce-scatters and all-gathers: each also in a queue of :data:`QUEUE_DEPTH` issued
    together beside one at a time (:func:`~gradsched.torch.measure.netbench.measure_queued`), at the groups'
    sizes within the table's range (:func:`~gradsched.net_extend.queue_sizes`); the cluster's ``queued_points``
    and fitted ``queued`` rule, which the simulator prices queued two-phase operations by (docs/cost-model.md,
    "Queued streams").  Every rank calls it (``cluster``: rank 0's, None elsewhere)."""
    from gradsched.net_extend import queue_sizes
    from gradsched.queued import fit_queued
    from gradsched.torch.measure.netbench import measure_queued

    names = [n for n in network_collectives(cfg) if n != "allreduce"]
    if not names:
        return {}
    rates = _two_phase_rates(cluster, names)
    sizes = None
    if rates is not None:  # one at a time and queued, each QUEUE_DEPTH operations a repetition, after a warm-up
        per_size = QUEUE_DEPTH * (2 * cfg.net_reps + 1)
        sizes = queue_sizes(min(b for b, _ in rates.values()),
                            lambda b: per_size * sum(rate * b for _, rate in rates.values()))
    sizes = _broadcast(sizes)
    points = {n: measure_queued(n, sizes, (QUEUE_DEPTH,), reps=cfg.net_reps, warmup=1) for n in names}
    rules = {n: r.to_dict() for n, q in points.items() if (r := fit_queued(q)) is not None}
    return {"queued_points": points, "queued": rules}


QUEUE_DEPTH = 4


def network_collectives(cfg: BenchConfig) -> list[str]:
    """What the network table times: the all-reduce, and where a row runs reduce-scatters and all-gathers
    (``dear``, ``fsdp2``) those too, as the runtime runs them.  Derived from the all-reduce they were
    half of it each; on gloo over 2 testbed hosts at 1 Gbit/s they took 2.0x (all-to-all and sum) and
    1.75x that (docs/notes/2026-12-decoupled.md), and ``dear`` was predicted 19-31% too fast."""
    two_phase = any(e.fsdp2 or (not e.torch_ddp and e.strategy == "dear") for e in cfg.entries)
    return ["allreduce", "reducescatter", "allgather"] if two_phase else ["allreduce"]


def _startup_probe(contention: ContentionProbe, cluster: Cluster, cfg: BenchConfig) -> tuple[ProbeFigures, Cluster]:
    """The contention probe's start-up figures, the runtimes' bucket passes and buffer broadcast (measured
    once: they are plain copies), and ``cluster`` with its all-reduce table anchored to the probe's all-reduce
    of every gradient (:func:`anchored_to_probe`): the plans, ``auto``'s included, are made from the table the
    predictions use (before, the anchor came after the rounds, so plans and predictions saw different tables);
    the figures are taken against the anchored table's times, as after the rounds."""
    reps = contention.start_reps
    contention.measure(reps)
    alone_s = statistics.median(contention.samples["allreduce_alone_s"])
    cluster, anchor = anchored_to_probe(cluster, contention.total_bytes, alone_s)
    cluster = with_stream_cost(cluster, contention.total_bytes, alone_s, os.cpu_count() or 1)
    copy_s, scale_s = contention.bucket_pass_s(reps)
    return {**contention.figures(cluster.cost("allreduce"), phase_costs(cluster)), "startup_reps": reps,
            "startup_anchor": anchor,
            "bucket_copy_s": copy_s, "bucket_scale_s": scale_s,
            "buffer_sync_s": contention.buffer_sync_s(reps, cfg.timeout_s)}, cluster


def _with_contention(cluster: Cluster, fitted: dict[str, float]) -> Cluster:
    return dataclasses.replace(cluster, contention=Contention(**fitted))


class _Resampling:
    """Between rounds, one more sample of each sampler (those with the fewest samples first) as long as
    the samples so far and that sampler's next one fit ``share`` of the rounds' time.

    ``samplers`` each take one sample and return the seconds it took.  Every rank
    decides alike: the times compared are the slowest rank's.  A sampler's next sample costs
    what its last one took; before its first, its ``first_estimates_s`` (the slowest rank's).  Each
    sampler on its own: the runtimes' overhead probe, where start-up left its rows to build and
    its warm-up rotation to run (a replay at 8 hosts: about 200 s for BERT-Large), no longer keeps
    the network table's and the contention probe's samples (tens of seconds) out, and, counted
    with them at the rotation's compute alone, no longer runs over the share (BERT-Large: one
    sample of 245 s where the share allowed 186 s over all its rounds)."""

    def __init__(self, samplers: list[Callable[[], float]], share: float, first_estimates_s: list[float],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.samplers, self.share, self._clock = samplers, share, clock
        self.count, self.spent_s, self.rounds_s = 0, 0.0, 0.0
        self._next_s = slowest(list(first_estimates_s))
        self.taken = [0] * len(samplers)  # samples each sampler took
        self._since = 0.0

    def start(self) -> None:
        """The rounds start now."""
        self._since = self._clock()

    def after_round(self, r: int) -> None:
        self.rounds_s += slowest([self._clock() - self._since])[0]
        sampled = False
        for i in sorted(range(len(self.samplers)), key=lambda k: self.taken[k]):  # the fewest samples first
            if self.share > 0 and self.spent_s + self._next_s[i] <= self.share * self.rounds_s:
                took = self.samplers[i]()
                self.spent_s += took
                self._next_s[i] = took
                self.taken[i] += 1
                sampled = True
        self.count += sampled
        self._since = self._clock()


class _RuntimeOverheads:
    """Per runtime, what a step of its simplest plan costs beyond the simulator's account of it.

    The probe's copies, divisions and buffer broadcast are timed on their own; a runtime
    adds more: Python per gradient hook and per operation (gradsched), the optimizer
    wrapper, waking the backend's threads between ranks in lock step.  Each runtime runs
    its plan with the least to schedule (gradsched: ``sync``, one all-reduce after
    backward; PyTorch DDP: its default buckets, as its rows run) in short bursts rotated
    with the compute-only step (:class:`_ComputeOnly`), timed as the rounds time a step.
    The overhead is the median over rotations of the runtime's burst less the
    compute-only burst beside it (paired, so that a slow phase of the machine cancels),
    less what the simulator adds to compute for that plan (from the profile scaled to
    the compute-only median and the costs measured so far); never negative.  On 2 local
    ranks (docs/simulator.md, "Fidelity"): 0-5.5 ms a step for gradsched, 0-12 ms for
    PyTorch DDP; with them the median prediction error fell from 5.4% to 3.9% in one run.
    Per operation, gradsched's Python costs more with more operations: the rotations
    also run ``wfbp`` to measure that (:meth:`op_host`), and the simulator charges it per
    operation, before the overhead, which is then what is left per step.
    :meth:`measure` runs more rotations (the bench's samples between rounds)."""

    ENTRIES = (BenchEntry(label="sync", strategy="sync", torch_ddp=False),
               BenchEntry(label="ddp", strategy="ddp", torch_ddp=True))
    # gradsched's runtime with one operation per tensor, beside its one-operation ``sync``:
    # the difference in host time per step, per extra operation, is the host time per
    # operation (:mod:`gradsched.torch.runtime.hosttime`); its step times are not used.
    MANY_OPS = BenchEntry(label="wfbp", strategy="wfbp", torch_ddp=False)
    STEPS = 2  # counted per burst; one more runs on each side (see _burst)

    def __init__(self, cfg: BenchConfig, profile: Profile, cluster: Cluster, probe: ProbeFigures,
                 shared: SharedModel) -> None:
        spec = shared.spec
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + 997 + dist.get_rank())
        self._batches = [spec.make_batch(cfg.batch_size, gen) for _ in range(4)]
        self._loss_fn = spec.loss_fn
        self._build = (cfg, profile, cluster, probe, shared)
        self.runs: list[tuple[Any, Any]] = []  # built with the first rotation where none runs at start-up
        self.bursts: list[list[float]] = [[] for _ in range(len(self.ENTRIES) + 2)]  # per run, each rotation's median
        self.host: list[tuple[float, float]] = []  # per rotation: (issue_s, retire_s) per operation
        self._warm = False
        self.rotation_s, self.setup_s = self._cost(probe)
        lo, hi = OVERHEAD_REPS
        lo = probe_floor(lo, self.rotation_s, least=0)  # the floor as before; its budget pays the warm-up too
        fit = int((_share(cfg, OVERHEAD_BUDGET_S) - self.setup_s) / max(self.rotation_s, 1e-6))
        self.start_reps = max(lo, min(hi, fit))
        if self.start_reps:  # else built by the first rotation, between the rounds
            self._built()

    def _built(self) -> None:
        """The runs: the compute-only step and each runtime's row, built and primed with one step (the warm-up
        rotation follows; on a slow dilated link those of three rows take half a minute: a start-up with no
        rotation leaves them to the first)."""
        if self.runs:
            return
        cfg, profile, cluster, probe, shared = self._build
        reference = _ComputeOnly(cfg, shared)
        self.runs = [(reference, reference)] + [
            _build_entry(e, cfg, with_runtime_costs(profile, probe, e.torch_ddp), cluster, shared,
                         (self._loss_fn, self._batches[0]), primed=1)  # the warm-up rotation follows
            for e in (*self.ENTRIES, self.MANY_OPS)]
        one_op, many_ops = self.runs[1][0], self.runs[-1][0]
        self._timers = (one_op.host_timer(), many_ops.host_timer())
        self.extra_ops = len(many_ops.plan.operations) - len(one_op.plan.operations)
        for t in self._timers:
            t.reset()  # the warm-up is not counted

    def _cost(self, probe: ProbeFigures) -> tuple[float, float]:
        """About what a rotation costs (slowest rank), and what precedes the first one not yet run.  A replay's:
        the compute-only run at the probe's step alone and each runtime's at its plan's simulated step
        (:func:`overhead_probe_s`; its warm-up waits for the first rotation: none may run at start-up);
        otherwise that of the warm-up rotation, run now."""
        if probe.get("host_work_hidden"):
            _, profile, cluster, _, _ = self._build  # the profile scaled to the probe's step
            compute_s = float(probe["compute_alone_s"])
            runs = [(e.strategy, e.torch_ddp) for e in (*self.ENTRIES, self.MANY_OPS)]
            steps = runtime_steps_s(profile, cluster, dict(probe), runs)
            rotation_s, setup_s = overhead_probe_s(compute_s, steps, self.STEPS)
            return slowest_median([rotation_s]), slowest_median([setup_s])
        return slowest_median([self._warm_up()]), 0.0

    def _warm_up(self) -> float:
        """One rotation off the clock (DDP builds its buckets), a replay's without its compute (:func:`fast_forward`:
        nothing reads its time); returns what it took on this rank."""
        self._warm = True
        self._built()
        with contextlib.ExitStack() as stack:
            for model, _ in self.runs:
                inner: Any = getattr(model, "module", model)  # a wrapper's module, or _ComputeOnly's
                stack.enter_context(fast_forward(inner))
            return sum(statistics.median(_burst(model, opt, self._loss_fn, self._batches, self.STEPS, 0))
                       for model, opt in self.runs) * (self.STEPS + 2)

    def measure(self, rotations: int) -> float:
        """``rotations`` more rotations; returns the seconds they took (slowest rank)."""
        t0 = time.perf_counter()
        if not self._warm:
            self._warm_up()
        step_s = _rotated_rounds(self.runs, self._loss_fn, self._batches, self.STEPS, rotations,
                                 first=len(self.bursts[0]), on_round=self._count_host)
        per_burst = step_s.reshape(len(self.runs), rotations, self.STEPS).median(dim=2).values
        for runs_bursts, new in zip(self.bursts, per_burst.tolist()):
            runs_bursts.extend(new)
        return slowest([time.perf_counter() - t0])[0]

    def _count_host(self, _round: int) -> None:
        """The rotation's host time per operation (slowest rank), and the timers restarted."""
        one, many = (t.per_pass() for t in self._timers)
        if self.extra_ops > 0:  # a model of one tensor has no extra operation to measure
            issue_s, retire_s = slowest([(many[k] - one[k]) / self.extra_ops for k in ("issue", "retire")])
            self.host.append((issue_s, retire_s))
        else:
            self.host.append((0.0, 0.0))
        for t in self._timers:
            t.reset()

    def op_host(self) -> dict[str, float]:
        """Host seconds per operation, issuing and retiring: the medians over every rotation so far (never negative;
        0 before the first)."""
        if not self.host:
            return {"issue_s": 0.0, "retire_s": 0.0}
        return {k: max(0.0, statistics.median(v)) for k, v in zip(("issue_s", "retire_s"), zip(*self.host))}

    def figures(self, profile: Profile, cluster: Cluster, probe: ProbeFigures) -> dict[str, float]:
        """Each runtime's overhead from every rotation so far, against ``profile`` and ``cluster``."""
        probe = {k: v for k, v in probe.items() if k != "runtime_overhead_s"}  # type: ignore[assignment]
        if not self.bursts[0]:  # no rotation yet (start-up left them to the samples between rounds): none counted
            return {runtime_name(e.torch_ddp): 0.0 for e in self.ENTRIES}
        compute_s = statistics.median(self.bursts[0])
        scaled = calibrate(profile, compute_s)
        out = {}
        for e, (model, _), bursts in zip(self.ENTRIES, self.runs[1:], self.bursts[1:]):
            # paired by rotation: a slow phase of the machine moves both bursts of a rotation alike
            extra = statistics.median(b - c for b, c in zip(bursts, self.bursts[0]))
            _, predicted = _predict(e, model, with_runtime_costs(scaled, probe, e.torch_ddp), cluster, profile)
            out[runtime_name(e.torch_ddp)] = max(0.0, extra - (predicted - compute_s))
        return out


def prime_steps(cfg: BenchConfig) -> int:
    """Steps a row is primed with when built: one where a warm-up round follows (its first burst runs PyTorch
    DDP's second step, where DDP rebuilds its buckets, off the count), else two.  On a dilated replay each is an
    all-reduce of every gradient on a slow link: googlenet-k80 at 50 Mbit/s, 9 s a step, 72 s for four rows."""
    return 1 if cfg.warmup_rounds > 0 else 2


def _build_entry(entry: BenchEntry, cfg: BenchConfig, profile: Profile, cluster: Cluster,
                 shared: SharedModel, prime: tuple[Any, Any] | None = None,
                 warmup: AutoWarmup | None = None, primed: int | None = None) -> tuple[Any, Any]:
    """One row: a copy of the rank's model (shared parameters and momentum, :mod:`.shared_model`), wrapped.

    Every row makes ``.grad`` a view of its buckets (PyTorch DDP's ``gradient_as_bucket_view``;
    gradsched's runtime does so wherever its plan allows), so that the buckets are all a row
    holds between its bursts, and released there; and none copies rank 0's parameters at
    start-up (``init_sync=False``: every rank built them from the same seed).  ``prime``, a loss
    function and a batch: ``primed`` steps (:func:`prime_steps` where None), off the clock, so that ``.grad``
    shows the buckets the runtime allocated at construction, released before the next row is built (run-time
    ``auto`` is not primed: its warm-up bursts count its iterations from the first).  A replay
    is primed without its compute (:func:`fast_forward`): nothing reads those steps' times.
    ``warmup``: run-time ``auto``'s, in situ or planned at start-up (:func:`auto_options`)."""
    module = shared.copy()
    primed = prime_steps(cfg) if primed is None else primed
    if entry.fsdp2:  # PyTorch's fully_shard per block: its own shards, no buckets of ours to release
        row = Fsdp2Row(module, profile, cfg.lr)
        if prime is not None:  # its lazy initialisation and first gathers off the clock, as the others' priming
            loss_fn, (x, y) = prime
            for _ in _fast_steps(module, primed):
                row.zero_grad()
                loss_fn(row(x), y).backward()
                row.step()
        return row, row
    common = {"profile": profile, "cluster": cluster, "timeout_s": cfg.timeout_s, "init_sync": False,
              "gradient_as_bucket_view": True}
    if entry.torch_ddp:
        model = DistributedDataParallel(module, "ddp", ddp_kwargs=entry.ddp_kwargs or None, **common)
    else:
        options = entry.options or None
        cap: dict[str, Any] = {}
        if entry.strategy == "auto":  # the rounds time the plan it settles on: its trials back to back, off the clock
            options = auto_options(options, warmup or AutoWarmup(True, 0.0, math.inf, 0))
            ddp_cap = _ddp_cap_mb(cfg)  # its PyTorch-DDP baseline: the bench's ddp row
            cap = {} if ddp_cap is None else {"bucket_cap_mb": ddp_cap}
        model = DistributedDataParallel(module, entry.strategy, plan_options=options, use_torch_ddp=False, **common,
                                        **cap)
    opt = DistributedOptimizer(shared.sgd(module, cfg.lr), model)
    track(model, module, opt)
    if prime is not None and getattr(model, "autotuner", None) is None:
        loss_fn, (x, y) = prime
        for _ in _fast_steps(module, primed):  # DDP rebuilds its buckets in its second step (else the warm-up round)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        model.synchronize()
        row_buffers(model).release()
    return model, opt


def _fast_steps(module: Any, steps: int) -> Any:
    """``range(steps)``, iterated with ``module``'s replayed compute taking no time (:func:`fast_forward`); its
    clocks restart after them (:func:`restart_clocks`): else the next timed piece hides the host's work since
    the last fast one (a dilated replay profiled right after its fast step measured VGG-16's forward at 0.5% of
    its time and put its convolutions' backward on the first layer's: predictions 27% high)."""
    with fast_forward(module):
        yield from range(steps)
    restart_clocks(module)


class _ComputeOnly:
    """The same training step with free communication: the rounds' measure of compute.

    Its own optimizer too (``zero_grad``/``step``): the step moves no gradients, but the
    ranks meet once per step, after backward, in a one-element all-reduce, as every
    synchronous step makes them.  That meeting is part of a step's compute: the step
    waits for the slower rank, and ranks that run in lock step compete for the machine
    in the same phases.  Measured on vgg, 2 local ranks: 295 ms a step synchronised
    against 265-271 ms free-running (docs/bench.md, "Rounds").

    Timed in the rounds beside the strategies (same batches, same machine phases), its
    median is the iteration with free communication; predictions and the lower bound
    are scaled to it (:func:`calibrate`), so that they do not inherit the drift of a
    profile taken minutes earlier.  The meeting's own all-reduce stays in: subtracting
    the network benchmark's time for it made every prediction worse (that benchmark's
    small all-reduces, each behind a barrier, cost more than one between ranks in lock
    step: 0.6 ms on loopback, against mlp's 1.5 ms synchronised step)."""

    label = "compute only"

    def __init__(self, cfg: BenchConfig, shared: SharedModel) -> None:
        self.module = shared.copy()
        self.optimizer = shared.sgd(self.module, cfg.lr)
        self._meet = torch.zeros(1)
        track(self, self.module)

    def __call__(self, x: Any) -> Any:
        return self.module(x)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        dist.all_reduce(self._meet)  # where a synchronous step waits for the slowest rank
        self.optimizer.step()

    def synchronize(self) -> None:
        pass


# torch 2.13's DDP gives a 1 MiB first bucket only where bucket_cap_mb is its default (its _BucketCapacityConfig)
_EXPLICIT_CAP_NO_FIRST_BUCKET = hasattr(torch.nn.parallel.distributed, "_BucketCapacityConfig")


def _predict(entry: BenchEntry, model: Any, profile: Profile, cluster: Cluster,
             planned_with: Profile) -> tuple[Plan, float]:
    """The entry's plan (DDP rows: the ``ddp`` planner as DDP would bucket) and its simulated iteration."""
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    if entry.torch_ddp:
        kw = entry.ddp_kwargs or {}
        plan = make_plan("ddp", planned_with, cluster, bucket_cap_mb=float(kw.get("bucket_cap_mb", 25.0)),
                         first_bucket_mb=ddp_first_bucket_mb(kw, _EXPLICIT_CAP_NO_FIRST_BUCKET))
    else:
        plan = model.plan
    return plan, simulate(plan, profile, cluster, timeline=False).iteration_s


def _burst(model: Any, opt: Any, spec_loss: Any, batches: list[Any], steps: int, offset: int,
           until: Callable[[], bool] | None = None) -> list[float]:
    """``steps`` steady-state training steps: seconds from each step's start to the next one's.

    One step more runs before and after the counted ones, off the clock: the first
    step after the barrier has no communication of an earlier step still in flight
    (too fast for a plan that overlaps the next forward) and the last one has no next
    forward to hide its communication behind (too slow); training is neither.  ``until``: no
    step starts once it holds (it must hold on every rank alike: run-time ``auto``'s ``done``)."""
    buffers = row_buffers(model)
    if buffers is not None:  # the row's buckets, released after its last burst (shared_model.RowBuffers)
        buffers.restore()
    dist.barrier()
    starts = []
    for k in range(steps + 2):
        if until is not None and until():
            break
        starts.append(time.perf_counter())
        x, y = batches[(offset + k) % len(batches)]
        opt.zero_grad()
        spec_loss(model(x), y).backward()
        opt.step()
    model.synchronize()
    if buffers is not None:
        buffers.release()
    starts = starts[1:]  # steps 1 .. steps: each ends where the next one starts
    return [b - a for a, b in zip(starts, starts[1:])]


def _rotated_rounds(runs: list[tuple[Any, Any]], loss_fn: Any, batches: list[Any], steps: int, rounds: int,
                    on_burst: Callable[[int, int], None] | None = None,
                    on_round: Callable[[int], None] | None = None, first: int = 0) -> torch.Tensor:
    """Seconds of every counted step, ``(len(runs), rounds * steps)``: in round ``r`` each run
    does a :func:`_burst`, in an order rotated by ``r`` so that slow phases of the machine hit
    all alike (rounds counted from ``first``, for rounds run a few at a time).  ``on_burst(r,
    i)`` after each burst, ``on_round(r)`` after each round.  A collective call: every rank
    runs it.

    A step's time is the ranks' mean.  Training (compute only too) couples the ranks, so over
    a burst every rank takes the same time, but a rank's step (zero_grad to zero_grad) need
    not line up with the others': under a plan that overlaps the next forward one rank's long
    step is another's short one, and a per-step maximum would count the long one twice."""
    times: list[list[float]] = [[] for _ in runs]
    for r in range(first, first + rounds):
        shift = r % len(runs)
        for i in list(range(len(runs)))[shift:] + list(range(len(runs)))[:shift]:
            model, opt = runs[i]
            times[i].extend(_burst(model, opt, loss_fn, batches, steps, r * steps))
            if on_burst is not None:
                on_burst(r, i)
        if on_round is not None:
            on_round(r)
    flat = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return flat / dist.get_world_size()


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


def _start(cfg: BenchConfig, shared: SharedModel, phases: Phases) -> _Start:
    """Steps 1-3 of the module docstring: profile, network table, contention and overhead probes."""
    profile = _measure_profile(cfg, shared)
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


def update_call_s(module: torch.nn.Module, lr: float, reps: int = 20) -> float:
    """Seconds of one deferred update of an overlapping plan (``op_host.update_call_s``): the bench's optimizer
    (SGD, momentum 0.9) stepping copies of one layer's parameters, timed with every rank at it at once (so that
    ranks sharing cores count what they cost each other), the slowest rank's mean over ``reps`` calls.  A
    collective call."""
    owner = next((m for m in module.modules() if any(True for _ in m.parameters(recurse=False))), None)
    if owner is None:
        return 0.0
    params = [torch.nn.Parameter(p.detach().clone()) for p in owner.parameters(recurse=False)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    opt.step()  # its momentum buffers made off the clock
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        opt.step()
    return slowest([(time.perf_counter() - t0) / reps])[0]


def _auto_warmup(entry: BenchEntry, cfg: BenchConfig, start: _Start) -> AutoWarmup | None:
    """Run-time ``auto``'s warm-up in situ, or ``auto`` planned at start-up (:func:`auto_warmup`): the same
    decision on every rank (from the broadcast profile and cluster)."""
    if entry.torch_ddp or entry.fsdp2 or entry.strategy != "auto":
        return None
    from gradsched.tuning.config import AutoTuneConfig

    replay = bool(start.probe.get("host_work_hidden")) if start.probe else cfg.model.startswith("replay:")
    ddp_cap = _ddp_cap_mb(cfg)
    begin = replay_start(entry.options, ddp_cap) if replay else {}
    options = {"trial_share": 0, **begin, **(entry.options or {})}
    try:
        config = AutoTuneConfig.from_options(options)
    except Exception:  # noqa: BLE001 - the wrapper reports a bad option itself, as before
        return None
    bound_s = lower_bound_s(start.profile, start.cluster)["lower_bound_s"]
    if not config.adaptive:
        return auto_warmup(0, bound_s, entry.options, replay)
    ddp_options = {} if ddp_cap is None else {"bucket_cap_mb": ddp_cap, "first_bucket_mb": ddp_cap}
    speeds = (_simulated_s(config.initial, start, config.initial_options, torch_ddp=False),
              _simulated_s("ddp", start, ddp_options))  # the trials' baseline: the bench's ddp row
    iterations, seconds = _warmup_s(config, speeds, bound_s)
    full = dataclasses.replace(auto_warmup(iterations, seconds / iterations, entry.options, replay), start=begin)
    if full.in_situ or not replay or not may_shorten(entry.options):
        return full
    iterations, seconds = _warmup_s(AutoTuneConfig.from_options({**options, **SHORT_WARMUP}), speeds, bound_s)
    short = shorter(full, auto_warmup(iterations, seconds / iterations, entry.options, replay))
    return dataclasses.replace(short, start=begin)


def _ddp_cap_mb(cfg: BenchConfig) -> float | None:
    """The ``bucket_cap_mb`` the bench's ``ddp`` row (PyTorch DDP's default buckets, byte-scaled: 25 MB / S) is
    built with, None where it is DDP's default: run-time ``auto``'s baseline in its trials is the same DDP."""
    row = next((e for e in cfg.entries if e.torch_ddp and e.label == "ddp"), None)
    cap = (row.ddp_kwargs or {}).get("bucket_cap_mb") if row is not None else None
    return None if cap is None else float(cap)


def _warmup_s(config: Any, speeds: tuple[float, float], bound_s: float) -> tuple[int, float]:
    """Run-time ``auto``'s warm-up under ``config`` (an ``AutoTuneConfig``): its iterations and their wall seconds
    (:func:`warmup_estimate_s`), its initial plan and PyTorch DDP's default buckets at ``speeds``."""
    window = config.window_for(bound_s)
    iterations = config.tuning_iterations_for(window)
    first = initial_iterations(config.switch_iteration, config.trial_rounds, window, config.trials > 1)
    return iterations, warmup_estimate_s(iterations, first, speeds[0], speeds[1], bound_s)


def _simulated_s(strategy: str, start: _Start, options: dict[str, Any], torch_ddp: bool | None = None) -> float:
    """``strategy``'s simulated iteration on the bench's profile (with its runtime's costs: PyTorch DDP's for
    ``ddp`` unless ``torch_ddp`` is False, gradsched's executor's otherwise) and cluster.  0 where it cannot be
    planned (the estimate then uses the bound)."""
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    torch_ddp = strategy == "ddp" if torch_ddp is None else torch_ddp
    profile = with_runtime_costs(start.profile, start.probe, torch_ddp)
    try:
        plan = make_plan(strategy, profile, start.cluster, **options)
        return simulate(plan, profile, start.cluster, timeline=False).iteration_s
    except Exception:  # noqa: BLE001 - an estimate only; the bound stands in
        return 0.0


def _build_rows(cfg: BenchConfig, start: _Start, shared: SharedModel, loss_fn: Any,
                batches: list[Any]) -> tuple[list[tuple[Any, Any]], float]:
    """Step 4: one row at a time, built, primed or warmed up, its buckets released before the next is built;
    the compute-only step last.  Returns the runs and the seconds of run-time ``auto``'s warm-up among them
    (its own phase, not start-up; in situ where it fits :data:`gradsched.jobs.startup.AUTO_WARMUP_S`, else
    ``auto`` is planned at start-up)."""
    runs, warmup_s = [], 0.0
    for entry in cfg.entries:
        warmup = start.auto_warmups.get(entry.label) or _auto_warmup(entry, cfg, start)  # decided with the budget
        if warmup is not None:
            start.auto_warmups[entry.label] = warmup
        model, opt = _build_entry(entry, cfg, with_runtime_costs(start.profile, start.probe, entry.torch_ddp),
                                  start.cluster, shared, (loss_fn, batches[0]), warmup)
        runs.append((model, opt))
        # Run-time ``auto`` (gradsched.torch.runtime.autotune) profiles itself under a safe default for its
        # first iterations, then switches plans: let it do so off the clock, so that the rounds
        # measure the plan it settled on (later re-plans, if any, are part of what it costs).
        tuner = getattr(model, "autotuner", None)
        if tuner is not None:
            t0 = time.perf_counter()
            auto_warm_up(tuner, lambda steps, until: _burst(model, opt, loss_fn, batches, steps, 0, until))
            warmup_s += time.perf_counter() - t0
    reference = _ComputeOnly(cfg, shared)
    runs.append((reference, reference))  # timed last in every round's rotation of the entries
    return runs, warmup_s


def _budget_after_startup(cfg: BenchConfig, start: _Start, phases: Phases) -> tuple[BenchConfig, Any]:
    """The bench fitted to its 15-minute budget again (:func:`gradsched.jobs.budget.after_startup`) with what the
    start-up measured: its phases so far, run-time ``auto``'s warm-up where it runs in situ (decided here, as
    :func:`_build_rows` builds it), and the probe's step and all-reduce of every gradient alone.  Where a budget
    applies (``cfg.budget``: a replay on the testbed); rank 0 decides, every rank follows.  Returns the config
    the rows and rounds run and the :class:`~gradsched.jobs.budget.Trim` (None: no budget)."""
    from gradsched.jobs import budget

    if not cfg.budget:
        return cfg, None
    for entry in cfg.entries:
        warmup = _auto_warmup(entry, cfg, start)
        if warmup is not None:
            start.auto_warmups[entry.label] = warmup
    probe, total = start.probe or {}, start.profile.total_bytes
    measured = budget.Measured(
        startup_s=sum(r["s"] for r in phases.records),
        warmup_s=sum(w.estimated_s for w in start.auto_warmups.values() if w.in_situ),
        compute_s=float(probe.get("compute_alone_s", start.profile.compute_s)),
        allreduce_s=float(probe.get("allreduce_alone_s", start.cluster.cost("allreduce").time_s(total))))
    out = budget.after_startup(cfg.entries, total, measured, budget.Given.from_dict(cfg.budget), steps=cfg.steps,
                               warmup_steps=cfg.warmup_steps, rounds=cfg.rounds, warmup_rounds=cfg.warmup_rounds,
                               min_rounds=cfg.min_rounds, share=cfg.resample_share) if dist.get_rank() == 0 else None
    out = _broadcast(out)
    if dist.get_rank() == 0:
        for line in budget.Given.from_dict(cfg.budget).lines(out):
            print(f"[bench] {line}", file=sys.stderr, flush=True)
    return dataclasses.replace(cfg, entries=out.entries, steps=out.steps, warmup_steps=out.warmup_steps,
                               rounds=out.rounds), out


def auto_warm_up(tuner: Any, burst: Callable[[int, Callable[[], bool] | None], Any]) -> None:
    """Run-time ``auto``'s warm-up off the clock: profiling, the switch, the trials and every re-plan check that
    :attr:`~gradsched.torch.runtime.autotune.AutoTuner.tuning_iterations` schedules, in two bursts
    (``burst(steps, until)``: :func:`_burst`); the first plan sets the trials' window length (the same on every
    rank), hence a first burst to it.  The second stops early once the tuner has nothing left to decide
    (:attr:`~gradsched.torch.runtime.autotune.AutoTuner.done`, the same on every rank: settled on PyTorch's DDP,
    where no check follows; both 8-host runs settled at iteration 62 of 108 and ran the rest, about 25 s)."""
    first = tuner.config.switch_iteration + 1
    burst(first, None)
    burst(tuner.tuning_iterations - first, lambda: tuner.done)


def _timed_rounds(cfg: BenchConfig, runs: list[tuple[Any, Any]], loss_fn: Any, batches: list[Any],
                  samplers: _Resampling | None) -> tuple[list[list[list[float]]], dict[str, Any]]:
    """Step 5: every run's step times, per round, until ``--rounds`` or the stopping rule
    (:class:`gradsched.jobs.rounds.StoppingRule`, the same decision on every rank); and the rule's record.
    A replay's warm-up rounds skip their compute (:func:`_warm_up_round`).  Rank 0 shows a progress bar."""
    labels = [e.label for e in cfg.entries] + [_ComputeOnly.label]
    bar = None
    if dist.get_rank() == 0 and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.rounds * len(runs) * cfg.steps, desc=f"bench {cfg.label or cfg.model} x{dist.get_world_size()}",
                   unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_burst(r: int, i: int) -> None:
        if bar is not None:
            bar.set_postfix_str(f"round {r + 1}/{cfg.rounds} {labels[i]}", refresh=False)
            bar.update(cfg.steps)

    rule = StoppingRule(cfg.round_tol, cfg.min_rounds, cfg.warmup_rounds)
    times: list[list[list[float]]] = [[] for _ in runs]
    if samplers is not None:
        samplers.start()
    for r in range(cfg.rounds):
        steps = cfg.warmup_steps or cfg.steps if r < cfg.warmup_rounds else cfg.steps  # fewer: gradsched.jobs.budget
        with _warm_up_round(runs, r < cfg.warmup_rounds and cfg.model.startswith(REPLAY_PREFIX)):
            step_s = _rotated_rounds(runs, loss_fn, batches, steps, 1, on_burst,
                                     samplers.after_round if samplers is not None else None, first=r)
        for run_times, new in zip(times, step_s.tolist()):
            run_times.append(new)
        settled = torch.tensor([1 if rule.settled(times) else 0])
        dist.broadcast(settled, 0)  # rank 0's decision: every rank stops at the same round
        if settled.item():
            break
    if bar is not None:
        bar.close()
    return times, rule.record(times, cfg.rounds)


@contextlib.contextmanager
def _warm_up_round(runs: list[tuple[Any, Any]], skip_compute: bool) -> Iterator[None]:
    """A replay's warm-up round (``skip_compute``): its rows' replayed compute takes no time
    (:func:`fast_forward`: nothing reads those steps' times, DDP's buckets and the caches warm up all the
    same), but a row that tunes itself at run time (in-situ ``auto``, whose tuner reads them); every clock
    restarts after it.  Else as it is."""
    if not skip_compute:
        yield
        return
    modules = [getattr(model, "module", model) for model, _ in runs if getattr(model, "autotuner", None) is None]
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(fast_forward(module))
        yield
    for module in modules:
        restart_clocks(module)


def _pooled(start: _Start, cfg: BenchConfig) -> tuple[ProbeFigures | None, Cluster]:
    """Rank 0, after the rounds: the probe's figures and the cluster from the medians over every sample,
    start-up and between rounds (the predictions use them), pooled with earlier jobs' figures."""
    probe, samplers = start.probe, start.samplers
    if samplers is None or probe is None:
        return probe, start.cluster
    assert start.network is not None and start.contention is not None and start.overheads is not None
    alone_s = statistics.median(start.contention.samples["allreduce_alone_s"])
    pooled, anchor = anchored_to_probe(start.network.pooled(), start.contention.total_bytes, alone_s)
    pooled = with_stream_cost(pooled, start.contention.total_bytes, alone_s, os.cpu_count() or 1)
    probe = {**probe, **start.contention.figures(pooled.cost("allreduce"), phase_costs(pooled)),
             "allreduce_anchor": anchor,
             "startup_fitted": probe["fitted"],
             "startup_runtime_overhead_s": probe["runtime_overhead_s"], "startup_op_host": probe["op_host"],
             "op_host": start.overheads.op_host(), "op_host_samples": start.overheads.host,
             "resamples": samplers.taken[1], "resample_s": samplers.spent_s,  # the contention probe's samples
             "resamples_each": dict(zip(("network", "contention", "overheads"), samplers.taken))}
    if start.history:  # what the predictions use; this job's own beside it, for later jobs to pool
        probe.update(own_fitted=probe["fitted"], history=start.history,
                     fitted=pooled_contention(probe["fitted"], cfg.contention_history, cfg.dilate))
    cluster = _with_contention(pooled, probe["fitted"])
    probe["runtime_overhead_s"] = start.overheads.figures(start.profile, cluster, probe)
    return probe, cluster


def _counted(rounds: list[list[float]], warm: int) -> list[float]:
    """Every counted step's seconds (all of them where no round is counted)."""
    return [s for steps in (rounds[warm:] or rounds) for s in steps]


def _row(entry: BenchEntry, run: tuple[Any, Any], rounds: list[list[float]], cfg: BenchConfig,
         predicted: tuple[Plan, float], bound: dict[str, float], warmup: AutoWarmup | None = None) -> BenchRow:
    """One entry's figures (the speed-ups are added once every row is known); ``rounds``: per round, per step."""
    plan, predicted_s = predicted
    warm = cfg.warmup_rounds
    counted = _counted(rounds, warm)
    median = statistics.median(counted)
    row: BenchRow = {
        "strategy": entry.label,
        "runs": "torch FSDP2" if entry.fsdp2 else runtime_name(entry.torch_ddp),
        "iteration_s_median": median, "iteration_s_mean": statistics.fmean(counted),
        "predicted_iteration_s": predicted_s, "prediction_error": (predicted_s - median) / median,
        "lower_bound_s": bound["lower_bound_s"], "vs_lower_bound": median / bound["lower_bound_s"],
        "contention_bound_s": bound["contention_bound_s"],
        "vs_contention_bound": median / bound["contention_bound_s"],
        "operations": len(plan.operations), "plan_hash": plan.hash,
        "step_s": rounds, "warmup_rounds": warm}
    if entry.torch_ddp:
        row["bucket_cap_mb"] = (entry.ddp_kwargs or {}).get("bucket_cap_mb", 25.0)
    else:
        row["plan_options"] = plan.options  # type: ignore[typeddict-item]
    tuner = getattr(run[0], "autotuner", None)
    if tuner is not None:
        row["autotune"] = tuner.summary()  # type: ignore[typeddict-item]
    if warmup is not None:
        row["auto_warmup"] = warmup.to_dict()  # type: ignore[typeddict-item]
    return row


def _with_speedups(rows: list[BenchRow]) -> str | None:
    """Each row's speed-up over PyTorch DDP's default and its best bucket size; returns the best's name."""
    ref = next((r["iteration_s_median"] for r in rows if r["strategy"] == "ddp"), None)
    ddp_rows = [r for r in rows if r["runs"] == "torch DDP"]
    best = min(ddp_rows, key=lambda r: r["iteration_s_median"]) if ddp_rows else None
    for row in rows:
        row["speedup_vs_ddp"] = ref / row["iteration_s_median"] if ref else None
        row["speedup_vs_best_ddp"] = best["iteration_s_median"] / row["iteration_s_median"] if best else None
    return best["strategy"] if best else None


def _result(cfg: BenchConfig, start: _Start, runs: list[tuple[Any, Any]], times: list[list[list[float]]],
            phases: Phases) -> BenchResult:
    """Step 6, rank 0: predictions, the bound and every row, in run seconds (the command converts)."""
    probe, cluster = _pooled(start, cfg)
    ref_steps = times[-1]
    compute_only_s = statistics.median(_counted(ref_steps, cfg.warmup_rounds))
    planned_with = start.profile
    profile = calibrate(planned_with, compute_only_s)  # predictions and the bound: the compute of the rounds
    bound = lower_bound_s(profile, cluster)
    rows = [_row(entry, runs[i], times[i], cfg,
                 _predict(entry, runs[i][0], with_runtime_costs(profile, probe, entry.torch_ddp), cluster,
                          planned_with), bound, start.auto_warmups.get(entry.label))
            for i, entry in enumerate(cfg.entries)]
    best_ddp = _with_speedups(rows)
    return {"rows": rows, "profile": {"compute_s": profile.compute_s, "forward_s": profile.forward_s,
                                      "backward_s": profile.backward_s, "other_s": profile.other_s,
                                      "total_bytes": profile.total_bytes, "tensors": profile.num_tensors,
                                      "hooked_compute_s": start.hooked.compute_s,
                                      "planned_compute_s": planned_with.compute_s, "measured": profile.to_dict()},
            "compute_only": {"iteration_s_median": compute_only_s,
                             "step_s": ref_steps},
            "cluster": cluster.to_dict(), "lower_bound": bound, "contention": probe,  # type: ignore[typeddict-item]
            "best_ddp": best_ddp, "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "machine": f"{this_machine()}, torch {torch.__version__}",
            "peak_rss_bytes": phases.records[-1]["peak_rss_bytes"], "phases": phases.records,
            "job_s": 0.0}


def run_bench(cfg: BenchConfig) -> BenchResult | None:
    """The whole job on this rank (``cfg``: the config.json ``gradsched bench`` wrote); rank 0
    returns the result in run seconds, the others None."""
    if not isinstance(cfg, BenchConfig):  # the raw JSON, as before
        cfg = BenchConfig.from_dict(cfg)
    t_start = time.time()
    phases = Phases()
    shared = SharedModel(cfg.model, cfg.seed)  # the rank's one model: every row shares its parameters
    start = _start(cfg, shared, phases)
    cfg, trimmed = _budget_after_startup(cfg, start, phases)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + dist.get_rank())
    batches = [shared.spec.make_batch(cfg.batch_size, gen) for _ in range(4)]
    runs, warmup_s = _build_rows(cfg, start, shared, shared.spec.loss_fn, batches)
    if start.auto_warmups:  # the same on every rank (a collective): auto's rows are everyone's
        phases.end_apart("rows (built, primed)", AUTO_WARMUP_PHASE, warmup_s)
    else:
        phases.end("rows (built, primed)")
    times, stopping = _timed_rounds(cfg, runs, shared.spec.loss_fn, batches, start.samplers)
    phases.end("rounds")  # its peak RSS is the largest rank's over the whole job: what check_memory allows for
    if dist.get_rank() != 0:
        return None
    result = _result(cfg, start, runs, times, phases)
    result["stopping"] = stopping  # type: ignore[typeddict-item]
    if trimmed is not None:  # what the rows and rounds ran, fitted after start-up
        result["trimmed"] = {**trimmed.to_dict(), "at": "start-up"}  # type: ignore[typeddict-item]
    result["job_s"] = time.time() - t_start
    return result


def main(argv: list[str] | None = None) -> int:
    return run_worker(BenchConfig.from_dict, run_bench, "bench.json", argv)


if __name__ == "__main__":
    from gradsched.torch.runtime.shutdown import leave

    leave(main())  # skip interpreter finalisation: see gradsched.torch.runtime.shutdown
