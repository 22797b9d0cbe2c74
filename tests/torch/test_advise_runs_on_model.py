"""Issue 38 item 7: the advisor recommends only plans that run on the model.

A plan that overlaps the optimizer step with the next forward updates each parameter just
before its first read (the first-use gate, gradsched.torch.runtime.gating): parameters read
outside their module's forward (``nn.MultiheadAttention``'s ``out_proj``), tied and shared
weights run, so the advisor recommends overlapping plans on a transformer, and the plan it
recommends trains equal to DDP.  What the gate cannot see (a parameter's memory read through a
view held outside the module's attributes) still fails, and ``unseen_reads`` finds it: the
advisor leaves overlapping plans out on such a model and says which were left out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradsched import Cluster  # noqa: E402
from gradsched.advise import advise, format_advice  # noqa: E402
from gradsched.torch import profile_from_module  # noqa: E402
from gradsched.torch.jobs.launch import free_port  # noqa: E402
from gradsched.torch.measure.outside_reads import outside_reads, plan_check, unseen_reads  # noqa: E402


class ParentReadsChild(nn.Module):
    """A parent whose own function uses a child's weight: the child's forward never runs."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(F.linear(x, self.inner.weight, self.inner.bias))


def test_outside_reads_names_attention_out_proj_and_a_parent_read():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)
    names = outside_reads(enc, torch.randn(2, 5, 16))
    assert names == [f"layers.{i}.self_attn.out_proj.{k}" for i in (0, 1) for k in ("weight", "bias")]
    assert outside_reads(nn.MultiheadAttention(8, 2), lambda: (torch.randn(3, 1, 8),) * 3) == \
        ["out_proj.weight", "out_proj.bias"]
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    assert outside_reads(ParentReadsChild(), (x, y), F.mse_loss) == ["inner.weight", "inner.bias"]


def test_outside_reads_finds_none_in_plain_tied_and_unused_parameters():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert outside_reads(mlp, (torch.randn(3, 4), torch.randn(3, 2)), F.mse_loss) == []
    emb, head = nn.Embedding(10, 6), nn.Linear(6, 10, bias=False)
    head.weight = emb.weight  # tied: read by the head's forward, which runs
    lm = nn.Sequential(emb, head)
    ids = torch.randint(0, 10, (2, 5))
    assert outside_reads(lm, (ids, ids), lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten())) == []
    unused = nn.ModuleDict({"used": nn.Linear(4, 2), "spare": nn.Linear(4, 2)})
    unused.forward = lambda x: unused["used"](x)  # type: ignore[method-assign]
    assert outside_reads(unused, torch.randn(3, 4)) == []  # no gradient: nothing to gate


def test_grads_are_left_alone():
    m = nn.Linear(4, 2)
    outside_reads(m, torch.randn(3, 4))
    assert m.weight.grad is None


class HiddenView(nn.Module):
    """A view of a parameter's memory made at construction and kept in a list (not a module attribute
    tensor): read before the parameter's module runs, it passes no gate and reads the weight before its
    update (an overlapping plan trains to other parameters than DDP)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.views = [self.inner.weight.detach().t()]

    def forward(self, x):
        return self.inner(torch.tanh(x @ self.views[0]))


class AttributeView(HiddenView):
    """The same view as a module attribute: the gate finds it at wrap time and updates before the read."""

    def __init__(self):
        super().__init__()
        self.view = self.views.pop()

    def forward(self, x):
        return self.inner(torch.tanh(x @ self.view))


def _encoder() -> nn.Module:
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True), 2,
                                 enable_nested_tensor=False)


def test_unseen_reads_finds_only_what_the_first_use_gate_cannot_see():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)
    assert outside_reads(enc, torch.randn(2, 5, 16))  # read outside their module: the gate handles them
    assert unseen_reads(enc, torch.randn(2, 5, 16)) == []
    assert unseen_reads(nn.MultiheadAttention(8, 2), lambda: (torch.randn(3, 1, 8),) * 3) == []
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    assert unseen_reads(ParentReadsChild(), (x, y), F.mse_loss) == []
    emb, head = nn.Embedding(10, 6), nn.Linear(6, 10, bias=False)
    head.weight = emb.weight
    ids = torch.randint(0, 10, (2, 5))
    assert unseen_reads(nn.Sequential(emb, head), (ids, ids),
                        lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten())) == []
    assert unseen_reads(AttributeView(), torch.randn(3, 4)) == []
    assert unseen_reads(HiddenView(), torch.randn(3, 4)) == ["inner.weight"]


def test_an_hf_model_with_its_own_batch_and_loss_runs_every_plan():
    """As the Trainer feeds it: a dict with ``labels``, the model's own loss (HF GPT-2, tied lm_head)."""
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 32, (2, 8))
    assert unseen_reads(model, {"input_ids": ids, "labels": ids}) == []


def test_unseen_reads_leaves_the_model_and_the_random_state_as_they_were():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    x = torch.randn(3, 4)
    running = model[1].running_mean.clone()
    torch.manual_seed(5)
    unseen_reads(model, x)
    after = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(4))
    assert torch.equal(model[1].running_mean, running)
    assert all(p.grad is None for p in model.parameters())


