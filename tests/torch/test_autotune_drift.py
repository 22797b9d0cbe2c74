"""Run-time auto's drift checks against a machine that slows down as a whole: a control plan tells the machine's
drift from the plan's own, and the bench holds the checks through its counted rounds.

One rank in this process, the clock injected as in ``test_autotune_torch_ddp.py``: an iteration under a plan takes
what the test says on the tracer's clock (seconds; the real iteration, milliseconds, is noise beside it), so which
check sees what, and what it decides, is fixed by the iterations, not by the machine.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gradsched.torch import DistributedDataParallel  # noqa: E402
from gradsched.torch.runtime.torch_ddp import is_torch_ddp  # noqa: E402

from tests.torch.test_autotune_torch_ddp import _net, _train, delay  # noqa: E402

# back to back trials at iterations fixed in advance, then a check every patience + 1 = 4 iterations
OPTIONS = {"switch_iteration": 3, "trials": 2, "trial_iterations": 2, "trial_rounds": 2, "trial_window_s": 0,
           "min_gain": 0, "patience": 3, "max_replans": 2, "runoff_rounds": 0, "trial_share": 0}
SLOW = 1.6  # the slowdown: what the check at runs12's ResNet-50 saw (227 ms against 175 expected: x1.3), and more
AFTER = 8  # iterations after the trials' end at which the slowdown starts ...
LASTS = 16  # ... and how long it lasts


class Machine:
    """Every plan's iteration on the injected clock: 2 s under PyTorch's DDP and the initial plan, 1 s under any
    other (so one of gradsched's plans is kept and another is there to control it); ``slow(model, plan)``:
    whether it runs ``SLOW`` times slower now."""

    def __init__(self, slow: Any) -> None:
        self.slow = slow
        self.model: Any = None

    def seconds(self, plan: Any) -> float:
        tuner = self.model.autotuner
        base = 2.0 if is_torch_ddp(plan) or plan.hash == tuner.switches[0].plan_hash else 1.0
        return base * (SLOW if self.slow(tuner, plan) else 1.0)


def _run(slow: Any, steps: int, hold_after: int | None = None) -> Any:
    """Auto trained ``steps`` iterations; ``hold_after``: its checks held that many iterations after it settled."""
    machine = Machine(slow)
    model = DistributedDataParallel(_net(), "auto", plan_options=OPTIONS, bucket_cap_mb=0.01)
    machine.model = model
    delay(model, machine.seconds)
    for _ in range(steps):
        tuner = model.autotuner
        if hold_after is not None and tuner.settled_at is not None and tuner.iteration == tuner.settled_at + hold_after:
            tuner.hold_checks()
        _train(model, 0, 1, 1)
    return model


def _slow_phase(tuner: Any) -> bool:
    settled = tuner.settled_at
    return settled is not None and settled + AFTER <= tuner.iteration < settled + AFTER + LASTS


def test_a_slowdown_every_plan_shares_is_checked_against_a_control_plan_and_does_not_re_plan(world_of_one):
    model = _run(lambda tuner, plan: _slow_phase(tuner), 80)
    tuner = model.autotuner
    kept = tuner.trial_decision["kept"]
    assert not is_torch_ddp(tuner._tried[kept][1])  # one of gradsched's plans won the trials (1 s)
    after = [s for s in tuner.switches if s.iteration > tuner.settled_at]
    # a check in the slow phase ran the control plan for a window and came back: no re-plan, no revert; and when the
    # machine sped up again, the check saw that too and the control said so (the drift is the machine's both ways)
    assert [s.reason for s in after] == ["control", "back", "control", "back"]
    assert all(s.plan_hash != kept for s in after[0::2]) and all(s.plan_hash == kept for s in after[1::2])
    assert tuner.replans == 0 and model.plan.hash == kept
    actions = [c.action for c in tuner.checks]
    assert actions.count("control") == 2 and set(actions) == {"keep", "control"}
    slow_check = next(c for c in tuner.checks if c.action == "control")
    assert slow_check.measured_s == pytest.approx(SLOW, rel=0.1)  # what the check saw: x1.6
    # after the first control, the plan is expected at the machine's pace: the checks in the slow phase keep it
    assert tuner._expected_s == pytest.approx(1.0, rel=0.1)  # back to the trials' pace after the second


def test_a_slowdown_of_the_plan_alone_re_plans_as_before(world_of_one):
    def own(tuner: Any, plan: Any) -> bool:
        return _slow_phase(tuner) and plan.hash == tuner.trial_decision["kept"]

    model = _run(own, 60)
    tuner = model.autotuner
    after = [s.reason for s in tuner.switches if s.iteration > tuner.settled_at]
    assert after[:3] == ["control", "back", "replan"] and tuner.replans >= 1  # the control did not slow: re-plan


def test_held_checks_make_no_check_and_no_switch_whatever_the_machine_does(world_of_one):
    """``gradsched bench`` holds the checks once its warm-up ends (bench_autowarmup.hold_checks): its counted
    rounds record one plan, through a slowdown too."""
    model = _run(lambda tuner, plan: _slow_phase(tuner), 60, hold_after=2)
    tuner = model.autotuner
    held_at = tuner.settled_at + 2
    assert tuner.held_from == held_at and tuner.done
    assert [s for s in tuner.switches if s.iteration >= held_at] == []
    assert [c for c in tuner.checks if c.iteration >= held_at] == []
    assert tuner.summary()["held_from"] == held_at
