"""What the runtime's reduce-scatter and all-gather cost a byte over half the all-reduce's, from cluster files that
timed all three (``gradsched netbench --collectives allreduce,reducescatter,allgather``, or a bench JSON's cluster):
the ratio of the lines' slopes fitted to the medians from 256 KiB (the whole group's bytes) up, and of their
start-ups.  The figures behind ``gradsched.costs.DERIVED_PHASE_RATIOS`` (docs/cost-model.md, "Two phases not
measured").

    python benchmarks/two_phase_ratios.py benchmarks/results/netbench_two_phase_*.json RUNS.json \\
        --json benchmarks/results/two_phase_ratios.json

RUNS.json: the 2-host bench tables since the pieces (bench_replay_bert_base_2h_1gbit_dear7_pieces{,2},
bench_replay_googlenet_k80_2h_1gbit_dear7_pieces, ..._dear_merged, bench_rows_mem7_googlenet_k80_2h).
The netbench files were made with (N = 2, 4, 8; 8 twice; and 8 at 250mbit with --max-bytes 4194304):
    gradsched netbench --rate 4gbit --hosts N --prefix gse --collectives allreduce,reducescatter,allgather \\
        --min-bytes 4096 --max-bytes 16777216 --reps 5 --warmup 1 -o benchmarks/results/netbench_two_phase_Nh_4gbit.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gradsched.costs import fit_line

FROM_BYTES = 256 << 10


def cluster_of(path: Path) -> dict[str, Any] | None:
    """The cluster a file holds (a cluster file, or a bench JSON's first row's), None without the two phases."""
    data = json.loads(path.read_text())
    cluster = data[0].get("cluster") if isinstance(data, list) else data
    points = (cluster or {}).get("measured_points", {})
    return cluster if {"allreduce", "reducescatter", "allgather"} <= set(points) else None


def ratios(cluster: dict[str, Any]) -> dict[str, Any]:
    """Each phase's slope and start-up over half the all-reduce's (the phases by the whole group's bytes)."""
    p = cluster["world_size"]
    points = cluster["measured_points"]
    a0, b0 = fit_line([(b, t) for b, t in points["allreduce"] if b >= FROM_BYTES])
    out: dict[str, Any] = {"world_size": p}
    for name in ("reducescatter", "allgather"):
        a, b = fit_line([(x * p, t) for x, t in points[name] if x * p >= FROM_BYTES])
        out[name] = {"beta_ratio": b / (b0 / 2), "alpha_ratio": a / (a0 / 2) if a0 > 0 else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for path in args.files:
        cluster = cluster_of(path)
        if cluster is None:
            continue
        row = {"file": path.name, **ratios(cluster)}
        rows.append(row)
        rs, ag = row["reducescatter"], row["allgather"]
        print(f"{path.name:50s} P={row['world_size']:2d}  reduce-scatter x{rs['beta_ratio']:.2f} a byte  "
              f"all-gather x{ag['beta_ratio']:.2f} a byte (over half the all-reduce)")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "from_bytes": FROM_BYTES,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
