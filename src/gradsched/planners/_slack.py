"""Near-tied plans: prefer the one that leaves the link slack during the backward.

Where communication hides behind the backward, many plans are predicted within a fraction of a
percent of each other: more operations start earlier but pay more start-ups, so the best-predicted
plan is often the one that keeps the link busiest while the backward runs.  Where the link runs
slower during compute than alone (CPU collectives sharing cores with the model: 8 ranks on 2 cores
measured a channel 1.1-3x slower during the backward, by load), such a plan has no slack to absorb
it and ends late, while one with fewer operations and idle gaps does not (docs/notes/
2026-12-bench-runs.md, "Where `auto`'s 130 ms go").  ``auto`` therefore ranks every candidate
predicted within ``slack`` (a fraction, :data:`SLACK_TOLERANCE` by default) of the best by the
seconds its channels are busy before the backward ends (:func:`busy_in_backward_s`), least first;
it never picks a plan predicted more than ``slack`` slower than the best.
"""

from __future__ import annotations

from typing import Sequence

SLACK_TOLERANCE = 0.01  # auto's default: plans predicted within 1% of the best are near-tied
# optimal's channel stretches auto adds as candidates where slack > 0: the two the stored 8-host runs picked
# (1.1 only BERT-Large, for 268 -> 252 ms busy; 1.1-2 all four made auto's worst 1,000-tensor case 243 ms, these 186)
STRETCHES = (1.25, 1.5)


def busy_in_backward_s(op_start_s: Sequence[float], op_end_s: Sequence[float], backward_end_s: float) -> float:
    """Seconds of communication (summed over operations, so over channels) before ``backward_end_s``."""
    return float(sum(max(0.0, min(e, backward_end_s) - s) for s, e in zip(op_start_s, op_end_s)))


def near(predicted_s: Sequence[float], ranking_s: Sequence[float], slack: float) -> list[int]:
    """Indices of the candidates near-tied with the best: ranked (``ranking_s``) and predicted within
    ``slack`` of the best-ranked one (so none is predicted more than ``slack`` slower than it)."""
    if not ranking_s:
        return []
    top = min(range(len(ranking_s)), key=lambda i: ranking_s[i])
    cap_rank = ranking_s[top] * (1 + slack) * (1 + 1e-12)
    cap_pred = predicted_s[top] * (1 + slack) * (1 + 1e-12)
    return [i for i in range(len(ranking_s)) if ranking_s[i] <= cap_rank and predicted_s[i] <= cap_pred]
