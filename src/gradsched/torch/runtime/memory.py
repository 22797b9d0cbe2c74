"""Buffer accounting for the runtime: every buffer the executor allocates, live and peak bytes.

Sparse communication is memory-hungry if done naively (a residual as large as the
model, dense gradient buffers, value and index buffers: LaySA's point), so the
runtime routes every allocation of its own through one :class:`MemoryLedger`.  The
ledger's ``live_bytes`` is, by construction and by test, the sum of the storage sizes
of the buffers the executor holds; ``peak_bytes`` is its maximum over the run, plus
the gradients autograd hands to the hooks for the short time the runtime holds them
before releasing them (:meth:`MemoryLedger.transient`), which exist in dense and
sparse training alike.  Parameters and optimizer state are not the runtime's and are
not counted: ``peak_bytes`` is the "extra" memory of data-parallel training.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from gradsched.errors import InternalError


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage behind ``t`` (what the allocator really holds for it)."""
    return t.untyped_storage().nbytes()


@dataclass
class MemoryLedger:
    """Named allocations: ``alloc`` when a buffer is created, ``free`` when it is dropped."""

    live_bytes: int = 0
    peak_bytes: int = 0  # live buffers plus transients: the figure reported as peak extra memory
    peak_held_bytes: int = 0  # live buffers alone (what the runtime itself holds at its peak)

    def __post_init__(self) -> None:
        self._live: dict[str, int] = {}

    def alloc(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Record ``tensor`` (a fresh buffer, not a view) under ``name``; returns it."""
        if name in self._live:
            raise InternalError(f"buffer {name!r} allocated twice without free")
        nbytes = storage_bytes(tensor)
        self._live[name] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.peak_held_bytes = max(self.peak_held_bytes, self.live_bytes)
        return tensor

    def free(self, name: str) -> None:
        nbytes = self._live.pop(name, None)
        if nbytes is None:
            raise InternalError(f"buffer {name!r} freed but not allocated")
        self.live_bytes -= nbytes

    def transient(self, nbytes: int) -> None:
        """Memory that exists on top of the live buffers for a moment (a gradient from autograd)."""
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + int(nbytes))

    def holds(self, name: str) -> bool:
        return name in self._live

    def snapshot(self) -> dict[str, int]:
        """``{name: bytes}`` of every live buffer (for reports and tests)."""
        return dict(self._live)

    def stats(self) -> dict[str, int]:
        return {"live_bytes": self.live_bytes, "peak_bytes": self.peak_bytes, "peak_held_bytes": self.peak_held_bytes,
                "buffers": len(self._live)}


def trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    Buckets below glibc's mmap threshold (which rises to 32 MiB as large blocks are freed) live on the
    heap; freed, they leave holes that the next buckets, of other sizes, do not fill.  ``gradsched bench``
    trims between a row's bursts (resident memory grew with the rows: +110 MB for 4 more rows of an 80 MB
    model, 2 ranks; trimmed, it stays flat), and run-time auto where it switches plans on the CPU (the
    outgoing plan's buckets freed or parked: :meth:`~gradsched.torch.runtime.torch_ddp.TorchDDPPool.park`)."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None
