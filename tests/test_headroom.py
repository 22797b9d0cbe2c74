"""benchmarks/headroom.py's tighter network bound (startup_bound_s) on committed 8-host runs: below every plan's
simulated step, above the bench's bound where the start-up per operation is large."""

from __future__ import annotations

import json

import pytest

from gradsched.cluster import Cluster
from gradsched.costs import NO_RING_BYTES
from gradsched.jobs.results import read_bench_row
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate
from tests.scripts import ROOT, load_script

headroom = load_script("benchmarks/headroom.py", "headroom_under_test")
plan_headroom = load_script("benchmarks/plan_headroom.py", "plan_headroom_under_test")
RESULTS = ROOT / "benchmarks" / "results"


def _run(name: str) -> tuple[dict, Profile, Cluster]:
    """A stored run's first row, profile and cluster, its unmeasured two phases priced half the all-reduce each as
    when it ran (``derived_phase_ratios`` 1, and all-to-alls at every size, ``ring_min_bytes`` out of reach: the
    runs before the rings; docs/cost-model.md, "Two phases not measured")."""
    first, _ = read_bench_row(json.loads((RESULTS / f"emulate_papers_{name}.json").read_text())[0])
    as_run = {"derived_phase_ratios": {"reducescatter": 1.0, "allgather": 1.0}, "ring_min_bytes": NO_RING_BYTES,
              **first["cluster"]}
    return first, Profile.from_dict(first["profile"]["measured"]), Cluster.from_dict(as_run)


@pytest.mark.parametrize("name", ["bert_base_8h_start8", "vgg16_8h_runs9b"])
def test_no_plan_simulates_below_the_startup_bound(name):
    first, profile, cluster = _run(name)
    bound = headroom.startup_bound_s(profile, cluster)
    assert bound["allreduce_all_s"] == pytest.approx(first["lower_bound"]["allreduce_all_s"], rel=1e-6)
    plans = [make_plan(s, profile, cluster) for s in ("ddp", "optimal", "mgwfbp", "usbyte")]
    n = len(profile.order)
    plans += [plan_headroom.grouped_plan(profile, cuts, kind) for kind in plan_headroom.KINDS
              for cuts in ([], [1], [n // 4, n // 2], list(range(1, n, max(1, n // 12))))]
    for plan in plans:
        assert simulate(plan, profile, cluster, timeline=False).iteration_s >= bound["startup_bound_s"]


def test_the_startup_bound_is_tighter_where_the_start_up_is_large():
    # BERT-Base on 8 hosts: a ~20 ms start-up per all-reduce against 0.59 s for all gradients
    first, profile, cluster = _run("bert_base_8h_start8")
    bound = headroom.startup_bound_s(profile, cluster)
    assert bound["startup_bound_s"] > 1.02 * first["lower_bound_s"]
    assert bound["idle_and_startup_s"] > 0


def test_help_prints_usage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """``--help`` is an option, not a run's path: it used to print an empty table and overwrite headroom.json."""
    monkeypatch.setattr(headroom, "RESULTS", tmp_path)
    with pytest.raises(SystemExit) as done:
        headroom.main(["--help"])
    assert done.value.code == 0 and "usage" in capsys.readouterr().out
    assert not (tmp_path / "headroom.json").exists()
