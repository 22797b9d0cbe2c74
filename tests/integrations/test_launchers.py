"""Issue 38 item 6: Accelerate and the HF Trainer as their users launch them, with gradsched's advice and hooks.

The documented commands of docs/integrations.md, run as written (fewer steps): each
example with the advisor's bucket size and a plain all-reduce hook of gradsched's must
end where the plain framework ends (the hook averages exactly; bucket sizes do not change
the sums of two ranks), on 2 CPU processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.torch.hooks import allreduce_hook, register_hook  # noqa: E402
from gradsched.torch.jobs.launch import free_port  # noqa: E402
from gradsched.torch.jobs.selftest import rel_diff  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TOLERANCE = 1e-5


def _run(argv: list[str], timeout_s: float = 400) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def _accelerate(script: str, *extra: str) -> list[str]:
    # the documented command: accelerate launch --multi_gpu --num_processes 2 examples/...
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
            str(free_port()), f"examples/{script}", *extra]


def _torchrun(script: str, *extra: str) -> list[str]:
    # the documented command: torchrun --nproc-per-node 2 examples/...
    return [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), f"examples/{script}",
            *extra]


def _params(path: Path) -> list:
    saved = torch.load(path)
    return [saved["params"][k] for k in sorted(saved["params"])]


@pytest.mark.slow
def test_accelerate_launch_runs_two_cpu_processes_with_advice_and_a_hook(tmp_path):
    out = _run(_accelerate("accelerate_train.py", "--steps", "4", "--advise", "--hook", "allreduce",
                           "--out", str(tmp_path / "g.pt")))
    assert "2 processes, DistributedType.MULTI_CPU" in out
    assert "gradsched advise: bucket_cap_mb=" in out
    assert "gradsched hook allreduce registered on DistributedDataParallel" in out
    _run(_accelerate("accelerate_train.py", "--steps", "4", "--reference", "--out", str(tmp_path / "r.pt")))
    assert rel_diff(_params(tmp_path / "g.pt"), _params(tmp_path / "r.pt")) <= TOLERANCE


@pytest.mark.slow
def test_the_trainer_under_torchrun_takes_the_advice_and_a_hook(tmp_path):
    out = _run(_torchrun("hf_trainer.py", "--steps", "4", "--advise", "--hook", "allreduce",
                         "--out", str(tmp_path / "g.pt")))
    assert "gradsched advise: ddp_bucket_cap_mb=" in out
    assert "2 processes, trained 4 steps" in out and "hook allreduce on DistributedDataParallel" in out
    _run(_torchrun("hf_trainer.py", "--steps", "4", "--reference", "--out", str(tmp_path / "r.pt")))
    assert rel_diff(_params(tmp_path / "g.pt"), _params(tmp_path / "r.pt")) <= TOLERANCE


@pytest.mark.slow
def test_accelerate_launch_cpu_starts_one_process(tmp_path):
    """Why the docs do not say ``accelerate launch --cpu --num_processes 2``: it starts one process."""
    script = tmp_path / "count.py"
    script.write_text("import os\nprint('WORLD_SIZE', os.environ.get('WORLD_SIZE', 'unset'), flush=True)\n")
    out = _run([str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", str(script)], timeout_s=120)
    assert out.count("WORLD_SIZE") == 1 and "WORLD_SIZE unset" in out


def test_register_hook_refuses_a_bare_module_when_several_processes_were_launched(monkeypatch, caplog):
    module = torch.nn.Linear(2, 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(GradschedError, match=r"Accelerator\(cpu=True\)"):
        register_hook(module, None, allreduce_hook)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert register_hook(module, None, allreduce_hook) is None
    assert "accelerate launch --cpu" in caplog.text
