"""The contention probe's own peak memory on a replayed profile: one gloo rank, VmHWM reset just before it.

    python benchmarks/probe_peak.py [--profile benchmarks/profiles/bert-large-b32-10tflops.profile.json]
        [--scale-bytes 4] [--probe-module FILE.py] [--out benchmarks/results/probe_peak_TAG.json]

Builds the replay model of the profile (1/S of each tensor's elements), the bench's optimizer (SGD, momentum 0.9),
then resets the process's VmHWM (``/proc/self/clear_refs``) and runs a ``ContentionProbe`` and two of its
repetitions (a step alone, an all-reduce of every gradient alone and with steps, the small all-reduces): what it
adds over the resident memory before it, per byte of parameters.  No network: one rank (its all-reduces move
nothing, its buffers are as large as on any number of ranks).  ``--probe-module``: a ``probe.py`` from another
commit (``git show REV:src/gradsched/torch/measure/probe.py > FILE.py``), to compare before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gradsched.byte_scaling import scale_profile
from gradsched.procfs import proc_bytes
from gradsched.profile import Profile
from gradsched.torch.jobs.replay import ReplayModel, make_batch

HERE = Path(__file__).parent


def probe_class(module_file: Path | None) -> Any:
    """``ContentionProbe`` from this checkout, or from ``module_file``."""
    if module_file is None:
        from gradsched.torch.measure.probe import ContentionProbe
        return ContentionProbe
    spec = importlib.util.spec_from_file_location("probe_under_test", module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ContentionProbe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", type=Path, default=HERE / "profiles" / "bert-large-b32-10tflops.profile.json")
    p.add_argument("--scale-bytes", type=int, default=4)
    p.add_argument("--probe-module", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    profile = scale_profile(Profile.load(args.profile), args.scale_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            model = ReplayModel(profile)
            spec = type("Spec", (), {"module": model, "make_batch": staticmethod(make_batch),
                                     "loss_fn": staticmethod(torch.nn.functional.mse_loss)})()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            start = proc_bytes("/proc/self/status", "VmRSS") or 0
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
            t0 = time.perf_counter()
            probe = probe_class(args.probe_module)(spec, profile.total_bytes, lr=0.01, seed=0, batch_size=16,
                                                   optimizer=opt, step_s=profile.compute_s, allreduce_s=0.01)
            probe.measure(2)
            wall_s = time.perf_counter() - t0
            peak = proc_bytes("/proc/self/status", "VmHWM") or 0
        finally:
            dist.destroy_process_group()
    model_bytes = profile.total_bytes
    result = {"profile": args.profile.name, "scale_bytes": args.scale_bytes, "probe_module": str(args.probe_module),
              "model_bytes": model_bytes, "rss_before_bytes": start, "peak_rss_bytes": peak,
              "probe_adds_bytes": peak - start, "probe_adds_x_params": (peak - start) / model_bytes,
              "wall_s": wall_s, "compute_alone_s": probe.samples["compute_alone_s"]}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
