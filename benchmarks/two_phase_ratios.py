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

A ``benchmarks/gloo_ring_phases.py`` sweep (all-to-alls and rings, each size a rank's whole buffer) gives the ring's
figures behind ``gradsched.costs.RING_PHASE_RATIOS``: each form's slope from ``RING_MIN_BYTES`` up and below it over
half the all-reduce's, fitted to the medians as above (phase11):

    python benchmarks/two_phase_ratios.py benchmarks/results/gloo_ring_phases_8h_250mbit.json \
        --json benchmarks/results/two_phase_ring_ratios.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gradsched.costs import RING_MIN_BYTES, fit_line

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


def ring_sweep_ratios(sweep: dict[str, Any]) -> dict[str, Any]:
    """A ring sweep's (``gloo_ring_phases.py``) slopes over half the all-reduce's: from ``RING_MIN_BYTES`` up
    (``from_threshold``, where the runtime sends rings) and from ``FROM_BYTES`` to under it (``below``)."""
    out: dict[str, Any] = {"ranks": sweep["ranks"], "rate": sweep.get("rate")}
    for span, keep in (("from_threshold", lambda b: b >= RING_MIN_BYTES),
                       ("below", lambda b: FROM_BYTES <= b < RING_MIN_BYTES)):
        rows = [r for r in sweep["rows"] if keep(r["mib_per_rank"] * 2**20)]
        slope = {case: fit_line([(r["mib_per_rank"] * 2**20, r["median_s"][case]) for r in rows])[1]
                 for case in rows[0]["median_s"]}
        out[span] = {"mib": [r["mib_per_rank"] for r in rows],
                     **{case: b / (slope["allreduce"] / 2) for case, b in slope.items() if case != "allreduce"}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for path in args.files:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "ring_rs" in (data.get("rows") or [{}])[0].get("median_s", {}):
            rows.append({"file": path.name, **ring_sweep_ratios(data)})
            for span in ("from_threshold", "below"):
                r = rows[-1][span]
                print(f"{path.name:50s} {span:14s} " + "  ".join(f"{c} x{r[c]:.2f}" for c in
                                                              ("ring_rs", "ring_ag", "a2a_rs", "a2a_ag")))
            continue
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
