"""``gradsched train``'s summary says what run-time auto ran, also when it never left PyTorch's DDP."""

from __future__ import annotations

from typing import Any

from gradsched.commands.train import print_report


def _result(autotune: dict[str, Any]) -> dict[str, Any]:
    return {"model": "mlp", "params": 33738, "nproc": 2, "backend": "gloo", "strategy": "auto", "operations": 1,
            "steps": 20, "batch_size": 16, "optimizer": "sgd", "iteration_s_median": 0.004,
            "iteration_s_mean": 0.005, "warmup_steps": 3, "loss_first": 2.31, "loss_last": 2.27,
            "autotune": autotune}


def _tuner(profiled_at: int | None, switches: int = 1) -> dict[str, Any]:
    first = {"iteration": 0, "strategy": "torch-ddp", "reason": "initial", "predicted_iteration_s": None,
             "measured_before_s": None}
    later = {"iteration": 40, "strategy": "usbyte", "reason": "trials", "predicted_iteration_s": 0.003,
             "measured_before_s": 0.004}
    return {"profiling_from": 5635 if profiled_at is None else 30, "profiled_at": profiled_at,
            "switches": [first, *[later] * (switches - 1)]}


def test_a_job_that_never_profiled_says_auto_ran_ddp_and_when_profiling_would_start(capsys):
    print_report(_result(_tuner(None)))
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("auto:"))
    assert "PyTorch's DDP throughout" in line and "5,635" in line and "defer=false" in line


def test_a_job_that_profiled_reports_its_switches_not_the_deferred_line(capsys):
    print_report(_result(_tuner(30, switches=2)))
    out = capsys.readouterr().out
    assert "throughout" not in out and "iteration 40: usbyte (trials)" in out
