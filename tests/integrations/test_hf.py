"""HF Accelerate and the HF Trainer: gradsched's comm hooks on the DDP they build (tiny GPT-2, random init, 2 CPU ranks)."""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from gradsched.integrations import hooks as H  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402

STEPS = 6


def _tiny_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg)  # random weights: nothing downloaded


def _tokens(n: int) -> torch.Tensor:
    return torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(1))


def _hook(name: str):
    """(state, hook) per case: "dense-topk" sends every entry, so it must match plain DDP."""
    return {"none": (None, None),
            "dense-topk": (H.TopKState(density=1.0), H.topk_hook),
            "topk": (H.TopKState(density=0.05), H.topk_hook),
            "fp16": (None, H.fp16_hook)}[name]


def _env(rank: int, world: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))


def _accelerate_run(rank: int, world: int, names: list[str]) -> dict:
    _env(rank, world)
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    data = _tokens(4 * world * STEPS)
    out = {}
    for name in names:
        model = _tiny_gpt2()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ddp, opt = acc.prepare(model, opt)
        state, hook = _hook(name)
        if hook is not None:
            ddp.register_comm_hook(state, hook)  # the supported path: on the prepared model, before training
        for step in range(STEPS):
            batch = data[step * 4 * world:(step + 1) * 4 * world][rank::world]
            loss = ddp(input_ids=batch, labels=batch).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        out[name] = {"params": [p.detach().clone() for p in model.parameters()],
                     "iterations": getattr(state, "iteration", None), "is_ddp": type(ddp).__name__}
    return out


def _trainer_run(rank: int, world: int, names: list[str]) -> dict:
    _env(rank, world)
    from gradsched.integrations.hf import add_comm_hook

    data = [{"input_ids": t, "labels": t} for t in _tokens(4 * world * STEPS)]
    out = {}
    for name in names:
        model = _tiny_gpt2()
        with tempfile.TemporaryDirectory() as tmp:
            args = transformers.TrainingArguments(
                output_dir=tmp, max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-3, use_cpu=True,
                report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
                ddp_bucket_cap_mb=1, ddp_backend="gloo")
            trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
            state, hook = _hook(name)
            callback = add_comm_hook(trainer, hook, state) if hook is not None else None
            trainer.train()
        ddp = trainer.model_wrapped
        out[name] = {"params": [p.detach().clone() for p in model.parameters()],
                     "iterations": getattr(state, "iteration", None),
                     "registered": callback is not None and callback.registered_on is ddp,
                     "bucket_bytes_cap": getattr(ddp, "bucket_bytes_cap", None)}
    return out


def _check(ranks: list[dict]) -> dict:
    r0 = ranks[0]
    for name in r0:
        assert all(torch.equal(a, b) for a, b in zip(r0[name]["params"], ranks[1][name]["params"])), name
    ref = r0["none"]["params"]
    assert rel_diff(r0["dense-topk"]["params"], ref) < 1e-4  # the hook ran and averaged exactly
    assert r0["dense-topk"]["iterations"] == STEPS == r0["topk"]["iterations"]
    fp16, topk = rel_diff(r0["fp16"]["params"], ref), rel_diff(r0["topk"]["params"], ref)
    assert fp16 < 0.05, fp16  # AdamW scales each entry by its own history: fp16 rounding shows (0.026 measured)
    assert topk > max(fp16, 1e-3), (topk, fp16)  # a real top-k changes the run more than rounding does
    return r0


@pytest.mark.slow
def test_accelerate_runs_gradsched_hooks_on_its_ddp():
    r0 = _check(spawn_local(_accelerate_run, 2, ["none", "dense-topk", "topk", "fp16"], timeout_s=180))
    assert r0["none"]["is_ddp"] == "DistributedDataParallel"


@pytest.mark.slow
def test_trainer_runs_gradsched_hooks_and_bucket_size():
    r0 = _check(spawn_local(_trainer_run, 2, ["none", "dense-topk", "topk", "fp16"], timeout_s=240))
    assert all(r0[n]["registered"] for n in ("dense-topk", "topk", "fp16"))
    assert r0["none"]["bucket_bytes_cap"] == 2**20  # ddp_bucket_cap_mb=1 reached PyTorch's DDP
