"""The progress thread: with a credit window, a block's completion issues the next one at once.

Without it the next block waited for the main thread's next hook or wait: while the
model computed a long layer the channel idled (docs/runtime.md, "Issue order").
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local, train  # noqa: E402

ONE_BLOCK = {"partition_bytes": 8192, "credit_bytes": 8192}  # mlp: every weight in several blocks, one in flight
SLEEP_S = 0.25  # the long layer's compute, between two gating hooks of the next forward
BLOCK = {"partition_bytes": 4096, "credit_bytes": 4096}


# --------------------------------------------------------------------------- scenarios (run on every rank)
def _equivalence(rank: int, world: int) -> dict:
    out = {}
    for opt in ("sgd", "adam"):
        ref = train("mlp", "ddp", opt, 20, seed=0, batch_size=8, device=torch.device("cpu"), use_torch_ddp=True,
                    options=None)
        mine = train("mlp", "bytescheduler", opt, 20, seed=0, batch_size=8, device=torch.device("cpu"),
                     use_torch_ddp=False, options=ONE_BLOCK)
        out[opt] = {"ref": ref, "mine": mine}
    return out


class SlowLayer(nn.Module):
    """A layer whose forward computes for ``SLEEP_S`` before its own (gated) linear runs.

    With ``issued`` set (a callable: operations issued so far), it records how many
    operations were issued while it computed: the event the progress thread exists for."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.issued = None
        self.issued_during: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = self.issued() if self.issued is not None else 0
        time.sleep(SLEEP_S)
        if self.issued is not None:
            self.issued_during.append(self.issued() - before)
        return self.lin(x)


def _gaps(rank: int, world: int, thread: bool, steps: int = 5) -> dict:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), SlowLayer(64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                           nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model = DistributedDataParallel(module, "bytescheduler", trace=True, plan_options=BLOCK)
    ex = model._executor
    module[2].issued = lambda: ex.next_pos  # operations of the last backward issued so far
    had_thread = ex._thread is not None and ex._thread.is_alive() and ex._thread.daemon
    if not thread:
        model.stop_progress_thread()  # the old behaviour: progress only at hooks and waits
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, 64, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.flush()
    trace = model.gather_timeline().to_chrome_trace()
    thread_obj = ex._thread
    ex.close()
    stopped = thread_obj is None or not thread_obj.is_alive()
    return {"trace": json.dumps(trace), "had_thread": had_thread, "stopped": stopped,
            "issued_during": module[2].issued_during,
            "n_ops": len(model.plan.operations), "credit": model.plan.credit_bytes}


def _wfbp_has_no_thread(rank: int, world: int) -> bool:
    model = DistributedDataParallel(nn.Linear(8, 8), "wfbp")
    return model._executor._thread is None


def _threads_by_window(rank: int, world: int) -> dict:
    """Whether a credit window starts a thread: one smaller than the plan's bytes, and one that holds them all."""
    module = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))  # 16.9 KB of gradients
    out = {}
    for credit in (8192, 1 << 20):
        model = DistributedDataParallel(module, "bytescheduler",
                                        plan_options={"partition_bytes": 4096, "credit_bytes": credit})
        ex = model._executor
        out[credit] = {"thread": ex._thread is not None, "credit": ex.credit_bytes}
        ex.close()
    return out


