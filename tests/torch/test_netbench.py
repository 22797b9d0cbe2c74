"""The network benchmark: sizes, a real 2-rank gloo run through the launcher, errors."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from gradsched.cli import main as cli  # noqa: E402
from gradsched.cluster import Cluster  # noqa: E402
from gradsched.costs import PER_RANK, split_envelope  # noqa: E402
from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch.measure.netbench import sizes_bytes  # noqa: E402


def test_sizes_are_powers_of_two_from_4k_to_256m():
    sizes = sizes_bytes()
    assert sizes[0] == 4096 and sizes[-1] == 256 * 2**20 and len(sizes) == 17
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert sizes_bytes(4096, 100_000) == [4096, 8192, 16384, 32768, 65536]
    with pytest.raises(GradschedError):
        sizes_bytes(8192, 4096)


@pytest.mark.slow
def test_netbench_on_two_gloo_ranks(tmp_path):
    out = tmp_path / "cluster.json"
    rc = cli(["netbench", "--nproc", "2", "--max-bytes", str(2**16), "--reps", "3", "--warmup", "1",
              "--backend", "gloo", "-o", str(out)])
    assert rc == 0
    cluster = Cluster.load(out)
    assert cluster.world_size == 2 and cluster.backend == "gloo"
    assert set(cluster.collectives) == {"allreduce", "allgather", "reducescatter"}
    ar, ag, rs = cluster.cost("allreduce"), cluster.cost("allgather"), cluster.cost("reducescatter")
    assert [p[0] for p in ar.points] == [4096, 8192, 16384, 32768, 65536]
    assert [p[0] for p in ag.points] == [4096, 8192, 16384, 32768]  # contributions up to max / world size
    assert [p[0] for p in rs.points] == [4096, 8192, 16384, 32768]  # each rank's part, as for the all-gather
    for cost in (ar, ag, rs):
        assert all(t > 0 for _, t in cost.points)
        assert cost.alpha_s > 0 or cost.beta_s_per_byte > 0
        # The fitted line is the model outside the table; inside, the table itself.
        assert cost.time_s(4096) == pytest.approx(cost.points[0][1])
    assert cluster.extra["measured_by"] == "gradsched netbench"
    # the table: the measurements' lower envelope
    for name, cost in (("allreduce", ar), ("allgather", ag), ("reducescatter", rs)):
        measured = cluster.extra["measured_points"][name]
        sizes = [p[0] for p in measured]
        assert sizes == [p[0] for p in cost.points]
        # all-reduce: each size capped at the smaller sizes' operations that would carry its bytes (the
        # per-rank-sized all-gather and reduce-scatter are not: costs.fit_measured), then at every larger size's
        times = [t for _, t in measured]
        capped = times if name in PER_RANK else list(split_envelope(sizes, times))
        assert [p[1] for p in cost.points] == [min(capped[k:]) for k in range(len(capped))]


def test_netbench_outside_torchrun_says_what_to_do(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli(["netbench", "-o", "unused.json"]) == 2
    assert "--nproc" in capsys.readouterr().err
    assert cli(["netbench", "--nproc", "1"]) == 2
    assert "at least 2" in capsys.readouterr().err


def test_module_entry_point_reports_missing_launcher(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "gradsched.torch.measure.netbench", "-o", str(tmp_path / "c.json")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "torchrun" in proc.stderr
    assert not (tmp_path / "c.json").exists()


def test_node_layout_from_the_argument_then_local_world_size_then_one(monkeypatch):
    from gradsched.torch.measure.netbench import node_layout

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert node_layout(8) == (8, 1)  # every rank its own node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's
    assert node_layout(8) == (2, 4)
    assert node_layout(8, 2) == (4, 2)  # an explicit count wins
    with pytest.raises(GradschedError, match="LOCAL_WORLD_SIZE 4 does not divide the 6 ranks"):
        node_layout(6)
    with pytest.raises(GradschedError, match="ranks per node 3 does not divide"):
        node_layout(8, 3)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(GradschedError, match="not a positive integer"):
        node_layout(8)


def test_topology_field_has_both_levels_fitted_as_the_top_level(monkeypatch):
    """The field's shape (docs/formats.md), measured on one gloo rank in this process."""
    import torch.distributed as dist

    from gradsched.cluster import CollectiveCost, Topology
    from gradsched.torch.jobs.launch import free_port
    from gradsched.torch.measure.netbench import measure_topology

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        topo = measure_topology(1, 1, [4096, 8192, 16384], reps=2, warmup=0)
    finally:
        dist.destroy_process_group()
    assert set(topo) == {"nodes", "ranks_per_node", "algorithm", "intra", "inter"}
    assert (topo["nodes"], topo["ranks_per_node"], topo["algorithm"]) == (1, 1, "ring")
    # inside a node also the hierarchical all-reduce's steps: reduce to, broadcast from the leader
    for level, names in (("intra", {"allreduce", "reduce", "broadcast"}), ("inter", {"allreduce"})):
        assert set(topo[level]) == {"collectives", "points"}
        assert set(topo[level]["collectives"]) == set(topo[level]["points"]) == names
        for name in names:
            table = topo[level]["points"][name]
            assert [p[0] for p in table] == [4096, 8192, 16384] and all(t > 0 for _, t in table)
            assert [t for _, t in table] == sorted(t for _, t in table)  # the lower monotone envelope
            assert topo[level]["collectives"][name] == pytest.approx(CollectiveCost.fit(table).to_dict())
    assert Topology.from_dict(topo, "netbench", world_size=1).ranks_per_node == 1  # the format's own checks