def _timed(profile):
    # 1 ms forward, 2 ms backward per tensor, 1 MB/s-ish links: overlapping the next forward (usbyte) wins
    return replace(profile, tensors=tuple(replace(t, forward_s=1e-3, backward_s=2e-3) for t in profile.tensors))


def test_a_transformer_gets_a_best_plan_that_overlaps_the_next_forward():
    enc = _encoder()
    profile, cluster = _timed(profile_from_module(enc)), Cluster.alpha_beta(1e-4, 1e-6, 4)
    free = advise(profile, cluster, (1, 25))
    checked = advise(profile, cluster, (1, 25), plan_check=plan_check(enc, torch.randn(4, 6, 32)))
    assert free.gradsched_overlaps_forward and not free.gradsched_rejected
    assert checked == free  # nothing refused: the overlapping plan runs on nn.TransformerEncoder


class EncoderAfterHiddenView(nn.Module):
    """The transformer of the test above behind a layer read first through a view held in a list."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(32, 32)
        self.views = [self.inner.weight.detach().t()]
        self.encoder = _encoder()

    def forward(self, x):
        return self.encoder(self.inner(torch.tanh(x @ self.views[0])))


def test_a_model_the_gate_cannot_see_gets_a_best_plan_that_does_not_overlap_the_next_forward():
    model = EncoderAfterHiddenView()
    assert unseen_reads(model, torch.randn(4, 6, 32)) == ["inner.weight"]
    profile, cluster = _timed(profile_from_module(model)), Cluster.alpha_beta(1e-4, 1e-6, 4)
    free = advise(profile, cluster, (1, 25))
    checked = advise(profile, cluster, (1, 25), plan_check=plan_check(model, torch.randn(4, 6, 32)))
    assert free.gradsched_overlaps_forward
    assert not checked.gradsched_overlaps_forward
    assert checked.gradsched_rejected[0].startswith(f"{free.gradsched_strategy}: it steps the optimizer")
    assert "inner.weight is read where the first-use gate cannot see it" in checked.gradsched_rejected[0]
    assert "does not overlap the next forward" in checked.gradsched_rejected[0]  # the remedy
    assert checked.gradsched_predicted_s > free.gradsched_predicted_s
    assert "were left out" in format_advice(checked) and free.gradsched_strategy in format_advice(checked)


WORKER = r"""
import json
from dataclasses import replace
import torch, torch.distributed as dist
from torch import nn
import torch.nn.functional as F
import gradsched.torch
from gradsched import Cluster
from gradsched.advise import advise
from gradsched.torch.jobs.selftest import SMALL_MODEL_OPTIONS, rel_diff
from gradsched.torch.measure.outside_reads import plan_check
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def train(strategy):
    module = encoder()
    if strategy == "reference":
        model, opt = gradsched.torch.DistributedDataParallel(module, "ddp"), None
    else:
        model = gradsched.torch.DistributedDataParallel(module, strategy, plan_options=SMALL_MODEL_OPTIONS.get(strategy),
                                                        use_torch_ddp=False, timeout_s=60)
    inner = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt = inner if strategy == "reference" else gradsched.torch.DistributedOptimizer(inner, model)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        opt.zero_grad()
        x, y = torch.randn(4 * world, 6, 32, generator=gen), torch.randn(4 * world, 6, 32, generator=gen)
        F.mse_loss(model(x[rank::world]), y[rank::world]).backward()
        opt.step()
    overlapped = model.overlaps_forward
    model.synchronize()
    return [p.detach().clone() for p in module.parameters()], overlapped


enc = encoder()
live = gradsched.torch.advise(enc, torch.randn(4, 6, 32), iterations=2, net_reps=1, buckets_mb=(1, 25))
# a profile and links where overlapping the next forward wins (as the offline test), checked on the live model
sizes = gradsched.torch.profile_from_module(enc)
timed = replace(sizes, tensors=tuple(replace(t, forward_s=1e-3, backward_s=2e-3) for t in sizes.tensors))
slow = advise(timed, Cluster.alpha_beta(1e-4, 1e-6, world), (1, 25), plan_check=plan_check(enc, torch.randn(4, 6, 32)))
reference, _ = train("reference")
out = {"live": live.to_dict(), "slow": slow.to_dict()}
for key, advice in (("live", live), ("slow", slow)):
    params, overlapped = train(advice.gradsched_strategy)
    out[key + "_rel_diff"], out[key + "_overlapped"] = rel_diff(params, reference), overlapped
print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_live_advice_on_a_transformer_recommends_a_plan_that_runs_and_trains_equal_to_ddp():
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs[0]["live"] == outs[1]["live"]
    for o in outs:
        assert not o["live"]["gradsched_rejected"] and not o["slow"]["gradsched_rejected"]  # nothing refused
        assert o["slow"]["gradsched_overlaps_forward"] and o["slow_overlapped"]  # an overlapping plan ran
        assert o["slow_rel_diff"] <= 1e-5 and o["live_rel_diff"] <= 1e-5, o
