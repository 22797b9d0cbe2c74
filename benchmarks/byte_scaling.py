"""How far a replayed bench agrees with itself at byte scales S = 1, 4 and 16 (``--scale-bytes``).

    sudo python benchmarks/byte_scaling.py [--profile googlenet-k80] [--hosts 2] [--rate 1gbit] [--scales 1,4,16]

One ``gradsched bench --replay PROFILE`` per scale on the testbed (prefix ``gse``),
the same rows, rounds and network otherwise; for each row, its median iteration (in
emulated seconds) at every S against S = 1, and the simulator's error.  Byte scaling
keeps each operation's bandwidth time and not its per-message latency, so rows with
many small operations are the ones expected to move.  Prints a table and writes
``benchmarks/results/byte_scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _bench(args: argparse.Namespace, scale: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "gradsched.cli", "bench", "--replay", args.profile, "--hosts", str(args.hosts),
           "--rate", args.rate, "--prefix", args.prefix, "--strategies", args.strategies, "--ddp-buckets",
           args.ddp_buckets, "--rounds", str(args.rounds), "--scale-bytes", str(scale), "-q", "--json", str(out)]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    rows = json.loads(out.read_text())
    return {"command": " ".join(cmd[1:]), "wall_s": time.time() - t0, "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="googlenet-k80")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--prefix", default="gse")
    p.add_argument("--strategies", default="ddp,mgwfbp,auto")
    p.add_argument("--ddp-buckets", default="5,all")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--scales", default="1,4,16")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("byte scaling shapes testbed links: run as root", file=sys.stderr)
        return 2
    scales = [int(s) for s in args.scales.split(",")]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in scales:
            runs[s] = _bench(args, s, Path(tmp, f"s{s}.json"))
    base = {r["strategy"]: r["iteration_s_median"] for r in runs[scales[0]]["rows"]}
    print(f"{args.profile}, {args.hosts} hosts at {args.rate}: median iteration (emulated ms), vs S={scales[0]}, "
          f"prediction error")
    print(f"{'row':12s} " + " ".join(f"{'S=' + str(s):>22s}" for s in scales))
    table = []
    for name in base:
        cells, row = [], {"strategy": name}
        for s in scales:
            r = next(x for x in runs[s]["rows"] if x["strategy"] == name)
            ratio = r["iteration_s_median"] / base[name]
            row[f"s{s}"] = {"iteration_s_median": r["iteration_s_median"], "vs_first": ratio,
                            "prediction_error": r["prediction_error"]}
            cells.append(f"{r['iteration_s_median'] * 1e3:8.1f} {ratio:5.3f} {r['prediction_error'] * 100:+5.1f}%")
        table.append(row)
        print(f"{name:12s} " + " ".join(f"{c:>22s}" for c in cells))
    worst = max(abs(row[f"s{s}"]["vs_first"] - 1) for row in table for s in scales)
    print(f"largest difference from S={scales[0]}: {worst * 100:.1f}%; wall s per run: "
          + ", ".join(f"S={s} {runs[s]['wall_s']:.0f}" for s in scales) + f"; load {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    out = {"profile": args.profile, "hosts": args.hosts, "rate": args.rate, "scales": scales, "table": table,
           "largest_difference": worst, "runs": {str(s): runs[s] for s in scales},
           "load_after": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (RESULTS / "byte_scaling.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / 'byte_scaling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
