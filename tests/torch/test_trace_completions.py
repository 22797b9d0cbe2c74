"""Completion stamps: a callback per operation only while the tracer asks for them (run-time auto's switch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gradsched.timeline import COMM  # noqa: E402
from gradsched.torch.jobs.selftest import spawn_local  # noqa: E402

STEPS = 3


def _phases(rank: int, world: int) -> dict:
    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    spec = build_model("mlp", seed=0)
    model = DistributedDataParallel(spec.module, "wfbp", trace=True, timeout_s=60)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    gen = torch.Generator().manual_seed(1)
    out = {}
    for phase, stamped in (("stamped", True), ("unstamped", False)):
        model._tracer.completions = stamped
        for _ in range(STEPS):
            x, y = spec.make_batch(8, gen)
            opt.zero_grad()
            spec.loss_fn(model(x), y).backward()
            opt.step()
        model.synchronize()
        runners = model._executor.runners
        out[phase] = {"callbacks": sum(r.on_complete is not None for r in runners), "ops": len(runners)}
    comm = [e for e in model.timeline().events if e.cat == COMM]
    out["comm_per_iteration"] = {it: sum(1 for e in comm if e.args["iteration"] == it)
                                 for it in {e.args["iteration"] for e in comm}}
    return out


@pytest.mark.slow
def test_completion_callbacks_follow_the_tracer_and_every_operation_is_still_traced():
    for r in spawn_local(_phases, 2, timeout_s=60):
        assert r["stamped"]["callbacks"] == r["stamped"]["ops"] > 1  # wfbp on mlp: one operation per tensor
        assert r["unstamped"]["callbacks"] == 0  # no credit window, no progress thread: nothing else needs them
        # unstamped, an operation's end is when the runtime sees it done: still one event per operation
        assert set(r["comm_per_iteration"].values()) == {r["stamped"]["ops"]}
        assert len(r["comm_per_iteration"]) == 2 * STEPS
