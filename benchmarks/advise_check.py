"""Does the advised DDP bucket size run as fast as the best of a sweep?  On the testbed, for real.

    python benchmarks/advise_check.py [--model vgg] [--rate 1gbit] [--rounds 16] [--steps 1] \
        [--contention] [--prefix gsp] [--json benchmarks/results/advise_check_vgg_1gbit.json]
    python benchmarks/advise_check.py --pool RESULT.json RESULT2.json [--json POOLED.json]

As root: 2 testbed hosts joined by shaped links.  Each worker measures what
``gradsched.torch.advise`` measures (profile in place, network benchmark, with
``--contention`` the contention probe), then trains PyTorch DDP (``bucket_cap_mb`` set)
at every bucket size of the sweep; the report advises from what was measured as that
function does (``gradsched.advise.advise``, the installed DDP's first-bucket rule).

Method: the step times of one bucket size spread from run to run by more than the 3%
the check decides on a loaded machine (the "spread" the report prints), so one run per
size cannot decide it.  The sizes are interleaved: each round runs every size
``--steps`` steps in a fresh random order (the first round not counted: DDP rebuilds its
buckets after the first step), each step timed between barriers.  A size's time in a
round is divided by the median of all sizes in that round, which cancels load that
changes between rounds; a size's figure is the median of those ratios over the rounds.
The advised size passes if its figure is within 3% of the smallest; a bootstrap over
the rounds gives a 90% interval of that ratio, so the report also says whether the
rounds decide it.  Writes JSON with the profile and cluster the advice came from, the
step times by round, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SWEEP_MB = (1, 2, 5, 10, 25, 50, 100)
TOLERANCE = 0.03
BOOTSTRAP = 2000


def worker(out: str, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from gradsched.torch import build_model
    from gradsched.torch.measure.advisor import ddp_first_bucket_mb, measure

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    spec = build_model(args.model)
    gen = torch.Generator().manual_seed(dist.get_rank())
    x, y = spec.make_batch(args.batch_size, gen)
    t0 = time.perf_counter()
    profile, cluster = measure(spec.module, (x, y), loss_fn=spec.loss_fn, contention=args.contention)
    advise_s = time.perf_counter() - t0
    ddps = {mb: torch.nn.parallel.DistributedDataParallel(build_model(args.model).module, bucket_cap_mb=mb)
            for mb in SWEEP_MB}
    opts = {mb: torch.optim.SGD(m.parameters(), lr=0.01) for mb, m in ddps.items()}
    rounds: list[dict[str, list[float]]] = []
    loads: list[float] = []
    for r in range(args.rounds):
        order = random.Random(r).sample(SWEEP_MB, len(SWEEP_MB))  # the same on every rank
        times: dict[str, list[float]] = {}
        loads.append(os.getloadavg()[0])
        for mb in order:
            times[str(mb)] = []
            for _ in range(args.steps):
                dist.barrier()
                start = time.perf_counter()
                opts[mb].zero_grad()
                spec.loss_fn(ddps[mb](x), y).backward()
                opts[mb].step()
                dist.barrier()
                times[str(mb)].append(time.perf_counter() - start)
        rounds.append(times)
    if cluster is not None:  # rank 0
        Path(out).write_text(json.dumps({"profile": profile.to_dict(), "cluster": cluster.to_dict(),
                                         "ddp_first_bucket_mb": ddp_first_bucket_mb(), "advise_s": advise_s,
                                         "rounds": rounds, "load_1min": loads}))
    dist.destroy_process_group()


def drive(args: argparse.Namespace) -> dict:
    import tempfile

    from gradsched.testbed import Testbed

    with tempfile.TemporaryDirectory(prefix=f"{args.prefix}-advise-") as tmp:
        Path(tmp).chmod(0o755)
        out = Path(tmp, "worker.json")
        with Testbed(hosts=2, rate=args.rate, prefix=args.prefix) as tb:  # always torn down
            argv = [str(Path(__file__).resolve()), "--worker", str(out), "--model", args.model,
                    "--rounds", str(args.rounds), "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
            tb.launch(argv + (["--contention"] if args.contention else [])).wait(timeout_s=args.timeout_s)
        return json.loads(out.read_text())


def relative_medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each size's median over the rounds of its time divided by the round's median over sizes."""
    ratios: dict[str, list[float]] = {mb: [] for mb in rounds[0]}
    for r in rounds:
        mid = statistics.median(r.values())
        for mb, t in r.items():
            ratios[mb].append(t / mid)
    return {mb: statistics.median(v) for mb, v in ratios.items()}


