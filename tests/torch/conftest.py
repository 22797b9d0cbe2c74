"""Shared set-up of the runtime tests: one compute thread per process (2-core CI machines)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)
