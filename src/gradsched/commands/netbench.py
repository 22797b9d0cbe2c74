"""``gradsched netbench``: measure collectives on this network and write a cluster file."""

from __future__ import annotations

import argparse
import os
import tempfile

from gradsched.cluster import COLLECTIVES
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.commands._inputs import check_processes
from gradsched.errors import GradschedError
from gradsched.jobs.launch import PREFIXES, Ranks, launch
from gradsched.netbench_args import DEFAULT_OUTPUT, MAX_BYTES, MIN_BYTES, add_arguments
from gradsched.netbench_args import check_backend, check_sizes, parse_depths

__all__ = ["MAX_BYTES", "MIN_BYTES", "TESTBED_PREFIX", "check_arguments", "register", "run"]  # MIN/MAX: public names
TESTBED_PREFIX = PREFIXES["netbench"]  # its own prefix: never touches a testbed the user has up


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("netbench", help="measure all-reduce/all-gather and fit the cost model (gradsched.cluster/1)",
                       description="Time all-reduce and all-gather from 4 KiB to 256 MiB on the live process "
                                   "group and fit alpha-beta lines plus the measured table. Run it under torchrun "
                                   "(torchrun ... -m gradsched.torch.measure.netbench, or this command inside torchrun), "
                                   "or pass --nproc N to launch N ranks on this machine over loopback.")
    p.add_argument("--workers", "--nproc", dest="nproc", type=int, default=None, metavar="N",
                   help="launch this many local ranks through torch.distributed.run (loopback); --nproc is the "
                        "same flag")
    p.add_argument("--rate", default=None, metavar="RATE",
                   help="instead: bring up the testbed (root) with links shaped to RATE, e.g. 200mbit, run "
                        "--ranks-per-host ranks on each of --hosts hosts, measure, and remove it (docs/testbed.md)")
    p.add_argument("--hosts", type=int, default=2, metavar="N", help="testbed hosts with --rate (default 2)")
    p.add_argument("--prefix", default=TESTBED_PREFIX, help=f"testbed name prefix with --rate (default "
                   f"{TESTBED_PREFIX})")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="stop the testbed job after this (default 1800)")
    add_arguments(p)
    add_json_arg(p, "the measured cluster (gradsched.cluster/1; as written to -o)")
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
    check_backend(args.backend)
    parse_depths(args.queue_depths)
    if args.nproc is not None:
        check_processes("--workers", args.nproc)
    world = args.nproc or (args.hosts * (args.ranks_per_node or 1) if args.rate else None)
    world = world or int(os.environ.get("WORLD_SIZE", "2") or 2)
    check_sizes(args.min_bytes, args.max_bytes, max(world, 2), names)


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    if to_stdout(args):
        args.quiet = True  # stdout holds the JSON alone
    if args.output is not None or args.json is None:
        args.output = args.output or DEFAULT_OUTPUT
        return _measure(args)
    with tempfile.TemporaryDirectory(prefix="gradsched-netbench-") as scratch:  # --json alone leaves no file
        args.output = os.path.join(scratch, DEFAULT_OUTPUT)
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    """Run the ranks where the flags say, then hand the cluster file rank 0 wrote to ``--json``."""
    if args.rate is not None:
        code = _launch_testbed(args)
    elif args.nproc is not None:
        code = _launch_local(args)
    else:
        from gradsched.torch.measure.netbench import run_under_launcher

        code = run_under_launcher(args)
        if os.environ.get("RANK", "0") != "0":
            return code  # rank 0 wrote the cluster
    if code == 0 and args.json is not None:
        import json

        with open(args.output) as f:
            emit_json(args, json.load(f))
    return code


def _launch_local(args: argparse.Namespace) -> int:
    """Start ``args.nproc`` ranks of ``gradsched.torch.measure.netbench`` here through PyTorch's launcher."""
    if args.nproc < 2:
        raise GradschedError(f"--nproc must be at least 2 (a collective needs two ranks), got {args.nproc}")
    if "RANK" in os.environ:
        raise GradschedError("--nproc launches its own ranks: drop it when already running under torchrun")
    if args.ranks_per_node is not None and args.nproc % args.ranks_per_node:
        raise GradschedError(f"--ranks-per-node {args.ranks_per_node} does not divide --nproc {args.nproc} into "
                             f"equal nodes")
    # one node of --nproc ranks (the measuring module groups them by --ranks-per-node itself)
    launch(Ranks(script_argv=tuple(_rank_argv(args)), hosts=args.nproc)).check("the launched ranks")
    return 0


def _rank_argv(args: argparse.Namespace) -> list[str]:
    """What follows the launcher's options: the measuring module and the shared flags."""
    argv = ["-m", "gradsched.torch.measure.netbench", "-o", os.path.abspath(args.output), "--min-bytes",
            str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--reps", str(args.reps), "--warmup",
            str(args.warmup), "--collectives", args.collectives]
    if args.ranks_per_node is not None:
        argv += ["--ranks-per-node", str(args.ranks_per_node)]
    if args.backend:
        argv += ["--backend", args.backend]
    if args.quiet:
        argv.append("--quiet")
    if args.queue_depths:
        argv += ["--queue-depths", args.queue_depths]
    return argv


def _launch_testbed(args: argparse.Namespace) -> int:
    """Run the ranks on a testbed of ``--hosts`` hosts, ``--ranks-per-host`` each; always torn down."""
    from gradsched.testbed import check_ranks_per_host

    if args.nproc is not None:
        raise GradschedError("--rate runs the ranks on the testbed, --nproc on this machine's loopback: give one")
    per_host = check_ranks_per_host(args.ranks_per_node or 1)
    if args.hosts * per_host < 2:
        raise GradschedError("a network benchmark needs at least 2 ranks: --hosts 2, or --ranks-per-host 2")
    ranks = Ranks(script_argv=tuple(_rank_argv(args)), hosts=args.hosts, ranks_per_host=per_host, rate=args.rate,
                  prefix=args.prefix, timeout_s=args.timeout_s)
    launch(ranks).check("the testbed's ranks")  # the testbed validates --hosts and --rate
    return 0
