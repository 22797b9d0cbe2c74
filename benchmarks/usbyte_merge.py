"""``usbyte``'s layer merging: the paper's layers against groups of 256 KiB, 1 MiB and 4 MiB.

    python benchmarks/usbyte_merge.py [--workers 8] [--json benchmarks/results/usbyte_merge.json]

Predicted iteration (simulator) of ``usbyte`` with each ``merge_bytes`` that ``auto``
searches (0: the paper's layers, the default), the fastest of them, and ``optimal``,
``mgwfbp`` and ``auto`` for reference, on the bundled GoogLeNet profile, the GPT-2-shaped meta profile of the
emulated-regime runs and synthetic profiles, at a fast, a 10GbE-like and a slow
network.  Prints a table and writes JSON.  No torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gradsched.bundled import bundled_profile
from gradsched.cluster import Cluster
from gradsched.planners import make_plan
from gradsched.planners.auto import USBYTE_MERGE_BYTES as MERGES
from gradsched.profile import Profile
from gradsched.sim import simulate
from gradsched.synthetic import synthetic_profile

HERE = Path(__file__).parent
NETWORKS = {"fast (50 us, 0.2 ns/B)": (50e-6, 0.2e-9), "10GbE-like (0.5 ms, 0.8 ns/B)": (0.5e-3, 0.8e-9),
            "slow (2 ms, 8 ns/B)": (2e-3, 8e-9)}


def profiles() -> dict[str, Profile]:
    return {"GoogLeNet (bundled)": bundled_profile("googlenet-k80"),
            "gpt-6x512 (meta, 2.5 TFLOP/s)": Profile.load(HERE / "profiles" / "gpt-6x512.profile.json"),
            "synthetic 300 (seed 1)": synthetic_profile(300, seed=1),
            "synthetic 1000 (seed 0)": synthetic_profile(1000)}


def rows(workers: int) -> list[dict]:
    out = []
    for pname, profile in profiles().items():
        for nname, (alpha, beta) in NETWORKS.items():
            cluster = Cluster.alpha_beta(alpha, beta, workers)

            def predicted(strategy: str, **opts) -> tuple[float, int, dict]:
                plan = make_plan(strategy, profile, cluster, **opts)
                return simulate(plan, profile, cluster, timeline=False).iteration_s, len(plan.operations), plan.options

            row = {"profile": pname, "network": nname, "workers": workers}
            for merge in MERGES:
                row[f"merge_{merge}_s"], row[f"merge_{merge}_ops"], _ = predicted("usbyte", merge_bytes=merge)
            auto_s, _, opts = predicted("auto")
            row["auto_s"], row["auto_chose"] = auto_s, f"{opts['chose']} {opts['chosen_options']}"
            best = min(MERGES, key=lambda m: (row[f"merge_{m}_s"], m))
            row["fastest_s"], row["fastest_merge_bytes"] = row[f"merge_{best}_s"], best
            row["optimal_s"], _, _ = predicted("optimal")
            row["mgwfbp_s"], _, _ = predicted("mgwfbp")
            row["gain_vs_paper_layers"] = row["merge_0_s"] / row["fastest_s"]
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--json", default="benchmarks/results/usbyte_merge.json")
    args = ap.parse_args()
    table = rows(args.workers)
    heads = [f"{m >> 10} KiB" if m else "paper" for m in MERGES]
    print(f"{'profile':<30} {'network':<30} " + " ".join(f"{h:>9}" for h in heads)
          + f" {'fastest':>16} {'optimal':>9} {'mgwfbp':>9} {'auto':>9} {'gain':>6}   (ms)")
    for r in table:
        merges = " ".join(f"{r[f'merge_{m}_s'] * 1e3:9.1f}" for m in MERGES)
        fastest = f"{r['fastest_s'] * 1e3:.1f} ({r['fastest_merge_bytes'] >> 10}K)"
        print(f"{r['profile']:<30} {r['network']:<30} {merges} {fastest:>16} {r['optimal_s'] * 1e3:9.1f} "
              f"{r['mgwfbp_s'] * 1e3:9.1f} {r['auto_s'] * 1e3:9.1f} {r['gain_vs_paper_layers']:5.3f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(table, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
