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