def test_ranks_per_node_and_testbed_flags_are_checked_before_launching(capsys):
    assert cli(["netbench", "--nproc", "3", "--ranks-per-node", "2", "-o", "unused.json"]) == 2
    assert "does not divide --nproc 3" in capsys.readouterr().err
    assert cli(["netbench", "--rate", "100mbit", "--nproc", "2", "-o", "unused.json"]) == 2
    assert "give one" in capsys.readouterr().err


def test_the_bench_times_no_queue_where_its_groups_go_as_rings():
    """Rings of a group run one after another on one thread: a queue of them is the same operations one at a time
    (dear13), so the bench's table times the queue only at sizes whose groups go as all-to-alls."""
    from gradsched.torch.jobs.bench_network import phase_queue_sizes

    rates = {"reducescatter": (16 << 20, 1e-9), "allgather": (16 << 20, 1e-9)}  # a fast link: every size fits
    assert phase_queue_sizes(rates, 2, False, 3) == [1 << 20, 4 << 20, 16 << 20]  # two ranks: no rings
    assert phase_queue_sizes(rates, 8, True, 3) == [1 << 20, 4 << 20, 16 << 20]  # NCCL: no rings
    assert phase_queue_sizes(rates, 8, False, 3) == []  # 1 MiB a rank: 8 MiB groups, rings from 4 MiB
    assert phase_queue_sizes(rates, 3, False, 3) == [1 << 20]  # 3 MiB groups: all-to-alls; 12 MiB: rings


def test_the_bench_times_one_ring_size_beyond_its_table():
    """A ring's seconds a byte are flat (dear13): beyond the table the phases are timed at sizes whose groups go as
    all-to-alls and at the smallest whose groups go as rings, not at the larger ones."""
    from gradsched.torch.jobs.bench_network import beyond_sizes

    cheap = lambda b: 0.0  # noqa: E731  (every size fits the budget)
    group = 64 << 20  # the model's largest group: 8 MiB a rank on 8 ranks
    assert beyond_sizes(256 << 10, group, 8, False, cheap) == [512 << 10]  # 8 ranks: 4 MiB groups on are rings
    assert beyond_sizes(512 << 10, group, 8, False, cheap) == []  # the table timed a ring already
    assert beyond_sizes(256 << 10, group, 3, False, cheap) == [512 << 10, 2 << 20]  # 3 ranks: 1.5 MiB a2a, 6 MiB ring
    assert beyond_sizes(256 << 10, group, 8, True, cheap) == [512 << 10, 2 << 20, 8 << 20]  # NCCL: no rings
    assert beyond_sizes(256 << 10, group, 2, False, cheap) == [512 << 10, 2 << 20, 8 << 20, 32 << 20]  # 2 ranks
