"""Peak memory of sparse training, measured from the process beside the runtime's own ledger.

Each case runs in fresh processes (2 gloo ranks on this machine, the ``gradsched train``
defaults: batch 16, SGD with momentum, 12 steps), so the process's high-water mark is
the case's own: peak RSS (``VmHWM`` in ``/proc/self/status``; on CUDA the allocator's
``max_memory_allocated``) is measured on every rank and the larger is reported.  Beside
it, the ledger's figure (every buffer the runtime books, plus the gradient autograd
hands to each hook: docs/sparse.md).  The RSS includes the interpreter, torch, the
model, its activations and the optimizer state, so it is compared with dense gradsched
training and PyTorch's DDP on the same model and batches.

    python benchmarks/sparse_memory.py [--model vgg] [--steps 12] [--repeats 2]
    # table + benchmarks/results/sparse_memory.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

OUT = Path(__file__).parent / "results" / "sparse_memory.json"
CASES = {"torch ddp": ("ddp", None), "dense wfbp": ("wfbp", None),
         "topk naive": ("topk", "naive"), "topk laysa": ("topk", "laysa"), "omgs laysa": ("omgs", "laysa")}


def _vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def worker(rank: int, world: int, label: str, model_name: str, density: float, steps: int, batch: int) -> dict:
    import torch

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    torch.set_num_threads(1)
    strategy, memory = CASES[label]
    spec = build_model(model_name, seed=0)
    model = DistributedDataParallel(spec.module, strategy, plan_options={"density": density} if memory else None,
                                    sparse_options={"memory": memory} if memory else None)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model)
    gen = torch.Generator().manual_seed(rank)
    batches = [spec.make_batch(batch, gen) for _ in range(min(steps, 8))]
    start_rss = _vm_hwm_bytes()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        opt.zero_grad()
        spec.loss_fn(model(x), y).backward()
        opt.step()
    model.synchronize()
    stats = model.memory_stats() or {}
    return {"peak_rss_bytes": _vm_hwm_bytes(), "rss_before_training_bytes": start_rss,
            "ledger_peak_bytes": stats.get("peak_bytes"), "ledger_peak_held_bytes": stats.get("peak_held_bytes"),
            "operations": len(model.plan.operations) if model.plan is not None else None,
            "params_bytes": sum(p.numel() * p.element_size() for p in spec.module.parameters()),
            "largest_tensor_bytes": max(p.numel() * p.element_size() for p in spec.module.parameters())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="fresh runs per case (the median is reported)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    from gradsched.torch.jobs.selftest import spawn_local

    cases: dict[str, dict] = {}
    for label in args.cases.split(","):
        runs = [spawn_local(worker, 2, label, args.model, args.density, args.steps, args.batch_size, timeout_s=600)
                for _ in range(args.repeats)]
        peaks = [max(r["peak_rss_bytes"] for r in run) for run in runs]
        r0 = runs[0][0]
        cases[label] = {**r0, "peak_rss_bytes": statistics.median(peaks), "peak_rss_runs_bytes": peaks,
                        "ledger_peak_bytes": max((r["ledger_peak_bytes"] or 0) for run in runs for r in run) or None}
    _report(args, cases)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": args.model, "density": args.density, "world_size": 2,
                                          "steps": args.steps, "batch_size": args.batch_size,
                                          "repeats": args.repeats, "cases": cases}, indent=1) + "\n")
    return 0


def _report(args: argparse.Namespace, cases: dict[str, dict]) -> None:
    mib = 2 ** 20
    any_case = next(iter(cases.values()))
    print(f"{args.model}: parameters {any_case['params_bytes'] / mib:.1f} MiB (largest tensor "
          f"{any_case['largest_tensor_bytes'] / any_case['params_bytes']:.0%}), 2 gloo ranks, density "
          f"{args.density}, {args.steps} steps of batch {args.batch_size}, median of {args.repeats} runs")
    dense = cases.get("dense wfbp", any_case)
    print(f"{'case':12s} {'ops':>4s} {'peak RSS MiB':>13s} {'runs MiB':>16s} {'x dense':>8s} {'ledger MiB':>11s}"
          f" {'ledger x dense':>15s}")
    for label, c in cases.items():
        runs = "/".join(f"{p / mib:.0f}" for p in c["peak_rss_runs_bytes"])
        ledger = c["ledger_peak_bytes"]
        led = f"{ledger / mib:11.1f} {ledger / dense['ledger_peak_bytes']:15.2f}" if ledger and \
            dense.get("ledger_peak_bytes") else f"{'-':>11s} {'-':>15s}"
        print(f"{label:12s} {c['operations'] or '-':>4} {c['peak_rss_bytes'] / mib:13.1f} {runs:>16s}"
              f" {c['peak_rss_bytes'] / dense['peak_rss_bytes']:8.3f} {led}")


if __name__ == "__main__":
    sys.exit(main())
