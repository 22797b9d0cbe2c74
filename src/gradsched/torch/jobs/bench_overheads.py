"""Step 3 of the bench's job (:mod:`gradsched.torch.jobs.bench_worker`): the start-up probes and their samples.

The contention probe's start-up figures (:func:`_startup_probe`), each runtime's own overhead per step and
gradsched's host time per operation (:class:`_RuntimeOverheads`), one deferred update's host time
(:func:`update_call_s`), the start-up probes' share of ``--probe-s`` (:func:`_share`), and the samples taken
again between rounds within ``resample_share`` of the rounds' time (:class:`_Resampling`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from gradsched.calibration import calibrate, phase_costs, runtime_name, with_runtime_costs
from gradsched.jobs.bench import anchored_to_probe, probe_alone_s, with_phase_ratios, with_stream_cost
from gradsched.jobs.config import BenchConfig, BenchEntry
from gradsched.jobs.startup import overhead_probe_s, probe_floor, runtime_steps_s
from gradsched.jobs.results import Contention as ProbeFigures  # the probe's figures (the cluster's Contention below)
from gradsched.cluster import Cluster, Contention
from gradsched.profile import Profile
from gradsched.torch.jobs.bench_rows import _build_entry, _burst, _ComputeOnly, _predict, _rotated_rounds
from gradsched.torch.jobs.replay import fast_forward
from gradsched.torch.jobs.shared_model import SharedModel
from gradsched.torch.measure.probe import PROBE_BUDGET_S, ContentionProbe, slowest, slowest_median


OVERHEAD_BUDGET_S = 12.0  # the runtimes' overhead probe takes about this long (by default) ...
OVERHEAD_REPS = (2, 20)  # ... in this many rotations of short bursts (at least 2: slow steps; resampled later;
# none where 2 take minutes: gradsched.jobs.startup.probe_floor)


def _share(cfg: BenchConfig, default_s: float) -> float:
    """One start-up probe's part of ``--probe-s``, in the proportion of the default budgets."""
    return cfg.probe_s * default_s / (PROBE_BUDGET_S + OVERHEAD_BUDGET_S)


def _startup_probe(contention: ContentionProbe, cluster: Cluster, cfg: BenchConfig) -> tuple[ProbeFigures, Cluster]:
    """The contention probe's start-up figures, the runtimes' bucket passes and buffer broadcast (measured
    once: they are plain copies), and ``cluster`` with its all-reduce table anchored to the probe's all-reduce
    of every gradient (:func:`anchored_to_probe`): the plans, ``auto``'s included, are made from the table the
    predictions use (before, the anchor came after the rounds, so plans and predictions saw different tables);
    the figures are taken against the anchored table's times, as after the rounds."""
    reps = contention.start_reps
    contention.measure(reps)
    alone_s = probe_alone_s(contention.samples["allreduce_alone_s"], cluster.world_size, os.cpu_count() or 1)
    cluster, anchor = anchored_to_probe(cluster, contention.total_bytes, alone_s)
    cluster = with_phase_ratios(with_stream_cost(cluster, contention.total_bytes, alone_s, os.cpu_count() or 1))
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
