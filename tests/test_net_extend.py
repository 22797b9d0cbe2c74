"""The bench's all-reduce table beyond its measured sizes: on the bandwidth line, not timed."""

import pytest

from gradsched.costs import CollectiveCost
from gradsched.net_extend import MEASURED_MAX_BYTES, extend_points


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
