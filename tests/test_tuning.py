"""Run-time auto's torch-free decisions (gradsched.tuning): when profiling starts, the configuration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradsched.calibration.budget import MAX_REST
from gradsched.errors import GradschedError
from gradsched.tuning import AutoTuneConfig, profiling_cost_s, profiling_rest


@given(share=st.floats(0.001, 0.5), elapsed_s=st.floats(0, 1000), base_s=st.floats(1e-4, 2),
       iterations=st.integers(2, 20), planning_s=st.floats(0, 5))
def test_profiling_waits_exactly_until_its_cost_fits_the_share(share, elapsed_s, base_s, iterations, planning_s):
    """After the rest, profiling's expected cost is within ``share`` of the time trained by its end; two
    iterations less (one: rounding) and it would not be."""
    cost = profiling_cost_s(base_s, iterations, planning_s)
    rest = profiling_rest(elapsed_s, base_s, share, cost, iterations)

    def fits(n: int) -> bool:
        return cost <= share * (elapsed_s + (n + iterations) * base_s) * (1 + 1e-9) + 1e-12

    assert 0 <= rest <= MAX_REST and (fits(rest) or rest == MAX_REST)
    assert rest <= 1 or not fits(rest - 2)


def test_profiling_costs_more_for_slower_iterations_and_starts_at_once_without_a_budget():
    assert profiling_cost_s(0.2, 5) > profiling_cost_s(0.1, 5) > profiling_cost_s(0.1, 5, planning_s=0)
    assert profiling_rest(0.0, 0.1, 0.0, 10.0, 5) == 0  # no budget: profile now, as without defer
    assert profiling_rest(0.0, 0.0, 0.01, 10.0, 5) == 0  # nothing measured: now
    # a longer job (more time trained) waits less: the same cost fits sooner
    assert profiling_rest(50.0, 0.1, 0.01, 1.0, 5) < profiling_rest(5.0, 0.1, 0.01, 1.0, 5)


def test_a_100_step_job_of_short_iterations_never_profiles_with_the_defaults():
    cfg = AutoTuneConfig.from_options({})
    base_s = 0.1  # 100 steps: 10 s
    rest = profiling_rest(cfg.switch_iteration * base_s, base_s, cfg.trial_share,
                          profiling_cost_s(base_s, cfg.switch_iteration), cfg.switch_iteration)
    assert cfg.deferred and cfg.switch_iteration + rest > 100


def test_the_configuration_is_torch_free_and_defer_is_checked():
    assert AutoTuneConfig.from_options({"defer": "no"}).defer is False
    with pytest.raises(GradschedError, match="defer"):
        AutoTuneConfig.from_options({"defer": 3})
