"""benchmarks/hier_allreduce.py's table without the testbed: predictions from the measured
cluster, winners from medians, and the issue-21 target judged only where hier is predicted to win."""

from __future__ import annotations

import pytest

from gradsched.cluster import Cluster, CollectiveCost, Topology
from scripts import load_script

KiB, MiB = 1024, 1024 * 1024


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/hier_allreduce.py", "hier_allreduce_bench")


def _cluster() -> Cluster:
    """2 x 2: a fast node, a slow link; flat all-reduce measured with a low start-up, so that the
    model predicts flat at 64 KiB and hier at 16 MiB."""
    topo = Topology(2, 2, "ring", {"allreduce": CollectiveCost(2e-3, 1e-10)}, {"allreduce": CollectiveCost(1e-4, 1e-8)})
    return Cluster(4, {"allreduce": CollectiveCost(1e-4, 3e-8)}, "gloo", topology=topo)


def _raw(measured: dict[int, tuple[list[float], list[float]]]) -> dict:
    return {"cluster": _cluster().to_dict(), "sizes": list(measured),
            "runtime_s": {str(s): {"flat": f, "hier": h} for s, (f, h) in measured.items()},
            "intra_s": {str(s): {"reduce+broadcast": [0.3, 0.3, 9.0], "allreduce": [0.2, 0.2, 0.2]}
                        for s in measured}}


def test_predictions_come_from_the_cluster_and_winners_from_medians(bench):
    # 64 KiB: flat measured faster by median, though one slow flat rep makes its mean the larger
    raw = _raw({64 * KiB: ([0.001, 0.001, 0.5], [0.002, 0.002, 0.002]), 16 * MiB: ([0.9] * 3, [0.5] * 3)})
    table = bench.rows(raw)
    c = _cluster()
    for row in table:
        assert row["predicted_flat_s"] == pytest.approx(c.cost("allreduce").time_s(row["bytes"]))
        assert row["predicted_hier_s"] == pytest.approx(c.cost("hier-allreduce").time_s(row["bytes"]))
    assert [r["predicted_winner"] for r in table] == ["flat", "hier"]
    assert [r["measured_winner"] for r in table] == ["flat", "hier"]
    assert all(r["agree"] for r in table)
    assert table[0]["intra_reduce_broadcast_over_allreduce"] == pytest.approx(1.5)
    assert bench.summary(table) == {"sizes": 2, "agree": 2, "predicted_hier_wins": 1, "target_holds": True}


def test_target_fails_only_where_hier_was_predicted_and_lost(bench):
    # flat predicted at 64 KiB but hier measured faster: a disagreement, not a failed target
    table = bench.rows(_raw({64 * KiB: ([0.003] * 3, [0.002] * 3), 16 * MiB: ([0.9] * 3, [0.5] * 3)}))
    assert bench.summary(table) == {"sizes": 2, "agree": 1, "predicted_hier_wins": 1, "target_holds": True}
    # hier predicted at 16 MiB and measured slower: the target fails, and the table says so
    table = bench.rows(_raw({64 * KiB: ([0.001] * 3, [0.002] * 3), 16 * MiB: ([0.5] * 3, [0.9] * 3)}))
    assert bench.summary(table)["target_holds"] is False
    text = bench.format_table(table)
    assert "FAILS" in text and text.splitlines()[2].split()[-2] == "NO"


def test_a_single_size_is_refused_before_any_rank_starts(bench, monkeypatch, capsys):
    """netbench fits each level through two sizes or more: one size used to fail on every rank."""
    monkeypatch.setattr("sys.argv", ["hier_allreduce.py", "--max-bytes", str(64 * KiB)])
    monkeypatch.setattr(bench, "drive", lambda args: pytest.fail("ranks started"))
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2
    assert "fewer than two sizes" in capsys.readouterr().err.strip().splitlines()[-1]
