"""The hier-allreduce operation kind (issue 21, item 5): two levels, equal to DDP.

4 gloo ranks as 2 nodes x 2 ranks.  Plans whose operations are all, or every other one,
``hier-allreduce`` train to PyTorch DDP's parameters; so does a plan on a data-parallel
subgroup (ranks per node then count group ranks).  Ranks that disagree on the ranks per
node (or one rank's LOCAL_WORLD_SIZE is not a number), or nodes that do not divide the
group, fail with one line on every rank, no hang.
The node layout and the order groups are made in are checked without processes.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.plan import DENSE, HIER, Plan  # noqa: E402
from gradsched.planners import make_plan  # noqa: E402
from gradsched.torch import DistributedDataParallel, build_model  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local, train  # noqa: E402
from gradsched.torch.runtime.groups import group_count  # noqa: E402
from gradsched.torch.runtime.nodes import creation_order, node_layout, ranks_per_node  # noqa: E402
from gradsched.torch.runtime.planning import default_cluster, profile_from_module  # noqa: E402

TOLERANCE = 1e-5
STEPS = 6
CPU = torch.device("cpu")


def _plan(kind: str) -> Plan:
    """wfbp's plan for the mlp with every operation (``all``) or every other one (``mixed``) two-level;
    ``mixed`` also holds a credit window (a progress thread, a private group beside the node groups)."""
    profile = profile_from_module(build_model("mlp", seed=0).module)
    plan = make_plan("wfbp", profile, default_cluster(4))
    ops = tuple(dataclasses.replace(op, collective=HIER if kind == "all" or j % 2 == 0 else DENSE)
                for j, op in enumerate(plan.operations))
    return dataclasses.replace(plan, operations=ops, credit_bytes=40_000 if kind == "mixed" else None)


def _train(plan, **wrap) -> list:
    return train("mlp", plan, "sgd", STEPS, seed=0, batch_size=8, device=CPU, use_torch_ddp=plan == "ddp",
                 options=None, timeout_s=30, wrap=wrap)


def _error(**kw) -> str:
    module = build_model("mlp", seed=0).module
    try:
        DistributedDataParallel(module, _plan("all"), timeout_s=20, **kw)
    except GradschedError as exc:
        return str(exc)
    return "no error"


def _traced(rank: int, world: int) -> dict:
    spec = build_model("mlp", seed=0)
    model = DistributedDataParallel(spec.module, _plan("all"), trace=True, ranks_per_node=2, timeout_s=30)
    x, y = spec.make_batch(8, torch.Generator().manual_seed(rank))
    spec.loss_fn(model(x), y).backward()
    model.synchronize()
    comm = [e for e in model.timeline().events if e.cat == "comm"]
    layout = model._executor.nodes.layout
    return {"collectives": sorted({e.args["collective"] for e in comm}), "ops": len(comm),
            "layout": (layout.nodes, layout.node, layout.leader, layout.is_leader)}


def _hier(rank: int, world: int) -> dict:
    out: dict = {"ddp": _train("ddp")}
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # the ranks-per-node rule's second source, as torchrun sets it
    out["all"] = _train(_plan("all"))
    del os.environ["LOCAL_WORLD_SIZE"]
    out["mixed"] = _train(_plan("mixed"), ranks_per_node=2)
    out["traced"] = _traced(rank, world)
    out["mismatch"] = _error(ranks_per_node=2 if rank < 2 else 4)
    out["indivisible"] = _error(ranks_per_node=3)
    os.environ["LOCAL_WORLD_SIZE"] = "x" if rank == 3 else "2"  # one rank's launcher is broken
    out["bad_env"] = _error()
    del os.environ["LOCAL_WORLD_SIZE"]
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # 2 data-parallel groups of one node each
    mine = groups[rank // 2]
    out["sub/ddp"] = _train("ddp", process_group=mine)
    out["sub/hier"] = _train(_plan("all"), process_group=mine, ranks_per_node=2)
    out["sub/again"] = _train("wfbp", process_group=mine)  # the start-up check still finds equal group counts
    out["groups"] = group_count()
    after = dist.new_group([0, 1, 2, 3])  # collective group creation still lines up on every rank
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=after)
    out["after"] = float(t.item())
    return out


@pytest.fixture(scope="module")
def hier():
    return spawn_local(_hier, 4, timeout_s=90)


@pytest.mark.slow
def test_hier_allreduce_on_2x2_trains_to_ddp_on_the_world_and_on_subgroups(hier):
    for r in hier:
        for key in ("all", "mixed"):
            assert rel_diff(r[key], r["ddp"]) <= TOLERANCE, key
        assert rel_diff(r["sub/hier"], r["sub/ddp"]) <= TOLERANCE
        assert rel_diff(r["sub/again"], r["sub/ddp"]) <= TOLERANCE
    for key in ("all", "mixed"):  # every rank holds the same parameters
        assert all(torch.equal(a, b) for r in hier[1:] for a, b in zip(r[key], hier[0][key]))
    # the subgroups trained apart (different shards): a mix-up between them would show
    assert rel_diff(hier[0]["sub/hier"], hier[2]["sub/hier"]) > 1e-3
    assert [r["traced"]["collectives"] for r in hier] == [[HIER]] * 4
    assert [r["traced"]["ops"] for r in hier] == [len(_plan("all").operations)] * 4
    assert [r["traced"]["layout"] for r in hier] == [(2, 0, 0, True), (2, 0, 0, False), (2, 1, 2, True),
                                                     (2, 1, 2, False)]
    # leaders and the others hold as many groups (fillers), and new groups still line up
    assert len({r["groups"] for r in hier}) == 1
    assert [r["after"] for r in hier] == [6.0] * 4


@pytest.mark.slow
def test_ranks_per_node_mismatch_and_indivisible_layout_fail_on_every_rank_in_one_line(hier):
    for rank, r in enumerate(hier):
        assert r["mismatch"].startswith("ranks disagree on ranks per node (rank 0: 2, rank 1: 2, rank 2: 4, "
                                        f"rank 3: 4; this is rank {rank})"), r["mismatch"]
        assert r["indivisible"].startswith("hier-allreduce: the group's 4 ranks do not fill nodes of 3 ranks")
        assert r["bad_env"].startswith("ranks disagree on ranks per node (rank 0: 2, rank 1: 2, rank 2: 2, "
                                       f"rank 3: invalid; this is rank {rank})"), r["bad_env"]
        assert "\n" not in r["mismatch"] + r["indivisible"] + r["bad_env"]


# --------------------------------------------------------------------------- no processes
def test_ranks_per_node_comes_from_the_argument_then_local_world_size_then_one():
    assert ranks_per_node(4, {"LOCAL_WORLD_SIZE": "8"}) == 4
    assert ranks_per_node(None, {"LOCAL_WORLD_SIZE": "8"}) == 8
    assert ranks_per_node(None, {}) == 1
    for bad in (0, -2, True, 2.0):
        with pytest.raises(GradschedError, match="ranks_per_node must be an integer >= 1"):
            ranks_per_node(bad, {})
    with pytest.raises(GradschedError, match="LOCAL_WORLD_SIZE='x' is not a positive integer"):
        ranks_per_node(None, {"LOCAL_WORLD_SIZE": "x"})


@pytest.mark.parametrize("world,m", [(8, 4), (8, 2), (6, 3), (4, 1), (4, 4), (1, 1)])
def test_every_rank_is_a_member_of_as_many_groups_and_members_agree_on_the_order(world, m):
    ranks = [10 + 2 * r for r in range(world)]  # a subgroup: its group ranks are not the global ones
    orders = [creation_order(node_layout(ranks, g, m)) for g in range(world)]
    assert all(o == orders[0] for o in orders)  # every rank lists every group, in one order
    memberships = [sum(me in members for _, members in orders[0]) for me in ranks]
    assert len(set(memberships)) == 1
    roles = [role for role, _ in orders[0]]
    assert roles.count("reduce") == roles.count("broadcast") == (world // m if m > 1 else 0)
    assert roles.count("leaders") == (1 if world // m > 1 else 0)
    layout = node_layout(ranks, 2 % world, m)
    assert layout.leaders == ranks[::m] and layout.members(layout.node)[0] == layout.leader


def test_a_group_that_nodes_do_not_divide_is_refused_in_one_line():
    with pytest.raises(GradschedError, match=r"^hier-allreduce: the group's 6 ranks do not fill nodes of 4 ranks"):
        node_layout(list(range(6)), 0, 4)
