"""A measured all-reduce table extended to large sizes along its bandwidth line, not measured there.

``gradsched bench`` needs the all-reduce's cost up to about twice the model's
gradients.  Measuring those sizes on shaped links takes dilated time (a 1 GiB
all-reduce at 1 Gbit/s: about 9 s a repetition) and a buffer as large; beyond a few
MiB an all-reduce is bandwidth-bound, so its time grows linearly with its bytes.  The
bench measures up to :data:`MEASURED_MAX_BYTES` and adds each larger power of two on
the line through the two largest measured sizes (:func:`extend_points`); the table is
then read as a measured one (docs/bench.md, "Start-up").  On links shaped slow (a high
``--dilate``) even 32 MiB takes seconds a repetition: :func:`measured_top` stops the sizes
timed where the table would exceed :data:`TABLE_BUDGET_S`, at the first bandwidth-bound size at least
(:func:`table_floor`: 128 KiB on a link shaped at 50 Mbit/s), never above :data:`TABLE_FLOOR_BYTES`.
Where a row runs reduce-scatters and all-gathers, those two are also timed beyond the all-reduce table's top,
up to the model's largest group (:func:`two_phase_sizes`, within :data:`TWO_PHASE_BUDGET_S`), and their queued
rule at the groups' sizes (:func:`queue_sizes`, within :data:`QUEUE_BUDGET_S`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gradsched.costs import PER_RANK, CollectiveCost, fit_measured

MEASURED_MAX_BYTES = 32 << 20  # the largest all-reduce the bench times; larger ones are on the line
TABLE_BUDGET_S = 20.0  # on slow (dilated) links, the sizes timed stop where the table would take longer ...
TABLE_FLOOR_BYTES = 2 << 20  # ... but never below the first bandwidth-bound size, nor this one (bandwidth-bound
# on every link the bench shapes)
TWO_PHASE_BUDGET_S = 20.0  # reduce-scatter and all-gather timed beyond the table's top, both together, at most ...
QUEUE_BUDGET_S = 30.0  # ... and their queued rule (docs/cost-model.md, "Queued streams") at most this
QUEUE_SIZES = (1 << 20, 4 << 20, 16 << 20)  # a rank's part: where dear's groups lie (about 1 MiB a rank at 4 MB, its
# threshold on googlenet-k80 at 4 hosts, up to 16 MiB and more); below 1 MiB latency rules
RUN_BYTES = 8 << 20  # a repetition times back-to-back operations of at least this many bytes in all ...
MAX_RUN = 64  # ... and at most this many (gradsched.torch.measure.netbench)
TABLE_RUN_S = 0.25  # the bench's table: a repetition's back-to-back operations take at most about this long ...
TABLE_LEAST_RUN = 4  # ... but at least this many (table_run)
LATENCY_SHARE = 1 / 16  # a size is bandwidth-bound where an operation's latency is at most this share of its time


def extend_points(points: list[tuple[float, float]], top_bytes: int, *,
                  at_largest_rate: bool = False) -> list[tuple[float, float]]:
    """``points`` (``(bytes, seconds)``, at least two) with each power of two above the largest up to
    ``top_bytes`` added on the line through the largest point and the third largest (the second where
    there are two: a wider base than neighbours, less moved by one's noise; never a slope below 0).

    ``at_largest_rate``: at the largest point's own seconds per byte instead (the line through it and
    the origin), for gloo's reduce-scatter and all-gather (:data:`gradsched.costs.PER_RANK`), whose time
    per byte grows over the measured sizes and then stays: on 2 testbed hosts at 1 Gbit/s a
    reduce-scatter took 18.6, 18.1, 17.7 and 18.2 ns per rank byte at 16, 32, 64 and 128 MiB a rank
    (all-gather 16.2, 16.1, 17.5, 14.6), while the line through 4 and 16 MiB of the bench's own table
    rose at 23.1 ns/B and priced 128 MiB at 3.08 s against 2.44 measured
    (docs/notes/2026-12-decoupled.md, "Round 4")."""
    table = sorted(points)
    if len(table) < 2:
        return table
    (b0, t0), (b1, t1) = table[-min(3, len(table))], table[-1]
    slope = max(0.0, t1 / b1 if at_largest_rate else (t1 - t0) / (b1 - b0))
    size = b1 * 2
    while size <= top_bytes:
        table.append((size, t1 + slope * (size - b1)))
        size *= 2
    return table


def extended_costs(points: dict[str, Any], names: list[str], top_bytes: int) -> dict[str, CollectiveCost]:
    """Each of ``names`` that ``points`` (``measured_points``: ``[bytes, seconds]`` medians per collective) holds,
    its table extended to ``top_bytes`` (:func:`extend_points`; a per-rank-sized collective at its largest size's
    rate) and read as measured (:func:`gradsched.costs.fit_measured`): the bench's table beyond what it timed."""
    return {name: fit_measured(name, extend_points([(float(b), float(t)) for b, t in points[name]], top_bytes,
                                                   at_largest_rate=name in PER_RANK))
            for name in names if name in points}


def measured_top(sizes: list[int], seconds_of: Callable[[int], float], budget_s: float = TABLE_BUDGET_S,
                 floor_bytes: int = TABLE_FLOOR_BYTES) -> int:
    """The largest of ``sizes`` (ascending) to time: every size up to ``floor_bytes``, then more while timing all
    of them so far (``seconds_of`` each) fits ``budget_s``; larger ones go on the line (:func:`extend_points`)."""
    top, total = sizes[0], 0.0
    for size in sizes:
        total += seconds_of(size)
        if size > floor_bytes and total > budget_s:
            break
        top = size
    return top


