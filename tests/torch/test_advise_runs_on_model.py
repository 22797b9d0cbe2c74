"""Issue 38 item 7: the advisor recommends only plans that run on the model.

A plan that overlaps the optimizer step with the next forward gates each module's forward;
a parameter read outside its module's forward (``nn.MultiheadAttention``'s ``out_proj``)
passes no gate.  ``outside_reads`` finds such parameters; the live advisor refuses
overlapping plans on such a model and says which were left out."""

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
from gradsched.torch.measure.outside_reads import outside_reads, plan_check  # noqa: E402


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


def test_a_transformer_gets_a_best_plan_that_does_not_overlap_the_next_forward():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True), 2, enable_nested_tensor=False)
    batch = torch.randn(4, 6, 32)
    sizes = profile_from_module(enc)
    # 1 ms forward, 2 ms backward per tensor, 1 MB/s-ish links: overlapping the next forward (usbyte) wins
    profile = replace(sizes, tensors=tuple(replace(t, forward_s=1e-3, backward_s=2e-3) for t in sizes.tensors))
    cluster = Cluster.alpha_beta(1e-4, 1e-6, 4)
    free = advise(profile, cluster, (1, 25))
    checked = advise(profile, cluster, (1, 25), plan_check=plan_check(enc, batch))
    assert free.gradsched_overlaps_forward and not free.gradsched_rejected
    assert not checked.gradsched_overlaps_forward
    assert checked.gradsched_rejected[0].startswith(f"{free.gradsched_strategy}: it steps the optimizer")
    assert "layers.0.self_attn.out_proj.weight and 3 more are read" in checked.gradsched_rejected[0]
    assert checked.gradsched_predicted_s > free.gradsched_predicted_s
    assert "were left out" in format_advice(checked) and free.gradsched_strategy in format_advice(checked)


WORKER = r"""
import json
import torch, torch.distributed as dist
from torch import nn
import gradsched.torch
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True), 2, enable_nested_tensor=False)
advice = gradsched.torch.advise(enc, torch.randn(4, 6, 32), iterations=2, net_reps=1, buckets_mb=(1, 25))
print(json.dumps(advice.to_dict()), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_live_advice_on_a_transformer_recommends_a_plan_that_runs():
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
    assert outs[0] == outs[1]
    assert outs[0]["gradsched_overlaps_forward"] is False
    assert all("out_proj" in r for r in outs[0]["gradsched_rejected"])
