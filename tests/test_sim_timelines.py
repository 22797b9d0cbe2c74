"""Hand-computed timelines of 3-4 tensor cases (as drawn in the papers' figures).

Common case: tensors t0, t1, t2 (forward order), 100, 100 and 200 fp32 elements
(400, 400, 800 bytes), each its own layer with forward 0.1 s; backward 0.3, 0.2,
0.1 s, so gradients are ready at t2: 0.1, t1: 0.3, t0: 0.6 (backward ends at 0.6).
All-reduce: alpha 0.1 s, beta 1 ms/byte: T(400) = 0.5, T(800) = 0.9,
T(1200) = 1.3, T(1600) = 1.7.  Iteration = end of the next forward (0.3 s).
"""

from __future__ import annotations

import pytest

from gradsched import Cluster, Profile, TensorProfile
from gradsched.plan import Operation, Plan, Slice, whole_tensor_ops
from gradsched.planners import make_plan
from gradsched.sim import simulate

MiB = 1 << 20


def run(name, case, **opts):
    profile, cluster = case
    plan = make_plan(name, profile, cluster, **opts)
    plan.check(profile)
    return plan, simulate(plan, profile, cluster)


def groups(plan):
    return [list(op.tensors()) for op in plan.operations]


def test_ready_times(case):
    assert case[0].ready_s == pytest.approx((0.6, 0.3, 0.1))


def test_wfbp(case):
    # t2 0.1-1.0, t1 waits for the channel 1.0-1.5, t0 1.5-2.0; forward 2.0-2.3
    plan, r = run("wfbp", case)
    assert groups(plan) == [[2], [1], [0]]
    assert r.op_start_s == pytest.approx([0.1, 1.0, 1.5])
    assert r.op_end_s == pytest.approx([1.0, 1.5, 2.0])
    assert r.iteration_s == pytest.approx(2.3)
    assert r.exposed_comm_s == pytest.approx(2.3 - 0.9)
    assert r.peak_extra_bytes == 0


def test_sync(case):
    # one all-reduce of 1600 bytes after backward: 0.6-2.3, forward 2.3-2.6
    plan, r = run("sync", case)
    assert groups(plan) == [[2, 1, 0]]
    assert r.op_start_s == pytest.approx([0.6]) and r.op_end_s == pytest.approx([2.3])
    assert r.iteration_s == pytest.approx(2.6)
    assert r.peak_extra_bytes == 1600  # flat buffer from t2's gradient until the reduce ends


def test_threshold(case):
    # buckets close at >= 1200 bytes: [t2, t1] ready 0.3: 0.3-1.6, then [t0] 1.6-2.1
    plan, r = run("threshold", case, mb=1200 / MiB)
    assert groups(plan) == [[2, 1], [0]]
    assert r.op_start_s == pytest.approx([0.3, 1.6]) and r.op_end_s == pytest.approx([1.6, 2.1])
    assert r.iteration_s == pytest.approx(2.4)
    assert r.peak_extra_bytes == 1200


def test_ddp_first_bucket_then_cap(case):
    # first bucket closes at 800 bytes ([t2]); the rest stays under the 25 MiB cap:
    # [t1, t0], 800 bytes, ready 0.6, starts when the channel frees at 1.0: 1.0-1.9
    plan, r = run("ddp", case, first_bucket_mb=800 / MiB)
    assert groups(plan) == [[2], [1, 0]]
    assert r.op_start_s == pytest.approx([0.1, 1.0]) and r.op_end_s == pytest.approx([1.0, 1.9])
    assert r.iteration_s == pytest.approx(2.2)


def test_horovod_fuses_what_is_ready_per_cycle(case):
    # cycle 0.25 s: at 0.25 only t2 is ready -> fused alone, busy until 1.15; by then t1
    # and t0 are both ready -> fused together.  Simulated: 0.1-1.0, then 1.0-1.9.
    plan, r = run("horovod", case, cycle_ms=250)
    assert groups(plan) == [[2], [1, 0]]
    assert r.iteration_s == pytest.approx(2.2)


