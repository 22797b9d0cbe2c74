"""gradsched's DDP communication hooks on PyTorch's own DDP: bytes each rank sends, step time, loss.

2 gloo ranks on this machine (loopback, one compute thread each), the built-in ``cnn``
model (309k parameters, 1.2 MB of fp32 gradients), SGD with momentum, the same seeded
data for every hook.  Bytes are what each rank hands to the collectives per iteration
after warm-up (all-reduce: the bucket; top-k: values plus int32 indices), counted in
the hooks.  "params vs plain": the final parameters' largest difference from plain DDP's,
relative to each tensor's largest magnitude (40 steps of ``cnn`` amplify any rounding:
this is of order 1 for fp16 too, not a measure of quality).  Step times over loopback on 2 shared cores
say little about a slow network; the bytes do.

    python benchmarks/comm_hooks.py [--model cnn] [--steps 40]   # table + benchmarks/results/comm_hooks.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "comm_hooks.json"
CASES = ["plain DDP", "fp16", "bf16", "topk 1%", "merged topk 1%", "fp16 + topk 1%"]
WARMUP = 2


def _case(name: str, counter: dict):
    from gradsched.integrations import hooks as H

    def counting(hook):
        def counted(state, bucket: H.dist.GradBucket) -> H.torch.futures.Future[H.torch.Tensor]:
            if counter["iteration"] >= WARMUP:
                counter["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
            counter["iteration"] += bucket.is_last()
            return hook(state, bucket)
        return counted

    dense = counting(H.allreduce_hook)
    topk = H.TopKState(density=0.01, warmup_steps=WARMUP)
    return {"plain DDP": (None, None), "fp16": (None, H.fp16_wrapper(dense)), "bf16": (None, H.bf16_wrapper(dense)),
            "topk 1%": (topk, H.topk_hook),
            "merged topk 1%": (H.TopKState(density=0.01, warmup_steps=WARMUP, merge_bytes=float("inf")),
                               H.merged_topk_hook),
            "fp16 + topk 1%": (topk, H.fp16_wrapper(H.topk_hook))}[name]


def worker(rank: int, world: int, model_name: str, steps: int) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from gradsched.torch import build_model
    from gradsched.torch.jobs.selftest import rel_diff

    out, plain = {}, None
    for name in CASES:
        spec = build_model(model_name, seed=0)
        ddp = TorchDDP(spec.module)
        counter = {"bytes": 0, "iteration": 0}
        state, hook = _case(name, counter)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
        gen = torch.Generator().manual_seed(rank)
        times, losses = [], []
        for _ in range(steps):
            x, y = spec.make_batch(16, gen)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = spec.loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
        numel = sum(p.numel() for p in spec.module.parameters())
        if state is not None:  # top-k: values (bucket dtype) + int32 indices, after warm-up
            value_bytes = 2 if "fp16" in name else 4
            sent = state.sent_elements
            counter["bytes"] = sent * (value_bytes + 4)
        elif hook is None:
            counter["bytes"] = numel * 4 * (steps - WARMUP)
        out[name] = {"bytes_per_step": counter["bytes"] / (steps - WARMUP), "dense_bytes_per_step": numel * 4,
                     "median_step_ms": 1e3 * statistics.median(times[WARMUP:]),
                     "loss_first5": sum(losses[:5]) / 5, "loss_last5": sum(losses[-5:]) / 5}
        final = [p.detach().clone() for p in spec.module.parameters()]
        plain = plain or final
        out[name]["rel_diff_vs_plain"] = rel_diff(final, plain)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", default=str(OUT))
    args = ap.parse_args(argv)
    from gradsched.torch.jobs.selftest import spawn_local

    rows = spawn_local(worker, 2, args.model, args.steps, timeout_s=600)[0]
    print(f"{args.model}, 2 gloo ranks (loopback), {args.steps} steps; bytes per rank and step after warm-up")
    print(f"{'hook':18s} {'bytes/step':>12s} {'vs dense':>9s} {'median ms':>10s} {'params vs plain':>16s}")
    for name, r in rows.items():
        print(f"{name:18s} {r['bytes_per_step']:12.0f} {r['bytes_per_step'] / r['dense_bytes_per_step']:9.3f} "
              f"{r['median_step_ms']:10.1f} {r['rel_diff_vs_plain']:16.2e}")
    result = {"model": args.model, "world_size": 2, "backend": "gloo", "steps": args.steps, "warmup_steps": WARMUP,
              "command": "python benchmarks/comm_hooks.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
