"""``usbyte`` prices its rules' plans with the simulator's compiled pass, without making them
(planners/_usbyte_eval.py): the iteration ``simulate`` predicts for each plan, bit for bit, and the
same plan chosen as building and simulating every rule's plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.constants import MiB
from gradsched.planners import usbyte
from gradsched.planners.usbyte import RULES
from gradsched.sim import _kernel, simulate
from gradsched.synthetic import random_case
from strategies import clusters, profiles, two_level_clusters

needs_numba = pytest.mark.skipif(not _kernel.enabled(), reason="numba not installed (gradsched[fast])")


def priced_and_simulated(monkeypatch, profile, cluster, **opts):
    """Every rule plan ``usbyte`` prices: (its price, the simulated iteration of the plan built from it)."""
    seen = []
    priced = usbyte._priced

    def check(model, found, options, cluster_, hierarchical):
        plan_, predicted = priced(model, found, options, cluster_, hierarchical)
        built = usbyte._build(model, found, options, cluster_, hierarchical)
        seen.append((plan_, predicted, simulate(built, profile, cluster_, timeline=True).iteration_s))  # Python pass
        return plan_, predicted

    monkeypatch.setattr(usbyte, "_priced", check)
    return usbyte.plan(profile, cluster, **opts), seen


@needs_numba
@settings(max_examples=30, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(),
       st.sampled_from([MiB // 4, MiB, 4 * MiB]))
def test_rule_plans_priced_as_simulated(profile, cluster, merge_bytes):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_kernel, "MIN_OPERATIONS", 1)  # small plans priced too
        _, seen = priced_and_simulated(mp, profile, cluster, merge_bytes=merge_bytes, unit_bytes=16 << 10)
    assert seen and all(plan_ is None for plan_, _, _ in seen)  # every one priced, none built
    assert [p for _, p, _ in seen] == [s for _, _, s in seen]


@needs_numba
@settings(max_examples=20, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True), two_level_clusters(), st.sampled_from(["auto", "always", "never"]))
def test_rule_plans_priced_as_simulated_with_hierarchical_blocks(profile, cluster, hierarchical):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_kernel, "MIN_OPERATIONS", 1)
        _, seen = priced_and_simulated(mp, profile, cluster, merge_bytes=MiB, unit_bytes=16 << 10,
                                       hierarchical=hierarchical)
    assert [p for _, p, _ in seen] == [s for _, _, s in seen]


@needs_numba
@pytest.mark.parametrize("seed", [619334, 586572, 886728])
def test_merged_usbyte_chooses_the_plan_of_simulating_every_rule(seed, monkeypatch):
    # issue 40's grid: the rule chosen from prices is the one of building and simulating each rule's plan
    case = random_case(seed, 300)
    profile, cluster = case.profile(), case.cluster()
    got, seen = priced_and_simulated(monkeypatch, profile, cluster, merge_bytes=MiB)
    assert seen and [p for _, p, _ in seen] == [s for _, _, s in seen]
    fixed = [usbyte.plan(profile, cluster, merge_bytes=MiB, window=w, extend=e) for w, e in RULES]
    keyed = [(simulate(p, profile, cluster, timeline=False).iteration_s, len(p.operations), k, p)
             for k, p in enumerate(fixed)]
    expected = min(keyed, key=lambda x: x[:3])[3]
    assert got.operations == expected.operations and got.options == expected.options


@settings(max_examples=20, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True))
def test_whole_ops_from_the_profile_table_equal_whole_tensor_ops(profile):
    # the planners' operations made from the per-profile table (planners/_tables.py), shared slices and
    # all, equal those made one by one; a profile's table is made once while it is kept
    from gradsched.plan import whole_tensor_ops
    from gradsched.planners._tables import tensor_table, whole_ops

    groups = [[t] for t in profile.order] + [list(profile.order)]
    assert whole_ops(groups, profile) == whole_tensor_ops(groups, profile)
    assert tensor_table(profile) is tensor_table(profile)
    assert tensor_table(profile).element_bytes == [t.element_bytes for t in profile.tensors]


def test_a_merged_plan_slower_than_beat_s_is_priced_but_not_made(monkeypatch):
    # auto passes its best so far: a usbyte candidate that cannot win is not built, its iteration is
    # still the simulated one; at or above it the plan is made as without beat_s
    case = random_case(619334, 1000)  # hundreds of blocks: every rule's plan priced
    profile, cluster = case.profile(), case.cluster()
    plan_, simulated_s = usbyte.plan_and_simulated(profile, cluster, merge_bytes=MiB)
    assert plan_ is not None and simulated_s == simulate(plan_, profile, cluster, timeline=False).iteration_s
    built = []
    build = usbyte._build
    monkeypatch.setattr(usbyte, "_build", lambda *a: built.append(1) or build(*a))
    assert usbyte.plan_and_simulated(profile, cluster, simulated_s * 0.999, merge_bytes=MiB) == (None, simulated_s)
    assert built == []
    assert usbyte.plan_and_simulated(profile, cluster, simulated_s, merge_bytes=MiB) == (plan_, simulated_s)
