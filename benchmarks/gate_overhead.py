"""What gating each parameter's first read costs a forward (gradsched.torch.runtime.gating).

    python benchmarks/gate_overhead.py [--models mlp,cnn,gpt2,bert] [--batch-size 32] [--reps 30]

With an overlapping plan and a ``DistributedOptimizer``, a forward that has updates pending
runs under ``FirstUse``, a ``TorchFunctionMode`` that checks every torch operation's
arguments for a parameter whose update is due.  This times, in one process and one
thread, each model's forward alone and forward plus backward, without the mode and under
it, interleaved rep by rep, in CPU time of the one thread (on a loaded machine wall-clock
time counts the waits for a core; CPU time counts the work), with the updates
themselves left out: the optimizer stand-in applies nothing, so what is measured is the
mode's own cost (every read of a parameter still costs the call that finds its group
already applied, as in training).  Also counts the torch operations of one forward
(each a call of the mode).  Prints medians and ratios; writes
benchmarks/results/gate_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from torch.overrides import TorchFunctionMode

from gradsched.torch.jobs.models import build_model
from gradsched.torch.runtime.gating import FirstUse, ForwardGate


class _Pending:
    """The optimizer as the gate sees it: updates always due, each group applied once (for nothing)."""

    def __init__(self, n: int) -> None:
        self._pending = set(range(n))

    @property
    def pending(self) -> bool:
        return True

    def is_due(self, tensor: int) -> bool:
        return tensor in self._pending

    def apply(self, tensors: list[int]) -> None:
        todo = [i for i in tensors if i in self._pending]
        self._pending.difference_update(todo)

    def reset(self, n: int) -> None:
        self._pending = set(range(n))


class _Count(TorchFunctionMode):
    """Counts the torch operations a forward runs (each one a call of the gate's mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _time(fn: Callable[[], Any]) -> float:
    """CPU seconds of this thread (one torch thread: all the work; waiting for a core not counted)."""
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def measure(name: str, batch_size: int, reps: int) -> dict[str, Any]:
    """Median seconds of forward and forward+backward, plain and under the mode."""
    spec = build_model(name, seed=0)
    module = spec.module
    params = [p for p in module.parameters() if p.requires_grad]
    x, y = spec.make_batch(batch_size, torch.Generator().manual_seed(0))
    opt = _Pending(len(params))
    gate = ForwardGate(module, params, lambda: opt)
    gate.remove()  # the mode alone: the pre-hooks are what per-module gating already cost

    def forward(mode: bool) -> Any:
        opt.reset(len(params))
        if not mode:
            return module(x)
        with FirstUse(gate, opt):
            return module(x)

    def step(mode: bool) -> None:
        spec.loss_fn(forward(mode), y).backward()
        module.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up
        step(False)
        step(True)
    times: dict[str, list[float]] = {"fwd": [], "fwd_mode": [], "step": [], "step_mode": []}
    with torch.no_grad():
        for r in range(reps):
            for mode in (r % 2 == 1, r % 2 == 0):  # alternate which goes first: no bias from the order
                times["fwd_mode" if mode else "fwd"].append(_time(lambda: forward(mode)))
    for r in range(reps):
        for mode in (r % 2 == 1, r % 2 == 0):
            times["step_mode" if mode else "step"].append(_time(lambda: step(mode)))
    med = {k: statistics.median(v) for k, v in times.items()}
    counter = _Count()
    with torch.no_grad(), counter:
        module(x)
    return {"model": name, "batch_size": batch_size, "reps": reps, "median_s": med, "ops_per_forward": counter.calls,
            "forward_ratio": med["fwd_mode"] / med["fwd"], "step_ratio": med["step_mode"] / med["step"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,gpt2,bert")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "gate_overhead.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(m, args.batch_size, args.reps) for m in args.models.split(",")]
    print(f"{'model':6s} {'ops':>5s} {'fwd ms':>8s} {'+mode':>8s} {'ratio':>6s} {'fwd+bwd ms':>11s} {'+mode':>8s} "
          f"{'ratio':>6s}")
    for r in rows:
        m = r["median_s"]
        print(f"{r['model']:6s} {r['ops_per_forward']:5d} {m['fwd'] * 1e3:8.2f} {m['fwd_mode'] * 1e3:8.2f} "
              f"{r['forward_ratio']:6.3f} {m['step'] * 1e3:11.2f} {m['step_mode'] * 1e3:8.2f} {r['step_ratio']:6.3f}")
    command = " ".join(["python benchmarks/gate_overhead.py", *(sys.argv[1:] if argv is None else argv)])
    Path(args.json).write_text(json.dumps({"command": command, "torch": torch.__version__,
                                           "clock": "thread CPU time", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
