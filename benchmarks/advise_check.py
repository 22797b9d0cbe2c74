"""Does the advised DDP bucket size run as fast as the best of a sweep?  On the testbed, for real.

    python benchmarks/advise_check.py [--model vgg] [--rate 1gbit] [--rounds 5] [--steps 3] \
        [--json benchmarks/results/advise_check.json]

As root: 2 testbed hosts (prefix ``gsp``) joined by shaped links.  Each worker calls
``gradsched.torch.advise`` on the model as a user would (profile in place, network
benchmark, simulation of every bucket size), then trains PyTorch DDP at every bucket size
of the sweep in rotating rounds (the first round not counted) and times each step after a
barrier.  Prints the sweep's medians beside the predictions, and whether the advised size
is within 3% of the measured best; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SWEEP_MB = (1, 2, 5, 10, 25, 50, 100)
TOLERANCE = 0.03


def worker(out: str, model_name: str, rounds: int, steps: int, batch_size: int, contention: bool) -> None:
    import torch
    import torch.distributed as dist

    import gradsched.torch
    from gradsched.torch import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    spec = build_model(model_name)
    gen = torch.Generator().manual_seed(dist.get_rank())
    x, y = spec.make_batch(batch_size, gen)
    t0 = time.perf_counter()
    advice = gradsched.torch.advise(spec.module, (x, y), loss_fn=spec.loss_fn, buckets_mb=SWEEP_MB,
                                    contention=contention)
    advise_s = time.perf_counter() - t0
    ddps = {mb: torch.nn.parallel.DistributedDataParallel(build_model(model_name).module, bucket_cap_mb=mb)
            for mb in SWEEP_MB}
    opts = {mb: torch.optim.SGD(m.parameters(), lr=0.01) for mb, m in ddps.items()}
    times: dict[float, list[float]] = {mb: [] for mb in SWEEP_MB}
    for r in range(rounds):
        order = SWEEP_MB[r % len(SWEEP_MB):] + SWEEP_MB[:r % len(SWEEP_MB)]  # rotate: no size always first
        for mb in order:
            for _ in range(steps):
                dist.barrier()
                start = time.perf_counter()
                opts[mb].zero_grad()
                spec.loss_fn(ddps[mb](x), y).backward()
                opts[mb].step()
                dist.barrier()
                if r > 0:
                    times[mb].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"advice": advice.to_dict(), "advise_s": advise_s,
                                         "measured_s": {str(mb): ts for mb, ts in times.items()}}))
    dist.destroy_process_group()


def drive(args: argparse.Namespace) -> dict:
    import tempfile

    from gradsched.testbed import Testbed

    with tempfile.TemporaryDirectory(prefix="gsp-advise-") as tmp:
        Path(tmp).chmod(0o755)
        out = Path(tmp, "worker.json")
        with Testbed(hosts=2, rate=args.rate, prefix=args.prefix) as tb:  # always torn down
            argv = [str(Path(__file__).resolve()), "--worker", str(out), "--model", args.model,
                    "--rounds", str(args.rounds), "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
            tb.launch(argv + (["--contention"] if args.contention else [])).wait(timeout_s=args.timeout_s)
        return json.loads(out.read_text())


def report(raw: dict, args: argparse.Namespace) -> dict:
    advice = raw["advice"]
    medians = {float(mb): statistics.median(ts) for mb, ts in raw["measured_s"].items()}
    predicted = {p["bucket_mb"]: p["predicted_s"] for p in advice["ddp_sweep"]}
    best_mb = min(medians, key=medians.get)
    advised = advice["ddp_bucket_cap_mb"]
    ratio = medians[advised] / medians[best_mb]
    print(f"{args.model}, 2 testbed hosts at {args.rate}, gloo (CPU compute); {args.rounds - 1} counted rounds "
          f"x {args.steps} steps")
    print(f"{'bucket_cap_mb':>13} {'measured ms':>12} {'predicted ms':>13}")
    for mb in sorted(medians):
        mark = " <- advised" if mb == advised else ""
        mark += " <- measured best" if mb == best_mb else ""
        print(f"{mb:>13g} {medians[mb] * 1e3:>12.1f} {predicted[mb] * 1e3:>13.1f}{mark}")
    ok = ratio <= 1 + TOLERANCE
    print(f"advised {advised:g} MB runs at {ratio:.3f}x the measured best ({best_mb:g} MB): "
          f"{'within' if ok else 'NOT within'} {TOLERANCE:.0%}")
    return {"model": args.model, "hosts": 2, "rate": args.rate, "rounds": args.rounds, "steps": args.steps,
            "contention": args.contention, "near_best_mb": [p["bucket_mb"] for p in advice["ddp_sweep"]
                                                          if p["predicted_s"] <= advice["ddp_predicted_s"] * 1.02],
            "batch_size": args.batch_size, "advised_mb": advised, "measured_best_mb": best_mb,
            "advised_vs_best": ratio, "within_tolerance": ok, "tolerance": TOLERANCE,
            "measured_median_s": medians, "predicted_s": predicted, "advise_s": raw["advise_s"],
            "advice": advice, "steps_s": raw["measured_s"],
            "command": "python benchmarks/advise_check.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the sweep, the first not counted")
    ap.add_argument("--steps", type=int, default=3, help="steps per bucket size per round")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--prefix", default="gsp", help="testbed prefix (default gsp)")
    ap.add_argument("--contention", action="store_true",
                    help="advise with the contention probe (gradsched.torch.advise(..., contention=True))")
    ap.add_argument("--timeout-s", type=float, default=1500)
    ap.add_argument("--json", default="benchmarks/results/advise_check.json")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.rounds, args.steps, args.batch_size, args.contention)
        return
    if args.rounds < 2 or args.steps < 1:
        raise SystemExit("--rounds must be at least 2 (the first is not counted) and --steps at least 1")
    result = report(drive(args), args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
