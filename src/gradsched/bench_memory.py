"""How much memory a replayed bench needs per rank, and the check that refuses one that would not fit.

Since the rows share one model per rank (:mod:`gradsched.torch.jobs.shared_model`), a
rank holds, whatever the number of rows: the parameters and the shared momentum, and
beside them either the contention probe's all-gradients buffer, its step's gradients views
of it (``PROBE_COPIES`` times the parameters' bytes in all), or the buckets of the one row
that runs (``COPIES`` times), in both the largest tensor's gradient as autograd hands it
over, and its own torch, gloo and gradsched (``RANK_BASE_BYTES``).  A two-phase row
(``dear``, or run-time ``auto`` trying it) holds more while it runs: each group's shard
beside the arena, and beyond two ranks the all-to-all's buffer as large as the group
(:func:`two_phase_bytes`, :mod:`gradsched.torch.runtime.decoupled`).  Rank 0, which plans
for every rank, holds numba's kernels only where ``GRADSCHED_JIT`` is given (:func:`planning_bytes`): else the
bench plans without them, as fast on its clusters.
Measured with ``gradsched bench --json`` (``peak_rss_bytes``, the largest rank's VmHWM;
``tests/test_bench.py`` checks the estimate against the stored runs): docs/bench.md, "Memory".
"""

from __future__ import annotations

import importlib.util
import os

from gradsched.errors import GradschedError
from gradsched.jobs.startup import AUTO_WARMUP_PHASE
from gradsched.procfs import proc_bytes

RANK_BASE_BYTES = 400e6  # one rank's torch, gloo and gradsched, and the heap's and autograd's passing buffers (the
# stored 12-row googlenet-k80 run: 0.58 GB = 0.40 + 3 x 53.5 MB + its largest tensor, 8.4 MB)
COPIES = 3  # parameters, momentum, one row's buckets (gradients are views of them), per byte of parameters
PROBE_COPIES = 3  # parameters, momentum, the contention probe's all-gradients buffer (its step's gradients: views)
KERNELS_BYTES = 100e6  # numba's code and LLVM, resident on the rank that plans (rank 0) once it has loaded them
MEMORY_SHARE = 0.8  # of the available memory, what a replay may plan to use (the rest: the estimate's error, the OS)


def two_phase_bytes(model_bytes: int, ranks: int) -> float:
    """What a two-phase row holds beside its arena on the CPU (gloo) on ``ranks`` ranks: every group's shard
    (1/ranks of it; on two ranks it also receives the other rank's part), and beyond two ranks the
    all-to-all's buffer, as large as the group (:func:`gradsched.torch.runtime.decoupled.scratch_for`)."""
    return model_bytes / ranks + (model_bytes if ranks > 2 else 0)


def rank_bytes(model_bytes: int, largest_bytes: int, ranks: int = 2, two_phase: bool = False) -> float:
    """The peak resident bytes of one rank replaying a model of ``model_bytes`` (largest tensor ``largest_bytes``)
    on ``ranks`` ranks, but rank 0's kernels (:func:`planning_bytes`): the probe's or the rows', whichever holds
    more; ``two_phase``: a row runs reduce-scatters and all-gathers (:func:`two_phase_bytes`)."""
    extra = two_phase_bytes(model_bytes, ranks) if two_phase else 0.0
    return RANK_BASE_BYTES + largest_bytes + max(PROBE_COPIES * model_bytes, COPIES * model_bytes + extra)


def kernels_load() -> bool:
    """Whether a bench's planning rank loads numba's kernels: numba installed and ``GRADSCHED_JIT`` given, not ``0``
    (the bench's workers set it to ``0`` where it is not given:
    :func:`gradsched.torch.jobs.bench_startup._kernels_where_they_pay`)."""
    jit = os.environ.get("GRADSCHED_JIT")
    return jit not in (None, "0") and importlib.util.find_spec("numba") is not None


