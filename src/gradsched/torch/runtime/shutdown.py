"""Leaving a process cleanly: what gradsched runs or holds is released before finalisation.

Two ways out, for two kinds of process:

- **A user's script** returns from its main function, with or without
  ``destroy_process_group()``, and Python finalises.  Everything gradsched holds
  that reaches into the backend (progress threads, autograd hooks, process groups
  and the collectives in flight on them) is registered with :func:`close_at_exit`
  and closed by an ``atexit`` handler, which then collects the reference cycles
  between wrapper, executor and optimizer, while the interpreter is still whole.
  Without it those cycles held the last references to process groups until the
  collector ran during finalisation, when a backend's destructor (joining its worker
  threads) or a progress thread taking the GIL could abort the process ("terminate
  called without an active exception").  PyTorch's DDP holds its groups from C++ and
  has no such cycle.
- **gradsched's own workers** (``gradsched train``/``bench``/``netbench``) flush their
  results and end with :func:`leave` (``os._exit``), skipping finalisation altogether:
  their results are written, and nothing is left to release.

**After a failed collective** (a :class:`~gradsched.torch.runtime.ops.CollectiveError`,
which calls :func:`note_collective_failure`), nothing in flight will complete: a
frozen peer (SIGSTOP) leaves gloo's worker threads blocked in a receive until the
*process group's* timeout (30 min by default), and destroying the group at
finalisation joins them, so the process hung at exit for that long (31 s with
gradsched's earlier 30 s wait per operation; gloo's ``abort()`` does not unblock them).
So then closing waits for nothing, and :func:`close_all`, if a process group is still
initialised, arms a watchdog
(``faulthandler.dump_traceback_later(exit=True)``: a C thread that needs no GIL)
that ends the process with status 1 if finalisation is still running
:data:`EXIT_GRACE_S` later.  A process that finalises in time keeps its own status.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import sys
import threading
import weakref
from typing import Callable, Protocol, TextIO

EXIT_GRACE_S = 5.0  # after a failed collective: the longest finalisation may take before the process is ended


class Closable(Protocol):
    def close(self) -> None: ...


_LIVE: "weakref.WeakSet[Closable]" = weakref.WeakSet()
_RELEASES: list[Callable[[], None]] = []  # module-level holdings (private process groups), run after closing
_LOCK = threading.Lock()
_hooked = False
_FAILED = threading.Event()  # a collective failed: peers may be gone, nothing in flight will complete
_WATCHDOG_SINK: list[TextIO] = []  # the watchdog writes its traceback dump here (kept open until exit)


def _hook() -> None:
    global _hooked
    if not _hooked:
        atexit.register(close_all)
        _hooked = True


def close_at_exit(obj: Closable) -> None:
    """Call ``obj.close()`` at interpreter exit if it is still alive then (held weakly until then)."""
    with _LOCK:
        _LIVE.add(obj)
        _hook()


def collect_at_exit() -> None:
    """Run :func:`close_all` at interpreter exit even with nothing registered: its cycle collection frees a
    wrapper's process groups while the interpreter is whole (run-time ``auto`` deferred on PyTorch's DDP
    builds no executor, whose registration used to be what armed it)."""
    with _LOCK:
        _hook()


def release_at_exit(release: Callable[[], None]) -> None:
    """Call ``release()`` at interpreter exit, after the registered objects are closed (once per callable)."""
    with _LOCK:
        if release not in _RELEASES:
            _RELEASES.append(release)
        _hook()


def note_collective_failure() -> None:
    """Record that a collective failed (called by ``CollectiveError``): from now on closing waits for
    nothing in flight, and exit is bounded by :data:`EXIT_GRACE_S` (module docstring)."""
    _FAILED.set()
    with _LOCK:
        _hook()


def collective_failed() -> bool:
    """Whether a collective failed in this process (:func:`note_collective_failure`)."""
    return _FAILED.is_set()


def close_all() -> None:
    """Close every registered object still alive, run the releases, collect cycles (idempotent; runs at exit).

    After a failed collective, also arm the exit watchdog (module docstring)."""
    for obj in list(_LIVE):
        _quietly(obj.close, type(obj).__name__)
    _LIVE.clear()
    for release in _RELEASES:
        _quietly(release, getattr(release, "__name__", "release"))
    gc.collect()
    if _FAILED.is_set() and _process_group_alive():
        _arm_exit_watchdog()


def _process_group_alive() -> bool:
    """Whether torch.distributed still holds a process group, whose destruction at finalisation can block."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _arm_exit_watchdog() -> None:
    """End the process with status 1 if it is still finalising :data:`EXIT_GRACE_S` from now (after
    a failed collective, gloo's threads can block its finalisation until the process group's timeout)."""
    sys.stderr.flush()
    try:
        sink = open(os.devnull, "w")
        _WATCHDOG_SINK.append(sink)  # the watchdog's C thread writes to its descriptor: keep it open
        faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True, file=sink)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"gradsched: could not bound the exit after a failed collective: {exc}", file=sys.stderr)


def _quietly(fn: Callable[[], None], what: str) -> None:
    try:
        fn()
    except Exception as exc:  # at exit: report, never keep the others from closing
        print(f"gradsched: releasing {what} at exit failed: {exc}", file=sys.stderr)


def leave(code: int = 0) -> None:
    """Flush stdio and end the process now with ``code`` (use only in worker entry points)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
