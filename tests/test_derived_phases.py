"""Reduce-scatter and all-gather the network table did not time: derived from the all-reduce at the measured
ratio over half of it (gradsched.costs.DERIVED_PHASE_RATIOS), a cluster file's own ratios winning."""

from __future__ import annotations

import pytest

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.costs import derived_phase_ratio

AR = CollectiveCost(0.002, 4e-9)


def _cluster(backend: str, world: int, **extra) -> Cluster:
    return Cluster(world, {"allreduce": AR}, backend, extra=extra)


def test_gloo_at_8_ranks_is_not_half() -> None:
    rs = _cluster("gloo", 8).cost("reducescatter")
    half = AR.beta_s_per_byte * 8 / 2
    assert rs.alpha_s == pytest.approx(AR.alpha_s / 2)
    assert rs.beta_s_per_byte == pytest.approx(half * derived_phase_ratio("gloo", 8, "reducescatter"))
    assert rs.beta_s_per_byte > 1.5 * half


def test_a_backend_without_ratios_keeps_half() -> None:
    for name in ("reducescatter", "allgather"):
        cost = _cluster("nccl", 8).cost(name)
        assert (cost.alpha_s, cost.beta_s_per_byte) == pytest.approx((AR.alpha_s / 2, AR.beta_s_per_byte * 4))


def test_the_files_ratios_win_and_round_trip() -> None:
    cluster = _cluster("gloo", 8, derived_phase_ratios={"reducescatter": 1.0, "allgather": 3.0})
    again = Cluster.from_dict(cluster.to_dict())
    assert again.cost("reducescatter").beta_s_per_byte == pytest.approx(AR.beta_s_per_byte * 4)
    assert again.cost("allgather").beta_s_per_byte == pytest.approx(AR.beta_s_per_byte * 4 * 3.0)


@pytest.mark.parametrize("bad", [{"reducescatter": 0}, {"reducescatter": -1.0}, {"allreduce": 2.0}, [2.0]])
def test_a_bad_ratio_in_the_file_is_an_error(bad) -> None:
    from gradsched.errors import FormatError

    data = _cluster("gloo", 8).to_dict()
    with pytest.raises(FormatError, match="derived_phase_ratios"):
        Cluster.from_dict({**data, "derived_phase_ratios": bad})


def test_measured_phases_are_not_scaled() -> None:
    measured = CollectiveCost(0.001, 1e-8)
    cluster = Cluster(8, {"allreduce": AR, "reducescatter": measured}, "gloo")
    assert cluster.cost("reducescatter") == measured


@pytest.mark.parametrize("world, expected", [(2, 2), (3, 2), (4, 4), (7, 4), (8, 8), (64, 8), (1, 2)])
def test_the_ratio_is_the_largest_measured_rank_count_at_or_below(world: int, expected: int) -> None:
    assert derived_phase_ratio("gloo", world, "allgather") == derived_phase_ratio("gloo", expected, "allgather")


def test_a_dear_operation_costs_more_than_half_the_all_reduce_on_gloo() -> None:
    from gradsched.plan import REDUCE_SCATTER

    n = 1 << 24
    gloo = _cluster("gloo", 8).operation_cost(REDUCE_SCATTER).time_s(n)
    ring = _cluster("nccl", 8).operation_cost(REDUCE_SCATTER).time_s(n)
    assert ring == pytest.approx(AR.time_s(n) / 2)
    assert gloo > 1.5 * ring
