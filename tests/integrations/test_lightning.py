"""PyTorch Lightning: GradschedStrategy reaches the parameters of Lightning's own "ddp" strategy (2 CPU processes)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.integrations.lightning import GradschedStrategy  # noqa: E402
from gradsched.integrations import hooks as H  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff, spawn_local  # noqa: E402

SMALL = {"bytescheduler": {"partition_bytes": 4096, "credit_bytes": 16384}, "usbyte": {"unit_bytes": 2048},
         "topk": {"density": 0.05}}


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)]


def _data() -> DataLoader:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    return DataLoader(TensorDataset(x, y), batch_size=8)  # 2 ranks: 4 batches per rank and epoch


def _strategy(plan: str):
    if plan == "lightning-ddp":
        return "ddp"
    if plan == "registered":
        return "gradsched"  # the name gradsched.lightning registers: GradschedStrategy("auto")
    if plan == "ddp+topk":  # PyTorch's DDP with a gradsched hook, on CPU
        return GradschedStrategy("ddp", ddp_comm_hook=H.topk_hook, ddp_comm_state=H.TopKState(density=0.05))
    return GradschedStrategy(plan, plan_options=SMALL.get(plan))


def _fit(plan: str, steps: int, ckpt_path: str | None = None, callbacks=(), **trainer_kw) -> list[torch.Tensor]:
    module = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=_strategy(plan), max_steps=steps, logger=False,
                        enable_checkpointing=bool(callbacks), callbacks=list(callbacks), enable_progress_bar=False,
                        enable_model_summary=False, **trainer_kw)
    trainer.fit(module, _data(), ckpt_path=ckpt_path)
    return [p.detach().clone() for p in module.parameters()]


def _lightning_cases(rank: int, world: int, cases: list[tuple[str, str, dict]]) -> dict:
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0")  # the processes exist: Lightning launches none
    return {label: _fit(plan, **kw) for label, plan, kw in cases}


def _check_cases(cases: list[tuple[str, str, dict]], refs: dict[str, str], tolerance: float) -> dict:
    ranks = spawn_local(_lightning_cases, 2, cases, timeout_s=180)
    diffs = {}
    for label, _, _ in cases:
        assert all(torch.equal(a, b) for a, b in zip(ranks[0][label], ranks[1][label])), label  # ranks agree
        if label in refs:
            diffs[label] = rel_diff(ranks[0][label], ranks[0][refs[label]])
    bad = {k: v for k, v in diffs.items() if v > tolerance}
    assert not bad, diffs
    return ranks[0]


@pytest.mark.slow
def test_plans_reach_lightning_ddp_parameters():
    """Plain steps (``strategy="gradsched"`` is run-time auto), and gradient clipping with
    accumulate_grad_batches, under overlapping and other plans."""
    plain = {"steps": 8}
    clip = {"steps": 6, "gradient_clip_val": 0.05, "accumulate_grad_batches": 2}
    cases = [("ref", "lightning-ddp", plain), ("wfbp", "wfbp", plain), ("mgwfbp", "mgwfbp", plain),
             ("usbyte", "usbyte", plain), ("bytescheduler", "bytescheduler", plain), ("torch-ddp", "ddp", plain),
             ("auto", "registered", plain), ("ddp+topk", "ddp+topk", plain),
             ("clip-ref", "lightning-ddp", clip), ("clip-usbyte", "usbyte", clip), ("clip-mgwfbp", "mgwfbp", clip),
             ("clip-off", "mgwfbp", {"steps": 6, "accumulate_grad_batches": 2})]
    refs = {c[0]: "ref" for c in cases[1:7]}
    refs.update({"clip-usbyte": "clip-ref", "clip-mgwfbp": "clip-ref"})
    params = _check_cases(cases, refs, tolerance=1e-5)
    # the comparison can fail: without clipping the same run ends elsewhere (clipping was active)
    assert rel_diff(params["clip-off"], params["clip-ref"]) > 1e-3
    assert rel_diff(params["ddp+topk"], params["ref"]) > 1e-3  # the hook ran: top-k at 5% changes the run


@pytest.mark.slow
def test_bf16_mixed_precision_and_checkpoints():
    """bf16 autocast; a checkpoint written mid-run under an overlapping plan holds the weights of
    Lightning's DDP at that step, and training resumed from it ends where DDP ends."""
    with tempfile.TemporaryDirectory() as tmp:
        every4 = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp, every_n_train_steps=4, save_top_k=-1,
                                                     filename="{step}")
        # weights only: nothing in the dump flushes the optimizer, so this one needs the strategy's care
        weights4 = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp, every_n_train_steps=2, save_top_k=-1,
                                                       filename="w{step}", save_weights_only=True)
        cases = [("bf16-ref", "lightning-ddp", {"steps": 6, "precision": "bf16-mixed"}),
                 ("bf16-usbyte", "usbyte", {"steps": 6, "precision": "bf16-mixed"}),
                 ("ref4", "lightning-ddp", {"steps": 4}), ("ref8", "lightning-ddp", {"steps": 8}),
                 ("usbyte8", "usbyte", {"steps": 8, "callbacks": (every4, weights4)}),
                 ("resumed8", "usbyte", {"steps": 8, "ckpt_path": str(Path(tmp, "step=4.ckpt"))})]
        params = _check_cases(cases, {"bf16-usbyte": "bf16-ref", "usbyte8": "ref8", "resumed8": "ref8"},
                              tolerance=1e-5)
        saved = {n: torch.load(Path(tmp, n), weights_only=False)["state_dict"] for n in ("step=4.ckpt", "wstep=4.ckpt")}
    for name, state in saved.items():
        at4 = [state[f"net.{i}.{w}"] for i in (0, 2, 4) for w in ("weight", "bias")]
        assert rel_diff(at4, params["ref4"]) < 1e-5, name
    assert rel_diff(params["ref4"], params["ref8"]) > 1e-3  # the checkpoint is not simply the end state


