"""Replay a profile: a model whose compute is emulated by waiting, with real parameters.

Why: on a CPU machine, real compute takes the cores that gloo needs to move gradients,
so every benchmark measures CPU contention as much as scheduling.  On GPUs compute
runs on the accelerator.  :class:`ReplayModel` reproduces that regime here: built from
any ``gradsched.profile/1`` (measured on a GPU, converted from a paper's logs, or
estimated with ``gradsched profile --device meta``), it has one real parameter per
profile tensor (same sizes, element widths and order), and each layer's forward and
backward *wait* for the profile's time instead of computing.  Hooks, the executor,
PyTorch DDP, gloo, shaped links and every gradient byte stay real.

How one iteration runs:

- ``forward``: waits ``other_s`` (the profile's per-iteration time outside layers),
  then calls each layer module in forward order; a layer waits its forward time.
  Layers are modules that own their tensors, so forward pre-hooks (gradsched's
  next-forward gating, the profiler) see them as they would a real model's.
- The autograd graph is a chain of :class:`_Backward` nodes, one per layer, built in
  the reverse of the profile's ready order, so that autograd runs the layers'
  backward in the profile's ready order.  Each node's backward makes its layer's
  gradients (each parameter times one scalar from the batch: cheap, deterministic,
  different per rank; not the gradient of any real loss) and waits out the rest of
  the layer's backward time.  Autograd accumulates them at once, so the gradients
  become ready at the profile's times.
- Waiting: ``time.sleep`` to a deadline on the model's own clock (:class:`_Clock`),
  which runs the pieces back to back as a device does: a sleep that wakes late and
  the host's own work between pieces (autograd, hooks, copies into buckets, the
  optimizer step: CPU time of the training thread, and the time it waited for one of
  this machine's shared cores, :func:`run_queue_s`), which a GPU's host runs beside
  the device, do not delay the next piece; time the host spends blocked (waiting for
  communication) counts beyond :data:`HOST_SLACK_S`.

What it does not model: the profile's ``update_s`` is not waited for (the optimizer
step runs for real on the CPU, beside the emulated device); the host's work takes
real CPU from gloo, more than a GPU's host would; memory bandwidth shared between
compute and communication on a GPU host is not emulated.  docs/bench.md, "Emulated
compute", has the figures.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Any, Iterator

import torch
from torch import nn

from gradsched.constants import REPLAY_PREFIX  # noqa: F401  (build_model("replay:PROFILE"), re-exported)
from gradsched.profile import Profile
# read and checked without torch (gradsched.replayable); load_profile re-exported for build_model
from gradsched.replayable import ELEMENT_BYTES, check_element_bytes, check_replayable, load_profile  # noqa: F401

WIDTH = 8  # features of the tiny activation that chains the layers
_DTYPES = dict(zip(ELEMENT_BYTES, (torch.float16, torch.float32, torch.float64)))  # element bytes -> dtype


# time off the CPU between two pieces that the emulated device ignores: a sleep's late wake-up, the GIL (_Clock)
HOST_SLACK_S = 3e-4
_SCHEDSTAT: dict[tuple[int, int], int] = {}  # (pid, thread id) -> open descriptor of its /proc schedstat
_MAX_SCHEDSTAT = 64


def run_queue_s() -> float:
    """Seconds the calling thread has waited for a core (runnable, not running) since it started.

    Linux's ``/proc/self/task/TID/schedstat`` (its second field, ``run_delay``); 0.0 where the
    kernel does not say.  The bench's ranks share this machine's 2 cores with gloo's threads, the
    kernel's network work and each other, so the host's own work (the optimizer step, copies into
    buckets) waits for a core as well as computing: 26 ms of an SGD step's CPU took 65-127 ms of
    wall time, 37-100 ms of it in the run queue (docs/notes/2026-12-bench-runs.md, "Byte scaling:
    where S = 1 lost its time").  A GPU's host has cores of its own for that work."""
    key = (os.getpid(), threading.get_native_id())
    for _ in range(2):
        fd = _SCHEDSTAT.get(key)
        if fd is None:
            if len(_SCHEDSTAT) >= _MAX_SCHEDSTAT:  # threads come and go (a pool's): keep a few descriptors only
                for old in list(_SCHEDSTAT.values()):
                    with contextlib.suppress(OSError):
                        os.close(old)
                _SCHEDSTAT.clear()
            try:
                fd = _SCHEDSTAT[key] = os.open(f"/proc/self/task/{key[1]}/schedstat", os.O_RDONLY)
            except OSError:
                return 0.0
        try:
            return int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):  # a thread id reused after its thread ended: open it again
            with contextlib.suppress(OSError):
                os.close(fd)
            _SCHEDSTAT.pop(key, None)
    return 0.0


