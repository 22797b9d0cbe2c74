"""benchmarks/trace_network.py's reading of a measured trace, on synthetic events (no testbed)."""

from __future__ import annotations

import pytest

from gradsched.timeline import Event
from scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/trace_network.py", "trace_network_bench")


def _ev(cat: str, ts_ms: float, dur_ms: float, iteration: int, **args) -> Event:
    return Event(cat, cat, "compute", ts_ms / 1e3, dur_ms / 1e3, 0, {"iteration": iteration, **args})


def test_time_on_the_wire_excludes_queueing_behind_the_previous_operation(bench):
    events = [
        _ev("comm", -50, 40, 0, op=5, bytes=1),  # the previous iteration's last op, done at -10
        _ev("backward", 0, 100, 1),
        _ev("comm", 10, 30, 1, op=0, bytes=3_000_000),  # alone: 30 ms on the wire
        _ev("comm", 20, 50, 1, op=1, bytes=2_000_000),  # issued at 20, queued until 40: 30 ms on the wire
        _ev("comm", 100, 150, 1, op=2, bytes=16_000_000),  # issued after backward: 150 ms
        _ev("wait", 110, 140, 1),  # the next forward's first layer waits for op 2
        _ev("wait", 255, 5, 1),
        _ev("backward", 400, 100, 2),
        _ev("wait", 600, 99, 2),  # after the next backward: not this iteration's forward
    ]
    b = bench.iteration_breakdown(events, 1)
    assert [o["op"] for o in b["ops"]] == [0, 1, 2]
    assert [round(o["on_wire_ms"], 6) for o in b["ops"]] == [30, 30, 150]
    assert b["ops"][1]["mb_per_s"] == pytest.approx(2_000_000 / 30e3)
    assert b["backward_end_ms"] == 100 and b["network_end_ms"] == 250 and b["on_wire_ms"] == pytest.approx(210)
    assert b["first_forward_wait_ms"] == 140 and b["forward_waits_ms"] == 145
