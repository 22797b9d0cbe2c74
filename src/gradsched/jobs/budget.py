"""A default replay's rounds cut to fit :data:`BENCH_TARGET_S` of wall time, and what was cut.

Torch-free; read by ``gradsched bench`` before it launches the workers.  A dilated replay's step takes
seconds of wall time (googlenet-k80 at dilation 20 and 1 Gbit/s: about 10 s, bound by its dilated
communication, which skipping compute does not shorten), so the default rows (``ddp``, ``auto``, four more
DDP bucket sizes and the compute-only row) x 5 steps x (a warm-up round and at least two counted ones) take
25 minutes.  Where the defaults would not fit, :func:`trim` cuts, in this order, only what the user did not
set, until the estimate fits:

1. DDP bucket rows that are the same job: every cap at least the gradients' bytes is one bucket, which is
   ``ddp-all`` (PyTorch 2.13 gives an explicit cap no 1 MiB first bucket); the others are dropped.
2. Counted steps per round 3 -> 2 (``--steps``; two counted rounds still give every row 4 steps for its
   median), and the warm-up round's steps per row -> 1 (its steps are not counted; a replay's skip compute).
3. DDP bucket rows, the largest cap first (``--ddp-buckets`` runs them again).
4. The most rounds (``--rounds``, default 6): as many counted ones as fit after the cuts, ``--min-rounds`` at
   least (the stopping rule may end them sooner).  This one also where only the most rounds would not fit.

The estimate (:func:`estimate_s`) is the start-up target, plus the warm-up rounds and ``--min-rounds``
counted rounds of every row and the compute-only one, each burst ``steps + 2`` steps (one uncounted on each
side) of :func:`step_estimate_s`: the mean of the compute and all-gradients all-reduce overlapped and back to
back (measured 8-12 s a step where this gives 12.5 s: googlenet-k80, 2 hosts, 1 Gbit/s, dilation 20).

That estimate knows only the model.  Once the start-up has measured, the workers fit the budget again
(:func:`after_startup`, before the rows are built): a row's step from the contention probe's step and
all-reduce of every gradient alone (with 8 ranks on 2 cores the all-reduce ran 1.2-1.7x the ring at the
emulated rate), the compute-only row's at the step alone, the start-up as it went, run-time ``auto``'s warm-up
where it runs in situ, and the samples between the rounds at their share (:class:`Costs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gradsched.jobs.config import BenchEntry
from gradsched.jobs.startup import STARTUP_TARGET_S

BENCH_TARGET_S = 900.0  # a default bench on 2-8 hosts: at most about this long in wall seconds
TRIMMED_STEPS = 2  # counted steps per row per round where the default 3 would not fit
TRIMMED_WARMUP_STEPS = 1  # the warm-up round's steps per row where the defaults would not fit


def step_estimate_s(compute_s: float, total_bytes: int, ranks: int, rate_bps: float, dilate: float) -> float:
    """About one step's wall time on a replay: ``compute_s`` (the profile's, emulated) and a ring all-reduce of
    ``total_bytes`` over ``ranks`` at the emulated ``rate_bps``, both x ``dilate``; the mean of their max
    (overlapped) and their sum (back to back).  Byte scaling divides bytes and rate alike: it cancels."""
    comm_s = 2 * (ranks - 1) / ranks * total_bytes * 8 / rate_bps
    return dilate * measured_step_s(compute_s, comm_s)


def measured_step_s(compute_s: float, allreduce_s: float) -> float:
    """About one step of a row that moves every gradient once: the mean of ``compute_s`` and ``allreduce_s``
    overlapped (their max) and back to back (their sum).  With the contention probe's step alone and all-reduce
    of every gradient alone (wall seconds, as the start-up measured them, ranks sharing cores) it is what the
    rows run: BERT-Large on 8 emulated hosts, 5.97 s against 5.5-6.2 s measured (the model's ring at the
    emulated rate gave 5.21 s); BERT-Base 2.37 s against 2.0-2.7 s (the model's: 1.87 s)."""
    return (max(compute_s, allreduce_s) + compute_s + allreduce_s) / 2


def estimate_s(rows: int, steps: int, warmup_steps: int, warmup_rounds: int, min_rounds: int, step_s: float,
               startup_s: float = STARTUP_TARGET_S, compute_s: float | None = None, share: float = 0.0) -> float:
    """Wall seconds of a bench whose rounds stop at the earliest: ``rows`` (and the compute-only one) in
    ``warmup_rounds`` of ``warmup_steps`` and ``min_rounds`` of ``steps``, each burst with 2 more steps; a row's
    step ``step_s``, the compute-only one's ``compute_s`` (None: ``step_s``), and the samples between the rounds
    ``share`` of the rounds' time on top (``--resample-share``: they stay within it)."""
    return startup_s + _per_step_s(rows, step_s, compute_s, share) * (warmup_rounds * (warmup_steps + 2)
                                                                     + min_rounds * (steps + 2))


def _per_step_s(rows: int, step_s: float, compute_s: float | None, share: float) -> float:
    """Wall seconds of one step of every row and the compute-only one, with the samples' share."""
    return (rows * step_s + (step_s if compute_s is None else compute_s)) * (1 + share)


@dataclass
class Trim:
    """What :func:`trim` kept and cut: the rows, the steps per round and the warm-up round's steps (0: as
    ``steps``), the rows dropped and why, the estimate before and after."""

    entries: list[BenchEntry]
    steps: int
    warmup_steps: int
    step_s: float
    before_s: float
    after_s: float
    rounds: int = 0  # the most rounds, warm-up ones included
    dropped: list[str] = field(default_factory=list)  # row labels
    duplicates: list[str] = field(default_factory=list)  # of those, the ones the same as ddp-all
    steps_cut: bool = False
    rounds_cut: bool = False

    @property
    def cut(self) -> bool:
        return bool(self.dropped or self.steps_cut or self.rounds_cut)

    def lines(self, buckets: str, steps: int, rounds: int = 6) -> list[str]:
        """What the output says, with how to get the cut back (``buckets``, ``steps``, ``rounds``: the defaults)."""
        if not self.cut:
            return []
        out = [f"a step here takes about {self.step_s:.1f} s of wall time: the default rounds would take about "
               f"{self.before_s / 60:.0f} min, cut to about {self.after_s / 60:.0f} min (target "
               f"{BENCH_TARGET_S / 60:.0f} min):"]
        if self.steps_cut:
            out.append(f"  {self.steps} counted steps per row per round (--steps {steps} for the default), "
                       f"{self.warmup_steps} in the warm-up round")
        if self.rounds_cut:
            out.append(f"  at most {self.rounds} rounds, the stopping rule's least included (--rounds {rounds})")
        if self.duplicates:
            out.append(f"  dropped {', '.join(self.duplicates)}: one bucket of all gradients, the same as ddp-all")
        rest = [d for d in self.dropped if d not in self.duplicates]
        if rest:
            out.append(f"  dropped {', '.join(rest)} (--ddp-buckets {buckets} runs them)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"step_estimate_s": self.step_s, "estimate_before_s": self.before_s, "estimate_s": self.after_s,
                "target_s": BENCH_TARGET_S, "dropped": self.dropped, "steps": self.steps,
                "warmup_steps": self.warmup_steps, "rounds": self.rounds, "duplicates": self.duplicates,
                "steps_cut": self.steps_cut, "rounds_cut": self.rounds_cut}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trim":
        """Back from :meth:`to_dict`, without the rows kept (enough for :meth:`lines`)."""
        return cls([], int(d["steps"]), int(d["warmup_steps"]), float(d["step_estimate_s"]),
                   float(d["estimate_before_s"]), float(d["estimate_s"]), int(d["rounds"]), list(d["dropped"]),
                   list(d.get("duplicates", [])), bool(d.get("steps_cut")), bool(d.get("rounds_cut")))


def _cap(entry: BenchEntry) -> float | None:
    kw = entry.ddp_kwargs or {}
    return float(kw["bucket_cap_mb"]) if entry.torch_ddp and "bucket_cap_mb" in kw else None


@dataclass(frozen=True)
class Costs:
    """What a bench costs besides its rows' steps: the start-up (wall seconds, run-time ``auto``'s warm-up
    included where it runs), the compute-only row's step (None: a row's) and the samples' share between the
    rounds (``--resample-share``).  Before the launch: the start-up target, nothing measured."""

    startup_s: float = STARTUP_TARGET_S
    compute_s: float | None = None
    share: float = 0.0


def trim(entries: list[BenchEntry], total_bytes: int, step_s: float, *, steps: int | None, buckets_given: bool,
         warmup_rounds: int, min_rounds: int, default_steps: int = 3, rounds: int | None = None,
         default_rounds: int = 6, costs: Costs = Costs(), warmup_steps: int = 0) -> Trim:
    """The rows, steps and rounds of a replay fitted to :data:`BENCH_TARGET_S` (module docstring): ``steps`` and
    ``rounds`` None and not ``buckets_given`` where the user left them at their defaults (only those are cut);
    ``costs``: the start-up's and the rest (:class:`Costs`); ``warmup_steps``: the warm-up round's as cut before
    (0: ``steps``)."""
    rows, n = list(entries), steps or default_steps
    warm = warmup_steps

    def est() -> float:
        return estimate_s(len(rows), n, warm or n, warmup_rounds, min_rounds, step_s, costs.startup_s,
                          costs.compute_s, costs.share)

    out = Trim(rows, n, warm, step_s, est(), est(), rounds or default_rounds)
    if out.before_s <= BENCH_TARGET_S:
        return _fit_rounds(out, rounds, warmup_rounds, min_rounds, default_rounds, costs)
    if not buckets_given:
        whole = [e for e in rows if (_cap(e) or 0) * 2**20 >= total_bytes]
        keep = next((e for e in whole if e.label == "ddp-all"), whole[-1] if whole else None)
        out.duplicates = [e.label for e in whole if e is not keep]
        rows = [e for e in rows if e.label not in out.duplicates]
        out.dropped += out.duplicates
    if steps is None and est() > BENCH_TARGET_S:
        n, warm, out.steps_cut = min(n, TRIMMED_STEPS), TRIMMED_WARMUP_STEPS, True
    while not buckets_given and est() > BENCH_TARGET_S:
        sweep = [e for e in rows if _cap(e) is not None]
        if not sweep:
            break
        largest = max(sweep, key=lambda e: _cap(e) or 0.0)
        rows.remove(largest)
        out.dropped.append(largest.label)
    out.entries, out.steps, out.warmup_steps, out.after_s = rows, n, warm, est()
    return _fit_rounds(out, rounds, warmup_rounds, min_rounds, default_rounds, costs)


def _fit_rounds(out: Trim, rounds: int | None, warmup_rounds: int, min_rounds: int, default_rounds: int,
                costs: Costs) -> Trim:
    """``out`` with its most rounds lowered to as many as fit :data:`BENCH_TARGET_S` (``--min-rounds`` counted at
    least), unless the user gave ``rounds``."""
    if rounds is not None:
        return out
    counted_s = _per_step_s(len(out.entries), out.step_s, costs.compute_s, costs.share) * (out.steps + 2)
    fit = warmup_rounds + min_rounds + int(max(0.0, BENCH_TARGET_S - out.after_s) // counted_s)
    out.rounds = max(warmup_rounds + min_rounds, min(default_rounds, fit))
    out.rounds_cut = out.rounds < default_rounds
    return out


OUTSIDE_JOB_S = 40.0  # the testbed's hosts up, the ranks launched, the results written: 36 s of BERT-Base's 1067 s


@dataclass(frozen=True)
class Given:
    """What the user set of what the budget may cut (only the rest is cut), and the defaults; in the bench's
    config (``budget``) where a replay runs on the testbed, so that its workers fit the budget again once the
    start-up has measured a step (:func:`after_startup`)."""

    steps: bool
    buckets: bool
    rounds: bool
    default_steps: int = 3
    default_rounds: int = 6
    default_buckets: str = "1,5,25,100,all"  # --ddp-buckets' default, which brings dropped rows back

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Given":
        return cls(**d)

    def lines(self, out: "Trim") -> list[str]:
        """What the output says of ``out``, with the flags that bring each cut back."""
        return out.lines(self.default_buckets, self.default_steps, self.default_rounds)


@dataclass(frozen=True)
class Measured:
    """What a bench's start-up measured, in wall seconds: its phases so far, run-time ``auto``'s warm-up
    estimate where it runs in situ, and the contention probe's step alone and all-reduce of every gradient
    alone (ranks sharing cores as in the rounds)."""

    startup_s: float
    warmup_s: float
    compute_s: float
    allreduce_s: float


def after_startup(entries: list[BenchEntry], total_bytes: int, measured: Measured, given: Given, *, steps: int,
                  warmup_steps: int, rounds: int, warmup_rounds: int, min_rounds: int, share: float) -> Trim:
    """The rows, steps and rounds fitted to :data:`BENCH_TARGET_S` again (:func:`trim`) with what the start-up
    measured instead of the model's step and the 2-minute target: a row's step from the probe
    (:func:`measured_step_s`), the compute-only row's its step alone, the start-up as it went (plus
    :data:`OUTSIDE_JOB_S`, the rows' priming, one all-reduce each, and ``auto``'s warm-up), and the samples
    between the rounds at their ``share``: the pre-launch estimate knows none of these (BERT-Large on 8
    emulated hosts: 849 s estimated, 1206 s run; history in docs/notes/2026-12-bench-runs.md, "The 15-minute
    budget at 8 hosts").  ``steps``, ``warmup_steps`` and ``rounds``: the bench's as launched (cut before the
    launch or given)."""
    step_s = measured_step_s(measured.compute_s, measured.allreduce_s)
    costs = Costs(OUTSIDE_JOB_S + measured.startup_s + len(entries) * measured.allreduce_s + measured.warmup_s,
                  measured.compute_s, share)
    out = trim(entries, total_bytes, step_s, steps=steps if given.steps else None, buckets_given=given.buckets,
               warmup_rounds=warmup_rounds, min_rounds=min_rounds, default_steps=steps,
               rounds=rounds if given.rounds else None, default_rounds=given.default_rounds, costs=costs,
               warmup_steps=warmup_steps)
    out.steps_cut = out.steps_cut or (not given.steps and out.steps < given.default_steps)
    return out
