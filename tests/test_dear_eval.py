"""``dear`` prices its candidate groupings with the simulator's compiled pass, without making their plans
(planners/_dear_eval.py): the iteration ``simulate`` predicts for each plan, bit for bit, and the same
choice as simulating every candidate (the Python path, ``GRADSCHED_JIT=0``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.planners import make_plan
from gradsched.planners import _dear_eval
from gradsched.planners._dear_eval import TwoPhasePricer
from gradsched.planners.dear import candidate_groupings, prioritized, ready_parts, two_phase_ops
from gradsched.plan import Plan
from gradsched.sim import _kernel, simulate
from gradsched.synthetic import random_case
from strategies import clusters, profiles

needs_numba = pytest.mark.skipif(not _kernel.enabled(), reason="numba not installed (gradsched[fast])")


@pytest.fixture(autouse=True)
def small_profiles_too(monkeypatch):
    monkeypatch.setattr(_dear_eval, "MIN_TENSORS", 1)


def assert_priced_as_simulated(profile, cluster):
    pricer = TwoPhasePricer(profile, cluster)
    assert pricer.run is not None
    for _, groups in candidate_groupings(profile, cluster):
        fifo = two_phase_ops(groups, profile)
        for scheduling, ops in (("fifo", fifo), ("priority", prioritized(fifo))):
            plan = Plan("dear", ops, profile.fingerprint, profile.model, scheduling=scheduling, overlap_forward=True)
            expected = simulate(plan, profile, cluster, timeline=True).iteration_s  # the Python pass
            assert pricer.iteration_s(ready_parts(groups, profile), scheduling == "priority") == expected


@needs_numba
@settings(max_examples=30, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from([0.0, 3e-6]))
def test_pricer_gives_the_simulated_iteration(profile, cluster, issue_s):
    if issue_s:
        profile = profile.with_op_host(issue_s, 0.0)
    assert_priced_as_simulated(profile, cluster)


@needs_numba
@pytest.mark.parametrize("seed", [619331, 619334, 586572])
def test_pricer_gives_the_simulated_iteration_on_random_cases(seed):
    case = random_case(seed, 200)
    assert_priced_as_simulated(case.profile(), case.cluster())


@needs_numba
@settings(max_examples=15, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters())
def test_dear_chooses_as_when_it_simulates_every_candidate(profile, cluster):
    priced = make_plan("dear", profile, cluster)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADSCHED_JIT", "0")
        assert TwoPhasePricer(profile, cluster).run is None
        simulated = make_plan("dear", profile, cluster)
    assert priced == simulated
    assert priced.options["predicted_iteration_s"] == simulate(priced, profile, cluster).iteration_s
