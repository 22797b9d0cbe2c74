"""US-Byte's rules side by side: gradsched's and the paper's promotion window, with and
without the paper's block extension, and the rule ``usbyte`` chooses by simulation.

    python benchmarks/usbyte_rules.py [--json benchmarks/results/usbyte_rules.json]

Predicted iteration (simulator) per rule, on the bundled GoogLeNet profile and synthetic
profiles at a fast and a slow network, 8 workers.  Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gradsched.bundled import bundled_profile
from gradsched.cluster import Cluster
from gradsched.planners import make_plan
from gradsched.planners.usbyte import RULES
from gradsched.sim import simulate
from gradsched.synthetic import synthetic_profile

NETWORKS = {"fast (50 us, 0.2 ns/B)": (50e-6, 0.2e-9), "10GbE-like (0.5 ms, 0.8 ns/B)": (0.5e-3, 0.8e-9),
            "slow (2 ms, 8 ns/B)": (2e-3, 8e-9)}


def rows(workers: int) -> list[dict]:
    profiles = {"GoogLeNet (bundled)": bundled_profile(), "synthetic 300 (seed 1)": synthetic_profile(300, seed=1),
                "synthetic 1000 (seed 0)": synthetic_profile(1000)}
    out = []
    for pname, profile in profiles.items():
        for nname, (alpha, beta) in NETWORKS.items():
            cluster = Cluster.alpha_beta(alpha, beta, workers)
            row = {"profile": pname, "network": nname, "workers": workers}
            for window, extend in RULES:
                plan = make_plan("usbyte", profile, cluster, extend=extend, window=window)
                row[f"{window}{'+extend' if extend else ''}_s"] = simulate(plan, profile, cluster,
                                                                           timeline=False).iteration_s
            chosen = make_plan("usbyte", profile, cluster)
            row["chosen"] = f"{chosen.options['window']}{'+extend' if chosen.options['extend'] else ''}"
            row["chosen_s"] = simulate(chosen, profile, cluster, timeline=False).iteration_s
            row["gain_vs_gradsched_rule"] = row["block_s"] / row["chosen_s"]
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--json", default="benchmarks/results/usbyte_rules.json")
    args = ap.parse_args()
    table = rows(args.workers)
    cols = [f"{w}{'+extend' if e else ''}" for w, e in RULES]
    print(f"{'profile':<24} {'network':<30} " + " ".join(f"{c:>13}" for c in cols) + f" {'chosen':>13} {'gain':>6}")
    for r in table:
        print(f"{r['profile']:<24} {r['network']:<30} " + " ".join(f"{r[c + '_s'] * 1e3:>10.1f} ms" for c in cols)
              + f" {r['chosen']:>13} {r['gain_vs_gradsched_rule']:>5.3f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(table, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
