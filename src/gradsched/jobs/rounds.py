"""When a bench's rounds stop: at ``--rounds``, or earlier once a stated rule on the medians holds.

Torch-free; read by the bench's worker (:mod:`gradsched.torch.jobs.bench_worker`) after every round.
A dilated replay's round takes minutes (googlenet-k80 at dilation 20, seven rows: about 4.5), so the
rounds, not the start-up, set how long a default bench takes.  The rule: after at least
``min_counted`` counted rounds, stop once the last round moved no row's median (over every counted
step so far) by more than ``tol`` of it.  Replayed on the step times of 33 earlier bench files at
``tol`` 1% (``docs/bench.md``), it kept every row's median within 1.6% and every speed-up over DDP
within 1.1% of what all the rounds gave.  ``tol`` 0 runs every round.

The machine's load is recorded with the rounds (:class:`RoundLoads`): the 1-minute load average at start-up's end
and at each round's end, so that a row whose rounds ran beside other work is flagged (:func:`loaded_rounds`) rather
than read as the job's own timing (on 8 emulated hosts sharing 2 cores, the small-operation rows' rounds spread 2-3x
more in jobs run beside other sessions' work: docs/notes/2026-12-err11.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROUND_TOL = 0.01  # --round-tol's default: a round that moves no row's median by more than 1% ends the rounds
MIN_COUNTED_ROUNDS = 2  # --min-rounds' default: counted rounds before the rule may stop them


def _pooled(rounds: list[list[float]]) -> float:
    return statistics.median([s for steps in rounds for s in steps])


@dataclass(frozen=True)
class StoppingRule:
    """Stop the rounds once the last one moved no row's median by more than ``tol`` (after ``min_counted``)."""

    tol: float  # 0: never early
    min_counted: int
    warmup: int  # rounds not counted

    def moves(self, times: list[list[list[float]]]) -> list[float]:
        """After each counted round from the second, the largest relative move of any row's median
        (``times``: per row, per round, per step)."""
        rounds = min(len(t) for t in times)
        return [max(abs(_pooled(t[self.warmup:r]) / _pooled(t[self.warmup:r - 1]) - 1) for t in times)
                for r in range(self.warmup + 2, rounds + 1)]

    def settled(self, times: list[list[list[float]]]) -> bool:
        """Whether the rounds so far (``times``: per row, per round, per step) may end the rounds."""
        counted = min(len(t) for t in times) - self.warmup
        if self.tol <= 0 or counted < max(self.min_counted, 2):
            return False
        return self.moves(times)[-1] <= self.tol

    def record(self, times: list[list[list[float]]], max_rounds: int) -> dict[str, Any]:
        """What the JSON says of the rule and how the rounds ended."""
        run = min(len(t) for t in times)
        return {"rule": "stop once the last counted round moved no row's median by more than tol of it, "
                        "after min_counted counted rounds (tol 0: every round)",
                "tol": self.tol, "min_counted": self.min_counted, "max_rounds": max_rounds, "rounds_run": run,
                "moves": self.moves(times), "stopped_early": run < max_rounds}


LOADAVG = "/proc/loadavg"
# A round ran under load where the 1-minute load at its end is above this share of the job's ranks on the machine
# (and above its cores).  A replay's ranks wait out their emulated compute for most of a step, so its own ranks keep
# the load below their number: 8 ranks on this machine's 2 cores ended every quiet 8-host job (runs10, runs11) at
# 1.5-5.4; the jobs run beside other sessions' work ended at 6.8 and above (docs/notes/2026-12-err11.md).  So 6 for 8
# ranks on 2 cores; with no more ranks than cores, a load above the cores means tasks waiting for one.
LOADED_SHARE = 0.75


def load_1min(path: str = LOADAVG) -> float | None:
    """The 1-minute load average (the first field of ``/proc/loadavg``); None where there is none."""
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def loaded_above(ranks: int, cores: int) -> float:
    """The 1-minute load above which a round of a job of ``ranks`` on a machine of ``cores`` ran under others' work
    (:data:`LOADED_SHARE` of the ranks, at least the cores: 6.0 for 8 ranks on 2 cores)."""
    return max(float(cores), LOADED_SHARE * ranks)


@dataclass
class RoundLoads:
    """The 1-minute load at start-up's end (as the rounds begin: rows built, ``auto``'s warm-up done) and at each
    round's end, read by rank 0 (``read``: :func:`load_1min`; a test gives a fake)."""

    read: Callable[[], float | None] = load_1min
    startup_end: float | None = None
    rounds: list[float | None] = field(default_factory=list)

    def at_startup_end(self) -> None:
        self.startup_end = self.read()

    def after_round(self) -> None:
        self.rounds.append(self.read())

    def record(self, ranks: int, cores: int) -> dict[str, Any]:
        """What the JSON's ``load`` says (:class:`gradsched.jobs.results.Load`)."""
        return {"source": f"{LOADAVG}, 1-minute", "startup_end": self.startup_end, "rounds": list(self.rounds),
                "ranks": ranks, "cores": cores, "loaded_above": loaded_above(ranks, cores)}


def loaded_rounds(load: Mapping[str, Any] | None, warmup_rounds: int = 0) -> list[int] | None:
    """The counted rounds (after ``warmup_rounds``; indices into the rounds) whose 1-minute load at their end was above
    the record's ``loaded_above``; None where the job recorded no load (files from before it, or no loadavg)."""
    if not load or not any(x is not None for x in load.get("rounds") or []):
        return None
    limit = load["loaded_above"]
    return [i for i, x in enumerate(load["rounds"]) if i >= warmup_rounds and x is not None and x > limit]
