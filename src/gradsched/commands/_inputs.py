"""Argument helpers shared by the planning commands: profile, cluster, strategy options."""

from __future__ import annotations

import argparse
import inspect
import json
from typing import Any

from gradsched.cluster import Cluster
from gradsched.errors import GradschedError
from gradsched.planners import get_planner, strategy_names
from gradsched.profile import Profile


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="P.json", help="gradsched.profile/1 file, or bundled:NAME (default: bundled:googlenet)")
    p.add_argument("--workers", type=int, default=8, metavar="N", help="number of data-parallel ranks (default 8)")
    net = p.add_argument_group("network (default: the bundled 10GbE cluster measured with GoogLeNet)")
    net.add_argument("--cluster", metavar="C.json", help="gradsched.cluster/1 file extrapolated to --workers, or bundled:NAME "
                                                         "(googlenet-10gbe: OSU table; googlenet-intrain: in-training times)")
    net.add_argument("--alpha", type=float, metavar="SECONDS", help="all-reduce start-up time at --workers ranks")
    net.add_argument("--beta", type=float, metavar="SECONDS_PER_BYTE", help="all-reduce time per byte at --workers ranks")
    p.add_argument("--opt", action="append", default=[], metavar="[STRATEGY.]KEY=VALUE",
                   help="planner option, e.g. ddp.bucket_cap_mb=5 or density=0.01 (repeatable)")
    p.add_argument("--density", type=float, help="allow top-k sparsification at this density (sparse strategies, auto)")


def load_profile(args: argparse.Namespace) -> Profile:
    from gradsched.bundled import bundled_profile

    if not args.profile:
        return bundled_profile()
    if args.profile.startswith("bundled:"):
        return bundled_profile(args.profile.removeprefix("bundled:"))
    return Profile.load(args.profile)


def load_cluster(args: argparse.Namespace) -> Cluster:
    if args.workers < 1:
        raise GradschedError(f"--workers must be at least 1, got {args.workers}")
    if (args.alpha is None) != (args.beta is None):
        raise GradschedError("--alpha and --beta go together")
    if args.alpha is not None:
        if args.cluster:
            raise GradschedError("give either --cluster or --alpha/--beta, not both")
        for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
            if not (value >= 0 and value != float("inf")):
                raise GradschedError(f"{flag} must be a finite non-negative number, got {value}")
        return Cluster.alpha_beta(args.alpha, args.beta, args.workers)
    from gradsched.bundled import bundled_cluster

    if not args.cluster:
        cluster = bundled_cluster(world_size=args.workers)
    elif args.cluster.startswith("bundled:"):
        cluster = bundled_cluster(args.cluster.removeprefix("bundled:"), world_size=args.workers)
    else:
        cluster = Cluster.load(args.cluster)
    return cluster.at_world_size(args.workers) if cluster.world_size != args.workers else cluster


def strategy_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise GradschedError("--strategy needs at least one name")
    if names == ["all"]:
        return strategy_names()
    for name in names:
        get_planner(name)  # raises with the list of known names
    return names


def planner_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Options from ``--opt`` (and ``--density``) that planner ``name`` accepts."""
    params = inspect.signature(get_planner(name)).parameters
    out: dict[str, Any] = {}
    if args.density is not None and "density" in params:
        out["density"] = args.density
    for item in args.opt:
        key, sep, raw = item.partition("=")
        if not sep:
            raise GradschedError(f"--opt {item!r}: expected KEY=VALUE or STRATEGY.KEY=VALUE")
        target, dot, key = key.rpartition(".")
        if dot and target != name:
            continue
        if key not in params:
            if dot:
                known = ", ".join(k for k in params if k not in ("profile", "cluster")) or "none"
                raise GradschedError(f"--opt {item!r}: strategy {name!r} has no option {key!r} (it has: {known})")
            continue
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
