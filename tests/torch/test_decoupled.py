"""Decoupled all-reduce at run time (issue 36, item 3): dear's plans train to PyTorch DDP's parameters.

gloo, 2 ranks (SGD with momentum and AdamW, with and without a DistributedOptimizer) and 3
ranks (pieces padded to a multiple of the world size).  The reduce-scatter runs as an
all-to-all and a local sum, the all-gather on a group of its own
(gradsched.torch.runtime.decoupled).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

torch = pytest.importorskip("torch")

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.plan import ALL_GATHER, REDUCE_SCATTER  # noqa: E402
from gradsched.planners import make_plan  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402
from gradsched.torch.runtime.decoupled import DecoupledAllReduce, executable  # noqa: E402
from gradsched.torch.runtime.planning import default_cluster, profile_from_module  # noqa: E402
from helpers import params_of, train  # noqa: E402

TOLERANCE = 1e-5
STEPS = 8


def _plan(world: int, **options):
    profile = profile_from_module(build_model("mlp", seed=0).module)
    return make_plan("dear", profile, default_cluster(world), **options)


def _train(strategy, optimizer: str, *, distributed_optimizer: bool = True) -> dict:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = build_model("mlp", seed=0)
    ddp = strategy == "ddp"
    model = DistributedDataParallel(spec.module, strategy, use_torch_ddp=ddp, timeout_s=30, trace=not ddp)
    params = list(model.parameters())
    inner = (torch.optim.SGD(params, lr=0.05, momentum=0.9) if optimizer == "sgd"
             else torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01))
    opt = DistributedOptimizer(inner, model) if distributed_optimizer and not ddp else inner
    train(model, opt, spec.make_batch, spec.loss_fn, rank=rank, world=world, steps=STEPS)
    model.synchronize()
    out: dict = {"params": params_of(spec.module)}
    if not ddp:
        out["runners"] = sorted({type(r).__name__ for r in model._executor.runners})
        out["collectives"] = sorted({e.args["collective"] for e in model.timeline().events if e.cat == "comm"})
    return out


def _job(rank: int, world: int) -> dict:
    out = {}
    for optimizer in ("sgd", "adamw"):
        ref = _train("ddp", optimizer)["params"]
        for label, plan in (("planned", _plan(world)), ("per-layer", _plan(world, grouping="nearby",
                                                                             nearby_layers=1))):
            got = _train(plan, optimizer)
            out[f"{label}/{optimizer}"] = {"diff": rel_diff(got["params"], ref), "runners": got["runners"],
                                           "collectives": got["collectives"], "flat": torch.cat(
                                               [p.reshape(-1) for p in got["params"]])}
        plain = _train(_plan(world, grouping="nearby", nearby_layers=1), optimizer, distributed_optimizer=False)
        out[f"plain/{optimizer}"] = {"diff": rel_diff(plain["params"], ref), "runners": plain["runners"],
                                     "collectives": plain["collectives"],
                                     "flat": torch.cat([p.reshape(-1) for p in plain["params"]])}
    return out


def _check(results: list[dict], optimizers: tuple[str, ...]) -> None:
    first = results[0]
    for label, r in first.items():
        if label.split("/")[1] not in optimizers:
            continue
        assert r["diff"] <= TOLERANCE, (label, r["diff"])
        assert r["runners"] == ["DecoupledAllReduce"], label
        assert r["collectives"] == [REDUCE_SCATTER], label
        assert all(torch.equal(r["flat"], other[label]["flat"]) for other in results[1:]), label


@pytest.mark.slow
def test_two_ranks_sgd_and_adamw_match_ddp():
    _check(spawn_local(_job, 2, timeout_s=120), ("sgd", "adamw"))


def _padded(rank: int, world: int) -> dict:
    from gradsched.torch.runtime import decoupled

    decoupled.CHUNK_BYTES = 256  # gloo's phases in pieces of 64 floats a rank: several a group, the last padded
    plan = _plan(world, grouping="nearby", nearby_layers=1)
    sizes = [sum(s.numel for s in op.slices) for op in plan.operations if op.collective == REDUCE_SCATTER]
    ref = _train("ddp", "sgd")["params"]
    got = _train(plan, "sgd")
    return {"indivisible": [n for n in sizes if n % world], "diff": rel_diff(got["params"], ref),
            "runners": got["runners"], "collectives": got["collectives"],
            "flat": torch.cat([p.reshape(-1) for p in got["params"]])}


def _phases(rank: int, world: int) -> dict:
    import os

    from gradsched.torch.runtime import decoupled

    os.environ["GRADSCHED_RING_MIN_BYTES"] = str(1 << 62)  # the all-to-alls, whatever the size (no ring)
    decoupled.CHUNK_BYTES = 128  # 16 doubles a rank a piece
    decoupled.PHASE_THREADS = 3  # not gloo's default two (side_group's gloo options were dropped: dear13)
    gen = torch.Generator().manual_seed(rank)
    full = torch.randn(world * 50, generator=gen, dtype=torch.float64)  # 50 a rank: pieces of 16, 16, 16, 2
    mine = full.clone()
    shard, scratch = torch.empty(50, dtype=torch.float64), decoupled.scratch_for(full, world, False)
    scattered = decoupled.start_reduce_scatter(shard, full, scratch, None, rank)
    for w in scattered:
        w.wait()
    decoupled.sum_pieces(shard, full, scratch, rank)
    gathered = decoupled.start_all_gather(full, shard, scratch, None, rank)
    for w in gathered:
        w.wait()
    world_group = torch.distributed.group.WORLD
    threads = [g._get_backend(torch.device("cpu")).options._threads
               for g in (decoupled.scatter_group(world_group), decoupled.gather_group(world_group))]
    return {"mine": mine, "shard": shard.clone(), "full": full, "works": (len(scattered), len(gathered)),
            "threads": threads}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])  # two ranks: no scratch buffer (each sends the other its part alone)
def test_gloos_two_phases_go_in_pieces_and_together_make_the_all_reduce(world):
    results = spawn_local(_phases, world, timeout_s=60)
    total = sum(r["mine"] for r in results)
    step = 16 * world  # 16 doubles a rank a piece, then the rest
    pieces = [(a, min(a + step, 50 * world)) for a in range(0, 50 * world, step)]
    for rank, r in enumerate(results):
        assert r["works"] == (4, 4)  # one all-to-all each way a piece
        assert r["threads"] == [3, 3]  # the phase groups run the gloo threads asked for
        assert torch.allclose(r["full"], total, rtol=0, atol=1e-12)  # every rank: the sum of every rank's
        mine = torch.cat([total[a:b].view(world, -1)[rank] for a, b in pieces])  # its part of each piece
        assert torch.allclose(r["shard"], mine, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_three_ranks_pad_pieces_and_match_ddp():
    results = spawn_local(_padded, 3, timeout_s=120)
    assert results[0]["indivisible"], "no piece needed padding: the test would not test it"
    _check([{"padded/sgd": r} for r in results], ("sgd",))


def _priority_job(rank: int, world: int) -> dict:
    from gradsched.planners.dear import prioritized

    fifo = _plan(world, grouping="nearby", nearby_layers=1)
    plan = dataclasses.replace(fifo, operations=prioritized(fifo.operations), scheduling="priority")
    ref = _train("ddp", "adamw")["params"]
    got = _train(plan, "adamw")
    return {"priority/adamw": {"diff": rel_diff(got["params"], ref), "runners": got["runners"],
                               "collectives": got["collectives"],
                               "flat": torch.cat([p.reshape(-1) for p in got["params"]])}}


@pytest.mark.slow
def test_a_plan_with_priorities_over_both_phases_matches_ddp():
    _check(spawn_local(_priority_job, 2, timeout_s=120), ("adamw",))


def _deprecations(rank: int, world: int) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(_plan(world, grouping="nearby", nearby_layers=1), "sgd")
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.slow
def test_a_decoupled_run_warns_no_deprecated_collective():
    # all_gather_into_tensor and reduce_scatter_tensor warn FutureWarning on every call in 2.13
    for messages in spawn_local(_deprecations, 2, timeout_s=120):
        assert not [m for m in messages if "deprecated" in m], messages


# --------------------------------------------------------------------------- no processes
def test_executable_drops_the_all_gathers_and_renumbers_the_order():
    plan = _plan(2, grouping="nearby", nearby_layers=1)
    n_rs = sum(op.collective == REDUCE_SCATTER for op in plan.operations)
    order = list(range(len(plan.operations)))[::-1]
    run, run_order = executable(plan, order)
    assert [op.collective for op in run.operations] == [REDUCE_SCATTER] * n_rs
    assert run_order == list(range(n_rs))[::-1]
    dense = make_plan("wfbp", profile_from_module(build_model("mlp", seed=0).module), default_cluster(2))
    assert executable(dense, [0, 1]) == (dense, [0, 1])


def test_a_gate_before_the_groups_first_layer_is_refused_at_start_up():
    plan = _plan(2, grouping="nearby", nearby_layers=1)
    last = len(plan.operations) - 1
    assert plan.operations[last].collective == ALL_GATHER
    early = dataclasses.replace(plan.operations[last], gate=0)
    gated = dataclasses.replace(plan, operations=plan.operations[:last] + (early,))
    with pytest.raises(GradschedError, match="gated on its group's first layer"):
        executable(gated, list(range(len(gated.operations))))


def test_the_runner_is_registered_for_reduce_scatter():
    from gradsched.torch.runtime.ops import OP_KINDS

    assert OP_KINDS[REDUCE_SCATTER] is DecoupledAllReduce


class _FakeRunner(DecoupledAllReduce):
    """Records when its gather starts; no process group."""

    def __init__(self, index: int, first_tensor: int, log: list) -> None:  # noqa: D107 (no super: no group)
        self.index, self.first_tensor, self.log, self.phase = index, first_tensor, log, 1

    def start_gather(self, timeout_s: float) -> None:
        if self.phase == 1:
            self.log.append(("gather", self.index))
            self.phase = 2


class _FakeExecutor:
    def __init__(self, firsts: list[int]) -> None:
        from collections import deque

        self.log: list = []
        self.runners = [_FakeRunner(j, t, self.log) for j, t in enumerate(firsts)]
        self.inflight = deque(range(len(firsts)))
        self.timeout_s = 1.0


def test_gathers_start_in_forward_order_and_a_layer_retires_its_own_operation_alone():
    # issued in backward order: op 0 holds the last layers (first tensor 6), op 2 the first ones (tensor 0)
    ex = _FakeExecutor([6, 3, 0])
    from gradsched.torch.runtime.decoupled import retire_alone

    assert retire_alone(ex, 2)  # the first forward layer's gate: its operation, issued last, retires first
    assert ex.log == [("gather", 2), ("gather", 1), ("gather", 0)]
    assert list(ex.inflight) == [0, 1, 2]  # the executor retires it (the hook only decides and gathers)
    ex.inflight.remove(2)
    assert retire_alone(ex, 1) and len(ex.log) == 3  # gathers start once
    assert not retire_alone(ex, 7)  # not a decoupled operation in flight: the executor drains as usual


def _rings(rank: int, world: int) -> dict:
    import os

    from gradsched.torch.runtime import decoupled

    os.environ["GRADSCHED_RING_MIN_BYTES"] = "1"  # every group beyond two ranks goes as a ring
    gen = torch.Generator().manual_seed(rank)
    full = torch.randn(world * 40_000, generator=gen, dtype=torch.float64)  # a step's chunk: 4 messages of 80 KB
    mine = full.clone()
    shard, scratch = torch.empty(40_000, dtype=torch.float64), decoupled.scratch_for(full, world, False)
    scattered = decoupled.start_reduce_scatter(shard, full, scratch, None, rank)
    done = [w.get_future() for w in scattered]
    for w in scattered:
        w.wait()
    decoupled.sum_pieces(shard, full, scratch, rank)  # nothing left to do: the ring summed into the shard
    after_scatter = shard.clone()
    gathered = decoupled.start_all_gather(full, shard, scratch, None, rank)
    for w in gathered:
        w.wait()
    return {"mine": mine, "shard": after_scatter, "full": full, "scratch": scratch.numel(),
            "kinds": sorted({type(w).__name__ for w in scattered + gathered}), "futures_done": all(
                f.done() for f in done)}


@pytest.mark.slow
@pytest.mark.parametrize("world", [3, 4])
def test_gloos_rings_make_the_all_reduce_with_one_shard_of_scratch(world):
    results = spawn_local(_rings, world, timeout_s=60)
    total = sum(r["mine"] for r in results)
    for rank, r in enumerate(results):
        assert r["kinds"] == ["RingWork"] and r["futures_done"]
        assert r["scratch"] == 40_000  # one shard, where the all-to-alls need the whole group
        assert torch.allclose(r["shard"], total.view(world, -1)[rank], rtol=0, atol=1e-12)
        assert torch.allclose(r["full"], total, rtol=0, atol=1e-12)


def _ring_training(rank: int, world: int) -> dict:
    import os

    os.environ["GRADSCHED_RING_MIN_BYTES"] = "1"
    plan = _plan(world, grouping="nearby", nearby_layers=1)
    ref = _train("ddp", "adamw")["params"]
    got = _train(plan, "adamw")
    return {"diff": rel_diff(got["params"], ref), "runners": got["runners"], "collectives": got["collectives"],
            "flat": torch.cat([p.reshape(-1) for p in got["params"]])}


@pytest.mark.slow
def test_three_ranks_train_to_ddps_parameters_over_rings():
    _check([{"ring/adamw": r} for r in spawn_local(_ring_training, 3, timeout_s=120)], ("adamw",))


def test_a_ring_phase_hands_its_error_and_its_timeout_to_the_waiter():
    import threading
    from datetime import timedelta

    from gradsched.torch.runtime.ring import submit

    group = object()  # a lane per group: any key will do here
    failed = submit(group, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.wait(timeout=timedelta(seconds=10))
    assert failed.is_completed() and failed.get_future().done()
    release = threading.Event()
    blocked = submit(group, release.wait)
    queued = submit(group, lambda: None)  # runs after the blocked one, in submission order
    with pytest.raises(RuntimeError, match="not done within"):
        blocked.wait(timeout=0.05)
    assert not queued.is_completed()
    release.set()
    assert queued.wait(timeout=10) and blocked.is_completed()
