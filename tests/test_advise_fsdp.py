"""``gradsched advise --fsdp`` (issue 36, item 5): fully_shard groupings simulated as decoupled plans."""

from __future__ import annotations

import json

import pytest

from gradsched import Cluster, Profile, TensorProfile
from gradsched.advise_fsdp import blocks_plan, candidates, fsdp_advice
from gradsched.cli import main
from gradsched.plan import Plan
from gradsched.planners.dear import two_phase_ops
from gradsched.sim import simulate


@pytest.fixture
def case():
    tensors = tuple(TensorProfile(f"l{i}.w", 1_000_000, 4_000_000, 0.02, 0.01) for i in range(8))
    return Profile("eight", tensors), Cluster.alpha_beta(1e-3, 5e-9, 8)


def test_each_grouping_is_predicted_as_its_decoupled_plan_and_the_fastest_is_advised(case):
    profile, cluster = case
    advice = fsdp_advice(profile, cluster)
    by_name = {c.grouping: c for c in advice.choices}
    for name, groups in candidates(profile):
        if name in by_name:
            plan = Plan("x", two_phase_ops(groups, profile), profile.fingerprint, overlap_forward=True)
            assert by_name[name].predicted_s == pytest.approx(simulate(plan, profile, cluster).iteration_s)
            assert len(by_name[name].groups) == len(groups)
    assert advice.best.predicted_s == min(c.predicted_s for c in advice.choices)
    assert by_name["per layer"].groups[0] == ("l0.w", "l0.w")
    # a grouping equal to one already listed is listed once (here "within 64 MB" already holds all 32 MB)
    assert [c.groups for c in advice.choices if len(c.groups) == 1] == [[("l0.w", "l7.w")]]
    # the network is as slow as backward: gathering ahead of the forward beats DDP's buckets
    assert advice.best.predicted_s < advice.ddp_default_s


def test_the_bench_rows_fsdp2_plan_groups_each_block_and_the_roots_own_tensors():
    names = ["embed.w", "blocks.0.w", "blocks.0.b", "blocks.1.w", "head.w", "scale"]
    profile = Profile("blocks", tuple(TensorProfile(n, 1000, 4000, 0.01, 0.01) for n in names))
    plan = blocks_plan(profile, ["embed", "blocks", "head"])
    groups = sorted(sorted(s.tensor for s in op.slices) for op in plan.operations if op.collective == "reduce-scatter")
    assert groups == [[0], [1, 2, 3], [4], [5]]  # "scale" is the root's own: fully_shard(root) holds it
    assert plan.overlap_forward and len(plan.gathers()) == len(groups)


def test_advise_fsdp_on_the_command_line(case, tmp_path, capsys):
    profile, cluster = case
    profile.save(tmp_path / "p.json")
    cluster.save(tmp_path / "c.json")
    out = tmp_path / "advice.json"
    assert main(["advise", "--fsdp", "--profile", str(tmp_path / "p.json"), "--cluster", str(tmp_path / "c.json"),
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fully_shard" in printed and "set_modules_to_forward_prefetch" in printed
    data = json.loads(out.read_text())
    assert data["best"]["grouping"] in {c["grouping"] for c in data["choices"]}
    assert data["speedup_best_vs_ddp_default"] > 1
