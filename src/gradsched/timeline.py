"""Timeline: what happened when, on which stream, for one or more iterations.

The simulator produces one (predicted) and the runtime another (measured); both
export the same Chrome-trace JSON (open it in https://ui.perfetto.dev or
chrome://tracing) and the same PNG Gantt chart, so the two can be laid side by side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Categories used by both the simulator and the runtime.
BACKWARD, FORWARD, COMM, SELECT, UPDATE, OTHER, WAIT = "backward", "forward", "comm", "select", "update", "other", "wait"
HOST = "host"  # the runtime's own work per operation on the training thread (issue, retire)


@dataclass(frozen=True, slots=True)
class Event:
    """One span on one track (``start_s``/``dur_s`` in seconds)."""

    name: str
    cat: str
    track: str  # "compute", "comm0", "comm1", ...
    start_s: float
    dur_s: float
    rank: int = 0
    args: dict[str, Any] | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass
class Timeline:
    """Events plus optional memory samples ``(time_s, bytes)`` and metadata."""

    events: list[Event] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, cat: str, track: str, start_s: float, dur_s: float, **args: Any) -> None:
        self.events.append(Event(name, cat, track, start_s, dur_s, 0, args or None))

    def by_cat(self, cat: str) -> list[Event]:
        return [e for e in self.events if e.cat == cat]

    @property
    def end_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    # ------------------------------------------------------------------ export
    def to_chrome_trace(self) -> dict[str, Any]:
        """Chrome trace-event JSON: "X" spans in microseconds, pid = rank, tid = track."""
        out: list[dict[str, Any]] = []
        tracks = sorted({(e.rank, e.track) for e in self.events}, key=lambda rt: (rt[0], _track_key(rt[1])))
        tid_of = {rt: i for i, rt in enumerate(tracks)}
        for rank in sorted({r for r, _ in tracks}):
            out.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        for (rank, track), tid in tid_of.items():
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": track}})
        for e in self.events:
            ev: dict[str, Any] = {"name": e.name, "cat": e.cat, "ph": "X", "ts": e.start_s * 1e6,
                                  "dur": e.dur_s * 1e6, "pid": e.rank, "tid": tid_of[(e.rank, e.track)]}
            if e.args:
                ev["args"] = e.args
            out.append(ev)
        for t, b in self.memory:
            out.append({"name": "extra memory", "ph": "C", "ts": t * 1e6, "pid": 0, "args": {"bytes": b}})
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(self.meta)}

    def save_chrome_trace(self, path: str | Path) -> None:
        from gradsched._files import write_text

        write_text(path, json.dumps(self.to_chrome_trace()))

    @classmethod
    def from_chrome_trace(cls, data: dict[str, Any]) -> "Timeline":
        """Read back spans written by :meth:`to_chrome_trace` (or by the runtime)."""
        names: dict[tuple[int, int], str] = {}
        for ev in data.get("traceEvents", []):
            if ev.get("ph") == "M" and ev.get("name") == "thread_name":
                names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        tl = cls(meta=dict(data.get("otherData", {})))
        for ev in data.get("traceEvents", []):
            if ev.get("ph") == "X":
                track = names.get((ev["pid"], ev["tid"]), str(ev["tid"]))
                tl.events.append(Event(ev["name"], ev.get("cat", ""), track, ev["ts"] / 1e6, ev["dur"] / 1e6,
                                       ev["pid"], ev.get("args")))
        return tl


def _track_key(track: str) -> tuple[int, str]:
    return (0 if track == "compute" else 1, track)
