"""Queued streams: what a process group's asynchronous collectives cost when several are in flight.

gloo runs a process group's asynchronous collectives on its worker threads, at most ``slots``
at once (``ProcessGroupGloo``'s ``threads``: two per device by default), and one reduce-scatter
(an all-to-all) or all-gather alone leaves a shaped link partly idle: measured on 2 testbed hosts
at 1 Gbit/s, a queue of four moved 1.65x (reduce-scatter) and 1.40x (all-gather) the bytes a
second of the same operations one at a time, all-reduces no more (docs/cost-model.md, "Queued
streams").  ``gradsched netbench --queue-depths 2,4`` times each
collective in queues of k operations issued together beside one alone (``queued_points``) and
fits the rule here (``queued``): with ``n <= slots`` operations in flight they move, together,
:meth:`QueuedRule.rate` ``(n)`` times the bytes a second of one alone, shared equally; further
operations wait for a slot.  One operation alone costs exactly its table's time.

The gain is a ratio to one alone at the sizes the queue was timed at; an operation whose table time alone is
already as fast a byte as that queue moved gains nothing (:meth:`QueuedRule.for_operation`): at 8 emulated
hosts on 2 cores a reduce-scatter of 2 MiB alone took 0.172 s (0.201 s in the queue's own timing) and four queued
0.099 s each (2.0x), where one of 1 MiB alone took 0.041 s, 0.84x the queue's seconds a byte: priced at 2.0x,
BERT-Large's ``dear`` of about 100 groups under 1 MiB was predicted at 1.603 s against 2.651 s measured.

Torch-free: the simulator and the planners read it from the cluster.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gradsched.errors import FormatError

MIN_GAIN = 1.0  # a queue is never priced slower than the operations one after another


@dataclass(frozen=True)
class QueuedRule:
    """``slots`` operations of one collective run at once; ``speedup``: how many times the bytes a second of
    one alone they move together when all slots are busy (1 <= speedup <= slots)."""

    slots: int
    speedup: float
    # the deepest queue's seconds per operation per byte, where the rule was timed (None: not known, no cap)
    queue_s_per_byte: float | None = None

    def rate(self, in_flight: int) -> float:
        """Bytes a second of ``in_flight`` operations together, in units of one alone's (linear between one
        and ``slots`` in flight)."""
        n = min(max(in_flight, 1), self.slots)
        if self.slots <= 1:
            return 1.0
        return 1.0 + (self.speedup - 1.0) * (n - 1) / (self.slots - 1)

    def for_operation(self, alone_s: float, nbytes: float) -> "QueuedRule":
        """The rule for one operation of ``nbytes`` that costs ``alone_s`` alone: ``speedup`` at most what brings
        it to the seconds a byte of the queue as timed (``queue_s_per_byte``), never under 1.  A queue gains by
        filling the link one operation alone leaves idle; one alone that already moves its bytes as fast as the
        queue did leaves none to fill (measured once, at the queue's sizes: the cap is that queue's own rate)."""
        if self.queue_s_per_byte is None or nbytes <= 0 or self.queue_s_per_byte <= 0:
            return self
        gain = min(self.speedup, max(MIN_GAIN, alone_s / (nbytes * self.queue_s_per_byte)))
        return self if gain == self.speedup else QueuedRule(self.slots, gain, self.queue_s_per_byte)

    def with_queue_rate(self, queue_s_per_byte: float | None) -> "QueuedRule":
        """This rule capped by the queue's seconds a byte (:meth:`for_operation`)."""
        return QueuedRule(self.slots, self.speedup, queue_s_per_byte)

    def to_dict(self) -> dict[str, float | int]:
        return {"slots": self.slots, "speedup": self.speedup}

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>", where: str = "queued") -> "QueuedRule":
        if not isinstance(data, Mapping):
            raise FormatError(source, where, "must be a JSON object with 'slots' and 'speedup'")
        slots, speedup = data.get("slots"), data.get("speedup")
        if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= 64:
            raise FormatError(source, f"{where}.slots", "must be an integer from 1 to 64")
        if not isinstance(speedup, (int, float)) or isinstance(speedup, bool) or not 1.0 <= speedup <= slots:
            raise FormatError(source, f"{where}.speedup", f"must be a number from 1 to slots ({slots})")
        return cls(slots, float(speedup))


def queue_s_per_byte(by_depth: Mapping[str, Sequence[Sequence[float]]]) -> float | None:
    """The deepest queue's seconds per operation per byte (``queued_points``' units), the median over its sizes;
    None without a queue deeper than one."""
    deeper = [int(k) for k in by_depth if int(k) > 1]
    if not deeper:
        return None
    rates = [float(t) / float(b) for b, t in by_depth[str(max(deeper))] if float(b) > 0 and float(t) > 0]
    return statistics.median(rates) if rates else None


GLOO_SLOTS = 2  # ProcessGroupGloo's worker threads by default (two per device, one device)


def fit_queued(by_depth: Mapping[str, Sequence[Sequence[float]]], slots: int = GLOO_SLOTS) -> QueuedRule | None:
    """The rule from ``{"1": [[bytes, s per operation one at a time], ...], "2": ..., "4": ...}`` (``gradsched
    netbench``'s ``queued_points``): ``speedup`` is the deepest queue's gain, the median over sizes of the time
    one at a time over the queue's time per operation, between 1 and ``slots``.  The deepest, because a steady
    queue keeps every slot busy, while a queue of two ends with one operation running alone (measured: two
    queued gained 1.43x and 1.24x for reduce-scatter and all-gather, four 1.65x and 1.40x).  None without
    depth 1 and another."""
    alone = {float(b): float(t) for b, t in by_depth.get("1", ())}
    deeper = [int(k) for k in by_depth if int(k) > 1]
    if not alone or not deeper:
        return None
    rows = by_depth[str(max(deeper))]
    ratios = [alone[float(b)] / float(t) for b, t in rows if float(b) in alone and float(t) > 0]
    if not ratios:
        return None
    return QueuedRule(slots, min(float(slots), max(MIN_GAIN, statistics.median(ratios))))
