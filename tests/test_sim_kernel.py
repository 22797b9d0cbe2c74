"""The simulator's compiled pass (numba, ``gradsched[fast]``) gives exactly the Python pass's times;
without numba, with ``GRADSCHED_JIT=0``, with contention or the runtime's retire time, the Python
pass runs (the reference)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.cluster import Contention
from gradsched.planners import make_plan
from gradsched.sim import _kernel, engine, simulate
from gradsched.synthetic import random_case
from strategies import clusters, profiles

needs_numba = pytest.mark.skipif(not _kernel.enabled(), reason="numba not installed (gradsched[fast])")
PLANS = [("wfbp", {}), ("sync", {}), ("mgwfbp", {}), ("bytescheduler", {"partition_bytes": 1 << 20}),
         ("bytescheduler", {"partition_bytes": 64 << 10, "credit_bytes": 1 << 30}),
         ("usbyte", {}), ("dear", {"grouping": "nearby", "nearby_layers": 1}), ("dear", {}),
         ("topk", {"density": 0.05}), ("omgs", {"density": 0.05}), ("horovod", {})]


def both(plan, profile, cluster, channels=1):
    """(Python pass, compiled pass) of the same plan, every field of the result."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_kernel, "MIN_OPERATIONS", 1)  # small plans too
        mp.setenv("GRADSCHED_JIT", "0")
        python = simulate(plan, profile, cluster, channels=channels, timeline=False)
        mp.setenv("GRADSCHED_JIT", "1")
        calls = []
        run_compiled = engine._run_compiled
        mp.setattr(engine, "_run_compiled", lambda *a: calls.append(run_compiled(*a)) or calls[-1])
        compiled = simulate(plan, profile, cluster, channels=channels, timeline=False)
    assert len(calls) == 1 and calls[0] is not None  # the kernel ran
    return dataclasses.asdict(python), dataclasses.asdict(compiled)


def test_the_kernels_simultaneity_is_the_simulators():
    assert _kernel.EPS_S == engine.EPS_S


@needs_numba
@settings(max_examples=30, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from(PLANS),
       st.sampled_from([1, 2]), st.sampled_from([0.0, 2e-6]), st.sampled_from([0.0, 3e-6]))
def test_compiled_pass_equals_python_pass(profile, cluster, strategy, channels, issue_s, op_latency_s):
    if issue_s:
        profile = profile.with_op_host(issue_s, 0.0)
    if op_latency_s:  # a latency per operation, nothing dilated: still the compiled pass
        cluster = dataclasses.replace(cluster, contention=Contention(op_latency_s=op_latency_s))
    name, opts = strategy
    plan = make_plan(name, profile, cluster, **opts)
    python, compiled = both(plan, profile, cluster, channels)
    assert compiled == python


@needs_numba
@pytest.mark.parametrize("seed", [619334, 619331])
@pytest.mark.parametrize("strategy", PLANS, ids=lambda s: f"{s[0]}{s[1]}" if isinstance(s, tuple) else str(s))
def test_compiled_pass_equals_python_pass_on_random_cases(seed, strategy):
    case = random_case(seed, 150)
    profile, cluster = case.profile(), case.cluster()
    plan = make_plan(strategy[0], profile, cluster, **strategy[1])
    python, compiled = both(plan, profile, cluster)
    assert compiled == python


def test_python_pass_runs_without_the_kernel_or_where_it_does_not_apply(monkeypatch):
    case = random_case(619334, 150)
    profile, cluster = case.profile(), case.cluster()
    plan = make_plan("bytescheduler", profile, cluster, partition_bytes=1 << 20)
    monkeypatch.setenv("GRADSCHED_JIT", "0")
    assert not _kernel.enabled()
    assert engine._run_compiled(plan, profile, engine._Static(plan, profile, cluster), 1, 0.0) is None
    monkeypatch.setenv("GRADSCHED_JIT", "1")
    retiring = profile.with_op_host(0.0, 1e-6)
    assert engine._run_compiled(plan, retiring, engine._Static(plan, retiring, cluster), 1, 0.0) is None
    monkeypatch.setattr(_kernel.importlib.util, "find_spec", lambda name: None)
    assert not _kernel.enabled()


@needs_numba
@settings(max_examples=30, deadline=None)
@given(profiles(max_layers=12, mixed_dtypes=True), clusters(tables=False), st.sampled_from([0.0, 1e-4]))
def test_optimal_groups_compiled_equals_numpy(profile, cluster, alpha_s):
    from gradsched.cluster import CollectiveCost
    from gradsched.planners import optimal

    cost = cluster.cost("allreduce") if alpha_s else CollectiveCost(0.0, cluster.cost("allreduce").beta_s_per_byte)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(optimal, "MIN_COMPILED", 1)
        mp.setenv("GRADSCHED_JIT", "0")
        numpy_groups = optimal.optimal_groups(profile, cost)
        mp.setenv("GRADSCHED_JIT", "1")
        assert optimal._compiled_dp() is not None
        compiled_groups = optimal.optimal_groups(profile, cost)
    assert compiled_groups == numpy_groups


@needs_numba
@pytest.mark.parametrize("seed", [619331, 619334, 586572])
def test_optimal_groups_compiled_equals_numpy_on_random_cases(seed, monkeypatch):
    from gradsched.planners import optimal

    case = random_case(seed, 400)
    profile, cost = case.profile(), case.cluster().cost("allreduce")
    compiled_groups = optimal.optimal_groups(profile, cost)
    monkeypatch.setenv("GRADSCHED_JIT", "0")
    assert compiled_groups == optimal.optimal_groups(profile, cost)


@settings(max_examples=30, deadline=None)
@given(profiles(max_layers=10, mixed_dtypes=True, with_update=True), clusters(), st.sampled_from(PLANS),
       st.sampled_from([0.0, 2e-6]))
def test_peak_memory_without_a_timeline_is_the_timelines(profile, cluster, strategy, issue_s):
    # without a timeline the peak is summed with numpy instead of sample by sample: the same figure
    if issue_s:
        profile = profile.with_op_host(issue_s, 0.0)
    plan = make_plan(strategy[0], profile, cluster, **strategy[1])
    with_timeline = simulate(plan, profile, cluster)
    assert simulate(plan, profile, cluster, timeline=False).peak_extra_bytes == with_timeline.peak_extra_bytes
    assert with_timeline.peak_extra_bytes == max(live for _, live in with_timeline.timeline.memory)
