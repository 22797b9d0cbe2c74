"""Shared set-up of the runtime tests: one compute thread per process (2-core CI machines), and the runtime
tests' shared helpers (tests/torch/helpers.py) importable as ``helpers``, as in tests/torch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "torch"))

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from helpers import preload_dynamo  # noqa: E402

preload_dynamo()  # spawned ranks start with torch._dynamo imported (tests/torch/helpers.py)