def advised_vs_best(rounds: list[dict[str, float]], advised: str) -> float:
    rel = relative_medians(rounds)
    return rel[advised] / min(rel.values())


def spread(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Run-to-run spread of each size: its median over the even rounds against the odd ones,
    as a fraction of its median (the same size measured twice, in two halves of the run)."""
    out = {}
    for mb in rounds[0]:
        even = statistics.median(r[mb] for r in rounds[0::2])
        odd = statistics.median(r[mb] for r in rounds[1::2])
        out[mb] = abs(even - odd) / statistics.median(r[mb] for r in rounds)
    return out


def bootstrap(rounds: list[dict[str, float]], advised: str, seed: int = 0) -> tuple[float, float]:
    """A 90% interval of advised/best, resampling whole rounds."""
    rng = random.Random(seed)
    ratios = sorted(advised_vs_best([rng.choice(rounds) for _ in rounds], advised) for _ in range(BOOTSTRAP))
    return ratios[int(0.05 * BOOTSTRAP)], ratios[int(0.95 * BOOTSTRAP) - 1]


def predictions(raw: dict) -> dict[str, Any]:
    """The advice's predictions, and the same inputs under the rule the advisor used before
    (a 1 MiB first bucket whatever bucket_cap_mb is set to)."""
    from gradsched import Cluster, Profile
    from gradsched.advise import advise

    profile, cluster = Profile.from_dict(raw["profile"]), Cluster.from_dict(raw["cluster"])
    now = advise(profile, cluster, SWEEP_MB, ddp_first_bucket_mb=raw["ddp_first_bucket_mb"])
    old = advise(profile, cluster, SWEEP_MB, ddp_first_bucket_mb=1.0)
    return {"advice": now, "predicted_s": {p.bucket_mb: p.predicted_s for p in now.ddp_sweep},
            "predicted_idle_s": {p.bucket_mb: p.predicted_idle_s for p in now.ddp_sweep},
            "predicted_first_1mib_s": {p.bucket_mb: p.predicted_s for p in old.ddp_sweep}}


def report(raw: dict, args: argparse.Namespace) -> dict:
    rounds = [{mb: statistics.median(ts) for mb, ts in r.items()} for r in raw["rounds"][1:]]
    pred = predictions(raw)
    advice = pred["advice"]
    advised = str(SWEEP_MB[[float(mb) for mb in SWEEP_MB].index(advice.ddp_bucket_cap_mb)])
    rel = relative_medians(rounds)
    medians = {mb: statistics.median(r[mb] for r in rounds) for mb in rel}
    best = min(rel, key=rel.get)
    ratio = rel[advised] / rel[best]
    low, high = bootstrap(rounds, advised)
    spreads = spread(rounds)
    rel_spreads = spread([{mb: t / statistics.median(r.values()) for mb, t in r.items()} for r in rounds])
    load = statistics.mean(raw["load_1min"])
    _print_table(args, rounds, rel, medians, pred, advised, best, load)
    ok = ratio <= 1 + TOLERANCE
    decided = high <= 1 + TOLERANCE or low > 1 + TOLERANCE
    print(f"run-to-run spread of one size (even vs odd rounds): median {statistics.median(spreads.values()):.1%}, "
          f"largest {max(spreads.values()):.1%}; relative to the round: largest {max(rel_spreads.values()):.1%}")
    print(f"advised {advised} MiB runs at {ratio:.3f}x the measured best ({best} MiB; 90% interval over rounds "
          f"{low:.3f}-{high:.3f}): {'within' if ok else 'NOT within'} {TOLERANCE:.0%}"
          f"{'' if decided else ' (the interval straddles the tolerance: these rounds do not decide it)'}")
    return {"model": args.model, "hosts": 2, "rate": args.rate, "rounds": args.rounds, "steps": args.steps,
            "batch_size": args.batch_size, "contention": args.contention, "load_1min_mean": load,
            "load_1min": raw["load_1min"], "method": "interleaved rounds, medians of ratios to the round's median",
            "advised_mb": float(advised), "measured_best_mb": float(best), "advised_vs_best": ratio,
            "advised_vs_best_90": [low, high], "within_tolerance": ok, "decided": decided, "tolerance": TOLERANCE,
            "spread_even_odd": spreads, "spread_even_odd_relative": rel_spreads, "relative_median": rel,
            "measured_median_s": medians, "predicted_s": pred["predicted_s"],
            "predicted_idle_s": pred["predicted_idle_s"],
            "predicted_first_1mib_s": pred["predicted_first_1mib_s"], "advice": advice.to_dict(),
            "advise_s": raw["advise_s"], "profile": raw["profile"], "cluster": raw["cluster"],
            "ddp_first_bucket_mb": raw["ddp_first_bucket_mb"], "steps_s_by_round": raw["rounds"],
            "command": "python benchmarks/advise_check.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def pool(paths: list[str]) -> dict:
    """Rounds of several result files of one model and rate, each advised anew from its own
    measured inputs; pooled only where every file gives the same advice."""
    rows = [json.loads(Path(p).read_text()) for p in paths]
    advised = {float(predictions(r)["advice"].ddp_bucket_cap_mb) for r in rows}
    if len({(r["model"], r["rate"]) for r in rows}) != 1 or len(advised) != 1:
        raise SystemExit(f"--pool: the files differ in model, rate or advice ({sorted(advised)} MiB): not pooled")
    rounds = [{mb: statistics.median(ts) for mb, ts in r.items()} for row in rows for r in row["steps_s_by_round"][1:]]
    mb = str(SWEEP_MB[[float(x) for x in SWEEP_MB].index(advised.pop())])
    rel = relative_medians(rounds)
    best = min(rel, key=rel.get)
    low, high = bootstrap(rounds, mb)
    out = {"files": paths, "rounds": len(rounds), "advised_mb": float(mb), "measured_best_mb": float(best),
           "advised_vs_best": rel[mb] / rel[best], "advised_vs_best_90": [low, high], "relative_median": rel,
           "load_1min_mean": statistics.mean(x for row in rows for x in row["load_1min"])}
    print(f"pooled {len(rounds)} rounds of {len(paths)} runs ({rows[0]['model']}, {rows[0]['rate']}): advised {mb} MiB "
          f"runs at {out['advised_vs_best']:.3f}x the measured best ({best} MiB; 90% interval {low:.3f}-{high:.3f}): "
          f"{'within' if out['advised_vs_best'] <= 1 + TOLERANCE else 'NOT within'} {TOLERANCE:.0%}"
          f"{'' if high <= 1 + TOLERANCE or low > 1 + TOLERANCE else ' (the interval straddles the tolerance)'}")
    return out


def _print_table(args: argparse.Namespace, rounds: list, rel: dict, medians: dict, pred: dict, advised: str,
                 best: str, load: float) -> None:
    print(f"{args.model}, 2 testbed hosts at {args.rate}, gloo (CPU compute); {len(rounds)} counted rounds "
          f"x {args.steps} steps per size, interleaved; load average {load:.1f} (mean over rounds)")
    print(f"{'bucket_cap_mb':>13} {'median ms':>10} {'vs round':>9} {'predicted ms':>13} {'idle net':>9} "
          f"{'1 MiB first':>12}")
    for mb in sorted(rel, key=float):
        mark = " <- advised" if mb == advised else ""
        mark += " <- measured best" if mb == best else ""
        f = float(mb)
        idle = pred["predicted_idle_s"][f]
        print(f"{mb:>13} {medians[mb] * 1e3:>10.1f} {rel[mb]:>9.3f} {pred['predicted_s'][f] * 1e3:>13.1f} "
              f"{'-' if idle is None else f'{idle * 1e3:.1f}':>9} {pred['predicted_first_1mib_s'][f] * 1e3:>12.1f}{mark}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--rounds", type=int, default=16, help="rounds over the sweep, the first not counted")
    ap.add_argument("--steps", type=int, default=1, help="steps per bucket size per round")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--prefix", default="gsp", help="testbed prefix (default gsp)")
    ap.add_argument("--contention", action="store_true",
                    help="advise with the contention probe (gradsched.torch.advise(..., contention=True))")
    ap.add_argument("--timeout-s", type=float, default=3000)
    ap.add_argument("--json", default=None, help="default benchmarks/results/advise_check_MODEL_RATE.json")
    ap.add_argument("--pool", nargs="+", metavar="RESULT", help="no run: pool the rounds of these result files "
                    "(one model and rate, the same advice from each file's measured inputs)")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    if args.pool:
        result = pool(args.pool)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return
    if args.rounds < 5 or args.steps < 1:
        raise SystemExit("--rounds must be at least 5 (the first is not counted) and --steps at least 1")
    result = report(drive(args), args)
    path = Path(args.json or f"benchmarks/results/advise_check_{args.model}_{args.rate}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
