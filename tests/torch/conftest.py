"""Shared set-up of the runtime tests: one compute thread per process (2-core CI machines)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from helpers import preload_dynamo  # noqa: E402

preload_dynamo()  # spawned ranks start with torch._dynamo imported (tests/torch/helpers.py)


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """A one-rank gloo process group in this process, for a test module's in-process runtime tests."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
