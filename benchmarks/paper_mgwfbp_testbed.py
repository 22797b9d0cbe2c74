"""MG-WFBP's GoogLeNet experiment on the testbed: K80 compute replayed, 10 GbE emulated, real gloo.

    python benchmarks/paper_mgwfbp_testbed.py            # 2, 4 and 8 hosts (root; testbed prefix gsp)
    python benchmarks/paper_mgwfbp_testbed.py --quick    # 2 hosts, a short run
    python benchmarks/paper_mgwfbp_testbed.py --table-only   # the table again from the JSON files written

The paper (Shi, Chu, Li; TPDS 2021; ../shared/SEEDS.md) trained GoogLeNet on K80 nodes
over 10 Gb Ethernet and reported MG-WFBP about 1.2x faster than WFBP and 1.36x faster
than SyncEASGD at 8 nodes.  Here each host replays the bundled ``googlenet-k80`` profile
(the authors' B-Caffe per-layer logs) and moves every gradient byte over gloo on
testbed links shaped at the rate MPI achieved on the paper's cluster (the bundled
``googlenet-10gbe`` cluster's fitted bandwidth at that host count), divided by a
dilation chosen per host count to keep the links' summed rate within what this
machine moves faithfully (``paper_testbed.dilation``).  Rows: ``sync`` (SyncEASGD, one
all-reduce of everything after backward), ``wfbp`` with ``layerwise=true`` (B-Caffe's
WFBP: a layer's weight and bias as one message, as the logs' zero bias rows show) and
``mgwfbp``.  Beside the measured ratios: the simulator's for the run (its own measured
profile and network) and for the paper's inputs (bundled profile and cluster), and the
paper's.  Writes ``benchmarks/results/paper_mgwfbp_testbed.json`` (and each run's
``gradsched bench`` JSON beside it).  Each run states whether it stayed faithful.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import paper_testbed as pt  # noqa: E402

from gradsched.bundled import bundled_cluster, bundled_profile  # noqa: E402
from gradsched.cluster import Cluster  # noqa: E402
from gradsched.profile import Profile  # noqa: E402

PROFILE = "googlenet-k80"
CLUSTER = "googlenet-10gbe"
STRATEGIES = "sync,wfbp,mgwfbp"
OPTS = ["wfbp.layerwise=true"]
PLANS = {"sync": {}, "wfbp": {"layerwise": True}, "mgwfbp": {}}
PAPER = {8: {"mgwfbp_over_wfbp": 1.2, "mgwfbp_over_sync": 1.36}}  # SEEDS.md: "about", 8 nodes only
OUT = pt.RESULTS / "paper_mgwfbp_testbed.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 hosts, 2 counted rounds of 1 step (a few minutes)")
    ap.add_argument("--hosts", default=None, help="comma-separated host counts (default 2,4,8; --quick: 2)")
    ap.add_argument("--steps", type=int, default=None, help="steps per row per round (default 1)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, the first not counted (default 4; --quick: 3)")
    ap.add_argument("--prefix", default="gsp", help="testbed name prefix (default gsp)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table-only", action="store_true", help="summarise the bench JSON files already written")
    args = ap.parse_args(argv)
    args.hosts = [int(h) for h in (args.hosts or ("2" if args.quick else "2,4,8")).split(",")]
    if any(h < 2 for h in args.hosts):
        ap.error("--hosts: every host count must be at least 2")
    args.steps = args.steps or 1
    args.rounds = args.rounds or (3 if args.quick else 4)
    return args


def emulated_rate_bps(hosts: int) -> int:
    """The link rate at which gloo's ring matches what MPI achieved on the paper's cluster at ``hosts``."""
    beta = bundled_cluster(CLUSTER, hosts).cost("allreduce").beta_s_per_byte
    return pt.link_rate_bps(beta, hosts)


def plans(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One ``gradsched bench`` per host count: rate, dilation, command line and raw JSON path."""
    out = []
    for hosts in args.hosts:
        rate = emulated_rate_bps(hosts)
        dilate = pt.dilation(rate, hosts)
        raw = args.out.with_name(f"{args.out.stem}_{hosts}h.json")
        out.append({"hosts": hosts, "rate_bps": rate, "dilate": dilate, "shaped_rate_bps": rate / dilate,
                    "raw": raw, "argv": pt.bench_argv(PROFILE, hosts, rate, dilate, STRATEGIES, OPTS, args.steps,
                                                      args.rounds, args.prefix, raw)})
    return out


def simulated(profile: Profile, cluster: Cluster) -> dict[str, Any]:
    """The simulator's iteration per strategy (the script's plans) on ``profile`` and ``cluster``, and ratios."""
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    times = {s: simulate(make_plan(s, profile, cluster, **o), profile, cluster, timeline=False).iteration_s * 1e3
             for s, o in PLANS.items()}
    return {"ms": times, **pt.speedups(times, "mgwfbp", ("wfbp", "sync"))}


