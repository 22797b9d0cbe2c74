"""One-command GPU check of the runtime: NCCL equivalence with DDP, then a timing.

    python benchmarks/gpu_check.py [--out DIR] [--quick]

On a machine with G >= 1 CUDA GPUs (one per process):

1. Equivalence, NCCL, G ranks: every dense strategy, 20 SGD and 20 Adam steps of the
   mlp on the GPU, final parameters against real DDP's (1e-5 relative) and identical
   on every rank.  With G = 1 this still runs the NCCL code path (streams, waits)
   on a world of one.
2. Equivalence, gloo with CUDA tensors, 2 ranks sharing GPU 0 (a real multi-rank
   reduction even on a one-GPU machine; NCCL refuses two ranks on one GPU).
3. Timing, NCCL, G ranks: ``gradsched train`` on the vgg model (13.8M parameters) for
   PyTorch DDP, the ``ddp`` plan on gradsched's executor, and the other dense
   strategies; a table of median iteration times.

Writes ``gpu_check.json`` into ``--out`` (default: $OUT if set, else benchmarks/results)
and exits non-zero if an equivalence check fails.  Takes about 2-4 minutes
(``--quick``: SGD only, fewer strategies and steps, about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

TIMED = [("torch-ddp", "ddp", []), ("ddp-plan", "ddp", ["--no-torch-ddp"]), ("wfbp", "wfbp", []),
         ("mgwfbp", "mgwfbp", []), ("sync", "sync", []), ("bytescheduler", "bytescheduler", []),
         ("usbyte", "usbyte", [])]


def equivalence(label: str, world: int, backend: str, device: str, quick: bool) -> dict:
    from gradsched.torch.jobs import selftest

    strategies = ["wfbp", "ddp", "mgwfbp", "bytescheduler", "usbyte"] if quick else None
    t0 = time.time()
    results = selftest.run(world, backend=backend, device=device, optimizers=("sgd",) if quick else ("sgd", "adam"),
                           steps=20, strategies=strategies)
    failed = {k: r for k, r in results.items() if not (r["rel_diff_vs_ddp"] <= 1e-5 and r["identical_across_ranks"])}
    worst = max(r["rel_diff_vs_ddp"] for r in results.values())
    print(f"[{label}] {len(results)} cases, worst rel diff vs DDP {worst:.2e}, "
          f"{'all ok' if not failed else f'{len(failed)} FAILED: {sorted(failed)}'} ({time.time() - t0:.0f} s)",
          flush=True)
    return {"label": label, "world": world, "backend": backend, "device": device, "cases": results,
            "failed": sorted(failed), "worst_rel_diff": worst}


def timing(world: int, quick: bool) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).parent))
    from runtime_vs_ddp import run_once

    rows = []
    configs = TIMED[:4] if quick else TIMED
    for label, strategy, extra in configs:
        try:
            res = run_once("vgg", strategy, extra + ["--backend", "nccl"], world, 15 if quick else 30, 64)
        except SystemExit as exc:  # a failing strategy is reported, not fatal to the rest
            print(f"[timing] {label}: FAILED {str(exc)[-400:]}", flush=True)
            rows.append({"label": label, "error": str(exc)[-2000:]})
            continue
        rows.append({"label": label, "iteration_s_median": res["iteration_s_median"],
                     "loss_first": res["loss_first"], "loss_last": res["loss_last"]})
    ref = next((r["iteration_s_median"] for r in rows if r["label"] == "torch-ddp" and "error" not in r), None)
    print(f"\nvgg, {world} x NCCL, batch 64 per GPU")
    print(f"{'strategy':14s} {'iteration ms':>12s} {'vs torch-ddp':>12s}")
    for r in rows:
        if "error" in r:
            print(f"{r['label']:14s} {'failed':>12s}")
            continue
        r["ratio_vs_torch_ddp"] = r["iteration_s_median"] / ref if ref else None
        print(f"{r['label']:14s} {r['iteration_s_median'] * 1e3:12.2f} "
              f"{format(r['ratio_vs_torch_ddp'], '.3f') if ref else '-':>12s}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).parent / "results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible: this check needs one (run the gloo tests on CPU instead)", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus,
           "gpu_name": torch.cuda.get_device_name(0), "python": platform.python_version()}
    print(json.dumps(env), flush=True)
    report: dict = {"env": env, "equivalence": []}
    report["equivalence"].append(equivalence("nccl", gpus, "nccl", "cuda", args.quick))
    report["equivalence"].append(equivalence("gloo+cuda", 2, "gloo", "cuda", args.quick))
    if not args.skip_timing:
        report["timing"] = timing(gpus, args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'gpu_check.json'}")
    return 1 if any(e["failed"] for e in report["equivalence"]) else 0


if __name__ == "__main__":
    sys.exit(main())
