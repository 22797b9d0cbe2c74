"""gradsched.calibration without torch: measurements -> Profile and Cluster, contention, bounds, auto's rules."""

from __future__ import annotations

import pytest

from gradsched.calibration import (StepRecord, decide, fastest, fit_cluster, issue_times, measured_profile,
                                   service_points)
from gradsched.profile import Profile, TensorProfile
from gradsched.timeline import BACKWARD, COMM, FORWARD, UPDATE, WAIT, Event


# --------------------------------------------------------------------------- measurements -> profile, cluster
def _base() -> Profile:
    """Two layers: layer 0 owns tensors 0, 1 (weight, bias); layer 1 owns tensor 2."""
    return Profile("toy", (TensorProfile("a.w", 100, 400, 0, 0, layer=0), TensorProfile("a.b", 10, 40, 0, 0, layer=0),
                           TensorProfile("h.w", 50, 200, 0, 0, layer=1)))


def _iteration(it: int, t0: float, ready: dict[int, float], ops: list[tuple[int, float, float, int]]) -> list[Event]:
    """Events of one traced iteration starting at ``t0``: forward 0.010 s (with a 0.002 s wait
    inside), backward from t0 + 0.010, the given ready offsets, then operations."""
    ev = [Event("forward", FORWARD, "compute", t0, 0.010, 0, {"iteration": it}),
          Event("wait a.w", WAIT, "compute", t0 + 0.001, 0.002, 0, {"iteration": it})]
    bwd0 = t0 + 0.010
    last = bwd0
    for i, r in sorted(ready.items(), key=lambda kv: kv[1]):
        ev.append(Event(f"t{i}", BACKWARD, "compute", last, bwd0 + r - last, 0, {"iteration": it, "tensor": i}))
        last = bwd0 + r
    ev.append(Event("wait for communication", WAIT, "compute", last, 0.003, 0, {"iteration": it}))
    ev.append(Event("update", UPDATE, "compute", last + 0.003, 0.001, 0, {"iteration": it}))
    for op, start, dur, nbytes in ops:
        ev.append(Event(f"op{op}", COMM, "comm0", bwd0 + start, dur, 0, {"iteration": it, "op": op, "bytes": nbytes}))
    return ev


def test_measured_profile_reproduces_medians_of_ready_times_and_splits_the_iteration():
    events, steps = [], []
    for k, jitter in enumerate((0.0, 0.004, 0.001)):  # the median iteration is the last one
        t0 = 0.1 * k
        events += _iteration(k + 7, t0, {2: 0.020 + jitter, 1: 0.050 + jitter, 0: 0.052 + jitter}, [])
        steps.append(StepRecord(k, k + 7, t0, t0 + 0.080))
    p = measured_profile(_base(), events, steps)
    assert p.order == (2, 1, 0)
    assert p.ready_s == pytest.approx((0.053, 0.053, 0.021))  # a layer is ready with its last tensor
    assert p.tensors[2].backward_s == pytest.approx(0.021) and p.tensors[0].backward_s == pytest.approx(0.032)
    assert p.tensors[1].backward_s == 0 and p.tensors[1].forward_s == 0  # the layer's time sits on its first tensor
    assert p.forward_s == pytest.approx(0.008)  # forward minus the wait inside it
    # the rest of the 80 ms: 80 - forward 8 - backward 53 - waits (2 + 3) = 14 ms (loss, update, data...)
    assert p.other_s == pytest.approx(0.014)
    assert p.fingerprint == _base().fingerprint


def _flat(points: list[tuple[int, float]]) -> list[float]:
    return [x for p in points for x in p]


def test_service_time_excludes_queueing_and_waiting_for_a_late_peer():
    # op0 issued at 1 ms, done at 3 ms; op1 issued at 2 ms (queued behind op0), done at 7 ms
    events = _iteration(0, 0.0, {0: 0.001, 1: 0.001, 2: 0.001}, [(0, 0.001, 0.002, 400), (1, 0.002, 0.005, 4000)])
    steps = [StepRecord(0, 0, 0.0, 0.05)]
    assert _flat(service_points(events, steps)) == pytest.approx([400, 0.002, 4000, 0.004])
    # the peer issued op0 only at 2.5 ms: its all-reduce really took 0.5 ms
    peer = issue_times(_iteration(0, 0.0, {}, [(0, 0.0025, 0.0005, 400), (1, 0.002, 0.005, 4000)]), steps)
    assert peer == {0: {0: pytest.approx(0.0125), 1: pytest.approx(0.012)}}
    late = {0: {0: 0.0125, 1: 0.012}}
    assert _flat(service_points(events, steps, [late])) == pytest.approx([400, 0.0005, 4000, 0.004])


def test_fit_cluster_recovers_a_line_from_medians():
    alpha, beta = 2e-4, 1e-9
    points = {b: [alpha + beta * b, 5 * (alpha + beta * b), alpha + beta * b] for b in (1 << 10, 1 << 16, 1 << 20)}
    c = fit_cluster(points, 2, "gloo")
    assert c.cost("allreduce").alpha_s == pytest.approx(alpha, rel=1e-6)
    assert c.cost("allreduce").beta_s_per_byte == pytest.approx(beta, rel=1e-6)


# --------------------------------------------------------------------------- auto's decision rules
def test_decide_reverts_to_a_plan_that_measured_faster():
    # the current plan (b) measured 120 ms; plan a measured 100 ms before: revert to a
    assert decide("b", 0.120, 0.080, {"a": 0.100, "b": 0.120}, 0.15) == ("revert", "a")
    # within the threshold of the best measured: no revert; measured near predicted: keep
    assert decide("b", 0.110, 0.105, {"a": 0.100, "b": 0.110}, 0.15) == ("keep", None)
    # off the prediction, nothing better measured: re-plan
    assert decide("b", 0.150, 0.100, {"b": 0.150}, 0.15) == ("replan", None)
    assert decide("b", 0.090, 0.120, {"a": 0.100, "b": 0.090}, 0.15) == ("replan", None)
    # one slow window (150 ms) of a plan whose iterations so far measured 105 ms: no revert to a's
    # 100 ms; the window is still off the prediction, so the plan is re-derived from measurements
    assert decide("b", 0.150, 0.105, {"a": 0.100, "b": 0.105}, 0.15) == ("replan", None)
    assert decide("b", 0.110, 0.105, {"a": 0.100, "b": 0.105}, 0.15) == ("keep", None)


def test_trials_keep_ddps_buckets_unless_clearly_beaten():
    assert fastest({"a": 0.099, "ddp": 0.100, "b": 0.120}, "ddp", 0.03) == "ddp"  # 1% faster: noise
    assert fastest({"a": 0.090, "ddp": 0.100, "b": 0.120}, "ddp", 0.03) == "a"  # 10% faster: keep it
    assert fastest({"a": 0.099, "ddp": 0.100}, "ddp", 0.0) == "a"  # min_gain 0: the plain minimum
    assert fastest({"a": 0.099, "b": 0.100}, None, 0.03) == "a"  # no baseline measured: the minimum
    assert fastest({"a": 0.110, "ddp": 0.100}, "ddp", 0.03) == "ddp"
