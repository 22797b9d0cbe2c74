"""US-Byte's comparison on the testbed: usbyte, bytescheduler, wfbp and PyTorch DDP, GPU compute replayed.

    python benchmarks/paper_usbyte_testbed.py            # ResNet-50 on 2, 4 and 8 hosts, VGG-16 (root; prefix gsp2)
    python benchmarks/paper_usbyte_testbed.py --quick    # ResNet-50, 2 hosts, a short run
    python benchmarks/paper_usbyte_testbed.py --table-only

US-Byte (Gao et al., TPDS 2024; ../shared/SEEDS.md) reports up to 1.26x over
ByteScheduler and 1.56x over WFBP on two 8-node GPU clusters (PyTorch).  SEEDS.md names
neither the models, the GPUs nor the network; the authors' public code trains ImageNet
CNNs and hard-codes per-layer times for VGG-16, ResNet-50 and ResNet-152.  So, stated as
assumptions (``ASSUMED``, in the JSON): ResNet-50 and VGG-16 (``paper_models.py``, small
definitions, ImageNet shapes), batch 64 per GPU, profiled on the meta device at 10
TFLOP/s sustained fp32 (a V100 / RTX 3090-class GPU; ``gradsched profile --device meta
--device-tflops``: FLOPs at that rate, element-wise operators free), over 10 GbE as MPI
achieved it on MG-WFBP's 10 GbE cluster (the bundled ``googlenet-10gbe`` cluster's
bandwidth per host count), scaled by dilation as in ``paper_mgwfbp_testbed.py``.  Each
run is one ``gradsched bench --replay`` (emulated compute, real gloo, interleaved
rounds, medians); beside the measured speed-ups of ``usbyte``: the simulator's for the
run, the simulator's on the assumed cluster itself, and the paper's.
Writes ``benchmarks/results/paper_usbyte_testbed.json`` and each run's bench JSON beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import paper_models  # noqa: E402
import paper_testbed as pt  # noqa: E402

from gradsched.bundled import bundled_cluster  # noqa: E402
from gradsched.profile import Profile  # noqa: E402

CLUSTER = "googlenet-10gbe"
STRATEGIES = "usbyte,bytescheduler,wfbp,ddp"
OTHERS = ("bytescheduler", "wfbp", "ddp")
PAPER = {"usbyte_over_bytescheduler": 1.26, "usbyte_over_wfbp": 1.56}  # SEEDS.md: "up to", 8-node clusters
ASSUMED = {"models": "ResNet-50, VGG-16 (ImageNet shapes; the authors' code's models)", "batch_per_gpu": 64,
           "device_tflops": 10.0, "network": f"10 GbE as MPI achieved it (bundled {CLUSTER} cluster)"}
PROFILES = Path(__file__).parent / "profiles"
OUT = pt.RESULTS / "paper_usbyte_testbed.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="ResNet-50 on 2 hosts, 2 counted rounds of 1 step")
    ap.add_argument("--runs", default=None, help="MODEL:HOSTS, comma-separated (default resnet50:2,resnet50:4,"
                    "resnet50:8,vgg16:2; --quick: resnet50:2)")
    ap.add_argument("--batch-size", type=int, default=ASSUMED["batch_per_gpu"])
    ap.add_argument("--device-tflops", type=float, default=ASSUMED["device_tflops"])
    ap.add_argument("--steps", type=int, default=None, help="steps per row per round (default 1)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, the first not counted (default 4; --quick: 3)")
    ap.add_argument("--prefix", default="gsp2", help="testbed name prefix (default gsp2)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table-only", action="store_true", help="summarise the bench JSON files already written")
    args = ap.parse_args(argv)
    runs = args.runs or ("resnet50:2" if args.quick else "resnet50:2,resnet50:4,resnet50:8,vgg16:2")
    args.runs = []
    for item in runs.split(","):
        model, _, hosts = item.partition(":")
        if model not in paper_models.BUILDERS or not hosts.isdigit() or int(hosts) < 2:
            ap.error(f"--runs {item!r}: expected MODEL:HOSTS with MODEL one of "
                     f"{', '.join(paper_models.BUILDERS)} and HOSTS at least 2")
        args.runs.append((model, int(hosts)))
    if args.batch_size < 1 or not args.device_tflops > 0:
        ap.error("--batch-size must be at least 1 and --device-tflops above 0")
    args.steps = args.steps or 1
    args.rounds = args.rounds or (3 if args.quick else 4)
    return args


def profile_path(model: str, args: argparse.Namespace) -> Path:
    """The meta profile of ``model`` at the run's batch and throughput (made once, then read)."""
    name = f"{model}-b{args.batch_size}-{args.device_tflops:g}tflops"
    return paper_models.meta_profile(model, args.batch_size, args.device_tflops, PROFILES / f"{name}.profile.json")


