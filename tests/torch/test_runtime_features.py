"""What users rely on: no_sync, unused and frozen parameters, dtypes, state_dict, plan agreement, errors, tracing.

One spawned 2-rank job runs every scenario (each returns what the assertions below
need), so the suite pays for process start-up once.
"""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.plan import Operation, Plan, Slice  # noqa: E402
from gradsched.timeline import Timeline  # noqa: E402
from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model  # noqa: E402
from gradsched.torch.runtime.ops import OP_KINDS  # noqa: E402
from gradsched.torch.runtime.planning import profile_from_module  # noqa: E402
from gradsched.torch.jobs.selftest import SMALL_MODEL_OPTIONS, rel_diff, spawn_local, train  # noqa: E402

CPU = torch.device("cpu")


# --------------------------------------------------------------------------- scenarios (run on every rank)
class Branchy(nn.Module):
    """A frozen input layer, a branch only some ranks use at some steps, a layer never used."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 16)
        self.frozen.requires_grad_(False)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.never = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        h = F.relu(self.a(F.relu(self.frozen(x))))
        if use_b:
            h = h + self.b(h)
        return self.head(h)


def _branchy_run(rank: int, strategy: str, steps: int = 6) -> tuple[list[torch.Tensor], list[bool]]:
    torch.manual_seed(0)
    module = Branchy()
    if strategy == "torch-ddp":
        model = DistributedDataParallel(module, "ddp", find_unused_parameters=True)
    else:
        model = DistributedDataParallel(module, strategy, find_unused_parameters=True,
                                        plan_options=SMALL_MODEL_OPTIONS.get(strategy))
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(4, 8, generator=gen) + rank
        y = torch.randint(0, 3, (4,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x, use_b=(rank == 0 and step % 2 == 0)), y).backward()
        opt.step()
    model.synchronize()
    return [p.detach().clone() for p in module.parameters()], [p.grad is None for p in module.parameters()]


class Mixed(nn.Module):
    """fp32, bf16 and fp16 layers: three dtypes that must go in separate buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.l32 = nn.Linear(8, 16)
        self.lbf = nn.Linear(16, 16).to(torch.bfloat16)
        self.l16 = nn.Linear(16, 16).to(torch.float16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lbf(F.relu(self.l32(x)).to(torch.bfloat16))
        h = self.l16(h.to(torch.float16))
        return self.out(h.float())


def _mixed_run(rank: int, strategy: str, steps: int = 5) -> list[torch.Tensor]:
    torch.manual_seed(0)
    module = Mixed()
    model = DistributedDataParallel(module, strategy)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen) + rank
        y = torch.randint(0, 3, (4,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().float().clone() for p in module.parameters()]


def _checkpoint_run(rank: int, world: int, strategy: str) -> dict[str, list[torch.Tensor]]:
    """6 steps, save, 6 more; versus a fresh model (other seed) that loads the checkpoint and does the 6."""
    def make(seed: int):
        spec = build_model("mlp", seed=seed)
        model = DistributedDataParallel(spec.module, strategy, plan_options=SMALL_MODEL_OPTIONS.get(strategy))
        inner = torch.optim.Adam(model.parameters(), lr=1e-2)
        return spec, model, DistributedOptimizer(inner, model)

    def steps(spec, model, opt, gen, n):
        for _ in range(n):
            x, y = spec.make_batch(8 * world, gen)
            opt.zero_grad()
            spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
            opt.step()

    spec, model, opt = make(0)
    gen = torch.Generator().manual_seed(5)
    steps(spec, model, opt, gen, 6)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # torch returns live state tensors
    gen_state = gen.get_state()
    steps(spec, model, opt, gen, 6)
    model.synchronize()
    straight = [p.detach().clone() for p in model.parameters()]

    _, model2, opt2 = make(123)
    model2.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    gen.set_state(gen_state)
    steps(spec, model2, opt2, gen, 6)  # spec's data: the teacher depends on the seed
    model2.synchronize()
    return {"straight": straight, "resumed": [p.detach().clone() for p in model2.parameters()],
            "keys": sorted(saved_model)}


def _batchnorm_run(rank: int, world: int, strategy: str) -> dict[str, torch.Tensor]:
    """The ResNet-like cnn (BatchNorm buffers, broadcast from rank 0 before every forward, as DDP does)."""
    spec = build_model("cnn")
    model = DistributedDataParallel(spec.module, "ddp" if strategy == "torch-ddp" else strategy,
                                    use_torch_ddp=strategy == "torch-ddp")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x, y = spec.make_batch(4, gen)
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        opt.step()
    model.synchronize()
    return {k: v.detach().clone() for k, v in spec.module.state_dict().items()}


def _error_of(fn) -> str:
    try:
        fn()
    except GradschedError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _unused_without_flag(rank: int) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(Branchy(), "wfbp")
    F.cross_entropy(model(torch.randn(2, 8), use_b=False), torch.tensor([0, 1])).backward()


def _overlap_without_optimizer() -> None:
    """An overlapping plan with a plain optimizer waits at the end of backward (no longer an error)."""
    spec = build_model("mlp")
    model = DistributedDataParallel(spec.module, "bytescheduler", plan_options=SMALL_MODEL_OPTIONS["bytescheduler"])
    model(torch.randn(2, 64)).sum().backward()
    if not model._executor.settled or not all(type(p.grad) is torch.Tensor for p in model.parameters()):
        raise AssertionError("gradients still in flight after backward() without a DistributedOptimizer")


def _sparse_plan(rank: int) -> None:
    spec = build_model("mlp")
    prof = profile_from_module(spec.module)
    ops = tuple(Operation((Slice(i, 0, t.numel),), "topk-allgather", i, 0.01) for i, t in enumerate(prof.tensors))
    DistributedDataParallel(spec.module, Plan("hand-topk", ops, prof.fingerprint))


def _traced(rank: int, world: int, strategy: str) -> dict:
    spec = build_model("mlp")
    model = DistributedDataParallel(spec.module, strategy, trace=True, plan_options=SMALL_MODEL_OPTIONS.get(strategy))
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, y = spec.make_batch(8 * world, gen)
        opt.zero_grad()
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    tl = model.gather_timeline()
    names = [n for n, p in spec.module.named_parameters()]
    return {"trace": json.dumps(tl.to_chrome_trace()), "order": model._order, "op_tensors": model._executor.layout.op_tensors,
            "names": names, "overlap": model.overlaps_forward}


def scenarios(rank: int, world: int) -> dict:
    out: dict = {}
    # gradient accumulation with no_sync
    for strategy in ("torch-ddp", "wfbp", "bytescheduler"):
        out[f"accumulate/{strategy}"] = train("mlp", "ddp" if strategy == "torch-ddp" else strategy, "adam", 6,
                                              seed=0, batch_size=4, device=CPU, use_torch_ddp=strategy == "torch-ddp",
                                              options=SMALL_MODEL_OPTIONS.get(strategy), accumulate=3)
    for strategy in ("torch-ddp", "wfbp", "sync", "bytescheduler"):
        out[f"unused/{strategy}"] = _branchy_run(rank, strategy)
    for strategy in ("torch-ddp", "sync", "wfbp"):
        out[f"dtypes/{strategy}"] = _mixed_run(rank, "ddp" if strategy == "torch-ddp" else strategy)
    for strategy in ("wfbp", "usbyte"):
        out[f"checkpoint/{strategy}"] = _checkpoint_run(rank, world, strategy)
    for strategy in ("torch-ddp", "ddp", "wfbp"):
        out[f"batchnorm/{strategy}"] = _batchnorm_run(rank, world, strategy)
    spec = build_model("mlp")
    out["mismatch"] = _error_of(lambda: DistributedDataParallel(spec.module, "wfbp" if rank == 0 else "sync"))
    out["unused_without_flag"] = _error_of(lambda: _unused_without_flag(rank))
    out["overlap_without_optimizer"] = _error_of(_overlap_without_optimizer)
    out["sparse"] = _error_of(lambda: _sparse_plan(rank))
    for strategy in ("wfbp", "bytescheduler"):
        out[f"trace/{strategy}"] = _traced(rank, world, strategy)
    dist.barrier()
    return out


# --------------------------------------------------------------------------- assertions
@pytest.fixture(scope="module")
def results():
    return spawn_local(scenarios, 2, timeout_s=60)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["wfbp", "bytescheduler"])
