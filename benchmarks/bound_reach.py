"""Where issue 36's target (``auto`` >= 1.3x PyTorch DDP within 1.05x the bound) can be reached at all: PyTorch DDP's
measured step over the lower bound, from stored ``gradsched bench --json`` runs (dear13).

    python benchmarks/bound_reach.py RUN.json [...] [--json benchmarks/results/bound_reach.json]

For each run: its profile's backward, one all-reduce of all gradients and the bound (``lower_bound``: overlap with
backward and forward), the ``ddp`` row's median, DDP over the bound (no plan can beat DDP by more), and the ``auto``
and ``dear`` rows' medians against DDP and the bound where they ran.  Times in emulated milliseconds, as stored.  No
network: reads JSON only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def reach(path: Path) -> dict[str, Any]:
    rows = json.loads(path.read_text())
    first = rows[0]
    median = {r["strategy"]: r["iteration_s_median"] for r in rows}
    ddp, bound = median["ddp"], first["lower_bound_s"]
    out = {"run": path.stem, "backward_ms": first["profile"]["backward_s"] * 1e3,
           "allreduce_all_ms": first["lower_bound"]["allreduce_all_s"] * 1e3, "ddp_ms": ddp * 1e3,
           "bound_ms": bound * 1e3, "ddp_over_bound": ddp / bound, "target_reachable": ddp / bound >= 1.3}
    out["allreduce_at_least_backward"] = out["allreduce_all_ms"] >= out["backward_ms"]
    for name in ("auto", "dear"):
        if name in median:
            out[f"{name}_ms"] = median[name] * 1e3
            out[f"{name}_vs_ddp"] = ddp / median[name]
            out[f"{name}_over_bound"] = median[name] / bound
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    results = [reach(p) for p in args.runs]
    print(f"{'run':45s} {'bwd':>5s} {'AR all':>7s} {'ddp':>6s} {'bound':>6s} {'ddp/bnd':>7s} {'auto/ddp':>8s} "
          f"{'auto/bnd':>8s} {'dear/ddp':>8s}")
    for r in results:
        print(f"{r['run'][:45]:45s} {r['backward_ms']:5.0f} {r['allreduce_all_ms']:7.0f} {r['ddp_ms']:6.0f} "
              f"{r['bound_ms']:6.0f} {r['ddp_over_bound']:7.2f} {r.get('auto_vs_ddp', float('nan')):8.2f} "
              f"{r.get('auto_over_bound', float('nan')):8.2f} {r.get('dear_vs_ddp', float('nan')):8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
