"""The papers' models replayed on 8 emulated hosts: ``ddp,auto`` and DDP's bucket sweep, one bench each.

    sudo python benchmarks/emulate_papers.py [--models resnet50,vgg16,...] [--hosts 8] [--rate 10gbit]

US-Byte's ResNet-50 and VGG-16 and DeAR's ResNet-50, DenseNet-201, Inception-v4, BERT-Base and
BERT-Large (``paper_models.py``, meta profiles at 10 TFLOP/s, a V100-class sustained fp32
rate, DeAR's batch per GPU), each ``gradsched bench --replay`` on the testbed (prefix ``gse``)
at ``--rate`` (DeAR's 10 GbE), the links shaped at rate / (dilation x byte scale) within
what this machine moves faithfully: ``SETTINGS`` gives each model's dilation and byte scale
(``--scale-bytes``: the model's memory; dilation: the links' aggregate rate); ``--strategies dear`` adds
rows beside ``ddp,auto`` (the bench drops bucket rows, then rounds, to fit its 15 minutes).  Prints a
table (auto against DDP's default and best bucket and the lower bound, the simulator's
errors, start-up, ``auto``'s warm-up, peak memory, the plan ``auto`` ran) and writes
``benchmarks/results/emulate_papers.json`` and each bench's JSON beside it
(``emulate_papers_MODEL_8h.json``); ``--resummarize`` rebuilds the summary from those JSONs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
# model: (profile, dilation, byte scale); shaped link = 10 Gbit/s / (dilation x scale) = 250 Mbit/s at 8 hosts
SETTINGS = {
    "resnet50": ("resnet50-b64-10tflops", 5, 8),
    "vgg16": ("vgg16-b64-10tflops", 2.5, 16),
    "densenet201": ("densenet201-b32-10tflops", 5, 8),
    "inception-v4": ("inception-v4-b64-10tflops", 2.5, 16),
    "bert-base": ("bert-base-b64-10tflops", 2.5, 16),
    "bert-large": ("bert-large-b32-10tflops", 2.5, 16),
}


DEFAULT_STRATEGIES = ("ddp", "auto")


def strategies(extra: str) -> str:
    """The bench's ``--strategies``: ``ddp,auto`` and then ``extra``'s (comma-separated) not among them, in the
    order given; the bench adds DDP's bucket sweep beside them (and drops its largest caps first where the rows
    would not fit its 15 minutes: ``gradsched.jobs.budget``)."""
    out = list(DEFAULT_STRATEGIES)
    out += [s for s in dict.fromkeys(x.strip() for x in extra.split(",")) if s and s not in out]
    return ",".join(out)


def bench_command(model: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The ``gradsched bench --replay`` command of one model (``SETTINGS``), its JSON written to ``out``."""
    profile, dilate, scale = SETTINGS[model]
    return ["gradsched", "bench", "--replay", str(HERE / "profiles" / f"{profile}.profile.json"), "--hosts",
            str(args.hosts), "--rate", args.rate, "--dilate", str(dilate), "--scale-bytes", str(scale), "--prefix",
            args.prefix, "--strategies", strategies(args.strategies),
            *(["--rounds", str(args.rounds)] if args.rounds else []), "-q", "--json", str(out)]


def _run(model: str, args: argparse.Namespace) -> dict:
    _, dilate, scale = SETTINGS[model]
    out = RESULTS / f"emulate_papers_{model.replace('-', '_')}_{args.hosts}h{_tag(args)}.json"
    cmd = bench_command(model, args, out)
    t0, load = time.time(), os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-m", "gradsched.cli", *cmd[1:]], capture_output=True, text=True)
    wall = time.time() - t0
    if done.returncode != 0:  # the bench's own words, on the terminal and (their end) in the summary
        sys.stderr.write(f"{model}: gradsched bench exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr}")
        return {"model": model, "command": " ".join(cmd), "failed": done.stderr.strip().splitlines()[-20:],
                "wall_s": wall}
    return {"model": model, "command": " ".join(cmd), "wall_s": wall, "load_before": load,
            "load_after": os.getloadavg()[0], "dilate": dilate, "scale_bytes": scale, **summary(out)}


