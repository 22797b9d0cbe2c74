"""Real compute: does run-time ``auto`` ever fall behind the best of PyTorch DDP's bucket sizes?

    python benchmarks/auto_real_compute.py                        # both parts (the testbed part as root)
    python benchmarks/auto_real_compute.py --jobs 0               # loopback only
    python benchmarks/auto_real_compute.py --models none --jobs 3 # vgg on the testbed only

Issue 16's target for the real-compute regimes: ``auto`` never below 0.98x the fastest of
PyTorch DDP's bucket sizes (its default 25 MB, 1, 5, 100 MB and one bucket), (1) for
every built-in model over loopback (2 local ranks, one ``gradsched bench --loopback`` job
each) and (2) for vgg on 2 testbed hosts at 1 Gbit/s over ``--jobs`` separate
``gradsched bench`` jobs.  Each job interleaves the rows in rotating rounds and reports
medians.  Prints one row per job and writes ``benchmarks/results/auto_real_compute.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from fidelity import DEFAULT_SCHEDULE, MODELS, SCHEDULE  # (steps per burst, rounds) by model

from gradsched.cli import main as gradsched
from gradsched.commands.bench import auto_strategy

RESULTS = Path(__file__).parent / "results"
TARGET = 0.98


def bench(model: str, where: list[str], schedule: tuple[int, int]) -> dict:
    """One ``gradsched bench`` job of ``ddp,auto`` and DDP's bucket sweep; its summary."""
    steps, rounds = schedule
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "bench.json")
        code = gradsched(["bench", "--model", model, "--hosts", "2", *where, "--strategies", "ddp,auto",
                          "--steps", str(steps), "--rounds", str(rounds), "--json", str(out), "-q"])
        if code != 0:
            raise SystemExit(f"gradsched bench --model {model} {' '.join(where)} exited {code}")
        rows = json.loads(out.read_text())
    by_name = {r["strategy"]: r for r in rows}
    ddp = {name: r["iteration_s_median"] for name, r in by_name.items() if name.startswith("ddp")}
    best = min(ddp, key=ddp.__getitem__)
    auto = by_name["auto"]
    return {"model": model, "where": " ".join(where), "auto_s": auto["iteration_s_median"],
            "auto_plan": auto_strategy(auto),
            "ddp_s": ddp["ddp"], "best_ddp": best, "best_ddp_s": ddp[best], "ddp_rows_s": ddp,
            "auto_vs_best_ddp": ddp[best] / auto["iteration_s_median"],
            "auto_vs_ddp": ddp["ddp"] / auto["iteration_s_median"], "job_s": rows[0].get("job_s")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS, help="built-in models over loopback ('none': skip)")
    ap.add_argument("--jobs", type=int, default=3, help="vgg jobs on 2 testbed hosts (root; 0: skip)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--prefix", default="gsa", help="testbed name prefix")
    ap.add_argument("--json", default=str(RESULTS / "auto_real_compute.json"))
    args = ap.parse_args(argv)
    if args.jobs and os.geteuid() != 0:
        raise SystemExit("the testbed jobs need root (--jobs 0 runs the loopback part only)")
    records = []
    for model in [] if args.models == "none" else args.models.split(","):
        records.append(bench(model, ["--loopback"], SCHEDULE.get(model, DEFAULT_SCHEDULE)))
        _print(records[-1])
    for job in range(args.jobs):
        records.append(bench("vgg", ["--rate", args.rate, "--prefix", args.prefix], (3, 6)) | {"job": job + 1})
        _print(records[-1])
    worst = min(r["auto_vs_best_ddp"] for r in records)
    print(f"worst auto / best DDP bucket: {worst:.3f}x (target >= {TARGET}x): {'met' if worst >= TARGET else 'MISSED'}")
    Path(args.json).write_text(json.dumps({"rows": records, "worst_auto_vs_best_ddp": worst, "target": TARGET},
                                          indent=1))
    print(f"wrote {args.json}")
    return 0


def _print(r: dict) -> None:
    print(f"{r['model']:<5} {r['where']:<28} auto {1e3 * r['auto_s']:8.1f} ms ({r['auto_plan']})  "
          f"DDP {1e3 * r['ddp_s']:8.1f}  best {r['best_ddp']} {1e3 * r['best_ddp_s']:8.1f}  "
          f"auto/best {r['auto_vs_best_ddp']:.3f}x  auto/DDP {r['auto_vs_ddp']:.3f}x", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
