"""LLaMA-7B and GPT-2-XL replayed on 2, 4 and 8 emulated hosts at 100 Gbit/s, byte-scaled (issue 35, item 2).

    sudo python benchmarks/emulate_llms.py --models llama-7b --hosts 2 --prefix gsm   # one bench, a few minutes
    sudo python benchmarks/emulate_llms.py                                            # all six, one after another
    python benchmarks/emulate_llms.py --resummarize      # the table again from the stored benches' JSONs
    python benchmarks/emulate_llms.py --profiles         # the two meta profiles again (seconds, no testbed)

Profiles: ``gradsched profile --model M --device meta --device-tflops 150`` (``PROFILES``): 150 TFLOP/s is
what LLaMA's authors report per A100-80GB (65B at 380 tokens/s/GPU: 6 x 65.2e9 x 380 = 1.49e14 FLOP/s), the
batch what one such GPU holds (LLaMA-7B: one 2048-token sequence; GPT-2-XL: eight of 1024). Each
(model, hosts) is one ``gradsched bench --replay`` with ``ddp,auto`` (no bucket sweep) at DeAR's 100 Gbit/s
InfiniBand. The bench's own byte scale (the smallest that fits this machine's memory: 16-128 for LLaMA-7B)
would need dilations of 3-25 to keep the shaped links within the 2 Gbit/s this machine moves faithfully, so
a step would take 10-30 s of wall time; ``SETTINGS`` gives a larger S per host count instead, at which
``--dilate`` 1 fits (links at 100 Gbit/s / S, 1.56 Gbit/s over all hosts): each operation keeps its bandwidth
time, memory and copying shrink, and per-message latency (gloo's on these cores) is not scaled and not
dilated (docs/bench.md, "Large language models at byte scale"). Before each bench, what the bench itself
would pick (``pick``: S and the dilation its links would need) is recorded beside it. Writes each bench's
JSON (``bench_replay_MODEL_Hh_TAG.json``) and the summary ``benchmarks/results/emulate_llms_TAG.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import emulate_papers  # noqa: E402

from gradsched.jobs.bench import FAITHFUL_AGGREGATE_BPS, byte_scale  # noqa: E402
from gradsched.profile import Profile  # noqa: E402
from gradsched.testbed import parse_rate_bps  # noqa: E402

HERE = Path(__file__).parent
RESULTS = HERE / "results"
TFLOPS = 150.0
# model: (profile name, batch per GPU)
PROFILES = {"llama-7b": ("llama-7b-b1-150tflops", 1), "gpt2-xl": ("gpt2-xl-b8-150tflops", 8)}
# hosts: (byte scale, dilation): 100 Gbit/s / (S x K) per link, x hosts = 1.56 Gbit/s within the 2 Gbit/s limit
SETTINGS = {2: (128, 1.0), 4: (256, 1.0), 8: (512, 1.0)}


def profile_path(model: str) -> Path:
    return HERE / "profiles" / f"{PROFILES[model][0]}.profile.json"


def make_profiles() -> None:
    """The two meta profiles (FLOPs at ``TFLOPS``, nothing allocated)."""
    for model, (_, batch) in PROFILES.items():
        subprocess.run(["gradsched", "profile", "--model", model, "--device", "meta", "--device-tflops", f"{TFLOPS:g}",
                        "--batch-size", str(batch), "-o", str(profile_path(model))], check=True)


def bench_pick(model: str, hosts: int, rate: str) -> dict:
    """What the bench would pick without ``--scale-bytes``: the smallest S that fits this machine's memory now
    (``ddp,auto``: ``auto`` may try the two phases) and the dilation its links would then need."""
    scale, note = byte_scale(str(profile_path(model)), hosts, None, True, two_phase=True)
    need = parse_rate_bps(rate) / scale * hosts / FAITHFUL_AGGREGATE_BPS
    return {"scale_bytes": scale, "note": note, "dilate_needed": math.ceil(need * 10) / 10}


def step_estimate_s(model: str, hosts: int, rate: str) -> tuple[float, float]:
    """The emulated compute (forward + backward) and one ring all-reduce of every gradient at ``rate`` (96%
    goodput), in seconds: what a step costs on the cluster emulated, before any per-message latency."""
    profile = Profile.load(profile_path(model))
    ring = 2 * (hosts - 1) / hosts * profile.total_bytes * 8 / (0.96 * parse_rate_bps(rate))
    return profile.forward_s + profile.backward_s, ring


def bench_command(model: str, hosts: int, args: argparse.Namespace, out: Path) -> list[str]:
    scale, dilate = SETTINGS[hosts]
    return ["gradsched", "bench", "--replay", str(profile_path(model)), "--hosts", str(hosts), "--rate", args.rate,
            "--scale-bytes", str(scale), "--dilate", f"{dilate:g}", "--strategies", "ddp,auto", "--ddp-buckets",
            "none", "--prefix", args.prefix, "--timeout-s", "1200",
            *(["--rounds", str(args.rounds)] if args.rounds else []), "-q", "--json", str(out)]


def bench_json(model: str, hosts: int, tag: str) -> Path:
    return RESULTS / f"bench_replay_{model.replace('-', '_')}_{hosts}h_{tag}.json"


def run_one(model: str, hosts: int, args: argparse.Namespace) -> dict:
    out = bench_json(model, hosts, args.tag)
    cmd = bench_command(model, hosts, args, out)
    head = {"model": model, "hosts": hosts, "command": " ".join(cmd), "bench_pick": bench_pick(model, hosts, args.rate)}
    t0, load = time.time(), os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-m", "gradsched.cli", *cmd[1:]], capture_output=True, text=True)
    wall = time.time() - t0
    if done.returncode != 0:
        sys.stderr.write(f"{model} {hosts}h: gradsched bench exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr}")
        return {**head, "failed": done.stderr.strip().splitlines()[-20:], "wall_s": wall}
    scale, dilate = SETTINGS[hosts]
    return {**head, "wall_s": wall, "load_before": load, "load_after": os.getloadavg()[0], "dilate": dilate,
            "scale_bytes": scale, **emulate_papers.summary(out)}


def table(runs: dict) -> list[str]:
    lines = [f"{'model':9s} {'H':>2s} {'S':>4s} {'K':>3s} {'pick S/K':>9s} {'compute':>8s} {'allred':>7s} "
             f"{'ddp ms':>7s} {'pred':>6s} {'auto ms':>8s} {'pred':>6s} {'vs ddp':>7s} {'/ bound':>8s} {'start s':>8s} "
             f"{'wall s':>7s} {'GB/rank':>8s} {'line':>5s} auto ran"]
    for key, r in runs.items():
        pick = r.get("bench_pick") or {}
        picked = f"{pick.get('scale_bytes', '?')}/{pick.get('dilate_needed', '?')}"
        if "failed" in r:
            lines.append(f"{key:12s} failed: {r['failed'][-1] if r['failed'] else ''}")
            continue
        ddp, auto = r["rows"]["ddp"], r["rows"]["auto"]
        line = 3 * r["model_bytes"] / r["scale_bytes"] / 1e9 + 0.5 if "model_bytes" in r else float("nan")
        lines.append(
            f"{r['model']:9s} {r['hosts']:2d} {r['scale_bytes']:4d} {r['dilate']:3g} {picked:>9s} "
            f"{r['compute_s'] * 1e3:8.0f} {r['allreduce_all_s'] * 1e3:7.0f} {ddp['median_s'] * 1e3:7.0f} "
            f"{ddp['predicted_s'] * 1e3:6.0f} {auto['median_s'] * 1e3:8.0f} {auto['predicted_s'] * 1e3:6.0f} "
            f"{r['auto_vs_ddp']:6.2f}x {r['auto_vs_lower_bound']:7.2f}x {r['startup_s']:8.0f} {r['wall_s']:7.0f} "
            f"{r['peak_rss_bytes'] / 1e9:8.2f} {line:5.2f} {r.get('auto_ran', '')}")
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(PROFILES))
    p.add_argument("--hosts", default="2,4,8", help="comma-separated host counts among 2, 4, 8")
    p.add_argument("--rate", default="100gbit", help="the emulated links' rate (default DeAR's 100 Gbit/s)")
    p.add_argument("--rounds", type=int, default=None, help="the bench's most rounds (default: the bench's)")
    p.add_argument("--prefix", default="gsm", help="testbed prefix (default gsm)")
    p.add_argument("--tag", default="llm12", help="names the JSONs: bench_replay_MODEL_Hh_TAG.json, "
                   "emulate_llms_TAG.json (default llm12)")
    p.add_argument("--resummarize", action="store_true", help="run nothing: the summary again from the benches' "
                   "JSONs (command, wall time, load and the bench's pick as recorded)")
    p.add_argument("--profiles", action="store_true", help="make the meta profiles again and stop")
    return p


def main() -> int:
    args = parser().parse_args()
    if args.profiles:
        make_profiles()
        return 0
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"emulate_llms_{args.tag}.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else {}
    for model in args.models.split(","):
        for hosts in (int(h) for h in args.hosts.split(",")):
            key = f"{model} {hosts}h"
            if args.resummarize:
                runs[key] = {**runs.get(key, {"model": model, "hosts": hosts}),
                             **emulate_papers.summary(bench_json(model, hosts, args.tag))}
            else:
                runs[key] = run_one(model, hosts, args)
            compute, ring = step_estimate_s(model, hosts, args.rate)
            runs[key].update(model_bytes=Profile.load(profile_path(model)).total_bytes, emulated_compute_s=compute,
                             emulated_ring_allreduce_s=ring)
            path.write_text(json.dumps({"rate": args.rate, "tflops": TFLOPS, "runs": runs}, indent=1))
    print("\n".join(table(runs)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