@pytest.mark.slow
def test_sparse_checkpoints_resume_with_every_ranks_residuals():
    """A checkpoint of a top-k run holds every rank's residuals; resumed from it, training ends
    where the uninterrupted run ends, and without them it does not."""
    with tempfile.TemporaryDirectory() as tmp:
        every4 = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp, every_n_train_steps=4, save_top_k=-1,
                                                     filename="{step}")
        first = spawn_local(_lightning_cases, 2, [("topk8", "topk", {"steps": 8, "callbacks": (every4,)})],
                            timeout_s=180)
        ckpt = torch.load(Path(tmp, "step=4.ckpt"), weights_only=False)
        residuals = {k: v for k, v in ckpt["gradsched_sparse_state"].items() if ".residual." in k}
        assert residuals and all(v.shape[0] == 2 for v in residuals.values())  # both ranks' rows
        assert all(not torch.equal(v[0], v[1]) for v in residuals.values())  # and they differ
        del ckpt["gradsched_sparse_state"]
        torch.save(ckpt, Path(tmp, "dropped.ckpt"))
        ranks = spawn_local(_lightning_cases, 2, [
            ("resumed8", "topk", {"steps": 8, "ckpt_path": str(Path(tmp, "step=4.ckpt"))}),
            ("dropped8", "topk", {"steps": 8, "ckpt_path": str(Path(tmp, "dropped.ckpt"))})], timeout_s=180)
    for label in ("resumed8", "dropped8"):
        assert all(torch.equal(a, b) for a, b in zip(ranks[0][label], ranks[1][label])), label  # ranks agree
    assert rel_diff(ranks[0]["resumed8"], first[0]["topk8"]) < 1e-6
    assert rel_diff(ranks[0]["dropped8"], first[0]["topk8"]) > 1e-4  # the residuals matter


def test_options_for_pytorch_ddp_are_refused_with_a_gradsched_plan():
    with pytest.raises(GradschedError, match="bucket_cap_mb: PyTorch DDP options"):
        GradschedStrategy("mgwfbp", bucket_cap_mb=5)
    with pytest.raises(GradschedError, match="ddp_comm_hook runs inside PyTorch's DDP"):
        GradschedStrategy("usbyte", ddp_comm_hook=lambda s, b: None)
    GradschedStrategy("ddp", bucket_cap_mb=5)  # fine: PyTorch's DDP takes it