def _max_gaps_s(trace_json: str, rank: int) -> list[float]:
    """Per iteration: the longest time from one operation's completion to the next one's issue."""
    events = [e for e in json.loads(trace_json)["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "comm" and e.get("pid") == rank]
    by_iter: dict[int, list[dict]] = {}
    for e in events:
        by_iter.setdefault(e["args"]["iteration"], []).append(e)
    out = []
    for it in sorted(by_iter):
        ops = sorted(by_iter[it], key=lambda e: e["ts"])
        gaps = [(b["ts"] - (a["ts"] + a["dur"])) / 1e6 for a, b in zip(ops, ops[1:])]
        out.append(max(gaps))
    return out


# --------------------------------------------------------------------------- tests
def _all_jobs(rank: int, world: int) -> dict[str, Any]:
    """Every case of this file in one 2-rank job (one start-up instead of five)."""
    return {"equivalence": _equivalence(rank, world), "gaps/thread": _gaps(rank, world, True),
            "gaps/no-thread": _gaps(rank, world, False), "wfbp-no-thread": _wfbp_has_no_thread(rank, world),
            "threads-by-window": _threads_by_window(rank, world)}


@pytest.fixture(scope="module")
def jobs() -> list[dict[str, Any]]:
    return spawn_local(_all_jobs, 2, timeout_s=240)


@pytest.mark.slow
def test_one_block_credit_window_matches_ddp_and_ranks_agree(jobs):
    results = [r["equivalence"] for r in jobs]
    for opt in ("sgd", "adam"):
        for r in results:
            assert rel_diff(r[opt]["mine"], r[opt]["ref"]) <= 1e-5, opt
        assert all(torch.equal(a, b) for a, b in zip(results[0][opt]["mine"], results[1][opt]["mine"])), opt


@pytest.mark.slow
def test_completion_issues_the_next_block_during_a_long_forward_layer(jobs):
    with_thread, without = [r["gaps/thread"] for r in jobs], [r["gaps/no-thread"] for r in jobs]
    for r in with_thread + without:
        assert r["had_thread"] and r["stopped"]
        assert r["credit"] == BLOCK["credit_bytes"] and r["n_ops"] >= 8
    for rank in range(2):
        new = _max_gaps_s(with_thread[rank]["trace"], rank)[1:]  # the first step warms up
        old = _max_gaps_s(without[rank]["trace"], rank)[1:]
        assert len(new) >= 3 and len(old) >= 3
        # Old: the queued blocks wait for the slow layer's end (the next gating hook): the event below, not
        # the gaps' lengths, which under load can be short (the blocks in flight outlast the layer).
        # New: a completion issues the next block at once, whatever the model computes:
        # blocks are issued while the slow layer computes (an event, not a duration).
        during_new = with_thread[rank]["issued_during"][1:]
        during_old = without[rank]["issued_during"][1:]
        assert all(n == 0 for n in during_old), during_old  # nothing runs the executor inside the layer
        assert sorted(during_new)[len(during_new) // 2] >= 1, during_new


@pytest.mark.slow
def test_plans_without_credit_window_start_no_thread(jobs):
    assert [r["wfbp-no-thread"] for r in jobs] == [True, True]


@pytest.mark.slow
def test_a_window_that_holds_the_whole_plan_starts_no_thread(jobs):
    # It can never hold an operation back, and a thread woken at every completion costs
    # the model's thread the GIL each time (docs/runtime.md, "Issue order").
    for r in (j["threads-by-window"] for j in jobs):
        assert r[8192] == {"thread": True, "credit": 8192}
        assert r[1 << 20] == {"thread": False, "credit": None}


# --------------------------------------------------------------------------- in process (one rank)
def _thread_alive(model: DistributedDataParallel) -> bool:
    thread = model._executor._thread
    return thread is not None and thread.is_alive()


def test_the_model_stops_its_progress_thread_for_later_plans_too(world_of_one):
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 10)), "bytescheduler",
                                    plan_options=BLOCK)
    assert _thread_alive(model)
    model.stop_progress_thread()
    assert not _thread_alive(model)
    model._switch_plan(model.plan, model._order)  # as run-time auto switches: a new executor, no thread
    assert model._executor.credit_bytes == BLOCK["credit_bytes"] and not _thread_alive(model)
    model._executor.close()


def test_unfinished_bytes_counts_what_the_last_backward_left_in_flight(world_of_one):
    module = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4))
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    model = DistributedDataParallel(module, "usbyte")
    assert model.unfinished_bytes() == (total, total)  # no backward yet: nothing issued
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    left, moved = model.unfinished_bytes()
    assert moved == total and 0 <= left <= total
    model.synchronize()
    assert model.unfinished_bytes() == (0, total)
    assert DistributedDataParallel(nn.Linear(2, 2), "ddp").unfinished_bytes() is None  # PyTorch's DDP
    model._executor.close()
