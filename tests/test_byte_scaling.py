"""Byte scaling (gradsched bench --scale-bytes): tensors / S on links at rate / S keep each operation's bandwidth time."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.bundled import bundled_profile
from gradsched.byte_scaling import (check_scale, pick_scale, scale_ddp_entries, scale_entries, scale_profile,
                                    scaled_bps, smallest_fitting_scale)
from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.planners import make_plan
from gradsched.planners.auto import best
from gradsched.planners.registry import byte_scaled_options, planner_option_specs, strategy_names
from gradsched.profile import Profile
from gradsched.sim import simulate

BETA = 8e-9  # seconds per byte: 1 Gbit/s
ALPHA = 1e-3


def _profile(numels: list[int]) -> Profile:
    tensors = [{"name": f"t{i}", "numel": n, "bytes": 4 * n, "forward_s": 1e-3, "backward_s": 2e-3}
               for i, n in enumerate(numels)]
    return Profile.from_dict({"format": "gradsched.profile/1", "model": "m", "tensors": tensors,
                              "ready_order": list(range(len(numels)))[::-1], "other_s": 1e-3})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 1 << 22), min_size=1, max_size=12), st.sampled_from([1, 2, 4, 16, 64]))
def test_every_tensor_keeps_its_bandwidth_time_and_only_latency_is_not_scaled(numels, scale):
    prof = _profile([n * scale for n in numels])  # divisible: the scaled sizes are exact
    scaled = scale_profile(prof, scale)
    full, small = Cluster.alpha_beta(ALPHA, BETA, 4).cost("allreduce"), Cluster.alpha_beta(ALPHA, BETA * scale, 4).cost(
        "allreduce")
    for a, b in zip(prof.tensors, scaled.tensors):
        assert b.numel * scale == a.numel and b.element_bytes == a.element_bytes
        assert (b.forward_s, b.backward_s) == (a.forward_s, a.backward_s)
        assert small.time_s(b.bytes) - ALPHA == pytest.approx(full.time_s(a.bytes) - ALPHA, rel=1e-9)  # bandwidth
        assert small.time_s(b.bytes) == pytest.approx(full.time_s(a.bytes), rel=1e-9)  # and the latency as it was


def _googlenet_x16() -> Profile:
    """GoogLeNet (K80) with its sizes x16 (exact at S = 4 and 16), its times and order."""
    k80 = bundled_profile("googlenet-k80")
    return Profile(k80.model, tuple(dataclasses.replace(t, numel=16 * t.numel, bytes=16 * t.bytes)
                                    for t in k80.tensors), k80.ready_order, k80.other_s, {}, None)


SIZED = ["ddp", "threshold", "horovod", "bytescheduler", "usbyte", "dear"]  # the strategies with options in bytes


@pytest.mark.parametrize("strategy", ["wfbp", "mgwfbp", "optimal", *SIZED])
@pytest.mark.parametrize("scale", [4, 16])
def test_a_plan_of_the_scaled_model_on_scaled_links_takes_the_emulated_time(strategy, scale):
    """GoogLeNet (K80) on links at 1 Gbit/s and at 1/S of it with tensors / S, the strategy's sizes (defaults and
    given) / S as the bench passes them: the same operations, each as long, hence the same simulated iteration."""
    prof = _googlenet_x16()
    full_cluster, small_cluster = Cluster.alpha_beta(ALPHA, BETA, 4), Cluster.alpha_beta(ALPHA, BETA * scale, 4)
    scaled = scale_profile(prof, scale)
    given = {"usbyte": {"merge_bytes": 1 << 20}, "bytescheduler": {"partition_bytes": 1 << 20, "credit_bytes": 4 << 20},
             "dear": {"grouping": "threshold"}, "ddp": {"bucket_cap_mb": 5}}.get(strategy, {})
    plan = make_plan(strategy, prof, full_cluster, **given)
    plan_scaled = make_plan(strategy, scaled, small_cluster, **byte_scaled_options(strategy, given, scale))
    assert [op.tensors() for op in plan_scaled.operations] == [op.tensors() for op in plan.operations]
    full_cost, small_cost = full_cluster.cost("allreduce"), small_cluster.cost("allreduce")
    for b, b_s in zip(plan.op_bytes(prof), plan_scaled.op_bytes(scaled)):
        assert b_s * scale == b and small_cost.time_s(b_s) == pytest.approx(full_cost.time_s(b), rel=1e-12)
    t, ts = (simulate(p, pr, c, timeline=False).iteration_s
             for p, pr, c in ((plan, prof, full_cluster), (plan_scaled, scaled, small_cluster)))
    assert ts == pytest.approx(t, rel=1e-9)


def test_every_size_option_is_marked_and_divided():
    """An option in bytes, MiB or MB (by its name) is declared a size, which byte scaling divides (a default of None,
    the planner's own choice, stays; integers stay whole, at least 1; 0 stays 0)."""
    sized = {name for name in strategy_names()
             for o in planner_option_specs(name).values()
             if o.name.endswith(("_bytes", "_mb")) or o.name == "mb"}
    assert sized == set(SIZED)
    for name in strategy_names():
        for o in planner_option_specs(name).values():
            assert o.size == (o.name.endswith(("_bytes", "_mb")) or o.name == "mb"), (name, o.name)
    assert byte_scaled_options("usbyte", {"merge_bytes": "3"}, 16) == {"merge_bytes": 1, "unit_bytes": 1 << 18}
    assert byte_scaled_options("bytescheduler", {}, 16) == {"partition_bytes": 1 << 18}  # credit: two blocks
    assert byte_scaled_options("ddp", {"bucket_cap_mb": 5}, 4) == {"bucket_cap_mb": 1.25, "first_bucket_mb": 0.25}
    assert byte_scaled_options("mgwfbp", {}, 16) == {} and byte_scaled_options("usbyte", {"patience": 3}, 1) == {
        "patience": 3}


@pytest.mark.parametrize("scale", [4, 16])
def test_auto_on_the_scaled_model_chooses_the_emulated_models_plan(scale):
    """``auto`` with ``byte_scale`` S (its grid's sizes and the strategies' defaults / S) on the scaled model and links
    chooses what it chooses for the model emulated: the same strategy and operations, predicted alike."""
    prof = _googlenet_x16()
    full_cluster, small_cluster = Cluster.alpha_beta(ALPHA, BETA, 2), Cluster.alpha_beta(ALPHA, BETA * scale, 2)
    (full, n), (small, n_scaled) = best(prof, full_cluster), best(scale_profile(prof, scale), small_cluster,
                                                                 byte_scale=scale)
    assert (small.strategy, n_scaled) == (full.strategy, n)
    assert [op.tensors() for op in small.plan.operations] == [op.tensors() for op in full.plan.operations]
    assert small.predicted_s == pytest.approx(full.predicted_s, rel=1e-9)
    assert make_plan("auto", scale_profile(prof, scale), small_cluster, byte_scale=scale).options["chosen_options"] == \
        byte_scaled_options(full.strategy, full.plan.options, scale)


def test_the_bench_divides_every_rows_sizes():
    entries = [{"label": "ddp", "strategy": "ddp", "torch_ddp": True},
               {"label": "usbyte", "strategy": "usbyte", "torch_ddp": False, "options": {"merge_bytes": 1 << 20}},
               {"label": "auto", "strategy": "auto", "torch_ddp": False, "options": {"trials": 2}},
               {"label": "mgwfbp", "strategy": "mgwfbp", "torch_ddp": False},
               {"label": "fsdp2", "strategy": "fsdp2", "torch_ddp": False, "fsdp2": True}]
    out = scale_entries(entries, 16)
    assert out[0]["ddp_kwargs"] == {"bucket_cap_mb": 25 / 16}
    assert out[1]["options"] == {"merge_bytes": 1 << 16, "unit_bytes": 1 << 18}
    assert out[2]["options"] == {"trials": 2, "byte_scale": 16}
    assert out[3]["options"] == {} and out[4] == entries[4]
    assert scale_entries(entries, 1) == entries and entries[1]["options"] == {"merge_bytes": 1 << 20}


def test_ddp_buckets_and_link_rates_scale_alike():
    entries = [{"label": "ddp", "torch_ddp": True}, {"label": "ddp-5mb", "torch_ddp": True,
                                                     "ddp_kwargs": {"bucket_cap_mb": 5.0}},
               {"label": "auto", "torch_ddp": False}]
    out = scale_ddp_entries(entries, 4)
    assert [e.get("ddp_kwargs") for e in out] == [{"bucket_cap_mb": 6.25}, {"bucket_cap_mb": 1.25}, None]
    assert entries[0].get("ddp_kwargs") is None  # the given rows untouched
    assert scaled_bps(1_000_000_000, 16) == 62_500_000


@pytest.mark.parametrize("bad", [0, 0.5, 2.5, -4, float("nan"), float("inf"), 1e9])
def test_a_bad_scale_is_refused(bad):
    with pytest.raises(GradschedError, match="--scale-bytes must be a whole number"):
        check_scale(bad)
    assert check_scale(16.0) == 16


def test_the_smallest_power_of_two_that_fits_is_picked(monkeypatch):
    assert smallest_fitting_scale(lambda s: s >= 5, None) == 8
    assert smallest_fitting_scale(lambda s: False, 3) == 3
    with pytest.raises(GradschedError, match="even at --scale-bytes"):
        smallest_fitting_scale(lambda s: False, None)
    import gradsched.bench_memory as bm

    monkeypatch.setattr(bm, "available_bytes", lambda: int(4e9))  # 3.2 GB usable
    prof = _profile([100_000_000])  # 400 MB in one tensor: 0.40 + 0.4 / S + 3 x 0.4 / S GB a rank
    assert pick_scale(prof, 2, None, shaped=True) == 2  # 4.0 GB for 2 ranks at S=1, 2.4 GB at S=2
    assert pick_scale(prof, 2, 8, shaped=True) == 8
    with pytest.raises(GradschedError, match=f"needs about {2 * bm.rank_bytes(400e6, 400e6, 2) / 1e9:.1f} GB"):
        pick_scale(prof, 2, None, shaped=False)  # loopback: no links to scale
    with pytest.raises(GradschedError, match="run on the testbed"):
        pick_scale(prof, 2, 4, shaped=False)


def test_a_bad_scale_exits_2_with_one_line():
    done = subprocess.run([sys.executable, "-m", "gradsched.cli", "bench", "--replay", "googlenet-k80", "--loopback",
                           "--scale-bytes", "2.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--scale-bytes" in done.stderr
