"""Peak extra memory of sparse training: naive layout vs LaySA-style, against dense gradsched training.

"Extra" = every buffer the runtime allocates (its MemoryLedger: flat gradient buffers,
residuals, value/index buffers, rebuilt results) plus the gradient autograd hands to
each hook until the runtime releases it; parameters and optimizer state are not
counted.  2 gloo ranks on this machine, 3 SGD steps, density 0.01.  The last two
columns leave out autograd's gradients (the runtime's own buffers alone).

    python benchmarks/sparse_memory.py [--model vgg]   # table + benchmarks/results/sparse_memory.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).parent / "results" / "sparse_memory.json"
CASES = [("dense wfbp", "wfbp", None), ("dense sync", "sync", None),
         ("topk naive", "topk", "naive"), ("omgs naive", "omgs", "naive"),
         ("topk laysa", "topk", "laysa"), ("omgs laysa", "omgs", "laysa")]


def worker(rank: int, world: int, model_name: str, density: float) -> dict:
    import torch

    from gradsched.torch import DistributedDataParallel, DistributedOptimizer, build_model

    torch.set_num_threads(1)
    out = {}
    for label, strategy, memory in CASES:
        spec = build_model(model_name, seed=0)
        opts = {"density": density} if memory else None
        model = DistributedDataParallel(spec.module, strategy, plan_options=opts,
                                        sparse_options={"memory": memory} if memory else None)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x, y = spec.make_batch(4, gen)
            opt.zero_grad()
            spec.loss_fn(model(x), y).backward()
            opt.step()
        model.synchronize()
        stats = model.memory_stats()
        out[label] = {"peak_extra_bytes": stats["peak_bytes"], "live_bytes": stats["live_bytes"],
                      "peak_held_bytes": stats["peak_held_bytes"],
                      "operations": len(model.plan.operations),
                      "params_bytes": sum(p.numel() * p.element_size() for p in spec.module.parameters()),
                      "largest_tensor_bytes": max(p.numel() * p.element_size() for p in spec.module.parameters())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg")
    ap.add_argument("--density", type=float, default=0.01)
    args = ap.parse_args(argv)
    from gradsched.torch.jobs.selftest import spawn_local

    res = spawn_local(worker, 2, args.model, args.density, timeout_s=300)
    r0 = res[0]
    dense = r0["dense wfbp"]["peak_extra_bytes"]
    params = r0["dense wfbp"]["params_bytes"]
    print(f"{args.model}: parameters {params / 2**20:.1f} MiB (largest tensor "
          f"{r0['dense wfbp']['largest_tensor_bytes'] / params:.0%}), 2 ranks, density {args.density}")
    held_dense = r0["dense wfbp"]["peak_held_bytes"]
    print(f"{'case':14s} {'ops':>4s} {'peak extra MiB':>15s} {'x params':>9s} {'x dense wfbp':>13s}"
          f" {'held only MiB':>14s} {'x dense':>8s}")
    for label, r in r0.items():
        peak = max(x[label]["peak_extra_bytes"] for x in res)
        held = max(x[label]["peak_held_bytes"] for x in res)
        r["peak_extra_bytes"], r["peak_held_bytes"] = peak, held
        print(f"{label:14s} {r['operations']:4d} {peak / 2**20:15.2f} {peak / params:9.2f} {peak / dense:13.2f}"
              f" {held / 2**20:14.2f} {held / held_dense:8.2f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"model": args.model, "density": args.density, "world_size": 2, "cases": r0},
                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