def host_time() -> float:
    """The calling thread's own seconds on the host: its CPU time and the time it waited for a core (:func:`run_queue_s`)."""
    return time.thread_time() + run_queue_s()


class _Clock:
    """The emulated device's timeline: pieces of compute back to back, as a GPU runs them.

    On a GPU the host runs ahead of the device: the autograd engine, hooks, the
    optimizer's launches and the launch of the next layer happen while the device still
    computes, so the device goes from one layer to the next without a gap.  Here the
    host waits each piece out, so what it does between two pieces would delay every
    later piece.  The next piece therefore starts when the last one was due, later only
    by the part of the host's absence that was not its own work: time the training
    thread spent blocked (waiting for communication: a gated forward, the end of
    backward) beyond :data:`HOST_SLACK_S` (a sleep's late wake-up, the GIL) counts; its
    own time (:func:`host_time`: its CPU time and the time it waited for one of this
    machine's shared cores) does not, since on a GPU that work (hooks, copies into
    buckets, the optimizer step) runs beside the device's compute or on the device itself,
    on a host with cores to spare.  Host work
    longer than the pieces that follow makes the device wait, as a host that falls
    behind does.  At an iteration's start (:meth:`new_iteration`) at most ``carry_s`` of
    host work is hidden, so that another model's work in the same thread (the bench's
    rows take turns) is not credited to this one.  The device never runs ahead of the
    host."""

    def __init__(self, slack_s: float = HOST_SLACK_S, carry_s: float = math.inf) -> None:
        self.slack_s, self.carry_s = slack_s, carry_s
        self._due: float | None = None  # when the last piece was due (None: no piece yet)
        self._back = 0.0  # when the host came back from it (wall clock) ...
        self._cpu_back = 0.0  # ... and the training thread's CPU time then
        self._carry = math.inf  # most host work the next start hides
        self.waited_s = 0.0  # total asked for (what the profile says), for tests and reports
        self.scale = 1.0  # each piece takes this share of its time (0: none, in fast_forward)

    def start(self) -> float:
        """When the next piece of emulated compute starts (never later than now)."""
        now, cpu = time.perf_counter(), host_time()
        if self._due is None:
            return now
        worked = max(0.0, min(cpu - self._cpu_back, self._carry))  # the host's own work since: beside the device
        start = self._due + max(0.0, now - self._back - self.slack_s - worked)
        self._carry = math.inf
        return start

    def wait_until(self, start: float, seconds: float) -> None:
        due = start + seconds * self.scale
        self.waited_s += seconds
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        self._due, self._back, self._cpu_back = due, max(due, time.perf_counter()), host_time()

    def restart(self) -> None:
        """The next piece starts when it is called, whatever ran since the last one (:func:`restart_clocks`)."""
        self._due = None

    def new_iteration(self) -> None:
        """The next piece starts an iteration: hide at most ``carry_s`` of the host's work before it."""
        self._carry = self.carry_s

    def wait(self, seconds: float) -> None:
        self.wait_until(self.start(), seconds)


