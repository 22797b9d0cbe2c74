"""``auto``'s faster search (shared results for equal plans, a lower bound that skips
candidates) returns exactly the plan of simulating every candidate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.planners import make_plan
from gradsched.planners.auto import USBYTE_MERGE_BYTES, as_auto, comm_lower_bound_s, ranked, usbyte_floor_s
from gradsched.sim import simulate
from strategies import clusters, profiles

SETTINGS = settings(max_examples=25, deadline=None)


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([1.0, 0.05]),
       st.sampled_from([1, 2]))
def test_auto_returns_the_plan_of_simulating_every_candidate(profile, cluster, density, channels):
    every = ranked(profile, cluster, density, channels)
    expected = as_auto(every[0], len(every), density)
    got = make_plan("auto", profile, cluster, density=density, channels=channels)
    assert got == expected


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True), clusters(), st.sampled_from([1, 2]))
def test_lower_bound_never_exceeds_the_simulated_iteration(profile, cluster, channels):
    for r in ranked(profile, cluster, 0.05, channels):
        bound = comm_lower_bound_s(r.plan, profile, cluster, channels)
        assert bound <= simulate(r.plan, profile, cluster, channels=channels, timeline=False).iteration_s * (1 + 1e-9)
        if any(op.sparse for op in r.plan.operations):
            assert bound == 0.0


@SETTINGS
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([1, 2]))
def test_usbyte_floor_never_exceeds_the_simulated_iteration(profile, cluster, channels):
    # auto skips planning a usbyte candidate whose floor is above the best so far: the floor,
    # from the profile alone, must hold for every plan usbyte makes, every rule and merge.
    for merge_bytes in USBYTE_MERGE_BYTES:
        floor = usbyte_floor_s(profile, cluster, {"merge_bytes": merge_bytes}, channels)
        for extend in (False, True):
            plan = make_plan("usbyte", profile, cluster, merge_bytes=merge_bytes, extend=extend, unit_bytes=64 << 10)
            simulated = simulate(plan, profile, cluster, channels=channels, timeline=False).iteration_s
            assert floor <= simulated * (1 + 1e-9)