def test_bytescheduler_priority_preempts_at_block_boundaries(case):
    # 400-byte blocks: t2 -> 2 blocks (priority 2), t1 (1), t0 (0); credit of one block.
    # 0.1-0.6 t2 block 0; at 0.6 t0 is ready and goes first (0.6-1.1), then t1 (1.1-1.6),
    # then t2 block 1 (1.6-2.1).  Forward waits per layer: t0 1.1-1.2, t1 1.6-1.7,
    # t2 2.1-2.2.
    plan, r = run("bytescheduler", case, partition_bytes=400, credit_bytes=400)
    assert [(op.slices[0].tensor, op.slices[0].start) for op in plan.operations] == [(2, 0), (2, 100), (1, 0), (0, 0)]
    assert r.op_start_s == pytest.approx([0.1, 1.6, 1.1, 0.6])
    assert r.iteration_s == pytest.approx(2.2)
    assert r.peak_extra_bytes == 0  # blocks are reduced in place


def test_credit_window_commits_early(case):
    # credit of two blocks: t2 block 1 is queued at 0.1 behind block 0 (0.6-1.1), so t0
    # waits for it (1.1-1.6) and t1 goes last (1.6-2.1).  Forward: t0 1.6-1.7, t1
    # 2.1-2.2, t2 2.2-2.3: a larger window gives up preemption.
    plan, r = run("bytescheduler", case, partition_bytes=400, credit_bytes=800)
    assert r.op_start_s == pytest.approx([0.1, 0.6, 1.6, 1.1])
    assert r.iteration_s == pytest.approx(2.3)


def test_fifo_plan_order_is_respected_even_when_a_later_op_is_ready(case):
    profile, cluster = case
    # hand-made plan: t0 first (ready at 0.6), then t2 (ready 0.1): fifo makes t2 wait
    ops = (Operation((Slice(0, 0, 100),)), Operation((Slice(2, 0, 200),)), Operation((Slice(1, 0, 100),)))
    plan = Plan("hand", ops, profile.fingerprint, profile.model)
    r = simulate(plan, profile, cluster)
    assert r.op_start_s == pytest.approx([0.6, 1.1, 2.0])
    assert r.iteration_s == pytest.approx(2.5 + 0.3)


def test_sparse_selection_delays_backward_and_uses_allgather(case):
    profile, cluster = case
    cluster = Cluster(2, {"allreduce": cluster.collectives["allreduce"]},
                      extra={"topk_selection_s_per_nlogn": 1e-3})
    # one top-k op over t2 at density 0.05: k = 10 elements -> 10 * 8 bytes per rank.
    # selection 1e-3 * 200 * log2(200) s runs right after t2's backward (0.1) and
    # pushes t1 and t0 back by that much.
    ops = (Operation((Slice(2, 0, 200),), "topk-allgather", 0, 0.05), Operation((Slice(1, 0, 100),)),
           Operation((Slice(0, 0, 100),)))
    plan = Plan("hand", ops, profile.fingerprint, profile.model)
    r = simulate(plan, profile, cluster)
    sel = cluster.selection_s(200)
    ag = cluster.cost("allgather").time_s(80)
    assert ag == pytest.approx(0.05 + 1e-3 * 2 / 2 * 80)  # derived from the all-reduce line at P=2
    assert r.op_start_s[0] == pytest.approx(0.1 + sel)
    assert r.backward_end_s == pytest.approx(0.6 + sel)
    assert r.op_end_s[0] == pytest.approx(0.1 + sel + ag)
    assert r.compute_s == pytest.approx(0.9 + sel)


def contention_case(compute_slowdown, comm_slowdown, busy_latency_s=0.0, other_s=0.0, op_latency_s=0.0):
    # t1 (layer 1): backward 1 s, ready at 1; t0 (layer 0): backward 1 s; each all-reduce 1 s
    profile = Profile("two", (TensorProfile("t0", 1, 4, 0.0, 1.0), TensorProfile("t1", 1, 4, 0.0, 1.0)),
                      other_s=other_s)
    cluster = Cluster(2, {"allreduce": Cluster.alpha_beta(1.0, 0.0, 2).collectives["allreduce"]},
                      extra={"contention": {"compute_slowdown": compute_slowdown, "comm_slowdown": comm_slowdown,
                                            "busy_latency_s": busy_latency_s, "op_latency_s": op_latency_s}})
    return simulate(make_plan("wfbp", profile, cluster), profile, cluster)


