"""``gradsched train --strategy topk|omgs --density D``: runs, reports ``peak_extra_bytes``."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from gradsched.cli import main  # noqa: E402


@pytest.mark.slow
def test_train_sparse_reports_memory_near_dense(capsys):
    common = ["train", "--nproc", "2", "--model", "mlp", "--steps", "4", "--warmup", "1", "--json"]
    out = {}
    for name, extra in (("wfbp", ["--strategy", "wfbp"]),
                        ("omgs", ["--strategy", "omgs", "--density", "0.01"]),
                        ("naive", ["--strategy", "topk", "--density", "0.01", "--sparse", "memory=naive",
                                   "--sparse", "selection=sampled"])):
        assert main(common + extra) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert out["omgs"]["strategy"] == "omgs" and out["omgs"]["density"] == 0.01
    assert out["wfbp"]["density"] is None
    params_bytes = out["wfbp"]["params"] * 4
    assert out["wfbp"]["peak_extra_bytes"] >= params_bytes  # the gradient buffer
    assert out["omgs"]["peak_extra_bytes"] <= 1.3 * out["wfbp"]["peak_extra_bytes"]
    assert out["naive"]["peak_extra_bytes"] >= 2 * params_bytes
    for r in out.values():
        assert r["loss_last"] == r["loss_last"] and r["loss_last"] > 0  # finite


def test_bad_sparse_option_is_one_line(capsys):
    assert main(["train", "--strategy", "topk", "--sparse", "memory=tiny"]) == 2
    err = capsys.readouterr().err
    assert "memory" in err and len(err.strip().splitlines()) == 1


class _MixedDtypes(torch.nn.Module):
    """bf16 layers around an fp32 one, as mixed-precision models keep norms or heads in fp32."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32).to(torch.bfloat16)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 4).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x.to(torch.bfloat16)).float().relu()
        h = self.b(h).relu()
        return self.c(h.to(torch.bfloat16)).float()


def _train_mixed_dtypes(rank: int, world: int) -> dict:
    from gradsched.torch import DistributedDataParallel, DistributedOptimizer
    from gradsched.torch.runtime.planning import profile_from_module

    out = {}
    for name, strategy, options in (("dense", "ddp", {}), ("topk", "topk", {"density": 1.0}),
                                    ("omgs", "omgs", {"density": 0.5})):
        torch.manual_seed(0)
        module = _MixedDtypes()
        model = DistributedDataParallel(module, strategy, plan_options=options)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(4):
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        plan, profile = model.plan, profile_from_module(module)  # the runtime's own profile: its tensor indices
        out[name] = {"params": {k: v.detach().float().clone() for k, v in module.named_parameters()},
                     "sizes_per_op": None if plan is None else [
                         len({profile.tensors[s.tensor].element_bytes for s in op.slices}) for op in plan.operations]}
    return out


@pytest.mark.slow
def test_sparse_plans_train_a_model_of_mixed_dtypes():
    # omgs merges layers of different dtypes; its operations are split by dtype so the runtime
    # (one dtype per sparse operation) runs them: every rank ends equal, and top-k at density 1
    # is dense training bit for bit.
    from gradsched.torch.jobs.selftest import spawn_local

    ranks = spawn_local(_train_mixed_dtypes, 2, timeout_s=120)
    for name in ("dense", "topk", "omgs"):
        a, b = ranks[0][name]["params"], ranks[1][name]["params"]
        assert all(torch.equal(a[k], b[k]) for k in a), name
    for name in ("topk", "omgs"):
        assert ranks[0][name]["sizes_per_op"] and set(ranks[0][name]["sizes_per_op"]) == {1}
    dense, topk = ranks[0]["dense"]["params"], ranks[0]["topk"]["params"]
    assert all(torch.equal(dense[k], topk[k]) for k in dense)
