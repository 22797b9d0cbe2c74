"""DeAR's comparison, simulated: its five models on 64 GPUs (16 x 4) over 10 GbE and 100 Gb InfiniBand.

DeAR (Zhang, Shi, Chu et al., ICDCS 2023) reports up to 1.83x (10 GbE) and 1.15x (100 Gb IB)
training speed-up over WFBP, ByteScheduler, Horovod, PyTorch DDP and MG-WFBP.  This script
plans each strategy for each model and network and simulates one iteration, printing the
iteration times and the speed-up of ``dear`` (and of ``auto``) over each baseline, beside
DeAR's published figures.  One command, from the repository root::

    .venv/bin/python benchmarks/dear_paper.py            # writes benchmarks/results/dear_paper.json

Profiles are built from the models' layer shapes (no weights, no torch): each layer's
parameter tensors and its multiply-accumulates per sample; forward takes
``2 * MACs * batch / GPU_FLOPS``, backward twice that (the usual 1:2 ratio), at an assumed
effective ``GPU_FLOPS`` of 10 TFLOP/s (DeAR's RTX 2080 Ti peak is 13.4 fp32).  Batches
and BERT's sequence length 64 are DeAR's (ANCHORS.md).  Inception-v4's stem and blocks
are summarised as their convolutions with the published widths; DenseNet-201 and the
BERTs are exact in parameters (DenseNet-201 20.0 M, BERT-Base 110 M, BERT-Large 335 M).

Networks (flat ring over 64 ranks; its slowest link is the inter-node one): 10 GbE at
1.25 GB/s and 25 us per ring step, 100 Gb IB at 12.5 GB/s and 5 us per step; a ring
all-reduce of ``s`` bytes costs ``2(p-1) a + 2(p-1)/p s / B``.  Baselines at their
defaults as DeAR ran them: ByteScheduler partition 4 MB and credit 16 MB, Horovod's
fusion buffer 64 MB, DDP's 25 MB buckets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gradsched import Cluster, Profile, TensorProfile
from gradsched.calibration import lower_bound_s
from gradsched.planners import make_plan
from gradsched.sim import simulate

ROOT = Path(__file__).resolve().parent
GPU_FLOPS = 10e12
P, NODES, GPUS_PER_NODE = 64, 16, 4
NETWORKS = {"10GbE": (25e-6, 1.25e9), "100GbIB": (5e-6, 12.5e9)}  # per ring step (s), bandwidth (B/s)
PUBLISHED = {"10GbE": 1.83, "100GbIB": 1.15}  # DeAR's "up to" speed-up over the best of the baselines
BASELINES = {"wfbp": {}, "bytescheduler": {"partition_bytes": 4 << 20, "credit_bytes": 16 << 20},
             "horovod": {"fusion_mb": 64.0}, "ddp": {}, "mgwfbp": {}}
OURS = {"dear": {}, "auto": {}}
TODAY = {"auto_without_dear": ("auto", {"exclude": ("dear",)})}  # auto as it was before dear

Layer = tuple[str, list[int], float]  # name, parameter tensors' numels, MACs per sample


def conv(name: str, c_in: int, c_out: int, k: int | tuple[int, int], hw: int, bn: bool = True) -> list[Layer]:
    kh, kw = (k, k) if isinstance(k, int) else k
    out = [(name, [c_in * c_out * kh * kw], c_in * c_out * kh * kw * hw * hw)]
    return out + ([(name + ".bn", [c_out, c_out], 4 * c_out * hw * hw)] if bn else [])


def resnet50() -> list[Layer]:
    layers = conv("conv1", 3, 64, 7, 112)
    c_in, hw = 64, 56
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for b in range(blocks):
            stride_hw = hw // 2 if (b == 0 and stage > 0) else hw
            name = f"layer{stage + 1}.{b}"
            layers += conv(f"{name}.conv1", c_in, width, 1, hw) + conv(f"{name}.conv2", width, width, 3, stride_hw)
            layers += conv(f"{name}.conv3", width, 4 * width, 1, stride_hw)
            if b == 0:
                layers += conv(f"{name}.down", c_in, 4 * width, 1, stride_hw)
            c_in, hw = 4 * width, stride_hw
    return layers + [("fc", [2048 * 1000, 1000], 2048 * 1000)]


def densenet201() -> list[Layer]:
    layers = conv("conv0", 3, 64, 7, 112)
    c, hw = 64, 56
    for k, blocks in enumerate((6, 12, 48, 32)):
        for b in range(blocks):
            name = f"block{k + 1}.{b}"
            layers += [(name + ".bn1", [c, c], 4 * c * hw * hw)] + conv(name + ".conv1", c, 128, 1, hw)
            layers += conv(name + ".conv2", 128, 32, 3, hw, bn=False)
            c += 32
        if k < 3:
            layers += [(f"trans{k + 1}.bn", [c, c], 4 * c * hw * hw)] + conv(f"trans{k + 1}.conv", c, c // 2, 1, hw,
                                                                             bn=False)
            c, hw = c // 2, hw // 2
    return layers + [("norm5", [c, c], 4 * c * hw * hw), ("classifier", [c * 1000, 1000], c * 1000)]


def inception_v4() -> list[Layer]:
    """Stem, 4 x Inception-A, Reduction-A, 7 x Inception-B, Reduction-B, 3 x Inception-C (Szegedy et al. 2017)."""
    L: list[Layer] = []
    stem = [(3, 32, 3, 149), (32, 32, 3, 147), (32, 64, 3, 147), (64, 96, 3, 73), (160, 64, 1, 73), (64, 96, 3, 71),
            (160, 64, 1, 73), (64, 64, (7, 1), 73), (64, 64, (1, 7), 73), (64, 96, 3, 71), (192, 192, 3, 35)]
    for j, (a, b, k, hw) in enumerate(stem):
        L += conv(f"stem.{j}", a, b, k, hw)
    for i in range(4):
        for j, (a, b, k) in enumerate(((384, 96, 1), (384, 64, 1), (64, 96, 3), (384, 64, 1), (64, 96, 3),
                                       (96, 96, 3), (384, 96, 1))):
            L += conv(f"A{i}.{j}", a, b, k, 35)
    for j, (a, b, k, hw) in enumerate(((384, 384, 3, 17), (384, 192, 1, 35), (192, 224, 3, 35), (224, 256, 3, 17))):
        L += conv(f"redA.{j}", a, b, k, hw)
    for i in range(7):
        for j, (a, b, k) in enumerate(((1024, 384, 1), (1024, 192, 1), (192, 224, (1, 7)), (224, 256, (7, 1)),
                                       (1024, 192, 1), (192, 192, (7, 1)), (192, 224, (1, 7)), (224, 224, (7, 1)),
                                       (224, 256, (1, 7)), (1024, 128, 1))):
            L += conv(f"B{i}.{j}", a, b, k, 17)
    for j, (a, b, k, hw) in enumerate(((1024, 192, 1, 17), (192, 192, 3, 8), (1024, 256, 1, 17),
                                       (256, 256, (1, 7), 17), (256, 320, (7, 1), 17), (320, 320, 3, 8))):
        L += conv(f"redB.{j}", a, b, k, hw)
    for i in range(3):
        for j, (a, b, k) in enumerate(((1536, 256, 1), (1536, 384, 1), (384, 256, (1, 3)), (384, 256, (3, 1)),
                                       (1536, 384, 1), (384, 448, (3, 1)), (448, 512, (1, 3)), (512, 256, (1, 3)),
                                       (512, 256, (3, 1)), (1536, 256, 1))):
            L += conv(f"C{i}.{j}", a, b, k, 8)
    return L + [("fc", [1536 * 1000, 1000], 1536 * 1000)]


def bert(layers: int, hidden: int, seq: int = 64) -> list[Layer]:
    """BERT with its pre-training heads' dense layer (vocabulary 30522, 512 positions)."""
    h, f = hidden, 4 * hidden
    out: list[Layer] = [("embeddings", [30522 * h, 512 * h, 2 * h, h, h], 0.0)]
    for i in range(layers):
        out += [(f"layer{i}.qkv", [3 * h * h, 3 * h], 3 * h * h * seq + 2 * seq * seq * h),
                (f"layer{i}.out", [h * h, h, h, h], h * h * seq), (f"layer{i}.ffn1", [h * f, f], h * f * seq),
                (f"layer{i}.ffn2", [f * h, h, h, h], f * h * seq)]
    return out + [("pooler", [h * h, h], h * h), ("head", [h * h, h, h, h, 30522], 30522 * h * seq)]