def test_op_latency_is_paid_by_every_operation_and_not_stretched():
    # t1's all-reduce starts at 1 during t0's backward: half speed (comm slowdown 1) until 2,
    # then the other half 2-2.5, plus 0.2 waited: ends 2.7; t0's, with the cores idle: 2.7-3.9.
    r = contention_case(0.0, 1.0, op_latency_s=0.2)
    assert r.op_start_s == pytest.approx([1.0, 2.7]) and r.op_end_s == pytest.approx([2.7, 3.9])
    assert r.iteration_s == pytest.approx(3.9)
    # alone, without any slowdown, it is just 0.2 more per operation
    r = contention_case(0.0, 0.0, op_latency_s=0.2)
    assert r.op_end_s == pytest.approx([2.2, 3.4]) and r.iteration_s == pytest.approx(3.4)


def test_busy_latency_is_paid_by_operations_that_start_during_compute():
    # t1's all-reduce starts at 1 while t0's backward runs (1-2): 1 s + 0.25 s, ends 2.25;
    # t0's starts at 2.25 with the compute stream idle: 1 s, ends 3.25.
    r = contention_case(0.0, 0.0, busy_latency_s=0.25)
    assert r.op_start_s == pytest.approx([1.0, 2.25]) and r.op_end_s == pytest.approx([2.25, 3.25])
    assert r.iteration_s == pytest.approx(3.25)


def test_the_optimizer_step_and_other_work_wait_for_the_last_operation():
    # wfbp does not overlap the next forward: other_s (0.5) starts when t0's all-reduce
    # ends at 3, not when backward ends at 2 (it would then hide under communication).
    r = contention_case(0.0, 0.0, other_s=0.5)
    assert r.op_end_s == pytest.approx([2.0, 3.0])
    assert r.iteration_s == pytest.approx(3.5)
    assert r.compute_s == pytest.approx(2.5)


def test_contention_slows_compute_while_communication_runs():
    # compute at half speed while an all-reduce is in flight: t1's all-reduce runs 1-2,
    # so t0's backward does half its work in 1-2 and the rest in 2-2.5; t0's all-reduce
    # then runs 2.5-3.5 (nothing left to slow down).
    r = contention_case(1.0, 0.0)
    assert r.backward_end_s == pytest.approx(2.5)
    assert r.op_start_s == pytest.approx([1.0, 2.5]) and r.op_end_s == pytest.approx([2.0, 3.5])
    assert r.iteration_s == pytest.approx(3.5)


def test_contention_slows_communication_while_compute_runs():
    # an all-reduce at half speed while backward runs: t1's all-reduce does half its
    # work in 1-2 (t0's backward) and the rest in 2-2.5; t0's follows, 2.5-3.5.
    r = contention_case(0.0, 1.0)
    assert r.backward_end_s == pytest.approx(2.0)
    assert r.op_start_s == pytest.approx([1.0, 2.5]) and r.op_end_s == pytest.approx([2.5, 3.5])
    assert r.iteration_s == pytest.approx(3.5)


def test_no_contention_is_the_plain_timeline():
    r = contention_case(0.0, 0.0)
    assert r.op_end_s == pytest.approx([2.0, 3.0]) and r.iteration_s == pytest.approx(3.0)


