"""The bench's all-reduce table beyond its measured sizes: on the bandwidth line, not timed."""

import pytest

from gradsched.costs import CollectiveCost
from gradsched.net_extend import MEASURED_MAX_BYTES, extend_points, extended_costs


def test_larger_sizes_lie_on_the_line_through_the_largest_measured_ones():
    alpha, beta = 2e-3, 8e-9  # 1 Gbit/s-ish
    measured = [(float(b), alpha + beta * b) for b in (4096 << k for k in range(14))]  # up to 32 MiB
    table = extend_points(measured, 1 << 30)
    assert table[:len(measured)] == measured  # the measured points as they were
    assert [b for b, _ in table[len(measured):]] == [float(64 << 20 << k) for k in range(5)]  # 64 MiB .. 1 GiB
    for b, t in table[len(measured):]:
        assert t == pytest.approx(alpha + beta * b)
    cost = CollectiveCost.fit(table, envelope=True)
    assert cost.time_s(600e6) == pytest.approx(alpha + beta * 600e6, rel=1e-6)


def test_nothing_added_within_the_measured_sizes_and_never_a_falling_line():
    measured = [(1e6, 0.010), (2e6, 0.030), (4e6, 0.020)]  # noise: the largest measured below the one before
    assert extend_points(measured, 4e6) == measured
    grown = extend_points(measured, 16e6)
    assert [t for _, t in grown[3:]] == [0.020 + (0.020 - 0.010) / 3e6 * 4e6, 0.020 + (0.020 - 0.010) / 3e6 * 12e6]
    assert MEASURED_MAX_BYTES >= 4 << 20  # beyond the latency-bound sizes the bench samples again


def test_reduce_scatter_and_all_gather_go_on_at_their_largest_sizes_rate_the_all_reduce_on_its_line():
    # per-byte time rising over the measured sizes (gloo's all-to-all at 1 Gbit/s: 17.6 ns/B at 4 MiB a
    # rank, 21.7 at 16 MiB); measured further it stays near the largest size's rate, not the rise's slope
    mib = float(1 << 20)
    rising = [(4 * mib, 0.0738), (8 * mib, 0.1581), (16 * mib, 0.3646)]
    line = [(b, 1e-3 + 8e-9 * b) for b in (4 * mib, 8 * mib, 16 * mib)]
    costs = extended_costs({"reducescatter": rising, "allgather": rising, "allreduce": line},
                           ["allreduce", "reducescatter", "allgather"], int(128 * mib))
    for name in ("reducescatter", "allgather"):
        assert costs[name].time_s(128 * mib) == pytest.approx(0.3646 * 8, rel=1e-9)  # 2.92 s, not 3.08 s
        assert costs[name].time_s(16 * mib) == pytest.approx(0.3646)  # the measured sizes as measured
    assert costs["allreduce"].time_s(128 * mib) == pytest.approx(1e-3 + 8e-9 * 128 * mib)  # its line, as before