def test_no_sync_accumulation_matches_ddp(results, strategy):
    for r in results:
        assert rel_diff(r[f"accumulate/{strategy}"], r["accumulate/torch-ddp"]) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["wfbp", "sync", "bytescheduler"])
def test_unused_and_frozen_parameters_match_ddp(results, strategy):
    names = [n for n, _ in Branchy().named_parameters()]
    for r in results:
        params, grad_none = r[f"unused/{strategy}"]
        ref_params, ref_none = r["unused/torch-ddp"]
        assert rel_diff(params, ref_params) <= 1e-5
        assert grad_none == ref_none  # never-used layer keeps grad None, as in DDP
        assert grad_none[names.index("never.weight")] and grad_none[names.index("frozen.weight")]
    assert all(torch.equal(a, b) for a, b in zip(results[0][f"unused/{strategy}"][0], results[1][f"unused/{strategy}"][0]))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "wfbp"])
def test_mixed_dtypes_match_ddp(results, strategy):
    for r in results:
        ours, ref = r[f"dtypes/{strategy}"], r["dtypes/torch-ddp"]
        assert rel_diff(ours[:2], ref[:2]) <= 1e-5  # fp32 layer
        assert rel_diff(ours, ref) <= 1e-2  # bf16/fp16 layers: same arithmetic, low precision
    assert all(torch.equal(a, b) for a, b in zip(results[0][f"dtypes/{strategy}"], results[1][f"dtypes/{strategy}"]))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["wfbp", "usbyte"])
