"""The two phases priced as the runtime runs them (issue 36, phase11): on gloo beyond two ranks a reduce-scatter or
all-gather group of at least ``gradsched.costs.RING_MIN_BYTES`` goes as a ring, a smaller one as all-to-alls, so a
phase the table did not time is derived from the all-reduce at the ring's ratio from the threshold and at the
all-to-alls' below it (docs/cost-model.md, "Two phases not measured")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.costs import (NO_RING_BYTES, RING_MIN_BYTES, RING_MIN_BYTES_ENV, derived_phase_ratio, ring_min_bytes,
                             ring_phase_ratio, runs_ring, switched_at)
from gradsched.errors import FormatError
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER

AR = CollectiveCost(0.002, 4e-9)
T = RING_MIN_BYTES
PHASES = ((REDUCE_SCATTER, "reducescatter"), (ALL_GATHER, "allgather"))


def _cluster(backend: str = "gloo", world: int = 8, **extra) -> Cluster:
    return Cluster(world, {"allreduce": AR}, backend, extra=extra)


def _derived_s(nbytes: float, ratio: float) -> float:
    """A group of ``nbytes`` priced from the all-reduce: half its start-up, half its slope times ``ratio``."""
    return AR.alpha_s / 2 + AR.beta_s_per_byte / 2 * ratio * nbytes


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(RING_MIN_BYTES_ENV, raising=False)


# ------------------------------------------------------------------ the rule, by size and rank count
@pytest.mark.parametrize("nbytes, ring", [(1, False), (T - 4, False), (T - 1, False), (T, True), (T + 1, True),
                                          (64 * T, True)])
def test_runs_ring_below_at_and_above_the_threshold(nbytes: int, ring: bool) -> None:
    assert runs_ring(8, nbytes, nccl=False) is ring
    assert not runs_ring(8, nbytes, nccl=True)  # NCCL: one collective at every size
    assert not runs_ring(2, nbytes, nccl=False)  # two ranks: the all-to-alls send each rank's part once


def test_the_environment_moves_the_threshold_for_the_runtime_and_the_prices(monkeypatch) -> None:
    monkeypatch.setenv(RING_MIN_BYTES_ENV, str(1 << 20))
    assert ring_min_bytes() == 1 << 20 and runs_ring(4, 1 << 20, nccl=False)
    rs = _cluster().operation_cost(REDUCE_SCATTER)
    assert rs.time_s(1 << 20) == pytest.approx(_derived_s(1 << 20, ring_phase_ratio("gloo", 8, "reducescatter")))
    monkeypatch.setenv(RING_MIN_BYTES_ENV, str(NO_RING_BYTES))  # rings off: the all-to-alls' price at every size
    assert _cluster().operation_cost(REDUCE_SCATTER) == _cluster(ring_min_bytes=NO_RING_BYTES).operation_cost(
        REDUCE_SCATTER)


def test_the_files_threshold_wins_over_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(RING_MIN_BYTES_ENV, "1")
    cluster = _cluster(ring_min_bytes=T)
    assert cluster.ring_min_bytes == T
    assert cluster.operation_cost(ALL_GATHER).time_s(T - 4) == pytest.approx(
        _derived_s(T - 4, derived_phase_ratio("gloo", 8, "allgather")))


@pytest.mark.parametrize("world, expected", [(3, 1.0), (4, 1.0), (8, 1.0), (64, 1.0), (2, None), (1, None)])
def test_the_ring_ratio_by_rank_count(world: int, expected: float | None) -> None:
    assert ring_phase_ratio("gloo", world, "reducescatter") == expected
    assert ring_phase_ratio("nccl", world, "allgather") is None


@settings(max_examples=200, deadline=None)
@given(world=st.integers(3, 64), nbytes=st.integers(1, 1 << 30), which=st.sampled_from(PHASES),
       least=st.sampled_from([2, 1 << 20, T, 1 << 26]))
def test_a_derived_group_costs_the_ring_from_the_threshold_and_the_all_to_alls_below(world, nbytes, which, least):
    op, name = which
    cluster = Cluster(world, {"allreduce": AR}, "gloo", extra={"ring_min_bytes": least})
    ar_half_slope = AR.beta_s_per_byte / 2
    ratio = ring_phase_ratio("gloo", world, name) if nbytes >= least else derived_phase_ratio("gloo", world, name)
    expected = AR.alpha_s / 2 + ar_half_slope * ratio * nbytes
    assert cluster.operation_cost(op).time_s(nbytes) == pytest.approx(expected, rel=1e-9)
    assert float(cluster.operation_cost(op).times_s([nbytes])[0]) == pytest.approx(expected, rel=1e-9)


def test_at_8_ranks_a_ring_group_costs_about_half_what_the_all_to_alls_did() -> None:
    """The mispricing this fixes: a 16 MiB group at the all-to-alls' 2.0 cost nearly twice what runs (the ring)."""
    rs = _cluster().operation_cost(REDUCE_SCATTER)
    ring, a2a = rs.time_s(16 * T // 4), _derived_s(16 * T // 4, derived_phase_ratio("gloo", 8, "reducescatter"))
    assert ring == pytest.approx(_derived_s(16 * T // 4, 1.0))
    assert a2a > 1.9 * ring


@pytest.mark.parametrize("backend, world", [("nccl", 8), ("gloo", 2), ("unknown", 8)])
def test_no_step_where_no_ring_runs_or_none_is_known(backend: str, world: int) -> None:
    for op, _ in PHASES:
        cost = _cluster(backend, world).operation_cost(op)
        assert cost.points is None  # one line: the all-to-alls' (or half) at every size


def test_measured_phases_are_priced_as_measured() -> None:
    measured = CollectiveCost(0.001, 1e-8)
    cluster = Cluster(8, {"allreduce": AR, "reducescatter": measured}, "gloo")
    assert cluster.operation_cost(REDUCE_SCATTER).time_s(4 * T) == pytest.approx(0.001 + 1e-8 * 4 * T / 8)
    assert cluster.operation_cost(ALL_GATHER).time_s(T) == pytest.approx(_derived_s(T, 1.0))  # the other: derived


def test_a_phase_timed_only_under_the_threshold_is_priced_as_timed_there_and_as_the_ring_from_it() -> None:
    # runs11: the table timed each phase as all-to-alls up to 2 MiB a group and extended that line beyond, where the
    # runtime sends groups of 4 MiB and more as rings (the probe's ring of every gradient: half the all-reduce)
    table = CollectiveCost(0.001, 1e-8, ((1024.0, 0.0011), (262144.0, 0.02)))  # per rank sizes: to 2 MiB a group
    timed_to = {"reducescatter": [[1024.0, 0.0011], [262144.0, 0.02]]}
    cluster = Cluster(8, {"allreduce": AR, "reducescatter": table}, "gloo", extra={"measured_points": timed_to})
    cost = cluster.operation_cost(REDUCE_SCATTER)
    assert cluster.timed_to_bytes("reducescatter") == 2 << 20
    assert cost.time_s(2 << 20) == pytest.approx(0.02)  # as timed
    assert cost.time_s(T - 1) == pytest.approx(table.time_s((T - 1) / 8))  # the table's line under the threshold
    for n in (T, 4 * T):
        assert cost.time_s(n) == pytest.approx(_derived_s(n, 1.0))  # the ring from it
    no_rings = Cluster(8, {"allreduce": AR, "reducescatter": table}, "gloo",
                       extra={"measured_points": timed_to, "ring_min_bytes": NO_RING_BYTES})
    assert no_rings.operation_cost(REDUCE_SCATTER).time_s(4 * T) == pytest.approx(table.time_s(4 * T / 8))
    far = {"reducescatter": [[1024.0, 0.0011], [T / 8, 0.03]]}  # timed at the threshold and past it: as timed
    timed = Cluster(8, {"allreduce": AR, "reducescatter": table}, "gloo", extra={"measured_points": far})
    assert timed.operation_cost(REDUCE_SCATTER).time_s(4 * T) == pytest.approx(table.time_s(4 * T / 8))


# ------------------------------------------------------------------ the file's fields
def test_the_fields_round_trip_and_the_files_ring_ratios_win() -> None:
    cluster = _cluster(ring_min_bytes=1 << 22, ring_phase_ratios={"allgather": 1.5})
    again = Cluster.from_dict(cluster.to_dict())
    assert again.ring_min_bytes == 1 << 22
    assert again.operation_cost(ALL_GATHER).time_s(1 << 23) == pytest.approx(_derived_s(1 << 23, 1.5))
    assert again.operation_cost(REDUCE_SCATTER).time_s(1 << 23) == pytest.approx(_derived_s(1 << 23, 1.0))


@pytest.mark.parametrize("field, bad", [("ring_min_bytes", 0), ("ring_min_bytes", -4), ("ring_min_bytes", 1.5),
                                        ("ring_min_bytes", "4MiB"), ("ring_phase_ratios", {"reducescatter": 0}),
                                        ("ring_phase_ratios", {"allreduce": 1.0}), ("ring_phase_ratios", [1.0])])
def test_a_bad_field_is_an_error(field: str, bad) -> None:
    with pytest.raises(FormatError, match=field):
        Cluster.from_dict({**_cluster().to_dict(), field: bad})


def test_switched_at_takes_lines_and_its_ends() -> None:
    a2a, ring = CollectiveCost(1e-3, 2e-9), CollectiveCost(1e-3, 1e-9)
    assert switched_at(a2a, ring, 1) is ring and switched_at(a2a, ring, NO_RING_BYTES) is a2a
    step = switched_at(a2a, ring, 1000)
    assert [step.time_s(n) for n in (1, 999, 1000, 10**6)] == pytest.approx(
        [a2a.time_s(1), a2a.time_s(999), ring.time_s(1000), ring.time_s(10**6)])
    from gradsched.errors import InternalError

    with pytest.raises(InternalError):
        switched_at(step, ring, 10)


# ------------------------------------------------------------------ the bench records the threshold it ran
def test_the_bench_records_the_threshold_where_rings_run(monkeypatch) -> None:
    from gradsched.jobs.bench import with_phase_ratios

    monkeypatch.setenv(RING_MIN_BYTES_ENV, str(1 << 21))
    assert with_phase_ratios(_cluster()).extra["ring_min_bytes"] == 1 << 21
    assert with_phase_ratios(_cluster(ring_min_bytes=T)).extra["ring_min_bytes"] == T  # a given one is kept
    assert "ring_min_bytes" not in with_phase_ratios(_cluster("gloo", 2)).extra
    timed = Cluster(8, {"allreduce": AR, "reducescatter": AR, "allgather": AR}, "gloo")
    assert with_phase_ratios(timed) is timed  # nothing derived: nothing to record


# ------------------------------------------------------------------ the simulator
def test_the_simulator_prices_a_group_from_the_threshold_at_the_ring_ratio() -> None:
    """DeAR per layer: a 4 MiB layer's reduce-scatter and all-gather take the ring's price, a 1 MiB layer's the
    all-to-alls'; each operation's span in the timeline is its cost (no contention, one channel)."""
    from gradsched.planners import make_plan
    from gradsched.profile import Profile, TensorProfile
    from gradsched.sim import simulate

    profile = Profile("two", (TensorProfile("big", T // 4, T, 0.01, 0.02), TensorProfile("small", 1 << 18, 1 << 20,
                                                                                       0.01, 0.02)))
    cluster = _cluster()
    plan = make_plan("dear", profile, cluster, grouping="nearby", nearby_layers=1)
    result = simulate(plan, profile, cluster)
    for j, op in enumerate(plan.operations):
        name = "reducescatter" if op.collective == REDUCE_SCATTER else "allgather"
        nbytes = profile.tensors[op.slices[0].tensor].bytes
        ratio = 1.0 if nbytes >= T else derived_phase_ratio("gloo", 8, name)
        assert result.op_end_s[j] - result.op_start_s[j] == pytest.approx(_derived_s(nbytes, ratio))


def test_the_ring_is_priced_on_the_all_reduces_stream_slope_where_the_file_has_one() -> None:
    """The ring was timed against an all-reduce of the same size: the stream figure (anchored to the probe's
    all-reduce of every gradient) where the bench wrote one; the all-to-alls stay on the line their ratios were
    fitted on."""
    stream = {"latency_s": 0.01, "s_per_byte": 6e-9}
    cluster = _cluster(allreduce_stream=stream)
    rs = cluster.operation_cost(REDUCE_SCATTER)
    assert rs.time_s(2 * T) == pytest.approx(AR.alpha_s / 2 + 6e-9 / 2 * 2 * T)
    assert rs.time_s(T // 2) == pytest.approx(_derived_s(T // 2, derived_phase_ratio("gloo", 8, "reducescatter")))


# ------------------------------------------------------------------ dear's groupings at least the ring's size
def _layers_profile(mib: list[float]):
    from gradsched.profile import Profile, TensorProfile

    return Profile("layers", tuple(TensorProfile(f"t{k}", int(m * 2**18), int(m * 2**18) * 4, 0.001, 0.002)
                                   for k, m in enumerate(mib)))


@settings(max_examples=100, deadline=None)
@given(mib=st.lists(st.floats(0.25, 12.0), min_size=1, max_size=30), multiple=st.sampled_from([1, 2, 3]))
def test_at_least_groups_reach_the_size_in_forward_order(mib: list[float], multiple: int) -> None:
    from gradsched.planners.dear import at_least_groups

    profile = _layers_profile(mib)
    groups = at_least_groups(profile, multiple * T)
    assert [t for g in groups for t in g] == list(range(len(mib)))  # every tensor once, forward order
    sizes = [sum(profile.tensors[t].bytes for t in g) for g in groups]
    assert all(s >= multiple * T for s in sizes[:-1])
    assert all(sum(profile.tensors[t].bytes for t in g[:-1]) < multiple * T for g in groups)  # closed at reaching it


def test_dear_tries_groups_of_at_least_the_ring_size_only_where_rings_run() -> None:
    from gradsched.planners.dear import RING_MULTIPLES, candidate_groupings

    profile = _layers_profile([1.5] * 24)

    def names(cluster: Cluster) -> list[str]:
        return [n for n, _ in candidate_groupings(profile, cluster) if n.startswith("at least")]

    assert names(_cluster()) == [f"at least({k}x 4 MiB)" for k in RING_MULTIPLES]
    for no_rings in (_cluster("nccl"), _cluster("gloo", 2), _cluster(ring_min_bytes=NO_RING_BYTES)):
        assert names(no_rings) == []


def test_dear_planned_is_no_slower_than_its_ring_sized_candidates() -> None:
    """Layers of 1.5 MiB at 8 gloo ranks: DeAR's 4 MB threshold makes 3 MiB groups (all-to-alls); groups of three
    layers (4.5 MiB) go as rings at half the price a byte; the planned grouping takes the fastest candidate."""
    from gradsched.planners import make_plan
    from gradsched.planners.dear import at_least_groups, threshold_groups, two_phase_ops
    from gradsched.plan import Plan
    from gradsched.sim import simulate

    profile = _layers_profile([1.5] * 24)
    cluster = _cluster()

    def iteration_s(groups) -> float:
        plan = Plan("dear", two_phase_ops(groups, profile), profile.fingerprint, profile.model, overlap_forward=True)
        return simulate(plan, profile, cluster, timeline=False).iteration_s

    ring_sized = iteration_s(at_least_groups(profile, T))
    assert ring_sized < iteration_s(threshold_groups(profile, 4e6))
    planned = make_plan("dear", profile, cluster)
    assert simulate(planned, profile, cluster, timeline=False).iteration_s <= ring_sized + 1e-12