def _table_s(sizes: list[int], op_s, reps: int = 3) -> float:
    """What timing ``sizes`` costs as the bench's table times them: a warm-up and ``reps`` repetitions, each a
    lead and a run of at least 8 MiB in all, at most 64 operations (gradsched.torch.measure.netbench)."""
    return sum((reps + 1) * (1 + max(1, min(64, -(-(8 << 20) // b)))) * op_s(b) for b in sizes)


def test_the_table_on_a_slow_link_stops_at_its_first_bandwidth_bound_size_within_its_budget():
    from gradsched.net_extend import TABLE_BUDGET_S, TABLE_FLOOR_BYTES, measured_top, table_floor

    # googlenet-k80 at 1 Gbit/s and --dilate 20 (links at 50 Mbit/s, 2 hosts): 4 KiB in 1.64 ms, 1 MiB in 176 ms
    sizes = [4096 << k for k in range(14)]
    alpha, beta = 1.0e-3, 1.67e-7

    def op_s(b: int) -> float:
        return alpha + beta * b

    floor = table_floor(op_s(4096), op_s(1 << 20))
    assert floor == 128 << 10  # latency 1 ms against 23 ms: bandwidth-bound; 64 KiB is not (1 ms of 12)
    top = measured_top(sizes, lambda b: _table_s([b], op_s), floor_bytes=floor)
    assert floor <= top < TABLE_FLOOR_BYTES
    assert _table_s([b for b in sizes if b <= top], op_s) <= TABLE_BUDGET_S  # the old 2 MiB floor: 34 s
    assert _table_s([b for b in sizes if b <= TABLE_FLOOR_BYTES], op_s) > 1.5 * TABLE_BUDGET_S
    # the line through the largest sizes timed prices all of googlenet's gradients as the link does
    table = extend_points([(float(b), op_s(b)) for b in sizes if b <= top], 64 << 20)
    assert CollectiveCost.fit(table, envelope=True).time_s(53_516_544) == pytest.approx(op_s(53_516_544), rel=1e-3)
    # a fast link (1 Gbit/s, 0.2 ms latency): the floor stays at most 2 MiB, and its budget never binds there
    assert table_floor(2e-4 + 8.6e-9 * 4096, 2e-4 + 8.6e-9 * (1 << 20)) <= TABLE_FLOOR_BYTES
    assert table_floor(1e-3, 1e-3) == TABLE_FLOOR_BYTES  # no slope measured: the fixed floor


# googlenet-k80 on 4 testbed hosts at 1 Gbit/s, --dilate 2 (bench_replay_googlenet_k80_4h_1gbit_queued.json): the
# table stopped at 512 KiB a rank, a reduce-scatter there 48.75 ms (93 ns a rank byte), an all-gather 37.75 ms
_RS_4H = [(4096.0, 2.83e-3), (65536.0, 5.40e-3), (262144.0, 23.43e-3), (524288.0, 48.75e-3)]
_AG_4H = [(4096.0, 8.27e-3), (65536.0, 10.39e-3), (262144.0, 20.74e-3), (524288.0, 37.75e-3)]


def _bench_estimate(b: int, reps: int = 3) -> float:
    """Seconds the bench expects timing both phases at ``b`` bytes a rank to take: a warm-up and ``reps``
    repetitions as the table times them, at the largest measured size's rate (bench_network._time_two_phase)."""
    return _table_s([b], lambda s: s * (_RS_4H[-1][1] / _RS_4H[-1][0] + _AG_4H[-1][1] / _AG_4H[-1][0]), reps)


def test_the_two_phases_are_timed_up_to_the_models_largest_group_within_their_budget():
    from gradsched.bundled import bundled_profile
    from gradsched.net_extend import TWO_PHASE_BUDGET_S, two_phase_sizes
    from gradsched.planners.dear import nearby_groups, threshold_groups, largest_group_bytes
    from gradsched.planners._tables import tensor_table

    profile = bundled_profile("googlenet-k80")
    nbytes = tensor_table(profile).nbytes
    groups = threshold_groups(profile, 25e6) + nearby_groups(profile, 4) + threshold_groups(profile, 4e6)
    assert largest_group_bytes(profile) == max(sum(nbytes[t] for t in g) for g in groups)
    largest = -(-largest_group_bytes(profile) // 4)  # a rank's part on 4 hosts: 5.9 MiB
    sizes = two_phase_sizes(512 << 10, largest, _bench_estimate)
    assert sizes and max(sizes) >= largest and min(sizes) > 512 << 10  # beyond the table's top, up to the group
    assert sizes == sorted(set(sizes))
    assert sum(_bench_estimate(b) for b in sizes) <= TWO_PHASE_BUDGET_S
    # dear's 4 MB groups (about 1 MiB a rank) lie between two timed sizes, not on the line from 512 KiB
    assert min(sizes) <= 2 << 20
    # a table already past the largest group times nothing more; a slow link, what fits the budget
    assert two_phase_sizes(16 << 20, largest, _bench_estimate) == []
    slow = two_phase_sizes(512 << 10, largest, lambda b: 2 * _bench_estimate(b))
    assert slow and max(slow) < largest and sum(2 * _bench_estimate(b) for b in slow) <= TWO_PHASE_BUDGET_S
    assert two_phase_sizes(512 << 10, largest, lambda b: 1e9) == []  # nothing fits: the table as before


def test_a_measured_large_point_prices_the_two_phases_as_measured_not_on_the_line_from_the_top():
    mib = float(1 << 20)
    before = extended_costs({"reducescatter": _RS_4H}, ["reducescatter"], int(64 * mib))["reducescatter"]
    # the same table with 2 and 8 MiB a rank timed as the bench now times them: 60 and 45 ns a rank byte
    large = _RS_4H + [(2 * mib, 60e-9 * 2 * mib), (8 * mib, 45e-9 * 8 * mib)]
    after = extended_costs({"reducescatter": large}, ["reducescatter"], int(64 * mib))["reducescatter"]
    assert after.time_s(8 * mib) == pytest.approx(45e-9 * 8 * mib)  # as measured
    assert after.time_s(2 * mib) == pytest.approx(60e-9 * 2 * mib)
    assert before.time_s(8 * mib) == pytest.approx(_RS_4H[-1][1] * 16)  # on the line from 512 KiB: 2.07x
    assert after.time_s(32 * mib) == pytest.approx(45e-9 * 32 * mib)  # beyond: at the largest timed rate
    assert after.time_s(512 << 10) == pytest.approx(_RS_4H[-1][1])  # the table's own sizes unchanged
    assert _RS_4H[-1][1] < after.time_s(mib) < after.time_s(2 * mib)  # between: on the measured points


def test_the_queued_rule_is_measured_at_the_groups_sizes_within_its_budget():
    from gradsched.net_extend import QUEUE_BUDGET_S, queue_sizes

    def queued_s(b: int) -> float:  # 4 deep: a warm-up queue, 3 repetitions of 4 one at a time and 4 queued
        return 4 * 7 * b * (_RS_4H[-1][1] / _RS_4H[-1][0] + _AG_4H[-1][1] / _AG_4H[-1][0])

    sizes = queue_sizes(8 << 20, queued_s)
    assert sizes == [1 << 20, 4 << 20]  # the 4-host table timed to 8 MiB a rank: 1 and 4 MiB, not 512 KiB
    assert sum(queued_s(b) for b in sizes) <= QUEUE_BUDGET_S
    assert queue_sizes(16 << 20, lambda b: 1.0) == [1 << 20, 4 << 20, 16 << 20]  # a fast link: every size
    assert queue_sizes(16 << 20, lambda b: 1e3) == [1 << 20]  # the smallest whatever it costs
    assert queue_sizes(512 << 10, queued_s) == []  # a table that stops below them: none (a2a12; was its top)