MODELS = {"resnet50": (resnet50, 64), "densenet201": (densenet201, 32), "inception_v4": (inception_v4, 64),
          "bert_base": (lambda: bert(12, 768), 64), "bert_large": (lambda: bert(24, 1024), 32)}


def profile_of(name: str) -> Profile:
    build, batch = MODELS[name]
    tensors = []
    for lid, (layer, numels, macs) in enumerate(build()):
        fwd = 2.0 * macs * batch / GPU_FLOPS
        for k, numel in enumerate(numels):
            tensors.append(TensorProfile(f"{layer}.{k}", numel, 4 * numel, fwd if k == 0 else 0.0,
                                         2 * fwd if k == 0 else 0.0, layer=lid))
    return Profile(f"{name}-b{batch}", tuple(tensors))


def cluster_of(network: str) -> Cluster:
    a, bandwidth = NETWORKS[network]
    return Cluster.alpha_beta(2 * (P - 1) * a, 2 * (P - 1) / P / bandwidth, P)


def run() -> dict:
    rows = []
    for model in MODELS:
        profile = profile_of(model)
        for network in NETWORKS:
            cluster = cluster_of(network)
            times = {}
            for name, opts in {**BASELINES, **OURS}.items():
                plan = make_plan(name, profile, cluster, **opts)
                times[name] = simulate(plan, profile, cluster, timeline=False).iteration_s
                if name == "auto":
                    chose = plan.options["chose"]
            for label, (name, opts) in TODAY.items():
                times[label] = simulate(make_plan(name, profile, cluster, **opts), profile, cluster,
                                        timeline=False).iteration_s
            bound = lower_bound_s(profile, cluster)
            rows.append({"model": profile.model, "network": network, "params_m": profile.total_numel / 1e6,
                         "compute_s": profile.compute_s, "backward_s": profile.backward_s,
                         "allreduce_all_s": cluster.cost("allreduce").time_s(profile.total_bytes),
                         "lower_bound_s": bound["lower_bound_s"], "bound_overlap": bound["overlap"],
                         "iteration_s": times, "auto_chose": chose,
                         "auto_vs_auto_without_dear": times["auto_without_dear"] / times["auto"],
                         "auto_vs_bound": times["auto"] / bound["lower_bound_s"],
                         "dear_speedup": {b: times[b] / times["dear"] for b in BASELINES},
                         "auto_speedup": {b: times[b] / times["auto"] for b in BASELINES}})
    return {"benchmark": "dear_paper", "world_size": P, "nodes": NODES, "gpus_per_node": GPUS_PER_NODE,
            "gpu_flops": GPU_FLOPS, "networks": {k: {"ring_step_s": a, "bandwidth_Bps": b}
                                                   for k, (a, b) in NETWORKS.items()},
            "published_up_to": PUBLISHED, "baselines": BASELINES, "rows": rows,
            "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def table(result: dict) -> str:
    names = list(BASELINES) + list(OURS)
    lines = [f"{'model':16} {'net':8} {'params':>7} {'AR-all':>7} " + " ".join(f"{n:>9}" for n in names)
             + "  dear/base auto/base (chose)   auto/old-auto auto/bound"]
    for r in result["rows"]:
        t = r["iteration_s"]
        best_base = min(t[b] for b in BASELINES)
        lines.append(f"{r['model']:16} {r['network']:8} {r['params_m']:6.1f}M {r['allreduce_all_s'] * 1e3:6.0f}ms "
                     + " ".join(f"{t[n] * 1e3:7.1f}ms" for n in names)
                     + f"  {best_base / t['dear']:8.2f}x {best_base / t['auto']:8.2f}x ({r['auto_chose']:8}) "
                     f"{r['auto_vs_auto_without_dear']:10.2f}x {r['auto_vs_bound']:9.3f}x")
    for net, published in result["published_up_to"].items():
        rows = [r for r in result["rows"] if r["network"] == net]
        up_to = max(max(r["dear_speedup"].values()) for r in rows)
        over_best = max(min(r["dear_speedup"].values()) for r in rows)
        lines.append(f"{net}: dear up to {up_to:.2f}x over a baseline ({over_best:.2f}x over the best baseline "
                     f"of a model); DeAR published up to {published:.2f}x")
    lines.append("dear/base, auto/base: the best baseline's iteration over theirs; auto/bound: over the lower bound "
                 "(communication overlapping backward and the next forward)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "dear_paper.json"))
    args = ap.parse_args(argv)
    result = run()
    print(table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
