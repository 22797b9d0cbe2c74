"""Top-k's ``k`` has one definition (gradsched.sparsity.k_of), and the planners and the simulator read it."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched import Cluster, CollectiveCost, Profile, TensorProfile
from gradsched.planners import make_plan
from gradsched.planners.omgs import sweep
from gradsched.sim.engine import _Static
from gradsched.sparsity import INDEX_BYTES, k_of, sent_bytes

SETTINGS = settings(max_examples=200, deadline=None)
DENSITIES = st.one_of(st.sampled_from([0.001, 0.01, 0.1, 0.3, 1 / 3, 0.5, 1.0]),
                      st.floats(min_value=1e-6, max_value=1.0, exclude_min=False))
NUMELS = st.integers(min_value=1, max_value=10**8)
CLUSTER = Cluster(2, {"allreduce": CollectiveCost(1e-3, 1e-9), "allgather": CollectiveCost(1e-3, 1e-6)},
                  extra={"topk_selection_s_per_nlogn": 1e-7})


@SETTINGS
@given(DENSITIES, NUMELS)
def test_k_rounds_the_exact_product_up_between_one_and_numel(density, numel):
    exact = Fraction(density) * numel  # the float density's exact product, no rounding on the way
    k = k_of(density, numel)
    assert 1 <= k <= numel
    want = min(numel, max(1, math.ceil(exact)))
    # the one rule: ceil; a product within 1e-12 (relative) above an integer is that integer
    assert k == want or (k == want - 1 and exact - k <= Fraction(1, 10**12) * max(1, exact))


@SETTINGS
@given(DENSITIES, DENSITIES, NUMELS)
def test_k_grows_with_the_density(a, b, numel):
    lo, hi = sorted((a, b))
    assert k_of(lo, numel) <= k_of(hi, numel)


def test_k_of_products_that_are_whole_numbers_in_decimal():
    # 0.07 * 100 is 7.000000000000001 in floating point: still k = 7, not 8
    assert 0.07 * 100 > 7 and k_of(0.07, 100) == 7
    assert k_of(0.001, 10) == 1 and k_of(1.0, 10) == 10 and k_of(0.5, 3) == 2 and k_of(0.01, 1050) == 11


@settings(max_examples=40, deadline=None)
@given(DENSITIES, st.integers(min_value=1, max_value=10**6), st.sampled_from([2, 4]))
def test_simulator_and_omgs_send_the_k_of_k_of(density, numel, element_bytes):
    """A one-layer model: the simulator's and OMGS's all-gather carry ``sent_bytes`` per rank."""
    profile = Profile("one", (TensorProfile("w", numel, element_bytes * numel, 0.0, 1e-3),))
    plan = make_plan("topk", profile, CLUSTER, density=density)
    per_rank = k_of(density, numel) * (element_bytes + INDEX_BYTES)
    assert sent_bytes(density, numel, element_bytes) == per_rank
    gather_s = CLUSTER.cost("allgather").time_s(per_rank)
    assert _Static(plan, profile, CLUSTER).cost == [gather_s]
    _, ends_s = sweep(profile, CLUSTER, density)
    assert math.isclose(ends_s[0], 1e-3 + CLUSTER.selection_s(numel) + gather_s, rel_tol=1e-12)
