"""Standard training loops give PyTorch DDP's parameters under every strategy (docs/runtime.md,
"Between backward() and step()").

Each loop reads or changes gradients between ``backward()`` and ``step()`` (global-norm
clipping, ``GradScaler`` with fp16 autocast, bf16 autocast, logging and an in-place edit,
accumulation with ``no_sync``), with a plain ``torch.optim`` optimizer and LR scheduler
or with ``DistributedOptimizer``.  With plans that overlap the next forward
(``bytescheduler``, ``usbyte``, ``auto`` once it switches to one) ``backward()`` returns
while gradients are still being reduced: before the fix these loops were 16-54% off
DDP (issue 17), or refused a plain optimizer outright.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model  # noqa: E402
from gradsched.torch.jobs.selftest import SMALL_MODEL_OPTIONS, dense_strategies, rel_diff, spawn_local  # noqa: E402

TOLERANCE = 1e-5  # as tests/torch/test_runtime_equivalence.py
STEPS = 8
CLIP = 0.1
NOT_OVERLAPPING = ("wfbp", "sync", "threshold", "ddp", "horovod", "mgwfbp", "optimal")
# run-time auto, made to switch to an overlapping plan (usbyte or bytescheduler) at iteration 3
AUTO_OVERLAPPING = {"switch_iteration": 3, "trials": 1, "exclude": list(NOT_OVERLAPPING)}
SPARSE_WARM = {"warmup_steps": 1000}  # top-k's dense warm-up: DDP's numbers, through the sparse runner


def _cases() -> list[tuple[str, dict | None, dict | None]]:
    """(strategy, plan options, sparse options) of every plan the loops run under."""
    out: list[tuple[str, dict | None, dict | None]] = [
        (s, SMALL_MODEL_OPTIONS.get(s), None) for s in dense_strategies() if s != "auto"]
    out.append(("auto", AUTO_OVERLAPPING, None))
    out.append(("topk", {"density": 0.1}, SPARSE_WARM))
    return out


# --------------------------------------------------------------------------- one loop on one rank
def _train(loop: str, wrap_opt: bool, strategy: str, options: dict | None, sparse: dict | None) -> dict:
    """``STEPS`` steps of ``loop``; the final parameters and what the loop logged."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = build_model("mlp", seed=0)
    if strategy == "torch-ddp":
        model = DistributedDataParallel(spec.module, "ddp")
    else:
        model = DistributedDataParallel(spec.module, strategy, plan_options=options, use_torch_ddp=False,
                                        sparse_options=sparse, timeout_s=60)
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    integrated = loop == "clip_integrated"
    opt: Any = (DistributedOptimizer(inner, model, **({"clip_grad_norm": CLIP} if integrated else {}))
                if wrap_opt and strategy != "torch-ddp" else inner)
    sched = torch.optim.lr_scheduler.StepLR(inner, step_size=3, gamma=0.5)
    amp = {"scaler": torch.float16, "bf16": torch.bfloat16}.get(loop)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) if loop == "scaler" else None
    gen = torch.Generator().manual_seed(1)
    logged: list[float] = []
    for _ in range(STEPS):
        opt.zero_grad()
        micro = 2 if loop == "accumulate" else 1
        for m in range(micro):
            x, y = spec.make_batch(8 * world, gen)
            x, y = x[rank::world], y[rank::world]
            quiet = model.no_sync() if m < micro - 1 else contextlib.nullcontext()
            with quiet, (torch.autocast("cpu", dtype=amp) if amp else contextlib.nullcontext()):
                loss = spec.loss_fn(model(x), y)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        if loop == "log":
            logged.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)  # an edit that needs the averaged values
        elif integrated and opt is inner:  # the reference (torch DDP) clips by hand
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        elif loop != "plain" and not integrated:
            logged.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sched.step()
    if strategy != "torch-ddp":
        model.synchronize()
    return {"params": [p.detach().clone() for p in spec.module.parameters()], "logged": logged,
            "overlapping": model.overlaps_forward}


def _job(rank: int, world: int, loop: str, wrap_opt: bool) -> dict:
    torch.manual_seed(0)
    out = {"torch-ddp": _train(loop, wrap_opt, "torch-ddp", None, None)}
    for strategy, options, sparse in _cases():
        if sparse is not None and wrap_opt and loop not in ("plain", "clip_integrated"):
            continue  # LaySA updates top-k weights as results arrive (docs/runtime.md, "not supported")
        out[strategy] = _train(loop, wrap_opt, strategy, options, sparse)
    return out


def _check(results: list[dict]) -> None:
    ref = results[0]["torch-ddp"]
    bad = {}
    for strategy in results[0]:
        diffs = [rel_diff(r[strategy]["params"], ref["params"]) for r in results]
        logs = [r[strategy]["logged"] for r in results]
        log_ok = all(len(lg) == len(ref["logged"]) and all(abs(a - b) <= TOLERANCE * max(abs(b), 1e-12)
                                                            for a, b in zip(lg, ref["logged"])) for lg in logs)
        same = all(torch.equal(a, b) for a, b in zip(results[0][strategy]["params"], results[1][strategy]["params"]))
        if max(diffs) > TOLERANCE or not log_ok or not same:
            bad[strategy] = {"rel_diff": max(diffs), "logged": logs[0][:3], "ref_logged": ref["logged"][:3],
                             "same_on_ranks": same}
    assert not bad, bad


