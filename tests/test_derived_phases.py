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


def test_a_dear_operation_under_the_ring_threshold_costs_more_than_half_the_all_reduce_on_gloo() -> None:
    from gradsched.plan import REDUCE_SCATTER

    n = 1 << 20  # under 4 MiB: the all-to-alls (from it, a ring: tests/test_ring_phases.py)
    gloo = _cluster("gloo", 8).operation_cost(REDUCE_SCATTER).time_s(n)
    ring = _cluster("nccl", 8).operation_cost(REDUCE_SCATTER).time_s(n)
    assert ring == pytest.approx(AR.time_s(n) / 2)
    assert gloo > 1.5 * ring


def test_a_file_without_the_field_prices_the_phases_exactly_as_before() -> None:
    """err10 left DERIVED_PHASE_RATIOS (what a cluster file without ``derived_phase_ratios`` takes) as it was."""
    cluster = _cluster("gloo", 8)
    assert cluster.cost("reducescatter").beta_s_per_byte == pytest.approx(AR.beta_s_per_byte * 4 * 2.0)
    assert cluster.cost("allgather").beta_s_per_byte == pytest.approx(AR.beta_s_per_byte * 4 * 2.0)


def test_the_bench_writes_the_ratios_measured_alone_into_its_cluster() -> None:
    from gradsched.costs import measured_phase_ratio
    from gradsched.jobs.bench import with_phase_ratios

    priced = with_phase_ratios(_cluster("gloo", 8))
    assert priced.extra["derived_phase_ratios"] == {"reducescatter": 1.56, "allgather": 1.75}
    # a2a12: and by the group's size, which this version prices by (tests/test_phase_ratio_points.py); the flat
    # ratios price as before where the points are left out (what older versions read)
    assert set(priced.extra["derived_phase_ratio_points"]) == {"reducescatter", "allgather"}
    flat = {k: x for k, x in priced.to_dict().items() if k != "derived_phase_ratio_points"}
    again = Cluster.from_dict(flat)
    for name in ("reducescatter", "allgather"):
        assert again.cost(name).beta_s_per_byte == pytest.approx(
            AR.beta_s_per_byte * 4 * measured_phase_ratio("gloo", 8, name))
        assert again.cost(name).beta_s_per_byte < _cluster("gloo", 8).cost(name).beta_s_per_byte
    for world in (2, 3, 4, 7):  # below 8 ranks the derived ratios are the measured ones: prices unchanged
        assert with_phase_ratios(_cluster("gloo", world)).cost("allgather") == _cluster("gloo", world).cost("allgather")


def test_the_bench_keeps_measured_phases_given_ratios_and_other_backends() -> None:
    from gradsched.jobs.bench import with_phase_ratios

    nccl = _cluster("nccl", 8)
    assert with_phase_ratios(nccl) is nccl
    given = _cluster("gloo", 8, derived_phase_ratios={"allgather": 3.0})
    measured = CollectiveCost(0.001, 1e-8)
    both = Cluster(8, {"allreduce": AR, "reducescatter": measured}, "gloo", extra=dict(given.extra))
    priced = with_phase_ratios(both)
    assert priced.cost("reducescatter") == measured
    assert priced.extra["derived_phase_ratios"] == {"allgather": 3.0}
    assert with_phase_ratios(given).extra["derived_phase_ratios"] == {"allgather": 3.0, "reducescatter": 1.56}
