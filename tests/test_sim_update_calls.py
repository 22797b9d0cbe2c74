"""The simulator charges an overlapping plan's deferred updates: ``op_host.update_call_s`` per update call in the
next forward, one per layer whose operations were not complete at an earlier call (issue 35).

The case of tests/test_sim_timelines.py: tensors t0, t1, t2 (forward order), each its own layer with forward
0.1 s; gradients ready at t2: 0.1, t1: 0.3, t0: 0.6; all-reduce alpha 0.1 s, beta 1 ms/byte: T(400) = 0.5,
T(800) = 0.9.  One operation per tensor, overlapping the next forward; a call costs 0.05 s."""

from __future__ import annotations

import dataclasses

import pytest

from gradsched import Cluster, Profile, TensorProfile
from gradsched.plan import Plan, whole_tensor_ops
from gradsched.planners import make_plan
from gradsched.profile import OpHost
from gradsched.sim import simulate
from gradsched.synthetic import random_case

CALL_S = 0.05


def _case(call_s: float, priorities: bool, overlap: bool = True):
    profile = Profile("three", (TensorProfile("t0", 100, 400, 0.1, 0.3),
                                TensorProfile("t1", 100, 400, 0.1, 0.2),
                                TensorProfile("t2", 200, 800, 0.1, 0.1))).with_op_host(0.0, 0.0, call_s)
    ops = whole_tensor_ops([[2], [1], [0]], profile)
    if priorities:  # the first layer's tensor first among the ready (usbyte's rule)
        ops = tuple(dataclasses.replace(op, priority=min(op.tensors())) for op in ops)
    plan = Plan("byhand", ops, profile.fingerprint, scheduling="priority" if priorities else "fifo",
                overlap_forward=overlap)
    return simulate(plan, profile, Cluster.alpha_beta(0.1, 1e-3, 2))


def _calls(r) -> list[tuple[str, float, float]]:
    return [(e.name, round(e.start_s, 9), round(e.end_s, 9)) for e in r.timeline.events if e.name.startswith("update call")]


def test_operations_done_in_issue_order_cost_one_call():
    # all-reduces t2 0.1-1.0, t1 1.0-1.5, t0 1.5-2.0: t0's layer waits for the last, every one is done, one call
    # 2.0-2.05, then the forward 2.05-2.35; the later layers' updates went with it
    r = _case(CALL_S, priorities=False)
    assert r.iteration_s == pytest.approx(2.35)
    assert _calls(r) == [("update call t0", 2.0, 2.05)]
    assert _case(0.0, priorities=False).iteration_s == pytest.approx(2.3)


def test_operations_done_after_the_first_call_cost_one_call_each():
    # priorities: t2 0.1-1.0, then t0 (first layer) 1.0-1.5, t1 1.5-2.0.  t0's layer: wait to 1.5, a call
    # 1.5-1.55 (t1 not done), forward 1.55-1.65; t1's: wait to 2.0, a call 2.0-2.05, forward 2.05-2.15;
    # t2's: done and updated with t0's call, forward 2.15-2.25
    r = _case(CALL_S, priorities=True)
    assert r.op_end_s == pytest.approx([1.0, 2.0, 1.5])
    assert _calls(r) == [("update call t0", 1.5, 1.55), ("update call t1", 2.0, 2.05)]
    assert r.iteration_s == pytest.approx(2.25)
    assert _case(0.0, priorities=True).iteration_s == pytest.approx(2.2)


def test_a_plan_that_does_not_overlap_pays_no_call():
    assert _case(CALL_S, priorities=False, overlap=False).iteration_s == \
        pytest.approx(_case(0.0, priorities=False, overlap=False).iteration_s)


def test_the_field_is_optional_and_written_only_when_set():
    p = Profile("toy", (TensorProfile("t", 1, 4, 0.1, 0.1),))
    assert p.op_update_call_s() == 0.0 and p.with_op_host(1e-4, 2e-5).to_dict()["op_host"] == \
        {"issue_s": 1e-4, "retire_s": 2e-5}
    q = Profile.from_dict(p.with_op_host(1e-4, 2e-5, 3e-4).to_dict())
    assert q.op_host == OpHost(1e-4, 2e-5, 3e-4) and q.op_update_call_s() == 3e-4
    with pytest.raises(Exception, match="update_call_s"):
        OpHost(update_call_s=-1.0)


@pytest.mark.parametrize("strategy", ["usbyte", "dear"])
def test_the_compiled_pass_and_the_planners_pricers_charge_the_same(strategy):
    """A case large enough for the compiled pass (and the planners' pricers, which run it): the calls change
    the overlapping plan's time there as in the Python pass."""
    case = random_case(619334, 150)
    profile, cluster = case.profile(), case.cluster()
    slow = profile.with_op_host(0.0, 0.0, 2e-3)
    plan = make_plan(strategy, profile, cluster)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADSCHED_JIT", "0")
        python = simulate(plan, slow, cluster).iteration_s
    compiled = simulate(plan, slow, cluster).iteration_s
    assert compiled == pytest.approx(python, rel=1e-12)
    assert compiled > simulate(plan, profile, cluster).iteration_s + 2e-3 - 1e-12


def test_auto_leaves_an_overlapping_plan_whose_update_calls_cost_more_than_its_overlap_gains():
    """The rule: where the deferred updates' host time outweighs the overlap, auto picks a plan without it."""
    case = random_case(619334, 150)
    profile, cluster = case.profile(), case.cluster()
    cheap = make_plan("auto", profile, cluster)
    assert cheap.overlap_forward  # usbyte, without the calls charged
    dear = profile.with_op_host(0.0, 0.0, 1.0)  # a second per call: no overlap can pay for it
    costly = make_plan("auto", dear, cluster)
    assert not costly.overlap_forward
    assert simulate(costly, dear, cluster).iteration_s <= simulate(cheap, dear, cluster).iteration_s


def test_the_bench_charges_the_measured_update_call_to_gradscheds_runtime_even_where_host_work_is_hidden():
    from gradsched.calibration import with_runtime_costs

    p = Profile("toy", (TensorProfile("w", 10, 40, 0.001, 0.002),))
    probe = {"allreduce_bytes": 40, "bucket_copy_s": 0.0, "bucket_scale_s": 0.0, "update_call_s": 4e-4,
             "op_host": {"issue_s": 1e-4, "retire_s": 2e-5}}
    assert with_runtime_costs(p, probe, torch_ddp=False).op_host == OpHost(1e-4, 2e-5, 4e-4)
    assert with_runtime_costs(p, {**probe, "host_work_hidden": True}, torch_ddp=False).op_host == \
        OpHost(update_call_s=4e-4)  # a replay: issue and retire hidden by its clock, the updates not
    assert with_runtime_costs(p, probe, torch_ddp=True).op_update_call_s() == 0.0
    old = {k: v for k, v in probe.items() if k != "update_call_s"}  # a probe from before the field
    assert with_runtime_costs(p, {**old, "host_work_hidden": True}, torch_ddp=False).op_host is None
