from gradsched import Cluster, Profile, TensorProfile
from gradsched.planners import make_plan


def test_wfbp_plan_covers_profile():
    p = Profile("m", (TensorProfile("a", 10, 40, 0.1, 0.2), TensorProfile("b", 5, 20, 0, 0)))
    plan = make_plan("wfbp", p, Cluster.alpha_beta(1e-3, 1e-9, 4))
    plan.check(p)
    assert [op.tensors() for op in plan.operations] == [(1,), (0,)]


def test_block_operations_equal_operations_made_one_by_one():
    import dataclasses

    from gradsched.plan import DENSE, HIER, Operation, Slice, block_operations

    blocks = [(3, 0, 10, DENSE, 2), (0, 5, 7, HIER, 0), (3, 10, 12, DENSE, 2)]
    fast = block_operations(blocks)
    slow = [Operation((Slice(t, a, b),), kind, priority=p) for t, a, b, kind, p in blocks]
    assert fast == slow and [hash(op) for op in fast] == [hash(op) for op in slow]
    assert [op.to_dict() for op in fast] == [op.to_dict() for op in slow]
    # every field set: a field added to Operation or Slice must be added to block_operations too
    assert [f.name for f in dataclasses.fields(Operation)] == list(vars(fast[0]))
    assert all(getattr(op.slices[0], f.name) is not None for op in fast for f in dataclasses.fields(Slice))
