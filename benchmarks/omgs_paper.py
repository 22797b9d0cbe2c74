"""OMGS-SGD's setting in simulation: 16 workers on 1 Gb Ethernet, density 0.001.

Compares, with the simulator, layer-wise ``topk``, one top-k over the whole model
(a single ``topk-allgather`` over every tensor), the paper's merge rule alone
(``omgs`` with ``refine_plan=False``) and gradsched's ``omgs`` (the rule, then a local
search on the exact sparse timeline), on the bundled GoogLeNet profile and on a
VGG profile estimated on the meta device at 10 TFLOP/s (the paper's P102-100 GPUs
are of that class).  Cluster constants are the OMGS authors' (docs: SEEDS.md):
all-gather at P = 16: alpha 1.1e-2 s, beta 1.7e-8 s/byte; selection 2.19e-10 n log2 n.

    python benchmarks/omgs_paper.py            # table + benchmarks/results/omgs_paper.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gradsched.bundled import bundled_profile
from gradsched.cluster import Cluster, CollectiveCost
from gradsched.plan import SPARSE, Operation, Plan, Slice
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

DENSITY = 0.001
WORLD = 16
OUT = Path(__file__).parent / "results" / "omgs_paper.json"


def paper_cluster() -> Cluster:
    # all-reduce (unused by sparse plans; the simulator wants one) from the ring relation the
    # cluster model uses itself: all-gather = (alpha / 2, beta * P / 2) of the all-reduce
    return Cluster(WORLD, {"allgather": CollectiveCost(1.1e-2, 1.7e-8),
                           "allreduce": CollectiveCost(2.2e-2, 2 * 1.7e-8 / WORLD)},
                   extra={"topk_selection_s_per_nlogn": 2.19e-10})


def vgg_profile(batch_size: int) -> Profile:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "vgg.json")
        subprocess.run([sys.executable, "-m", "gradsched.cli", "profile", "--model", "vgg", "--device", "meta",
                        "--device-tflops", "10", "--batch-size", str(batch_size), "-o", str(path), "-q"], check=True)
        return Profile.load(path)


def whole_model(profile: Profile) -> Plan:
    op = Operation(tuple(Slice(i, 0, profile.tensors[i].numel) for i in profile.order), SPARSE, 0, DENSITY)
    return Plan("topk-whole-model", (op,), profile.fingerprint, profile.model, {"density": DENSITY})


def main() -> int:
    cluster = paper_cluster()
    profiles = {"googlenet (bundled)": bundled_profile("googlenet"), "vgg (meta, batch 64)": vgg_profile(64)}
    rows = []
    for label, profile in profiles.items():
        plans = {"topk (layer-wise)": make_plan("topk", profile, cluster, density=DENSITY),
                 "one top-k (whole model)": whole_model(profile),
                 "omgs rule only": make_plan("omgs", profile, cluster, density=DENSITY, refine_plan=False),
                 "omgs": make_plan("omgs", profile, cluster, density=DENSITY)}
        for name, plan in plans.items():
            r = simulate(plan, profile, cluster, timeline=False)
            rows.append({"profile": label, "plan": name, "operations": len(plan.operations),
                         "iteration_s": r.iteration_s, "compute_s": r.compute_s, "comm_s": r.comm_s})
    print(f"OMGS-SGD setting: {WORLD} workers, 1 GbE all-gather (1.1e-2 s, 1.7e-8 s/B), density {DENSITY}")
    print(f"{'profile':24s} {'plan':26s} {'ops':>4s} {'iteration ms':>13s}")
    for r in rows:
        print(f"{r['profile']:24s} {r['plan']:26s} {r['operations']:4d} {r['iteration_s'] * 1e3:13.1f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"world_size": WORLD, "density": DENSITY, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
