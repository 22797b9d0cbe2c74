"""The bench's predictions: the all-reduce table through the probe's all-gradients all-reduce, and DDP's first bucket."""

from __future__ import annotations

import pytest

from gradsched.cluster import Cluster
from gradsched.costs import CollectiveCost
from gradsched.jobs.bench import anchored_to_probe, ddp_first_bucket_mb

MIB = 1 << 20


def _cluster() -> Cluster:
    points = [(float(s), 0.01 + 8e-8 * s) for s in (4096, 65536, MIB, 4 * MIB, 16 * MIB, 32 * MIB)]
    return Cluster(world_size=8, collectives={"allreduce": CollectiveCost.fit(points)})


def test_the_table_goes_through_the_probes_all_reduce_and_keeps_its_latency():
    cluster = _cluster()
    nbytes, measured = 12 * MIB, 0.8 * cluster.cost("allreduce").time_s(12 * MIB)  # the table ran 25% slow
    anchored, k = anchored_to_probe(cluster, nbytes, measured)
    cost, before = anchored.cost("allreduce"), cluster.cost("allreduce")
    assert cost.time_s(nbytes) == pytest.approx(measured, rel=1e-6) and k < 1
    assert cost.alpha_s == before.alpha_s
    assert cost.time_s(4096) == pytest.approx(before.time_s(4096), rel=0.01)  # latency-bound sizes as measured
    assert cost.time_s(32 * MIB) < before.time_s(32 * MIB)


@pytest.mark.parametrize("nbytes, measured", [(0, 1.0), (MIB, 0.0), (MIB, float("nan"))])
def test_without_a_usable_probe_the_table_stays(nbytes, measured):
    cluster = _cluster()
    assert anchored_to_probe(cluster, nbytes, measured) == (cluster, 1.0)


def test_ddps_first_bucket_is_1_mib_only_at_its_default_cap_on_torch_2_13():
    assert ddp_first_bucket_mb(None, True) == 1.0 and ddp_first_bucket_mb({}, True) == 1.0
    assert ddp_first_bucket_mb({"bucket_cap_mb": 3.125}, True) == 3.125  # byte scaling's 25 / 8
    assert ddp_first_bucket_mb({"bucket_cap_mb": 3.125}, False) == 1.0  # older torch: 1 MiB whatever the cap


def test_a_loaded_probe_sample_does_not_move_the_anchor():
    """Where ranks outnumber cores the anchor is the least of the probe's samples (``probe_alone_s``), as the table
    reads each size: two loaded samples of three (ResNet-50's runs9: 183-203 ms against 150-155 quiet) would set a
    median 25% slow; with a rank per core, the median as before."""
    from gradsched.jobs.bench import probe_alone_s

    cluster, nbytes = _cluster(), 12 * MIB
    quiet = cluster.cost("allreduce").time_s(nbytes)
    samples = [1.25 * quiet, quiet, 1.3 * quiet]
    assert probe_alone_s(samples, 8, 2) == quiet
    anchored, k = anchored_to_probe(cluster, nbytes, probe_alone_s(samples, 8, 2))
    assert k == pytest.approx(1.0) and anchored.cost("allreduce").time_s(nbytes) == pytest.approx(quiet)
    assert probe_alone_s(samples, 2, 2) == pytest.approx(1.25 * quiet)  # a rank per core: the median
    assert probe_alone_s([], 8, 2) == 0.0 and anchored_to_probe(cluster, nbytes, probe_alone_s([], 8, 2)) == (cluster, 1.0)
