"""Contention figures: from the bench's probe, pooled across jobs, and the jobs that may pool.

The simulator's :class:`~gradsched.cluster.Contention` (docs/simulator.md,
"Contention") is fitted from the times :class:`gradsched.torch.measure.probe.ContentionProbe`
takes; earlier ``gradsched bench --json`` runs of the same job on the same machine can
be pooled with this one's (``--contention-from``).
"""

from __future__ import annotations

import os
import platform
import statistics
from typing import TYPE_CHECKING, Any, Mapping

from gradsched.errors import FormatError, GradschedError

if TYPE_CHECKING:
    from gradsched.cluster import Cluster, CollectiveCost

# What share of the small operations' own excess over the table (issued together, cores idle)
# every operation pays (docs/simulator.md, "Contention").  Chosen on kept fidelity runs
# re-simulated offline (every row but auto): 0.25 is the share that helped both with pooled
# and with start-up figures (the shares tried, per set of runs: docs/notes/2026-12-fidelity.md).
OP_LATENCY_SHARE = 0.25
# How many standard errors of the small operations' busy time the busy latency is read net
# of: the part of their excess that noise cannot explain (docs/simulator.md, "Contention").
BUSY_NOISE_SE = 2.0


def median_se(samples: list[float]) -> float:
    """Standard error of a median, from the samples' median absolute deviation (normal noise)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    mad = statistics.median(abs(x - mid) for x in samples)
    return 1.2533 * 1.4826 * mad / len(samples) ** 0.5


def contention_from_probe(compute_s: float, comm_s: float, compute_busy_s: float, comm_busy_s: float,
                          small_model_s: float, small_busy_s: float, small_ops: int,
                          small_alone_s: float, small_busy_se_s: float = 0.0) -> dict[str, float]:
    """The simulator's contention figures (docs/simulator.md) from the probe's times.

    Compute was slowed for its whole duration, and so was the all-reduce, so each
    slowdown is a ratio.  ``comm_s`` and ``small_model_s`` are the times the simulator
    would give the same operations alone (the bench passes its cluster's), so that it
    reproduces the busy times.  Every operation pays :data:`OP_LATENCY_SHARE` of what
    the small operations, issued together with the cores idle, took beyond the table
    (``small_alone_s``) per operation; during compute they pay the
    all-reduce's slowdown and that latency, plus a latency per operation started during
    compute, which is what is left of their busy time beyond :data:`BUSY_NOISE_SE` times
    its standard error (``small_busy_se_s``).

    Why net of noise: the simulator charges that latency to every operation that starts
    during compute, so a plan of 65 operations multiplies its error 65 times.  On replayed
    compute (no core is taken) 2 testbed hosts measured 20 ms for 8 small operations busy,
    one standard error 3.1 ms, against 14.3 ms from the table: 0.69 ms per operation, which
    put usbyte's 65 operations 11.7% over their measured 523 ms; net of noise, 0 and +0.5%
    (``python benchmarks/resimulate.py --rev cc5d228``)."""
    kc = max(0.0, compute_busy_s / compute_s - 1.0)
    kn = max(0.0, comm_busy_s / comm_s - 1.0)
    op_lat = OP_LATENCY_SHARE * max(0.0, (small_alone_s - small_model_s) / small_ops)
    excess = small_busy_s - BUSY_NOISE_SE * small_busy_se_s - small_model_s * (1.0 + kn)
    lat = max(0.0, excess / small_ops - op_lat)
    return {"compute_slowdown": kc, "comm_slowdown": kn, "busy_latency_s": lat, "op_latency_s": op_lat}


PHASE_FIGURES = {"reducescatter": "reducescatter_comm_slowdown", "allgather": "allgather_comm_slowdown"}


def phase_costs(cluster: Cluster) -> dict[str, CollectiveCost]:
    """What one reduce-scatter and one all-gather of a group cost in ``cluster`` (by the whole group's bytes),
    the times the probe's two-phase slowdowns are taken against (:func:`phase_slowdowns`)."""
    from gradsched.plan import ALL_GATHER, REDUCE_SCATTER

    return {"reducescatter": cluster.operation_cost(REDUCE_SCATTER), "allgather": cluster.operation_cost(ALL_GATHER)}


def phase_slowdowns(m: Mapping[str, Any], model_s: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each two-phase collective's communication slowdown from the contention probe's medians ``m`` (its
    ``{name}_alone_s`` and ``{name}_overlapped_s``, name ``reducescatter`` or ``allgather``): its time
    while steps ran over ``model_s[name]``, the cluster's time for the same operation (the time the
    simulator stretches, as :func:`contention_from_probe` takes the all-reduce's), or over its own time
    alone where ``model_s`` lacks it.  Only the collectives the probe timed (where the job ran two-phase
    rows)."""
    model_s = model_s or {}
    return {fig: max(0.0, m[f"{name}_overlapped_s"] / model_s.get(name, m[f"{name}_alone_s"]) - 1.0)
            for name, fig in PHASE_FIGURES.items() if f"{name}_alone_s" in m}


def across_jobs(own: dict[str, float], history: list[dict[str, float]]) -> dict[str, float]:
    """Each contention figure at its median over this job's and earlier jobs' (``gradsched bench
    --contention-from``); a figure an earlier job lacks counts as 0, as the simulator reads it (a two-phase
    collective's own slowdown: as that job's ``comm_slowdown``)."""
    if not history:
        return dict(own)
    from gradsched.cluster import PHASE_SLOWDOWNS

    def of(h: dict[str, float], k: str) -> float:  # a two-phase figure absent: as that job's all-reduce
        return h.get(k, h.get("comm_slowdown", 0.0) if k in PHASE_SLOWDOWNS.values() else 0.0)

    return {k: statistics.median([v, *(of(h, k) for h in history)]) for k, v in own.items()}


def this_machine() -> str:
    """Host name, architecture and core count: how the bench's JSON names the machine (before the torch version)."""
    return f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs"


JOB_DEFAULTS = {"ranks_per_host": 1}  # job keys `gradsched bench --json` wrote later, and their earlier meaning


def contention_history(paths: list[str], job: dict[str, Any]) -> list[dict[str, float]]:
    """The contention figures of earlier ``gradsched bench --json`` runs of the same ``job``
    (model, hosts, network, rate, batch size) on this machine, each that job's own, to pool
    with this one's.

    Why: the probe's figures move from job to job more than the machine does, and more than
    the rounds they predict (``cnn``'s compute slowdown 0.20-0.67 in four jobs, each a median
    of 44-45 repetitions).  Seven kept fidelity runs re-simulated with each job's figures
    pooled with the other six's: median prediction error 4.7% to 3.4%; three runs made so,
    2.5-3.4% (docs/simulator.md, "Fidelity")."""
    from gradsched import _validate
    from gradsched.cluster import CONTENTION_FIELDS, PHASE_SLOWDOWNS

    history = []
    for path in paths:
        where = f"--contention-from {path}"
        try:
            rows = _validate.read_json(path)  # a regular file, size- and depth-limited
        except FormatError as e:
            raise GradschedError(f"{where}: {'not JSON' if e.field == '<json>' else 'cannot read it'} ({e.reason})") \
                from None
        if not (isinstance(rows, list) and rows and isinstance(rows[0], dict) and "contention" in rows[0]):
            raise GradschedError(f"{where}: expected the JSON that `gradsched bench --json` writes, with its probe's "
                                 f"figures (a job run without --no-probe)")
        for key, value in job.items():
            theirs = rows[0].get(key, JOB_DEFAULTS.get(key))  # a file from before the key was written: its default
            if theirs != value:
                raise GradschedError(f"{where}: that job's {key} was {theirs!r}, this one's is {value!r}; "
                                     f"contention depends on it, so only the same job's figures pool")
        if not str(rows[0].get("machine", "")).startswith(this_machine() + ","):
            raise GradschedError(f"{where}: measured on {rows[0].get('machine')!r}, not on this machine "
                                 f"({this_machine()}): contention is the machine's")
        probe = rows[0]["contention"]
        history.append(_validate.numbers(probe.get("own_fitted", probe.get("fitted")), path, "contention.fitted",
                                         (*CONTENTION_FIELDS, *PHASE_SLOWDOWNS.values())))
    return history
