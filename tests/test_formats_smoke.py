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


def test_new_slice_equals_a_slice_made_by_its_init():
    import dataclasses

    from gradsched.plan import Slice, new_slice

    fast, slow = new_slice(4, 3, 9), Slice(4, 3, 9)
    assert fast == slow and hash(fast) == hash(slow) and fast.numel == 6
    assert [getattr(fast, f.name) for f in dataclasses.fields(Slice)] == [4, 3, 9]  # every field set


def test_new_operation_equals_an_operation_made_by_its_init():
    import dataclasses

    from gradsched.plan import HIER, Operation, Slice, new_operation

    slices = (Slice(1, 0, 4), Slice(2, 0, 3))
    fast, slow = new_operation(slices, HIER, 5), Operation(slices, HIER, priority=5)
    assert fast == slow and hash(fast) == hash(slow) and fast.to_dict() == slow.to_dict()
    assert [f.name for f in dataclasses.fields(Operation)] == list(vars(fast))  # every field set
