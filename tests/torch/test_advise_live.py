"""``gradsched.torch.advise`` on a live 2-rank gloo group: the same advice on every rank,
the model left untouched, the advice the offline advisor gives on what was measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from gradsched.advise import Point, least_regret  # noqa: E402
from gradsched.torch.jobs.launch import free_port  # noqa: E402

WORKER = r"""
import json, os
import torch, torch.distributed as dist
import gradsched.torch
from gradsched.torch import build_model
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
spec = build_model("mlp")
before = [p.detach().clone() for p in spec.module.parameters()]
x, y = spec.make_batch(8, torch.Generator().manual_seed(1))
advice = {str(c): gradsched.torch.advise(spec.module, (x, y), loss_fn=spec.loss_fn, iterations=2, net_reps=1,
                                         buckets_mb=(1, 5, 25), contention=c).to_dict() for c in (False, True)}
same = all(torch.equal(a, p) for a, p in zip(before, spec.module.parameters()))
print(json.dumps({"advice": advice, "untouched": same}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_live_advice_is_the_same_on_every_rank():
    """Each rank advises twice in one job, without and with the contention probe."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["untouched"] for r in results)
    for contention in (False, True):
        a = results[0]["advice"][str(contention)]
        assert results[1]["advice"][str(contention)] == a
        assert a["world_size"] == 2 and a["model"]
        assert a["ddp_bucket_cap_mb"] in (1, 5, 25)
        sweep = [Point(**p) for p in a["ddp_sweep"]]
        assert a["ddp_bucket_cap_mb"] == least_regret(sweep).bucket_mb  # the fastest, unless contention figures
        assert all((p.predicted_idle_s is not None) == contention for p in sweep)
        assert a["ddp_predicted_s"] > 0 and a["gradsched_predicted_s"] > 0


def test_the_network_is_measured_up_to_the_whole_gradient():
    from gradsched.torch.measure.advisor import MIN_NET_BYTES, net_top_bytes
    from gradsched.torch.measure.netbench import sizes_bytes

    for total in (1, 5000, 1 << 20, (1 << 20) + 1, 55_011_624):
        top = net_top_bytes(total)
        assert max(sizes_bytes(MIN_NET_BYTES, top)) >= total  # the table covers the largest bucket
        assert top <= 2 * max(total, MIN_NET_BYTES)  # and not much more
    assert net_top_bytes(55_011_624) == 64 << 20 and net_top_bytes(1 << 40) == 256 << 20
