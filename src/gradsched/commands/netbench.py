"""``gradsched netbench``: measure collectives on this network and write a cluster file."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from gradsched.errors import GradschedError, WorkersFailed

# Defaults mirrored from gradsched.torch.netbench (this module must not import torch).
MIN_BYTES = 4 * 1024
MAX_BYTES = 256 * 1024 * 1024
COLLECTIVES = ("allreduce", "allgather")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("netbench", help="measure all-reduce/all-gather and fit the cost model (gradsched.cluster/1)",
                       description="Time all-reduce and all-gather from 4 KiB to 256 MiB on the live process "
                                   "group and fit alpha-beta lines plus the measured table. Run it under torchrun "
                                   "(torchrun ... -m gradsched.torch.netbench, or this command inside torchrun), "
                                   "or pass --nproc N to launch N ranks on this machine over loopback.")
    p.add_argument("--workers", "--nproc", dest="nproc", type=int, default=None, metavar="N",
                   help="launch this many local ranks through torch.distributed.run (loopback); --nproc is the "
                        "same flag")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``gradsched netbench`` and ``python -m gradsched.torch.netbench``."""
    p.add_argument("-o", "--output", default="cluster.json", help="cluster file to write (default cluster.json)")
    p.add_argument("--min-bytes", type=int, default=MIN_BYTES, help=f"smallest size (default {MIN_BYTES})")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help=f"largest size (default {MAX_BYTES} = 256 MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size; the median is kept (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions per size first (default 2)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma-separated, from {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--backend", default=None, help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def check_arguments(args: argparse.Namespace) -> None:
    """The shared flags' values, checked before any rank starts."""
    if args.reps < 1 or args.warmup < 0:
        raise GradschedError(f"--reps must be at least 1 and --warmup at least 0, got {args.reps} and {args.warmup}")
    if not 1 <= args.min_bytes <= args.max_bytes <= 1 << 40:
        raise GradschedError(f"--min-bytes and --max-bytes must satisfy 1 <= min <= max <= 1 TiB, got "
                             f"{args.min_bytes} and {args.max_bytes}")
    names = [c.strip() for c in args.collectives.split(",") if c.strip()]
    if not names or any(c not in COLLECTIVES for c in names):
        raise GradschedError(f"--collectives {args.collectives!r}: name some of {', '.join(COLLECTIVES)}")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    if args.nproc is not None:
        return _launch_local(args)
    from gradsched.torch.netbench import run_under_launcher

    return run_under_launcher(args)


def _launch_local(args: argparse.Namespace) -> int:
    """Start ``args.nproc`` ranks of ``gradsched.torch.netbench`` here through PyTorch's launcher."""
    if args.nproc < 2:
        raise GradschedError(f"--nproc must be at least 2 (a collective needs two ranks), got {args.nproc}")
    if "RANK" in os.environ:
        raise GradschedError("--nproc launches its own ranks: drop it when already running under torchrun")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "gradsched.torch.netbench", "-o", args.output, "--min-bytes", str(args.min_bytes),
           "--max-bytes", str(args.max_bytes), "--reps", str(args.reps), "--warmup", str(args.warmup),
           "--collectives", args.collectives]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.quiet:
        cmd.append("--quiet")
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local ranks talk over loopback, whatever the host's routes
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        raise WorkersFailed(f"the launched ranks failed (exit status {rc}); their errors are printed above", rc)
    return 0