def planning_bytes() -> float:
    """What rank 0 holds beyond :func:`rank_bytes`: numba's kernels where it loads them (:func:`kernels_load`)."""
    return KERNELS_BYTES if kernels_load() else 0.0


def peak_bytes(model_bytes: int, largest_bytes: int, ranks: int = 2, two_phase: bool = False) -> float:
    """The largest rank's peak resident bytes (a bench's ``peak_rss_bytes``): :func:`rank_bytes` and rank 0's
    :func:`planning_bytes`."""
    return rank_bytes(model_bytes, largest_bytes, ranks, two_phase) + planning_bytes()


def available_bytes() -> int:
    """Memory the machine can give without swapping: ``MemAvailable`` (free pages where it is not reported)."""
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_memory(model_bytes: int, largest_bytes: int, ranks: int, have: int | None = None,
                 two_phase: bool = False) -> float:
    """Refuse a replay whose ranks would not fit in ``MEMORY_SHARE`` of the available memory; returns the need.
    ``two_phase``: a row runs reduce-scatters and all-gathers (``dear``, or ``auto`` with it among its candidates);
    rank 0's kernels are counted where ``GRADSCHED_JIT`` loads them (:func:`planning_bytes`)."""
    have = available_bytes() if have is None else have
    per_rank = rank_bytes(model_bytes, largest_bytes, ranks, two_phase)
    kernels = planning_bytes()
    need = per_rank * ranks + kernels
    if need > MEMORY_SHARE * have:
        extra = (f", {two_phase_bytes(model_bytes, ranks) / 1e6:.0f} MB for the two phases' buffers (dear)"
                 if two_phase else "")
        planning = f", and rank 0 {kernels / 1e9:.1f} GB more for numba's kernels" if kernels else ""
        raise GradschedError(
            f"replaying {model_bytes / 1e6:.0f} MB of parameters on {ranks} ranks needs about {need / 1e9:.1f} GB "
            f"({per_rank / 1e9:.2f} GB a rank: {RANK_BASE_BYTES / 1e9:.2f} GB of runtime, {COPIES}x the "
            f"parameters and the largest tensor once, in the probe as in the rows{extra}, "
            f"whatever the rows{planning}), more than the {MEMORY_SHARE:.0%} of the available {have / 1e9:.1f} GB "
            f"that a replay may use ({MEMORY_SHARE * have / 1e9:.1f} GB; the rest is the margin: "
            f"{(1 - MEMORY_SHARE) * have / 1e9:.1f} GB): use fewer hosts or ranks per host, or a smaller profile")
    return need


def phase_lines(phases: list[dict] | None, model_bytes: int | None) -> list[str]:
    """A line per phase of a bench job (wall seconds, the largest rank's peak RSS so far), then the start-up
    (without run-time ``auto``'s warm-up, its own phase) and the peak against this module's estimate of it."""
    if not phases:
        return []
    lines = ["phases (wall seconds; peak memory of the largest rank so far): " + ", ".join(
        f"{p['phase']} {p['s']:.1f} s ({p['peak_rss_bytes'] / 1e9:.2f} GB)" for p in phases)]
    start = sum(p["s"] for p in phases if p["phase"] not in ("rounds", AUTO_WARMUP_PHASE))
    warmup = [p["s"] for p in phases if p["phase"] == AUTO_WARMUP_PHASE]
    peak = phases[-1]["peak_rss_bytes"]
    line = f"start-up {start:.1f} s"
    if warmup and warmup[0] > 0:  # run-time auto's, its own phase: part of auto's row, not start-up
        line += f" without run-time auto's warm-up ({warmup[0]:.1f} s, its own phase)"
    line += f"; peak memory per rank {peak / 1e9:.2f} GB (VmHWM)"
    if model_bytes:
        target = COPIES * model_bytes + 0.5e9
        line += f" against {target / 1e9:.2f} GB for {COPIES}x the parameters' {model_bytes / 1e6:.0f} MB + 0.5 GB"
    return lines + [line]