def test_state_dict_save_and_load_resumes_exactly(results, strategy):
    for r in results:
        c = r[f"checkpoint/{strategy}"]
        assert all(torch.equal(a, b) for a, b in zip(c["straight"], c["resumed"]))
        assert all(k.startswith("module.") for k in c["keys"])  # DDP's key layout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "wfbp"])
def test_batchnorm_buffers_follow_rank0_like_ddp(results, strategy):
    for r in results:
        ours, ref = r[f"batchnorm/{strategy}"], r["batchnorm/torch-ddp"]
        assert ours.keys() == ref.keys() and any("running_mean" in k for k in ours)
        floats = [k for k in ours if ours[k].is_floating_point()]
        assert rel_diff([ours[k] for k in floats], [ref[k] for k in floats]) <= 1e-5
    assert all(torch.equal(results[0][f"batchnorm/{strategy}"][k], results[1][f"batchnorm/{strategy}"][k])
               for k in results[0][f"batchnorm/{strategy}"] if "running" not in k)


@pytest.mark.slow
def test_mismatched_plans_fail_on_every_rank(results):
    for r in results:
        assert r["mismatch"].startswith("GradschedError: ranks hold different plans")
        assert "rank 0:" in r["mismatch"] and "rank 1:" in r["mismatch"]


@pytest.mark.slow
def test_clear_errors(results):
    for r in results:
        assert "got no gradient" in r["unused_without_flag"] and "find_unused_parameters=True" in r["unused_without_flag"]
        assert r["overlap_without_optimizer"] == "no error"  # a plain optimizer: backward waits (test_train_loops)
        if "topk-allgather" not in OP_KINDS:
            assert "topk-allgather" in r["sparse"] and "dense strategy" in r["sparse"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["wfbp", "bytescheduler"])
def test_measured_trace_is_valid_and_ordered(results, strategy):
    t = results[0][f"trace/{strategy}"]
    data = json.loads(t["trace"])
    tl = Timeline.from_chrome_trace(data)
    eps = 1e-4
    assert {e.rank for e in tl.events} == {0, 1}
    for rank in (0, 1):
        ev = [e for e in tl.events if e.rank == rank]
        assert all(e.dur_s >= 0 and e.start_s >= -eps for e in ev)
        for it in (1, 2, 3):
            comm = sorted((e for e in ev if e.cat == "comm" and e.args["iteration"] == it), key=lambda e: e.start_s)
            assert [e.args["op"] for e in comm] == list(t["order"])  # issued in the agreed order
            ready = {e.args["tensor"]: e.end_s for e in ev if e.cat == "backward" and e.args["iteration"] == it}
            assert sorted(ready) == list(range(len(t["names"])))  # every gradient became ready once
            fwd = [e for e in ev if e.cat == "forward" and e.args["iteration"] == it]
            assert len(fwd) == 1 and fwd[0].end_s <= min(ready.values()) + eps  # backward after forward
            for c in comm:
                assert all(ready[i] <= c.start_s + eps for i in t["op_tensors"][c.args["op"]])  # issued once ready
                later = [u for u in ev if u.cat == "update" and u.start_s >= c.start_s
                         and set(t["op_tensors"][c.args["op"]]) & set(u.args["tensors"])]
                if it < 3 or not t["overlap"]:
                    assert later and later[0].start_s >= c.end_s - eps  # updated only after reduced
        if t["overlap"]:
            assert any(e.cat == "update" and len(e.args["tensors"]) < len(t["names"]) for e in ev)  # per-layer updates
