"""The DDP drop-in (issue 18, item 1): DDP's constructor arguments, the default plan, an unmodified script.

The script test runs tests/torch/scripts/ddp_train.py (AdamW, OneCycleLR, BatchNorm,
gradient clipping, DistributedSampler, DDP's constructor arguments,
``init_process_group()`` without a backend) under torchrun as it is, and again with only
its import line changed to gradsched's, and compares what the two runs saved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch import DistributedDataParallel  # noqa: E402
from gradsched.torch.runtime.groups import backend_for, control_device_type  # noqa: E402
from gradsched.torch.jobs.selftest import free_port, rel_diff  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"
TORCH_IMPORT = "from torch.nn.parallel import DistributedDataParallel as DDP"
GRADSCHED_IMPORT = "from gradsched.torch import DistributedDataParallel as DDP"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """A one-rank process group in this process (no backend named, as the script does)."""
    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group(init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.Linear(64, 2))


def test_backend_of_each_device_from_the_configuration():
    assert backend_for("cpu:gloo,cuda:nccl", "cuda") == "nccl"
    assert backend_for("cpu:gloo,cuda:nccl", "cpu") == "gloo"
    assert backend_for("nccl", "cuda") == "nccl" and backend_for("gloo", "cuda") == "gloo"
    assert backend_for("cuda:nccl", "cpu") == ""
    # where the start-up check's and object broadcasts' small tensors go
    assert [control_device_type(c) for c in ("gloo", "cpu:gloo,cuda:nccl", "nccl", "cuda:nccl")] == \
        ["cpu", "cpu", "cuda", "cuda"]


def test_default_is_auto_with_pytorch_ddp_among_its_candidates_and_honours_bucket_cap_mb(world_of_one):
    assert backend_for(str(dist.get_backend_config()), "cpu") == "gloo"  # init without a backend: gloo on CPU
    model = DistributedDataParallel(_net())
    # run-time auto, starting on PyTorch's DDP at the user's bucket size (its default here); it profiles later on
    # DDP's buckets on gradsched's executor, once the trials' budget pays for it (gradsched.tuning.schedule)
    assert model.strategy == "auto" and model.autotuner is not None and model._ddp is not None
    assert model.plan.strategy == "torch-ddp" and model.plan.options == {"bucket_cap_mb": 25.0, "default": True}
    initial = model.autotuner._tried[model.autotuner._initial][1]
    assert initial.strategy == "ddp" and initial.options["bucket_cap_mb"] == 25.0
    assert model.autotuner.config.torch_ddp and model._ddp_cap_mb == 25.0  # PyTorch's DDP among the candidates
    assert model.autotuner.config.max_replans == 0  # the trials' winner stays: no re-plan to an unmeasured plan
    def wide() -> nn.Module:  # 2.1 MB; one module per wrapper (a module wrapped twice is refused)
        return nn.Sequential(nn.Linear(8, 512), nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 2))

    default = DistributedDataParallel(wide())
    small = DistributedDataParallel(wide(), bucket_cap_mb=0.5)  # the initial buckets and PyTorch DDP's candidate
    assert small.plan.options["bucket_cap_mb"] == 0.5 and small._ddp_cap_mb == 0.5
    assert len(small.plan.operations) > len(default.plan.operations)
    assert DistributedDataParallel(wide(), "auto", bucket_cap_mb=0.5)._ddp_cap_mb == 0.5
    torch_ddp = DistributedDataParallel(_net(), "ddp", bucket_cap_mb=0.005)  # PyTorch's DDP gets it too
    assert torch_ddp._ddp is not None and torch_ddp._ddp.bucket_bytes_cap == int(0.005 * 1024 * 1024)


def test_ddp_arguments_with_ddps_meaning(world_of_one):
    assert DistributedDataParallel(_net(), static_graph=True)._find_unused  # DDP then tolerates unused parameters
    quiet = DistributedDataParallel(_net(), broadcast_buffers=False)
    assert not quiet._broadcast_buffers and quiet._ctrl is None
    DistributedDataParallel(_net(), dim=0, check_reduction=True, gradient_as_bucket_view=True, init_sync=False)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    assert DistributedDataParallel(_net(), device_mesh=mesh)._group is mesh.get_group()
    with pytest.raises(GradschedError, match="1-D"):
        DistributedDataParallel(_net(), device_mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp")))
    with pytest.raises(GradschedError, match="not both"):
        DistributedDataParallel(_net(), process_group=dist.group.WORLD, device_mesh=mesh)


@pytest.mark.parametrize("args,kwargs,match", [
    ((), {"device_ids": [0]}, "device_ids applies to a module on one accelerator"),
    (([0],), {}, "device_ids applies to a module on one accelerator"),  # DDP(model, [rank]): positional device_ids
    ((), {"output_device": 0}, "output_device applies to single-device GPU modules"),
    ((), {"mixed_precision": object()}, "mixed_precision is not supported"),
    ((), {"delay_all_reduce_named_params": [("w", None)]}, "delay_all_reduce_named_params is not supported"),
    (("wfbp",), {"bucket_cap_mb": 5}, "bucket_cap_mb sets DDP's bucket size"),
    ((), {"bucket_cap_mb": -1}, "bucket_cap_mb must be above 0"),
    ((), {"bucket_cap_mb": float("inf")}, "bucket_cap_mb must be a finite number"),
    ((), {"timeout_s": float("nan")}, "timeout_s must be a finite number"),
])
def test_what_cannot_be_honoured_is_a_clear_error(world_of_one, args, kwargs, match):
    with pytest.raises(GradschedError, match=match):
        DistributedDataParallel(_net(), *args, **kwargs)


def test_an_unknown_argument_is_a_type_error_as_in_ddp(world_of_one):
    with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_size'"):
        DistributedDataParallel(_net(), bucket_size=5)


def _torchrun(script: Path, out: Path, tries: int = 1) -> None:
    """``torchrun`` of ``script`` on 2 local ranks; ``tries`` > 1: again where a rank aborted in PyTorch's own
    teardown (the reference, PyTorch's DDP: once in a fresh-clone CI a rank died with "terminate called
    without an active exception" after its last epoch, in ``destroy_process_group``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0 and tries > 1 and "terminate called without an active exception" in proc.stderr:
        return _torchrun(script, out, tries - 1)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.slow
def test_unmodified_ddp_script_with_only_the_import_changed_reaches_ddps_parameters(tmp_path):
    source = SCRIPT.read_text()
    assert source.count(TORCH_IMPORT) == 1
    swapped = tmp_path / "gradsched_train.py"
    swapped.write_text(source.replace(TORCH_IMPORT, GRADSCHED_IMPORT))
    _torchrun(SCRIPT, tmp_path / "ddp.pt", tries=2)  # PyTorch's own DDP: its teardown aborted once (above)
    _torchrun(swapped, tmp_path / "gradsched.pt")
    ref, got = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "gradsched.pt")
    assert got.keys() == ref.keys() and any("running_mean" in k for k in ref)
    assert rel_diff([got[k] for k in ref], [ref[k] for k in ref]) <= TOLERANCE
