"""The bench's prediction of runtime_overhead_8h.py's DenseNet-201 rows (q12, issue 35).

    python benchmarks/predict_q12_rows.py [--job benchmarks/results/emulate_papers_densenet201_8h_runs11.json]
        [--json benchmarks/results/predict_q12_rows.json]

The A/B's plans are made as its rows make them (DenseNet-201's stored profile at byte scale 8, compute x5, an
alpha-beta planning cluster of 20 ms and 250 Mbit/s) and priced as ``gradsched bench`` prices a job now
(``predict_fixes.bench_reading`` of ``--job``'s first row: its measured table, probe and contention, the
calibrated profile with the runtime's costs), in wall seconds of the dilated replay (the A/B's unit).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from gradsched.byte_scaling import scale_profile
from gradsched.calibration import calibrate, with_runtime_costs
from gradsched.cluster import Cluster
from gradsched.jobs.results import read_bench_row
from gradsched.planners import make_plan
from gradsched.profile import Profile
from gradsched.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import predict_fixes  # noqa: E402

PROFILE = "benchmarks/profiles/densenet201-b32-10tflops.profile.json"
ROWS = (("torch-ddp:mb=3.125", "ddp", {"bucket_cap_mb": 3.125}, True),
        ("torch-ddp:mb=0.125", "ddp", {"bucket_cap_mb": 0.125}, True),
        ("gs-ddp:mb=0.125", "ddp", {"bucket_cap_mb": 0.125}, False),
        ("gs-usbyte:groups=0+unit_bytes=524288", "usbyte", {"groups": 0, "unit_bytes": 524288}, False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="benchmarks/results/emulate_papers_densenet201_8h_runs11.json")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = json.loads(Path(args.job).read_text())
    row0, dilate = read_bench_row(rows[0])
    measured = Profile.from_dict(row0["profile"]["measured"])
    probe = row0["contention"]
    cluster = predict_fixes.bench_reading(row0)
    compute_s = row0["compute_only"]["iteration_s_median"]
    mine = scale_profile(Profile.load(PROFILE), 8)
    mine = replace(mine, tensors=tuple(replace(t, forward_s=t.forward_s * 5, backward_s=t.backward_s * 5)
                                       for t in mine.tensors))
    planning = Cluster.alpha_beta(0.02, 8 / 10e9 * 8 * 5, 8)
    out = {}
    for name, strategy, opts, torch_ddp in ROWS:
        plan = replace(make_plan(strategy, mine, planning, **opts), profile_fingerprint=measured.fingerprint)
        priced = with_runtime_costs(calibrate(measured, compute_s), probe, torch_ddp)
        wall_s = simulate(plan, priced, cluster, timeline=False).iteration_s
        out[name] = {"operations": len(plan.operations), "predicted_wall_s": wall_s, "predicted_bench_s": wall_s / dilate}
        print(f"{name:40s} {len(plan.operations):3d} operations, predicted {wall_s * 1e3:7.1f} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "job": args.job,
                                               "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