def table_floor(small_s: float, mib_s: float, floor_bytes: int = TABLE_FLOOR_BYTES) -> int:
    """The size the table times whatever its budget: the least power of two at which an all-reduce is
    bandwidth-bound (its latency at most :data:`LATENCY_SHARE` of its time), from one of 4 KiB (``small_s``)
    and one of 1 MiB (``mib_s``); at most ``floor_bytes``.  Beyond it the line through the largest measured
    sizes holds (:func:`extend_points`).  The fixed 2 MiB floor it replaces cost a link shaped at 50 Mbit/s
    (1 Gbit/s at ``--dilate 20``) 30 s of table against a 20 s budget, where every size is
    bandwidth-bound from 128 KiB on: there the line through 128 and 512 KiB of googlenet-k80's table put 2 MiB
    within 0.6% of its measured time
    (docs/notes/2026-12-bench-runs.md, "Start-up, measured")."""
    per_byte_s = (mib_s - small_s) / ((1 << 20) - 4096)
    if not (math.isfinite(per_byte_s) and per_byte_s > 0):
        return floor_bytes
    latency_s = max(0.0, small_s - 4096 * per_byte_s)
    least = latency_s * (1 / LATENCY_SHARE - 1) / per_byte_s  # latency <= LATENCY_SHARE of latency + bytes x rate
    return min(floor_bytes, 1 << max(12, math.ceil(math.log2(max(least, 1.0)))))


def two_phase_sizes(top: int, largest: int, seconds_of: Callable[[int], float],
                    budget_s: float = TWO_PHASE_BUDGET_S) -> list[int]:
    """The sizes a rank (ascending) above ``top`` (the table's largest per-rank size) at which the reduce-scatter
    and the all-gather are also timed, so that their table reaches ``largest`` (the model's largest group, a
    rank's part): the power of two at or above it, halved until timing it (``seconds_of``: both collectives, as
    the table times them) fits ``budget_s``, then every fourth power of two below it while the total fits.
    Beyond the largest size timed a reduce-scatter goes on at that size's rate (:func:`extend_points`).

    On googlenet-k80's 4 hosts at ``--dilate 2`` (the all-reduce table stopping at 512 KiB a rank) a
    reduce-scatter cost 81-95 ns a rank byte from 512 KiB to 8 MiB a rank, flat
    (docs/notes/2026-12-emulated-regime.md, "Issue 36's targets at 4 hosts with the two phases timed to the
    largest group")."""
    size = 1 << max(0, math.ceil(math.log2(max(largest, 1))))
    sizes: list[int] = []
    total = 0.0
    while size > top:
        cost = seconds_of(size)
        if total + cost <= budget_s:
            sizes.append(size)
            total += cost
            size //= 4
        else:
            size //= 4 if sizes else 2
    return sorted(sizes)


def queue_sizes(top: int, seconds_of: Callable[[int], float], budget_s: float = QUEUE_BUDGET_S) -> list[int]:
    """The sizes a rank at which the queued rule is measured: those of :data:`QUEUE_SIZES` within the two phases'
    table (``top``, a rank's part), smallest first while timing them (``seconds_of``) fits ``budget_s`` (the
    smallest always); none where the table stops below all of them (no rule: one at a time).  There the groups are
    latency-bound and a queue gains little: on 8 testbed hosts at 250 Mbit/s four queued took 0.96-1.13x one at a
    time at 256 KiB-1 MiB groups (benchmarks/results/gloo_ring_phases_8h_250mbit_a2a12.json), and without the rule
    runs11's four 8-host ``dear`` rows re-predict at median |error| 4.0% against 5.3% with it, while timing it at
    the table's top (256 KiB a rank) took 6-9 s of their start-ups (docs/notes/2026-12-a2a12.md)."""
    sizes: list[int] = []
    total = 0.0
    for size in (b for b in QUEUE_SIZES if b <= top):
        total += seconds_of(size)
        if sizes and total > budget_s:
            break
        sizes.append(size)
    return sizes


def run_for(nbytes: int, max_run: int = MAX_RUN) -> int:
    """Operations timed back to back in one repetition of ``nbytes`` (after one untimed lead): at least
    :data:`RUN_BYTES` in all, at most ``max_run``."""
    return max(1, min(max_run, -(-RUN_BYTES // max(nbytes, 1))))


def operations_for(nbytes: int, reps: int, max_run: int = MAX_RUN) -> int:
    """Operations one size's measurement issues: each repetition's lead and timed run.  A run
    already averages up to ``max_run`` operations, so small sizes need no extra repetitions."""
    return reps * (1 + run_for(nbytes, max_run))


def table_run(small_s: float, most: int = MAX_RUN, run_s: float = TABLE_RUN_S) -> int:
    """The most operations the bench's table times back to back a repetition, from one all-reduce of 4 KiB
    (``small_s``): ``most`` where that fits ``run_s``, else as many as do (at least :data:`TABLE_LEAST_RUN`).
    Its 64 a run suit an operation of microseconds; with 8 ranks on 2 cores one of 4 KiB to 128 KiB takes
    15-30 ms, so the six latency-bound sizes (timed whatever the budget, up to :func:`table_floor`) cost 5 s each
    and the table 35-44 s against its :data:`TABLE_BUDGET_S` (the papers' models on 8 emulated hosts)."""
    if not (math.isfinite(small_s) and small_s > 0):
        return most
    return max(TABLE_LEAST_RUN, min(most, int(run_s / small_s)))


def table_s(points: list[tuple[float, float]], reps: int, max_run: int = MAX_RUN, warmup: int = 1) -> float:
    """Seconds the bench's table takes to time ``points`` (``(bytes, seconds an operation)``): at each size
    ``warmup`` operations and ``reps`` repetitions of a lead and a run (:func:`run_for`)."""
    return sum((warmup + operations_for(int(b), reps, max_run)) * t for b, t in points)
