"""``auto``'s slack tie-break (planners/_slack.py) and ``optimal``'s ``stretch``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, Profile, TensorProfile
from gradsched.costs import cheaper, combine
from gradsched.errors import GradschedError
from gradsched.planners import make_plan
from gradsched.planners._slack import SLACK_TOLERANCE, busy_in_backward_s, near
from gradsched.planners.auto import ranked, ranking_s
from gradsched.planners.optimal import optimal_groups, stretched
from gradsched.sim import simulate
from strategies import clusters, profiles

MS = 1e-3
MB = 1_000_000
SETTINGS = settings(max_examples=12, deadline=None)


def busy(plan, profile, cluster, channels=1):
    r = simulate(plan, profile, cluster, channels=channels, timeline=False)
    return busy_in_backward_s(r.op_start_s, r.op_end_s, r.backward_end_s), r.iteration_s


# 20 layers of 10 ms backward and 2 ms forward, 1 MB each; an all-reduce costs 1 ms + 1 ms per MB: one
# operation per tensor ends communication earliest (1 ms after the backward), but groups of up to five
# tensors end within 5 ms of it, well inside 1% of the ~450 ms iteration, with the link far less busy.
EVEN = Profile("even", tuple(TensorProfile(f"t{i}", MB // 4, MB, 2 * MS, 10 * MS) for i in range(20)))
LINE = Cluster.alpha_beta(1 * MS, 1e-9, 8)


def test_near_ties_go_to_the_plan_least_busy_during_the_backward():
    greedy = make_plan("auto", EVEN, LINE)  # the default: off
    chosen = make_plan("auto", EVEN, LINE, slack=SLACK_TOLERANCE)
    optimal = make_plan("optimal", EVEN, LINE)
    busy_greedy, greedy_s = busy(greedy, EVEN, LINE)
    busy_chosen, chosen_s = busy(chosen, EVEN, LINE)
    busy_optimal, optimal_s = busy(optimal, EVEN, LINE)
    assert len(optimal.operations) == 20 and busy_optimal == pytest.approx(19 * 2 * MS)  # the last one after it
    assert greedy_s == pytest.approx(optimal_s)  # before: the fastest predicted, every tensor alone
    assert len(chosen.operations) < len(optimal.operations)
    assert busy_chosen < busy_optimal - 10 * MS
    assert chosen_s <= optimal_s * (1 + SLACK_TOLERANCE)
    assert ranked(EVEN, LINE, slack=SLACK_TOLERANCE)[0].plan.operations == chosen.operations


@SETTINGS
@given(profiles(max_layers=8, with_update=True), clusters(), st.sampled_from([0.01, 0.05]), st.sampled_from([1, 2]))
def test_slack_never_picks_a_plan_predicted_slower_than_the_tolerance(profile, cluster, slack, channels):
    every = ranked(profile, cluster, channels=channels, slack=slack)
    top = min(every, key=lambda r: ranking_s(r.plan, r.predicted_s))  # what slack 0 would pick among them
    chosen = make_plan("auto", profile, cluster, channels=channels, slack=slack)
    assert chosen.options["predicted_iteration_s"] <= top.predicted_s * (1 + slack) * (1 + 1e-9)
    assert chosen.operations == every[0].plan.operations  # the search's shortcuts choose as ranking every one
    # and it is the least busy of the near-tied ones
    tied = near([r.predicted_s for r in every], [r.predicted_s for r in every], slack)
    chosen_busy = busy(chosen, profile, cluster, channels)[0]
    assert all(chosen_busy <= busy(every[i].plan, profile, cluster, channels)[0] + 1e-12 for i in tied
               if not any(op.two_phase for op in every[i].plan.operations))


def test_slack_zero_is_the_fastest_predicted():
    every = ranked(EVEN, LINE, slack=0.0)
    assert every[0].predicted_s == min(r.predicted_s for r in every)
    assert make_plan("auto", EVEN, LINE, slack=0.0).options["predicted_iteration_s"] == every[0].predicted_s


def test_a_bad_slack_is_refused():
    with pytest.raises(GradschedError, match="slack"):
        make_plan("auto", EVEN, LINE, slack=-0.1)


@pytest.mark.parametrize("cost", [CollectiveCost(1 * MS, 1e-9), CollectiveCost(1 * MS, 1e-9, ((1e3, 2 * MS), (1e6, 3 * MS))),
                                  cheaper(CollectiveCost(1 * MS, 2e-9), CollectiveCost(3 * MS, 1e-9))])
def test_a_stretched_cost_is_every_time_times_the_factor(cost):
    sizes = [0.0, 10.0, 1e3, 5e5, 1e6, 4e6, 1e8]
    assert stretched(cost, 1.0) is cost
    assert stretched(cost, 2.5).times_s(sizes) == pytest.approx(2.5 * cost.times_s(sizes), rel=1e-12)


def test_optimal_stretched_plans_for_the_slower_channel_and_merges_more():
    # stretched 8x an operation of one tensor (16 ms) outlasts the 10 ms between gradients: merging pays
    plain = make_plan("optimal", EVEN, LINE)
    slow = make_plan("optimal", EVEN, LINE, stretch=8.0)
    groups, _ = optimal_groups(EVEN, combine([(8.0, LINE.cost("allreduce"))]))
    assert [list(op.tensors()) for op in slow.operations] == groups
    assert len(slow.operations) < len(plain.operations)
    assert slow.options["stretch"] == 8.0 and "stretch" not in plain.options