def host_case(issue_s, retire_s, compute_slowdown=0.0, overlap_forward=False):
    # as contention_case, plus 0.2 s of forward per layer; one operation per tensor, t1's first
    profile = Profile("two", (TensorProfile("t0", 1, 4, 0.2, 1.0), TensorProfile("t1", 1, 4, 0.2, 1.0)))
    profile = profile.with_op_host(issue_s, retire_s)
    cluster = Cluster(2, {"allreduce": Cluster.alpha_beta(1.0, 0.0, 2).collectives["allreduce"]},
                      extra={"contention": {"compute_slowdown": compute_slowdown, "comm_slowdown": 0.0}})
    plan = Plan("byhand", whole_tensor_ops([[1], [0]], profile), profile.fingerprint, overlap_forward=overlap_forward)
    return simulate(plan, profile, cluster)


def test_host_time_per_operation_delays_backward_and_the_wait():
    # t1's backward 0-1, its issue 1-1.1, its all-reduce 1.1-2.1; t0's backward 1.1-2.1, its
    # issue 2.1-2.2, its all-reduce 2.2-3.2.  Retiring, in issue order: t1's 2.2-2.25 (done
    # long ago), t0's once done, 3.2-3.25; then the forward, 3.25-3.65.
    r = host_case(0.1, 0.05)
    assert r.op_start_s == pytest.approx([1.1, 2.2]) and r.op_end_s == pytest.approx([2.1, 3.2])
    assert r.backward_end_s == pytest.approx(2.2)
    assert r.iteration_s == pytest.approx(3.65)
    assert r.compute_s == pytest.approx(2.4 + 2 * 0.15)  # host time is compute-stream work
    host = [(e.name, e.start_s, e.end_s) for e in r.timeline.events if e.cat == "host"]
    assert host == [("issue op0", pytest.approx(1.0), pytest.approx(1.1)),
                    ("issue op1", pytest.approx(2.1), pytest.approx(2.2)),
                    ("retire op0", pytest.approx(2.2), pytest.approx(2.25)),
                    ("retire op1", pytest.approx(3.2), pytest.approx(3.25))]
    # without it, the plain timeline: all-reduces 1-2 and 2-3, forward 3-3.4
    assert host_case(0.0, 0.0).iteration_s == pytest.approx(3.4)


def test_host_time_is_stretched_like_compute():
    # compute at half speed while an all-reduce runs: t1's all-reduce 1.1-2.1 halves t0's
    # backward there (0.5 done), the rest 2.1-2.6; issue 2.6-2.7, all-reduce 2.7-3.7;
    # retiring t1's during it: 0.05 of work at half speed, 2.7-2.8; t0's 3.7-3.75; forward 3.75-4.15
    r = host_case(0.1, 0.05, compute_slowdown=1.0)
    assert r.op_start_s == pytest.approx([1.1, 2.7])
    assert r.iteration_s == pytest.approx(4.15)


def test_host_time_with_the_next_forward_overlapped():
    # each forward layer first retires, oldest first, every operation issued up to the last one
    # holding its tensors (the runtime retires in issue order): t0's forward needs op1, so op0
    # (done at 2.1) is retired 2.2-2.25, op1 once done 3.2-3.25; forwards 3.25-3.45 and 3.45-3.65.
    r = host_case(0.1, 0.05, overlap_forward=True)
    assert r.iteration_s == pytest.approx(3.65)
    retire = [(e.name, e.start_s) for e in r.timeline.events if e.name.startswith("retire")]
    assert retire == [("retire op0", pytest.approx(2.2)), ("retire op1", pytest.approx(3.2))]


def test_auto_picks_the_fastest_candidate(case):
    # By hand, over the merges of the common case: {t2}{t1}{t0} 2.3, {t2,t1}{t0} 2.4,
    # {t2}{t1,t0} 2.2 (t2 0.1-1.0, then t1+t0, 800 bytes, 1.0-1.9, forward 1.9-2.2),
    # everything 2.6; ByteScheduler with whole-tensor blocks 2.3.  auto must find 2.2 among the
    # all-reduce plans (dear's decoupled plan, 2.05, is test_two_phase.py's).
    plan, r = run("auto", case, exclude=("dear",))
    assert r.iteration_s == pytest.approx(2.2)
    assert groups(plan) == [[2], [1, 0]]
    assert plan.strategy == "auto" and plan.options["predicted_iteration_s"] == pytest.approx(2.2)