# --------------------------------------------------------------------------- tests
PLAIN_LOOPS = ["plain", "clip"]
WRAPPED_LOOPS = ["clip", "clip_integrated", "scaler", "bf16", "log", "accumulate"]


def _all_jobs(rank: int, world: int) -> dict[str, Any]:
    """Every case of this file in one 2-rank job (one start-up instead of nine)."""
    out: dict[str, Any] = {f"plain/{loop}": _job(rank, world, loop, False) for loop in PLAIN_LOOPS}
    out.update({f"wrapped/{loop}": _job(rank, world, loop, True) for loop in WRAPPED_LOOPS})
    out["sparse"] = _sparse_job(rank, world)
    return out


@pytest.fixture(scope="module")
def jobs() -> list[dict[str, Any]]:
    return spawn_local(_all_jobs, 2, timeout_s=480)


@pytest.mark.slow
@pytest.mark.parametrize("loop", PLAIN_LOOPS)
def test_plain_optimizer_and_scheduler_match_ddp(jobs, loop):
    """Plain torch.optim + StepLR on the wrapped model's parameters, no DistributedOptimizer (issue 18)."""
    _check([r[f"plain/{loop}"] for r in jobs])


@pytest.mark.slow
@pytest.mark.parametrize("loop", WRAPPED_LOOPS)
def test_distributed_optimizer_loops_match_ddp(jobs, loop):
    """DistributedOptimizer with clipping (plain and integrated), GradScaler (fp16), bf16, logging, no_sync."""
    results = [r[f"wrapped/{loop}"] for r in jobs]
    _check(results)
    assert all(r["auto"]["overlapping"] and r["usbyte"]["overlapping"] for r in results)  # auto did switch


def test_clip_grad_norm_option_is_checked():
    from gradsched.errors import GradschedError

    class _Model:
        overlaps_forward = False

        @property
        def link(self) -> Any:
            return self

        def attach_optimizer(self, opt: Any, inner: Any) -> Any:
            return inner

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "one"):
        with pytest.raises(GradschedError, match=r"^DistributedOptimizer: clip_grad_norm must be [^\n]*, got"):
            DistributedOptimizer(opt, _Model(), clip_grad_norm=bad)  # type: ignore[arg-type]
    with pytest.raises(GradschedError, match=r"^DistributedOptimizer: norm_type must be above 0 \(2.0, or inf"):
        DistributedOptimizer(opt, _Model(), clip_grad_norm=1.0, norm_type=0)
    dist_opt = DistributedOptimizer(opt, _Model(), clip_grad_norm="1", norm_type=float("inf"))  # type: ignore[arg-type]
    assert (dist_opt.clip_grad_norm, dist_opt.norm_type) == (1.0, float("inf"))  # typed as declared


# --------------------------------------------------------------------------- top-k (LaySA) after its results are applied
def _sparse_clip(memory: str, how: str) -> list[torch.Tensor]:
    """Top-k (density 0.1, no warm-up), 6 steps with global-norm clipping done ``how``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = build_model("mlp", seed=0)
    model = DistributedDataParallel(spec.module, "topk", plan_options={"density": 0.1},
                                    sparse_options={"memory": memory}, timeout_s=60)
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt: Any = inner if how == "plain-optimizer" else DistributedOptimizer(
        inner, model, clip_grad_norm=CLIP if how == "integrated" else None)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        opt.zero_grad()
        x, y = spec.make_batch(8 * world, gen)
        spec.loss_fn(model(x[rank::world]), y[rank::world]).backward()
        if how != "integrated":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    return [p.detach().clone() for p in spec.module.parameters()]


def _sparse_job(rank: int, world: int) -> dict:
    out: dict[str, Any] = {"naive": _sparse_clip("naive", "plain-clip"),
                           "laysa-integrated": _sparse_clip("laysa", "integrated"),
                           "laysa-plain-optimizer": _sparse_clip("laysa", "plain-optimizer")}
    try:
        _sparse_clip("laysa", "plain-clip")
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        out["error"] = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    return out


@pytest.mark.slow
def test_topk_clipping_is_integrated_or_a_clear_error(jobs):
    """LaySA applies top-k results as they arrive: clipping then must be integrated (or the result kept)."""
    for r in (j["sparse"] for j in jobs):
        assert rel_diff(r["laysa-integrated"], r["naive"]) <= TOLERANCE
        assert rel_diff(r["laysa-plain-optimizer"], r["naive"]) <= TOLERANCE
        assert r["error"] is not None and r["error"].startswith("GradschedError")
        assert "clip_grad_norm=" in r["error"] and "applied to its weights" in r["error"]
