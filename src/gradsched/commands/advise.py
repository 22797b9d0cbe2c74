"""``gradsched advise``: the bucket sizes to set in PyTorch DDP, the HF Trainer and DeepSpeed.

    gradsched advise --profile my.profile.json --cluster my.cluster.json [--json PATH|-]

The network is required: a measured cluster (``gradsched netbench``), a bundled one
named as such (``--cluster bundled:googlenet-10gbe``), or ``--alpha``/``--beta``.

Simulates each tool's bucketing over a sweep of bucket sizes on the profile and network
and prints the settings with their predicted iteration times beside the tools' defaults
and gradsched's best plan (docs/advise.md)."""

from __future__ import annotations

import argparse

from gradsched.commands._inputs import add_model_args, load_cluster, load_profile
from gradsched.commands._output import add_json_arg, emit_json, to_stdout
from gradsched.errors import GradschedError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("advise", help="bucket sizes to set in PyTorch DDP, the HF Trainer and DeepSpeed",
                       description="Predict, by simulation, the iteration time of PyTorch DDP's bucket_cap_mb (also "
                                   "the HF Trainer's ddp_bucket_cap_mb) and DeepSpeed's reduce_bucket_size over a sweep "
                                   "of sizes, and print the fastest with gradsched's best plan beside them. The network "
                                   "is required (--cluster or --alpha/--beta); without --profile: the bundled "
                                   "GoogLeNet profile.")
    add_model_args(p)
    for group in p._action_groups:  # the network is required here, not a bundled default
        if group.title and group.title.startswith("network"):
            group.title = NETWORK_TITLE
    p.add_argument("--buckets", default=None, metavar="MB,MB,...",
                   help="bucket sizes to try, in MiB (default 1,2,5,10,15,25,35,50,75,100,150,250,500)")
    p.add_argument("--channels", type=int, default=1, help="parallel communication channels (default 1)")
    p.add_argument("--ddp-first-bucket-mb", type=float, default=None, metavar="MB",
                   help="DDP's first bucket whatever bucket_cap_mb is set to, for PyTorch releases that capped it "
                        "at 1 MiB always (give 1); default: PyTorch's current rule, a set bucket_cap_mb caps the "
                        "first bucket too")
    p.add_argument("--fsdp", action="store_true",
                   help="advise PyTorch FSDP2 instead: the fully_shard grouping and prefetch, each grouping's "
                        "predicted iteration beside DDP's default and gradsched's best plan")
    add_json_arg(p, "the advice")
    p.set_defaults(func=run)


NETWORK_TITLE = ("network (required: the advice depends on it; a measured --cluster, a bundled:NAME one, "
                 "or --alpha/--beta)")
NO_NETWORK = ("advise needs the network the job runs on: give --cluster C.json (measured with "
              "'gradsched netbench --workers N', or under torchrun on the job's hosts), --alpha/--beta, or "
              "--cluster bundled:googlenet-10gbe for the bundled 10 GbE measurements (not your network)")


def run(args: argparse.Namespace) -> int:
    from gradsched.advise import BUCKETS_MB, advise, format_advice

    if not args.cluster and args.alpha is None and args.beta is None:
        raise GradschedError(NO_NETWORK)
    profile = load_profile(args)
    cluster = load_cluster(args)
    if args.channels < 1:
        raise GradschedError(f"--channels must be at least 1, got {args.channels}")
    if args.fsdp:
        from gradsched.advise_fsdp import format_fsdp_advice, fsdp_advice

        fsdp = fsdp_advice(profile, cluster)
        if not to_stdout(args):
            print(format_fsdp_advice(fsdp))
        emit_json(args, fsdp.to_dict())
        return 0
    advice = advise(profile, cluster, _buckets(args.buckets) if args.buckets else BUCKETS_MB, args.channels,
                    args.ddp_first_bucket_mb)
    if not to_stdout(args):
        print(format_advice(advice))
    emit_json(args, advice.to_dict())
    return 0


def _buckets(text: str) -> tuple[float, ...]:
    try:
        sizes = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GradschedError(f"--buckets {text!r}: expected megabytes separated by commas, e.g. 5,25,100") from None
    if not sizes or any(not s > 0 for s in sizes):
        raise GradschedError(f"--buckets {text!r}: give positive megabytes, e.g. 5,25,100")
    return sizes
