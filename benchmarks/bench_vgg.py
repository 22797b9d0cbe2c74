"""The issue's target benchmark: vgg on 2 and 4 hosts, every dense strategy against DDP and its bucket sizes.

    python benchmarks/bench_vgg.py [--hosts 2,4] [--rate 1600mbit] [--steps 6] [--rounds 3]

One ``gradsched bench`` per host count (on the testbed as root, over loopback otherwise),
each writing ``benchmarks/results/bench_vgg_<H>h.json`` and ``.png``.  The default rate
makes one all-reduce of vgg's 55 MB of gradients take about as long as a 2-host
forward+backward on the project's 2-core machine (docs/bench.md has the measurements).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gradsched.cli import main as gradsched

STRATEGIES = "ddp,wfbp,mgwfbp,optimal,bytescheduler,usbyte,auto"
RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="2,4", help="host counts, comma-separated (default 2,4)")
    ap.add_argument("--rate", default="1600mbit", help="testbed link rate (default 1600mbit; ignored without root)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strategies", default=STRATEGIES)
    args = ap.parse_args(argv)
    net = ["--rate", args.rate] if os.geteuid() == 0 else ["--loopback"]
    for hosts in (int(h) for h in args.hosts.split(",")):
        stem = RESULTS / f"bench_vgg_{hosts}h"
        code = gradsched(["bench", "--model", "vgg", "--hosts", str(hosts), *net, "--strategies", args.strategies,
                          "--steps", str(args.steps), "--rounds", str(args.rounds),
                          "--json", f"{stem}.json", "--plot", f"{stem}.png"])
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
