"""US-Byte's compiled search (numba, the optional extra ``gradsched[fast]``) gives exactly the Python
search's plans; without numba, or with ``GRADSCHED_JIT=0``, the Python search runs (the fallback)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.planners import _usbyte_jit, make_plan
from gradsched.planners import usbyte
from gradsched.planners.usbyte import RULES, _Model, merged_layers, search_priorities
from gradsched.synthetic import random_case
from strategies import clusters, profiles, two_level_clusters

needs_numba = pytest.mark.skipif(not _usbyte_jit.enabled(), reason="numba not installed (gradsched[fast])")


def both_searches(model_args, extend, window, patience, max_evaluations=None):
    """(Python search, compiled search) of the same model, each on a fresh model."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_usbyte_jit, "MIN_UNITS", 1)  # small cases too
        mp.setenv("GRADSCHED_JIT", "0")
        python = search_priorities(_Model(*model_args), max_evaluations, extend, window, patience)
        mp.setenv("GRADSCHED_JIT", "1")
        found = usbyte._compiled_search(_Model(*model_args), max_evaluations, extend, window, patience)
    return python, None if found is None else (found.rank.tolist(), found.schedule(), found.evaluations)


def assert_same(python, compiled):
    assert compiled is not None
    (rank_p, sched_p, evals_p), (rank_c, sched_c, evals_c) = python, compiled
    assert rank_c == rank_p and evals_c == evals_p
    assert sched_c.blocks == sched_p.blocks and sched_c.decide_s == sched_p.decide_s
    assert sched_c.iteration_s == sched_p.iteration_s


@needs_numba
@pytest.mark.parametrize("seed", [3, 11, 25, 100001])
def test_compiled_search_equals_python_on_random_cases(seed):
    case = random_case(seed, 300 if seed > 100 else None)
    profile, cluster = case.profile(), case.cluster()
    for merge_bytes in (0, 1 << 20):
        args = (profile, cluster.cost("allreduce"), usbyte.DEFAULT_UNIT_BYTES, None,
                merged_layers(profile, merge_bytes))
        for window, extend in RULES:
            for patience, cap in ((24, None), (0, None), (0, 5)):
                assert_same(*both_searches(args, extend, window, patience, cap))


@needs_numba
@settings(max_examples=40, deadline=None)
@given(profiles(max_layers=12, mixed_dtypes=True, with_update=True), clusters(tables=False),
       st.sampled_from(RULES), st.sampled_from([0, 2]), st.sampled_from([64 << 10, 1 << 20]))
def test_compiled_search_equals_python_on_any_profile(profile, cluster, rule, patience,
                                                      unit_bytes):
    # hypothesis' profiles: ready times that tie (layers without backward time), mixed
    # element sizes, layers of one or two tensors, zero start-ups
    args = (profile, cluster.cost("allreduce"), unit_bytes)
    assert_same(*both_searches(args, rule[1], rule[0], patience))


@needs_numba
@settings(max_examples=25, deadline=None)
@given(profiles(max_layers=10), two_level_clusters(), st.sampled_from(RULES))
def test_compiled_search_equals_python_with_hierarchical_blocks(profile, cluster, rule):
    # each block the cheaper of the plain and the hierarchical all-reduce (two cost lines)
    exact = (cluster.cost("allreduce"), cluster.cost("hier-allreduce"))
    if any(c.points is not None for c in exact):
        return  # a measured table: the Python search (the kernel declines it, tested below)
    args = (profile, cluster.cost("allreduce"), 1 << 20, exact)
    assert_same(*both_searches(args, rule[1], rule[0], 24))


def test_python_search_without_numba(monkeypatch):
    # the fallback: numba missing (CI's install) or switched off, and a measured table
    case = random_case(7, 200)
    profile, cluster = case.profile(), case.cluster()
    model = _Model(profile, cluster.cost("allreduce"), usbyte.DEFAULT_UNIT_BYTES)
    monkeypatch.setenv("GRADSCHED_JIT", "0")
    assert not _usbyte_jit.enabled() and usbyte._compiled_search(model, None, False, "block", 24) is None
    monkeypatch.setenv("GRADSCHED_JIT", "1")
    monkeypatch.setattr(_usbyte_jit.importlib.util, "find_spec", lambda name: None)
    assert not _usbyte_jit.enabled() and usbyte._compiled_search(model, None, False, "block", 24) is None
    plan = make_plan("usbyte", profile, cluster)
    plan.check(profile)
    monkeypatch.undo()
    model.lines = None  # as for a measured cost table
    assert usbyte._compiled_search(model, None, False, "block", 24) is None


@needs_numba
def test_usbyte_plans_the_same_with_and_without_numba(monkeypatch):
    case = random_case(100003, 1000)
    profile, cluster = case.profile(), case.cluster()
    monkeypatch.setenv("GRADSCHED_JIT", "0")
    python = make_plan("usbyte", profile, cluster)
    monkeypatch.setenv("GRADSCHED_JIT", "1")
    assert make_plan("usbyte", profile, cluster) == python


def test_python_search_where_numba_fails_to_load(monkeypatch, caplog):
    # numba installed but broken (e.g. built for another numpy): one warning, the Python search
    import builtins

    real_import = builtins.__import__

    def no_numba(name, *args, **kwargs):
        if name == "numba":
            raise ImportError("numba built for another numpy")
        return real_import(name, *args, **kwargs)

    case = random_case(7, 200)
    profile, cluster = case.profile(), case.cluster()
    monkeypatch.setenv("GRADSCHED_JIT", "0")
    python = make_plan("usbyte", profile, cluster)
    monkeypatch.setenv("GRADSCHED_JIT", "1")
    monkeypatch.setattr(_usbyte_jit, "_kernel", None)
    monkeypatch.setattr(_usbyte_jit, "_failed", [])
    monkeypatch.setattr(_usbyte_jit.importlib.util, "find_spec", lambda name: object())  # "installed"
    monkeypatch.setattr(builtins, "__import__", no_numba)
    model = _Model(profile, cluster.cost("allreduce"), usbyte.DEFAULT_UNIT_BYTES)
    assert usbyte._compiled_search(model, None, False, "block", 24) is None
    assert _usbyte_jit._failed and not _usbyte_jit.enabled()
    assert "numba could not be imported" in caplog.text
    assert make_plan("usbyte", profile, cluster) == python


@needs_numba
def test_meet_test_compares_every_units_elements():
    # the compiled search tests whether a try met the best schedule by a hash of the per-unit difference
    # in elements sent, then unit by unit (_diff_zero): a hash that collides must not pass, and the
    # scratch array is left as zeros
    diff_zero = _usbyte_jit.kernel("_diff_zero")
    best = np.array([[0, 1, 2, 1], [0, 0, 0, 5], [10, 5, 7, 9]], dtype=np.int64)  # unit, first, end element
    diff = np.zeros(3, dtype=np.int64)
    # resumed at block 1: the same elements per unit as the best's blocks 1..3 (another order, block 0 kept)
    same = np.array([[0, 2, 1], [0, 0, 0], [10, 7, 9]], dtype=np.int64)
    assert diff_zero(same, best, 3, 1, 4, diff) and not diff.any()
    # block 0 extended by 2 elements of unit 0 and unit 1 one element short: the same hash (weights unit + 1)
    collide = np.array([[0, 2, 1], [0, 0, 0], [12, 7, 8]], dtype=np.int64)
    assert 2 * 1 - 1 * 2 == 0 and not diff_zero(collide, best, 3, 1, 4, diff) and not diff.any()
    assert not diff_zero(same, best, 3, 1, 3, diff) and not diff.any()  # the best's block 3 not yet passed
