from gradsched import Cluster, Profile, TensorProfile
from gradsched.planners import make_plan


def test_wfbp_plan_covers_profile():
    p = Profile("m", (TensorProfile("a", 10, 40, 0.1, 0.2), TensorProfile("b", 5, 20, 0, 0)))
    plan = make_plan("wfbp", p, Cluster.alpha_beta(1e-3, 1e-9, 4))
    plan.check(p)
    assert [op.tensors() for op in plan.operations] == [(1,), (0,)]
