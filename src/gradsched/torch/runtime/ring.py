"""Reduce-scatter and all-gather as rings of point-to-point messages, for gloo.

gloo's own ``reduce_scatter_tensor`` is an all-reduce and a slice (PyTorch PR #118911), and the
runtime's all-to-all form (:mod:`gradsched.torch.runtime.decoupled`) sends every rank's part to
every other rank at once: over 8 shaped testbed hosts it cost 1.2-2x half an all-reduce a byte
(docs/cost-model.md, "Two phases not measured").  A ring moves the same (p-1)/p of the bytes in
p-1 steps, each rank sending to the next and receiving from the previous one, as gloo's ring
all-reduce does for each of its halves:

- reduce-scatter: at step ``s`` rank ``r`` sends its running sum of chunk ``(r - s - 1) mod p``
  and adds the previous rank's running sum of chunk ``(r - s - 2) mod p`` into its own; after p-1
  steps chunk ``r`` holds every rank's sum (the chunks are the shards, in rank order, as
  ``reduce_scatter_tensor`` lays them out);
- all-gather: at step ``s`` rank ``r`` sends chunk ``(r - s) mod p`` and receives chunk
  ``(r - s - 1) mod p`` straight into its place.

Each step's chunk goes as up to :data:`RING_SPLITS` messages at once (over a shaped link one large
message alone moves about half its rate).  The ring functions run synchronously on the calling thread;
``buffer`` is modified in place (the reduce-scatter leaves partial sums in the other chunks).
:func:`submit` runs one on its group's own thread, in submission order, and returns a handle the
runtime waits on and polls as it does a gloo ``Work`` (gloo's ``isend``/``irecv`` works have no
future and do not report completion until waited for).
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

RING_SPLITS = 4  # messages a step's chunk goes as, at once
MIN_SPLIT_BYTES = 64 << 10  # no message smaller than this (a message's start-up outweighs its bytes)


def _parts(a: int, b: int, element_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the messages chunk ``[a, b)`` goes as."""
    n = b - a
    k = max(1, min(RING_SPLITS, n * element_bytes // MIN_SPLIT_BYTES))
    step = -(-n // k)
    return [(x, min(x + step, b)) for x in range(a, b, step)]


def _exchange(send: torch.Tensor, recv: torch.Tensor, to: int, frm: int, group: dist.ProcessGroup) -> None:
    """Send ``send`` to rank ``to`` while receiving ``recv`` from rank ``frm`` (group ranks), in parts."""
    works = []
    for a, b in _parts(0, send.numel(), send.element_size()):
        works.append(dist.irecv(recv[a:b], group=group, group_src=frm))
        works.append(dist.isend(send[a:b], group=group, group_dst=to))
    for w in works:
        w.wait()


def ring_reduce_scatter(buffer: torch.Tensor, group: dist.ProcessGroup, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Sum every rank's ``buffer`` (p equal chunks) into this rank's chunk, in p-1 ring steps; returns that chunk
    (a view of ``buffer``).  ``scratch``: a tensor of at least one chunk for the incoming sums (else allocated)."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    m = buffer.numel() // p
    chunk = buffer.view(p, m)
    incoming = scratch[:m] if scratch is not None else torch.empty(m, dtype=buffer.dtype, device=buffer.device)
    to, frm = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        _exchange(chunk[(r - s - 1) % p], incoming, to, frm, group)
        chunk[(r - s - 2) % p].add_(incoming)
    return chunk[r]


def ring_all_gather(buffer: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Every rank's chunk ``r`` of ``buffer`` (p equal chunks) into every rank's ``buffer``, in p-1 ring steps."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    chunk = buffer.view(p, buffer.numel() // p)
    to, frm = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        _exchange(chunk[(r - s) % p], chunk[(r - s - 1) % p], to, frm, group)


class RingWork:
    """A ring phase submitted to a group's thread: ``wait``, ``is_completed`` and ``get_future`` as a gloo ``Work``."""

    def __init__(self) -> None:
        self._future: torch.futures.Future = torch.futures.Future()
        self._done = threading.Event()
        self._error: BaseException | None = None

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until the phase is done; its error, or a ``RuntimeError`` after ``timeout``."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if not self._done.wait(seconds):
            raise RuntimeError(f"ring phase not done within {seconds:g} s")
        if self._error is not None:
            raise self._error
        return True

    def finish(self, error: BaseException | None) -> None:
        """The group's thread: the phase ended (with ``error``); callbacks run here, then waiters wake."""
        self._error = error
        if error is None:
            self._future.set_result(None)
        else:
            self._future.set_exception(error)
        self._done.set()


class _Lane:
    """One daemon thread running a group's ring phases one after another, in submission order (the same on every
    rank, so each phase's messages meet their peers')."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], None], RingWork]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="gradsched-ring", daemon=True).start()

    def _run(self) -> None:
        while True:
            job, work = self.jobs.get()
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the waiter, as a backend's error is
                work.finish(e)
            else:
                work.finish(None)


_LANES: dict[int, _Lane] = {}


def submit(group: dist.ProcessGroup, job: Callable[[], None]) -> RingWork:
    """Run ``job`` (a ring phase on ``group``) on ``group``'s thread after the phases submitted before it."""
    lane = _LANES.get(id(group))
    if lane is None:
        lane = _LANES[id(group)] = _Lane()
    work = RingWork()
    lane.jobs.put((job, work))
    return work
