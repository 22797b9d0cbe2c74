"""Overlapping plans on a private gloo group of N worker threads (``$GRADSCHED_OVERLAP_GLOO_THREADS``, issue 35).

gloo runs a group's queued collectives on its worker threads, two by default, so an overlapping plan's
operations finish in pairs while the next forward waits for them one at a time in priority order
(docs/notes/2026-12-q12.md).  The switch puts such a plan's operations on a group of its own with the
threads asked for; torch 2.13's ``new_group`` ignores gloo's ``pg_options``, which the group helper
works around.  Results must stay DDP's.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from gradsched.torch.jobs.selftest import rel_diff, spawn_local, train  # noqa: E402
from gradsched.torch.runtime.executor import OVERLAP_THREADS_ENV  # noqa: E402

USBYTE: dict | None = None  # the paper's blocks in forward-order priority, overlapping the next forward


def _threads(group: object) -> int:
    return group._get_backend(torch.device("cpu")).options._threads  # type: ignore[attr-defined]


def _group_threads(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from gradsched.torch.runtime.groups import gloo_thread_group, side_group

    world_group = dist.group.WORLD
    return {"default": _threads(world_group), "side": _threads(side_group(world_group, 30.0)),
            "one": _threads(gloo_thread_group(world_group, 30.0, 1)),
            "three": _threads(gloo_thread_group(world_group, 30.0, 3))}


def _train_with(rank: int, world: int, threads: str) -> dict:
    """DDP's parameters and usbyte's (overlapping) with the switch set to ``threads`` ("" unset), and the
    executor's issue group: whether it is the user's and how many gloo threads it runs."""
    import torch.distributed as dist

    from gradsched.torch import DistributedDataParallel, build_model

    os.environ[OVERLAP_THREADS_ENV] = threads
    ref = train("mlp", "ddp", "sgd", 12, seed=0, batch_size=8, device=torch.device("cpu"), use_torch_ddp=True,
                options=None)
    mine = train("mlp", "usbyte", "sgd", 12, seed=0, batch_size=8, device=torch.device("cpu"),
                 use_torch_ddp=False, options=USBYTE)
    model = DistributedDataParallel(build_model("mlp", seed=0).module, "usbyte", plan_options=USBYTE,
                                    use_torch_ddp=False)
    ex = model._executor
    out = {"ref": ref, "mine": mine, "overlap": ex.plan.overlap_forward, "ops": len(ex.plan.operations),
           "own_group": ex.group is not dist.group.WORLD, "threads": _threads(ex.group),
           "runners_on_it": all(r.group is ex.group for r in ex.runners)}
    ex.close()
    return out


def test_gloo_thread_group_runs_the_threads_asked_for():
    out = spawn_local(_group_threads, 2)
    for r in out:
        assert r == {"default": 2, "side": 2, "one": 1, "three": 3}


@pytest.mark.parametrize("threads", ["1", ""])
def test_overlapping_plan_on_its_own_group_matches_ddp(threads):
    out = spawn_local(_train_with, 2, threads, timeout_s=120.0)
    for r in out:
        assert r["overlap"] and r["ops"] > 1
        assert rel_diff(r["mine"], r["ref"]) <= 1e-5
        assert r["runners_on_it"]
        if threads:
            assert r["own_group"] and r["threads"] == 1
        else:
            assert not r["own_group"] and r["threads"] == 2
    assert rel_diff(out[0]["mine"], out[1]["mine"]) == 0.0
