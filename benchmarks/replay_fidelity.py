"""How faithful emulation is on this machine: replayed compute, and all-reduce on shaped links.

    python benchmarks/replay_fidelity.py [--profile googlenet-k80] [--configs 2x1gbit,2x2gbit,4x1gbit,...]

1. **Compute** (any user): the replay model of ``--profile``, profiled by gradsched's own
   profiler (hooks, ``--iterations``): per-layer forward and backward against the
   profile (median and worst |error| over layers of at least 1 ms, error of the sums),
   and the CPU time of a replayed step against its wall time: the emulated compute
   (forward and backward: waits, the gradients' bytes written, autograd) and with the
   SGD step, real work on the CPU that a GPU would run on the device.
2. **Network** (root): for each ``HOSTSxRATE`` in ``--configs``, a testbed (prefix
   ``gsr``) and gloo all-reduce timed from 1 MiB to 64 MiB (``gradsched.torch.measure.netbench``,
   one process per host), each size against the rate's line: the ring's ``2(n-1)/n``
   times the size each way at the links' goodput (96% of the rate: tbf counts whole
   frames, docs/testbed.md).  A configuration is faithful when every size of 4 MiB
   and more is within 5% of its line.

Prints a table and writes ``benchmarks/results/replay_fidelity.json`` (a run without
network configurations keeps the network results already in it).  What it showed
sets ``FAITHFUL_AGGREGATE_BPS`` in ``gradsched/jobs/bench.py`` (docs/bench.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
GOODPUT = 0.96  # TCP payload per tbf bit at MTU 1500 (docs/testbed.md)
TOLERANCE = 0.05
MiB = 1 << 20


def compute_fidelity(source: str, iterations: int) -> dict:
    import torch

    from gradsched.torch.measure.profiler import profile_module
    from gradsched.torch.jobs.models import build_model

    torch.set_num_threads(1)
    spec = build_model(f"replay:{source}")
    gen = torch.Generator().manual_seed(0)
    batch = spec.make_batch(4, gen)
    measured = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=iterations, warmup=2)
    ref = spec.module.profile
    pairs = []  # per layer (first tensor carries the time): (profile s, measured s)
    for t, m in zip(ref.tensors, measured.tensors):
        for a, b in ((t.forward_s, m.forward_s), (t.backward_s, m.backward_s)):
            if a >= 1e-3:
                pairs.append((a, b))
    errors = [abs(b - a) / a for a, b in pairs]
    # each gradient's ready time after backward starts, against the profile's, over the whole backward
    order = [measured.ready_s[i] - ref.ready_s[i] for i in range(ref.num_tensors)]
    opt = torch.optim.SGD(spec.module.parameters(), lr=0.01)
    walls, cpus, emulated = [], [], []  # a step's wall and CPU time; the CPU time of forward and backward alone
    for _ in range(iterations):
        opt.zero_grad()
        w0, c0 = time.perf_counter(), time.process_time()
        spec.loss_fn(spec.module(batch[0]), batch[1]).backward()
        emulated.append(time.process_time() - c0)
        opt.step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    fb = ref.forward_s + ref.backward_s
    return {"profile": source, "layers_compared": len(pairs), "median_abs_error": statistics.median(errors),
            "worst_abs_error": max(errors),
            "forward_backward_error": (measured.forward_s + measured.backward_s - fb) / fb,
            "ready_median_abs_error_of_backward": statistics.median(abs(d) for d in order) / ref.backward_s,
            "ready_worst_abs_error_of_backward": max(abs(d) for d in order) / ref.backward_s,
            "same_ready_order": list(measured.order) == list(ref.order),
            "step_wall_s": statistics.median(walls), "step_cpu_s": statistics.median(cpus),
            "cpu_share": statistics.median(c / w for c, w in zip(cpus, walls)),
            "forward_backward_cpu_s": statistics.median(emulated),
            "forward_backward_cpu_share": statistics.median(c / w for c, w in zip(emulated, walls)),
            "profile_step_s": ref.compute_s, "load_average": os.getloadavg()[0]}


def network_fidelity(hosts: int, rate: str) -> dict:
    from gradsched.testbed import Testbed, parse_rate_bps

    bps = parse_rate_bps(rate)
    with tempfile.TemporaryDirectory(prefix="gsr-fidelity-") as tmp:
        os.chmod(tmp, 0o755)
        out = Path(tmp, "cluster.json")
        with Testbed(hosts=hosts, rate=rate, prefix="gsr") as tb:
            tb.launch(["-m", "gradsched.torch.measure.netbench", "--collectives", "allreduce", "--min-bytes", str(MiB),
                       "--max-bytes", str(64 * MiB), "--reps", "3", "--warmup", "1", "-q", "-o", str(out)]
                      ).wait(timeout_s=600)
        cluster = json.loads(out.read_text())
    points = cluster["measured_points"]["allreduce"]
    rows = []
    for size, seconds in points:
        line = 2 * (hosts - 1) / hosts * size * 8 / (GOODPUT * bps)
        rows.append({"bytes": size, "seconds": seconds, "line_s": line, "ratio": seconds / line})
    big = [r["ratio"] for r in rows if r["bytes"] >= 4 * MiB]
    return {"hosts": hosts, "rate": rate, "aggregate_bps": hosts * bps, "points": rows, "worst_ratio": max(big),
            "faithful": max(big) <= 1 + TOLERANCE, "load_average": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="googlenet-k80")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--configs", default="2x1gbit,2x2gbit,2x3gbit,4x500mbit,4x1gbit,4x1500mbit",
                    help="HOSTSxRATE, comma-separated (root only)")
    ap.add_argument("--json", default=str(RESULTS / "replay_fidelity.json"))
    args = ap.parse_args(argv)
    out: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(["python", *sys.argv])}
    c = out["compute"] = compute_fidelity(args.profile, args.iterations)
    print(f"compute: {c['profile']}, {c['layers_compared']} layer times >= 1 ms: median |error| "
          f"{c['median_abs_error']:.1%}, worst {c['worst_abs_error']:.1%}; forward+backward {c['forward_backward_error']:+.1%}; "
          f"ready times off by a median {c['ready_median_abs_error_of_backward']:.1%} of backward (worst "
          f"{c['ready_worst_abs_error_of_backward']:.1%}), same order: {c['same_ready_order']}; "
          f"a step {c['step_wall_s'] * 1e3:.0f} ms wall, {c['step_cpu_s'] * 1e3:.0f} ms CPU ({c['cpu_share']:.1%}), "
          f"forward and backward alone {c['forward_backward_cpu_s'] * 1e3:.0f} ms ({c['forward_backward_cpu_share']:.1%}); "
          f"load {c['load_average']:.1f}")
    out["network"] = []
    if os.geteuid() == 0:
        print(f"{'hosts':>5s} {'rate':>9s} {'aggregate':>10s} {'worst / line':>12s}  per size (MiB: ratio)")
        for item in filter(None, args.configs.split(",")):
            hosts, rate = item.split("x")
            n = network_fidelity(int(hosts), rate)
            out["network"].append(n)
            sizes = " ".join(f"{p['bytes'] // MiB}:{p['ratio']:.2f}" for p in n["points"])
            print(f"{n['hosts']:5d} {n['rate']:>9s} {n['aggregate_bps'] / 1e9:8.1f}G {n['worst_ratio']:11.2f}x  "
                  f"{sizes}  {'faithful' if n['faithful'] else 'NOT faithful'} (load {n['load_average']:.1f})")
    else:
        print("network: skipped (the testbed needs root)")
    path = Path(args.json)
    if not out["network"] and path.exists():  # a compute-only run keeps the network results already written
        out = {**json.loads(path.read_text()), **{k: v for k, v in out.items() if k != "network"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
