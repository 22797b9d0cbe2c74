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
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import weakref
from typing import Callable, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_LIVE: "weakref.WeakSet[Closable]" = weakref.WeakSet()
_RELEASES: list[Callable[[], None]] = []  # module-level holdings (private process groups), run after closing
_LOCK = threading.Lock()
_hooked = False


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


def release_at_exit(release: Callable[[], None]) -> None:
    """Call ``release()`` at interpreter exit, after the registered objects are closed (once per callable)."""
    with _LOCK:
        if release not in _RELEASES:
            _RELEASES.append(release)
        _hook()


def close_all() -> None:
    """Close every registered object still alive, run the releases, collect cycles (idempotent; runs at exit)."""
    for obj in list(_LIVE):
        _quietly(obj.close, type(obj).__name__)
    _LIVE.clear()
    for release in _RELEASES:
        _quietly(release, getattr(release, "__name__", "release"))
    gc.collect()


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
