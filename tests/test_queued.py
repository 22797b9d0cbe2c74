"""Queued streams (issue 36, docs/cost-model.md "Queued streams"): reduce-scatters and all-gathers in
flight several at once, the link's rate shared, fitted from ``gradsched netbench --queue-depths``.

The case of test_two_phase.py: tensors t0, t1, t2 of 400, 400 and 800 bytes, gradients ready at
t2: 0.1, t1: 0.3, t0: 0.6, each forward 0.1 s; a reduce-scatter or all-gather of n bytes costs
0.05 + 0.0005 n alone: RS/AG(400) = 0.25, RS/AG(1200) = 0.65.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster
from gradsched.errors import FormatError, GradschedError
from gradsched.netbench_args import parse_depths
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER, Operation, Plan, Slice
from gradsched.queued import QueuedRule, fit_queued
from gradsched.sim import simulate
from gradsched.sim._queued import schedule_queued
from gradsched.sim.engine import _schedule

RULES = {"reducescatter": {"slots": 2, "speedup": 1.5}, "allgather": {"slots": 2, "speedup": 2.0}}


def queued(cluster: Cluster, rules=RULES) -> Cluster:
    return dataclasses.replace(cluster, extra={**cluster.extra, "queued": rules})


def whole(profile, *tensors):
    return tuple(Slice(t, 0, profile.tensors[t].numel) for t in tensors)


def two_phase(profile, scheduling="fifo"):
    """RS(t2, t1), RS(t0), AG(t0), AG(t2, t1)."""
    ops = (Operation(whole(profile, 2, 1), REDUCE_SCATTER, 0), Operation(whole(profile, 0), REDUCE_SCATTER, 1),
           Operation(whole(profile, 0), ALL_GATHER, 2), Operation(whole(profile, 2, 1), ALL_GATHER, 3))
    return Plan("hand", ops, profile.fingerprint, profile.model, scheduling=scheduling, overlap_forward=True)


def test_queued_phases_share_the_link_two_at_a_time(case):
    # RS(t2,t1) alone 0.3-0.6 (0.35 left); with RS(t0) from 0.6 each at 1.5/2: RS(t0) ends 0.6 + 0.25/0.75;
    # AG(t0) starts then beside RS(t2,t1) (0.1 left at 0.75: ends +0.1/0.75); AG(t2,t1) starts then, both
    # all-gathers at 2/2: AG(t0) ends with its last 0.25 - 0.1/0.75; AG(t2,t1) alone after it
    profile, cluster = case
    r = simulate(two_phase(profile), profile, queued(cluster))
    rs0_end = 0.6 + 0.25 / 0.75
    rs1_end = rs0_end + 0.1 / 0.75
    ag0_end = rs1_end + (0.25 - (rs1_end - rs0_end))
    ag1_end = ag0_end + 0.65 - (ag0_end - rs1_end)
    assert r.op_start_s == pytest.approx([0.3, 0.6, rs0_end, rs1_end])
    assert r.op_end_s == pytest.approx([rs1_end, rs0_end, ag0_end, ag1_end])
    assert r.comm_s == pytest.approx(ag1_end - 0.3)  # busy from the first start to the last end, counted once
    assert r.iteration_s == pytest.approx(ag1_end + 0.2)  # t0 ran after AG(t0); t1, t2 wait for AG(t2,t1)
    before = simulate(two_phase(profile), profile, cluster)  # one at a time, as without the rule
    assert before.op_end_s == pytest.approx([0.95, 1.2, 1.45, 2.1])
    assert r.iteration_s < before.iteration_s


def test_priority_order_issues_the_most_urgent_ready_operation_into_a_free_slot(case):
    profile, cluster = case
    r = simulate(two_phase(profile, "priority"), profile, queued(cluster))
    assert r.op_start_s[:2] == pytest.approx([0.3, 0.6])  # both slots: the second reduce-scatter does not wait
    assert max(r.op_end_s) < 2.1


def test_a_rule_that_gains_nothing_or_a_plan_with_all_reduces_is_priced_as_before(case):
    profile, cluster = case
    plan = two_phase(profile)
    flat = queued(cluster, {"reducescatter": {"slots": 2, "speedup": 1.0}, "allgather": {"slots": 2, "speedup": 1.0}})
    assert simulate(plan, profile, flat).op_end_s == simulate(plan, profile, cluster).op_end_s
    ar = Plan("ar", (Operation(whole(profile, 2, 1, 0), "allreduce", 0),), profile.fingerprint, profile.model)
    with_rule = queued(cluster, {**RULES, "allreduce": {"slots": 2, "speedup": 2.0}})
    assert simulate(ar, profile, with_rule).op_end_s == simulate(ar, profile, cluster).op_end_s


def test_old_cluster_files_load_and_the_rule_round_trips(case, tmp_path):
    _, cluster = case
    assert cluster.queued_rule(REDUCE_SCATTER) is None
    path = tmp_path / "c.json"
    queued(cluster).save(path)
    back = Cluster.load(path)
    assert back.queued_rule(REDUCE_SCATTER) == QueuedRule(2, 1.5)
    assert back.queued_rule("allgather") == QueuedRule(2, 2.0)
    with pytest.raises(FormatError, match="queued.allgather.speedup"):
        queued(cluster, {"allgather": {"slots": 2, "speedup": 3.0}}).queued_rule(ALL_GATHER)


def test_fit_reads_the_deepest_queues_gain_on_gloos_two_slots():
    one = [[1 << 20, 0.02], [1 << 24, 0.30], [1 << 25, 0.6]]
    rule = fit_queued({"1": one, "2": [[1 << 20, 0.015], [1 << 24, 0.25], [1 << 25, 0.5]],
                       "4": [[1 << 20, 0.0125], [1 << 24, 0.2], [1 << 25, 0.375]]})
    assert rule == QueuedRule(2, pytest.approx(1.6))
    assert fit_queued({"1": one, "4": [[1 << 20, 0.005], [1 << 24, 0.05]]}) == QueuedRule(2, 2.0)  # at most slots
    slower = fit_queued({"1": one, "2": [[1 << 20, 0.03], [1 << 24, 0.4]]})
    assert slower == QueuedRule(2, 1.0)  # a queue is never priced slower than one at a time
    assert fit_queued({"1": one}) is None


def test_queue_depths_flag():
    assert parse_depths("2,4") == (2, 4) and parse_depths("") == ()
    for bad in ("1", "two", "2,99"):
        with pytest.raises(GradschedError, match="--queue-depths"):
            parse_depths(bad)


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=8),
       gaps=st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8),
       slots=st.integers(1, 4), gain=st.floats(0.0, 1.0), fifo=st.booleans())
def test_one_operation_alone_is_priced_as_before_and_a_queue_never_ends_later(costs, gaps, slots, gain, fifo):
    n = len(costs)
    ready = [sum(gaps[:j + 1]) for j in range(n)]  # in plan order, as a backward makes them
    rule = QueuedRule(slots, 1.0 + gain * (slots - 1))
    start, end = [0.0] * n, [0.0] * n
    schedule_queued(fifo, list(range(n)), list(ready), costs, [rule] * n, start, end, lambda s, w: s + w,
                    [-1] * n, 0.0)
    ops = tuple(Operation((Slice(0, 0, 1),), "allreduce", j) for j in range(n))
    plan = Plan("x", ops, "f", "m", scheduling="fifo" if fifo else "priority")
    s1, e1 = [0.0] * n, [0.0] * n
    _schedule(plan, list(ready), costs, [1] * n, 1, s1, e1)  # one channel, one at a time
    assert max(end) <= max(e1) + 1e-9
    assert all(s >= r - 1e-12 for s, r in zip(start, ready))
    if n == 1:
        assert end == pytest.approx(e1) and start == pytest.approx(s1)


@pytest.mark.slow
def test_netbench_times_queues_beside_one_at_a_time_and_writes_the_rule(tmp_path):
    from gradsched.cli import main

    out = tmp_path / "c.json"
    assert main(["netbench", "--nproc", "2", "--collectives", "allgather,allreduce", "--min-bytes", "1048576",
                 "--max-bytes", "4194304", "--reps", "1", "--warmup", "0", "--queue-depths", "2", "-q",
                 "-o", str(out)]) == 0
    cluster = Cluster.load(out)
    points = cluster.extra["queued_points"]["allgather"]
    assert sorted(points) == ["1", "2"] and [b for b, _ in points["2"]] == [1 << 20, 2 << 20]  # 1 MiB a rank up
    assert cluster.queued_rule(ALL_GATHER).slots == 2 and cluster.queued_rule("allreduce") is not None


def test_an_operation_alone_as_fast_a_byte_as_the_timed_queue_gains_nothing():
    rule = QueuedRule(2, 2.0, queue_s_per_byte=1e-3)  # the queue moved an operation's byte in 1 ms
    assert rule.for_operation(0.5, 1000).speedup == 1.0  # alone 0.5 ms a byte: already faster than the queue
    assert rule.for_operation(1.5, 1000).speedup == pytest.approx(1.5)  # up to the queue's rate
    assert rule.for_operation(3.0, 1000).speedup == 2.0  # never past the fitted gain
    assert QueuedRule(2, 2.0).for_operation(0.5, 1000) == QueuedRule(2, 2.0)  # no queue timing: as before


def test_the_cluster_reads_the_queues_rate_per_whole_group_byte(case):
    _, cluster = case  # 2 ranks: queued_points are per rank bytes, a plan operation's bytes the whole group's
    points = {"reducescatter": {"1": [[100.0, 0.2]], "4": [[100.0, 0.1], [300.0, 0.2]]}}
    with_points = dataclasses.replace(queued(cluster), extra={**queued(cluster).extra, "queued_points": points})
    rule = with_points.queued_rule(REDUCE_SCATTER)
    assert rule.speedup == 1.5 and rule.queue_s_per_byte == pytest.approx((0.1 / 100 + 0.2 / 300) / 2 / 2)
    assert with_points.queued_rule(ALL_GATHER).queue_s_per_byte is None  # no points: uncapped, as before


def test_queued_phases_gain_only_down_to_the_queues_timed_rate(case):
    # alone RS/AG(400) = 0.25 s (6.25e-4 s a byte), RS/AG(1200) = 0.65 s (5.4e-4 s a byte)
    profile, cluster = case
    plan = two_phase(profile)

    def timed(per_rank_s_per_byte: float) -> Cluster:
        pts = {"1": [[200.0, 1.0]], "4": [[200.0, 200.0 * per_rank_s_per_byte]]}
        c = queued(cluster)
        return dataclasses.replace(c, extra={**c.extra, "queued_points": {"reducescatter": pts, "allgather": pts}})

    alone = simulate(plan, profile, cluster)
    uncapped = simulate(plan, profile, queued(cluster))
    # a queue timed as slow a byte as either alone: no operation gains, priced one at a time as without the rule
    assert simulate(plan, profile, timed(2 * 6.25e-4)).op_end_s == pytest.approx(alone.op_end_s)
    # a queue timed far faster: the fitted gains, as before
    assert simulate(plan, profile, timed(1e-9)).op_end_s == pytest.approx(uncapped.op_end_s)
    # between (4.6e-4 s a whole byte): the 400-byte operations gain 1.36x, the 1200-byte ones 1.18x (<= 1.5, 2.0)
    between = simulate(plan, profile, timed(2 * 4.6e-4)).iteration_s
    assert uncapped.iteration_s < between < alone.iteration_s