class _Backward(torch.autograd.Function):
    """Identity on the chain activation; its backward makes a layer's gradients and waits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: "ReplayLayer", *params: torch.Tensor) -> torch.Tensor:
        ctx.layer, ctx.params = layer, params
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        layer: ReplayLayer = ctx.layer
        start = layer.clock.start()
        (x,) = ctx.saved_tensors
        scale = float((grad_out * x).mean())  # one number from this rank's batch
        grads = [p.detach() * scale for p in ctx.params]
        layer.clock.wait_until(start, layer.backward_s)
        return (grad_out, None, *grads)


class ReplayLayer(nn.Module):
    """One profile layer: its tensors as parameters, its times as waits."""

    def __init__(self, shapes: list[tuple[int, torch.dtype]], forward_s: float, backward_s: float,
                 clock: _Clock, generator: torch.Generator) -> None:
        super().__init__()
        # registered on the layer itself (not in a ParameterList), so that the modules that
        # own them directly are the ones called in forward: gating and the profiler hook those
        for j, (n, dtype) in enumerate(shapes):
            self.register_parameter(f"t{j}", nn.Parameter((torch.randn(n, generator=generator) * 0.01).to(dtype)))
        self.forward_s, self.backward_s, self.clock = forward_s, backward_s, clock
        self.ready = list(range(len(shapes)))  # the order autograd accumulates its tensors in

    @property
    def params(self) -> list[nn.Parameter]:
        """This layer's tensors, in the profile's forward order."""
        return list(self._parameters.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.wait(self.forward_s)
        return x


class ReplayModel(nn.Module):
    """An ``nn.Module`` that replays ``profile``: real parameters, emulated compute.

    ``parameters()`` yields one tensor per profile tensor, in the profile's order, with
    its ``numel`` and element width (2, 4, 8 bytes: float16, float32, float64).  The
    input is a ``(batch, WIDTH)`` tensor (see :func:`make_batch`)."""

    hides_host_work = True  # the host's CPU work runs beside the emulated device (_Clock): no runtime cost on it

    def __init__(self, profile: Profile, *, seed: int = 0) -> None:
        super().__init__()
        groups = check_replayable(profile)
        gen = torch.Generator().manual_seed(seed)
        self.clock = _Clock(carry_s=profile.compute_s / 2)
        self.profile, self.other_s = profile, profile.other_s
        self.layers = nn.ModuleList(
            ReplayLayer([(profile.tensors[i].numel, _dtype(profile, i)) for i in idx],
                        sum(profile.tensors[i].forward_s for i in idx),
                        sum(profile.tensors[i].backward_s for i in idx), self.clock, gen)
            for idx in groups)
        first = {i: k for k, idx in enumerate(groups) for i in idx}
        ready_layers = list(dict.fromkeys(first[i] for i in profile.order))
        self.chain = ready_layers[::-1]
        for k, idx in enumerate(groups):  # within a layer, tensors in the profile's ready order
            # built in this order, autograd runs it backwards: the ready order
            self.layers[k].ready = sorted(range(len(idx)), key=lambda j: profile.order.index(idx[j]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.new_iteration()
        self.clock.wait(self.other_s)
        for layer in self.layers:
            x = layer(x)
        for k in self.chain:
            layer = self.layers[k]
            x = _Backward.apply(x, layer, *(layer.params[j] for j in layer.ready))
        return x


@contextlib.contextmanager
def fast_forward(module: nn.Module) -> Iterator[None]:
    """Within it, every replayed layer of ``module`` (a :class:`ReplayModel` or a wrapper around one) takes
    no time: for steps off the clock whose timing nothing reads (a row's priming, a warm-up), so that
    start-up does not wait out dilated compute for them.  Communication, hooks and buckets run as ever;
    a module without replayed compute runs as it is."""
    clocks = [m.clock for m in module.modules() if isinstance(m, ReplayModel)]
    for clock in clocks:
        clock.scale = 0.0
    try:
        yield
    finally:
        for clock in clocks:
            clock.scale = 1.0


def restart_clocks(module: nn.Module) -> None:
    """Every replayed layer of ``module`` starts its next piece when called: for a module resumed after others
    ran in its thread (a bench's probe between the rounds), whose work its clock would otherwise hide, up to
    ``carry_s``, from the first step it times (one step of 3.9 s measured 2.0 s so)."""
    for m in module.modules():
        if isinstance(m, ReplayModel):
            m.clock.restart()


def _dtype(profile: Profile, i: int) -> torch.dtype:
    return _DTYPES[check_element_bytes(profile, i)]


def make_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for a replay model: random ``(batch, WIDTH)`` tensors (the loss is their MSE)."""
    return (torch.randn(batch_size, WIDTH, generator=generator),
            torch.randn(batch_size, WIDTH, generator=generator))
