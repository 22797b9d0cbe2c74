"""The cluster cost model: fitting alpha-beta lines, measured tables, other world sizes."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradsched.cluster import Cluster, CollectiveCost, fit_line
from gradsched.errors import GradschedError

SIZES = [2.0 ** k for k in range(12, 29)]  # 4 KiB .. 256 MiB, as netbench measures


def _points(alpha, beta, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return [(s, (alpha + beta * s) * (1 + noise * rng.standard_normal())) for s in SIZES]


@pytest.mark.parametrize("alpha,beta", [(8e-4, 3.3e-9), (2e-5, 1e-10), (1.6e-3, 1.0e-8)])
def test_fit_line_recovers_exact_alpha_beta(alpha, beta):
    a, b = fit_line(_points(alpha, beta))
    assert a == pytest.approx(alpha, rel=1e-6)
    assert b == pytest.approx(beta, rel=1e-6)


def test_fit_line_with_noise_stays_close():
    # 3% multiplicative noise, as repeated collectives on a quiet network show.
    alpha, beta = 5e-4, 2e-9
    errs_a, errs_b = [], []
    for seed in range(20):
        a, b = fit_line(_points(alpha, beta, noise=0.03, seed=seed))
        errs_a.append(abs(a / alpha - 1))
        errs_b.append(abs(b / beta - 1))
    assert np.median(errs_a) < 0.05 and max(errs_a) < 0.15
    assert np.median(errs_b) < 0.03 and max(errs_b) < 0.10


def test_fit_weights_small_messages():
    # Relative weighting: a 10% error at 4 KiB matters as much as one at 256 MiB, so
    # alpha (which only the small sizes see) is not swamped by the large ones.
    alpha, beta = 1e-4, 1e-9
    a, _ = fit_line(_points(alpha, beta))
    assert a == pytest.approx(alpha, rel=1e-6)
    assert CollectiveCost(a, beta).time_s(4096) == pytest.approx(alpha + beta * 4096, rel=1e-6)


def test_fit_clamps_to_non_negative():
    # Decreasing times (noise at tiny sizes) must not give a negative beta, nor a negative alpha.
    a, b = fit_line([(1000, 2e-3), (2000, 1e-3), (4000, 0.5e-3)])
    assert b == 0.0 and a == pytest.approx(np.mean([2e-3, 1e-3, 0.5e-3]))
    a, b = fit_line([(1e3, 1e-9), (1e6, 1e-3), (1e7, 1e-2)])  # a line through below the origin
    assert a == 0.0 and b > 0


def test_fit_needs_two_points():
    with pytest.raises(GradschedError, match="two"):
        fit_line([(4096, 1e-4)])


def test_collective_fit_accepts_a_generator():
    cost = CollectiveCost.fit((s, 1e-4 + 1e-9 * s) for s in SIZES)
    assert cost.points is not None and len(cost.points) == len(SIZES)
    assert cost.time_s(1 << 20) == pytest.approx(1e-4 + 1e-9 * (1 << 20))


def test_table_interpolates_inside_and_line_outside():
    # A protocol switch: flat until 8 KiB, 4x at 12 KiB (like B-Caffe's OSU curve).
    pts = [(4096, 1e-4), (8192, 1e-4), (12288, 4e-4), (65536, 5e-4)]
    cost = CollectiveCost.fit(pts)
    assert cost.time_s(8192) == pytest.approx(1e-4)
    assert cost.time_s(10240) == pytest.approx(2.5e-4)  # halfway between 8 KiB and 12 KiB
    assert cost.time_s(12288) == pytest.approx(4e-4)
    line = CollectiveCost(cost.alpha_s, cost.beta_s_per_byte)
    for outside in (1024, 1 << 20, 1 << 28):
        assert cost.time_s(outside) == pytest.approx(line.time_s(outside))
    assert cost.time_s(0) == 0.0
    sizes = np.array([0, 1024, 8192, 10240, 1 << 20])
    assert np.allclose(cost.times_s(sizes), [cost.time_s(s) for s in sizes])


def test_table_dropped_when_asked():
    cost = CollectiveCost.fit(_points(1e-4, 1e-9), keep_table=False)
    assert cost.points is None


def _ring(p, a, b):
    """Ring all-reduce and all-gather (alpha, beta) at p ranks for link latency a, inverse bandwidth b."""
    return {"allreduce": (2 * (p - 1) * a, 2 * (p - 1) / p * b), "allgather": ((p - 1) * a, (p - 1) * b)}


@pytest.mark.parametrize("p0,p", [(2, 8), (8, 2), (4, 1024), (8, 8), (16, 3)])
def test_at_world_size_follows_ring_formulas(p0, p):
    a, b = 2e-5, 1e-10
    ar = _ring(p0, a, b)["allreduce"]
    cluster = Cluster.alpha_beta(*ar, world_size=p0).at_world_size(p)
    assert cluster.world_size == p
    for name, (alpha, beta) in _ring(p, a, b).items():
        c = cluster.cost(name)
        assert c.alpha_s == pytest.approx(alpha, rel=1e-12), name
        assert c.beta_s_per_byte == pytest.approx(beta, rel=1e-12), name


def test_measured_allgather_extrapolates_with_its_own_ring_formula():
    a, b = 3e-5, 2e-10
    cluster = Cluster(4, {"allreduce": CollectiveCost(*_ring(4, a, b)["allreduce"]),
                          "allgather": CollectiveCost(*_ring(4, a, b)["allgather"])})
    c = cluster.cost("allgather", 16)
    assert (c.alpha_s, c.beta_s_per_byte) == pytest.approx(_ring(16, a, b)["allgather"])


def test_tree_algorithm_grows_startup_as_log2():
    cluster = Cluster(4, {"allreduce": CollectiveCost(1e-4, 1e-9)}, algorithm="tree")
    c = cluster.cost("allreduce", 64)
    assert c.alpha_s == pytest.approx(1e-4 * math.log2(64) / math.log2(4))
    assert c.beta_s_per_byte == pytest.approx(1e-9)


def test_table_scales_size_by_size_by_the_ratio_of_the_lines():
    # docs/cost-model.md: a measured table moves to another world size point by point,
    # times the ratio of the new line to the old one at that size (it keeps its shape
    # and meets the ring formulas at both ends); outside it, the new line.
    a, b = 2e-5, 1e-10
    alpha, beta = _ring(2, a, b)["allreduce"]
    pts = _points(alpha, beta, noise=0.05)
    measured = Cluster(2, {"allreduce": CollectiveCost.fit(pts)})
    base = measured.cost("allreduce")
    at8 = measured.cost("allreduce", 8)
    for s, t in pts:
        ratio = ((base.alpha_s * 7 + base.beta_s_per_byte * 1.75 * s)  # ring: alpha x (8-1)/(2-1), beta x (7/8)/(1/2)
                 / (base.alpha_s + base.beta_s_per_byte * s))
        assert at8.time_s(s) == pytest.approx(t * ratio, rel=1e-9)
    assert at8.times_s([s for s, _ in pts]) == pytest.approx([at8.time_s(s) for s, _ in pts])
    assert at8.time_s(1 << 30) == pytest.approx(base.alpha_s * 7 + base.beta_s_per_byte * 1.75 * (1 << 30))
    # extrapolating twice is the same as once
    assert measured.at_world_size(4).cost("allreduce", 8).time_s(pts[1][0]) == pytest.approx(at8.time_s(pts[1][0]))


def test_world_size_one_is_free_and_bad_sizes_fail():
    cluster = Cluster.alpha_beta(1e-4, 1e-9, 4)
    assert cluster.cost("allreduce", 1).time_s(1 << 20) == 0.0
    with pytest.raises(GradschedError):
        cluster.cost("allreduce", 0)
    with pytest.raises(GradschedError, match="1 rank"):
        Cluster.alpha_beta(1e-4, 1e-9, 1).cost("allreduce", 4)


def test_cluster_round_trips_with_table(tmp_path):
    cluster = Cluster(2, {"allreduce": CollectiveCost.fit(_points(1e-4, 1e-9))}, backend="gloo")
    cluster.save(tmp_path / "c.json")
    back = Cluster.load(tmp_path / "c.json")
    assert back.backend == "gloo" and back.world_size == 2
    assert back.cost("allreduce").points == cluster.cost("allreduce").points
    assert back.cost("allreduce").time_s(123456) == pytest.approx(cluster.cost("allreduce").time_s(123456))


def test_envelope_reads_noisy_measurements_as_never_falling_with_more_bytes():
    # Scheduling noise only adds time: with envelope=True (netbench's own measurements) a
    # small size measured above a larger one is read as the larger one's time.
    # Measured: all-reduce, 2 local gloo ranks on a 2-core VM, medians of 20 (2026-12-02).
    pts = [(4096, 2.04e-3), (8192, 3.49e-3), (16384, 2.36e-3), (32768, 3.66e-3), (65536, 2.18e-3),
           (131072, 0.43e-3), (262144, 0.56e-3)]
    cost = CollectiveCost.fit(pts, envelope=True)
    assert [cost.time_s(s) for s, _ in pts] == pytest.approx([0.43e-3] * 6 + [0.56e-3])
    assert cost.alpha_s < 0.45e-3
    raw = CollectiveCost.fit(pts)  # a table given as it is stays as it is
    assert raw.points == tuple(pts) and raw.alpha_s > 2e-3  # every 4 KiB operation would cost 2 ms


@given(st.lists(st.floats(1e-5, 1e-1), min_size=2, max_size=17))
def test_envelope_is_monotone_and_never_above_a_measurement(times):
    pts = list(zip(SIZES, times))
    cost = CollectiveCost.fit(pts, envelope=True)
    inside = [cost.time_s(s) for s in np.geomspace(SIZES[0], SIZES[len(times) - 1], 64)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(inside, inside[1:]))
    for s, t in pts:
        assert cost.time_s(s) <= t
    split = all(t <= math.ceil(s / s0) * t0 for i, (s, t) in enumerate(pts) for s0, t0 in pts[:i])
    if split and all(b >= a for a, b in zip(times, times[1:])):  # already both: read as measured
        assert [cost.time_s(s) for s, _ in pts] == pytest.approx(times)


@given(st.lists(st.floats(1e-5, 1e-1), min_size=2, max_size=17))
def test_a_size_never_costs_more_than_smaller_operations_carrying_its_bytes(times):
    pts = list(zip(SIZES, times))
    cost = CollectiveCost.fit(pts, envelope=True)
    read = [cost.time_s(s) for s, _ in pts]
    for i, (s, _) in enumerate(pts):
        for j, (s0, _) in enumerate(pts[:i]):
            assert read[i] <= math.ceil(s / s0) * read[j] * (1 + 1e-12)


def test_split_envelope_reads_a_retransmission_as_two_halves():
    # Measured: 8 testbed hosts at 250 Mbit/s (time dilation 4), all-reduce medians in a stream
    # (benchmarks/results/bench_replay_googlenet_k80_8h.json, measured_points): 1 MiB took
    # longer than 2 MiB, about twice what two 512 KiB operations took.
    pts = [(262144, 21.6e-3), (524288, 31.0e-3), (1048576, 150.3e-3), (2097152, 123.8e-3), (4194304, 246.9e-3)]
    cost = CollectiveCost.fit(pts, envelope=True)
    assert cost.time_s(1048576) == pytest.approx(62.0e-3)  # two of 512 KiB
    assert cost.time_s(2097152) == pytest.approx(123.8e-3)  # measured, under four of 512 KiB
    assert CollectiveCost.fit(pts).time_s(1048576) == pytest.approx(150.3e-3)  # a given table stays as it is


def test_gloos_reduce_scatter_and_all_gather_keep_their_measured_large_sizes():
    """Per-rank-sized collectives are read through the monotone envelope only: their large sizes are slower per
    byte on gloo, systematically (the same in training: docs/notes/2026-12-decoupled.md), not by a
    retransmission.  Measured: 2 testbed hosts at 1 Gbit/s, medians in a stream, bytes a rank
    (benchmarks/results/bench_replay_resnet50_2h_1gbit_emu.json, measured_points)."""
    from gradsched.costs import fit_measured

    rs = [(262144, 2.7e-3), (524288, 7.1e-3), (1048576, 16.5e-3), (4194304, 58.1e-3), (8388608, 147.3e-3),
          (16777216, 295.9e-3)]
    ag = [(262144, 5.0e-3), (524288, 5.4e-3), (1048576, 12.6e-3), (4194304, 58.4e-3), (8388608, 114.7e-3),
          (16777216, 245.4e-3)]
    assert fit_measured("reducescatter", rs).time_s(16777216) == pytest.approx(295.9e-3)  # not 64 x 2.7 ms
    assert fit_measured("allgather", ag).time_s(8388608) == pytest.approx(114.7e-3)  # not 16 x 5.4 ms
    assert CollectiveCost.fit(rs, envelope=True).time_s(16777216) == pytest.approx(64 * 2.7e-3)  # the split cap
    # an all-reduce's table keeps the split envelope (a retransmission read as two halves)
    pts = [(262144, 21.6e-3), (524288, 31.0e-3), (1048576, 150.3e-3), (2097152, 123.8e-3), (4194304, 246.9e-3)]
    assert fit_measured("allreduce", pts).time_s(1048576) == pytest.approx(62.0e-3)


def test_below_the_table_a_size_never_costs_more_than_the_tables_first():
    """A fitted line can lie above the table's first point (hypothesis found one: 3.9 ms at 1 B
    against 2.7 ms at 1 KiB); below the table the cost is the line, capped there."""
    cost = CollectiveCost(0.0039, 4.9e-9, ((1024.0, 0.0027), (2048.0, 0.0030)))
    assert cost.time_s(1) == pytest.approx(0.0027) and cost.time_s(1024) == pytest.approx(0.0027)
    below = CollectiveCost(0.0001, 4.9e-9, cost.points)  # a line under the table stays the line
    assert below.time_s(1) == pytest.approx(0.0001 + 4.9e-9)
    sizes = [1, 100, 1023, 1024, 1500, 2048, 4096]
    assert list(cost.times_s(sizes)) == pytest.approx([cost.time_s(s) for s in sizes])
    assert all(a <= b for a, b in zip(cost.times_s(sizes), cost.times_s(sizes)[1:]))