def plans(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for model, hosts in args.runs:
        source = profile_path(model, args)
        beta = bundled_cluster(CLUSTER, hosts).cost("allreduce").beta_s_per_byte
        rate = pt.link_rate_bps(beta, hosts)
        dilate = pt.dilation(rate, hosts)
        raw = args.out.with_name(f"{args.out.stem}_{model}_{hosts}h.json")
        out.append({"model": model, "hosts": hosts, "profile": pt.relative(source), "rate_bps": rate,
                    "dilate": dilate, "shaped_rate_bps": rate / dilate, "raw": raw,
                    "argv": pt.bench_argv(pt.relative(source), hosts, rate, dilate, STRATEGIES, [], args.steps, args.rounds,
                                          args.prefix, raw)})
    return out


def simulated(profile: Profile, hosts: int) -> dict[str, Any]:
    """The simulator on the assumed cluster itself: each row's plan (``ddp``: DDP's buckets) and speed-ups."""
    from gradsched.planners import make_plan
    from gradsched.sim import simulate

    cluster = bundled_cluster(CLUSTER, hosts)
    times = {s: simulate(make_plan(s, profile, cluster), profile, cluster, timeline=False).iteration_s * 1e3
             for s in ("usbyte", *OTHERS)}
    return {"ms": times, **pt.speedups(times, "usbyte", OTHERS)}


def summarise(plan: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    per = pt.measured(rows)
    replayed = Profile.load(pt.ROOT / plan["profile"])
    fidelity = pt.run_fidelity(rows[0], replayed)
    return {"allreduce_over_compute": pt.regime(rows),
            "compute_only_ms": rows[0]["compute_only"]["iteration_s_median"] * 1e3, "rows": per,
            "measured": pt.speedups({s: r["measured_ms"] for s, r in per.items()}, "usbyte", OTHERS),
            "predicted_testbed": pt.speedups({s: r["predicted_ms"] for s, r in per.items()}, "usbyte", OTHERS),
            "simulated_assumed_cluster": simulated(replayed, plan["hosts"]), "paper": PAPER,
            "testbed_alpha_emulated_s": rows[0]["cluster"]["collectives"]["allreduce"]["alpha_s"] / plan["dilate"],
            "fidelity": fidelity,
            "flag": None if fidelity["faithful"] else "NOT FAITHFUL: " + "; ".join(fidelity["problems"])}


def _x(d: dict[str, Any] | None, key: str) -> str:
    return f"{d[key]:.2f}x" if d and key in d else "-"


def table(results: list[dict[str, Any]]) -> str:
    keys = [f"usbyte_over_{o}" for o in OTHERS]
    lines = [f"{'model':9s} {'hosts':>5s} {'K':>5s} {'AR/comp':>7s} " + " ".join(f"{s + ' ms':>12s}" for s in
             ("usbyte", *OTHERS)) + "  " + "  ".join(f"{'vs ' + o + ': meas/sim/cl/paper':>34s}" for o in OTHERS)
             + "  faithful"]
    for r in results:
        head = f"{r['model']:9s} {r['hosts']:5d} {r['dilate']:5g}"
        if r["status"] != "ran":
            lines.append(f"{head}  {r['status'].upper()}: {r.get('message', '')}")
            continue
        ms = " ".join(f"{r['rows'][s]['measured_ms']:12.1f}" for s in ("usbyte", *OTHERS))
        ratios = "  ".join(f"{_x(r['measured'], k):>13s} {_x(r['predicted_testbed'], k):>6s} "
                           f"{_x(r['simulated_assumed_cluster'], k):>6s} {_x(r['paper'], k):>6s}" for k in keys)
        lines.append(f"{head} {r['allreduce_over_compute']:7.2f} {ms}  {ratios}  "
                     f"{'yes' if r['fidelity']['faithful'] else r['flag']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    earlier, command = pt.earlier_runs(args.out, args.table_only, Path(__file__).name, argv)
    results = pt.run_all(plans(args), summarise, earlier)
    print("US-Byte's comparison (GPU compute replayed from meta profiles, real gloo on testbed links at 10 GbE "
          "as MPI achieved it / K); medians of interleaved rounds, emulated ms; speed-ups of usbyte: meas(ured), "
          "sim (the simulator on the run's measured profile and network), cl (on the assumed cluster), paper")
    print(table(results))
    pt.write(args.out, {"command": command,
                        "quick": args.quick, "steps": args.steps, "rounds": args.rounds, "assumed": ASSUMED | {
                            "batch_per_gpu": args.batch_size, "device_tflops": args.device_tflops},
                        "runs": results, "note": NOTE})
    return 0


NOTE = ("SEEDS.md does not name US-Byte's models, GPUs or network: see 'assumed'. Compute emulated (meta-device "
        "FLOPs at the assumed throughput, waiting), communication real (gloo over testbed links shaped at rate/K). "
        "The machine is shared with other sessions: load averages per run are in load_before/load_after, the "
        "figures are under that load. Per-message latency is not emulated (no netem): dilation divides the "
        "testbed's own start-up by K (testbed_alpha_emulated_s).")


if __name__ == "__main__":
    sys.exit(main())