def paper_side(hosts: int, alpha_s: float) -> dict[str, Any]:
    """The simulator on the paper's inputs, and on them with the testbed's (emulated) start-up instead."""
    profile, cluster = bundled_profile(PROFILE), bundled_cluster(CLUSTER, hosts)
    cost = cluster.cost("allreduce")
    return {"simulated_paper": simulated(profile, cluster),
            "simulated_paper_bandwidth_testbed_latency": simulated(
                profile, Cluster.alpha_beta(alpha_s, cost.beta_s_per_byte, hosts)),
            "paper_alpha_s": cost.alpha_s}


def summarise(plan: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One host count's row: measured, predicted (the run's simulator) and paper-side ratios, fidelity."""
    per = pt.measured(rows)
    hosts = plan["hosts"]
    measured = {s: r["measured_ms"] for s, r in per.items()}
    predicted = {s: r["predicted_ms"] for s, r in per.items()}
    alpha = rows[0]["cluster"]["collectives"]["allreduce"]["alpha_s"] / rows[0].get("dilate", 1.0)
    paper = paper_side(hosts, alpha)
    paper_alpha = paper.pop("paper_alpha_s")
    fidelity = pt.run_fidelity(rows[0], bundled_profile(PROFILE))
    return {"allreduce_over_compute": pt.regime(rows), "compute_only_ms": rows[0]["compute_only"]["iteration_s_median"] * 1e3,
            "rows": per, "measured": pt.speedups(measured, "mgwfbp", ("wfbp", "sync")),
            "predicted_testbed": pt.speedups(predicted, "mgwfbp", ("wfbp", "sync")), **paper,
            "latency": {"testbed_alpha_emulated_s": alpha, "paper_alpha_s": paper_alpha},
            "paper": PAPER.get(hosts), "fidelity": fidelity,
            "flag": None if fidelity["faithful"] else "NOT FAITHFUL: " + "; ".join(fidelity["problems"])}


def _x(d: dict[str, Any] | None, key: str) -> str:
    return f"{d[key]:.2f}x" if d and key in d else "-"


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'hosts':>5s} {'rate':>9s} {'K':>5s} {'AR/comp':>7s} {'sync ms':>8s} {'wfbp ms':>8s} {'mgwfbp':>7s}  "
             f"{'mg/wfbp: meas':>13s} {'sim':>6s} {'paper-sim':>9s} {'paper':>6s}  {'mg/sync: meas':>13s} {'sim':>6s} "
             f"{'paper-sim':>9s} {'paper':>6s}  faithful"]
    for r in results:
        head = f"{r['hosts']:5d} {r['rate_bps'] / 1e9:7.2f}Gb {r['dilate']:5g}"
        if r["status"] != "ran":
            lines.append(f"{head}  {r['status'].upper()}: {r.get('message', '')}")
            continue
        ms = {s: v["measured_ms"] for s, v in r["rows"].items()}
        cols = [f"{r['allreduce_over_compute']:7.2f}", f"{ms['sync']:8.1f}", f"{ms['wfbp']:8.1f}", f"{ms['mgwfbp']:7.1f} "]
        for key in ("mgwfbp_over_wfbp", "mgwfbp_over_sync"):
            cols.append(f"{_x(r['measured'], key):>13s} {_x(r['predicted_testbed'], key):>6s} "
                        f"{_x(r['simulated_paper'], key):>9s} {_x(r['paper'], key):>6s} ")
        lines.append(f"{head} {' '.join(cols)} {'yes' if r['fidelity']['faithful'] else r['flag']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    earlier, command = pt.earlier_runs(args.out, args.table_only, Path(__file__).name, argv)
    results = pt.run_all(plans(args), summarise, earlier)
    print("MG-WFBP's GoogLeNet (K80 compute replayed, real gloo on testbed links at MPI's 10 GbE rate / K); "
          "medians of interleaved rounds, emulated ms; sim = the simulator on the run's own measured profile and "
          "network, paper-sim = on the paper's (bundled) inputs")
    print(table(results))
    pt.write(args.out, {"command": command,
                        "quick": args.quick, "steps": args.steps, "rounds": args.rounds, "runs": results,
                        "note": NOTE})
    return 0


NOTE = ("Compute emulated (replayed K80 per-layer times, waiting), communication real (gloo over testbed links "
        "shaped at rate/K). The machine is shared with other sessions: load averages per run are in load_before/"
        "load_after, the figures are under that load. Per-message latency is not emulated (no netem): dilation "
        "divides the testbed's own start-up by K, so the emulated cluster's start-up (latency.testbed_alpha_emulated_s)"
        " is far below the paper's; simulated_paper_bandwidth_testbed_latency shows what that alone does to the "
        "ratios.")


if __name__ == "__main__":
    sys.exit(main())
