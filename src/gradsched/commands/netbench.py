"""``gradsched netbench``: measure collectives on this network and write a cluster file."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from gradsched.cluster import COLLECTIVES
from gradsched.errors import GradschedError, WorkersFailed
from gradsched.netbench_args import MAX_BYTES, MIN_BYTES, add_arguments  # noqa: F401 (MIN/MAX_BYTES: public names)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("netbench", help="measure all-reduce/all-gather and fit the cost model (gradsched.cluster/1)",
                       description="Time all-reduce and all-gather from 4 KiB to 256 MiB on the live process "
                                   "group and fit alpha-beta lines plus the measured table. Run it under torchrun "
                                   "(torchrun ... -m gradsched.torch.measure.netbench, or this command inside torchrun), "
                                   "or pass --nproc N to launch N ranks on this machine over loopback.")
    p.add_argument("--workers", "--nproc", dest="nproc", type=int, default=None, metavar="N",
                   help="launch this many local ranks through torch.distributed.run (loopback); --nproc is the "
                        "same flag")
    add_arguments(p)
    p.set_defaults(func=run)


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
    from gradsched.torch.measure.netbench import run_under_launcher

    return run_under_launcher(args)


def _launch_local(args: argparse.Namespace) -> int:
    """Start ``args.nproc`` ranks of ``gradsched.torch.measure.netbench`` here through PyTorch's launcher."""
    if args.nproc < 2:
        raise GradschedError(f"--nproc must be at least 2 (a collective needs two ranks), got {args.nproc}")
    if "RANK" in os.environ:
        raise GradschedError("--nproc launches its own ranks: drop it when already running under torchrun")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "gradsched.torch.measure.netbench", "-o", args.output, "--min-bytes", str(args.min_bytes),
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
