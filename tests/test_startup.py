"""A bench's start-up in wall seconds at any dilation: the rules of gradsched.jobs.startup (torch-free)."""

from __future__ import annotations

import math

import pytest

from gradsched.jobs.startup import (AUTO_WARMUP_S, FULL_FLOOR_S, STARTUP_TARGET_S, AutoWarmup, auto_options,
                                    auto_warmup, probe_floor)


@pytest.mark.parametrize("per_rep_s,least,expected", [
    (0.5, 1, 3),  # three fit: the floor
    (FULL_FLOOR_S / 3, 0, 3),  # just fit
    (FULL_FLOOR_S / 3 * 1.01, 1, 1),  # a dilated replay's repetition: one ...
    (40.0, 0, 0),  # ... or none (sampled between the rounds)
    (math.inf, 1, 1),
])
def test_a_probe_keeps_its_floor_only_where_it_fits(per_rep_s, least, expected):
    assert probe_floor(3, per_rep_s, least=least) == expected


def test_a_floor_below_least_is_kept():
    assert probe_floor(1, 100.0, least=2) == 1


def test_auto_warms_up_in_situ_where_its_iterations_fit_its_own_budget():
    # googlenet-k80 at dilation 1: some 300 iterations of about 0.4 s, two minutes: more than is left of
    # the 120 s start-up once it has run, yet run-time auto's warm-up is its own phase with its own budget
    default = auto_warmup(303, 0.4, options=None, replay=True)
    assert AUTO_WARMUP_S == 300.0 and AUTO_WARMUP_S > STARTUP_TARGET_S
    assert default.in_situ and default.estimated_s == pytest.approx(121.2) and default.budget_s == AUTO_WARMUP_S
    assert "adaptive" not in auto_options(None, default)
    assert auto_warmup(300, 0.99, options=None, replay=True).in_situ  # 297 s
    assert not auto_warmup(300, 1.01, options=None, replay=True).in_situ  # 303 s
    assert not auto_warmup(300, 0.1, options=None, replay=True, budget_s=20.0).in_situ


def test_a_dilated_replay_plans_auto_at_start_up():
    # googlenet-k80 at --dilate 20: a step of about 8 s, some 300 iterations of warm-up
    w = auto_warmup(303, 7.9, options={"trials": 3}, replay=True)
    assert not w.in_situ and w.iterations == 303 and w.estimated_s == pytest.approx(303 * 7.9)
    opts = auto_options({"trials": 3}, w)
    assert opts == {"trial_share": 0, "trials": 3, "adaptive": False}
    record = w.to_dict()
    assert record["mode"] == "planned at start-up" and AutoWarmup.from_dict(record) == w
    line = w.describe()
    assert "planned at start-up" in line and "auto.adaptive=true" in line and "303 iterations" in line
    assert "300 s budget" in line


def test_models_that_really_compute_keep_the_run_time_warm_up():
    w = auto_warmup(303, 7.9, options=None, replay=False)
    assert w.in_situ and auto_options(None, w) == {"trial_share": 0}


@pytest.mark.parametrize("given,in_situ", [(True, True), ("true", True), (False, False), ("false", False)])
def test_adaptive_given_is_obeyed_whatever_the_cost(given, in_situ):
    w = auto_warmup(303, 7.9, options={"adaptive": given}, replay=True)
    assert w.in_situ is in_situ and w.budget_s == math.inf
    assert w.to_dict()["budget_s"] is None and AutoWarmup.from_dict(w.to_dict()) == w  # no Infinity in the JSON
    assert auto_options({"adaptive": given}, w)["adaptive"] == given  # as given, never overridden
    assert "as asked" in w.describe() or w.in_situ


def test_the_network_table_stops_where_it_would_exceed_its_budget():
    from gradsched.net_extend import TABLE_BUDGET_S, TABLE_FLOOR_BYTES, measured_top

    sizes = [4096 << k for k in range(14)]  # 4 KiB .. 32 MiB
    fast = measured_top(sizes, lambda b: 1e-3 + b / 1e9)  # fast links: every size
    assert fast == sizes[-1]
    # a link shaped at 50 Mbit/s (1 Gbit/s at --dilate 20): a few repetitions of 8 MiB take seconds
    slow = measured_top(sizes, lambda b: 4 * max(1e-3, b * 8 / 50e6))
    assert TABLE_FLOOR_BYTES <= slow < sizes[-1]
    assert sum(4 * max(1e-3, b * 8 / 50e6) for b in sizes if b <= slow) <= TABLE_BUDGET_S or slow == TABLE_FLOOR_BYTES
    assert measured_top(sizes, lambda b: 100.0) == TABLE_FLOOR_BYTES  # never below the floor


def test_the_short_warm_up_is_kept_in_the_json_and_never_overrides_the_user():
    from gradsched.jobs.startup import SHORT_WARMUP, may_shorten, shorter

    full = auto_warmup(281, 1.7, options=None, replay=True)  # 478 s: over its budget
    short = auto_warmup(144, 1.7, options=None, replay=True)  # 245 s
    chosen = shorter(full, short)
    assert chosen.in_situ and AutoWarmup.from_dict(chosen.to_dict()) == chosen
    assert chosen.to_dict()["shortened"] == SHORT_WARMUP and "shortened" not in full.to_dict()
    assert shorter(full, auto_warmup(144, 2.5, options=None, replay=True)) == full  # 360 s: planned at start-up
    fits = auto_warmup(281, 1.0, options=None, replay=True)
    assert shorter(fits, short) == fits  # the full one where it fits
    assert may_shorten(None) and may_shorten({"max_replans": 2})
    assert not may_shorten({"adaptive": True}) and not may_shorten({"patience": 10})
