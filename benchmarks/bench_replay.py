"""The emulated-GPU regime: replayed profiles on testbed hosts, auto against PyTorch DDP.

    python benchmarks/bench_replay.py [--runs googlenet-k80:2:1gbit:1,gpt-6x512:2:1gbit:1,...]

Each run is ``PROFILE:HOSTS:RATE:DILATE``: one ``gradsched bench --replay PROFILE`` on the
testbed (root; prefix ``gsr``) with ``auto``, PyTorch DDP and DDP's bucket sizes, writing
``benchmarks/results/bench_replay_<profile>_<hosts>h.{json,png}`` (``..._<hosts>h_<rate>`` at a
rate other than 1gbit).  Then one table over
all runs: per row the ratio of one all-reduce of all gradients to compute (the regime),
``auto`` against DDP's default, against DDP's best bucket size and the lower bound, and
the simulator's error on every row.  Compute is emulated (waiting, per the profile) and
communication real (docs/bench.md, "Emulated compute").

Profiles: ``googlenet-k80`` is bundled (the MG-WFBP authors' K80 logs); ``gpt-6x512`` and
``gpt-4x384`` are GPT-2-shaped transformers (6 layers of width 512, batch 16; 4 layers of
width 384, batch 22, small enough for 8 ranks' memory here; vocabulary 8192, 512 tokens)
estimated on the meta device at 2.5 TFLOP/s (about a K80's sustained fp32), written to
``benchmarks/profiles/<name>.profile.json`` by :func:`transformer_profile` when missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from gradsched.cli import main as gradsched

HERE = Path(__file__).parent
RESULTS = HERE / "results"
PROFILES = HERE / "profiles"
DEFAULT_RUNS = "googlenet-k80:2:1gbit:1,gpt-6x512:2:1gbit:1,googlenet-k80:4:1gbit:2"
DEFAULT_RATE = "1gbit"  # a run at another rate has it in its files' names


TRANSFORMERS = {"gpt-6x512": (6, 512, 8, 16), "gpt-4x384": (4, 384, 6, 22)}  # layers, width, heads, batch


def transformer_profile(name: str) -> Path:
    """A GPT-2-shaped meta profile of :data:`TRANSFORMERS` (made once, then read from its file)."""
    path = PROFILES / f"{name}.profile.json"
    if path.exists():
        return path
    import torch

    from gradsched.torch.measure.flops import TransformerConfig, build_transformer
    from gradsched.torch.measure.profiler import profile_module

    layers, width, heads, batch_size = TRANSFORMERS[name]
    cfg = TransformerConfig(n_layer=layers, n_embd=width, n_head=heads, vocab_size=8192, seq_len=512,
                            ffn_hidden=4 * width)
    spec = build_transformer(cfg, device="meta")
    batch = spec.make_batch(batch_size, torch.Generator().manual_seed(0))
    prof = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=1, warmup=0, device="meta",
                          device_tflops=2.5, model_name=name)
    prof.extra["batch_size"] = batch_size
    PROFILES.mkdir(exist_ok=True)
    prof.save(path)
    return path


def summary(rows: list[dict]) -> dict:
    """One line of the table from one bench JSON."""
    by = {r["strategy"]: r for r in rows}
    auto, ddp = by["auto"], by["ddp"]
    best = by[rows[0]["best_ddp"]]
    lb = rows[0]["lower_bound"]
    # a profile's path in the repository, wherever the repository (or a copy of it) was when it ran
    model = re.sub(r"^replay:/.*?/(benchmarks/profiles/)", r"replay:\1", rows[0]["model"])
    return {"model": model, "hosts": rows[0]["hosts"], "rate": rows[0]["rate"],
            "dilate": rows[0].get("dilate", 1.0), "allreduce_over_compute": lb["allreduce_all_s"] / lb["compute_s"],
            "auto_ms": auto["iteration_s_median"] * 1e3, "ddp_ms": ddp["iteration_s_median"] * 1e3,
            "best_ddp": best["strategy"], "best_ddp_ms": best["iteration_s_median"] * 1e3,
            "lower_bound_ms": lb["lower_bound_s"] * 1e3, "auto_vs_ddp": auto["speedup_vs_ddp"],
            "auto_vs_best_ddp": auto["speedup_vs_best_ddp"], "auto_vs_lower_bound": auto["vs_lower_bound"],
            "auto_chose": (auto.get("autotune") or {}).get("switches", [{}])[-1].get("strategy"),
            "prediction_errors": {r["strategy"]: r["prediction_error"] for r in rows},
            "contention_compute_slowdown": (rows[0].get("contention") or {}).get("compute_slowdown")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=DEFAULT_RUNS, help=f"PROFILE:HOSTS:RATE:DILATE, comma-separated "
                    f"(default {DEFAULT_RUNS})")
    ap.add_argument("--strategies", default="ddp,auto")
    ap.add_argument("--ddp-buckets", help="DDP's bucket sizes beside its default (gradsched bench's default sweep "
                    "if not given; fewer rows where the ranks' model copies would not fit in memory)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--table-only", action="store_true", help="summarise the JSON files already written")
    args = ap.parse_args(argv)
    lines = []
    for run in args.runs.split(","):
        name, hosts, rate, dilate = run.split(":")
        source = str(transformer_profile(name)) if name in TRANSFORMERS else name
        stem = RESULTS / f"bench_replay_{name.replace('-', '_')}_{hosts}h{'' if rate == DEFAULT_RATE else '_' + rate}"
        if not args.table_only:
            code = gradsched(["bench", "--replay", source, "--hosts", hosts, "--rate", rate, "--dilate", dilate,
                              "--prefix", "gsr", "--strategies", args.strategies, "--steps", str(args.steps),
                              "--rounds", str(args.rounds), "-q", "--json", f"{stem}.json", "--plot", f"{stem}.png",
                              *(["--ddp-buckets", args.ddp_buckets] if args.ddp_buckets else [])])
            if code != 0:
                return code
        if Path(f"{stem}.json").exists():
            lines.append({**summary(json.loads(Path(f"{stem}.json").read_text())), "profile": name})
    print("emulated compute (replayed profiles), real gloo communication on testbed links; medians of counted rounds")
    print(f"{'profile':14s} {'hosts':>5s} {'rate':>7s} {'K':>3s} {'AR/comp':>7s} {'auto ms':>8s} {'ddp ms':>7s} "
          f"{'best ddp':>16s} {'bound':>6s} {'vs ddp':>7s} {'vs best':>7s} {'/bound':>6s}  simulator error per row")
    for s in lines:
        errs = " ".join(f"{k} {v:+.1%}" for k, v in s["prediction_errors"].items())
        print(f"{s['profile']:14s} {s['hosts']:5d} {s['rate']:>7s} {s['dilate']:3g} {s['allreduce_over_compute']:7.2f} "
              f"{s['auto_ms']:8.1f} {s['ddp_ms']:7.1f} {s['best_ddp']:>8s} {s['best_ddp_ms']:7.1f} "
              f"{s['lower_bound_ms']:6.0f} {s['auto_vs_ddp']:6.2f}x {s['auto_vs_best_ddp']:6.2f}x "
              f"{s['auto_vs_lower_bound']:5.2f}x  {errs}")
    out = RESULTS / "bench_replay_summary.json"
    out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "rows": lines}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
