"""The bucket advisor: the advised sizes are the sweep's fastest, DeepSpeed's buckets count
elements and cover every tensor once, the command's outputs and errors, no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster, Profile, TensorProfile
from gradsched.advise import (DDP_DEFAULT_FIRST_MB, DDP_DEFAULT_MB, Point, advise, ddp_plan, deepspeed_plan,
                              least_regret, regrets)
from gradsched.cluster import Contention
from gradsched.cli import main as cli
from gradsched.planners import make_plan
from gradsched.sim import simulate
from strategies import clusters, profiles

MS = 1e-3
BUNDLED_NET = ["--cluster", "bundled:googlenet-10gbe"]  # the network, named: advise never picks one silently
SETTINGS = settings(max_examples=30, deadline=None)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters())
def test_advised_sizes_are_the_fastest_of_the_sweep(profile, cluster):
    sizes = (1, 5, 25, 100)  # auto's own DDP sizes (1 MiB first): then auto is never predicted slower
    a = advise(profile, cluster, sizes, ddp_first_bucket_mb=DDP_DEFAULT_FIRST_MB)
    ddp = {mb: simulate(make_plan("ddp", profile, cluster, bucket_cap_mb=mb), profile, cluster,
                        timeline=False).iteration_s for mb in sizes}
    assert a.ddp_predicted_s == min(ddp.values())
    assert a.ddp_bucket_cap_mb == min(mb for mb in sizes if ddp[mb] == min(ddp.values()))  # ties: smaller
    assert a.ddp_default_s == simulate(make_plan("ddp", profile, cluster, bucket_cap_mb=DDP_DEFAULT_MB), profile,
                                       cluster, timeline=False).iteration_s
    assert a.deepspeed_predicted_s == min(p.predicted_s for p in a.deepspeed_sweep)
    auto = make_plan("auto", profile, cluster)
    assert a.gradsched_predicted_s == simulate(auto, profile, cluster, timeline=False).iteration_s
    assert a.gradsched_predicted_s <= a.ddp_predicted_s * (1 + 1e-9)  # auto tries DDP's buckets too
    near = a.ddp_near_best_mb
    assert a.ddp_bucket_cap_mb in near
    assert near == [mb for mb in sizes if ddp[mb] <= a.ddp_predicted_s * 1.02]
    s = a.settings()
    assert s["torch.nn.parallel.DistributedDataParallel"]["bucket_cap_mb"] == a.ddp_bucket_cap_mb
    assert s["transformers.TrainingArguments"]["ddp_bucket_cap_mb"] == a.ddp_bucket_cap_mb


@SETTINGS
@given(profiles(max_layers=12, mixed_dtypes=True), st.integers(1, 5_000_000))
def test_deepspeed_buckets_cover_every_tensor_once_within_the_element_cap(profile, elements):
    plan = deepspeed_plan(profile, elements)
    plan.check(profile)
    seen = [i for op in plan.operations for i in op.tensors()]
    assert seen == list(profile.order)  # backward order, each tensor once, never split
    for op in plan.operations:
        numel = sum(profile.tensors[i].numel for i in op.tensors())
        assert numel <= elements or len(op.slices) == 1


def test_a_set_bucket_cap_caps_the_first_bucket_too_the_default_does_not():
    # Ready order: six 0.6 MB tensors then a 4 MB one.  Left unset, DDP closes its first bucket
    # past 1 MiB (two tensors), then fills 25 MiB; set to 2 MiB, the first bucket holds 2 MiB too.
    sizes = [600_000] * 6 + [4_000_000]
    t = tuple(TensorProfile(f"t{i}", b // 4, b, MS, MS) for i, b in enumerate(sizes))
    profile = Profile("seven", t, ready_order=tuple(range(7)))
    cluster = Cluster.alpha_beta(1 * MS, 1e-9, 2)
    assert [op.tensors() for op in ddp_plan(profile, cluster, 2).operations] == [(0, 1, 2, 3), (4, 5, 6)]
    assert [op.tensors() for op in ddp_plan(profile, cluster, 2, 1).operations] == [(0, 1), (2, 3, 4, 5), (6,)]
    assert [op.tensors() for op in ddp_plan(profile, cluster, DDP_DEFAULT_MB, DDP_DEFAULT_FIRST_MB).operations] == \
        [(0, 1), (2, 3, 4, 5, 6)]
    a = advise(profile, cluster, (2, DDP_DEFAULT_MB))
    by_mb = {p.bucket_mb: p for p in a.ddp_sweep}
    assert by_mb[2].operations == 2 and by_mb[DDP_DEFAULT_MB].operations == 1  # a set 25 MiB: one bucket
    default = simulate(ddp_plan(profile, cluster, DDP_DEFAULT_MB, DDP_DEFAULT_FIRST_MB), profile, cluster,
                       timeline=False).iteration_s
    assert a.ddp_default_s == default  # the default row is DDP left unset: 1 MiB first
    old = advise(profile, cluster, (2, DDP_DEFAULT_MB), ddp_first_bucket_mb=1)
    assert {p.bucket_mb: p.operations for p in old.ddp_sweep} == {2.0: 3, DDP_DEFAULT_MB: 2}


def test_with_contention_figures_the_advice_is_the_least_worst_case_regret():
    # With the figures 100 MiB is fastest, without them 1 MiB; 5 MiB is near both.
    sweep = [Point(1, 1.05, 5, 1.00), Point(5, 1.012, 3, 1.007), Point(100, 1.00, 1, 1.20)]
    assert regrets(sweep) == pytest.approx({1: 1.05, 5: 1.012, 100: 1.20})
    assert least_regret(sweep).bucket_mb == 5
    no_figures = [Point(p.bucket_mb, p.predicted_s, p.operations) for p in sweep]
    assert least_regret(no_figures).bucket_mb == 100  # without figures: the fastest


def test_advise_on_a_cluster_with_contention_reads_both_predictions():
    layers = tuple(TensorProfile(f"l{i}", 2_500_000, 10_000_000, 5 * MS, 10 * MS) for i in range(8))
    profile = Profile("overlap", layers)
    idle = Cluster.alpha_beta(10e-6, 1e-9, 8)
    busy = replace(idle, contention=Contention(compute_slowdown=0.7, comm_slowdown=1.5))
    a = advise(profile, busy, (5, 25, 100))
    for p in a.ddp_sweep:
        assert p.predicted_s == simulate(ddp_plan(profile, busy, p.bucket_mb), profile, busy,
                                         timeline=False).iteration_s
        assert p.predicted_idle_s == simulate(ddp_plan(profile, idle, p.bucket_mb), profile, idle,
                                              timeline=False).iteration_s
    assert a.ddp_bucket_cap_mb == least_regret(a.ddp_sweep).bucket_mb
    assert a.ddp_predicted_s == {p.bucket_mb: p.predicted_s for p in a.ddp_sweep}[a.ddp_bucket_cap_mb]
    assert all(p.predicted_idle_s is None for p in advise(profile, idle, (5, 25, 100)).ddp_sweep)


def test_deepspeed_bucket_size_counts_elements_not_bytes():
    # Four fp32 tensors of 1M elements (4 MB each).  A 2M-element bucket holds two of them.
    t = [TensorProfile(f"t{i}", 1_000_000, 4_000_000, MS, MS) for i in range(4)]
    profile = Profile("four", tuple(t))
    assert [op.tensors() for op in deepspeed_plan(profile, 2_000_000).operations] == [(3, 2), (1, 0)]
    a = advise(profile, Cluster.alpha_beta(1 * MS, 1e-9, 4), (4, 8))
    assert a.element_bytes == 4
    assert a.deepspeed_reduce_bucket_size in (4 * 2**20 // 4, 8 * 2**20 // 4)


def test_small_buckets_advised_when_overlap_pays_and_large_when_start_ups_dominate():
    layers = tuple(TensorProfile(f"l{i}", 2_500_000, 10_000_000, 5 * MS, 10 * MS) for i in range(8))
    profile = Profile("overlap", layers)
    fast_start = advise(profile, Cluster.alpha_beta(10e-6, 1e-9, 8), (5, 25, 100))
    assert fast_start.ddp_bucket_cap_mb == 5  # each 10 MB layer goes as soon as it is ready
    slow_start = advise(profile, Cluster.alpha_beta(200 * MS, 1e-12, 8), (5, 25, 100))
    assert slow_start.ddp_bucket_cap_mb == 100  # one start-up for everything


def test_command_prints_the_settings_and_writes_json(tmp_path, capsys):
    out = tmp_path / "advice.json"
    assert cli(["advise", *BUNDLED_NET, "--workers", "4", "--buckets", "1,5,25", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bucket_cap_mb=" in text and "ddp_bucket_cap_mb=" in text and "reduce_bucket_size" in text
    assert "within 2% of the advised one" in text
    d = json.loads(out.read_text())
    assert d["ddp_bucket_cap_mb"] in (1, 5, 25) and d["world_size"] == 4
    assert d["ddp_bucket_cap_mb"] in d["ddp_near_best_mb"]
    assert f"bucket_cap_mb={d['settings']['torch.nn.parallel.DistributedDataParallel']['bucket_cap_mb']}" in text
    assert cli(["advise", *BUNDLED_NET, "--workers", "4", "--buckets", "1,5,25", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == d


@pytest.mark.parametrize("argv", [["--buckets", "x"], ["--buckets", "0,5"], ["--channels", "0"],
                                  ["--ddp-first-bucket-mb", "0"]])
def test_command_errors_are_one_line_and_exit_2(argv):
    out = subprocess.run([sys.executable, "-m", "gradsched.cli", "advise", *BUNDLED_NET, *argv], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_advise_command_imports_no_torch():
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ImportError('torch is blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from gradsched.cli import main\n"
            "assert main(['advise', '--cluster', 'bundled:googlenet-10gbe', '--workers', '2', '--buckets', '5,25', "
            "'--json', '-']) == 0\n"
            "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_command_requires_a_network_instead_of_a_bundled_one(capsys):
    """Issue 38 item 7: no silent bundled 10 GbE cluster; the error says how to give one."""
    assert cli(["advise", "--workers", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--cluster" in err and "gradsched netbench" in err and "bundled:googlenet-10gbe" in err
    assert cli(["advise", "--workers", "4", "--alpha", "1e-4", "--beta", "1e-9", "--buckets", "5,25"]) == 0


def _overlapping_and_not(profile, cluster):
    from gradsched.planners.auto import ranked

    every = ranked(profile, cluster)
    return [r for r in every if r.plan.overlap_forward], [r for r in every if not r.plan.overlap_forward]


@SETTINGS
@given(profiles(max_layers=8), clusters())
def test_a_plan_check_keeps_gradsched_best_plan_to_plans_that_run(profile, cluster):
    """A plan the check refuses is never recommended: the best is the fastest accepted candidate, and the
    refused faster ones are listed; with a check that accepts everything, auto's own choice."""
    refuse_overlap = lambda plan: "overlaps" if plan.overlap_forward else None  # noqa: E731
    a = advise(profile, cluster, (5, 25), plan_check=refuse_overlap)
    overlapping, plain = _overlapping_and_not(profile, cluster)
    assert a.gradsched_predicted_s == plain[0].predicted_s and not a.gradsched_overlaps_forward
    from gradsched.planners.auto import ranked  # auto's order: a decoupled plan must win by its margin, near ties
    # go to the plan least busy during the backward (planners/_slack.py)

    every = ranked(profile, cluster)
    first_plain = next(i for i, r in enumerate(every) if not r.plan.overlap_forward)
    faster = [r for r in every[:first_plain] if r.plan.overlap_forward]
    assert len(a.gradsched_rejected) >= len(faster)
    assert all(r.endswith(": overlaps") for r in a.gradsched_rejected)
    free = advise(profile, cluster, (5, 25), plan_check=lambda plan: None)
    assert free.gradsched_predicted_s == simulate(make_plan("auto", profile, cluster), profile, cluster,
                                                  timeline=False).iteration_s
