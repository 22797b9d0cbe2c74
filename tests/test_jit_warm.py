"""``python -m gradsched.jit`` compiles every kernel a plan uses: a later process loads them all from
numba's cache and compiles nothing (scripts/test.sh warms once so that the workers do not compile)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gradsched

pytest.importorskip("numba")

PACKAGE = Path(gradsched.__file__).parent


def _cache(env: dict[str, str]) -> dict[Path, float]:
    root = Path(env["NUMBA_CACHE_DIR"]) if "NUMBA_CACHE_DIR" in env else PACKAGE
    return {p: p.stat().st_mtime for p in root.rglob("*") if p.suffix in (".nbi", ".nbc")}


def test_after_warming_a_large_plan_of_every_compiled_planner_compiles_nothing():
    env = {**os.environ, "GRADSCHED_JIT": "1"}
    subprocess.run([sys.executable, "-m", "gradsched.jit"], env=env, check=True, capture_output=True)
    warmed = _cache(env)
    assert any(p.name.startswith("_kernel") for p in warmed) and any(p.name.startswith("_usbyte_jit") for p in warmed)
    code = ("from gradsched.synthetic import random_case; from gradsched.planners import make_plan; "
            "from gradsched.sim import simulate; c = random_case(7, 300); p, cl = c.profile(), c.cluster(); "
            "[simulate(make_plan(n, p, cl), p, cl, timeline=False) for n in ('usbyte', 'dear', 'optimal', 'auto')]")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    assert _cache(env) == warmed  # nothing compiled or rewritten
