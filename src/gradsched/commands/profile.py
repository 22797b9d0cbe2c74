"""``gradsched profile``: measure (or estimate on ``meta``) a model's per-tensor profile."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gradsched.commands._model import check_batch_memory, check_batch_size
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.errors import GradschedError

# Transformer shapes too large for this machine, profiled on the meta device
# (kept here as well as in gradsched.torch.measure.flops so that --help needs no torch).
_PRESET_NAMES = ("gpt2-xl", "llama-7b")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure a model's per-tensor forward/backward times (gradsched.profile/1)",
                       description="Run a few training iterations of a model with hooks on its layers and "
                                   "gradients, and write per-tensor sizes, times (median after warm-up) and the "
                                   "gradient-ready order. With --device meta nothing is allocated: times are "
                                   "FLOPs at --device-tflops, so models larger than this machine can be planned.")
    p.add_argument("--model", required=True,
                   help="built-in model (mlp, cnn, vgg, gpt2, bert), your own as MODULE:FUNCTION (a factory "
                        "returning (module, batch_fn[, loss_fn]); docs/profiling.md), or a large transformer shape "
                        f"for --device meta ({', '.join(_PRESET_NAMES)})")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per iteration (default 16; 1 for the large transformer shapes)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or meta (default cpu)")
    p.add_argument("--iterations", type=int, default=10, help="timed iterations; the profile keeps medians (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    p.add_argument("--device-tflops", type=float, default=None,
                   help="with --device meta: the target device's sustained TFLOP/s that turns FLOPs into seconds")
    p.add_argument("--seed", type=int, default=0, help="model and batch seed (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: PyTorch's choice)")
    p.add_argument("-o", "--output", default=None,
                   help="where to write the profile (default profile.json, none with --json alone)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    add_json_arg(p, "the profile (gradsched.profile/1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from gradsched.torch.measure.profiler import profile_module

    if args.batch_size is not None:
        check_batch_size(args.batch_size)
    if args.device_tflops is not None and args.device != "meta":
        raise GradschedError("--device-tflops only applies to --device meta (other devices are measured)")
    if args.model in _PRESET_NAMES and args.device != "meta":
        raise GradschedError(f"{args.model} is profiled from its shapes only: add --device meta --device-tflops T")
    if args.threads is not None:
        if args.threads < 1:
            raise GradschedError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    spec, default_batch = _build(args.model, args.seed, args.device)
    check_batch_memory(spec.make_batch, args.batch_size or default_batch)  # before the batch is made
    batch = spec.make_batch(args.batch_size or default_batch, torch.Generator().manual_seed(args.seed))
    quiet = args.quiet or to_stdout(args)
    output = args.output if args.output or args.json is not None else "profile.json"
    profile = profile_module(spec.module, batch, loss_fn=spec.loss_fn, iterations=args.iterations,
                             warmup=args.warmup, device=args.device, device_tflops=args.device_tflops,
                             model_name=args.model, progress=not quiet)
    profile.extra["batch_size"] = args.batch_size or default_batch
    if output:
        profile.save(output)
    if not quiet:
        _summary(profile, output, sys.stdout)
    emit_json(args, profile.to_dict())
    return 0


def _build(name: str, seed: int, device: str) -> tuple[Any, int]:
    """The model spec (built on the meta device when asked: no memory) and its default batch size."""
    import torch

    if name in _PRESET_NAMES:
        from gradsched.torch.measure.flops import build_transformer

        return build_transformer(name, device="meta"), 1
    from gradsched.torch.jobs.models import build_model

    if device == "meta":
        with torch.device("meta"):
            return build_model(name, seed=seed), 16
    return build_model(name, seed=seed), 16


def _summary(profile: Any, path: str | None, out: Any) -> None:
    ms = 1e3
    how = (f"estimated from FLOPs at {profile.extra.get('device_tflops')} TFLOP/s"
           if profile.extra.get("method") == "flops" else
           f"median of {profile.extra.get('iterations')} iterations on {profile.extra.get('device')}")
    print(f"{'wrote ' + path if path else 'profiled'}: {profile.model}, {profile.num_tensors} tensors, "
          f"{profile.total_numel:,} parameters "
          f"({profile.total_bytes / 2**20:.1f} MiB of gradients)", file=out)
    print(f"  forward {profile.forward_s * ms:.2f} ms, backward {profile.backward_s * ms:.2f} ms, "
          f"other {profile.other_s * ms:.2f} ms ({how})", file=out)