def summary(path: Path) -> dict:
    """One bench's figures from its JSON: ``auto`` against DDP, DDP's best bucket and the bound, the simulator's
    errors, start-up (every phase but the rounds and ``auto``'s warm-up), peak memory, the phases, the stopping
    rule's record, what ``auto`` ran (``auto_ran``) and its warm-up (estimated against taken)."""
    rows = json.loads(path.read_text())
    auto = next(r for r in rows if r["strategy"] == "auto")
    errors = [abs(r["prediction_error"]) for r in rows]
    phases = rows[0]["phases"]
    phases_s = {p["phase"]: p["s"] for p in phases}
    warmup = auto.get("auto_warmup") or {}
    return {"auto_vs_ddp": auto["speedup_vs_ddp"], "auto_vs_best_ddp": auto["speedup_vs_best_ddp"],
            "best_ddp": rows[0]["best_ddp"], "auto_vs_lower_bound": auto["vs_lower_bound"],
            "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
            "startup_s": sum(p["s"] for p in phases if p["phase"] not in ("rounds", "auto warm-up")),
            "peak_rss_bytes": rows[0]["peak_rss_bytes"],
            "compute_s": rows[0]["lower_bound"]["compute_s"],
            "allreduce_all_s": rows[0]["lower_bound"]["allreduce_all_s"],
            "errors": {r["strategy"]: r["prediction_error"] for r in rows},
            "rows": {r["strategy"]: _row(r) for r in rows},
            "phases_s": phases_s, "stopping": rows[0].get("stopping"), "trimmed": rows[0].get("trimmed"),
            "allreduce_anchor": (rows[0].get("contention") or {}).get("allreduce_anchor"),
            "auto_ran": auto_ran(auto),
            "auto_warmup": {"mode": warmup.get("mode"), "estimated_s": warmup.get("estimated_s"),
                            "short": bool(warmup.get("shortened")), "took_s": phases_s.get("auto warm-up")}}


def _row(r: dict) -> dict:
    """One row's median step and prediction (emulated seconds), against DDP and the bound, and its operations."""
    return {"median_s": r["iteration_s_median"], "predicted_s": r["predicted_iteration_s"],
            "vs_ddp": r["speedup_vs_ddp"], "vs_lower_bound": r["vs_lower_bound"], "operations": r.get("operations")}


def auto_ran(auto: dict) -> str:
    """The plan ``auto``'s row ran, as a reader names it: the trials' kept plan (run-time ``auto``), else the
    strategy it chose at start-up."""
    trial = (auto.get("autotune") or {}).get("trial_decision") or {}
    if trial.get("kept"):
        return trial["plans"].get(trial["kept"], trial["kept"])
    return auto["plan_options"].get("chose", auto["strategy"])


def _tag(args: argparse.Namespace) -> str:
    """``_TAG`` where --tag names the runs (JSONs beside the stored ones, not over them), else nothing."""
    return f"_{args.tag}" if args.tag else ""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(SETTINGS))
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--rate", default="10gbit")
    p.add_argument("--rounds", type=int, default=None, help="the bench's most rounds (default: the bench's, as many "
                   "of its 6 as fit its 15-minute target: gradsched.jobs.budget)")
    p.add_argument("--prefix", default="gse")
    p.add_argument("--tag", default="", help="write emulate_papers_MODEL_8h_TAG.json and emulate_papers_TAG.json "
                   "(a new run beside the stored ones)")
    p.add_argument("--resummarize", action="store_true", help="run nothing: the summary's figures of --models "
                   "again from their benches' JSONs (command, wall time and load as recorded)")
    p.add_argument("--strategies", default="", help="more rows beside ddp,auto and the bucket sweep, e.g. dear "
                   "(comma-separated gradsched strategies; the bench drops bucket rows, the largest cap first, "
                   "then rounds, to fit its 15 minutes)")
    return p


def main() -> int:
    args = parser().parse_args()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"emulate_papers{_tag(args)}.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else {}
    for model in args.models.split(","):
        if args.resummarize:
            bench = RESULTS / f"emulate_papers_{model.replace('-', '_')}_{args.hosts}h{_tag(args)}.json"
            runs[model] = {**runs.get(model, {"model": model}), **summary(bench)}
        else:
            runs[model] = _run(model, args)
        path.write_text(json.dumps({"hosts": args.hosts, "rate": args.rate, "runs": runs}, indent=1))
    print(f"{'model':13s} {'S':>3s} {'K':>4s} {'compute':>8s} {'allred':>7s} {'vs ddp':>7s} {'vs best':>8s} "
          f"{'/ bound':>8s} {'med err':>8s} {'worst':>6s} {'start s':>8s} {'warm-up':>8s} {'wall s':>7s} {'GB/rank':>8s} "
          "auto ran")
    for model, r in runs.items():
        if "failed" in r:
            print(f"{model:13s} failed: {r['failed']}")
            continue
        print(f"{model:13s} {r['scale_bytes']:3d} {r['dilate']:4g} {r['compute_s'] * 1e3:8.0f} "
              f"{r['allreduce_all_s'] * 1e3:7.0f} {r['auto_vs_ddp']:6.2f}x {r['auto_vs_best_ddp']:7.2f}x "
              f"{r['auto_vs_lower_bound']:7.2f}x {r['median_abs_error'] * 100:7.1f}% {r['worst_abs_error'] * 100:5.1f}% "
              f"{r['startup_s']:8.0f} {r['phases_s'].get('auto warm-up', 0.0):8.0f} {r['wall_s']:7.0f} "
              f"{r['peak_rss_bytes'] / 1e9:8.2f} {r.get('auto_ran', '')}")
        for name, row in r.get("rows", {}).items():
            if name not in DEFAULT_STRATEGIES and not name.startswith("ddp-"):
                print(f"{'':13s} {name}: {row['median_s'] * 1e3:.0f} ms, predicted {row['predicted_s'] * 1e3:.0f}, "
                      f"{row['vs_ddp']:.2f}x DDP, {row['vs_lower_bound']:.2f}x the bound")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
