"""What ``gradsched bench`` measures of the machine besides the profile, sampled again and again.

Two samplers, both collective calls (every rank runs them, with the same arguments):

- :class:`ContentionProbe`: a training step alone and while a queue of all-reduces of
  all gradients keeps communication busy; one such all-reduce alone and while steps
  run back to back; a burst of small all-reduces alone and with compute busy.
  :meth:`ContentionProbe.figures` turns the medians into the simulator's contention
  figures (:func:`contention_from_probe`).  Where the job runs two-phase rows (``two_phase``),
  also one reduce-scatter (as the runtime runs it) and one all-gather of all gradients, each
  alone and while steps run: their own communication slowdowns (:func:`phase_slowdowns`).  It also times what a runtime's hooks do
  to every gradient (a copy into a bucket, a division) and the broadcast of the
  model's buffers before every forward.
- :class:`NetworkResampler`: the all-reduce table's latency-bound sizes (4 KiB to
  4 MiB), timed once more; :meth:`NetworkResampler.pooled` gives the cluster with
  each of those sizes at its median over every sample.

Why sample more than once: the bench measures these at start-up, then spends minutes
in its rounds, and the machine's speed for small operations drifts through a job.
One start-up measurement moved every many-operation prediction by 10-25% from one
job to the next (``cnn``'s ``wfbp`` -8%, 0%, -24%, +8% in four jobs), while the
measured rows moved much less.  So the bench samples both again between its rounds
(and its runtime-overhead rotations), within a share of the rounds' time, and predicts
from the medians over all samples: over five jobs re-simulated both ways, the median
error went from 5.8% with the start-up figures to 4.9% (docs/simulator.md, "Fidelity").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
import time
from typing import Any, Callable, ContextManager, Protocol

import torch
import torch.distributed as dist

from gradsched.calibration import contention_from_probe, median_se, phase_slowdowns
from gradsched.cluster import Cluster, CollectiveCost
from gradsched.jobs.startup import probe_floor
from gradsched.net_extend import extend_points
from gradsched.net_extend import MAX_RUN, operations_for
from gradsched.torch.measure.netbench import measure_points
from gradsched.torch.runtime.decoupled import scratch_for, start_all_gather, start_reduce_scatter, sum_pieces
from gradsched.torch.runtime.memory import trim_heap
from gradsched.torch.runtime.wrapper import broadcast_buffers


class TrainableModel(Protocol):
    """What the probe times: a model with its data and loss (a ``gradsched.torch.jobs.models.ModelSpec``)."""

    module: torch.nn.Module
    make_batch: Callable[[int, torch.Generator], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]


SMALL_OPS = 8  # the busy-latency probe: this many all-reduces ...
SMALL_NUMEL = 1024  # ... of 4 KiB each, issued at once as the runtime issues ready operations
PROBE_BUDGET_S = 10.0  # the start-up contention probe takes about this long ...
PROBE_REPS = (3, 30)  # ... with at least and at most this many repetitions (3: a replay at dilation 20 steps in
# seconds, 5 repetitions took minutes of start-up; its figures are sampled again between the rounds and pooled)
COPY_CHUNK_NUMEL = 1 << 24  # the bucket pass's source of ones, before it copied the buffer onto itself (64 MiB)
ONE_WINDOW_MARGIN = 1.1  # an all-reduce of every gradient this much longer than a step: both overlapped times in
# one window (ContentionProbe._window), the step behind it checked to have ended first
PHASES = ("reducescatter", "allgather")  # the two-phase collectives the probe times where ``two_phase``
RESAMPLE_MAX_BYTES = 4 << 20  # the network sizes sampled again: the latency-bound ones, whose times drift most


def _grow(t: torch.Tensor) -> None:
    """``t``'s storage back to ``t``'s size where :meth:`ContentionProbe._release` shrank it, contents undefined.
    Not where it is that size already: ``resize_`` allocates and copies even to the same size, so the first
    restore, just after the buffers were made, held the all-gradients buffer twice for a moment (LLaMA-7B at
    S = 128 on 2 hosts: the job's peak, 1.18 GB a rank, in the probe's start: docs/notes/2026-12-mem13.md)."""
    nbytes = t.numel() * t.element_size()
    if t.untyped_storage().nbytes() != nbytes:
        t.untyped_storage().resize_(nbytes)


def slowest(per_rep: list[float]) -> list[float]:
    """Each repetition's slowest rank (a collective call: every rank passes its own times)."""
    t = torch.tensor(per_rep, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def slowest_median(per_rep: list[float]) -> float:
    """The median over repetitions of the slowest rank's time (a collective call)."""
    return statistics.median(slowest(per_rep))


def probe_reps(step_s: float, allreduce_s: float, budget_s: float = PROBE_BUDGET_S, phase_ops: int = 0) -> int:
    """Repetitions of the start-up probe: as many as fit ``budget_s`` (:data:`PROBE_BUDGET_S`), within
    :data:`PROBE_REPS`.  A repetition runs about three steps and two all-reduces of all
    gradients.  Millisecond-scale models get the most: their figures are the noisiest (on
    cnn, 5 repetitions gave a compute slowdown of 0.52 in one job and 0.03 in the next).
    Where the fewest would take more than :data:`gradsched.jobs.startup.FULL_FLOOR_S` (a
    replay at a high dilation), one: the figures are sampled again between the rounds.  ``phase_ops``: the
    reduce-scatters and all-gathers a repetition also runs (``two_phase``), each about an all-reduce's time:
    counted against the budget, not the floor (the all-reduce's figures keep their fewest repetitions: on
    googlenet-k80 at 4 hosts and ``--dilate 2`` counting them there left one, where three had run)."""
    lo, hi = PROBE_REPS
    lo = probe_floor(lo, 3 * step_s + 2 * allreduce_s, least=1)  # one where the floor would take minutes
    per_rep = 3 * step_s + (2 + phase_ops) * allreduce_s
    return max(lo, min(hi, int(budget_s / max(per_rep, 1e-6))))


class ContentionProbe:
    """Compute and communication, each alone and while the other keeps the cores busy.

    "Compute" is a whole training step without communication (zero_grad, forward,
    backward, optimizer step), timed as the rounds time a step: the slowest rank's
    time per repetition.  Each slowdown is measured with the other side busy for the
    whole measurement (compute behind a queue of all-reduces; an all-reduce while steps
    run back to back), so it is a plain ratio.  The communication side divides by the
    cluster's times for the same operations, not by the probe's own: those are the
    times the simulator stretches, and one all-reduce of 1-2 MB alone measured 0.9-3.6
    ms from one job to the next (the same one during compute 7-11 ms), which moved the
    slowdown between 1 and 8.  Every repetition runs all six measurements, so that
    :meth:`measure` can be called again between the bench's rounds and the samples
    pooled."""

    TIMES = ("compute_alone_s", "allreduce_alone_s", "compute_overlapped_s", "allreduce_overlapped_s",
             "small_ops_alone_s", "small_ops_busy_s")

    def __init__(self, spec: "TrainableModel", total_bytes: int, *, lr: float, seed: int, batch_size: int,
                 budget_s: float = PROBE_BUDGET_S, optimizer: torch.optim.Optimizer | None = None,
                 off_clock: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
                 step_s: float | None = None, restart: Callable[[], None] = lambda: None,
                 allreduce_s: float | None = None, two_phase: bool = False) -> None:
        self.module, self._loss_fn = spec.module, spec.loss_fn
        self.two_phase = two_phase  # also a reduce-scatter and an all-gather of all gradients, alone and busy
        self._restart = restart  # called before each measurement: a replay's clock forgets what ran meanwhile
        self._opt = optimizer if optimizer is not None else torch.optim.SGD(self.module.parameters(), lr=lr,
                                                                            momentum=0.9)
        gen = torch.Generator().manual_seed(seed * 1000 + 998)
        self._x, self._y = spec.make_batch(batch_size, gen)
        self.total_bytes = total_bytes
        self._big = torch.zeros(max(1, total_bytes // 4))  # all-reduced; the step's gradients too (_restore)
        self._smalls = [torch.zeros(SMALL_NUMEL) for _ in range(SMALL_OPS)]
        world = dist.get_world_size()
        # the reduce-scatter's p pieces (gloo but on two ranks: an all-to-all, as the runtime) and this rank's shard,
        # only where the job times the two phases (else 1/p of the gradients held for nothing at every restore)
        self._pieces, self._shard = torch.zeros(0), torch.zeros(max(1, total_bytes // 4) // world if two_phase else 0)
        self._nccl = dist.get_backend() == "nccl"
        self.times = self.TIMES + (tuple(f"{n}_{w}_s" for n in PHASES for w in ("alone", "overlapped"))
                                   if two_phase else ())
        self.samples: dict[str, list[float]] = {k: [] for k in self.times}
        self._grad_views = self._views_fit()
        self._restore()  # the step's gradients in the buffer from the first step on
        with off_clock():  # warm-up, its time unread (a replay's compute need not be waited out: bench_worker)
            self._compute()
        self._comm_while(self._smalls, False)
        if step_s is None:  # else known (a replay waits out its profile's step: bench_worker), not timed again
            step_s = slowest_median([self._timed(self._compute)])
        if allreduce_s is None:  # else known (a replay's, from the network table: bench_worker), not timed again
            allreduce_s = slowest_median([self._timed(lambda: self._comm_while([self._big], False))])
        self.start_reps = probe_reps(step_s, allreduce_s, budget_s, 2 * len(PHASES) if two_phase else 0)
        # a queue longer than a step, so that compute is slowed all along
        self._queue = [self._big] * (math.ceil(step_s / max(allreduce_s, 1e-9)) + 1)
        # one all-reduce longer than a step: the step behind it and it behind steps, in one window (_window)
        self.one_window = allreduce_s >= ONE_WINDOW_MARGIN * step_s
        self._release()

    def _views_fit(self) -> bool:
        """Whether the step's gradients fit in the all-gradients buffer as views (:meth:`_restore`): every trained
        parameter float32 (the buffer's type) and their elements no more than the buffer's (a replay's: the same)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        return all(p.dtype == self._big.dtype for p in params) and sum(p.numel() for p in params) <= self._big.numel()

    def _release(self) -> None:
        """Between measurements, the all-gradients buffer, the two phases' and the step's gradients hold no
        memory (a bench's rows take turns with the probe: gradsched.torch.jobs.shared_model; the shard, half the
        gradients on two ranks, stayed: googlenet-k80's default bench, 27 MB a rank through its rows)."""
        self._opt.zero_grad(set_to_none=True)  # the views first: the buffer's storage goes next
        for t in (self._big, self._shard):
            t.untyped_storage().resize_(0)
        self._pieces = torch.zeros(0)
        trim_heap()  # the step's gradients, freed below glibc's mmap threshold, else stay resident (about 50 MB a rank)

    def _restore(self) -> None:
        """The buffers back for a measurement; the step's gradients views of the all-gradients buffer where they fit
        (:attr:`_grad_views`), so that a step beside it holds no gradients of its own: with them the probe held 4x
        the parameters (parameters, momentum, gradients, buffer), the rows 3x (BERT-Large at S = 4, one rank: the
        probe added 3.05x the parameters over what the rank held before it, now 2.26x; benchmarks/probe_peak.py).
        Autograd adds each gradient into its view, the step zeroes them, as a runtime's buckets; the values, summed
        by the all-reduces under way, are the probe's to waste (it times them; a replay's values do not matter)."""
        for t in (self._big, self._shard):
            _grow(t)
            t.zero_()
        if self._grad_views:
            offset = 0
            for p in self.module.parameters():
                if p.requires_grad:
                    p.grad = self._big[offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
        if self.two_phase and not self._nccl and dist.get_world_size() != 2:  # as the runtime: a ring's one shard,
            world = dist.get_world_size()  # the all-to-alls' as large as the gradients
            self._pieces = scratch_for(self._big[:self._shard.numel() * world], world, False)

    def _compute(self) -> None:
        self._opt.zero_grad(set_to_none=not self._grad_views)  # views: zeroed in place, kept in the buffer
        self._loss_fn(self.module(self._x), self._y).backward()
        self._opt.step()

    @staticmethod
    def _timed(f: Callable[[], None]) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        f()
        return time.perf_counter() - t0

    def _comm_while(self, bufs: list[torch.Tensor], busy: bool) -> float:
        """Seconds until all-reduces of ``bufs``, issued at once, are all done; compute runs meanwhile if ``busy``."""
        stamp: list[float] = []
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, async_op=True) for b in bufs]
        # stamped on the backend's thread the moment the last one completes
        works[-1].get_future().add_done_callback(lambda _f: stamp.append(time.perf_counter()))
        while busy and not stamp:
            self._compute()
        for w in works:
            w.wait()
        while not stamp:  # the callback may run just after wait() returns
            time.sleep(1e-4)
        return stamp[0] - t0

    def _phase_while(self, name: str, busy: bool) -> float:
        """Seconds of one reduce-scatter (gloo: all-to-all, then the local sum the runtime does on completion)
        or all-gather of all gradients, as the runtime runs them (:mod:`gradsched.torch.runtime.decoupled`), as
        :meth:`_comm_while` times an all-reduce."""
        stamp: list[float] = []
        n = self._shard.numel() * dist.get_world_size()
        full, rank = self._big[:n], dist.get_rank()
        scratch = self._pieces if self._pieces.numel() else None
        t0 = time.perf_counter()
        if name == "allgather":
            works = start_all_gather(full, self._shard, scratch, None, rank, self._nccl)
        else:
            works = start_reduce_scatter(self._shard, full, scratch, None, rank, self._nccl)
        done = works[0].get_future() if len(works) == 1 else torch.futures.collect_all([w.get_future() for w in works])
        done.add_done_callback(lambda _f: stamp.append(time.perf_counter()))
        while busy and not stamp:
            self._compute()
        for work in works:
            work.wait()
        while not stamp:
            time.sleep(1e-4)
        t1 = time.perf_counter()
        if name == "reducescatter" and not self._nccl:
            sum_pieces(self._shard, full, scratch, rank)
        return stamp[0] - t0 + time.perf_counter() - t1

    def _phases(self) -> list[tuple[str, Callable[[], float]]]:
        if not self.two_phase:
            return []
        return [(f"{n}_{w}_s", functools.partial(self._phase_while, n, w == "overlapped"))
                for n in PHASES for w in ("alone", "overlapped")]

    def _step_behind_queue(self) -> float:
        """Seconds of one step while the queued all-reduces run (they are waited for off the clock)."""
        work = [dist.all_reduce(b, async_op=True) for b in self._queue]
        t0 = time.perf_counter()
        self._compute()
        seconds = time.perf_counter() - t0
        for w in work:
            w.wait()
        return seconds

    def _window(self, per_rep: dict[str, list[float]]) -> list[tuple[str, Callable[[], float]]]:
        """Both overlapped times from one window (:attr:`one_window`): an all-reduce of every gradient with
        training steps back to back until it completes, as :meth:`_comm_while` times it, and the first of those
        steps, behind communication all along where the all-reduce outlasted it on every rank (as behind
        :meth:`_step_behind_queue`'s queue).  Apart, a dilated replay's probe waited out the queue after its step,
        then ran the all-reduce behind two more steps: googlenet-k80 at 50 Mbit/s, 34 s against 16 s.  Where a
        step outlasted it, the step behind the queue is timed as before; returns what is left to time."""
        stamp: list[float] = []
        dist.barrier()
        t0 = time.perf_counter()
        work = dist.all_reduce(self._big, async_op=True)
        work.get_future().add_done_callback(lambda _f: stamp.append(time.perf_counter()))
        t1 = time.perf_counter()
        self._compute()
        step_s, overran = time.perf_counter() - t1, bool(stamp)
        while not stamp:
            self._compute()
        work.wait()
        per_rep["allreduce_overlapped_s"].append(stamp[0] - t0)
        if slowest([1.0 if overran else 0.0])[0]:  # the same decision on every rank
            return [("compute_overlapped_s", self._step_behind_queue)]
        per_rep["compute_overlapped_s"].append(step_s)
        return []

    def measure(self, reps: int) -> float:
        """``reps`` more repetitions of every measurement; returns the seconds they took (slowest rank)."""
        t0 = time.perf_counter()
        self._restore()
        self._restart()
        per_rep: dict[str, list[float]] = {k: [] for k in self.times}
        for _ in range(reps):
            per_rep["compute_alone_s"].append(self._timed(self._compute))
            per_rep["allreduce_alone_s"].append(self._timed(lambda: self._comm_while([self._big], False)))
            # these time themselves: the queue's wait, and the compute after the last completion, are off the clock
            overlapped = [("compute_overlapped_s", self._step_behind_queue),
                          ("allreduce_overlapped_s", lambda: self._comm_while([self._big], True))]
            if self.one_window:
                overlapped = self._window(per_rep)
            for key, f in (*overlapped, ("small_ops_alone_s", lambda: self._comm_while(self._smalls, False)),
                           ("small_ops_busy_s", lambda: self._comm_while(self._smalls, True)), *self._phases()):
                dist.barrier()
                per_rep[key].append(f())
        self._release()
        for k, v in per_rep.items():
            self.samples[k].extend(slowest(v))
        return slowest([time.perf_counter() - t0])[0]

    def figures(self, cost: CollectiveCost, phase_costs: dict[str, CollectiveCost] | None = None) -> dict[str, Any]:
        """The medians over every repetition so far, and the contention figures they give with ``cost`` (the
        all-reduce's) and ``phase_costs`` (one reduce-scatter's and all-gather's of all gradients, by
        ``reducescatter`` and ``allgather``; without one, that collective's slowdown is against its time
        alone); ``samples`` keeps every repetition's times (slowest rank, in the order taken) for offline study."""
        m = {k: statistics.median(v) for k, v in self.samples.items()}
        n_model, sa_model = cost.time_s(self.total_bytes), SMALL_OPS * cost.time_s(SMALL_NUMEL * 4)
        fitted = contention_from_probe(m["compute_alone_s"], n_model, m["compute_overlapped_s"],
                                       m["allreduce_overlapped_s"], sa_model, m["small_ops_busy_s"], SMALL_OPS,
                                       m["small_ops_alone_s"], median_se(self.samples["small_ops_busy_s"]))
        fitted.update(phase_slowdowns(m, {n: c.time_s(self.total_bytes) for n, c in (phase_costs or {}).items()}))
        return {**m, "compute_slowdown": m["compute_overlapped_s"] / m["compute_alone_s"],
                "allreduce_slowdown": m["allreduce_overlapped_s"] / m["allreduce_alone_s"],
                **{f"{n}_slowdown": m[f"{n}_overlapped_s"] / m[f"{n}_alone_s"] for n in PHASES if f"{n}_alone_s" in m},
                "allreduce_bytes": self.total_bytes, "allreduce_model_s": n_model,
                "reps": len(self.samples["compute_alone_s"]), "small_ops": SMALL_OPS,
                "small_ops_model_s": sa_model, "samples": {k: list(v) for k, v in self.samples.items()},
                "fitted": fitted}

    def bucket_pass_s(self, reps: int) -> tuple[float, float]:
        """Seconds to copy all gradients' worth of bytes into a bucket, and to scale the bucket by 1/world.

        What a runtime does to every gradient on the compute stream besides computing it
        (:meth:`Profile.with_bucket_costs`); timed on every rank at once, as training runs."""
        self._restore()
        buf = self._big
        pieces = self._copy_pieces(buf)
        copies, scales = [], []
        dist.barrier()
        for _ in range(reps):
            t0 = time.perf_counter()
            for dst, src in pieces:
                dst.copy_(src)
            t1 = time.perf_counter()
            buf.div_(dist.get_world_size())
            copies.append(t1 - t0)
            scales.append(time.perf_counter() - t1)
        del pieces
        self._release()
        return slowest_median(copies), slowest_median(scales)

    def _copy_pieces(self, buf: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """What :meth:`bucket_pass_s` copies, as ``(destination, source)``: ``buf`` onto itself, its second half into
        its first, then its first into its second (and an odd last element), so that every byte is read once and
        written once from a source as large as the gradients, out of the last-level cache as a runtime's gradients
        are, without a source of its own (a buffer of ones as large as the gradients, up to
        :data:`COPY_CHUNK_NUMEL` floats, had set the probe's peak: googlenet-k80, 53 MB a rank; side by side on one
        rank the two passes took the same time, 8-21 ms)."""
        n = buf.numel()
        half = n // 2
        pieces = [(buf[:half], buf[half:2 * half]), (buf[half:2 * half], buf[:half])] if half else []
        if n > 2 * half:
            pieces.append((buf[2 * half:], buf[:n - 2 * half]))
        return pieces

    def buffer_sync_s(self, reps: int, timeout_s: float) -> float:
        """Seconds a forward spends broadcasting rank 0's buffers (BatchNorm statistics), as both
        runtimes do before every forward by default; 0 for a model without buffers."""
        if not any(True for _ in self.module.buffers()):
            return 0.0
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            broadcast_buffers(self.module, None, 0, timeout_s)
            times.append(time.perf_counter() - t0)
        return slowest_median(times)


class NetworkResampler:
    """The latency-bound sizes of a measured all-reduce table, timed again and pooled.

    ``cluster`` is the start-up measurement (``gradsched netbench``'s, with its
    ``measured_points``); each :meth:`measure` times the sizes up to
    :data:`RESAMPLE_MAX_BYTES` once more (small sizes repeated as the netbench does).
    Larger sizes are bandwidth-bound and keep their start-up times: they drift little,
    and on a shaped network they cost seconds each."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        start = (cluster.extra or {}).get("measured_points", {}).get("allreduce", [])
        self.samples: dict[int, list[float]] = {int(b): [t] for b, t in start}
        self.sizes = [b for b in self.samples if b <= RESAMPLE_MAX_BYTES]
        self.max_run = int((cluster.extra or {}).get("table_max_run", MAX_RUN))  # as the table timed them

    def measure(self) -> float:
        """One more time of every resampled size; returns the seconds it took (slowest rank)."""
        t0 = time.perf_counter()
        for b, t in measure_points("allreduce", self.sizes, reps=1, warmup=0, max_run=self.max_run):
            self.samples[int(b)].append(t)
        return slowest([time.perf_counter() - t0])[0]

    def estimate_s(self) -> float:
        """About how long one :meth:`measure` takes, from the times so far."""
        return sum(operations_for(b, 1, self.max_run) * statistics.median(self.samples[b]) for b in self.sizes)

    def pooled(self) -> Cluster:
        """The start-up cluster with every size at its median over all samples, refitted as the netbench fits."""
        if not self.sizes:
            return self.cluster
        points = [(float(b), statistics.median(ts)) for b, ts in sorted(self.samples.items())]
        table = points
        if "extended_beyond_bytes" in self.cluster.extra:  # sizes the start-up table put on its line, again
            table = extend_points(points, int(self.cluster.collectives["allreduce"].points[-1][0]))
        cost = CollectiveCost.fit(table, envelope=True)
        measured = self.cluster.extra["measured_points"]
        extra = {**self.cluster.extra, "measured_points": {**measured, "allreduce": [list(p) for p in points]},
                 "startup_measured_points": measured, "samples": max(len(ts) for ts in self.samples.values())}
        return dataclasses.replace(self.cluster, collectives={**self.cluster.collectives, "allreduce": cost},
                                   extra=extra)
